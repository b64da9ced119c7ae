//! Names and attributes: the `stat` family (with the `__xstat` forms older programs call),
//! `statfs`/`statvfs`, `access`, `unlink`, `rename`, `mkdir`, `rmdir`, `chmod`, `chown`, time
//! stamps, extended attributes, links and `chdir`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use fs::{Kind, Stat};
use libc::{mode_t, size_t, ssize_t};

use super::{fs_errno, int, route, size, unit};
use crate::stat::{self, device, fill_stat, fill_statfs, fill_statvfs, fill_statx, may_access};
use crate::state::{self, Node};
use crate::{errno, real};

/// Attributes of an inside path (a trailing slash needs a directory). The path was
/// resolved already: a symbolic link at its end is one the caller did not follow (`lstat`).
fn stat_path(fs: &fs::Fs, path: &str, trailing_slash: bool) -> Result<Stat, c_int> {
    let st = fs.lstat(path).map_err(|e| fs_errno(&e))?;
    if trailing_slash && st.kind != Kind::Dir {
        return Err(libc::ENOTDIR);
    }
    Ok(st)
}

fn stat_fd(fd: c_int) -> Result<(Stat, (u32, u32)), c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    match &desc.node {
        Node::File(file) => Ok((file.stat(), device(file.fs()))),
        Node::Dir(_) => state::with_fs(|fs| Ok((stat_path(fs, &desc.path, false)?, device(fs)))),
    }
}

fn locus_stat(path: &str, slash: bool, buf: *mut libc::stat) -> c_int {
    if buf.is_null() {
        errno::set(libc::EFAULT);
        return -1;
    }
    unit(state::run(|| {
        state::with_fs(|fs| {
            let st = stat_path(fs, path, slash)?;
            // SAFETY: the caller's `struct stat *`, checked non-null.
            fill_stat(&st, device(fs), unsafe { &mut *buf });
            Ok(())
        })
    }))
}

/// `AT_EMPTY_PATH` with an empty name on a locus fd: the call is about the fd itself.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn names_the_fd(dirfd: c_int, path: *const c_char, flags: c_int) -> bool {
    // SAFETY: the caller's contract.
    let empty = !path.is_null() && unsafe { *path } == 0;
    empty && flags & libc::AT_EMPTY_PATH != 0 && state::is_locus(dirfd)
}

/// `fstatat` for everyone: `AT_EMPTY_PATH` on a locus fd, a locus path, or libc's.
unsafe fn stat_at(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // `stat(".")` in a locus working directory while another process holds the volume: what
    // it was at the `chdir` (`state::cwd_stat`), rather than a wait for the holder.
    let is_dot = || {
        // SAFETY: a NUL-terminated path per C's contract, checked non-null.
        !path.is_null() && matches!(unsafe { CStr::from_ptr(path) }.to_bytes(), b"." | b"./")
    };
    if dirfd == libc::AT_FDCWD
        && !buf.is_null()
        && is_dot()
        && let Some(then) = state::cwd_stat()
    {
        // SAFETY: forwarded contract.
        let rc = state::without_busy_wait(|| unsafe { stat_here(dirfd, path, buf, flags) });
        if rc != 0 && errno::get() == libc::EBUSY {
            // SAFETY: the caller's `struct stat *`, checked non-null.
            unsafe { *buf = then };
            return 0;
        }
        return rc;
    }
    // SAFETY: forwarded contract.
    unsafe { stat_here(dirfd, path, buf, flags) }
}

/// [`stat_at`] without its answer for `.`.
///
/// # Safety
/// C's contract for `fstatat`.
unsafe fn stat_here(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: a NUL-terminated path per C's contract.
    if unsafe { names_the_fd(dirfd, path, flags) } {
        // SAFETY: forwarded contract.
        return unsafe { fstat64(dirfd, buf) };
    }
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::fstatat64(dirfd, path, buf, flags) },
        locus(inner, slash) => locus_stat(&inner, slash, buf),
    )
}

/// `stat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

/// `stat64(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

/// `lstat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `lstat64(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `fstatat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(dirfd, path, buf, flags) }
}

/// `fstatat64(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(dirfd, path, buf, flags) }
}

/// `fstat64(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fstat64(fd, buf) };
    }
    if buf.is_null() {
        errno::set(libc::EFAULT);
        return -1;
    }
    unit(state::run(|| {
        let (st, dev) = stat_fd(fd)?;
        // SAFETY: the caller's `struct stat *`, checked non-null.
        fill_stat(&st, dev, unsafe { &mut *buf });
        Ok(())
    }))
}

/// `fstat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat64(fd, buf) }
}

// The `__xstat` family: glibc before 2.33 compiled `stat()` into these, with a structure
// version first (1 on x86-64 is today's `struct stat`). libc's own copies cannot be looked up
// by name any more, so kernel paths go to today's functions.

/// `__xstat`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

/// `__xstat64`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat64(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, 0) }
}

/// `__lxstat`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__lxstat64`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat64(
    _ver: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__fxstat`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat64(fd, buf) }
}

/// `__fxstat64`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat64(fd, buf) }
}

/// `__fxstatat`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(dirfd, path, buf, flags) }
}

/// `__fxstatat64`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat_at(dirfd, path, buf, flags) }
}

/// `statx(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    if buf.is_null() {
        // SAFETY: passed through (the kernel reports the fault).
        return unsafe { real::statx(dirfd, path, flags, mask, buf) };
    }
    // SAFETY: a NUL-terminated path per C's contract.
    if unsafe { names_the_fd(dirfd, path, flags) } {
        return unit(state::run(|| {
            let (st, dev) = stat_fd(dirfd)?;
            // SAFETY: the caller's buffer, checked non-null.
            fill_statx(&st, dev, unsafe { &mut *buf });
            Ok(())
        }));
    }
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::statx(dirfd, path, flags, mask, buf) },
        locus(inner, slash) => unit(state::run(|| state::with_fs(|fs| {
            let st = stat_path(fs, &inner, slash)?;
            // SAFETY: the caller's buffer, checked non-null.
            fill_statx(&st, device(fs), unsafe { &mut *buf });
            Ok(())
        }))),
    )
}

