//! The intercepted C functions. Each one first decides, as cheaply as it can, whether the
//! call is locus's — a locus fd (one bitmap load), a path under the mount prefix (a prefix
//! comparison), a locus directory stream — and otherwise passes it to libc unchanged.
//!
//! Every exported function is `unsafe extern "C"` with the C prototype of the libc function
//! it stands in for; the callers are C programs that uphold those prototypes' contracts
//! (valid pointers for the sizes they pass), which is what each `SAFETY` comment relies on.
//! `open`, `openat` and `fcntl` are variadic in C: they are defined here with their optional
//! argument as a named one, which the x86-64 and AArch64 Linux calling conventions pass in
//! the same register either way (an absent argument is read but not used).

pub(crate) mod dir;
pub(crate) mod exec;
pub(crate) mod fd;
pub(crate) mod io;
pub(crate) mod meta;
pub(crate) mod raw;
pub(crate) mod shared;
pub(crate) mod stdio;
pub(crate) mod temp;
pub(crate) mod walk;

use std::ffi::{CStr, CString, c_char, c_int};

use libc::ssize_t;

use crate::errno;
use crate::path::Target;
use crate::state::{self, Node};

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("liblocus_preload.so supports Linux on x86-64 and AArch64 (variadic calls)");

/// Returns a C int result, setting `errno` on failure.
pub(crate) fn int(result: Result<c_int, c_int>) -> c_int {
    result.unwrap_or_else(|e| {
        errno::set(e);
        -1
    })
}

/// Returns a byte count, setting `errno` on failure.
pub(crate) fn size(result: Result<usize, c_int>) -> ssize_t {
    match result {
        Ok(n) => n as ssize_t,
        Err(e) => {
            errno::set(e);
            -1
        }
    }
}

/// Returns 0, setting `errno` on failure.
pub(crate) fn unit(result: Result<(), c_int>) -> c_int {
    int(result.map(|()| 0))
}

/// The errno of a file-system error.
pub(crate) fn fs_errno(e: &fs::FsError) -> c_int {
    e.errno()
}

/// Where a (dirfd, path) pair leads.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// A locus path (inside the file system).
    Locus { path: String, trailing_slash: bool },
    /// The kernel's, unchanged.
    Kernel,
    /// The kernel's, but named relative to a locus directory: this absolute path instead.
    KernelPath(CString),
}

/// Most symbolic links one path walk follows before it is `ELOOP` (the kernel's limit).
const MAX_LINKS: usize = 40;

/// Decides whose `path` (relative to `dirfd`) is, following symbolic links (the last name's
/// too).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub(crate) unsafe fn resolve(dirfd: c_int, path: *const c_char) -> Result<Resolved, c_int> {
    // SAFETY: forwarded contract.
    unsafe { resolve_as(dirfd, path, true) }
}

/// [`resolve`], following the last name's symbolic link only when `follow_last` (or when
/// the path ends in `/`, as the kernel does).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub(crate) unsafe fn resolve_as(
    dirfd: c_int,
    path: *const c_char,
    follow_last: bool,
) -> Result<Resolved, c_int> {
    // SAFETY: forwarded contract.
    match unsafe { resolve_names(dirfd, path) }? {
        Resolved::Locus {
            path,
            trailing_slash,
        } => match state::served_mount() {
            // A `locus mount` server holds the volume: its mount has the same files.
            Some(point) => {
                let mut full = point.to_vec();
                if path != "/" {
                    full.extend_from_slice(path.as_bytes());
                }
                if trailing_slash {
                    full.push(b'/');
                }
                CString::new(full)
                    .map(Resolved::KernelPath)
                    .map_err(|_| libc::EINVAL)
            }
            None => follow_links(path, trailing_slash, follow_last || trailing_slash),
        },
        other => Ok(other),
    }
}

/// Follows the symbolic links a walk of the inside `path` meets, as the kernel does: a
/// link's target replaces the names through the link (a relative target is taken from the
/// link's directory), and the walk starts again — possibly out of the mount, into a kernel
/// path. `..` is folded by name before the walk (see docs/preload.md), so `link/..` is the
/// link's directory, not its target's parent.
fn follow_links(
    mut path: String,
    mut trailing_slash: bool,
    mut follow_last: bool,
) -> Result<Resolved, c_int> {
    let config = state::config().ok_or(libc::EIO)?;
    for _ in 0..=MAX_LINKS {
        let found = state::run(|| state::with_fs(|fs| Ok(fs.first_link(&path, follow_last))))?;
        let Some((link, target)) = found else {
            return Ok(Resolved::Locus {
                path,
                trailing_slash,
            });
        };
        let rest = &path[link.len()..];
        let mut full = if target.starts_with('/') {
            target.into_bytes()
        } else {
            let dir = &link[..link.rfind('/').unwrap_or(0)];
            let mut full = config.mount.outside(if dir.is_empty() { "/" } else { dir });
            full.push(b'/');
            full.extend_from_slice(target.as_bytes());
            full
        };
        full.extend_from_slice(rest.as_bytes());
        match config.mount.classify(&full) {
            Target::Locus {
                path: inside,
                trailing_slash: slash,
            } => {
                // `l -> d/` makes `l` name a directory, as a typed `d/` would.
                trailing_slash |= slash;
                follow_last |= slash;
                path = inside;
            }
            Target::Kernel => {
                let normal = crate::path::normalize(&full).expect("absolute");
                return Ok(Resolved::KernelPath(
                    CString::new(normal).map_err(|_| libc::EINVAL)?,
                ));
            }
        }
    }
    Err(libc::ELOOP)
}

