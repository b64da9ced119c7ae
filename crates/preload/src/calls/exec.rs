//! The `exec` family: locus fds without `FD_CLOEXEC`, and a locus working directory, are
//! handed over to the new program (see `state`'s handoff). `execl`, `execlp` and `execle`
//! are variadic and call libc's internal `execve`, so they hand nothing over; shells and
//! `posix_spawn`-free programs use the vector forms intercepted here.
//!
//! Programs stored on the volume run too, although the kernel cannot see them: a name that
//! leads out of the volume (a Python virtual environment's `bin/python3` link) is executed
//! at its host path; a script (`#!`) is run as the kernel runs one — its interpreter (a
//! host path, or itself on the volume), the line's one optional argument, then the script's
//! name as given, which the interpreter (under this library too) reads from the volume;
//! anything else is copied into a sealed memory file and executed from there (`fexecve`),
//! so an ELF program's image comes from the volume. The caller needs execute permission
//! (`EACCES` otherwise, as for a directory or a special file). `execvp` and `execvpe` search
//! a `PATH` holding volume directories themselves, with glibc's rules.

use std::ffi::{CStr, CString, c_char, c_int};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::Resolved;
use crate::state::{self, HANDOFF_ENV};
use crate::{errno, real};

/// Most interpreters one exec goes through (a script whose interpreter is a script on the
/// volume...), as the kernel's limit; `ELOOP` beyond.
const MAX_INTERPRETERS: usize = 4;

/// Bytes of a program's start the kernel reads for a `#!` line (`BINPRM_BUF_SIZE`).
const HEAD: usize = 256;

/// What runs for a program on the volume.
enum Program {
    /// A script: its interpreter and the `#!` line's optional argument.
    Script {
        interpreter: CString,
        argument: Option<CString>,
    },
    /// Anything else, copied into a memory file (the kernel decides whether it runs).
    Image(OwnedFd),
}

/// `execve` with programs on the volume: see the module documentation. Returns only on
/// failure (-1, `errno` set).
///
/// # Safety
/// C's contract for `execve`'s arguments.
unsafe fn exec_any(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if state::inside() || path.is_null() {
        // SAFETY: C's contract.
        return unsafe { with_handoff(envp, |envp| real::execve(path, argv, envp)) };
    }
    // SAFETY: C's contract: a NUL-terminated path, a null-terminated `argv`.
    let program = match unsafe { runnable(CStr::from_ptr(path), argv, false, 0) } {
        Ok(Some(program)) => program,
        // SAFETY: C's contract.
        Ok(None) => return unsafe { with_handoff(envp, |envp| real::execve(path, argv, envp)) },
        Err(e) => return fail(e),
    };
    let argv = program.argv(argv);
    match &program.target {
        // SAFETY: C's contract for `envp`; the path and arguments live in `program`.
        Target::Path(host) => unsafe {
            with_handoff(envp, |envp| real::execve(host.as_ptr(), argv, envp))
        },
        // SAFETY: as above; `fd` is a memory file holding the program.
        Target::Image(fd) => unsafe {
            with_handoff(envp, |envp| real::fexecve(fd.as_raw_fd(), argv, envp))
        },
    }
}

fn fail(e: c_int) -> c_int {
    errno::set(e);
    -1
}