macro_rules! statfs_calls {
    ($($name:ident, $fname:ident: $ty:ty, $fill:ident, $real:ident, $freal:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: the volume's capacity and free space.")]
        ///
        /// # Safety
        /// C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $ty) -> c_int {
            route!(libc::AT_FDCWD, path,
                // SAFETY: passed through.
                kernel(_dirfd, path) => unsafe { real::$real(path, buf) },
                locus(inner, slash) => unit(state::run(|| state::with_fs(|fs| {
                    stat_path(fs, &inner, slash)?;
                    if buf.is_null() {
                        return Err(libc::EFAULT);
                    }
                    // SAFETY: the caller's buffer, checked non-null.
                    $fill(fs, unsafe { &mut *buf });
                    Ok(())
                }))),
            )
        }

        #[doc = concat!("`", stringify!($fname), "`.")]
        ///
        /// # Safety
        /// C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fname(fd: c_int, buf: *mut $ty) -> c_int {
            if !state::is_locus(fd) {
                // SAFETY: passed through.
                return unsafe { real::$freal(fd, buf) };
            }
            unit(state::run(|| {
                let desc = state::desc(fd)?;
                desc.usable()?;
                if buf.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: the caller's buffer, checked non-null.
                state::with_fs(|fs| Ok($fill(fs, unsafe { &mut *buf })))
            }))
        }
    )*};
}

statfs_calls! {
    statfs, fstatfs: libc::statfs, fill_statfs, statfs64, fstatfs64;
    statfs64, fstatfs64: libc::statfs, fill_statfs, statfs64, fstatfs64;
    statvfs, fstatvfs: libc::statvfs, fill_statvfs, statvfs64, fstatvfs64;
    statvfs64, fstatvfs64: libc::statvfs, fill_statvfs, statvfs64, fstatvfs64;
}

fn check_access(path: &str, slash: bool, mode: c_int, effective: bool) -> Result<(), c_int> {
    if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        return Err(libc::EINVAL);
    }
    state::with_fs(|fs| {
        let st = stat_path(fs, path, slash)?;
        if may_access(&st, mode, effective) {
            Ok(())
        } else {
            Err(libc::EACCES)
        }
    })
}

/// `faccessat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::faccessat(dirfd, path, mode, flags) },
        locus(inner, slash) => unit(state::run(|| {
            check_access(&inner, slash, mode, flags & libc::AT_EACCESS != 0)
        })),
    )
}

/// `access(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::access(path, mode) },
        locus(inner, slash) => unit(state::run(|| check_access(&inner, slash, mode, false))),
    )
}

/// `euidaccess(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::euidaccess(path, mode) },
        locus(inner, slash) => unit(state::run(|| check_access(&inner, slash, mode, true))),
    )
}

/// `eaccess(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { euidaccess(path, mode) }
}

/// Where the file `st` describes is to keep a name instead of losing its last one, when a
/// process that let go of the volume holds it suspended ([`crate::suspended`]).
fn keep_for_suspended(fs: &fs::Fs, st: &Stat) -> Option<String> {
    (st.kind == Kind::File && st.nlink == 1)
        .then(|| crate::suspended::keep_for_holders(fs, st.ino))
        .flatten()
}

fn remove(path: &str, slash: bool, dir: bool) -> Result<(), c_int> {
    if path == "/" {
        return Err(if dir { libc::EBUSY } else { libc::EISDIR });
    }
    state::with_fs(|fs| {
        let st = stat_path(fs, path, slash)?;
        match (st.kind, dir) {
            (Kind::Dir, false) => return Err(libc::EISDIR),
            (kind, true) if kind != Kind::Dir => return Err(libc::ENOTDIR),
            _ => {}
        }
        let removed = if dir {
            fs.rmdir(path)
        } else if let Some(orphan) = keep_for_suspended(fs, &st) {
            // Its last name: moved where the process that holds it suspended finds it.
            fs.rename(path, &orphan)
        } else {
            fs.unlink(path).inspect(|()| {
                if st.nlink == 1 {
                    crate::locks::forget_inode(st.ino);
                }
            })
        };
        removed.map_err(|e| fs_errno(&e))
    })
}

/// `unlinkat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    route!(dirfd, path, follow(false),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::unlinkat(dirfd, path, flags) },
        locus(inner, slash) => unit(state::run(|| {
            if flags & !libc::AT_REMOVEDIR != 0 {
                return Err(libc::EINVAL);
            }
            remove(&inner, slash, flags & libc::AT_REMOVEDIR != 0)
        })),
    )
}

/// `unlink(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    route!(libc::AT_FDCWD, path, follow(false),
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::unlink(path) },
        locus(inner, slash) => unit(state::run(|| remove(&inner, slash, false))),
    )
}

/// `rmdir(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    route!(libc::AT_FDCWD, path, follow(false),
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::rmdir(path) },
        locus(inner, _slash) => unit(state::run(|| remove(&inner, false, true))),
    )
}

fn make_dir(path: &str, mode: mode_t) -> Result<(), c_int> {
    if path == "/" {
        return Err(libc::EEXIST);
    }
    state::with_fs(|fs| {
        stat::as_caller(fs)
            .mkdir(path, mode & 0o7777)
            .map_err(|e| fs_errno(&e))
    })
}

/// `mkdirat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    route!(dirfd, path, follow(false),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::mkdirat(dirfd, path, mode) },
        locus(inner, _slash) => unit(state::run(|| make_dir(&inner, mode))),
    )
}

/// `mkdir(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    route!(libc::AT_FDCWD, path, follow(false),
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::mkdir(path, mode) },
        locus(inner, _slash) => unit(state::run(|| make_dir(&inner, mode))),
    )
}

