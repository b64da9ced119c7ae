//! What each logged operation does to the file system in DRAM: one function per journal
//! operation and one for a data record, called by the live path right after it logged the
//! record (holding the locks that ordered it) and by recovery for every record it replays.
//! So a crash cannot replay an operation differently from how it ran.
//!
//! Each takes the state it changes already locked, and checks what the record claims about
//! it (a name holds the inode, a directory is empty, ...). The live path checked the same
//! before logging, so a failed check there is a bug ([`applied`] panics); in recovery it is
//! damage, and recovery names the record.
//!
//! What the caller does around them differs and stays with the caller: the live path frees
//! the blocks an operation returns and forgets an unlinked inode at its last close; recovery
//! drops them (nothing is owned yet). A checkpoint `Batch` is the one record the live path
//! does not apply after logging: the checkpoint makes its changes piece by piece under range
//! locks while it moves data and logs the record to describe them; [`batch`] replays it with
//! the same extent-map operations.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::extent_map::{BLOCK, ExtentMap, Run};
use crate::inode::{Attr, Inode, Owner};
use crate::journal::{Kind, MapEntry, SizeEntry};
use crate::xattr::Xattrs;

/// A directory's entries.
pub(crate) type Entries = BTreeMap<String, u64>;

/// Why a record does not apply.
pub(crate) type Problem = String;

/// The live path's view of a result: it checked the conditions before logging the record.
pub(crate) fn applied<T>(result: Result<T, Problem>) -> T {
    result.unwrap_or_else(|problem| panic!("a logged operation did not apply: {problem}"))
}

fn dir(inode: &Inode) -> Result<(), Problem> {
    match inode.kind {
        Kind::Dir => Ok(()),
        _ => Err(format!("inode {} is not a directory", inode.ino)),
    }
}

fn file(inode: &Inode, what: &str) -> Result<(), Problem> {
    match inode.kind {
        Kind::File => Ok(()),
        _ => Err(format!("{what} of {}, which is not a file", inode.ino)),
    }
}

/// What a `Create` makes.
pub(crate) struct NewInode<'a> {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) mode: u32,
    pub(crate) time: u64,
    pub(crate) name: &'a str,
    /// A symbolic link's target (empty otherwise).
    pub(crate) target: &'a str,
    /// A device node's device number (0 otherwise).
    pub(crate) rdev: u64,
    /// Its owner.
    pub(crate) owner: Owner,
}

/// `Create`: names a new inode in `parent` (whose `entries` are locked) and returns it.
pub(crate) fn create(
    parent: &Inode,
    entries: &mut Entries,
    new: &NewInode<'_>,
) -> Result<Arc<Inode>, Problem> {
    let NewInode {
        ino,
        kind,
        mode,
        time,
        name,
        target,
        rdev,
        owner,
    } = *new;
    dir(parent)?;
    if (kind == Kind::Symlink) == target.is_empty() {
        return Err(format!(
            "create of `{name}` ({kind:?}) with a link target of {} bytes",
            target.len()
        ));
    }
    if !kind.is_device() && rdev != 0 {
        return Err(format!(
            "create of `{name}` ({kind:?}) with device number {rdev}"
        ));
    }
    if entries.contains_key(name) {
        return Err(format!(
            "create of `{name}` in {}, where it exists",
            parent.ino
        ));
    }
    entries.insert(name.to_owned(), ino);
    if kind == Kind::Dir {
        parent.subdirs.fetch_add(1, Ordering::Relaxed);
    }
    parent.mtime.store(time, Ordering::Release);
    parent.changed(time);
    let attr = Attr {
        mode,
        uid: owner.uid,
        gid: owner.gid,
        parent: if kind == Kind::Dir { parent.ino } else { 0 },
        links: 1,
        unlinked: false,
        unnamed: false,
        never_named: false,
    };
    Ok(Arc::new(
        Inode::new(ino, kind, attr, time)
            .with_target(target)
            .with_rdev(rdev),
    ))
}

/// `CreateUnnamed`: a file with no name (`O_TMPFILE`), which only its handles reach.
pub(crate) fn create_unnamed(ino: u64, mode: u32, time: u64, owner: Owner) -> Arc<Inode> {
    let attr = Attr {
        mode,
        uid: owner.uid,
        gid: owner.gid,
        parent: 0,
        links: 0,
        unlinked: true,
        unnamed: true,
        never_named: false,
    };
    Arc::new(Inode::new(ino, Kind::File, attr, time))
}