/// Decides whose `path` (relative to `dirfd`) is, by its names alone.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn resolve_names(dirfd: c_int, path: *const c_char) -> Result<Resolved, c_int> {
    if path.is_null() || state::inside() {
        return Ok(Resolved::Kernel);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let Some(config) = state::config() else {
        return Ok(Resolved::Kernel);
    };
    if bytes.first() == Some(&b'/') {
        return Ok(match config.mount.classify(bytes) {
            Target::Locus {
                path,
                trailing_slash,
            } => Resolved::Locus {
                path,
                trailing_slash,
            },
            // `/locus/../etc` names `/etc`, but the kernel would look for `/locus` first,
            // which does not exist for it: hand it the folded path.
            Target::Kernel if bytes.starts_with(config.mount.prefix()) => {
                let folded = crate::path::normalize(bytes).expect("absolute");
                Resolved::KernelPath(CString::new(folded).map_err(|_| libc::EINVAL)?)
            }
            Target::Kernel => Resolved::Kernel,
        });
    }
    let base = if dirfd == libc::AT_FDCWD {
        match state::cwd() {
            Some(dir) => dir,
            None => return Ok(Resolved::Kernel),
        }
    } else if state::is_locus(dirfd) {
        let desc = state::desc(dirfd)?;
        desc.usable()?;
        if !matches!(desc.node, Node::Dir(_)) {
            return Err(libc::ENOTDIR);
        }
        desc.path.clone()
    } else {
        // A kernel directory (`openat(fd_of_/, "locus")`, as rsync and `find` walk): the
        // name may lead into the mount. Only a name that starts with `..` or with one of the
        // prefix's own components can, so only those pay for asking the kernel where the
        // directory is.
        if !could_reach(bytes, config.mount.prefix()) {
            return Ok(Resolved::Kernel);
        }
        let Some(dir) = kernel_dir(dirfd) else {
            return Ok(Resolved::Kernel);
        };
        let mut full = dir;
        full.push(b'/');
        full.extend_from_slice(bytes);
        let normal = crate::path::normalize(&full).ok_or(libc::EINVAL)?;
        return Ok(match config.mount.classify(&normal) {
            Target::Locus { path, .. } => Resolved::Locus {
                path,
                trailing_slash: bytes.ends_with(b"/"),
            },
            // Still the kernel's: its own dirfd and name, unchanged.
            Target::Kernel => Resolved::Kernel,
        });
    };
    if bytes.is_empty() {
        return Err(libc::ENOENT);
    }
    let (target, full) = config.mount.join(&base, bytes);
    Ok(match target {
        Target::Locus {
            path,
            trailing_slash,
        } => Resolved::Locus {
            path,
            trailing_slash,
        },
        Target::Kernel => Resolved::KernelPath(CString::new(full).map_err(|_| libc::EINVAL)?),
    })
}

/// Whether a name relative to a kernel directory could lead under the mount `prefix`: it
/// starts with `..` or with one of the prefix's components.
fn could_reach(relative: &[u8], prefix: &[u8]) -> bool {
    let first = relative.split(|&b| b == b'/').next().unwrap_or_default();
    first == b".."
        || (!first.is_empty()
            && prefix
                .split(|&b| b == b'/')
                .any(|component| component == first))
}

/// The absolute path of the kernel directory `dirfd` (from /proc/self/fd), if it has one.
fn kernel_dir(dirfd: c_int) -> Option<Vec<u8>> {
    let link = CString::new(format!("/proc/self/fd/{dirfd}")).ok()?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe {
        crate::real::readlinkat(
            libc::AT_FDCWD,
            link.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    buf.truncate(n);
    // A deleted directory, a socket or a pipe has no path to join.
    (buf.first() == Some(&b'/')).then_some(buf)
}

/// Calls `kernel` with the path to hand to libc (the caller's, or the rewritten one with
/// `AT_FDCWD`), or `locus` with the inside path. Symbolic links on the way are followed,
/// the last name's too unless `follow(false)` is given (`lstat`, `unlink`, `O_NOFOLLOW`).
macro_rules! route {
    (
        $dirfd:expr, $path:expr,
        kernel($kdirfd:ident, $kpath:ident) => $kernel:expr,
        locus($lpath:ident, $slash:ident) => $locus:expr $(,)?
    ) => {
        $crate::calls::route!($dirfd, $path, follow(true),
            kernel($kdirfd, $kpath) => $kernel,
            locus($lpath, $slash) => $locus)
    };
    (
        $dirfd:expr, $path:expr, follow($follow:expr),
        kernel($kdirfd:ident, $kpath:ident) => $kernel:expr,
        locus($lpath:ident, $slash:ident) => $locus:expr $(,)?
    ) => {{
        // SAFETY: `$path` is the caller's NUL-terminated path (or null).
        match unsafe { $crate::calls::resolve_as($dirfd, $path, $follow) } {
            Err(e) => {
                $crate::errno::set(e);
                <_ as $crate::real::Failed>::FAILED
            }
            Ok($crate::calls::Resolved::Kernel) => {
                let ($kdirfd, $kpath) = ($dirfd, $path);
                $kernel
            }
            Ok($crate::calls::Resolved::KernelPath(rewritten)) => {
                let ($kdirfd, $kpath) = (libc::AT_FDCWD, rewritten.as_ptr());
                let _ = $kdirfd;
                $kernel
            }
            Ok($crate::calls::Resolved::Locus {
                path: $lpath,
                trailing_slash: $slash,
            }) => {
                let _ = $slash;
                $locus
            }
        }
    }};
}
pub(crate) use route;

/// The current umask (read without changing it for longer than two calls).
pub(crate) fn umask() -> u32 {
    // SAFETY: umask cannot fail; the second call restores the first's change.
    unsafe {
        let mask = libc::umask(0o022);
        libc::umask(mask);
        mask
    }
}