/// What `mknod` makes inside locus: a regular file (type bits 0 or `S_IFREG`), a FIFO, a
/// socket's name, or (for root, standing in for `CAP_MKNOD`) a device node. FIFOs, sockets
/// and devices are names and attributes only: opening one through this library is
/// `EOPNOTSUPP` (the kernel serves them through `locus mount`).
fn make_node(path: &str, mode: mode_t, dev: libc::dev_t) -> Result<(), c_int> {
    if path == "/" {
        return Err(libc::EEXIST);
    }
    let perms = mode & 0o7777;
    let kind = match mode & libc::S_IFMT {
        0 | libc::S_IFREG => None,
        libc::S_IFIFO => Some(Kind::Fifo),
        libc::S_IFSOCK => Some(Kind::Socket),
        libc::S_IFCHR => Some(Kind::CharDevice),
        libc::S_IFBLK => Some(Kind::BlockDevice),
        libc::S_IFDIR => return Err(libc::EPERM),
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: geteuid cannot fail.
    if kind.is_some_and(Kind::is_device) && unsafe { libc::geteuid() } != 0 {
        return Err(libc::EPERM);
    }
    state::with_fs(|fs| {
        let fs = stat::as_caller(fs);
        match kind {
            Some(kind) => {
                let rdev = if kind.is_device() { dev } else { 0 };
                fs.mknod(path, kind, perms, rdev)
            }
            None => {
                let options = fs::OpenOptions {
                    create: true,
                    exclusive: true,
                    mode: perms,
                    ..fs::OpenOptions::default()
                };
                fs.open_file(path, options).map(drop)
            }
        }
        .map_err(|e| fs_errno(&e))
    })
}

/// `mknodat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    route!(dirfd, path, follow(false),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::mknodat(dirfd, path, mode, dev) },
        locus(inner, _slash) => unit(state::run(|| make_node(&inner, mode, dev))),
    )
}

/// `mknod(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mknodat(libc::AT_FDCWD, path, mode, dev) }
}

/// `mkfifoat(3)`: `mknodat` of a FIFO (glibc's own calls `mknodat` inside the library,
/// where no interposer sees it).
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mknodat(dirfd, path, libc::S_IFIFO | (mode & 0o7777), 0) }
}

/// `mkfifo(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkfifoat(libc::AT_FDCWD, path, mode) }
}

/// `__xmknodat`: what glibc before 2.33 compiled `mknodat` into (the device number by
/// pointer).
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xmknodat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    if dev.is_null() {
        errno::set(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's `dev_t *`, checked non-null; the rest forwarded.
    unsafe { mknodat(dirfd, path, mode, *dev) }
}

/// `__xmknod`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xmknod(
    ver: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { __xmknodat(ver, libc::AT_FDCWD, path, mode, dev) }
}

/// Where one side of a rename leads.
enum Side {
    Locus(String, bool),
    Kernel(c_int, *const c_char),
    KernelPath(std::ffi::CString),
}

/// Where `path` leads, a symbolic link at its end followed or not.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn side_as(dirfd: c_int, path: *const c_char, follow: bool) -> Result<Side, c_int> {
    // SAFETY: forwarded contract.
    Ok(match unsafe { super::resolve_as(dirfd, path, follow) }? {
        super::Resolved::Locus {
            path,
            trailing_slash,
        } => Side::Locus(path, trailing_slash),
        super::Resolved::Kernel => Side::Kernel(dirfd, path),
        super::Resolved::KernelPath(p) => Side::KernelPath(p),
    })
}

/// Where `path` leads, a symbolic link at its end not followed.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn side(dirfd: c_int, path: *const c_char) -> Result<Side, c_int> {
    // SAFETY: forwarded contract.
    unsafe { side_as(dirfd, path, false) }
}

impl Side {
    /// The kernel's `(dirfd, path)` for a side that is not locus's.
    fn kernel(&self) -> Option<(c_int, *const c_char)> {
        match self {
            Side::Kernel(fd, p) => Some((*fd, *p)),
            Side::KernelPath(p) => Some((libc::AT_FDCWD, p.as_ptr())),
            Side::Locus(..) => None,
        }
    }
}

/// `renameat2(2)`: within locus, atomic; between locus and another file system, `EXDEV`
/// (so `mv` copies); `RENAME_NOREPLACE` is honoured, `RENAME_EXCHANGE` swaps the two
/// names atomically, `RENAME_WHITEOUT` is `EINVAL`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: C's contract for both paths.
    let sides = unsafe { side(fromfd, from).and_then(|a| Ok((a, side(tofd, to)?))) };
    let (a, b) = match sides {
        Ok(sides) => sides,
        Err(e) => {
            errno::set(e);
            return -1;
        }
    };
    match (&a, &b) {
        (Side::Locus(from, _), Side::Locus(to, to_slash)) => unit(state::run(|| {
            let exchange = flags == libc::RENAME_EXCHANGE;
            if flags & !libc::RENAME_NOREPLACE != 0 && !exchange {
                return Err(libc::EINVAL);
            }
            if from == "/" || to == "/" {
                return Err(libc::EBUSY);
            }
            if exchange {
                return state::with_fs(|fs| fs.exchange(from, to).map_err(|e| fs_errno(&e)));
            }
            state::with_fs(|fs| {
                let st = stat_path(fs, from, false)?;
                if *to_slash && st.kind != Kind::Dir {
                    return Err(libc::ENOTDIR);
                }
                if flags & libc::RENAME_NOREPLACE != 0 && fs.lstat(to).is_ok() {
                    return Err(libc::EEXIST);
                }
                if from == to {
                    return Ok(());
                }
                // A file whose last name the rename replaces, held by a suspended process,
                // keeps a name where that process finds it (made first, so the rename
                // itself stays one atomic step).
                let replaced = fs.lstat(to).ok().filter(|old| old.ino != st.ino);
                let kept = replaced.as_ref().and_then(|old| {
                    keep_for_suspended(fs, old).filter(|orphan| fs.link(to, orphan).is_ok())
                });
                let renamed = fs.rename(from, to);
                match (&renamed, kept, replaced) {
                    (Err(_), Some(orphan), _) => {
                        let _ = fs.unlink(&orphan);
                    }
                    (Ok(()), None, Some(old)) if old.kind == Kind::File && old.nlink == 1 => {
                        crate::locks::forget_inode(old.ino);
                    }
                    _ => {}
                }
                renamed.map_err(|e| fs_errno(&e))
            })
        })),
        (Side::Locus(..), _) | (_, Side::Locus(..)) => {
            errno::set(libc::EXDEV);
            -1
        }
        _ => {
            let ((fa, pa), (fb, pb)) = (a.kernel().expect("kernel"), b.kernel().expect("kernel"));
            // SAFETY: passed through.
            unsafe { real::renameat2(fa, pa, fb, pb, flags) }
        }
    }
}

/// `renameat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { renameat2(fromfd, from, tofd, to, 0) }
}

/// `rename(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { renameat2(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

fn change_mode(path: &str, mode: mode_t) -> Result<(), c_int> {
    state::with_fs(|fs| fs.chmod(path, mode & 0o7777).map_err(|e| fs_errno(&e)))
}