/// `Remove`: takes `name` (naming `ino`) out of `parent`. `removed_entries`: the removed
/// inode's entries when it is a directory (locked; they must be empty). `time` 0: a record
/// of an old kind, the directory's time stays.
pub(crate) fn remove(
    parent: &Inode,
    entries: &mut Entries,
    name: &str,
    ino: u64,
    time: u64,
    removed_entries: Option<&Entries>,
) -> Result<(), Problem> {
    dir(parent)?;
    if entries.get(name) != Some(&ino) {
        return Err(format!(
            "removal of `{name}` (inode {ino}) from {}, which does not hold it",
            parent.ino
        ));
    }
    if removed_entries.is_some_and(|e| !e.is_empty()) {
        return Err(format!("removal of directory {ino}, which is not empty"));
    }
    entries.remove(name);
    if removed_entries.is_some() {
        less_subdirs(parent);
    }
    if time != 0 {
        parent.mtime.store(time, Ordering::Release);
        parent.changed(time);
    }
    Ok(())
}

/// `Link`: names the existing file or symbolic link `inode` (its attributes `attr` locked)
/// `name` in `parent` too (whose `entries` are locked).
pub(crate) fn link(
    parent: &Inode,
    entries: &mut Entries,
    inode: &Inode,
    attr: &mut Attr,
    name: &str,
    time: u64,
) -> Result<(), Problem> {
    dir(parent)?;
    if inode.kind == Kind::Dir {
        return Err(format!("link of directory {} as `{name}`", inode.ino));
    }
    if entries.contains_key(name) {
        return Err(format!(
            "link of `{name}` in {}, where it exists",
            parent.ino
        ));
    }
    if attr.unnamed {
        // An unnamed file (`O_TMPFILE`) gets its first name.
        attr.unnamed = false;
        attr.unlinked = false;
    } else if attr.unlinked || attr.links == 0 {
        return Err(format!("link of inode {}, which has no name", inode.ino));
    }
    attr.links += 1;
    entries.insert(name.to_owned(), inode.ino);
    parent.mtime.store(time, Ordering::Release);
    parent.changed(time);
    inode.changed(time);
    Ok(())
}

/// `inode` (its attributes `attr` locked) lost one of its names at `time` (a `Remove`, or a
/// `Rename` onto it; 0: a record of an old kind): true when that was its last. One that
/// keeps a name has its change time moved.
pub(crate) fn unname(inode: &Inode, attr: &mut Attr, time: u64) -> bool {
    attr.links = attr.links.saturating_sub(1);
    let last = attr.links == 0;
    if !last && time != 0 {
        inode.changed(time);
    }
    last
}

/// One directory fewer in `dir` (under its `entries` lock). Saturating: a count recovery
/// has not set yet (it replays before it counts) must not wrap.
fn less_subdirs(dir: &Inode) {
    let _ = dir
        .subdirs
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
}

/// The entries a rename changes, locked: one directory's or two.
pub(crate) enum RenameDirs<'a> {
    /// Source and target are one directory.
    Same(&'a mut Entries),
    /// The source's entries, then the target's.
    Two(&'a mut Entries, &'a mut Entries),
}

/// What a rename moves: the inode, the names, and what the target named before.
pub(crate) struct Move<'a> {
    pub(crate) ino: u64,
    pub(crate) src_name: &'a str,
    pub(crate) dst_name: &'a str,
    /// The inode the target name held (0: none).
    pub(crate) replaced: u64,
    /// Both directories' new time (0: a record of an old kind; the times stay).
    pub(crate) time: u64,
}

