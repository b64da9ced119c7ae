//! The stdio calls that open files. glibc's `FILE` reads and writes through internal calls
//! no library can intercept, so a locus `FILE` is a `fopencookie` stream whose callbacks are
//! this library's `read`, `write`, `lseek` and `close`. glibc gives a cookie stream no
//! descriptor (`fileno` is -1), so the library keeps each of its streams' fd and answers
//! `fileno`/`fileno_unlocked` itself: `fstat(fileno(f))` works as programs expect.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{FILE, off64_t, size_t, ssize_t};

use super::fd::open_locus;
use super::route;
use crate::{errno, real, state};

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieFunctions {
    read: unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t,
    write: unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t,
    seek: unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int,
    close: unsafe extern "C" fn(*mut c_void) -> c_int,
}

unsafe extern "C" {
    fn fopencookie(
        cookie: *mut c_void,
        mode: *const c_char,
        functions: CookieFunctions,
    ) -> *mut FILE;
}

unsafe extern "C" {
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

/// The cookie streams this library made, and the locus fd each reads and writes: what
/// `fileno` answers for them. An entry goes when its stream is closed (its cookie's close
/// runs inside `fclose`, before glibc frees the `FILE`), so a later stream at the same
/// address is never mistaken for it.
static STREAMS: std::sync::Mutex<Vec<(usize, c_int)>> = std::sync::Mutex::new(Vec::new());

fn remember(stream: *mut FILE, fd: c_int) {
    let mut streams = STREAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    streams.retain(|&(s, _)| s != stream as usize);
    streams.push((stream as usize, fd));
}

/// Forgets the streams over `fd` (its stream is being closed).
fn forget_fd(fd: c_int) {
    STREAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|&(_, f)| f != fd);
}

fn forget(stream: *mut FILE) {
    STREAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|&(s, _)| s != stream as usize);
}

fn fd_of(stream: *mut FILE) -> Option<c_int> {
    STREAMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|&&(s, _)| s == stream as usize)
        .map(|&(_, fd)| fd)
}

/// `fileno(3)`: the locus fd of this library's streams, else libc's answer.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno(stream: *mut FILE) -> c_int {
    match fd_of(stream) {
        Some(fd) => fd,
        // SAFETY: passed through.
        None => unsafe { real::fileno(stream) },
    }
}

/// `fileno_unlocked(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut FILE) -> c_int {
    match fd_of(stream) {
        Some(fd) => fd,
        // SAFETY: passed through.
        None => unsafe { real::fileno_unlocked(stream) },
    }
}

/// The streams `stdin`, `stdout`, `stderr` had before they were made to follow a locus fd.
static ORIGINAL: [AtomicPtr<FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// Makes `stdin`/`stdout`/`stderr` follow fd 0/1/2 when it becomes (`locus`) or stops being
/// a locus fd. glibc's standard streams read and write through internal calls no library
/// can intercept, so while the fd is locus the stream is a cookie stream over this library's
/// `read`/`write` on that fd number (the way a shell's `echo hello > /locus/f` reaches the
/// file); the original stream comes back, flushed, when the fd is the kernel's again.
pub(crate) fn follow_std(fd: c_int, locus: bool) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let original = &ORIGINAL[fd as usize];
    // SAFETY: the standard stream variables are glibc's documented, assignable globals; the
    // program's own uses of them are as racy as ever (stdio's rules apply).
    unsafe {
        let slot: *mut *mut FILE = match fd {
            0 => &raw mut stdin,
            1 => &raw mut stdout,
            _ => &raw mut stderr,
        };
        let current = *slot;
        if locus {
            let mode = if fd == 0 { c"r" } else { c"w" };
            let functions = CookieFunctions {
                read: cookie_read,
                write: cookie_write,
                seek: cookie_seek,
                close: cookie_keep,
            };
            let stream = fopencookie(fd as usize as *mut c_void, mode.as_ptr(), functions);
            if stream.is_null() {
                return;
            }
            if fd == 2 {
                libc::setvbuf(stream, std::ptr::null_mut(), libc::_IONBF, 0);
            }
            libc::fflush(current);
            if original.load(Ordering::Relaxed).is_null() {
                original.store(current, Ordering::Relaxed);
            } else {
                forget(current);
                libc::fclose(current);
            }
            remember(stream, fd);
            *slot = stream;
        } else {
            let saved = original.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !saved.is_null() {
                forget(current);
                libc::fclose(current);
                *slot = saved;
            }
        }
    }
}

/// Closing a standard stream's cookie leaves the fd alone (the fd is the program's).
unsafe extern "C" fn cookie_keep(cookie: *mut c_void) -> c_int {
    forget_fd(cookie_fd(cookie));
    0
}

