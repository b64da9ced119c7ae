//! Opening and closing: `open` and its variants, `close`, `dup*`, `fcntl`, `flock`, `lockf`,
//! `ioctl`.

use std::ffi::{c_char, c_int, c_uint, c_ulong};

use fs::{FsError, Kind, OpenOptions};
use libc::{mode_t, off_t};

use super::{fs_errno, int, route, unit};
use crate::state::{self, Desc, FdEntry, Node};
use crate::{errno, real};

/// Status flags an open file description keeps (and `F_GETFL` reports).
const STATUS_FLAGS: c_int = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_ASYNC
    | libc::O_PATH;
/// Flags `F_SETFL` may change.
const SETFL_FLAGS: c_int =
    libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME | libc::O_ASYNC;

/// Opens the locus file or directory `path` with `open(2)`'s flags; returns the new fd.
pub(crate) fn open_locus(
    path: &str,
    trailing_slash: bool,
    flags: c_int,
    mode: mode_t,
) -> Result<c_int, c_int> {
    let access = flags & libc::O_ACCMODE;
    if access == libc::O_ACCMODE {
        return Err(libc::EINVAL);
    }
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return open_unnamed(path, flags, mode);
    }
    let write = access != libc::O_RDONLY && flags & libc::O_PATH == 0;
    let create = flags & libc::O_CREAT != 0 && flags & libc::O_PATH == 0;
    let desc = state::with_fs(|fs| {
        match fs.stat(path) {
            Ok(st) if st.kind == Kind::Dir => {
                if create && flags & libc::O_EXCL != 0 {
                    return Err(libc::EEXIST);
                }
                if write || create {
                    return Err(libc::EISDIR);
                }
                return Ok(Desc::new(
                    Node::Dir(Default::default()),
                    path.to_owned(),
                    st.ino,
                    flags & STATUS_FLAGS,
                ));
            }
            Ok(_) if flags & libc::O_DIRECTORY != 0 || trailing_slash => {
                return Err(libc::ENOTDIR);
            }
            Err(FsError::NotFound(_)) if create && trailing_slash => return Err(libc::EISDIR),
            Err(FsError::NotFound(_)) if create && flags & libc::O_DIRECTORY != 0 => {
                return Err(libc::EINVAL);
            }
            _ => {}
        }
        let options = OpenOptions {
            read: access != libc::O_WRONLY,
            write,
            create,
            exclusive: create && flags & libc::O_EXCL != 0,
            // O_TRUNC without write access is unspecified; it truncates nothing here.
            truncate: write && flags & libc::O_TRUNC != 0,
            mode: mode & 0o7777,
        };
        if options.truncate
            && let Ok(st) = fs.stat(path)
        {
            // Mappings of the file stop mapping its blocks before they are freed.
            super::shared::before_shrink(st.ino, 0)?;
        }
        let creator;
        let fs = if create {
            creator = crate::stat::as_caller(fs);
            &creator
        } else {
            fs
        };
        let file = fs.open_file(path, options).map_err(|e| fs_errno(&e))?;
        if options.truncate && super::shared::is_mapped(&file) {
            // The open emptied the file: its copy in memory too (the file system's part is
            // repeated under the copy's lock, as every change of a mapped file is).
            super::mapped_copy::change(
                &file,
                || file.set_len(0).map_err(|e| fs_errno(&e)),
                |copy| copy.set_len(0),
            )?;
        }
        let ino = file.ino();
        Ok(Desc::new(
            Node::File(file),
            path.to_owned(),
            ino,
            flags & STATUS_FLAGS,
        ))
    })?;
    state::new_fd(desc, flags & libc::O_CLOEXEC != 0)
}