/// `Rename`: moves `m.ino` from `src` to `dst`. `moving`: the moved inode (its parent
/// changes when it is a directory); `replaced_entries`: the replaced inode's entries when it
/// is a directory (locked; they must be empty).
pub(crate) fn rename(
    src: &Inode,
    dst: &Inode,
    dirs: RenameDirs<'_>,
    moving: Option<&Inode>,
    replaced_entries: Option<&Entries>,
    m: &Move<'_>,
) -> Result<(), Problem> {
    dir(src)?;
    dir(dst)?;
    let Move {
        ino,
        src_name,
        dst_name,
        replaced,
        time,
    } = *m;
    let (from, mut to) = match dirs {
        RenameDirs::Same(entries) if src.ino == dst.ino => (entries, None),
        RenameDirs::Same(_) => {
            return Err(format!(
                "rename from {} to {} given one directory's entries",
                src.ino, dst.ino
            ));
        }
        RenameDirs::Two(from, to) => (from, Some(to)),
    };
    if from.get(src_name) != Some(&ino) {
        return Err(format!(
            "rename of `{src_name}` (inode {ino}) from {}, which does not hold it",
            src.ino
        ));
    }
    let before = match &to {
        Some(to) => to.get(dst_name),
        None => from.get(dst_name),
    }
    .copied()
    .unwrap_or(0);
    if before != replaced {
        return Err(format!(
            "rename onto `{dst_name}` in {}: it named {before}, the record says {replaced}",
            dst.ino
        ));
    }
    if replaced == ino {
        return Err(format!("rename of inode {ino} onto its own name"));
    }
    if replaced_entries.is_some_and(|e| !e.is_empty()) {
        return Err(format!(
            "rename onto directory {replaced}, which is not empty"
        ));
    }
    from.remove(src_name);
    match &mut to {
        Some(to) => to.insert(dst_name.to_owned(), ino),
        None => from.insert(dst_name.to_owned(), ino),
    };
    if replaced_entries.is_some() {
        less_subdirs(dst);
    }
    if src.ino != dst.ino && moving.is_some_and(|m| m.kind == Kind::Dir) {
        less_subdirs(src);
        dst.subdirs.fetch_add(1, Ordering::Relaxed);
    }
    if time != 0 {
        for d in [src, dst] {
            d.mtime.store(time, Ordering::Release);
            d.changed(time);
        }
        if let Some(moving) = moving {
            moving.changed(time);
        }
    }
    if let Some(moving) = moving
        && moving.kind == Kind::Dir
    {
        moving.attr().parent = dst.ino;
    }
    Ok(())
}

/// `Exchange`: `a_name` in `a_dir` (naming `a`) and `b_name` in `b_dir` (naming `b`) trade
/// inodes. A directory that changes parent takes its `..` along (parent, subdirectory
/// counts); both directories' mtime and ctime and both inodes' ctime become `time`.
pub(crate) fn exchange(
    (a_dir, b_dir): (&Inode, &Inode),
    dirs: RenameDirs<'_>,
    (a, b): (&Inode, &Inode),
    (a_name, b_name): (&str, &str),
    time: u64,
) -> Result<(), Problem> {
    dir(a_dir)?;
    dir(b_dir)?;
    let (a_entries, mut b_entries) = match dirs {
        RenameDirs::Same(entries) if a_dir.ino == b_dir.ino => (entries, None),
        RenameDirs::Two(a_entries, b_entries) if a_dir.ino != b_dir.ino => {
            (a_entries, Some(b_entries))
        }
        _ => {
            return Err(format!(
                "exchange between {} and {} given the wrong directories' entries",
                a_dir.ino, b_dir.ino
            ));
        }
    };
    let b_held = match &b_entries {
        Some(entries) => entries.get(b_name),
        None => a_entries.get(b_name),
    };
    if a_entries.get(a_name) != Some(&a.ino) || b_held != Some(&b.ino) || a.ino == b.ino {
        return Err(format!(
            "exchange of `{a_name}` in {} and `{b_name}` in {}, which do not hold {} and {}",
            a_dir.ino, b_dir.ino, a.ino, b.ino
        ));
    }
    a_entries.insert(a_name.to_owned(), b.ino);
    match &mut b_entries {
        Some(entries) => entries.insert(b_name.to_owned(), a.ino),
        None => a_entries.insert(b_name.to_owned(), a.ino),
    };
    if a_dir.ino != b_dir.ino {
        for (moved, from, to) in [(a, a_dir, b_dir), (b, b_dir, a_dir)] {
            if moved.kind == Kind::Dir {
                less_subdirs(from);
                to.subdirs.fetch_add(1, Ordering::Relaxed);
                moved.attr().parent = to.ino;
            }
        }
    }
    for d in [a_dir, b_dir] {
        d.mtime.store(time, Ordering::Release);
        d.changed(time);
    }
    a.changed(time);
    b.changed(time);
    Ok(())
}