fn cookie_fd(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio passes its buffer of `len` bytes.
    unsafe { super::io::read(cookie_fd(cookie), buf.cast(), len) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio passes its buffer of `len` bytes.
    let n = unsafe { super::io::write(cookie_fd(cookie), buf.cast(), len) };
    // A cookie writer reports failure as 0 written (errno set).
    n.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, pos: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid position pointer.
    unsafe {
        let at = super::io::lseek64(cookie_fd(cookie), *pos, whence);
        if at < 0 {
            return -1;
        }
        *pos = at;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    forget_fd(cookie_fd(cookie));
    // SAFETY: the stream owns its fd.
    unsafe { super::fd::close(cookie_fd(cookie)) }
}

/// Opens a stream over the locus fd `fd` (which it owns from now on).
///
/// # Safety
/// `mode` is a NUL-terminated stdio mode.
unsafe fn stream(fd: c_int, mode: *const c_char) -> *mut FILE {
    let functions = CookieFunctions {
        read: cookie_read,
        write: cookie_write,
        seek: cookie_seek,
        close: cookie_close,
    };
    // SAFETY: a valid mode and function table; the cookie is the fd number.
    let file = unsafe { fopencookie(fd as usize as *mut c_void, mode, functions) };
    if file.is_null() {
        let e = errno::get();
        // SAFETY: our fd.
        unsafe { super::fd::close(fd) };
        errno::set(e);
    } else {
        remember(file, fd);
    }
    file
}

/// `open(2)` flags of a stdio mode ("r", "w+", "ax", "re", ...).
fn mode_flags(mode: &[u8]) -> Result<c_int, c_int> {
    let (first, rest) = mode.split_first().ok_or(libc::EINVAL)?;
    let plus = rest.contains(&b'+');
    let mut flags = match (first, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return Err(libc::EINVAL),
    };
    if rest.contains(&b'x') {
        flags |= libc::O_EXCL;
    }
    if rest.contains(&b'e') {
        flags |= libc::O_CLOEXEC;
    }
    Ok(flags)
}

/// `fopen64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::fopen64(path, mode) },
        locus(inner, slash) => {
            let opened = state::run(|| {
                if mode.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a NUL-terminated mode per C's contract.
                let flags = mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes())?;
                open_locus(&inner, slash, flags, 0o666)
            });
            match opened {
                // SAFETY: checked mode; our fd.
                Ok(fd) => unsafe { stream(fd, mode) },
                Err(e) => {
                    errno::set(e);
                    std::ptr::null_mut()
                }
            }
        },
    )
}

/// `fopen(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: forwarded contract.
    unsafe { fopen64(path, mode) }
}

/// `fdopen(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fdopen(fd, mode) };
    }
    if mode.is_null() {
        errno::set(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: checked mode; the caller hands the fd to the stream.
    unsafe { stream(fd, mode) }
}

/// The standard stream `stream` is (0, 1, 2), as the program sees it now.
fn std_index(stream: *mut FILE) -> Option<c_int> {
    // SAFETY: reading glibc's assignable globals, as the program may at any time.
    let current = unsafe { [stdin, stdout, stderr] };
    current
        .iter()
        .position(|&s| s == stream)
        .map(|k| k as c_int)
}

/// What `freopen` does with a stream: the fd it reads and writes, and whether the answer
/// is then the standard stream of that number (which may be a new `FILE`).
fn reopen_target(stream: *mut FILE) -> Option<(c_int, bool)> {
    let std = std_index(stream);
    match fd_of(stream) {
        Some(fd) => Some((fd, std.is_some())),
        None => std.map(|k| (k, true)),
    }
}

/// `freopen64(3)` where a locus path or a locus stream is involved: the new file is opened
/// (through this library or the kernel), moved onto the stream's fd with `dup2` (which makes
/// a standard stream follow it), and the stream starts over at its beginning. A plain glibc
/// stream other than `stdin`/`stdout`/`stderr` cannot be turned into a locus stream in place:
/// it is closed, as `freopen` closes it before opening, and the answer is `EOPNOTSUPP`.
/// `path` null (a new mode for the same file) on a locus stream is `EOPNOTSUPP`, the stream
/// kept.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    let ours = fd_of(stream).is_some();
    if path.is_null() {
        if ours {
            errno::set(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        // SAFETY: passed through.
        return unsafe { real::freopen64(path, mode, stream) };
    }
    if mode.is_null() {
        errno::set(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated mode per C's contract.
    let flags = match mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes()) {
        Ok(flags) => flags & !libc::O_CLOEXEC,
        Err(e) => {
            errno::set(e);
            return std::ptr::null_mut();
        }
    };
    // Opens the new file: `Ok(None)` when neither side is locus (libc's freopen then).
    let kernel_open = |dirfd: c_int, kpath: *const c_char| {
        if !ours {
            return Ok(None);
        }
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { real::openat(dirfd, kpath, flags, 0o666) };
        if fd < 0 {
            Err(errno::get())
        } else {
            Ok(Some(fd))
        }
    };
    // SAFETY: the caller's NUL-terminated path.
    let opened = match unsafe { super::resolve_as(libc::AT_FDCWD, path, true) } {
        Err(e) => Err(e),
        Ok(super::Resolved::Kernel) => kernel_open(libc::AT_FDCWD, path),
        Ok(super::Resolved::KernelPath(rewritten)) => {
            kernel_open(libc::AT_FDCWD, rewritten.as_ptr())
        }
        Ok(super::Resolved::Locus {
            path,
            trailing_slash,
        }) => state::run(|| open_locus(&path, trailing_slash, flags, 0o666)).map(Some),
    };
    let fd = match opened {
        Ok(None) => {
            // SAFETY: passed through.
            return unsafe { real::freopen64(path, mode, stream) };
        }
        Ok(Some(fd)) => fd,
        Err(e) => {
            errno::set(e);
            return std::ptr::null_mut();
        }
    };
    let Some((target, standard)) = reopen_target(stream) else {
        // SAFETY: our fd, then the caller's stream, which freopen closes in any case.
        unsafe {
            super::fd::close(fd);
            libc::fclose(stream);
        }
        errno::set(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's stream and fds: flush, move the new file onto the stream's fd
    // (dup2 makes a standard stream follow it), drop the extra fd.
    unsafe {
        libc::fflush(stream);
        let moved = super::fd::dup2(fd, target);
        let e = errno::get();
        super::fd::close(fd);
        if moved < 0 {
            errno::set(e);
            return std::ptr::null_mut();
        }
        let stream = if standard {
            [stdin, stdout, stderr][target as usize]
        } else {
            stream
        };
        libc::rewind(stream);
        stream
    }
}

/// `freopen(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut FILE,
) -> *mut FILE {
    // SAFETY: forwarded contract.
    unsafe { freopen64(path, mode, stream) }
}