/// Reads how to run the volume's file at `path` (which the caller may execute).
fn program(fs: &fs::Fs, path: &str) -> Result<Program, c_int> {
    let fs_errno = |e: fs::FsError| e.errno();
    if fs.stat(path).map_err(fs_errno)?.kind != fs::Kind::File {
        return Err(libc::EACCES);
    }
    let file = fs.open_read(path).map_err(fs_errno)?;
    let mut head = [0u8; HEAD];
    let n = file.read_at(&mut head, 0).map_err(fs_errno)?;
    if let Some(line) = head[..n].strip_prefix(b"#!") {
        let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
        let blank = |b: &u8| *b == b' ' || *b == b'\t';
        let line = &line[line.iter().position(|b| !blank(b)).unwrap_or(line.len())..];
        let end = line.iter().position(blank).unwrap_or(line.len());
        let (interpreter, rest) = line.split_at(end);
        let rest = rest.trim_ascii();
        if interpreter.is_empty() {
            return Err(libc::ENOEXEC);
        }
        let text = |bytes: &[u8]| CString::new(bytes).map_err(|_| libc::ENOEXEC);
        return Ok(Program::Script {
            interpreter: text(interpreter)?,
            argument: (!rest.is_empty()).then(|| text(rest)).transpose()?,
        });
    }
    // SAFETY: a NUL-terminated name; the flags ask for a file closed at exec.
    let fd = unsafe {
        libc::memfd_create(
            c"locus-program".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(errno::get());
    }
    // SAFETY: a descriptor just made, owned from here.
    let mut memory = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut at = 0u64;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = file.read_at(&mut chunk, at).map_err(fs_errno)?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut memory, &chunk[..n])
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        at += n as u64;
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: our memory file; sealing only restricts later changes.
    unsafe { libc::fcntl(memory.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    Ok(Program::Image(memory.into()))
}

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
    // The shared mappings end with the process image: their stores reach the files first
    // (those of a mapped copy, on a volume with data checksums, exist nowhere else).
    let _ = state::run(|| {
        crate::calls::shared::sync_all();
        Ok(())
    });
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
                if !CStr::from_ptr(item)
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
    inherited(&fds, || exec(vector.as_ptr()))
}

/// Runs `start` (an exec, or a spawn of a child) with the reservations of the handed-over
/// `fds` kept across exec (their kernel `FD_CLOEXEC` cleared), and closed at exec again
/// afterwards — the exec failed, or the child has its copies; `errno` as `start` left it.
fn inherited<T>(fds: &[c_int], start: impl FnOnce() -> T) -> T {
    for &fd in fds {
        // SAFETY: our reservation fds.
        unsafe { real::fcntl(fd, libc::F_SETFD, 0) };
    }
    let result = start();
    let e = errno::get();
    for &fd in fds {
        // SAFETY: as above.
        unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    }
    errno::set(e);
    result
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
    // SAFETY: C's contract.
    unsafe { exec_any(path, argv, envp) }
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
    if state::inside() || file.is_null() {
        // SAFETY: C's contract.
        return unsafe { with_handoff(envp, |envp| real::execvpe(file, argv, envp)) };
    }
    // SAFETY: NUL-terminated by C's contract.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    if name.is_empty() {
        return fail(libc::ENOENT);
    }
    if name.contains(&b'/') {
        // SAFETY: C's contract.
        return unsafe { exec_any(file, argv, envp) };
    }
    let Some(search) = volume_search_path() else {
        // SAFETY: C's contract.
        return unsafe { with_handoff(envp, |envp| real::execvpe(file, argv, envp)) };
    };
    // glibc's search: each directory in turn; a missing file goes on, a refused one is
    // remembered, a file the kernel cannot run is a shell script; anything else fails.
    let mut refused = false;
    for candidate in candidates(&search, name) {
        // SAFETY: C's contract; `candidate` is NUL-terminated.
        unsafe { exec_any(candidate.as_ptr(), argv, envp) };
        match errno::get() {
            libc::EACCES => refused = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            libc::ENOEXEC => {
                let mut args: Vec<*const c_char> = vec![c"/bin/sh".as_ptr(), candidate.as_ptr()];
                // SAFETY: C's contract for `argv`.
                args.extend(unsafe { after_the_first(argv) });
                args.push(std::ptr::null());
                // SAFETY: a null-terminated vector of live strings.
                return unsafe { exec_any(c"/bin/sh".as_ptr(), args.as_ptr(), envp) };
            }
            _ => return -1,
        }
    }
    fail(if refused { libc::EACCES } else { libc::ENOENT })
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

/// How a program on the volume runs, for `exec` and `posix_spawn`.
struct Runnable {
    target: Target,
    /// The arguments to give it when they are not the caller's (an interpreter, the
    /// script's name, then the caller's after its argv[0]): the strings and the vector.
    argv: Option<(Vec<CString>, Vec<*const c_char>)>,
}

/// What is executed.
enum Target {
    /// A host path.
    Path(CString),
    /// A memory file holding the program (closed at exec).
    Image(OwnedFd),
}

impl Runnable {
    /// The argument vector to pass: ours, or the caller's `argv`.
    fn argv(&self, caller: *const *const c_char) -> *const *const c_char {
        self.argv
            .as_ref()
            .map_or(caller, |(_, pointers)| pointers.as_ptr())
    }
}

/// The program `name` names (with `search`, `posix_spawnp`'s `PATH` search when the name has
/// no `/` and `PATH` names volume directories): `None` for a host program the kernel finds
/// by itself; for one on the volume, a link out at its host path, a script through its
/// interpreter (itself resolved the same way, up to [`MAX_INTERPRETERS`] deep), anything
/// else from a memory file; or an errno (`EACCES` without execute permission).
///
/// # Safety
/// `argv` is a null-terminated vector of strings.
unsafe fn runnable(
    name: &CStr,
    argv: *const *const c_char,
    search: bool,
    depth: usize,
) -> Result<Option<Runnable>, c_int> {
    let bytes = name.to_bytes();
    if search && !bytes.contains(&b'/') {
        let Some(search) = volume_search_path() else {
            return Ok(None);
        };
        let mut refused = false;
        for candidate in candidates(&search, bytes) {
            // SAFETY: a NUL-terminated path; the intercepted `access` answers for both.
            if unsafe { libc::access(candidate.as_ptr(), libc::X_OK) } == 0 {
                // SAFETY: as our contract.
                return match unsafe { runnable(&candidate, argv, false, depth) }? {
                    None => Ok(Some(Runnable {
                        target: Target::Path(candidate),
                        argv: None,
                    })),
                    found => Ok(found),
                };
            }
            refused |= errno::get() == libc::EACCES;
        }
        return Err(if refused { libc::EACCES } else { libc::ENOENT });
    }
    // SAFETY: NUL-terminated.
    let inside = match unsafe { super::resolve(libc::AT_FDCWD, name.as_ptr()) }? {
        Resolved::Kernel => return Ok(None),
        Resolved::KernelPath(host) => {
            return Ok(Some(Runnable {
                target: Target::Path(host),
                argv: None,
            }));
        }
        Resolved::Locus {
            trailing_slash: true,
            ..
        } => return Err(libc::ENOTDIR),
        Resolved::Locus { path, .. } => path,
    };
    // Execute permission, by the library's `access` (owner, group, others).
    // SAFETY: NUL-terminated; the intercepted `access`.
    if unsafe { libc::access(name.as_ptr(), libc::X_OK) } != 0 {
        return Err(errno::get());
    }
    match state::run(|| state::with_fs(|fs| program(fs, &inside)))? {
        Program::Image(fd) => Ok(Some(Runnable {
            target: Target::Image(fd),
            argv: None,
        })),
        Program::Script {
            interpreter,
            argument,
        } => {
            if depth >= MAX_INTERPRETERS {
                return Err(libc::ELOOP);
            }
            let mut owned: Vec<CString> = vec![interpreter.clone()];
            owned.extend(argument);
            owned.push(name.to_owned());
            // SAFETY: C's contract for `argv`: each pointer is a live string, copied here.
            owned.extend(unsafe {
                after_the_first(argv)
                    .into_iter()
                    .map(|a| CStr::from_ptr(a).to_owned())
                    .collect::<Vec<_>>()
            });
            let mut pointers: Vec<*const c_char> = owned.iter().map(|a| a.as_ptr()).collect();
            pointers.push(std::ptr::null());
            // The interpreter itself may be on the volume.
            // SAFETY: `pointers` is a null-terminated vector of the strings in `owned`.
            let inner = unsafe { runnable(&interpreter, pointers.as_ptr(), false, depth + 1) }?;
            let mut program = inner.unwrap_or(Runnable {
                target: Target::Path(interpreter),
                argv: None,
            });
            if program.argv.is_none() {
                program.argv = Some((owned, pointers));
            }
            Ok(Some(program))
        }
    }
}

/// The caller's arguments after its argv[0] (the program's own name), for an interpreter
/// and a script's name put in front of them.
///
/// # Safety
/// `argv` is null or a null-terminated vector of strings.
unsafe fn after_the_first(argv: *const *const c_char) -> Vec<*const c_char> {
    let mut rest = Vec::new();
    // SAFETY: the caller's null-terminated vector.
    unsafe {
        if !argv.is_null() && !(*argv).is_null() {
            let mut i = 1;
            while !(*argv.add(i)).is_null() {
                rest.push(*argv.add(i));
                i += 1;
            }
        }
    }
    rest
}

/// This process's `PATH` (glibc's default when unset) when one of its directories is on
/// the volume; `None` when libc's own search will do.
fn volume_search_path() -> Option<Vec<u8>> {
    // SAFETY: a NUL-terminated literal; the answer is copied before anything can change the
    // environment.
    let path = unsafe { libc::getenv(c"PATH".as_ptr()) };
    let path = if path.is_null() {
        b"/bin:/usr/bin".to_vec()
    } else {
        // SAFETY: the environment's NUL-terminated string.
        unsafe { CStr::from_ptr(path) }.to_bytes().to_vec()
    };
    path.split(|&b| b == b':').any(on_volume).then_some(path)
}

/// `dir/name` for each directory of a `PATH` (an empty one is the working directory).
fn candidates<'a>(path: &'a [u8], name: &'a [u8]) -> impl Iterator<Item = CString> + 'a {
    path.split(|&b| b == b':').filter_map(move |dir| {
        let mut candidate = if dir.is_empty() {
            b".".to_vec()
        } else {
            dir.to_vec()
        };
        candidate.push(b'/');
        candidate.extend_from_slice(name);
        CString::new(candidate).ok()
    })
}

/// Whether a `PATH` entry is a directory of the volume (by name; a relative one when the
/// working directory is on the volume).
fn on_volume(dir: &[u8]) -> bool {
    (dir.is_empty() || dir[0] != b'/') && state::cwd().is_some()
        || state::config()
            .is_some_and(|c| matches!(c.mount.classify(dir), crate::path::Target::Locus { .. }))
}

/// `posix_spawn` and `posix_spawnp`: glibc's run no fork handlers and call the kernel's
/// `execve` directly, so the volume is released here first (as a fork does), the locus fds
/// and working directory are handed over in the environment, and a program on the volume
/// is made spawnable ([`runnable`]). The file actions and attributes are the caller's,
/// applied by glibc; an action naming a locus path reaches the kernel (which fails it).
///
/// # Safety
/// C's contract for `posix_spawn`.
unsafe fn spawn(
    pid: *mut libc::pid_t,
    name: *const c_char,
    search: bool,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let plain = |name: *const c_char, argv: *const *const c_char, envp: *const *const c_char| {
        // SAFETY: C's contract.
        unsafe {
            if search {
                real::posix_spawnp(pid, name, actions, attr, argv, envp)
            } else {
                real::posix_spawn(pid, name, actions, attr, argv, envp)
            }
        }
    };
    if state::inside() || name.is_null() {
        return plain(name, argv, envp);
    }
    // SAFETY: NUL-terminated by C's contract.
    let found = match unsafe { runnable(CStr::from_ptr(name), argv, search, 0) } {
        Ok(found) => found,
        Err(e) => return e,
    };
    state::release_for_child();
    // glibc reports failure as the returned error number, not in errno.
    let Some(program) = found else {
        // SAFETY: C's contract for `envp`.
        return unsafe { with_handoff(envp, |envp| plain(name, argv, envp)) };
    };
    let path = match &program.target {
        Target::Path(host) => host.clone(),
        Target::Image(fd) => {
            // The child must inherit the memory file to execute it by name.
            // SAFETY: our memory file.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) };
            CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
        }
    };
    let argv = program.argv(argv);
    // SAFETY: C's contract; the path and arguments live here and in `program`.
    unsafe {
        with_handoff(envp, |envp| {
            real::posix_spawn(pid, path.as_ptr(), actions, attr, argv, envp)
        })
    }
}

/// `posix_spawn(3)`: see [`spawn`].
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { spawn(pid, path, false, actions, attr, argv, envp) }
}

