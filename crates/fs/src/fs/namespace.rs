//! Namespace operations: path resolution, create, remove, rename, truncate, punch, chmod,
//! stat. Each takes its directory locks, journals one record, then changes DRAM.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use volume::Extent;

use super::handles::Masking;
use super::state::{Inner, Slot};
use super::{MAX_FILE_SIZE, ROOT_INO, WHOLE_FILE, ZEROS, now_ns};
use crate::acl::{self, Acl};
use crate::apply::{self, Entries, Move, NewInode, RenameDirs, applied};
use crate::error::{FsError, Result};
use crate::extent_map::{BLOCK, Run};
use crate::inode::{Attr, Inode, Owner, Stat};
use crate::journal::{Kind, MAX_ALLOCATE_RUNS, MetaOp};
use crate::lock_order::Ordered;
use crate::path;
use crate::pieces::{Piece, alloc_halving};
use crate::range_lock::LockMode;
use crate::snapshot::{INODE_BYTES, RUN_BYTES, entry_bytes};
use crate::xattr::{self, XattrSet};

impl Inner {
    pub(crate) fn lookup_in(&self, dir: &Inode, name: &str, shown: &str) -> Result<Arc<Inode>> {
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir(shown.to_owned()));
        }
        let ino = dir
            .entries()
            .get(name)
            .copied()
            .ok_or_else(|| FsError::NotFound(shown.to_owned()))?;
        self.inode(ino)
            .ok_or_else(|| FsError::NotFound(shown.to_owned()))
    }

    /// Walks `names` (of `path`) from the root. A symbolic link is reported where it is met
    /// before the last name, and at the last one when `follow_last`: the file system never
    /// follows one itself (its target is a path of the caller's name space).
    fn walk(&self, path: &str, names: &[&str], follow_last: bool) -> Result<Arc<Inode>> {
        let mut at = self.inode(ROOT_INO).expect("root directory");
        for (i, name) in names.iter().enumerate() {
            at = self.lookup_in(&at, name, path)?;
            if at.kind == Kind::Symlink && (follow_last || i + 1 < names.len()) {
                return Err(FsError::Symlink {
                    link: format!("/{}", names[..=i].join("/")),
                    target: at.target.to_string(),
                });
            }
        }
        Ok(at)
    }

    /// The inode `path` names; a symbolic link there is the link itself (`lstat`).
    pub(crate) fn resolve(&self, path: &str) -> Result<Arc<Inode>> {
        self.walk(path, &path::components(path)?, false)
    }

    /// The inode `path` leads to: a symbolic link there is reported ([`FsError::Symlink`]).
    pub(crate) fn resolve_follow(&self, path: &str) -> Result<Arc<Inode>> {
        self.walk(path, &path::components(path)?, true)
    }

    /// The directory holding the last name of `path`, and that name.
    pub(crate) fn resolve_parent<'p>(&self, path: &'p str) -> Result<(Arc<Inode>, &'p str)> {
        let mut names = path::components(path)?;
        let name = names.pop().ok_or_else(|| {
            FsError::Invalid("the root directory cannot be changed this way".into())
        })?;
        let at = self.walk(path, &names, true)?;
        if at.kind != Kind::Dir {
            return Err(FsError::NotDir(path.to_owned()));
        }
        Ok((at, name))
    }

    /// Runs a metadata operation, retrying after a snapshot if the journal was full.
    pub(crate) fn metadata<T>(
        self: &Arc<Self>,
        mut op: impl FnMut(&Self, &Slot) -> Result<Option<T>>,
    ) -> Result<T> {
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            let gate = self.gate_shared();
            let done = op(self, &slot)?;
            drop(gate);
            match done {
                Some(value) => return Ok(value),
                None => self.wait_for_snapshot()?,
            }
        }
    }

    /// Creates `path`: a file, a directory, a symbolic link to `target` (empty for the
    /// others), a FIFO, a socket or a device node of number `rdev` (0 for the others), owned
    /// by `owner` — but in a set-group-ID directory it takes the directory's group, and a
    /// directory made there is set-group-ID too (as on the kernel's file systems). In a
    /// directory with a default ACL (when `masking` heeds them) it inherits that ACL,
    /// limited by `mode`, and a directory also takes the default ACL itself; elsewhere
    /// `masking`'s umask is taken from `mode`.
    ///
    /// The inherited ACLs are records of their own after the create: until the access ACL
    /// is stored the file's group digit gives the owning group only what the ACL gives it,
    /// so a crash in between leaves a file that grants less than its ACL, never more.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        self: &Arc<Self>,
        path: &str,
        kind: Kind,
        mode: u32,
        masking: Masking,
        target: &str,
        rdev: u64,
        owner: Owner,
    ) -> Result<Arc<Inode>> {
        if kind == Kind::Symlink {
            path::check_target(target)?;
            self.symlinks.store(true, Ordering::Release);
        }
        let mut inherit = None;
        let inode = self.metadata(|fs, slot| {
            let (parent, name) = fs.resolve_parent(path)?;
            let mut entries = parent.entries();
            name_is_free(&parent, &entries, name, path)?;
            let (mode, from_acl) = creation_mode(&parent, kind, mode, masking)?;
            inherit = from_acl;
            let (owner, mode) = inherited(&parent.attr(), kind, owner, mode);
            let ino = fs.next_ino.fetch_add(1, Ordering::Relaxed);
            let time = now_ns();
            let op = MetaOp::Create {
                parent: parent.ino,
                ino,
                kind,
                mode,
                time,
                name: name.to_owned(),
                target: target.to_owned(),
                rdev,
                uid: owner.uid,
                gid: owner.gid,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let new = NewInode {
                ino,
                kind,
                mode,
                time,
                name,
                target,
                rdev,
                owner,
            };
            let inode = applied(apply::create(&parent, &mut entries, &new));
            fs.table_mut().insert(ino, Arc::clone(&inode));
            let target_bytes = if target.is_empty() {
                0
            } else {
                2 + target.len() as u64
            } + if kind.is_device() { 8 } else { 0 };
            fs.grow_snapshot(INODE_BYTES + entry_bytes(name) + target_bytes);
            Ok(Some(inode))
        })?;
        if let Some(inherit) = inherit {
            self.inherit_acls(&inode, inherit)?;
        }
        Ok(inode)
    }

    /// A file with no name in directory `dir` (`open(O_TMPFILE)`), open once: only handles
    /// reach it until [`Inner::link_inode`] names it; its last close drops it, as recovery
    /// does when the process holding it ended with a crash. It takes its owner, mode and
    /// ACL as a file created in `dir` would. With `exclusive` it can never be named.
    pub(crate) fn create_unnamed(
        self: &Arc<Self>,
        dir: &str,
        mode: u32,
        exclusive: bool,
        masking: Masking,
        owner: Owner,
    ) -> Result<Arc<Inode>> {
        let mut inherit = None;
        let inode = self.metadata(|fs, slot| {
            let parent = fs.resolve_follow(dir)?;
            if parent.kind != Kind::Dir {
                return Err(FsError::NotDir(dir.to_owned()));
            }
            if parent.attr().unlinked {
                return Err(FsError::NotFound(dir.to_owned()));
            }
            let (mode, from_acl) = creation_mode(&parent, Kind::File, mode, masking)?;
            inherit = from_acl;
            let (owner, mode) = inherited(&parent.attr(), Kind::File, owner, mode);
            let ino = fs.next_ino.fetch_add(1, Ordering::Relaxed);
            let time = now_ns();
            let op = MetaOp::CreateUnnamed {
                ino,
                mode,
                time,
                uid: owner.uid,
                gid: owner.gid,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let inode = apply::create_unnamed(ino, mode, time, owner);
            inode.attr().never_named = exclusive;
            // Open from the start: a close before the caller has it drops it.
            inode.opens.fetch_add(1, Ordering::AcqRel);
            fs.table_mut().insert(ino, Arc::clone(&inode));
            fs.grow_snapshot(INODE_BYTES);
            Ok(Some(inode))
        })?;
        if let Some(inherit) = inherit {
            self.inherit_acls(&inode, inherit)?;
        }
        Ok(inode)
    }

    /// Gives a new inode what a default ACL of its directory passes on (see
    /// [`creation_mode`]): a directory's default ACL, and the access ACL with the mode it
    /// leaves.
    fn inherit_acls(self: &Arc<Self>, inode: &Arc<Inode>, inherit: Inherited) -> Result<()> {
        if let Some(dir_default) = inherit.dir_default {
            self.set_xattr(inode, acl::DEFAULT, &dir_default, XattrSet::Any, false)?;
        }
        if let Some(access) = inherit.access {
            let value: Box<[u8]> = access.encode().into();
            self.metadata(|fs, slot| {
                let mut attr = inode.attr();
                let mut xattrs = inode.xattrs.lock().expect("extended attributes");
                // The set-group-ID bit a set-group-ID directory gave is kept.
                let mode = inherit.full | (attr.mode & libc::S_ISGID);
                Ok(fs
                    .journal_acl(slot, inode, &mut attr, &mut xattrs, mode, &value)?
                    .then_some(()))
            })?;
        }
        Ok(())
    }

    /// Drops an unnamed file at its last close: journaled first (until then recovery would
    /// bring it back, and its blocks must not be used by another file), then freed.
    pub(crate) fn drop_unnamed(self: &Arc<Self>, inode: &Arc<Inode>) -> Result<()> {
        let dropped = self.metadata(|fs, slot| {
            let attr = inode.attr();
            // Named since (its last close raced with a link): it stays.
            if !attr.unnamed {
                return Ok(Some(false));
            }
            if !fs.journal(slot, &MetaOp::DropUnnamed { ino: inode.ino })? {
                return Ok(None);
            }
            Ok(Some(true))
        })?;
        if dropped { self.destroy(inode) } else { Ok(()) }
    }

    pub(crate) fn remove(self: &Arc<Self>, path: &str, dir: bool) -> Result<()> {
        self.metadata(|fs, slot| {
            // rmdir locks parent then child; renames (which lock directories in inode order)
            // are kept out by the rename lock.
            let _rename = dir.then(|| fs.lock_rename());
            let (parent, name) = fs.resolve_parent(path)?;
            let mut entries = parent.entries();
            let ino = *entries
                .get(name)
                .ok_or_else(|| FsError::NotFound(path.to_owned()))?;
            let target = fs
                .inode(ino)
                .ok_or_else(|| FsError::NotFound(path.to_owned()))?;
            match (dir, target.kind) {
                (true, kind) if kind != Kind::Dir => {
                    return Err(FsError::NotDir(path.to_owned()));
                }
                (false, Kind::Dir) => return Err(FsError::IsDir(path.to_owned())),
                _ => {}
            }
            let child_entries = dir.then(|| target.entries());
            if child_entries.as_ref().is_some_and(|e| !e.is_empty()) {
                return Err(FsError::NotEmpty(path.to_owned()));
            }
            // Held from the record to the count: a link of the same inode journals and
            // counts wholly before or wholly after, as recovery will replay them.
            let mut target_attr = target.attr();
            let time = now_ns();
            let op = MetaOp::Remove {
                parent: parent.ino,
                ino,
                name: name.to_owned(),
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            applied(apply::remove(
                &parent,
                &mut entries,
                name,
                ino,
                time,
                child_entries.as_deref(),
            ));
            drop(child_entries);
            let last = apply::unname(&target, &mut target_attr, time);
            drop(target_attr);
            if last {
                fs.unlinked(&target)?;
            }
            Ok(Some(()))
        })
    }

    /// Names the file or symbolic link `existing` (not followed) `new` too: a hard link.
    pub(crate) fn link(self: &Arc<Self>, existing: &str, new: &str) -> Result<()> {
        let inode = self.resolve(existing)?;
        self.link_inode(&inode, existing, new)
    }

    /// Names `inode` (`shown` in errors) `new` too — or first, an unnamed file
    /// ([`Inner::create_unnamed`]). One whose names were all removed cannot be named again.
    pub(crate) fn link_inode(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        shown: &str,
        new: &str,
    ) -> Result<()> {
        self.metadata(|fs, slot| {
            if inode.kind == Kind::Dir {
                return Err(FsError::NotPermitted(format!(
                    "{shown} is a directory, which cannot have a second name"
                )));
            }
            let (parent, name) = fs.resolve_parent(new)?;
            let mut entries = parent.entries();
            name_is_free(&parent, &entries, name, new)?;
            // Held from the check to the count, as a removal holds it from its record to
            // the count: the two are journaled in the order they change it.
            let mut attr = inode.attr();
            // Its last name removed since it was looked up (no lock was held in between).
            if attr.never_named || !attr.unnamed && (attr.unlinked || attr.links == 0) {
                return Err(FsError::NotFound(shown.to_owned()));
            }
            let op = MetaOp::Link {
                parent: parent.ino,
                ino: inode.ino,
                name: name.to_owned(),
                time: now_ns(),
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let MetaOp::Link { time, .. } = op else {
                unreachable!("built above")
            };
            applied(apply::link(
                &parent,
                &mut entries,
                inode,
                &mut attr,
                name,
                time,
            ));
            fs.grow_snapshot(entry_bytes(name));
            Ok(Some(()))
        })
    }

    /// `inode` lost its name: forget it now, or at its last close.
    pub(crate) fn unlinked(&self, inode: &Arc<Inode>) -> Result<()> {
        inode.attr().unlinked = true;
        if inode.opens.load(Ordering::Acquire) == 0 {
            self.destroy(inode)?;
        }
        Ok(())
    }

    /// Drops an unlinked, closed inode and frees its blocks. Its removal is durable already,
    /// so after a crash nothing owns these blocks either.
    pub(crate) fn destroy(&self, inode: &Arc<Inode>) -> Result<()> {
        if self.table_mut().remove(&inode.ino).is_none() {
            return Ok(());
        }
        let mut extents = inode.extents.write().expect("extent map");
        inode.dead.store(true, Ordering::Release);
        let runs = extents.truncate(0);
        drop(extents);
        inode.overlay.truncate(0);
        self.free_runs(&runs)
    }

    /// Frees blocks a file no longer has (or never got). One of them may be the page a
    /// writer's remap made the file's while its record waits for the checkpoint, the newest
    /// of its log: confirmed first ([`Inner::confirm_logs`]), so that its next owner's stores
    /// cannot make recovery take that write for one a crash cut short.
    pub(crate) fn free_runs(&self, runs: &[Run]) -> Result<()> {
        if !runs.is_empty() {
            self.confirm_logs()?;
        }
        for run in runs {
            self.volume.free(run.pages())?;
        }
        Ok(())
    }

    pub(crate) fn rename(self: &Arc<Self>, from: &str, to: &str) -> Result<()> {
        self.metadata(|fs, slot| {
            let _rename = fs.lock_rename();
            let (src, src_name) = fs.resolve_parent(from)?;
            let (dst, dst_name) = fs.resolve_parent(to)?;
            let mut locked = TwoDirs::lock(&src, &dst);
            let ino = *locked
                .of(src.ino)
                .get(src_name)
                .ok_or_else(|| FsError::NotFound(from.to_owned()))?;
            let moving = fs
                .inode(ino)
                .ok_or_else(|| FsError::NotFound(from.to_owned()))?;
            if dst.attr().unlinked {
                return Err(FsError::NotFound(to.to_owned()));
            }
            // The target directory must not be the moving one or inside it.
            if moving.kind == Kind::Dir && fs.is_within(dst.ino, ino) {
                return Err(FsError::Invalid(format!(
                    "cannot move {from} into itself ({to})"
                )));
            }
            let replaced = locked.of(dst.ino).get(dst_name).copied();
            if replaced == Some(ino) {
                return Ok(Some(()));
            }
            let target = replaced.and_then(|r| fs.inode(r));
            let target_entries = match (&target, moving.kind) {
                (Some(t), Kind::Dir) if t.kind != Kind::Dir => {
                    return Err(FsError::NotDir(to.to_owned()));
                }
                (Some(t), kind) if kind != Kind::Dir && t.kind == Kind::Dir => {
                    return Err(FsError::IsDir(to.to_owned()));
                }
                (Some(t), Kind::Dir) => {
                    let e = t.entries();
                    if !e.is_empty() {
                        return Err(FsError::NotEmpty(to.to_owned()));
                    }
                    Some(e)
                }
                _ => None,
            };
            // Held from the record to the count, as `remove` holds it.
            let mut target_attr = target.as_ref().map(|t| t.attr());
            let op = MetaOp::Rename {
                src_parent: src.ino,
                src_name: src_name.to_owned(),
                dst_parent: dst.ino,
                dst_name: dst_name.to_owned(),
                ino,
                replaced: replaced.unwrap_or(0),
                time: now_ns(),
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let MetaOp::Rename { time, .. } = op else {
                unreachable!("built above")
            };
            let dirs = locked.dirs(src.ino);
            let moved = Move {
                ino,
                src_name,
                dst_name,
                replaced: replaced.unwrap_or(0),
                time,
            };
            applied(apply::rename(
                &src,
                &dst,
                dirs,
                Some(&moving),
                target_entries.as_deref(),
                &moved,
            ));
            drop(target_entries);
            fs.grow_snapshot(entry_bytes(dst_name));
            let last = match (&target, target_attr.as_mut()) {
                (Some(t), Some(attr)) => apply::unname(t, attr, time),
                _ => false,
            };
            drop(target_attr);
            if let Some(t) = target.filter(|_| last) {
                fs.unlinked(&t)?;
            }
            Ok(Some(()))
        })
    }

    /// `a` and `b` trade the inodes they name, atomically (`RENAME_EXCHANGE`): both must
    /// exist, of any kinds; a directory must not end up inside itself. Two names of one
    /// inode change nothing.
    pub(crate) fn exchange(self: &Arc<Self>, a: &str, b: &str) -> Result<()> {
        self.metadata(|fs, slot| {
            let _rename = fs.lock_rename();
            let (a_dir, a_name) = fs.resolve_parent(a)?;
            let (b_dir, b_name) = fs.resolve_parent(b)?;
            let mut locked = TwoDirs::lock(&a_dir, &b_dir);
            let named = |ino: Option<&u64>, path: &str| {
                ino.and_then(|&i| fs.inode(i))
                    .ok_or_else(|| FsError::NotFound(path.to_owned()))
            };
            let a_node = named(locked.of(a_dir.ino).get(a_name), a)?;
            let b_node = named(locked.of(b_dir.ino).get(b_name), b)?;
            if a_node.ino == b_node.ino {
                return Ok(Some(()));
            }
            // Each directory's new parent must not be it or inside it.
            if (a_node.kind == Kind::Dir && fs.is_within(b_dir.ino, a_node.ino))
                || (b_node.kind == Kind::Dir && fs.is_within(a_dir.ino, b_node.ino))
            {
                return Err(FsError::Invalid(format!(
                    "cannot exchange {a} and {b}: a directory would move into itself"
                )));
            }
            let time = now_ns();
            let op = MetaOp::Exchange {
                a_parent: a_dir.ino,
                a_name: a_name.to_owned(),
                b_parent: b_dir.ino,
                b_name: b_name.to_owned(),
                a_ino: a_node.ino,
                b_ino: b_node.ino,
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            applied(apply::exchange(
                (&a_dir, &b_dir),
                locked.dirs(a_dir.ino),
                (&a_node, &b_node),
                (a_name, b_name),
                time,
            ));
            Ok(Some(()))
        })
    }

    /// Whether directory `dir` is `ancestor` or inside it (the rename lock held, so no
    /// directory moves meanwhile).
    fn is_within(&self, dir: u64, ancestor: u64) -> bool {
        let mut at = dir;
        loop {
            if at == ancestor {
                return true;
            }
            if at == ROOT_INO {
                return false;
            }
            at = self.inode(at).map_or(ROOT_INO, |i| i.attr().parent);
        }
    }

    pub(crate) fn set_len(self: &Arc<Self>, inode: &Arc<Inode>, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::TooLarge(format!(
                "size {size} is over the largest file ({MAX_FILE_SIZE})"
            )));
        }
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            // Keep writers, readers and the checkpoint off the whole file; dropped (with the
            // gate) before waiting for a snapshot, which the checkpoint could not take
            // otherwise.
            let batch = self.lock_batch();
            let range = self.lock_range(inode, 0, WHOLE_FILE, LockMode::Exclusive)?;
            let gate = self.gate_shared();
            let done = self.truncate_locked(&slot, inode, size)?;
            drop(gate);
            drop(range);
            drop(batch);
            if done {
                return Ok(());
            }
            self.wait_for_snapshot()?;
        }
    }

    pub(crate) fn punch_hole(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let end = (offset + len).min(inode.size.load(Ordering::Acquire));
        if offset >= end {
            return Ok(());
        }
        if inode.mapped.load(Ordering::Acquire) > 0 {
            // Mapped blocks stay the file's (`crate::fs::mapped`): the hole is zeros written
            // into them, and the writes reach the blocks before this returns.
            let mut at = offset;
            while at < end {
                let n = (end - at).min(ZEROS.len() as u64);
                self.write_at(inode, &ZEROS[..n as usize], at)?;
                at += n;
            }
            return self.drain();
        }
        let (first, last) = (offset.div_ceil(BLOCK), end / BLOCK);
        if first >= last {
            // Inside one block: zeros are all it takes.
            return self.write_at(inode, &ZEROS[..(end - offset) as usize], offset);
        }
        // The partial blocks at the edges get zeros, as writes; they are logged before the
        // hole's record, so replay orders them the same way.
        if offset < first * BLOCK {
            self.write_at(inode, &ZEROS[..(first * BLOCK - offset) as usize], offset)?;
        }
        if last * BLOCK < end {
            self.write_at(inode, &ZEROS[..(end - last * BLOCK) as usize], last * BLOCK)?;
        }
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            // As truncation: no batch half done, writers and readers off the range.
            let batch = self.lock_batch();
            let range = self.lock_range(
                inode,
                first * BLOCK,
                (last - first) * BLOCK,
                LockMode::Exclusive,
            )?;
            let gate = self.gate_shared();
            let time = now_ns();
            let op = MetaOp::Punch {
                ino: inode.ino,
                first_block: first,
                blocks: last - first,
                time,
            };
            if self.journal(&slot, &op)? {
                self.cuts
                    .note(inode.ino, first, last, self.progress.current_order());
                let freed = applied(apply::punch(
                    inode,
                    &mut inode.extents.write().expect("extent map"),
                    first,
                    last - first,
                    time,
                ));
                // A hole inside a run splits it.
                self.grow_snapshot(RUN_BYTES);
                drop(gate);
                drop(range);
                drop(batch);
                return self.free_runs(&freed);
            }
            drop(gate);
            drop(range);
            drop(batch);
            self.wait_for_snapshot()?;
        }
    }

    /// `fallocate` without `PUNCH_HOLE`: every hole of the blocks `[offset, offset + len)`
    /// touches gets a zeroed block, so that writing there cannot run out of space and the
    /// file's allocated size counts them; with `keep_size` false the size grows to cover
    /// the range. Runs out of space (`NoSpace`) before changing anything when the volume
    /// has not that much free; a race with other allocations can still stop it part way,
    /// with the blocks allocated so far kept (as on kernel file systems). Times change as a
    /// write's do. The work goes in pieces of [`ALLOCATE_PIECE`] bytes of the file, each
    /// under the batch lock only as long as its blocks take to zero.
    pub(crate) fn allocate(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<()> {
        let end = offset + len;
        self.check_running()?;
        self.room_to_allocate(inode, offset, len)?;
        let (first, last) = (offset / BLOCK, end.div_ceil(BLOCK));
        let slot = self.slot()?;
        let piece_blocks = ALLOCATE_PIECE / BLOCK;
        let mut from = first;
        while from < last {
            let to = last.min((from / piece_blocks + 1) * piece_blocks);
            // The size goes with the last piece's records.
            let size = if keep_size || to < last { 0 } else { end };
            while !self.allocate_piece(&slot, inode, from, to, size)? {
                self.wait_for_snapshot()?;
            }
            from = to;
        }
        Ok(())
    }

    /// `NoSpace` unless the volume has free memory for the holes among the blocks of
    /// `[offset, offset + len)` (its spare memory, or failing that — the checkpoint's
    /// reserve counted in — all of it). Short of it, the pages kept for small writes
    /// (`Recycled`) and the room left in the buffers the writers' threads are filling are
    /// given back first (as [`Inner::with_space`] does for a write), and the checkpoint
    /// drained so that the room is free: `Fs::space` counts both available, so an
    /// allocation of what `df` shows fits. Called with no lock held.
    pub(crate) fn room_to_allocate(&self, inode: &Inode, offset: u64, len: u64) -> Result<()> {
        let (first, last) = (offset / BLOCK, (offset + len).div_ceil(BLOCK));
        let wanted = {
            let extents = inode.extents.read().expect("extent map");
            holes(&extents, first, last)
                .iter()
                .map(|h| h.1)
                .sum::<u64>()
                * BLOCK
        };
        let short = || wanted > self.spare_bytes() && wanted > self.volume.free_bytes();
        if short() {
            self.recycled.drain(&self.volume)?;
            if self.trim_buffers()? {
                self.drain()?;
            }
        }
        if short() {
            return Err(FsError::Volume(volume::VolumeError::NoSpace {
                len_bytes: wanted,
            }));
        }
        Ok(())
    }

    /// One piece of [`Inner::allocate`]: blocks `[from, to)`. `false` when a journal filled
    /// up (what was journaled stays; wait for the snapshot and call again).
    fn allocate_piece(
        self: &Arc<Self>,
        slot: &Slot,
        inode: &Arc<Inode>,
        from: u64,
        to: u64,
        size: u64,
    ) -> Result<bool> {
        // As a hole punched: no batch half done, writers and readers off the range; a
        // logged write still waiting for the checkpoint lands on the zeroed block later,
        // as it would on any block the file has.
        let _batch = self.lock_batch();
        let _range = self.lock_range(
            inode,
            from * BLOCK,
            (to - from) * BLOCK,
            LockMode::Exclusive,
        )?;
        let _gate = self.gate_shared();
        // Under these locks no one else maps or unmaps blocks of the range.
        let holes = holes(&inode.extents.read().expect("extent map"), from, to);
        let mut runs = self.zeroed_runs(&holes)?;
        let mut extents = inode.extents.write().expect("extent map");
        let chunks: Vec<&[Run]> = if runs.is_empty() {
            vec![&[]]
        } else {
            runs.chunks(MAX_ALLOCATE_RUNS).collect()
        };
        let time = now_ns();
        let mut journaled = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            // The size goes with the last record.
            let size = if i + 1 == chunks.len() { size } else { 0 };
            let op = MetaOp::Allocate {
                ino: inode.ino,
                size,
                time,
                runs: chunk.to_vec(),
            };
            if !self.journal(slot, &op)? {
                drop(chunks);
                return self.free_runs(&runs.split_off(journaled)).map(|()| false);
            }
            applied(apply::allocate(inode, &mut extents, chunk, size, time));
            self.grow_snapshot(RUN_BYTES * chunk.len() as u64);
            journaled += chunk.len();
        }
        Ok(true)
    }

    /// Zeroed, durable blocks for `holes` (file block, blocks), as runs naming their file
    /// blocks: whole runs where free memory allows, smaller pieces where it does not
    /// ([`alloc_halving`]); their data checksums noted. On failure what was allocated is
    /// given back.
    pub(crate) fn zeroed_runs(&self, holes: &[(u64, u64)]) -> Result<Vec<Run>> {
        let mut runs: Vec<Run> = Vec::new();
        let fill = |runs: &mut Vec<Run>| -> Result<()> {
            for &(first, blocks) in holes {
                let mut pieces: Vec<Piece<Extent>> = Vec::new();
                let got = alloc_halving(blocks * BLOCK, BLOCK, usize::MAX, &mut pieces, |_, n| {
                    self.alloc_buffer(n)
                });
                runs.extend(pieces.iter().map(|p| Run {
                    file_block: first + p.at / BLOCK,
                    blocks: p.len / BLOCK,
                    addr: p.item.start.raw(),
                }));
                got?;
            }
            for run in runs.iter() {
                let (region, at) = self.region_at(run.addr)?;
                let mut zeroed = 0;
                while zeroed < run.blocks * BLOCK {
                    let n = (run.blocks * BLOCK - zeroed).min(ZEROS.len() as u64);
                    region.write_nt(at + zeroed, &ZEROS[..n as usize])?;
                    self.note_filled(run.addr + zeroed, &ZEROS[..n as usize])?;
                    zeroed += n;
                }
            }
            Ok(())
        };
        match fill(&mut runs) {
            Ok(()) => {
                self.volume.fence();
                Ok(runs)
            }
            Err(e) => self.free_runs(&runs).and(Err(e)),
        }
    }

    pub(crate) fn truncate_locked(&self, slot: &Slot, inode: &Inode, size: u64) -> Result<bool> {
        let fs = self;
        {
            let old = inode.size.load(Ordering::Acquire);
            // Shrinking into the middle of a block: the block's kept bytes go to a fresh page,
            // mapped by the same record, so the old block is never changed in place.
            let mut tail = 0u64;
            let mapped = inode.mapped.load(Ordering::Acquire) > 0;
            let block_in_place = (size < old && !size.is_multiple_of(BLOCK) && mapped)
                .then(|| inode.extents.read().expect("extent map").get(size / BLOCK))
                .flatten();
            if let Some(addr) = block_in_place {
                // A mapped file's block stays where the mappings point: the cut-off bytes
                // are zeroed in it, before the record (a crash in between leaves the old
                // size with those bytes zero — mapped files are not atomic).
                let within = size % BLOCK;
                let (region, at) = fs.region_at(addr)?;
                region.write_nt(at + within, &ZEROS[..(BLOCK - within) as usize])?;
                fs.volume.fence();
            } else if size < old && !size.is_multiple_of(BLOCK) && kept_bytes_in_block(inode, size)
            {
                let block = size / BLOCK;
                let mut bytes = vec![0u8; BLOCK as usize];
                fs.read_into(inode, block * BLOCK, &mut bytes[..(size % BLOCK) as usize])?;
                // A caller's allocation: it leaves the checkpoint its reserve — unless the
                // volume is full and the file has the block this page replaces, which the
                // same record frees: the page is then lent by the reserve for the moment
                // until the record is durable (one at a time: truncations hold the batch
                // lock). A shrinking truncate must work on a full volume: freeing room
                // starts with one (sqlite cuts its `-shm` file to 3 bytes as it opens a
                // database, and could not open one to delete from it).
                let extent = match fs.alloc_buffer(BLOCK) {
                    Err(e) if e.kind() == crate::ErrorKind::NoSpace && has_block(inode, block) => {
                        fs.alloc_local(BLOCK)?
                    }
                    other => other?,
                };
                let (region, offset) = fs.region_at(extent.start.raw())?;
                region.write_nt(offset, &bytes)?;
                fs.note_filled(extent.start.raw(), &bytes)?;
                fs.volume.fence();
                slot.counters.count_media(BLOCK);
                tail = extent.start.raw();
            }
            let time = now_ns();
            let op = MetaOp::Truncate {
                ino: inode.ino,
                size,
                time,
                tail,
            };
            if !fs.journal(slot, &op)? {
                if tail != 0 {
                    fs.free_runs(&[Run {
                        file_block: 0,
                        blocks: 1,
                        addr: tail,
                    }])?;
                }
                return Ok(false);
            }
            if size < old {
                fs.cuts.note(
                    inode.ino,
                    size / BLOCK,
                    u64::MAX,
                    fs.progress.current_order(),
                );
            }
            let freed = applied(apply::truncate(
                inode,
                &mut inode.extents.write().expect("extent map"),
                size,
                tail,
                time,
            ));
            fs.free_runs(&freed)?;
            if tail != 0 {
                fs.grow_snapshot(RUN_BYTES);
            }
            Ok(true)
        }
    }

    /// `chmod`: the permission bits, and the access ACL's owner, group-class and other
    /// entries with them when the inode has one (one record either way).
    pub(crate) fn set_mode(self: &Arc<Self>, path: &str, mode: u32) -> Result<()> {
        let inode = self.resolve_follow(path)?;
        self.set_mode_of(&inode, mode)
    }

    /// [`Inner::set_mode`] of `inode`.
    pub(crate) fn set_mode_of(self: &Arc<Self>, inode: &Arc<Inode>, mode: u32) -> Result<()> {
        self.metadata(|fs, slot| {
            let mut attr = inode.attr();
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            let Some(bytes) = xattrs.get(acl::ACCESS) else {
                drop(xattrs);
                return Ok(fs.journal_mode(slot, inode, &mut attr, mode)?.then_some(()));
            };
            let mut acl = Acl::decode(acl::ACCESS, bytes)?;
            acl.chmod(mode);
            let value = acl.encode();
            Ok(fs
                .journal_acl(slot, inode, &mut attr, &mut xattrs, mode, &value)?
                .then_some(()))
        })
    }

    /// Journals and applies `inode`'s mode with its access ACL (`value`; empty: none),
    /// the caller holding its attributes (`attr`, then `xattrs`); `false` when the journal
    /// is full (nothing changed: wait for the snapshot, retry).
    fn journal_acl(
        &self,
        slot: &Slot,
        inode: &Inode,
        attr: &mut Attr,
        xattrs: &mut xattr::Xattrs,
        mode: u32,
        value: &[u8],
    ) -> Result<bool> {
        let time = now_ns();
        let op = MetaOp::SetAcl {
            ino: inode.ino,
            mode,
            value: value.into(),
            time,
        };
        if !self.journal(slot, &op)? {
            return Ok(false);
        }
        let before = xattrs
            .get(acl::ACCESS)
            .map_or(0, |v| xattr::entry_bytes(acl::ACCESS, v));
        apply::set_acl(inode, attr, xattrs, mode, value, time);
        let after = if value.is_empty() {
            0
        } else {
            xattr::entry_bytes(acl::ACCESS, value)
        };
        self.grow_snapshot(after.saturating_sub(before) as u64);
        Ok(true)
    }

    /// Journals and applies `mode` for `inode`, whose attributes the caller holds;
    /// `false` when the journal is full (nothing changed: wait for the snapshot, retry).
    fn journal_mode(&self, slot: &Slot, inode: &Inode, attr: &mut Attr, mode: u32) -> Result<bool> {
        let time = now_ns();
        let op = MetaOp::SetMode {
            ino: inode.ino,
            mode,
            time,
        };
        if !self.journal(slot, &op)? {
            return Ok(false);
        }
        apply::set_mode(inode, attr, mode, time);
        Ok(true)
    }

    /// Sets `inode`'s owning user and group (`None`: unchanged). A change of owner of
    /// anything but a directory clears the set-user-ID bit, and the set-group-ID bit when
    /// group execution is on, in the same record — even when neither id changes, as
    /// `chown(2)` does on Linux. Who may change what is the caller's check (the kernel's,
    /// through `locus mount`).
    pub(crate) fn set_owner(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<()> {
        self.metadata(|fs, slot| {
            let mut attr = inode.attr();
            let owner = Owner {
                uid: uid.unwrap_or(attr.uid),
                gid: gid.unwrap_or(attr.gid),
            };
            let mode = match inode.kind {
                Kind::Dir => attr.mode,
                _ => dropped(attr.mode),
            };
            let time = now_ns();
            let op = MetaOp::SetOwner {
                ino: inode.ino,
                uid: owner.uid,
                gid: owner.gid,
                mode,
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            apply::set_owner(inode, &mut attr, owner, mode, time);
            Ok(Some(()))
        })
    }

    /// Sets extended attribute `name` of `inode` to `value`, as `how` allows; with
    /// `clear_sgid`, an access ACL set also clears the set-group-ID bit.
    pub(crate) fn set_xattr(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        name: &str,
        value: &[u8],
        how: XattrSet,
        clear_sgid: bool,
    ) -> Result<()> {
        xattr::check_name(name)?;
        xattr::check_value(name, value)?;
        if acl::is_acl(name) {
            let acl = Acl::decode(name, value)?;
            if name == acl::ACCESS {
                return self.set_access_acl(inode, &acl, value, how, clear_sgid);
            }
            if inode.kind != Kind::Dir {
                return Err(FsError::NotPermitted(format!(
                    "{name}: only a directory has a default ACL"
                )));
            }
        }
        self.metadata(|fs, slot| {
            // Under the inode's attributes lock, so two setters journal and apply in one order.
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            xattr::check_set(&xattrs, name, value, how)?;
            let time = now_ns();
            let op = MetaOp::SetXattr {
                ino: inode.ino,
                name: name.to_owned(),
                value: value.into(),
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let before = xattrs.get(name).map_or(0, |v| xattr::entry_bytes(name, v));
            apply::set_xattr(inode, &mut xattrs, name, value, time);
            fs.grow_snapshot(xattr::entry_bytes(name, value).saturating_sub(before) as u64);
            Ok(Some(()))
        })
    }

    /// `setfacl` of the access ACL: the mode takes its owner, group-class and other
    /// entries, and an ACL that says no more than that mode is kept as the mode alone.
    fn set_access_acl(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        acl: &Acl,
        value: &[u8],
        how: XattrSet,
        clear_sgid: bool,
    ) -> Result<()> {
        self.metadata(|fs, slot| {
            let mut attr = inode.attr();
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            xattr::check_set(&xattrs, acl::ACCESS, value, how)?;
            let (mut mode, plain) = acl.mode(attr.mode);
            if clear_sgid {
                mode &= !libc::S_ISGID;
            }
            let value = if plain { &[][..] } else { value };
            Ok(fs
                .journal_acl(slot, inode, &mut attr, &mut xattrs, mode, value)?
                .then_some(()))
        })
    }

    /// Removes extended attribute `name` of `inode` (`NoData` when it has none — but an ACL
    /// it does not have is removed already, as the kernel's file systems answer).
    pub(crate) fn remove_xattr(self: &Arc<Self>, inode: &Arc<Inode>, name: &str) -> Result<()> {
        xattr::check_name(name)?;
        self.metadata(|fs, slot| {
            let mut xattrs = inode.xattrs.lock().expect("extended attributes");
            if !xattrs.contains_key(name) {
                if acl::is_acl(name) {
                    return Ok(Some(()));
                }
                return Err(FsError::NoData(format!("extended attribute {name}")));
            }
            let time = now_ns();
            let op = MetaOp::RemoveXattr {
                ino: inode.ino,
                name: name.to_owned(),
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            applied(apply::remove_xattr(inode, &mut xattrs, name, time));
            Ok(Some(()))
        })
    }

    /// Clears `inode`'s set-user-ID bit, and its set-group-ID bit when group execution is
    /// on (without it, the bit is mandatory locking's mark and stays), as the kernel's file
    /// systems do when a process without `CAP_FSETID` writes or truncates a file. One
    /// journal record when a bit was set, none otherwise; `true` when the mode changed.
    pub(crate) fn drop_privileges(self: &Arc<Self>, inode: &Arc<Inode>) -> Result<bool> {
        {
            let attr = inode.attr();
            if dropped(attr.mode) == attr.mode {
                return Ok(false);
            }
        }
        self.metadata(|fs, slot| {
            let mut attr = inode.attr();
            let mode = dropped(attr.mode);
            if mode == attr.mode {
                return Ok(Some(false)); // another writer got there first
            }
            Ok(fs
                .journal_mode(slot, inode, &mut attr, mode)?
                .then_some(true))
        })
    }

    /// Sets `inode`'s access and modification times (`None`: unchanged); the change time
    /// becomes now. Times are ns since the epoch, and at least 1 (0 means "unchanged" in
    /// the record).
    pub(crate) fn set_times(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        atime: Option<u64>,
        mtime: Option<u64>,
    ) -> Result<()> {
        if atime.is_none() && mtime.is_none() {
            return Ok(()); // both `UTIME_OMIT`: nothing changes, not even the change time
        }
        self.metadata(|fs, slot| {
            // Under the attribute lock, so two setters journal and apply in one order.
            let attr = inode.attr();
            let op = MetaOp::SetTimes {
                ino: inode.ino,
                atime: atime.map_or(0, |t| t.max(1)),
                mtime: mtime.map_or(0, |t| t.max(1)),
                ctime: now_ns(),
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let MetaOp::SetTimes {
                atime,
                mtime,
                ctime,
                ..
            } = op
            else {
                unreachable!("built above")
            };
            apply::set_times(inode, atime, mtime, ctime);
            drop(attr);
            Ok(Some(()))
        })
    }

    pub(crate) fn stat_of(&self, inode: &Inode) -> Stat {
        inode.times_looked_at();
        let attr = inode.attr().clone();
        let (uid, gid) = attr.owner();
        // A removed inode still open (or a removed directory still someone's working
        // directory) has no name left: `fstat` reports no links, as on kernel file systems.
        let links = |n: u64| if attr.unlinked { 0 } else { n };
        let (size, nlink) = match inode.kind {
            Kind::Dir => {
                let entries = inode.entries();
                let subdirs = inode.subdirs.load(Ordering::Relaxed);
                (entries.len() as u64, links(2 + subdirs))
            }
            _ => (inode.size.load(Ordering::Acquire), links(attr.links)),
        };
        // The blocks the file has and those its logged writes will add (a write into a hole
        // takes a block at the checkpoint), as kernel file systems count blocks written and
        // not yet placed: a freshly written file never shows no blocks (which archivers read
        // as a file of holes). The checkpoint moves pieces into the map under its write
        // lock, so no block is missed or counted twice while one moves.
        let allocated = {
            let extents = inode.extents.read().expect("extent map");
            let pending = inode
                .overlay
                .unmapped_blocks(BLOCK, |from, to| extents.mapped_in(from, to));
            (extents.mapped_blocks() + pending) * BLOCK
        };
        Stat {
            ino: inode.ino,
            kind: inode.kind,
            mode: attr.mode,
            size,
            allocated,
            mtime_ns: inode.mtime.load(Ordering::Acquire),
            atime_ns: inode.atime.load(Ordering::Acquire),
            ctime_ns: inode.ctime.load(Ordering::Acquire),
            nlink,
            rdev: inode.rdev,
            uid,
            gid,
        }
    }
}

/// True when the block a truncation to `size` cuts into has data before `size` — in the
/// file's blocks or logged — which its tail page must keep; a hole there stays a hole. The
/// caller holds the whole file's range lock (no write or checkpoint moves data meanwhile).
fn kept_bytes_in_block(inode: &Inode, size: u64) -> bool {
    let block = size / BLOCK;
    has_block(inode, block) || !inode.overlay.lookup(block * BLOCK, size).is_empty()
}

/// True when the file's block table maps block `block`.
fn has_block(inode: &Inode, block: u64) -> bool {
    inode
        .extents
        .read()
        .expect("extent map")
        .get(block)
        .is_some()
}

/// Two directories' entries, locked in inode order (once when they are one directory).
struct TwoDirs<'a> {
    first: u64,
    first_entries: Ordered<MutexGuard<'a, Entries>>,
    second_entries: Option<Ordered<MutexGuard<'a, Entries>>>,
}

impl<'a> TwoDirs<'a> {
    fn lock(a: &'a Inode, b: &'a Inode) -> Self {
        let (first, second) = if a.ino <= b.ino { (a, b) } else { (b, a) };
        let first_entries = first.entries();
        let second_entries = (first.ino != second.ino).then(|| second.entries());
        Self {
            first: first.ino,
            first_entries,
            second_entries,
        }
    }

    /// The entries of directory `ino` (one of the two).
    fn of(&mut self, ino: u64) -> &mut Entries {
        match &mut self.second_entries {
            Some(second) if ino != self.first => second,
            _ => &mut self.first_entries,
        }
    }

    /// Both, `from`'s first, as a rename or an exchange from `from` takes them.
    fn dirs(&mut self, from: u64) -> RenameDirs<'_> {
        let Self {
            first,
            first_entries,
            second_entries,
        } = self;
        let Some(second) = second_entries else {
            return RenameDirs::Same(first_entries);
        };
        if from == *first {
            RenameDirs::Two(first_entries, second)
        } else {
            RenameDirs::Two(second, first_entries)
        }
    }
}

/// `mode` without the set-user-ID bit, and without the set-group-ID bit when group
/// execution is on (without it, the bit is mandatory locking's mark and stays).
fn dropped(mode: u32) -> u32 {
    let group_exec = mode & libc::S_IXGRP != 0;
    mode & !(libc::S_ISUID | if group_exec { libc::S_ISGID } else { 0 })
}

/// What a new inode takes from its directory's default ACL: the access ACL (when the
/// inherited one says more than a mode), the mode it ends with, and — a directory — the
/// default ACL itself.
struct Inherited {
    access: Option<Acl>,
    full: u32,
    dir_default: Option<Box<[u8]>>,
}

/// The mode a `kind` asked with `mode` is created with in `parent` (whose default ACL, when
/// `masking` heeds them, decides instead of the umask), and what it inherits, if anything.
/// With an access ACL to come, the mode first gives the owning group only what the ACL
/// gives it (see [`Inner::create`]).
fn creation_mode(
    parent: &Inode,
    kind: Kind,
    mode: u32,
    masking: Masking,
) -> Result<(u32, Option<Inherited>)> {
    let default = (masking.default_acls && kind != Kind::Symlink)
        .then(|| {
            let xattrs = parent.xattrs.lock().expect("extended attributes");
            xattrs.get(acl::DEFAULT).cloned()
        })
        .flatten();
    let Some(bytes) = default else {
        return Ok((mode & !masking.umask, None));
    };
    let default_acl = Acl::decode(acl::DEFAULT, &bytes)?;
    let (access, full) = default_acl.inherit(mode);
    let first = match access {
        Some(_) => default_acl.owning_group_only(full),
        None => full,
    };
    let dir_default = (kind == Kind::Dir).then_some(bytes);
    Ok((
        first,
        Some(Inherited {
            access,
            full,
            dir_default,
        }),
    ))
}

/// The owner and mode of a `kind` made by `owner` with `mode` in the directory whose
/// attributes are `parent`: a set-group-ID directory gives its group, and its bit to a
/// new directory.
fn inherited(parent: &Attr, kind: Kind, owner: Owner, mode: u32) -> (Owner, u32) {
    if parent.mode & libc::S_ISGID == 0 {
        return (owner, mode);
    }
    let mode = if kind == Kind::Dir {
        mode | libc::S_ISGID
    } else {
        mode
    };
    let owner = Owner {
        gid: parent.gid,
        ..owner
    };
    (owner, mode)
}

/// `name` (of `path`) can be made in `parent`, whose entries the caller holds: the directory
/// still has a name itself, and holds nothing by that name.
fn name_is_free(parent: &Inode, entries: &Entries, name: &str, path: &str) -> Result<()> {
    if parent.attr().unlinked {
        return Err(FsError::NotFound(path.to_owned()));
    }
    if entries.contains_key(name) {
        return Err(FsError::Exists(path.to_owned()));
    }
    Ok(())
}

/// Bytes of a file one step of [`Inner::allocate`] covers.
const ALLOCATE_PIECE: u64 = 256 << 20;

/// The holes of `extents` among blocks `[from, to)`, as (first block, blocks).
pub(crate) fn holes(extents: &crate::extent_map::ExtentMap, from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut holes = Vec::new();
    let mut at = from;
    for run in extents.lookup(from, to) {
        if run.file_block > at {
            holes.push((at, run.file_block - at));
        }
        at = run.file_block + run.blocks;
    }
    if at < to {
        holes.push((at, to - at));
    }
    holes
}
