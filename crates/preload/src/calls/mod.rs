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
pub(crate) mod mapped_copy;
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
    match unsafe { resolve_names(dirfd, path, follow_last) }? {
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

/// The kernel's names of an open fd: `/dev/stdin`, `/dev/stdout`, `/dev/stderr` (ordinary
/// links to the next forms), `/dev/fd/N`, `/proc/self/fd/N`, `/proc/thread-self/fd/N` and
/// `/proc/PID/fd/N` of this process. Returns the fd, whether the name is the fd's own link
/// (`/proc/.../fd/N`, `/dev/fd/N`) rather than a `/dev/std*` link to one, and the rest of
/// the path after it (empty or from a `/`).
pub(crate) fn fd_name(path: &[u8]) -> Option<(c_int, bool, &[u8])> {
    let (fd, own_link, rest) = if let Some(stream) = path.strip_prefix(b"/dev/std") {
        let (fd, rest) = [(0, &b"in"[..]), (1, b"out"), (2, b"err")]
            .into_iter()
            .find_map(|(fd, name)| stream.strip_prefix(name).map(|rest| (fd, rest)))?;
        (fd, false, rest)
    } else {
        let numbered = path.strip_prefix(b"/dev/fd/").or_else(|| {
            let proc = path.strip_prefix(b"/proc/")?;
            let slash = proc.iter().position(|&b| b == b'/')?;
            let (who, rest) = proc.split_at(slash);
            let own = who == b"self"
                || who == b"thread-self"
                || std::str::from_utf8(who)
                    .ok()
                    .and_then(|pid| pid.parse::<u32>().ok())
                    == Some(std::process::id());
            if own {
                rest.strip_prefix(b"/fd/")
            } else {
                None
            }
        })?;
        let digits = numbered.iter().take_while(|b| b.is_ascii_digit()).count();
        let fd = std::str::from_utf8(&numbered[..digits])
            .ok()?
            .parse::<c_int>()
            .ok()?;
        (fd, true, &numbered[digits..])
    };
    (rest.is_empty() || rest[0] == b'/').then_some((fd, own_link, rest))
}

/// A kernel name of an open locus fd ([`fd_name`]) leads to its file, as the kernel follows
/// such a name to the open file (`wc /dev/stdin < /locus/f`, `cat /dev/fd/3`): the inside
/// path the fd was opened by. (The kernel follows the open file itself; a file renamed or
/// unlinked since is not found by its old name.) `lstat` and `readlink` of the name itself
/// (`follow_last` false) see the kernel's link, as on any file system.
fn through_fd_name(
    config: &state::Config,
    bytes: &[u8],
    follow_last: bool,
) -> Result<Resolved, c_int> {
    let Some((fd, _, rest)) = fd_name(bytes) else {
        return Ok(Resolved::Kernel);
    };
    if !state::is_locus(fd) || (rest.is_empty() && !follow_last) {
        return Ok(Resolved::Kernel);
    }
    let desc = state::desc(fd)?;
    desc.usable()?;
    let mut full = config.mount.outside(&desc.path);
    full.extend_from_slice(rest);
    // (`/dev/fd/3/..` of the mount's root is a kernel path.)
    absolute(config, &full)
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

/// Decides whose `path` (relative to `dirfd`) is, by its names alone (and, for a kernel
/// name of an open fd, [`through_fd_name`]).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn resolve_names(
    dirfd: c_int,
    path: *const c_char,
    follow_last: bool,
) -> Result<Resolved, c_int> {
    if path.is_null() || state::inside() {
        return Ok(Resolved::Kernel);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let Some(config) = state::config() else {
        return Ok(Resolved::Kernel);
    };
    if bytes.first() == Some(&b'/') {
        return match absolute(config, bytes)? {
            Resolved::Kernel => through_fd_name(config, bytes, follow_last),
            other => Ok(other),
        };
    }
    let base = if dirfd == libc::AT_FDCWD {
        match state::cwd() {
            Some(dir) => dir,
            None => return Ok(Resolved::Kernel),
        }
    } else if state::is_locus(dirfd) {
        let desc = state::desc(dirfd)?;
        desc.usable()?;
        if bytes.is_empty() {
            // Before the directory check, as the kernel orders them (an empty name without
            // `AT_EMPTY_PATH`, which the callers that take it handle first).
            return Err(libc::ENOENT);
        }
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
    let (mut target, mut full) = config.mount.join(&base, bytes);
    // A locus name relative to the working directory, with the volume let go: mounted now
    // (the name needs it anyway), so that the working directory follows a rename another
    // process made meanwhile (`state::follow_cwd`).
    if dirfd == libc::AT_FDCWD
        && matches!(target, Target::Locus { .. })
        && let Some(now) = state::cwd_after_mount()?
        && now != base
    {
        (target, full) = config.mount.join(&now, bytes);
    }
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

/// Whose the absolute path `bytes` is, by its names alone.
fn absolute(config: &state::Config, bytes: &[u8]) -> Result<Resolved, c_int> {
    Ok(match config.mount.classify(bytes) {
        Target::Locus {
            path,
            trailing_slash,
        } => Resolved::Locus {
            path,
            trailing_slash,
        },
        // `/locus/../etc` names `/etc`, but the kernel would look for `/locus` first, which
        // does not exist for it: hand it the folded path.
        Target::Kernel if bytes.starts_with(config.mount.prefix()) => {
            let folded = crate::path::normalize(bytes).expect("absolute");
            Resolved::KernelPath(CString::new(folded).map_err(|_| libc::EINVAL)?)
        }
        Target::Kernel => Resolved::Kernel,
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

#[cfg(test)]
mod tests {
    use super::fd_name;

    #[test]
    fn the_kernels_names_of_open_fds_are_recognised_and_nothing_else() {
        assert_eq!(fd_name(b"/dev/stdin"), Some((0, false, &b""[..])));
        assert_eq!(fd_name(b"/dev/stdout"), Some((1, false, &b""[..])));
        assert_eq!(fd_name(b"/dev/stderr/x"), Some((2, false, &b"/x"[..])));
        assert_eq!(fd_name(b"/dev/fd/12"), Some((12, true, &b""[..])));
        assert_eq!(fd_name(b"/dev/fd/3/a/b"), Some((3, true, &b"/a/b"[..])));
        assert_eq!(fd_name(b"/proc/self/fd/5"), Some((5, true, &b""[..])));
        assert_eq!(
            fd_name(b"/proc/thread-self/fd/6/"),
            Some((6, true, &b"/"[..]))
        );
        let own = format!("/proc/{}/fd/7", std::process::id());
        assert_eq!(fd_name(own.as_bytes()), Some((7, true, &b""[..])));
        for other in [
            &b"/dev/stdinx"[..],
            b"/dev/std",
            b"/dev/fd/",
            b"/dev/fd/3x",
            b"/dev/fd/99999999999",
            b"/proc/self/fdinfo/3",
            b"/proc/self/fd",
            b"/proc/0/fd/3",
            b"/proc/self/cwd",
            b"/locus/dev/fd/3",
            b"dev/fd/3",
        ] {
            assert_eq!(fd_name(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