/// `Truncate`: sets a file's size (its `extents` locked); `tail`, when shrinking into a
/// block, is a fresh page holding the block's kept bytes. Returns the blocks it unmapped.
pub(crate) fn truncate(
    inode: &Inode,
    extents: &mut ExtentMap,
    size: u64,
    tail: u64,
    time: u64,
) -> Result<Vec<Run>, Problem> {
    file(inode, "truncate")?;
    let mut freed = extents.truncate(size.div_ceil(BLOCK));
    if tail != 0 {
        extents.map(size / BLOCK, 1, tail, &mut freed);
    }
    inode.overlay.truncate(size);
    inode.size.store(size, Ordering::Release);
    inode.mtime.store(time, Ordering::Release);
    inode.changed(time);
    Ok(freed)
}

/// `Punch`: unmaps `blocks` whole blocks from `first_block` (its `extents` locked). Returns
/// the blocks it unmapped.
pub(crate) fn punch(
    inode: &Inode,
    extents: &mut ExtentMap,
    first_block: u64,
    blocks: u64,
    time: u64,
) -> Result<Vec<Run>, Problem> {
    file(inode, "hole punched in")?;
    let end = first_block
        .checked_add(blocks)
        .filter(|end| end.checked_mul(BLOCK).is_some())
        .ok_or_else(|| format!("a hole of {blocks} blocks at block {first_block}"))?;
    let freed = extents.punch(first_block, end);
    inode.overlay.punch(first_block * BLOCK, end * BLOCK);
    inode.mtime.store(time, Ordering::Release);
    inode.changed(time);
    Ok(freed)
}

/// `Allocate`: maps zeroed blocks into holes of a file (its `extents` locked) and grows its
/// size to `size` when that is larger. Every run must be a hole: the live path took them
/// from the holes it saw under the batch lock, so replay, which reaches the same state,
/// finds the same holes.
pub(crate) fn allocate(
    inode: &Inode,
    extents: &mut ExtentMap,
    runs: &[Run],
    size: u64,
    time: u64,
) -> Result<(), Problem> {
    file(inode, "blocks allocated in")?;
    if let Some(run) = runs.iter().find(|r| {
        !extents
            .lookup(r.file_block, r.file_block + r.blocks)
            .is_empty()
    }) {
        return Err(format!(
            "blocks {}..{} allocated in file {} are not a hole",
            run.file_block,
            run.file_block + run.blocks,
            inode.ino
        ));
    }
    let mut replaced = Vec::new();
    for run in runs {
        extents.map(run.file_block, run.blocks, run.addr, &mut replaced);
    }
    debug_assert!(replaced.is_empty());
    inode.size.fetch_max(size, Ordering::AcqRel);
    inode.mtime.store(time, Ordering::Release);
    inode.changed(time);
    Ok(())
}

/// `SetMode` (the inode's `attr` locked). `time` 0: a record of an old kind, the change
/// time stays.
pub(crate) fn set_mode(inode: &Inode, attr: &mut Attr, mode: u32, time: u64) {
    attr.mode = mode;
    if time != 0 {
        inode.changed(time);
    }
}

/// `SetOwner` (the inode's `attr` locked): owner and the permission bits the change left.
pub(crate) fn set_owner(inode: &Inode, attr: &mut Attr, owner: Owner, mode: u32, time: u64) {
    attr.uid = owner.uid;
    attr.gid = owner.gid;
    attr.mode = mode;
    inode.changed(time);
}

/// `SetXattr` (the inode's attributes locked): `name` set to `value`.
pub(crate) fn set_xattr(inode: &Inode, xattrs: &mut Xattrs, name: &str, value: &[u8], time: u64) {
    xattrs.insert(name.to_owned(), value.into());
    inode.changed(time);
}

/// `SetAcl` (the inode's `attr` and attributes locked): the mode, and the access ACL set
/// to `value` or, empty, dropped.
pub(crate) fn set_acl(
    inode: &Inode,
    attr: &mut Attr,
    xattrs: &mut Xattrs,
    mode: u32,
    value: &[u8],
    time: u64,
) {
    attr.mode = mode;
    if value.is_empty() {
        xattrs.remove(crate::acl::ACCESS);
    } else {
        xattrs.insert(crate::acl::ACCESS.to_owned(), value.into());
    }
    inode.changed(time);
}

