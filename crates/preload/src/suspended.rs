//! Which locus files processes hold suspended, for the processes that remove names.
//!
//! A process that lets go of the volume (a `fork`, an `exec`, another process's turn) keeps
//! its open locus files as suspended descriptions and reopens each by inode number at its
//! next use. While it is suspended, the file system knows nothing of it: a second process
//! that removes the file's last name (`rm`, or `sed -i` and most editors renaming a new
//! file over it) would free the file, and the first could not reopen it — where a kernel
//! file system keeps a removed file readable to whoever has it open.
//!
//! So the suspending process leaves a marker per suspended file in the volume directory,
//! `suspended/INO.PID.START` (`START`: the process's start time, so that a later process
//! given the same pid does not keep markers alive), and removes it when it reopens or
//! closes the file, or exits. A process about to remove a file's last name asks
//! [`held`]; when some live process holds the file suspended, the name is moved into
//! [`ORPHANS`] instead of being removed (an atomic rename, or a link there before a rename
//! over it), which keeps the file and its blocks. Each mount removes the orphans no live
//! process holds any more ([`sweep`]): by then their holders reopened them (and
//! hold them open, so the removal frees nothing before their close) or let them go.
//! Markers of a process that died without removing them (kill -9) are removed by the next
//! [`held`] that finds them.

use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::state::Guard;

/// The directory of the file system's root that keeps removed files some suspended process
/// still holds, each named by its inode number.
pub(crate) const ORPHANS: &str = "/.locus-orphans";

/// The marker directory of the volume this process uses.
fn dir() -> Option<PathBuf> {
    Some(crate::state::config()?.volume.join("suspended"))
}

/// This process in marker names: pid and start time, read once per pid (a forked child
/// reads its own).
fn me() -> Option<(u32, u64)> {
    static CACHED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
    let pid = std::process::id();
    if CACHED[0].load(Ordering::Relaxed) == u64::from(pid) {
        return Some((pid, CACHED[1].load(Ordering::Relaxed)));
    }
    let start = start_time(pid)?;
    CACHED[1].store(start, Ordering::Relaxed);
    CACHED[0].store(u64::from(pid), Ordering::Relaxed);
    Some((pid, start))
}

/// When process `pid` started (clock ticks after boot: field 22 of `/proc/PID/stat`), or
/// `None` when there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from the
    // last `)`, after which field 3 begins.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(22 - 3)?.parse().ok()
}

fn marker(ino: u64, (pid, start): (u32, u64)) -> String {
    format!("{ino}.{pid}.{start}")
}

/// The inode number, pid and start time a marker's name holds.
fn parse(name: &str) -> Option<(u64, u32, u64)> {
    let mut parts = name.split('.');
    let parsed = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    parts.next().is_none().then_some(parsed)
}

/// Notes that this process holds the files `inos` suspended. A marker that cannot be made
/// (a volume directory this user cannot write) leaves that file as before: removed by
/// another process, it is gone when this one reopens it.
pub(crate) fn note(inos: impl IntoIterator<Item = u64>) {
    each_marker(inos, true, |path| {
        let _ = std::fs::File::create(path);
    });
}

/// Notes that this process no longer holds the files `inos` suspended.
pub(crate) fn forget(inos: impl IntoIterator<Item = u64>) {
    each_marker(inos, false, |path| {
        let _ = std::fs::remove_file(path);
    });
}

/// Runs `act` on the path of this process's marker of each of `inos` (nothing when there
/// are none: no system call then), the marker directory made first if `make`.
fn each_marker(inos: impl IntoIterator<Item = u64>, make: bool, mut act: impl FnMut(&Path)) {
    let mut inos = inos.into_iter().peekable();
    if inos.peek().is_none() {
        return;
    }
    let _inside = Guard::enter();
    let (Some(dir), Some(me)) = (dir(), me()) else {
        return;
    };
    if make {
        shared_dir(&dir);
    }
    for ino in inos {
        act(&dir.join(marker(ino, me)));
    }
}

/// Makes `dir` if it is missing, as a directory every user of the volume can add to and
/// remove their own entries from (mode 1777, as /tmp). Failing leaves it missing.
pub(crate) fn shared_dir(dir: &Path) {
    if !dir.is_dir() && std::fs::DirBuilder::new().mode(0o777).create(dir).is_ok() {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
}

/// After an `exec`: this process holds suspended exactly the files `inos` handed over (the
/// old image's markers of files it did not hand over go).
pub(crate) fn hold_only(inos: &HashSet<u64>) {
    let mine: Vec<u64> = {
        let _inside = Guard::enter();
        let (Some(dir), Some((pid, start))) = (dir(), me()) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            note(inos.iter().copied());
            return;
        };
        entries
            .filter_map(|e| parse(e.ok()?.file_name().to_str()?))
            .filter(|&(_, p, s)| (p, s) == (pid, start))
            .map(|(ino, ..)| ino)
            .collect()
    };
    forget(mine.iter().copied().filter(|ino| !inos.contains(ino)));
    note(inos.iter().copied().filter(|ino| !mine.contains(ino)));
}