/// `posix_spawnp(3)`: see [`spawn`].
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: C's contract.
    unsafe { spawn(pid, file, true, actions, attr, argv, envp) }
}

/// Runs `start` — `system` or `popen`, which start `/bin/sh -c` through glibc's internal
/// spawn (no fork handlers, the process's own environment) — with the volume released
/// first as a fork does and the handoff in the process's environment for the duration, so
/// the shell and what it runs see the locus working directory and fds. The variable is
/// removed again afterwards (the library took it out of the environment at load).
fn with_handoff_in_environ<T>(start: impl FnOnce() -> T) -> T {
    if state::inside() {
        return start();
    }
    state::release_for_child();
    let Some((description, fds)) = state::handoff_for_exec() else {
        return start();
    };
    let (Ok(name), Ok(value)) = (CString::new(HANDOFF_ENV), CString::new(description)) else {
        return start();
    };
    // SAFETY: NUL-terminated strings; like `system` itself, not for programs that change
    // their environment from another thread meanwhile.
    unsafe { libc::setenv(name.as_ptr(), value.as_ptr(), 1) };
    let result = inherited(&fds, start);
    let e = errno::get();
    // SAFETY: as above.
    unsafe { libc::unsetenv(name.as_ptr()) };
    errno::set(e);
    result
}

/// `system(3)`: see [`with_handoff_in_environ`].
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    // SAFETY: C's contract.
    with_handoff_in_environ(|| unsafe { real::system(command) })
}

/// `popen(3)`: see [`with_handoff_in_environ`].
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: C's contract.
    with_handoff_in_environ(|| unsafe { real::popen(command, mode) })
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