/// `RemoveXattr` (the inode's attributes locked): `name` must be there.
pub(crate) fn remove_xattr(
    inode: &Inode,
    xattrs: &mut Xattrs,
    name: &str,
    time: u64,
) -> Result<(), Problem> {
    if xattrs.remove(name).is_none() {
        return Err(format!(
            "removal of extended attribute {name} of {}, which has none of that name",
            inode.ino
        ));
    }
    inode.changed(time);
    Ok(())
}

/// `SetTimes`: access and modification time as given (0: unchanged), change time `ctime`.
/// Stored, not raised: a time set into the past is what `touch -d` and `tar` ask for.
pub(crate) fn set_times(inode: &Inode, atime: u64, mtime: u64, ctime: u64) {
    if atime != 0 {
        inode.atime.store(atime, Ordering::Release);
    }
    if mtime != 0 {
        inode.mtime.store(mtime, Ordering::Release);
    }
    inode.changed(ctime);
}

/// A data record: `len` bytes at `offset` of a file are at `buffer` (order `order`, written
/// at `mtime`). The file's overlay serves them until the checkpoint moves them.
pub(crate) fn write(
    inode: &Inode,
    offset: u64,
    len: u64,
    buffer: u64,
    order: u64,
    mtime: u64,
) -> Result<(), Problem> {
    file(inode, "a write")?;
    inode.overlay.insert(offset, len, buffer, order);
    written(inode, offset, len, mtime);
    Ok(())
}

/// A data record whose block its writer remapped into the file
/// (`crate::overlay::Overlay::remap_block`): its size and times.
pub(crate) fn file_written(
    inode: &Inode,
    offset: u64,
    len: u64,
    mtime: u64,
) -> Result<(), Problem> {
    file(inode, "a write")?;
    written(inode, offset, len, mtime);
    Ok(())
}

/// The size and times of a write of `[offset, offset + len)` at `mtime` whose data is in
/// place already (in the overlay, or remapped into the file by its writer).
fn written(inode: &Inode, offset: u64, len: u64, mtime: u64) {
    // An overwrite leaves the size as it is: no locked instruction for it.
    if inode.size.load(Ordering::Acquire) < offset + len {
        inode.size.fetch_max(offset + len, Ordering::AcqRel);
    }
    // Only when the time moves: writes of one tick share a time (`crate::fs::write_time`).
    if inode.mtime.load(Ordering::Relaxed) < mtime {
        inode.mtime.fetch_max(mtime, Ordering::AcqRel);
    }
    inode.changed(mtime);
}