/// `fchmodat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    if flags & !libc::AT_SYMLINK_NOFOLLOW != 0 && !state::inside() {
        // glibc's own answer for any other flag (`AT_EMPTY_PATH` included).
        errno::set(libc::EINVAL);
        return -1;
    }
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::fchmodat(dirfd, path, mode, flags) },
        // A link's own mode cannot change (`EOPNOTSUPP`, as Linux says).
        locus(inner, _slash) => unit(state::run(|| {
            change_mode(&inner, mode).map_err(|e| if e == libc::ELOOP { libc::EOPNOTSUPP } else { e })
        })),
    )
}

/// `chmod(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::chmod(path, mode) },
        locus(inner, _slash) => unit(state::run(|| change_mode(&inner, mode))),
    )
}

/// `fchmod(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fchmod(fd, mode) };
    }
    unit(state::run(|| {
        let desc = state::desc(fd)?;
        desc.usable()?;
        match &desc.node {
            // The open file, whatever it is called now (or if it has no name).
            Node::File(file) => file.chmod(mode & 0o7777).map_err(|e| fs_errno(&e)),
            Node::Dir(_) => change_mode(&desc.path, mode),
        }
    }))
}

/// The ids a `chown` of a file of `st` to `uid`/`gid` (-1: unchanged) sets, if the
/// calling process may, by the kernel's rules: root sets any owner; the file's owner may
/// "change" its user to itself and its group to its current one or any group the process
/// has; anything else is `EPERM`. (Clearing set-ID bits is the file system's part.)
fn new_owner(
    st: &Stat,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> Result<(Option<u32>, Option<u32>), c_int> {
    let uid = (uid != u32::MAX).then_some(uid);
    let gid = (gid != u32::MAX).then_some(gid);
    let (euid, _) = stat::effective_ids();
    if euid == 0 {
        return Ok((uid, gid));
    }
    let (owner, group) = stat::shown_owner(st);
    let is_owner = owner == euid;
    let uid_ok = uid.is_none_or(|u| is_owner && u == owner);
    let gid_ok = gid.is_none_or(|g| is_owner && (g == group || stat::in_group(g, false)));
    if uid_ok && gid_ok {
        Ok((uid, gid))
    } else {
        Err(libc::EPERM)
    }
}

fn exists(path: &str, slash: bool) -> Result<(), c_int> {
    state::with_fs(|fs| stat_path(fs, path, slash).map(drop))
}

/// `chown` of `path` (`follow`: what a link there leads to, else the link itself).
fn change_owner(
    path: &str,
    slash: bool,
    follow: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> Result<(), c_int> {
    state::with_fs(|fs| {
        let (uid, gid) = new_owner(&stat_path(fs, path, slash)?, uid, gid)?;
        fs.set_owner(path, uid, gid, follow)
            .map_err(|e| fs_errno(&e))
    })
}

/// `fchownat(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: `path` is null or NUL-terminated per C's contract.
    if unsafe { names_the_fd(dirfd, path, flags) } {
        // SAFETY: forwarded contract.
        return unsafe { fchown(dirfd, uid, gid) };
    }
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::fchownat(dirfd, path, uid, gid, flags) },
        locus(inner, slash) => unit(state::run(|| {
            change_owner(&inner, slash, flags & libc::AT_SYMLINK_NOFOLLOW == 0, uid, gid)
        })),
    )
}

/// `chown(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::chown(path, uid, gid) },
        locus(inner, slash) => unit(state::run(|| change_owner(&inner, slash, true, uid, gid))),
    )
}

/// `lchown(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    route!(libc::AT_FDCWD, path, follow(false),
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::lchown(path, uid, gid) },
        locus(inner, slash) => unit(state::run(|| change_owner(&inner, slash, false, uid, gid))),
    )
}

/// `fchown(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fchown(fd, uid, gid) };
    }
    unit(state::run(|| {
        let desc = state::desc(fd)?;
        desc.usable()?;
        match &desc.node {
            Node::File(file) => {
                let (uid, gid) = new_owner(&file.stat(), uid, gid)?;
                file.set_owner(uid, gid).map_err(|e| fs_errno(&e))
            }
            Node::Dir(_) => change_owner(&desc.path, false, false, uid, gid),
        }
    }))
}

/// Times to set, ns since the epoch: (access, modification); `None` leaves one as it is.
type Times = (Option<u64>, Option<u64>);

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// One time in ns since the epoch, from seconds and nanoseconds: `EINVAL` for a fraction out
/// of range, and for times before 1970 (locus keeps times as unsigned nanoseconds, which
/// reach the year 2554; a negative time cannot be stored and is refused, not bent).
fn time_ns(sec: i64, nsec: i64) -> Result<u64, c_int> {
    if !(0..1_000_000_000).contains(&nsec) || sec < 0 {
        return Err(libc::EINVAL);
    }
    (sec as u64)
        .checked_mul(1_000_000_000)
        .and_then(|t| t.checked_add(nsec as u64))
        .ok_or(libc::EOVERFLOW)
}

/// The times a `utimensat` pair asks for (null: both now; `UTIME_NOW`, `UTIME_OMIT`).
///
/// # Safety
/// `times` is null or two valid timespecs.
unsafe fn timespec_times(times: *const libc::timespec) -> Result<Times, c_int> {
    if times.is_null() {
        let now = now_ns();
        return Ok((Some(now), Some(now)));
    }
    // SAFETY: two entries per C's contract.
    let pair = unsafe { std::slice::from_raw_parts(times, 2) };
    let one = |t: &libc::timespec| match t.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now_ns())),
        nsec => time_ns(t.tv_sec, nsec).map(Some),
    };
    Ok((one(&pair[0])?, one(&pair[1])?))
}

/// The times a `utimes` pair asks for (null: both now).
///
/// # Safety
/// `times` is null or two valid timevals.
unsafe fn timeval_times(times: *const libc::timeval) -> Result<Times, c_int> {
    if times.is_null() {
        let now = now_ns();
        return Ok((Some(now), Some(now)));
    }
    // SAFETY: two entries per C's contract.
    let pair = unsafe { std::slice::from_raw_parts(times, 2) };
    let one = |t: &libc::timeval| {
        if !(0..1_000_000).contains(&t.tv_usec) {
            return Err(libc::EINVAL);
        }
        time_ns(t.tv_sec, t.tv_usec * 1000).map(Some)
    };
    Ok((one(&pair[0])?, one(&pair[1])?))
}