/// `open(dir, O_TMPFILE)`: a file with no name in the locus directory `dir`, opened for
/// writing (`EINVAL` without); `linkat` may name it, unless it was opened `O_EXCL`.
fn open_unnamed(dir: &str, flags: c_int, mode: mode_t) -> Result<c_int, c_int> {
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EINVAL);
    }
    let desc = state::with_fs(|fs| {
        let file = crate::stat::as_caller(fs)
            .create_unnamed(
                dir,
                mode & 0o7777,
                flags & libc::O_ACCMODE == libc::O_RDWR,
                flags & libc::O_EXCL != 0,
            )
            .map_err(|e| fs_errno(&e))?;
        let ino = file.ino();
        Ok(Desc::new(
            Node::File(file),
            dir.to_owned(),
            ino,
            flags & STATUS_FLAGS & !libc::O_DIRECTORY,
        ))
    })?;
    state::new_fd(desc, flags & libc::O_CLOEXEC != 0)
}

unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // `O_NOFOLLOW` refuses a link at the last name (`ELOOP`); `O_CREAT | O_EXCL` fails on one
    // (`EEXIST`) rather than creating its target.
    let exclusive = flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL;
    let follow = flags & libc::O_NOFOLLOW == 0 && !exclusive;
    route!(dirfd, path, follow(follow),
        kernel(dirfd, path) => {
            // SAFETY: the caller's arguments, unchanged (or a path we built).
            let fd = unsafe { real::openat(dirfd, path, flags, mode) };
            if fd >= 0 && state::inside() {
                state::move_internal(fd)
            } else {
                fd
            }
        },
        locus(inner, slash) => int(state::run(|| open_locus(&inner, slash, flags, mode))),
    )
}

/// `open(2)`.
///
/// # Safety
/// C's contract: `path` is a NUL-terminated string; `mode` is read only with `O_CREAT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

/// `open64(2)`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

/// `openat(2)`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, mode) }
}

/// `openat64(2)`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, mode) }
}

/// `__open_2`: `open` with `_FORTIFY_SOURCE` (no mode: O_CREAT is refused by the caller).
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

/// `__open64_2`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

/// `__openat_2`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, 0) }
}

/// `__openat64_2`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, 0) }
}

/// `creat(2)`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

/// `creat64(2)`.
///
/// # Safety
/// As [`open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { creat(path, mode) }
}

/// Closes a locus fd: forgets it, drops the process's record locks on the file (POSIX:
/// closing any fd of a file releases them), gives the number back to the kernel.
fn close_locus(fd: c_int) -> Result<(), c_int> {
    super::stdio::follow_std(fd, false);
    let Some(slot) = state::uninstall(fd) else {
        // A suspended fd (see `state`): nothing is open in the file system.
        // SAFETY: the reservation of that fd.
        unsafe { real::close(fd) };
        return Ok(());
    };
    if slot.desc.usable().is_ok() {
        crate::locks::release_process(slot.desc.ino);
    }
    // SAFETY: `fd` is the reservation we made for this locus fd.
    unsafe { real::close(fd) };
    state::release(slot);
    Ok(())
}

/// `close(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !state::is_locus(fd) {
        if state::is_internal(fd) {
            if !state::inside() {
                // The library's own fd (the volume lock, a device): to the program, a number
                // that is not open.
                errno::set(libc::EBADF);
                return -1;
            }
            state::forget_internal(fd);
        }
        // SAFETY: passed through.
        return unsafe { real::close(fd) };
    }
    unit(state::run(|| close_locus(fd)))
}

/// `close_range(2)` flags (linux/close_range.h).
const CLOSE_RANGE_UNSHARE: c_int = 1 << 1;
const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

/// `close_range(2)`: the locus fds in the range are closed as `close` closes them (marked
/// close-on-exec with `CLOSE_RANGE_CLOEXEC`), the library's own fds stay open, and the kernel
/// closes the rest.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if state::inside() || first > last || flags & !(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC) != 0
    {
        // SAFETY: passed through (the kernel judges bad arguments).
        return unsafe { real::close_range(first, last, flags) };
    }
    unit(close_range_keeping_ours(first, last, flags))
}

/// `closefrom(3)`: `close_range(lowfd, ~0, 0)`, keeping the library's own fds.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // closefrom reports nothing; a kernel refusal leaves the fds open, as glibc's would when
    // its fallback fails.
    let _ = close_range_keeping_ours(lowfd.max(0) as c_uint, c_uint::MAX, 0);
}

