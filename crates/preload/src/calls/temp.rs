//! Temporary names: `mkstemp` and its variants, `mkdtemp`. glibc makes the name and opens it
//! with an internal `open` no library can intercept, which would create a /locus template's
//! file on the host (relative to the process's real working directory, when the program had
//! changed into /locus). So for a template that is not plainly the kernel's — under the
//! mount, or relative to a working directory in it — this library makes the names itself
//! and creates them through its own `open`/`mkdir`, which route them. Kernel templates go to
//! libc unchanged.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Resolved, resolve};
use crate::{errno, real};

/// Names tried before giving up with `EEXIST` (glibc tries 62³).
const ATTEMPTS: u32 = 238_328;
const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// A different value every call, in this process and across processes.
fn entropy() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = now
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .rotate_left(17);
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What a temporary name is made into.
#[derive(Clone, Copy)]
enum Make {
    /// A file opened `O_RDWR | O_CREAT | O_EXCL` plus these flags, mode 0600.
    File(c_int),
    /// A directory, mode 0700.
    Dir,
}

/// Makes a name from `template` (its six `X`s before `suffix` bytes replaced, in place) and
/// creates it through this library: the fd, 0 for a directory, or -1 with `errno`.
///
/// # Safety
/// `template` is a writable NUL-terminated string.
unsafe fn make(template: *mut c_char, suffix: c_int, what: Make) -> c_int {
    // SAFETY: NUL-terminated per the contract.
    let len = unsafe { libc::strlen(template) };
    let suffix = usize::try_from(suffix).unwrap_or(usize::MAX);
    if suffix > len || len - suffix < 6 {
        errno::set(libc::EINVAL);
        return -1;
    }
    let at = len - suffix - 6;
    // SAFETY: `at + 6 <= len`, inside the string.
    let xs = unsafe { std::slice::from_raw_parts_mut(template.add(at).cast::<u8>(), 6) };
    if xs != b"XXXXXX" {
        errno::set(libc::EINVAL);
        return -1;
    }
    for _ in 0..ATTEMPTS {
        let mut bits = entropy();
        for x in xs.iter_mut() {
            *x = LETTERS[(bits % 62) as usize];
            bits /= 62;
        }
        // SAFETY: the template is a NUL-terminated path; our own calls route it.
        let result = unsafe {
            match what {
                Make::File(flags) => super::fd::open64(
                    template,
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | flags,
                    0o600,
                ),
                Make::Dir => super::meta::mkdir(template, 0o700),
            }
        };
        if result >= 0 || errno::get() != libc::EEXIST {
            return result;
        }
    }
    xs.copy_from_slice(b"XXXXXX");
    errno::set(libc::EEXIST);
    -1
}

/// Whether `template` is plainly the kernel's (absolute outside the mount, or relative to a
/// working directory outside it).
///
/// # Safety
/// `template` is NUL-terminated or null.
unsafe fn kernels(template: *const c_char) -> bool {
    // SAFETY: forwarded contract.
    let resolved = unsafe { resolve(libc::AT_FDCWD, template) };
    matches!(resolved, Ok(Resolved::Kernel))
}

/// `mkostemps64(3)`: the variant every other file variant is.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemps64(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        if template.is_null() || kernels(template) {
            return real::mkostemps64(template, suffix, flags);
        }
        make(template, suffix, Make::File(flags & !libc::O_ACCMODE))
    }
}

/// `mkostemps(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemps(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, suffix, flags) }
}

/// `mkstemp(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemp(template: *mut c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, 0, 0) }
}

/// `mkstemp64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemp64(template: *mut c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, 0, 0) }
}

/// `mkostemp(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, 0, flags) }
}

/// `mkostemp64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, 0, flags) }
}

/// `mkstemps(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemps(template: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, suffix, 0) }
}

/// `mkstemps64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemps64(template: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemps64(template, suffix, 0) }
}

/// `mkdtemp(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: forwarded contract.
    unsafe {
        if template.is_null() || kernels(template) {
            return real::mkdtemp(template);
        }
        if make(template, 0, Make::Dir) == 0 {
            template
        } else {
            std::ptr::null_mut()
        }
    }
}