/// The times a `utime` buffer asks for (null: both now).
///
/// # Safety
/// `times` is null or a valid utimbuf.
unsafe fn utimbuf_times(times: *const libc::utimbuf) -> Result<Times, c_int> {
    if times.is_null() {
        let now = now_ns();
        return Ok((Some(now), Some(now)));
    }
    // SAFETY: valid per C's contract.
    let t = unsafe { &*times };
    Ok((Some(time_ns(t.actime, 0)?), Some(time_ns(t.modtime, 0)?)))
}

/// Sets the times of the resolved inside `path` (a symbolic link at its end is one the
/// caller chose not to follow: its own times change).
fn set_path_times(path: &str, slash: bool, times: Times) -> Result<(), c_int> {
    state::with_fs(|fs| {
        stat_path(fs, path, slash)?;
        fs.set_times(path, times.0, times.1, false)
            .map_err(|e| fs_errno(&e))
    })
}

/// Sets the times of a locus fd's file or directory.
fn set_fd_times(fd: c_int, times: Times) -> Result<(), c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    match &desc.node {
        Node::File(file) => file.set_times(times.0, times.1).map_err(|e| fs_errno(&e)),
        Node::Dir(_) => set_path_times(&desc.path, false, times),
    }
}

/// `utimensat(2)`: times to the nanosecond, journaled; `AT_SYMLINK_NOFOLLOW` sets a link's
/// own.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() && state::is_locus(dirfd) {
        // SAFETY: forwarded contract (futimens form).
        return unsafe { futimens(dirfd, times) };
    }
    route!(dirfd, path, follow(flags & libc::AT_SYMLINK_NOFOLLOW == 0),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::utimensat(dirfd, path, times, flags) },
        locus(inner, slash) => unit(state::run(|| {
            if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) != 0 {
                return Err(libc::EINVAL);
            }
            // SAFETY: C's contract.
            let times = unsafe { timespec_times(times) }?;
            set_path_times(&inner, slash, times)
        })),
    )
}

/// `futimens(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::futimens(fd, times) };
    }
    unit(state::run(|| {
        // SAFETY: C's contract.
        let times = unsafe { timespec_times(times) }?;
        set_fd_times(fd, times)
    }))
}

macro_rules! path_times {
    ($($name:ident($ty:ty, $follow:expr, $times:ident);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: see `utimensat`.")]
        ///
        /// # Safety
        /// C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, times: *const $ty) -> c_int {
            route!(libc::AT_FDCWD, path, follow($follow),
                // SAFETY: passed through.
                kernel(_dirfd, path) => unsafe { real::$name(path, times) },
                locus(inner, slash) => unit(state::run(|| {
                    // SAFETY: C's contract.
                    let times = unsafe { $times(times) }?;
                    set_path_times(&inner, slash, times)
                })),
            )
        }
    )*};
}

path_times! {
    utimes(libc::timeval, true, timeval_times);
    lutimes(libc::timeval, false, timeval_times);
    utime(libc::utimbuf, true, utimbuf_times);
}

/// `futimes(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, times: *const libc::timeval) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::futimes(fd, times) };
    }
    unit(state::run(|| {
        // SAFETY: C's contract.
        let times = unsafe { timeval_times(times) }?;
        set_fd_times(fd, times)
    }))
}

// Extended attributes: the file system's (`user.`, `trusted.` and `security.` names),
// with the kernel's rules on top: `user.` names only on files and directories (`EPERM` to
// set one elsewhere, `ENODATA` to read one), `trusted.` names for root only (standing in for
// `CAP_SYS_ADMIN`: `EPERM` to set, `ENODATA` to read, left out of lists), names of 1..=255
// bytes (`ERANGE`), values of up to 64 KiB (`E2BIG`).

/// The inode an extended-attribute call works on.
#[derive(Clone, Copy)]
enum XattrOf<'a> {
    /// A path's: what a link there leads to (`true`), or the link itself.
    Path(&'a str, bool),
    /// An open locus fd's.
    Fd(c_int),
}

/// Runs `by_path` (file system, path, follow) or `by_file` on the inode of `of`.
fn on_xattr_inode<T>(
    of: XattrOf<'_>,
    by_path: impl FnOnce(&fs::Fs, &str, bool) -> fs::Result<T>,
    by_file: impl FnOnce(&fs::File) -> fs::Result<T>,
) -> Result<T, c_int> {
    match of {
        XattrOf::Path(path, follow) => {
            state::with_fs(|fs| by_path(fs, path, follow).map_err(|e| fs_errno(&e)))
        }
        XattrOf::Fd(fd) => {
            let desc = state::desc(fd)?;
            desc.usable()?;
            match &desc.node {
                Node::File(file) => by_file(file).map_err(|e| fs_errno(&e)),
                Node::Dir(_) => {
                    state::with_fs(|fs| by_path(fs, &desc.path, false).map_err(|e| fs_errno(&e)))
                }
            }
        }
    }
}

/// Whether the kernel lets the caller read (`write` false) or change `name` on `of`:
/// `Err` with its answer when not.
fn xattr_allowed(of: XattrOf<'_>, name: &str, write: bool) -> Result<(), c_int> {
    let refused = if write { libc::EPERM } else { libc::ENODATA };
    if name.starts_with("trusted.") && stat::effective_ids().0 != 0 {
        return Err(refused);
    }
    if name.starts_with("user.") {
        let kind = on_xattr_inode(
            of,
            |fs, path, follow| {
                if follow {
                    fs.stat(path)
                } else {
                    fs.lstat(path)
                }
            },
            |file| Ok(file.stat()),
        )?
        .kind;
        if !matches!(kind, Kind::File | Kind::Dir) {
            return Err(refused);
        }
    }
    Ok(())
}

/// The name an extended-attribute call was given: `ERANGE` for none or one over 255 bytes
/// (as the kernel), `EOPNOTSUPP` for one that is not UTF-8 (locus stores no such name).
///
/// # Safety
/// `name` is null or NUL-terminated.
unsafe fn xattr_name<'a>(name: *const c_char) -> Result<&'a str, c_int> {
    if name.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    if bytes.is_empty() || bytes.len() > fs::MAX_XATTR_NAME {
        return Err(libc::ERANGE);
    }
    std::str::from_utf8(bytes).map_err(|_| libc::EOPNOTSUPP)
}

