//! The `exec` family: locus fds without `FD_CLOEXEC`, and a locus working directory, are
//! handed over to the new program (see `state`'s handoff). `execl`, `execlp` and `execle`
//! are variadic and call libc's internal `execve`, so they hand nothing over; shells and
//! `posix_spawn`-free programs use the vector forms intercepted here.

use std::ffi::{CString, c_char, c_int};

use crate::state::{self, HANDOFF_ENV};
use crate::{errno, real};

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// Runs `exec` with the handoff added to `envp`; restores everything if it returns.
///
/// # Safety
/// `envp` is a null-terminated vector of NUL-terminated strings.
unsafe fn with_handoff(
    envp: *const *const c_char,
    exec: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if state::inside() {
        return exec(envp);
    }
    let Some((description, fds)) = state::handoff_for_exec() else {
        return exec(envp);
    };
    let Ok(entry) = CString::new(format!("{HANDOFF_ENV}={description}")) else {
        return exec(envp);
    };
    let prefix = format!("{HANDOFF_ENV}=");
    let mut vector: Vec<*const c_char> = Vec::new();
    if !envp.is_null() {
        let mut i = 0;
        // SAFETY: the caller's null-terminated vector.
        unsafe {
            while !(*envp.add(i)).is_null() {
                let item = *envp.add(i);
                if !std::ffi::CStr::from_ptr(item)
                    .to_bytes()
                    .starts_with(prefix.as_bytes())
                {
                    vector.push(item);
                }
                i += 1;
            }
        }
    }
    vector.push(entry.as_ptr());
    vector.push(std::ptr::null());
    // The reservations must survive the exec now (their kernel FD_CLOEXEC is set).
    for &fd in &fds {
        // SAFETY: our reservation fds.
        unsafe { real::fcntl(fd, libc::F_SETFD, 0) };
    }
    let rc = exec(vector.as_ptr());
    let e = errno::get();
    for &fd in &fds {
        // SAFETY: as above; the exec failed, so they are ours again.
        unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    }
    errno::set(e);
    rc
}

/// `execve(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: C's contract; the closure passes the (possibly extended) environment on.
    unsafe { with_handoff(envp, |envp| real::execve(path, argv, envp)) }
}

/// `execv(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: C's contract; `environ` is the process environment.
    unsafe { execve(path, argv, environ) }
}

/// `execvpe(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { with_handoff(envp, |envp| real::execvpe(file, argv, envp)) }
}

/// `execvp(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: C's contract; `environ` is the process environment.
    unsafe { execvpe(file, argv, environ) }
}

/// `fexecve(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { with_handoff(envp, |envp| real::fexecve(fd, argv, envp)) }
}

/// `vfork(2)` runs as `fork`: a `vfork` child shares the parent's memory, mount included,
/// so the fork handlers that suspend the parent's locus fds and release the volume (letting
/// the program the child executes mount it) could not run. POSIX allows `vfork` to be
/// `fork`; callers only lose the speed of not copying page tables.
///
/// # Safety
/// C's (the child must only `exec` or `_exit`, which `fork` makes safe anyway).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no preconditions.
    unsafe { libc::fork() }
}
