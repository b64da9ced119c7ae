//! Advisory locks on locus files — `fcntl` record locks (process-owned, the classic POSIX
//! kind), open-file-description locks (`F_OFD_*`) and `flock` — kept by the kernel, on a
//! host lock file per inode: `locks/INO` in the volume directory.
//!
//! Processes take turns with a volume (one mounts it at a time, the others' files suspended),
//! but locks must hold across the turns: a program that holds a lock and lets go of the
//! volume still holds the lock, and another program asking for it waits or fails as with a
//! kernel file system. So no lock lives in the library's memory. A process-owned lock is
//! taken on the process's own fd of the inode's lock file (one per inode, [`process_fd`]);
//! a description-owned one on the description's own fd of it (opened at its first lock,
//! [`open_lock_file`]), which moves with the description when it is suspended (a
//! `fork`, an `exec`, another process's turn) and comes back with it, so that a forked
//! child shares its parent's `flock` and OFD locks as with a kernel file. The kernel then
//! gives the semantics as they are: conflicts between processes and between descriptions,
//! `EDEADLK`, the holder's pid in `F_GETLK`, release when the last fd of a description
//! closes or the process ends (killed or not).
//!
//! Where the volume directory's lock files cannot be made (a directory this user cannot
//! write), a memory file of the process's own per inode stands in ([`private_lock_file`]):
//! locks then hold within the program and its forked children, and the program says so.
//!
//! Every lock fd is one of the library's own (above half the fd limit, protected from the
//! program's closes) and close-on-exec except while handed over an `exec`. The library
//! drops the process's record locks on an inode whenever one of the file's fds closes
//! ([`release_process`], POSIX's rule), and never closes a lock fd otherwise before the
//! description or process it belongs to ends — closing any fd of a lock file drops the
//! process's record locks on it.

use std::collections::HashMap;
use std::ffi::c_int;

use parking_lot::Mutex;

use crate::state::{self, Guard, ordered, rank};
use crate::{errno, real};

/// The process's fd of each inode's lock file, for its process-owned record locks.
static PROCESS: Mutex<Option<HashMap<u64, c_int>>> = Mutex::new(None);

/// Opens the lock file of inode `ino` (made if missing, readable and writable by every user
/// of the volume) as an internal fd: its own open file description, as a locus
/// description's OFD and `flock` locks need.
pub(crate) fn open_lock_file(ino: u64) -> Result<c_int, c_int> {
    let _inside = Guard::enter();
    let config = state::config().ok_or(libc::EIO)?;
    let dir = config.volume.join("locks");
    crate::suspended::shared_dir(&dir);
    let path = std::ffi::CString::new(format!("{}/{ino}", dir.display())).map_err(|_| libc::EIO)?;
    // SAFETY: a NUL-terminated path; plain system calls.
    let fd = unsafe {
        real::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        let e = errno::get();
        return private_lock_file(ino, &path.to_string_lossy(), e);
    }
    // SAFETY: our fd. (The mode under the creator's umask would keep other users out.)
    unsafe { libc::fchmod(fd, 0o666) };
    Ok(state::move_internal(fd))
}

/// The lock files this process made for itself, by inode, when the volume directory's could
/// not be used (a directory this user cannot write).
static PRIVATE: Mutex<Option<HashMap<u64, c_int>>> = Mutex::new(None);

/// A new open file description of this process's own lock file of inode `ino` (a memory
/// file, made at the first call): locks then hold among the process's descriptions and its
/// forked children, as they did before they were the kernel's, but other programs do not see
/// them. Said once on stderr, with why the volume's lock file `path` could not be opened.
fn private_lock_file(ino: u64, path: &str, e: c_int) -> Result<c_int, c_int> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "locus preload: cannot open the lock file {path}: {}; locks on locus files hold \
             within this program only",
            std::io::Error::from_raw_os_error(e)
        );
    }
    let mut private = PRIVATE.lock();
    let files = private.get_or_insert_with(HashMap::new);
    let base = match files.get(&ino) {
        Some(&fd) => fd,
        None => {
            // SAFETY: a literal name; plain system call.
            let fd = unsafe { libc::memfd_create(c"locus-lock".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(errno::get());
            }
            let fd = state::move_internal(fd);
            files.insert(ino, fd);
            fd
        }
    };
    // Another open file description of the same memory file.
    let again = std::ffi::CString::new(format!("/proc/self/fd/{base}")).map_err(|_| libc::EIO)?;
    // SAFETY: a NUL-terminated path; plain system call.
    let fd = unsafe { real::open(again.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno::get());
    }
    Ok(state::move_internal(fd))
}

