//! Which `locus mount` server, if any, serves a volume's file system, and where: a record the
//! server keeps in the volume directory while it runs (`locus.mounted`: its pid and its mount
//! point, one per line). The preload library reads it when the volume is held by another
//! process, to use the mount instead of failing with `EBUSY`; `status` and `fsck` read it to
//! name the mount. A record whose process is gone or whose mount point no longer shows a
//! locus FUSE mount is stale and ignored (a killed server leaves one).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Result, VolumeError};

/// The record's file name in the volume directory.
pub const SERVED_FILE: &str = "locus.mounted";

/// A running server of the volume's file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The server's process id.
    pub pid: u32,
    /// Where its file system is mounted.
    pub mountpoint: PathBuf,
}

/// Records this process as the server of the volume in `dir`, mounted at `mountpoint`.
pub fn record_served(dir: &Path, mountpoint: &Path) -> io::Result<()> {
    let mountpoint = mountpoint.canonicalize()?;
    let text = format!("{}\n{}\n", std::process::id(), mountpoint.display());
    let tmp = dir.join(format!("{SERVED_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(SERVED_FILE))
}

/// What a server logs when it cannot write its record (`locus mount` in the background
/// looks for it, so as not to wait for a record that will never come).
pub const UNRECORDED: &str = "cannot record the mount";

/// Removes the record (the server stopped).
pub fn clear_served(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(SERVED_FILE));
}

/// The live server of the volume in `dir`: its record names a running process and a mount
/// point where a locus FUSE file system is mounted now.
pub fn find_served(dir: &Path) -> Option<Served> {
    read_running(dir).filter(|s| is_locus_mount(&s.mountpoint))
}

/// A server of the volume in `dir` that no longer serves its mount but still runs: its
/// record names a running process, and no locus file system is mounted at its mount point.
/// That is a server closing the volume after `umount` (which returns before the server has
/// checkpointed and closed it), or one lazily unmounted (`umount -l`) that goes on serving
/// the files still open there until they are closed. The server removes its record only
/// after it has closed the volume.
pub fn find_stopping(dir: &Path) -> Option<Served> {
    read_running(dir).filter(|s| !is_locus_mount(&s.mountpoint))
}

/// The server of [`find_stopping`] when it is `pid`, the holder the volume lock names.
pub fn stopping_holder(dir: &Path, pid: &str) -> Option<Served> {
    find_stopping(dir).filter(|s| s.pid.to_string() == pid)
}

/// How long [`after_stopping_server`] waits. Closing is a checkpoint and a snapshot:
/// milliseconds to a second or two; a server still running after this is serving the files
/// a lazy unmount left open.
pub const STOPPING_WAIT: Duration = Duration::from_secs(30);

/// Runs `attempt` (something that takes the lock of the volume in `dir`) and, while it
/// fails with `InUse` held by a server that was unmounted and is closing the volume
/// ([`stopping_holder`]), runs it again, for up to [`STOPPING_WAIT`]; `waiting` is told once,
/// when the wait begins. `umount` returns as soon as the kernel has dropped the mount,
/// before the server has closed the volume: without this, `umount /mnt/x && locus fsck`
/// failed on a volume about to be free. Other errors, other holders and a wait that runs
/// out are returned as `attempt` gave them.
pub fn after_stopping_server<T>(
    dir: &Path,
    mut attempt: impl FnMut() -> Result<T>,
    waiting: impl FnOnce(&Served),
) -> Result<T> {
    let mut waiting = Some(waiting);
    let started = Instant::now();
    loop {
        let result = attempt();
        let holder = match &result {
            Err(VolumeError::InUse { pid, .. }) => stopping_holder(dir, pid),
            _ => None,
        };
        let Some(stopping) = holder else {
            return result;
        };
        if started.elapsed() >= STOPPING_WAIT {
            return result;
        }
        if let Some(waiting) = waiting.take() {
            waiting(&stopping);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The record in `dir`, when the process it names is running.
fn read_running(dir: &Path) -> Option<Served> {
    let text = std::fs::read_to_string(dir.join(SERVED_FILE)).ok()?;
    let mut lines = text.lines();
    let pid: u32 = lines.next()?.parse().ok()?;
    let mountpoint = PathBuf::from(lines.next()?);
    Path::new(&format!("/proc/{pid}"))
        .exists()
        .then_some(Served { pid, mountpoint })
}

/// Whether a locus FUSE file system is mounted at `mountpoint` (by /proc/self/mountinfo: the
/// type `fuse` or `fuse.locus`, the source `locus`).
pub fn is_locus_mount(mountpoint: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let after = fields
            .iter()
            .position(|&f| f == "-")
            .map(|i| &fields[i + 1..]);
        let ours = after.is_some_and(|a| {
            a.len() >= 2 && (a[0] == "fuse" || a[0] == "fuse.locus") && a[1] == "locus"
        });
        ours && fields.get(4).is_some_and(|m| Path::new(m) == mountpoint)
    })
}

/// The command line of process `pid`, as messages name a volume's holder: arguments joined by
/// spaces, control characters as spaces, at most 120 characters; `None` when /proc does not
/// show it (a process gone, or another user's under `hidepid`).
pub fn command_line(pid: u32) -> Option<String> {
    const LIMIT: usize = 120;
    let line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = line
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| {
            String::from_utf8_lossy(w)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect()
        })
        .collect();
    if words.is_empty() {
        return None;
    }
    let text = words.join(" ");
    Some(if text.chars().count() > LIMIT {
        text.chars().take(LIMIT - 1).collect::<String>() + "…"
    } else {
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_is_one_line_of_its_words() {
        let me = command_line(std::process::id()).expect("this process is in /proc");
        let argv0 = std::env::args().next().unwrap();
        assert!(me.starts_with(&argv0), "{me}");
        // A child whose arguments hold a newline and run long.
        let long = "x".repeat(300);
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5", "a\nb", &long])
            .spawn()
            .unwrap();
        // The child's cmdline is its own once it has exec'd.
        let deadline = Instant::now() + Duration::from_secs(5);
        let line = loop {
            let line = command_line(child.id()).unwrap_or_default();
            if line.starts_with("sh") || Instant::now() > deadline {
                break line;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(line.starts_with("sh -c sleep 5 a b xxx"), "{line}");
        assert_eq!(line.chars().count(), 120, "{line}");
        assert!(line.ends_with('…'), "{line}");
        assert_eq!(command_line(u32::MAX), None);
    }

    #[test]
    fn a_record_without_its_mount_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(find_served(dir.path()), None);
        let point = tempfile::tempdir().unwrap();
        record_served(dir.path(), point.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(SERVED_FILE)).unwrap();
        assert_eq!(
            text,
            format!(
                "{}\n{}\n",
                std::process::id(),
                point.path().canonicalize().unwrap().display()
            )
        );
        // This process is alive, but nothing is mounted there: a server that stopped
        // serving and has not closed the volume yet.
        assert_eq!(find_served(dir.path()), None);
        assert_eq!(
            find_stopping(dir.path()),
            Some(Served {
                pid: std::process::id(),
                mountpoint: point.path().canonicalize().unwrap(),
            })
        );
        clear_served(dir.path());
        assert!(!dir.path().join(SERVED_FILE).exists());
        assert_eq!(find_stopping(dir.path()), None);
    }

    #[test]
    fn an_open_waits_for_a_stopping_server_only() {
        let dir = tempfile::tempdir().unwrap();
        let point = tempfile::tempdir().unwrap();
        let in_use = |pid: u32| VolumeError::InUse {
            dir: dir.path().to_owned(),
            pid: pid.to_string(),
        };
        // Held by a process that is no server: returned at once.
        let mut attempts = 0;
        let result: Result<()> = after_stopping_server(
            dir.path(),
            || {
                attempts += 1;
                Err(in_use(std::process::id()))
            },
            |_| panic!("no server to wait for"),
        );
        assert!(matches!(result, Err(VolumeError::InUse { .. })));
        assert_eq!(attempts, 1);

        // Held by the recorded server, unmounted (this process, nothing mounted at its
        // point): tried again until the lock is free, the wait announced once.
        record_served(dir.path(), point.path()).unwrap();
        let (mut attempts, mut announced) = (0, 0);
        let result = after_stopping_server(
            dir.path(),
            || {
                attempts += 1;
                if attempts < 4 {
                    Err(in_use(std::process::id()))
                } else {
                    Ok(attempts)
                }
            },
            |s| {
                announced += 1;
                assert_eq!(s.pid, std::process::id());
            },
        );
        assert_eq!(result.unwrap(), 4);
        assert_eq!(announced, 1);

        // Held by another process than the record names: not waited for.
        let mut attempts = 0;
        let result: Result<()> = after_stopping_server(
            dir.path(),
            || {
                attempts += 1;
                Err(in_use(std::process::id() + 1))
            },
            |_| panic!("the holder is not the recorded server"),
        );
        assert!(result.is_err());
        assert_eq!(attempts, 1);
    }
}