fn close_range_keeping_ours(first: c_uint, last: c_uint, flags: c_int) -> Result<(), c_int> {
    let to_int = |n: c_uint| n.min(c_int::MAX as c_uint) as c_int;
    let (lo, hi) = (to_int(first), to_int(last));
    let cloexec = flags & CLOSE_RANGE_CLOEXEC != 0;
    for fd in state::locus_fds_in(lo, hi) {
        if cloexec {
            state::set_cloexec(fd, true)?;
        } else {
            state::run(|| close_locus(fd))?;
        }
    }
    // The kernel takes the gaps between the library's own fds (their placeholders of the locus
    // fds just closed are already gone).
    let mut from = first;
    for own in state::internal_in(lo, hi) {
        let own = own as c_uint;
        if own > from {
            kernel_close_range(from, own - 1, flags)?;
        }
        // `own` ≤ `c_int::MAX`: no overflow.
        from = own + 1;
    }
    if from <= last {
        kernel_close_range(from, last, flags)?;
    }
    Ok(())
}

fn kernel_close_range(first: c_uint, last: c_uint, flags: c_int) -> Result<(), c_int> {
    // SAFETY: plain system call on numbers (none of them the library's).
    if unsafe { real::close_range(first, last, flags) } == 0 {
        Ok(())
    } else {
        Err(errno::get())
    }
}

/// `dup(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::dup(fd) };
    }
    int(state::run(|| dup_from(fd, None, false)))
}

/// A new locus fd (the lowest free number ≥ `at_least`) sharing `fd`'s description.
fn dup_from(fd: c_int, at_least: Option<c_int>, cloexec: bool) -> Result<c_int, c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    let new = state::reserve(at_least)?;
    state::install(new, FdEntry { desc, cloexec });
    Ok(new)
}

/// `dup2`/`dup3` onto `newfd`: whichever side is locus, the table follows the kernel.
fn dup_onto(oldfd: c_int, newfd: c_int, cloexec: bool) -> Result<c_int, c_int> {
    let old_locus = if state::is_locus(oldfd) {
        Some(state::entry(oldfd)?)
    } else {
        None
    };
    if let Some(slot) = &old_locus {
        slot.desc.usable()?;
    }
    let flags = if old_locus.is_some() || cloexec {
        libc::O_CLOEXEC
    } else {
        0
    };
    // SAFETY: dup3 on the caller's numbers (for a locus oldfd, on our reservation).
    let result = unsafe { real::dup3(oldfd, newfd, flags) };
    if result < 0 {
        return Err(errno::get());
    }
    super::stdio::follow_std(newfd, old_locus.is_some());
    let replaced = match old_locus {
        Some(slot) => state::install(
            newfd,
            FdEntry {
                desc: slot.desc,
                cloexec,
            },
        ),
        None => state::uninstall(newfd),
    };
    if let Some(replaced) = replaced {
        if replaced.desc.usable().is_ok() {
            crate::locks::release_process(replaced.desc.ino);
        }
        state::release(replaced);
    }
    Ok(newfd)
}

/// `dup2(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if state::is_internal(newfd) && !state::inside() {
        // Replacing the library's own fd would drop the volume lock or a device.
        errno::set(libc::EBADF);
        return -1;
    }
    if !state::is_locus(oldfd) && !state::is_locus(newfd) {
        // SAFETY: passed through.
        return unsafe { real::dup2(oldfd, newfd) };
    }
    if oldfd == newfd {
        return newfd;
    }
    int(state::run(|| dup_onto(oldfd, newfd, false)))
}

/// `dup3(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if state::is_internal(newfd) && !state::inside() {
        // Replacing the library's own fd would drop the volume lock or a device.
        errno::set(libc::EBADF);
        return -1;
    }
    if !state::is_locus(oldfd) && !state::is_locus(newfd) {
        // SAFETY: passed through.
        return unsafe { real::dup3(oldfd, newfd, flags) };
    }
    if oldfd == newfd || flags & !libc::O_CLOEXEC != 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    int(state::run(|| {
        dup_onto(oldfd, newfd, flags & libc::O_CLOEXEC != 0)
    }))
}