/// The file of inode `ino` is gone (its last name removed): so is its lock file. Whoever
/// holds a lock on it keeps it (on its open fd of the lock file), and no one can open the
/// file by a name again — a file made under the same name is a new inode, with a lock file
/// of its own.
pub(crate) fn forget_inode(ino: u64) {
    let _inside = Guard::enter();
    if let Some(config) = state::config() {
        let _ = std::fs::remove_file(config.volume.join("locks").join(ino.to_string()));
    }
}

/// Closes a lock fd this library opened.
pub(crate) fn close(fd: c_int) {
    state::forget_internal(fd);
    // SAFETY: an internal fd no one else uses.
    unsafe { real::close(fd) };
}

/// The process's fd of inode `ino`'s lock file (opened at the first use).
pub(crate) fn process_fd(ino: u64) -> Result<c_int, c_int> {
    let mut fds = ordered(rank::LOCK_TABLE, || PROCESS.lock());
    let fds = fds.get_or_insert_with(HashMap::new);
    if let Some(&fd) = fds.get(&ino) {
        return Ok(fd);
    }
    let fd = open_lock_file(ino)?;
    fds.insert(ino, fd);
    Ok(fd)
}

/// One of the fds of inode `ino`'s file closed: the process's record locks on it go
/// (POSIX). The lock file's fd stays open — closing it would do the same, but another
/// thread may be waiting on it.
pub(crate) fn release_process(ino: u64) {
    let fd = ordered(rank::LOCK_TABLE, || PROCESS.lock())
        .as_ref()
        .and_then(|fds| fds.get(&ino).copied());
    if let Some(fd) = fd {
        // SAFETY: plain data; all-zero is valid (and a whole-file range).
        let mut all: libc::flock = unsafe { std::mem::zeroed() };
        all.l_type = libc::F_UNLCK as i16;
        all.l_whence = libc::SEEK_SET as i16;
        // SAFETY: our fd and a valid struct.
        unsafe { real::fcntl(fd, libc::F_SETLK, &raw mut all as libc::c_ulong) };
    }
}

/// The process's lock fds, to hand over an `exec` (record locks outlive an `exec`).
pub(crate) fn process_fds() -> Vec<(u64, c_int)> {
    ordered(rank::LOCK_TABLE, || PROCESS.lock())
        .as_ref()
        .map(|fds| fds.iter().map(|(&ino, &fd)| (ino, fd)).collect())
        .unwrap_or_default()
}

/// In a new image: the lock fd `fd` of inode `ino` handed over by the one before.
pub(crate) fn adopt_process_fd(ino: u64, fd: c_int) {
    adopt(fd);
    ordered(rank::LOCK_TABLE, || PROCESS.lock())
        .get_or_insert_with(HashMap::new)
        .insert(ino, fd);
}

/// In a new image: `fd`, a lock fd handed over, is the library's own again (close-on-exec,
/// protected from the program's closes).
pub(crate) fn adopt(fd: c_int) {
    // SAFETY: an fd handed over to this image.
    unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    state::move_internal(fd);
}

/// The tables' mutexes (the process's lock fds, then its own lock files), for the fork
/// handlers: a child must not inherit one another thread held.
pub(crate) fn mutexes() -> [&'static Mutex<Option<HashMap<u64, c_int>>>; 2] {
    [&PROCESS, &PRIVATE]
}

/// A record-lock command of `fcntl` on the lock fd `fd`, with `lock` already made absolute
/// (`SEEK_SET`); the kernel's answer as it gives it. A waiting command waits in the kernel.
pub(crate) fn record(fd: c_int, cmd: c_int, lock: &mut libc::flock) -> Result<(), c_int> {
    // SAFETY: our fd and a valid struct.
    let r = unsafe { real::fcntl(fd, cmd, std::ptr::from_mut(lock) as libc::c_ulong) };
    if r < 0 { Err(errno::get()) } else { Ok(()) }
}

/// `flock(2)` on the lock fd `fd`.
pub(crate) fn flock(fd: c_int, operation: c_int) -> Result<(), c_int> {
    // SAFETY: our fd.
    let r = unsafe { real::flock(fd, operation) };
    if r < 0 { Err(errno::get()) } else { Ok(()) }
}