/// A checkpoint `Batch`: maps `maps` into their files and raises sizes and times. Entries of
/// files removed since are skipped (their removal is durable); `inode` finds a file;
/// `times_set` is the order of the last replayed `SetTimes` that set a file's modification
/// time (0: none): a size entry's time is older than that set when its order is lower.
pub(crate) fn batch(
    maps: &[MapEntry],
    sizes: &[SizeEntry],
    inode: impl Fn(u64) -> Option<Arc<Inode>>,
    times_set: impl Fn(u64) -> u64,
) {
    // What the maps replaced was freed when the batch committed (and recovery's allocator
    // is rebuilt from what is mapped): nothing to hand back here.
    let mut replaced = Vec::new();
    for m in maps {
        if let Some(file) = inode(m.ino).filter(|i| i.kind == Kind::File) {
            file.extents.write().expect("extent map").map(
                m.file_block,
                m.blocks,
                m.addr,
                &mut replaced,
            );
            replaced.clear();
        }
    }
    for z in sizes {
        if let Some(file) = inode(z.ino) {
            file.size.fetch_max(z.size, Ordering::AcqRel);
            if z.order >= times_set(z.ino) {
                file.mtime.fetch_max(z.mtime, Ordering::AcqRel);
            }
            file.changed(z.mtime);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(ino: u64, kind: Kind) -> Arc<Inode> {
        let attr = Attr {
            mode: 0o755,
            uid: 0,
            gid: 0,
            parent: 1,
            links: 1,
            unlinked: false,
            unnamed: false,
            never_named: false,
        };
        Arc::new(Inode::new(ino, kind, attr, 1))
    }

    fn names(entries: &Entries) -> Vec<(&str, u64)> {
        entries.iter().map(|(n, i)| (n.as_str(), *i)).collect()
    }

    #[test]
    fn rename_within_a_directory_replaces_the_target() {
        let d = inode(1, Kind::Dir);
        let mut entries = Entries::from([("a".into(), 2), ("b".into(), 3)]);
        let m = Move {
            ino: 2,
            src_name: "a",
            dst_name: "b",
            replaced: 3,
            time: 77,
        };
        rename(&d, &d, RenameDirs::Same(&mut entries), None, None, &m).unwrap();
        assert_eq!(names(&entries), [("b", 2)]);
        assert_eq!(d.mtime.load(Ordering::Acquire), 77);
    }

    #[test]
    fn rename_moves_a_directory_and_its_parent() {
        let (src, dst, moved) = (
            inode(1, Kind::Dir),
            inode(5, Kind::Dir),
            inode(6, Kind::Dir),
        );
        let mut from = Entries::from([("d".into(), 6)]);
        let mut to = Entries::new();
        let m = Move {
            ino: 6,
            src_name: "d",
            dst_name: "e",
            replaced: 0,
            time: 0,
        };
        rename(
            &src,
            &dst,
            RenameDirs::Two(&mut from, &mut to),
            Some(&moved),
            None,
            &m,
        )
        .unwrap();
        assert!(from.is_empty());
        assert_eq!(names(&to), [("e", 6)]);
        assert_eq!(moved.attr().parent, 5);
        assert_eq!(
            src.mtime.load(Ordering::Acquire),
            1,
            "time 0 leaves times as they were"
        );
    }

    #[test]
    fn records_that_disagree_with_the_state_are_named() {
        let d = inode(1, Kind::Dir);
        let mut entries = Entries::from([("a".into(), 2), ("b".into(), 3)]);
        let m = Move {
            ino: 2,
            src_name: "a",
            dst_name: "b",
            replaced: 9,
            time: 0,
        };
        let problem = rename(&d, &d, RenameDirs::Same(&mut entries), None, None, &m).unwrap_err();
        assert!(
            problem.contains("it named 3, the record says 9"),
            "{problem}"
        );
        assert_eq!(names(&entries), [("a", 2), ("b", 3)], "nothing changed");

        let new = |name| NewInode {
            ino: 4,
            kind: Kind::File,
            mode: 0o644,
            time: 5,
            name,
            target: "",
            rdev: 0,
            owner: Owner { uid: 0, gid: 0 },
        };
        let problem = create(&d, &mut entries, &new("a")).unwrap_err();
        assert!(problem.contains("where it exists"), "{problem}");

        let full = Entries::from([("x".into(), 8)]);
        let problem = remove(&d, &mut entries, "b", 3, 5, Some(&full)).unwrap_err();
        assert!(problem.contains("not empty"), "{problem}");
        assert_eq!(names(&entries), [("a", 2), ("b", 3)]);

        let f = inode(2, Kind::File);
        let problem = create(&f, &mut Entries::new(), &new("z")).unwrap_err();
        assert!(problem.contains("not a directory"), "{problem}");
        let linkless = NewInode {
            kind: Kind::Symlink,
            ..new("s")
        };
        let problem = create(&d, &mut entries, &linkless).unwrap_err();
        assert!(problem.contains("link target of 0 bytes"), "{problem}");
        let problem = write(&d, 0, 1, 0, 1, 1).unwrap_err();
        assert!(problem.contains("not a file"), "{problem}");
        let problem = punch(&f, &mut ExtentMap::new(), u64::MAX - 1, 5, 1).unwrap_err();
        assert!(problem.contains("a hole of 5 blocks"), "{problem}");
    }

    #[test]
    fn truncate_maps_the_kept_tail_and_returns_what_it_unmapped() {
        let f = inode(2, Kind::File);
        let mut extents = ExtentMap::new();
        extents.map(0, 4, 1 << 20, &mut Vec::new());
        let freed = truncate(&f, &mut extents, BLOCK + 10, 9 << 20, 42).unwrap();
        let freed_blocks: u64 = freed.iter().map(|r| r.blocks).sum();
        assert_eq!(
            freed_blocks, 3,
            "blocks 1..4 unmapped (block 1 replaced by the tail)"
        );
        assert_eq!(extents.get(0), Some(1 << 20));
        assert_eq!(extents.get(1), Some(9 << 20));
        assert_eq!(f.size.load(Ordering::Acquire), BLOCK + 10);
        assert_eq!(f.mtime.load(Ordering::Acquire), 42);
    }
}