/// A lock request's byte range `[start, end)` from `struct flock`.
fn lock_range(desc: &Desc, lock: &libc::flock) -> Result<(u64, u64), c_int> {
    let base: i64 = match c_int::from(lock.l_whence) {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => *state::ordered(state::rank::POSITION, || desc.pos.lock()) as i64,
        libc::SEEK_END => desc.file()?.len() as i64,
        _ => return Err(libc::EINVAL),
    };
    let start = base.checked_add(lock.l_start).ok_or(libc::EOVERFLOW)?;
    let (start, end) = match lock.l_len {
        0 => (start, i128::from(u64::MAX)),
        len if len > 0 => (start, i128::from(start) + i128::from(len)),
        len => (start + len, i128::from(start)),
    };
    if start < 0 {
        return Err(libc::EINVAL);
    }
    Ok((start as u64, end.min(i128::from(u64::MAX)) as u64))
}

/// A record-lock command of `fcntl`, ready for the kernel: the lock fd it goes to (the
/// description's for OFD commands, the process's otherwise) and the lock with an absolute
/// range. Made while the caller holds the description; run ([`run_record_lock`]) after it
/// let go of it, so that a command that waits for another process's lock never keeps this
/// one from letting go of the volume meanwhile.
struct RecordLock {
    fd: c_int,
    cmd: c_int,
    lock: libc::flock,
}

/// Checks a record-lock command and makes it ready ([`RecordLock`]).
fn record_lock(desc: &Desc, cmd: c_int, lock: &libc::flock) -> Result<RecordLock, c_int> {
    let ofd = matches!(
        cmd,
        libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
    );
    if ofd && lock.l_pid != 0 {
        return Err(libc::EINVAL);
    }
    let (start, end) = lock_range(desc, lock)?;
    let test = matches!(cmd, libc::F_GETLK | libc::F_OFD_GETLK);
    let access = desc.status.load(std::sync::atomic::Ordering::Relaxed) & libc::O_ACCMODE;
    match c_int::from(lock.l_type) {
        libc::F_UNLCK if test => return Err(libc::EINVAL),
        libc::F_RDLCK if !test && access == libc::O_WRONLY => return Err(libc::EBADF),
        libc::F_WRLCK if !test && access == libc::O_RDONLY => return Err(libc::EBADF),
        libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK => {}
        _ => return Err(libc::EINVAL),
    }
    let fd = if ofd {
        desc.lock_fd()?
    } else {
        crate::locks::process_fd(desc.ino)?
    };
    // SAFETY: plain data; all-zero is valid.
    let mut absolute: libc::flock = unsafe { std::mem::zeroed() };
    absolute.l_type = lock.l_type;
    absolute.l_whence = libc::SEEK_SET as i16;
    absolute.l_start = i64::try_from(start).map_err(|_| libc::EOVERFLOW)?;
    absolute.l_len = if end == u64::MAX {
        0
    } else {
        i64::try_from(end - start).map_err(|_| libc::EOVERFLOW)?
    };
    Ok(RecordLock {
        fd,
        cmd,
        lock: absolute,
    })
}

/// Runs a record-lock command in the kernel; a test (`F_GETLK`) writes the conflicting lock
/// (or `F_UNLCK`) into the caller's `lock`.
fn run_record_lock(mut request: RecordLock, lock: &mut libc::flock) -> Result<c_int, c_int> {
    crate::locks::record(request.fd, request.cmd, &mut request.lock)?;
    if matches!(request.cmd, libc::F_GETLK | libc::F_OFD_GETLK) {
        let found = request.lock;
        lock.l_type = found.l_type;
        if c_int::from(found.l_type) != libc::F_UNLCK {
            lock.l_whence = libc::SEEK_SET as i16;
            lock.l_start = found.l_start;
            lock.l_len = found.l_len;
            lock.l_pid = found.l_pid;
        }
    }
    Ok(0)
}