/// `getxattr` of `of`: the value's length, copied into `value` unless `size` is 0 (a probe).
///
/// # Safety
/// `name` as for [`xattr_name`]; `value` holds `size` bytes.
unsafe fn get_xattr_of(
    of: XattrOf<'_>,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> Result<usize, c_int> {
    // SAFETY: forwarded.
    let name = unsafe { xattr_name(name) }?;
    xattr_allowed(of, name, false)?;
    let got = on_xattr_inode(
        of,
        |fs, path, follow| fs.get_xattr(path, name, follow),
        |file| file.get_xattr(name),
    )?;
    // SAFETY: the caller's buffer of `size` bytes.
    unsafe { copy_out(&got, value.cast(), size) }
}

/// `len` when `size` is 0 (a probe), else `bytes` copied to `out`, or `ERANGE`.
///
/// # Safety
/// `out` holds `size` bytes.
unsafe fn copy_out(bytes: &[u8], out: *mut u8, size: size_t) -> Result<usize, c_int> {
    if size == 0 {
        return Ok(bytes.len());
    }
    if bytes.len() > size {
        return Err(libc::ERANGE);
    }
    if out.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: `out` holds `size` >= `bytes.len()` bytes; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
    Ok(bytes.len())
}

/// `setxattr` of `of`.
///
/// # Safety
/// `name` as for [`xattr_name`]; `value` holds `size` bytes.
unsafe fn set_xattr_of(
    of: XattrOf<'_>,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> Result<(), c_int> {
    // SAFETY: forwarded.
    let name = unsafe { xattr_name(name) }?;
    if size > fs::MAX_XATTR_VALUE {
        return Err(libc::E2BIG);
    }
    let how = match flags {
        0 => fs::XattrSet::Any,
        libc::XATTR_CREATE => fs::XattrSet::Create,
        libc::XATTR_REPLACE => fs::XattrSet::Replace,
        _ => return Err(libc::EINVAL),
    };
    let value: &[u8] = if size == 0 {
        &[]
    } else if value.is_null() {
        return Err(libc::EFAULT);
    } else {
        // SAFETY: the caller's `size` bytes.
        unsafe { std::slice::from_raw_parts(value.cast(), size) }
    };
    xattr_allowed(of, name, true)?;
    on_xattr_inode(
        of,
        |fs, path, follow| fs.set_xattr(path, name, value, how, follow),
        |file| file.set_xattr(name, value, how),
    )
}

/// `listxattr` of `of`: each name NUL-terminated (`trusted.` ones for root only).
///
/// # Safety
/// `list` holds `size` bytes.
unsafe fn list_xattrs_of(of: XattrOf<'_>, list: *mut c_char, size: size_t) -> Result<usize, c_int> {
    let names = on_xattr_inode(of, fs::Fs::list_xattrs, |file| Ok(file.list_xattrs()))?;
    let root = stat::effective_ids().0 == 0;
    let bytes: Vec<u8> = names
        .iter()
        .filter(|n| root || !n.starts_with("trusted."))
        .flat_map(|n| n.bytes().chain([0]))
        .collect();
    // SAFETY: the caller's buffer of `size` bytes.
    unsafe { copy_out(&bytes, list.cast(), size) }
}

/// `removexattr` of `of`.
///
/// # Safety
/// `name` as for [`xattr_name`].
unsafe fn remove_xattr_of(of: XattrOf<'_>, name: *const c_char) -> Result<(), c_int> {
    // SAFETY: forwarded.
    let name = unsafe { xattr_name(name) }?;
    xattr_allowed(of, name, true)?;
    on_xattr_inode(
        of,
        |fs, path, follow| fs.remove_xattr(path, name, follow),
        |file| file.remove_xattr(name),
    )
}

/// One path form of an extended-attribute call: `follow` says whether a link at the last
/// name is followed (`getxattr`) or is itself the target (`lgetxattr`).
macro_rules! xattr_path_call {
    ($name:ident, $follow:expr, $doc:expr,
        ($($arg:ident: $ty:ty),*) -> $ret:ty => $imp:ident, $wrap:path) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char $(, $arg: $ty)*) -> $ret {
            route!(libc::AT_FDCWD, path, follow($follow),
                // SAFETY: passed through.
                kernel(_dirfd, path) => unsafe { real::$name(path $(, $arg)*) },
                locus(inner, slash) => $wrap(state::run(|| {
                    exists(&inner, slash)?;
                    // SAFETY: the caller's arguments, per C's contract.
                    unsafe { $imp(XattrOf::Path(&inner, $follow) $(, $arg)*) }
                })),
            )
        }
    };
}

/// Each extended-attribute call in its three forms: by path, by path naming a link itself,
/// by fd.
macro_rules! xattr_calls {
    ($($name:ident, $lname:ident, $fname:ident: ($($arg:ident: $ty:ty),*) -> $ret:ty
        => $imp:ident, $wrap:path;)*) => {$(
        xattr_path_call!($name, true, concat!("`", stringify!($name), "(2)`."),
            ($($arg: $ty),*) -> $ret => $imp, $wrap);
        xattr_path_call!($lname, false,
            concat!("`", stringify!($lname), "(2)`: a symbolic link's own."),
            ($($arg: $ty),*) -> $ret => $imp, $wrap);

        #[doc = concat!("`", stringify!($fname), "(2)`.")]
        ///
        /// # Safety
        /// C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fname(fd: c_int $(, $arg: $ty)*) -> $ret {
            if !state::is_locus(fd) {
                // SAFETY: passed through.
                return unsafe { real::$fname(fd $(, $arg)*) };
            }
            // SAFETY: the caller's arguments, per C's contract.
            $wrap(state::run(|| unsafe { $imp(XattrOf::Fd(fd) $(, $arg)*) }))
        }
    )*};
}

