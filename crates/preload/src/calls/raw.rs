//! `syscall(2)`: programs call the kernel by number for calls glibc wraps late or not at all
//! (`copy_file_range` in fsx, `close_range`, `statx`, `renameat2`, `getdents64` in older
//! code). Such a call on a locus fd or path would reach the kernel with the fd's placeholder
//! (a descriptor of `/`: `getdents64` would list the host's root) or a path that does not
//! exist there. The calls this library implements are routed to their C-library stand-ins
//! here, with the raw call's argument layout; every other number, and every call the library
//! makes itself, goes to libc's `syscall` unchanged.
//!
//! `syscall` is variadic in C. It is defined here with six argument words, as glibc's own
//! reads them: on x86-64 and AArch64 Linux the first five (AArch64: all six) arrive in
//! registers whether the call is variadic or not, and a word the caller did not pass is read
//! but not used. Raw calls return -1 and set `errno` on failure, as the stand-ins do.

use std::ffi::{c_char, c_long};

use super::{dir, exec, fd, io, meta};
use crate::{real, state};

/// `syscall(2)`.
///
/// # Safety
/// C's contract for the call `n` names: the argument words are what that call expects.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    if state::inside() {
        // SAFETY: the library's own call, passed through.
        return unsafe { real::syscall(n, [a, b, c, d, e, f]) };
    }
    // SAFETY: in every arm the words are the raw call's arguments, which have the stand-in's
    // types in the same order (or, where noted, the raw layout is converted); the caller
    // upholds the call's contract.
    unsafe {
        match n {
            libc::SYS_read => io::read(a as _, b as _, c as _).word(),
            libc::SYS_write => io::write(a as _, b as _, c as _).word(),
            libc::SYS_pread64 => io::pread64(a as _, b as _, c as _, d as _).word(),
            libc::SYS_pwrite64 => io::pwrite64(a as _, b as _, c as _, d as _).word(),
            libc::SYS_readv => io::readv(a as _, b as _, c as _).word(),
            libc::SYS_writev => io::writev(a as _, b as _, c as _).word(),
            // (fd, iov, count, pos_low, pos_high[, flags]): on a 64-bit kernel the low word
            // holds the whole offset.
            libc::SYS_preadv => io::preadv(a as _, b as _, c as _, d as _).word(),
            libc::SYS_pwritev => io::pwritev(a as _, b as _, c as _, d as _).word(),
            libc::SYS_preadv2 => io::preadv2(a as _, b as _, c as _, d as _, f as _).word(),
            libc::SYS_pwritev2 => io::pwritev2(a as _, b as _, c as _, d as _, f as _).word(),
            libc::SYS_lseek => io::lseek(a as _, b as _, c as _).word(),
            libc::SYS_fsync => io::fsync(a as _).word(),
            libc::SYS_fdatasync => io::fdatasync(a as _).word(),
            libc::SYS_syncfs => io::syncfs(a as _).word(),
            libc::SYS_sync_file_range => io::sync_file_range(a as _, b as _, c as _, d as _).word(),
            libc::SYS_ftruncate => io::ftruncate(a as _, b as _).word(),
            libc::SYS_truncate => io::truncate(a as _, b as _).word(),
            libc::SYS_fallocate => io::fallocate(a as _, b as _, c as _, d as _).word(),
            libc::SYS_copy_file_range => {
                io::copy_file_range(a as _, b as _, c as _, d as _, e as _, f as _).word()
            }
            libc::SYS_sendfile => io::sendfile64(a as _, b as _, c as _, d as _).word(),
            libc::SYS_splice => io::splice(a as _, b as _, c as _, d as _, e as _, f as _).word(),
            libc::SYS_mmap => io::mmap(a as _, b as _, c as _, d as _, e as _, f as _).word(),
            libc::SYS_munmap => io::munmap(a as _, b as _).word(),
            libc::SYS_mremap => io::mremap(a as _, b as _, c as _, d as _, e as _).word(),
            libc::SYS_msync => io::msync(a as _, b as _, c as _).word(),
            libc::SYS_mprotect => io::mprotect(a as _, b as _, c as _).word(),
            libc::SYS_pkey_mprotect => io::pkey_mprotect(a as _, b as _, c as _, d as _).word(),
            libc::SYS_getdents64 => dir::getdents64(a as _, b as _, c as _).word(),
            libc::SYS_close => fd::close(a as _).word(),
            libc::SYS_close_range => fd::close_range(a as _, b as _, c as _).word(),
            libc::SYS_dup => fd::dup(a as _).word(),
            libc::SYS_dup3 => fd::dup3(a as _, b as _, c as _).word(),
            libc::SYS_fcntl => fd::fcntl(a as _, b as _, c as _).word(),
            libc::SYS_flock => fd::flock(a as _, b as _).word(),
            libc::SYS_openat => fd::openat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_fstat => meta::fstat(a as _, b as _).word(),
            libc::SYS_newfstatat => meta::fstatat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_statx => meta::statx(a as _, b as _, c as _, d as _, e as _).word(),
            libc::SYS_statfs => meta::statfs(a as _, b as _).word(),
            libc::SYS_fstatfs => meta::fstatfs(a as _, b as _).word(),
            // The raw faccessat and fchmodat take no flags (glibc's flags forms are
            // faccessat2 and fchmodat2).
            libc::SYS_faccessat => meta::faccessat(a as _, b as _, c as _, 0).word(),
            libc::SYS_faccessat2 => meta::faccessat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_fchmodat => meta::fchmodat(a as _, b as _, c as _, 0).word(),
            libc::SYS_fchmod => meta::fchmod(a as _, b as _).word(),
            libc::SYS_fchownat => meta::fchownat(a as _, b as _, c as _, d as _, e as _).word(),
            libc::SYS_fchown => meta::fchown(a as _, b as _, c as _).word(),
            libc::SYS_utimensat => meta::utimensat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_unlinkat => meta::unlinkat(a as _, b as _, c as _).word(),
            libc::SYS_mkdirat => meta::mkdirat(a as _, b as _, c as _).word(),
            libc::SYS_mknodat => meta::mknodat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_renameat => meta::renameat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_renameat2 => meta::renameat2(a as _, b as _, c as _, d as _, e as _).word(),
            libc::SYS_symlinkat => meta::symlinkat(a as _, b as _, c as _).word(),
            libc::SYS_readlinkat => meta::readlinkat(a as _, b as _, c as _, d as _).word(),
            libc::SYS_linkat => meta::linkat(a as _, b as _, c as _, d as _, e as _).word(),
            libc::SYS_chdir => meta::chdir(a as _).word(),
            libc::SYS_fchdir => meta::fchdir(a as _).word(),
            // The raw call returns the length written, terminating NUL included.
            libc::SYS_getcwd => {
                let buf = a as *mut c_char;
                if meta::getcwd(buf, b as _).is_null() {
                    -1
                } else {
                    (std::ffi::CStr::from_ptr(buf).to_bytes().len() + 1) as c_long
                }
            }
            libc::SYS_execve => exec::execve(a as _, b as _, c as _).word(),
            _ => legacy(n, [a, b, c, d, e, f]),
        }
    }
}