/// Whether some live process (this one included) holds the file `ino` suspended. Markers of
/// processes that are gone are removed on the way.
///
/// Asked before every removal of a file's last name (`rm`, SQLite deleting its rollback
/// journal at each transaction), so the answer comes from the set found at the last look
/// while the marker directory has not changed since (its modification time and size): one
/// `stat` instead of reading the directory. A marker made within the clock tick of the last
/// look could be missed; its file is then freed as before markers were (its holder finds it
/// gone).
pub(crate) fn held(ino: u64) -> bool {
    static LAST: parking_lot::Mutex<Option<(Stamp, HashSet<u64>)>> = parking_lot::Mutex::new(None);
    let stamp = {
        let _inside = Guard::enter();
        let Some(dir) = dir() else {
            return false;
        };
        match std::fs::metadata(&dir) {
            Ok(meta) => stamp_of(&meta),
            Err(_) => return false,
        }
    };
    let mut last = LAST.lock();
    if let Some((seen, live)) = last.as_ref()
        && *seen == stamp
    {
        return live.contains(&ino);
    }
    let (live, removed) = scan();
    let found = live.contains(&ino);
    // A look that removed dead markers changed the directory: the next one looks again.
    *last = (!removed).then_some((stamp, live));
    found
}

/// When and how the marker directory last changed: modification time (ns) and size.
type Stamp = (i64, i64, u64);

fn stamp_of(meta: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime(), meta.mtime_nsec(), meta.size())
}

/// The inode numbers live processes hold suspended, and whether markers of dead processes
/// were removed on the way.
fn scan() -> (HashSet<u64>, bool) {
    let _inside = Guard::enter();
    let mut live = HashSet::new();
    let mut removed = false;
    let Some(dir) = dir() else {
        return (live, removed);
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return (live, removed);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((ino, pid, start)) = name.to_str().and_then(parse) else {
            continue;
        };
        if live.contains(&ino) {
            continue;
        }
        if start_time(pid) == Some(start) {
            live.insert(ino);
        } else {
            removed |= std::fs::remove_file(entry.path()).is_ok();
        }
    }
    (live, removed)
}

/// Where the name of `ino` goes instead of being removed, while a suspended process holds it.
fn orphan_path(ino: u64) -> String {
    format!("{ORPHANS}/{ino}")
}

/// Before the last name of the file `ino` is removed: when a suspended process holds the
/// file, the directory that keeps it ([`ORPHANS`]) is made if missing, and the path to link
/// or rename the file to is returned.
pub(crate) fn keep_for_holders(fs: &fs::Fs, ino: u64) -> Option<String> {
    if !held(ino) {
        return None;
    }
    match fs.mkdir(ORPHANS, 0o700) {
        Ok(()) | Err(fs::FsError::Exists(_)) => Some(orphan_path(ino)),
        Err(e) => {
            eprintln!(
                "locus preload: cannot keep a removed file for the process that has it open \
                 ({ORPHANS}: {e}); that process will find it gone"
            );
            None
        }
    }
}

/// At a mount: removes the markers of processes that are gone (a process that ends with
/// `_exit`, as dash does, runs no exit handler), then the orphans no live process holds
/// suspended any more (and their directory, once empty): their holders reopened them
/// meanwhile, or let them go.
pub(crate) fn sweep(fs: &fs::Fs) {
    let (live, _) = scan();
    let Ok(entries) = fs.readdir(ORPHANS) else {
        return;
    };
    let mut left = 0;
    for entry in entries {
        // Only numbers are put there; anything else is left alone.
        match entry.name.parse::<u64>() {
            Ok(ino) if !live.contains(&ino) && fs.unlink(&orphan_path(ino)).is_ok() => {
                crate::locks::forget_inode(ino);
            }
            _ => left += 1,
        }
    }
    if left == 0 {
        let _ = fs.rmdir(ORPHANS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_names_hold_inode_pid_and_start() {
        let name = marker(42, (7, 123_456));
        assert_eq!(name, "42.7.123456");
        assert_eq!(parse(&name), Some((42, 7, 123_456)));
        for bad in ["42.7", "42.7.1.2", "x.7.1", "42..1", ""] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn this_process_started_once() {
        let pid = std::process::id();
        let start = start_time(pid).expect("our own start time");
        assert_eq!(start_time(pid), Some(start));
        assert_eq!(me(), Some((pid, start)));
        // No process has pid 0 in /proc.
        assert_eq!(start_time(0), None);
    }
}