xattr_calls! {
    getxattr, lgetxattr, fgetxattr: (name: *const c_char, value: *mut c_void, size: size_t)
        -> ssize_t => get_xattr_of, crate::calls::size;
    setxattr, lsetxattr, fsetxattr:
        (name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int
        => set_xattr_of, unit;
    listxattr, llistxattr, flistxattr: (list: *mut c_char, size: size_t) -> ssize_t
        => list_xattrs_of, crate::calls::size;
    removexattr, lremovexattr, fremovexattr: (name: *const c_char) -> c_int
        => remove_xattr_of, unit;
}

/// `readlinkat(2)`: a link's target, truncated to `len` bytes without a NUL (as the kernel
/// does); `EINVAL` for anything but a link.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    len: size_t,
) -> ssize_t {
    // SAFETY: the caller's NUL-terminated path (or null).
    if let Some(target) = unsafe { fd_link_target(path) } {
        return size(copy_link(&target, buf, len));
    }
    route!(dirfd, path, follow(false),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::readlinkat(dirfd, path, buf, len) },
        locus(inner, slash) => size(state::run(|| {
            if slash {
                // `link/` names what the link leads to: a directory or nothing, not a link.
                exists(&inner, slash)?;
                return Err(libc::EINVAL);
            }
            let target = state::with_fs(|fs| fs.readlink(&inner).map_err(|e| fs_errno(&e)))?;
            copy_link(target.as_bytes(), buf, len)
        })),
    )
}

/// `readlink` of an open locus fd's own link (`/proc/self/fd/N`, `/dev/fd/N`): the path it
/// was opened by, under the mount prefix, where the kernel would name its placeholder (`/`).
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn fd_link_target(path: *const c_char) -> Option<Vec<u8>> {
    if path.is_null() || state::inside() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let (fd, own_link, rest) = super::fd_name(bytes)?;
    if !own_link || !rest.is_empty() || !state::is_locus(fd) {
        return None;
    }
    let desc = state::desc(fd).ok()?;
    desc.usable().ok()?;
    Some(state::config()?.mount.outside(&desc.path))
}

/// A link's target into the caller's buffer, truncated to `len` and not terminated, as
/// `readlink` returns it.
fn copy_link(target: &[u8], buf: *mut c_char, len: size_t) -> Result<usize, c_int> {
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    if len == 0 {
        return Err(libc::EINVAL);
    }
    let n = target.len().min(len);
    // SAFETY: the caller's buffer of `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(target.as_ptr().cast::<c_char>(), buf, n) };
    Ok(n)
}

/// `readlink(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { readlinkat(libc::AT_FDCWD, path, buf, len) }
}

/// `symlinkat(2)`: the link is stored as given (any target, absolute or relative, need not
/// exist); targets must be UTF-8, as every locus name.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    route!(dirfd, path, follow(false),
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::symlinkat(target, dirfd, path) },
        locus(inner, slash) => unit(state::run(|| {
            if target.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: NUL-terminated per C's contract.
            let bytes = unsafe { CStr::from_ptr(target) }.to_bytes();
            if bytes.is_empty() {
                return Err(libc::ENOENT);
            }
            if bytes.len() >= libc::PATH_MAX as usize {
                return Err(libc::ENAMETOOLONG);
            }
            let target = std::str::from_utf8(bytes).map_err(|_| libc::EINVAL)?;
            if inner == "/" {
                return Err(libc::EEXIST);
            }
            if slash {
                // The kernel makes no link named `name/`.
                return Err(if state::with_fs(|fs| Ok(fs.lstat(&inner).is_ok()))? {
                    libc::EEXIST
                } else {
                    libc::ENOENT
                });
            }
            state::with_fs(|fs| {
                stat::as_caller(fs)
                    .symlink(target, &inner)
                    .map_err(|e| fs_errno(&e))
            })
        })),
    )
}

/// `symlink(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { symlinkat(target, libc::AT_FDCWD, path) }
}

/// `linkat(2)`: within locus, a further name for a file or symbolic link (`EPERM` for a
/// directory); between locus and another file system, `EXDEV`. `AT_SYMLINK_FOLLOW` links
/// what a symbolic link at `from` leads to. An open locus file is linked by its descriptor
/// — `AT_EMPTY_PATH`, or its `/proc/self/fd/N` name with `AT_SYMLINK_FOLLOW` — whatever it
/// is called now: how a file from `open(dir, O_TMPFILE)` gets its name.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn linkat(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    if flags & !(libc::AT_SYMLINK_FOLLOW | libc::AT_EMPTY_PATH) != 0 {
        return int(Err(libc::EINVAL));
    }
    let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
    // SAFETY: C's contract for `from`.
    let by_fd = if unsafe { names_the_fd(fromfd, from, flags) } {
        Some(fromfd)
    } else if follow {
        // SAFETY: C's contract for `from`.
        unsafe { locus_fd_named(from) }
    } else {
        None
    };
    if let Some(fd) = by_fd {
        // SAFETY: C's contract for `to`.
        return match unsafe { side(tofd, to) } {
            Ok(Side::Locus(to, slash)) => unit(state::run(|| link_open_file(fd, &to, slash))),
            Ok(_) => int(Err(libc::EXDEV)),
            Err(e) => int(Err(e)),
        };
    }
    // SAFETY: C's contract for both paths.
    let sides = unsafe { side_as(fromfd, from, follow).and_then(|a| Ok((a, side(tofd, to)?))) };
    let (a, b) = match sides {
        Ok(sides) => sides,
        Err(e) => return int(Err(e)),
    };
    match (&a, &b) {
        (Side::Locus(from, from_slash), Side::Locus(to, to_slash)) => unit(state::run(|| {
            state::with_fs(|fs| {
                if *from_slash {
                    // A source with a trailing slash must be a directory (which the file
                    // system then refuses a second name: EPERM).
                    stat_path(fs, from, true)?;
                }
                if *to_slash {
                    // A new name with a trailing slash: the kernel's answers.
                    return Err(if fs.lstat(to).is_ok() {
                        libc::EEXIST
                    } else {
                        libc::ENOENT
                    });
                }
                fs.link(from, to).map_err(|e| fs_errno(&e))
            })
        })),
        (Side::Locus(..), _) | (_, Side::Locus(..)) => int(Err(libc::EXDEV)),
        _ => {
            let ((fa, pa), (fb, pb)) = (a.kernel().expect("kernel"), b.kernel().expect("kernel"));
            // SAFETY: passed through.
            unsafe { real::linkat(fa, pa, fb, pb, flags) }
        }
    }
}