/// The x86-64 calls that AArch64 has only in their `at` forms.
///
/// # Safety
/// As [`syscall`].
#[cfg(target_arch = "x86_64")]
unsafe fn legacy(n: c_long, w: [c_long; 6]) -> c_long {
    let [a, b, c, ..] = w;
    // SAFETY: as in `syscall`.
    unsafe {
        match n {
            libc::SYS_open => fd::open(a as _, b as _, c as _).word(),
            libc::SYS_creat => fd::creat(a as _, b as _).word(),
            libc::SYS_dup2 => fd::dup2(a as _, b as _).word(),
            libc::SYS_stat => meta::stat(a as _, b as _).word(),
            libc::SYS_lstat => meta::lstat(a as _, b as _).word(),
            libc::SYS_access => meta::access(a as _, b as _).word(),
            libc::SYS_unlink => meta::unlink(a as _).word(),
            libc::SYS_rmdir => meta::rmdir(a as _).word(),
            libc::SYS_mkdir => meta::mkdir(a as _, b as _).word(),
            libc::SYS_mknod => meta::mknod(a as _, b as _, c as _).word(),
            libc::SYS_rename => meta::rename(a as _, b as _).word(),
            libc::SYS_symlink => meta::symlink(a as _, b as _).word(),
            libc::SYS_readlink => meta::readlink(a as _, b as _, c as _).word(),
            libc::SYS_link => meta::link(a as _, b as _).word(),
            libc::SYS_chmod => meta::chmod(a as _, b as _).word(),
            libc::SYS_chown => meta::chown(a as _, b as _, c as _).word(),
            libc::SYS_lchown => meta::lchown(a as _, b as _, c as _).word(),
            _ => real::syscall(n, w),
        }
    }
}

/// AArch64 has no legacy forms: everything else is libc's.
///
/// # Safety
/// As [`syscall`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn legacy(n: c_long, w: [c_long; 6]) -> c_long {
    // SAFETY: passed through.
    unsafe { real::syscall(n, w) }
}

/// A stand-in's return value as the raw call's result word.
trait Word {
    fn word(self) -> c_long;
}

impl Word for std::ffi::c_int {
    fn word(self) -> c_long {
        c_long::from(self)
    }
}

/// `ssize_t`.
impl Word for isize {
    fn word(self) -> c_long {
        self as c_long
    }
}

/// `off_t`.
impl Word for i64 {
    fn word(self) -> c_long {
        self
    }
}

/// `mmap`'s and `mremap`'s address (`MAP_FAILED` is -1).
impl<T> Word for *mut T {
    fn word(self) -> c_long {
        self as c_long
    }
}
