//! Unmounting from the server's side when it is asked to stop: `umount2(2)` (through rustix) for root, else
//! the setuid helper (`fusermount3 -u`, or `fusermount -u`) that mounted for a user. Unlike
//! the unmount `fuser` does when its session is dropped, this says when the mount point is
//! busy, so the server can serve on until it is free instead of waiting for threads that
//! the kernel keeps busy.

use std::io;
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
    let error = match rustix::mount::unmount(point, rustix::mount::UnmountFlags::empty()) {
        Ok(()) => return Ok(Unmount::Done),
        Err(errno) => errno,
    };
    match error {
        rustix::io::Errno::BUSY => Ok(Unmount::Busy),
        // Not a mount point (any more): someone unmounted it meanwhile.
        rustix::io::Errno::INVAL => Ok(Unmount::Done),
        // Not root: the helper that mounted for this user unmounts too.
        rustix::io::Errno::PERM => helper(point),
        _ => {
            let error = io::Error::from(error);
            Err(io::Error::new(
                error.kind(),
                format!("unmounting {}: {error}", point.display()),
            ))
        }
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