/// The locus fd `path` is the kernel's name of (`/proc/self/fd/N`, `/dev/fd/N`), if any.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn locus_fd_named(path: *const c_char) -> Option<c_int> {
    if path.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated per the contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let (fd, own_link, rest) = super::fd_name(bytes)?;
    (own_link && rest.is_empty() && state::is_locus(fd)).then_some(fd)
}

/// Names the file open as locus `fd` `to` too (`ENOENT` when its names were all removed,
/// or it was made `O_TMPFILE | O_EXCL`; `EPERM` for a directory).
fn link_open_file(fd: c_int, to: &str, to_slash: bool) -> Result<(), c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    let Node::File(file) = &desc.node else {
        return Err(libc::EPERM);
    };
    if to_slash {
        return Err(state::with_fs(|fs| {
            Ok(if fs.lstat(to).is_ok() {
                libc::EEXIST
            } else {
                libc::ENOENT
            })
        })?);
    }
    file.link(to).map_err(|e| fs_errno(&e))
}

/// `link(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { linkat(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

/// `chdir(2)`: into a locus directory, the library keeps the working directory itself (the
/// kernel's stays where it was) and resolves relative paths against it; anywhere else, the
/// kernel's `chdir`, which ends the locus one.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    route!(libc::AT_FDCWD, path,
        kernel(_dirfd, path) => {
            // SAFETY: passed through.
            let rc = unsafe { real::chdir(path) };
            if rc == 0 {
                state::set_cwd(None);
            }
            rc
        },
        locus(inner, _slash) => unit(state::run(|| {
            let (st, dev) = state::with_fs(|fs| Ok((stat_path(fs, &inner, false)?, device(fs))))?;
            if st.kind != Kind::Dir {
                return Err(libc::ENOTDIR);
            }
            state::set_cwd(Some(inner.clone()));
            // SAFETY: a plain C struct, for which all zeros is a valid value.
            let mut then: libc::stat = unsafe { std::mem::zeroed() };
            fill_stat(&st, dev, &mut then);
            state::set_cwd_stat(then);
            Ok(())
        })),
    )
}

/// `fchdir(2)`: see [`chdir`].
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        let rc = unsafe { real::fchdir(fd) };
        if rc == 0 {
            state::set_cwd(None);
        }
        return rc;
    }
    unit(state::run(|| {
        let desc = state::desc(fd)?;
        desc.usable()?;
        match desc.node {
            Node::Dir(_) => {
                state::set_cwd(Some(desc.path.clone()));
                state::set_cwd_ino(desc.ino);
                Ok(())
            }
            Node::File(_) => Err(libc::ENOTDIR),
        }
    }))
}

/// `getcwd(3)`: the locus working directory when there is one.
///
/// # Safety
/// C's: `buf` is null or holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, len: size_t) -> *mut c_char {
    let Some(dir) = state::cwd().filter(|_| !state::inside()) else {
        // SAFETY: passed through.
        return unsafe { real::getcwd(buf, len) };
    };
    let Some(config) = state::config() else {
        // SAFETY: passed through.
        return unsafe { real::getcwd(buf, len) };
    };
    let path = config.mount.outside(&dir);
    let need = path.len() + 1;
    // SAFETY: glibc's extension (null buffer: allocate) or the caller's buffer of `len`.
    unsafe {
        let out = if buf.is_null() {
            let out = libc::malloc(need.max(len)).cast::<c_char>();
            if out.is_null() {
                errno::set(libc::ENOMEM);
                return out;
            }
            out
        } else {
            if len < need {
                errno::set(if len == 0 { libc::EINVAL } else { libc::ERANGE });
                return std::ptr::null_mut();
            }
            buf
        };
        std::ptr::copy_nonoverlapping(path.as_ptr().cast::<c_char>(), out, path.len());
        *out.add(path.len()) = 0;
        out
    }
}

/// `get_current_dir_name(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    if state::cwd().is_none() {
        // SAFETY: passed through.
        return unsafe { real::get_current_dir_name() };
    }
    // SAFETY: allocating form.
    unsafe { getcwd(std::ptr::null_mut(), 0) }
}

/// Copies `path` with a NUL into `buf` (`PATH_MAX` bytes, as `realpath`'s caller provides),
/// or into memory from `malloc` when `buf` is null.
///
/// # Safety
/// `buf` is null or holds `PATH_MAX` bytes.
unsafe fn c_path_out(path: &[u8], buf: *mut c_char) -> Result<*mut c_char, c_int> {
    if path.len() >= libc::PATH_MAX as usize {
        return Err(libc::ENAMETOOLONG);
    }
    // SAFETY: a fresh allocation or the caller's buffer, both of at least len + 1 bytes.
    unsafe {
        let out = if buf.is_null() {
            let out = libc::malloc(path.len() + 1).cast::<c_char>();
            if out.is_null() {
                return Err(libc::ENOMEM);
            }
            out
        } else {
            buf
        };
        std::ptr::copy_nonoverlapping(path.as_ptr().cast::<c_char>(), out, path.len());
        *out.add(path.len()) = 0;
        Ok(out)
    }
}

/// `realpath(3)`: glibc's walks the path with internal calls no library sees (it would say
/// `ENOENT` for every /locus path); for a locus path the library answers itself, following
/// links as every other call does, and the kernel's paths go to libc.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    if path.is_null() {
        errno::set(libc::EINVAL);
        return std::ptr::null_mut();
    }
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::realpath(path, resolved) },
        locus(inner, slash) => {
            let found = state::run(|| {
                state::with_fs(|fs| stat_path(fs, &inner, slash))?;
                let outside = state::config().ok_or(libc::EIO)?.mount.outside(&inner);
                // SAFETY: C's contract for `resolved`.
                unsafe { c_path_out(&outside, resolved) }
            });
            found.unwrap_or_else(|e| {
                errno::set(e);
                std::ptr::null_mut()
            })
        },
    )
}

/// `canonicalize_file_name(3)`: `realpath` into memory from `malloc`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: forwarded contract.
    unsafe { realpath(path, std::ptr::null_mut()) }
}

/// `__realpath_chk`: `realpath` as `_FORTIFY_SOURCE` builds call it.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    _resolved_len: size_t,
) -> *mut c_char {
    // SAFETY: forwarded contract.
    unsafe { realpath(path, resolved) }
}