fn fcntl_locus(fd: c_int, cmd: c_int, arg: c_ulong) -> Result<c_int, c_int> {
    let slot = state::entry(fd)?;
    let desc = &slot.desc;
    desc.usable()?;
    use std::sync::atomic::Ordering::Relaxed;
    match cmd {
        libc::F_DUPFD => dup_from(fd, Some(arg as c_int), false),
        libc::F_DUPFD_CLOEXEC => dup_from(fd, Some(arg as c_int), true),
        libc::F_GETFD => Ok(if slot.cloexec { libc::FD_CLOEXEC } else { 0 }),
        libc::F_SETFD => {
            state::set_cloexec(fd, arg as c_int & libc::FD_CLOEXEC != 0)?;
            Ok(0)
        }
        libc::F_GETFL => Ok(desc.status.load(Relaxed) | libc::O_LARGEFILE),
        libc::F_SETFL => {
            let keep = desc.status.load(Relaxed) & !SETFL_FLAGS;
            desc.status
                .store(keep | (arg as c_int & SETFL_FLAGS), Relaxed);
            Ok(0)
        }
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => {
            desc.file()?;
            let lock = arg as *mut libc::flock;
            if lock.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: the caller passes a `struct flock *` with the lock commands.
            let lock = unsafe { &mut *lock };
            let request = record_lock(desc, cmd, lock)?;
            // Waiting holds nothing of the program's files (see `RecordLock`).
            drop(slot);
            run_record_lock(request, lock)
        }
        // Leases, notifications, seals, pipe sizes, owners: not for locus files.
        _ => Err(libc::EINVAL),
    }
}

/// `fcntl(2)`.
///
/// # Safety
/// C's contract for `cmd`'s argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fcntl(fd, cmd, arg) };
    }
    int(state::run(|| fcntl_locus(fd, cmd, arg)))
}

/// `fcntl64`.
///
/// # Safety
/// As [`fcntl`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fcntl(fd, cmd, arg) }
}

/// `flock(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::flock(fd, operation) };
    }
    unit(state::run(|| {
        if !matches!(
            operation & !libc::LOCK_NB,
            libc::LOCK_SH | libc::LOCK_EX | libc::LOCK_UN
        ) {
            return Err(libc::EINVAL);
        }
        let lock_fd = {
            let desc = state::desc(fd)?;
            desc.usable()?;
            desc.lock_fd()?
        };
        // Waiting holds nothing of the program's files (see `RecordLock`).
        crate::locks::flock(lock_fd, operation)
    }))
}

/// `lockf(3)`: process-owned record locks from the current offset.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::lockf64(fd, cmd, len) };
    }
    int(state::run(|| {
        let desc = state::desc(fd)?;
        desc.file()?;
        // SAFETY: plain data; all-zero is valid.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_whence = libc::SEEK_CUR as i16;
        lock.l_len = len;
        let (command, kind) = match cmd {
            libc::F_LOCK => (libc::F_SETLKW, libc::F_WRLCK),
            libc::F_TLOCK => (libc::F_SETLK, libc::F_WRLCK),
            libc::F_ULOCK => (libc::F_SETLK, libc::F_UNLCK),
            libc::F_TEST => (libc::F_GETLK, libc::F_WRLCK),
            _ => return Err(libc::EINVAL),
        };
        lock.l_type = kind as i16;
        let request = record_lock(&desc, command, &lock)?;
        drop(desc);
        run_record_lock(request, &mut lock)?;
        if cmd == libc::F_TEST && c_int::from(lock.l_type) != libc::F_UNLCK {
            return Err(libc::EACCES);
        }
        Ok(0)
    }))
}

/// `lockf64(3)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { lockf(fd, cmd, len) }
}

/// `ioctl(2)`: no device requests apply to locus files (`ENOTTY`, as for any regular file
/// without the request).
///
/// # Safety
/// C's contract for `request`'s argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::ioctl(fd, request, arg) };
    }
    errno::set(libc::ENOTTY);
    -1
}
