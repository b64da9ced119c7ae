//! Unmounting from the server's side when it is asked to stop: `umount2(2)` for root, else
//! the setuid helper (`fusermount3 -u`, or `fusermount -u`) that mounted for a user. Unlike
//! the unmount `fuser` does when its session is dropped, this says when the mount point is
//! busy, so the server can serve on until it is free instead of waiting for threads that
//! the kernel keeps busy.
#![allow(
    unsafe_code,
    reason = "umount2(2), the one system call this crate makes itself"
)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

/// What asking the kernel to unmount did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmount {
    /// Unmounted (or no longer mounted): the serving threads end as the connection does.
    Done,
    /// The mount point is busy — a process has a file open below it or its working
    /// directory there — and stays mounted and served.
    Busy,
}

/// Unmounts the file system at `point`, as `umount` (root) or `fusermount3 -u` would.
pub(crate) fn unmount(point: &Path) -> io::Result<Unmount> {
    let path = CString::new(point.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{}: a NUL in the path", point.display())))?;
    // SAFETY: `path` is a NUL-terminated string that lives across the call; umount2 reads it
    // and keeps no pointer.
    if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
        return Ok(Unmount::Done);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EBUSY) => Ok(Unmount::Busy),
        // Not a mount point (any more): someone unmounted it meanwhile.
        Some(libc::EINVAL) => Ok(Unmount::Done),
        // Not root: the helper that mounted for this user unmounts too.
        Some(libc::EPERM) => helper(point),
        _ => Err(io::Error::new(
            error.kind(),
            format!("unmounting {}: {error}", point.display()),
        )),
    }
}

/// `fusermount3 -u` (or `fusermount -u`) of `point`.
fn helper(point: &Path) -> io::Result<Unmount> {
    for tool in ["fusermount3", "fusermount"] {
        let out = match Command::new(tool).arg("-u").arg(point).output() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            other => other?,
        };
        if out.status.success() {
            return Ok(Unmount::Done);
        }
        let said = String::from_utf8_lossy(&out.stderr);
        if said.contains("busy") {
            return Ok(Unmount::Busy);
        }
        return Err(io::Error::other(format!(
            "{tool} -u {}: {}",
            point.display(),
            said.trim()
        )));
    }
    Err(io::Error::other(format!(
        "unmounting {} needs root or fusermount3 (Debian: fuse3), and neither is here",
        point.display()
    )))
}
