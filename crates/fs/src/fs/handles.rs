//! The public handles: `Fs` (and the `Unmounter` its last clone drops), `File`, `Buffer`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pmem::Region;
use smallvec::SmallVec;
use volume::{Extent, Volume};

use super::lend;
use super::options::{FsOptions, OpenOptions};
use super::state::{FsStats, Inner, Recovered};
use super::write::check_io;
use super::{MAX_FILE_SIZE, MAX_IO};
use crate::defrag::Defragmenter;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::inode::{DirEntry, Inode, Owner, Stat};
use crate::journal::Kind;
use crate::pieces::{Piece, alloc_halving};
use crate::range_lock::LockMode;
use crate::xattr::XattrSet;

fn get_xattr(inode: &Inode, name: &str) -> Result<Vec<u8>> {
    crate::xattr::check_name(name)?;
    inode
        .xattrs
        .lock()
        .expect("extended attributes")
        .get(name)
        .map(|v| v.to_vec())
        .ok_or_else(|| FsError::NoData(format!("extended attribute {name}")))
}

fn list_xattrs(inode: &Inode) -> Vec<String> {
    let xattrs = inode.xattrs.lock().expect("extended attributes");
    xattrs.keys().cloned().collect()
}

/// Stops the checkpoint and writes the final snapshot when the last handle goes.
#[derive(Debug)]
pub(crate) struct Unmounter {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
    defrag: Mutex<Option<Defragmenter>>,
}

impl Unmounter {
    /// Stops the checkpoint thread after it has moved everything and written a final
    /// snapshot (`abandon`: at once, leaving the logs as a crash would).
    fn stop(&self, abandon: bool) -> Result<()> {
        // Its writes come first: the checkpoint then moves them with the rest.
        if let Some(mut defrag) = self.defrag.lock().expect("defrag thread").take() {
            defrag.stop();
        }
        let Some(handle) = self.thread.lock().expect("checkpoint thread").take() else {
            return Ok(());
        };
        self.inner.progress.request_stop(abandon);
        if handle.join().is_err() {
            return Err(FsError::Shutdown("the checkpoint thread panicked".into()));
        }
        match self.inner.progress.failure() {
            Some(why) => Err(FsError::Shutdown(why)),
            None => Ok(()),
        }
    }
}

impl Drop for Unmounter {
    fn drop(&mut self) {
        if let Err(e) = self.stop(false) {
            tracing::error!(error = %e, "unmount failed; recovery will replay the logs at next open");
        }
    }
}

/// An open file system. Cheap to clone; the last clone (with every [`File`]) unmounts it:
/// everything is checkpointed and a final snapshot is written.
///
/// A handle creates files, directories and links as its [`Owner`]: the opening process's
/// effective ids, or another's through [`Fs::as_owner`] (a server acting for its callers).
#[derive(Debug, Clone)]
pub struct Fs {
    pub(crate) inner: Arc<Inner>,
    pub(crate) mount: Arc<Unmounter>,
    owner: Owner,
    masking: Masking,
}

/// How what a handle makes takes its mode: the umask taken from it, and whether a
/// directory's default ACL replaces the umask there (and is inherited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Masking {
    pub(crate) umask: u32,
    pub(crate) default_acls: bool,
}

impl Masking {
    /// The mode as given, no ACL inherited: symbolic links (whose mode is fixed).
    pub(crate) const NONE: Masking = Masking {
        umask: 0,
        default_acls: false,
    };
}

impl Fs {
    /// Runs the file system recovery found, with the checkpoint thread `spawn` starts.
    pub(crate) fn start(
        recovered: Recovered,
        options: FsOptions,
        spawn: impl FnOnce(Arc<Inner>) -> Result<JoinHandle<()>>,
    ) -> Result<Fs> {
        let inner = Inner::assemble(recovered, options);
        // What recovery found whole is confirmed at once: a bit flipped later in the data
        // of a log's newest write is then damage (which data checksums report), not taken
        // for a write a crash cut short.
        inner.confirm_logs()?;
        let thread = spawn(Arc::clone(&inner))?;
        let mount = Arc::new(Unmounter {
            inner: Arc::clone(&inner),
            thread: Mutex::new(Some(thread)),
            defrag: Mutex::new(None),
        });
        // Started after the unmounter exists, so that a failure here still stops the
        // checkpoint.
        *mount.defrag.lock().expect("defrag thread") = Defragmenter::start(&inner)?;
        Ok(Fs {
            mount,
            inner,
            owner: Owner::of_process(),
            masking: Masking {
                umask: 0,
                default_acls: true,
            },
        })
    }

    /// A handle on the same file system that creates as `owner` (the user and group whose
    /// request a server is serving). A set-group-ID directory still gives its own group.
    pub fn as_owner(&self, owner: Owner) -> Fs {
        Fs {
            owner,
            ..self.clone()
        }
    }

    /// A handle on the same file system that takes `umask` from the mode of what it makes
    /// — except in a directory with a default ACL, where the ACL decides (the umask the
    /// kernel passes with each create; a handle's default is 0, the mode as given).
    pub fn with_umask(&self, umask: u32) -> Fs {
        Fs {
            masking: Masking {
                umask: umask & 0o777,
                ..self.masking
            },
            ..self.clone()
        }
    }

    /// A handle whose creates ignore directories' default ACLs (the umask applies
    /// everywhere and nothing is inherited): a mount without ACLs, as a kernel file system
    /// mounted `noacl` does. The ACLs stay on the volume.
    pub fn without_default_acls(&self) -> Fs {
        Fs {
            masking: Masking {
                default_acls: false,
                ..self.masking
            },
            ..self.clone()
        }
    }

    /// The owner this handle creates as.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// Opens `path`. See [`OpenOptions`]. A symbolic link at `path` is reported
    /// ([`FsError::Symlink`]) for the caller to follow — except by an exclusive create,
    /// which fails on any existing name.
    pub fn open_file(&self, path: &str, options: OpenOptions) -> Result<File> {
        let exclusive = options.create && options.exclusive;
        let found = if exclusive {
            self.inner.resolve(path)
        } else {
            self.inner.resolve_follow(path)
        };
        let inode = match found {
            Ok(_) if exclusive => return Err(FsError::Exists(path.to_owned())),
            Ok(inode) => inode,
            Err(FsError::NotFound(_)) if options.create => {
                match self.inner.create(
                    path,
                    Kind::File,
                    options.mode,
                    self.masking,
                    "",
                    0,
                    self.owner,
                ) {
                    Ok(inode) => inode,
                    // Lost a race with another creator: open theirs.
                    Err(FsError::Exists(_)) if !options.exclusive => {
                        self.inner.resolve_follow(path)?
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if inode.kind == Kind::Dir && options.write {
            return Err(FsError::IsDir(path.to_owned()));
        }
        if inode.kind.is_special() {
            return Err(FsError::NotSupported(format!(
                "{path} is a {:?}, which only the kernel can open (through `locus mount`)",
                inode.kind
            )));
        }
        let file = self.opened(inode, &options);
        if options.truncate {
            if !options.write {
                return Err(FsError::BadHandle(format!(
                    "{path}: truncate needs write access"
                )));
            }
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Opens the regular file whose inode number is `ino`, whatever its names are now:
    /// renamed since it was looked up, or left with no name while this process holds it
    /// open. Inode numbers are never reused, so a number names one file for the volume's
    /// life (the preload library reopens by number the files another process may have
    /// renamed while its own were suspended). `NotFound` when no such file lives; only
    /// `read` and `write` of `options` apply — nothing is created or truncated.
    pub fn open_ino(&self, ino: u64, options: OpenOptions) -> Result<File> {
        let gone = || FsError::NotFound(format!("inode {ino}"));
        let inode = self.inner.inode(ino).ok_or_else(gone)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir(format!("inode {ino}"))),
            kind => {
                return Err(FsError::NotSupported(format!(
                    "inode {ino} is a {kind:?}, not a regular file"
                )));
            }
        }
        let file = self.opened(inode, &options);
        // Destroyed between the look-up and the count: never hand out a freed file.
        if file.inode.dead.load(Ordering::Acquire) {
            return Err(gone());
        }
        Ok(file)
    }

    /// The path the directory whose inode number is `ino` has now (a directory has one name:
    /// its parent's entry), found by walking up its parents — what reopening a directory
    /// another process may have renamed needs. `NotFound` when no such directory lives,
    /// `NotDir` when `ino` is not one.
    pub fn dir_path(&self, ino: u64) -> Result<String> {
        let gone = || FsError::NotFound(format!("directory inode {ino}"));
        let mut at = self.inner.inode(ino).ok_or_else(gone)?;
        if at.kind != Kind::Dir {
            return Err(FsError::NotDir(format!("inode {ino}")));
        }
        let mut names = Vec::new();
        while at.ino != super::ROOT_INO {
            // Its own statement: the attributes' guard is let go before the table is taken.
            let parent_ino = at.attr().parent;
            let parent = self.inner.inode(parent_ino).ok_or_else(gone)?;
            let name = parent
                .entries()
                .iter()
                .find(|&(_, &child)| child == at.ino)
                .map(|(name, _)| name.clone())
                .ok_or_else(gone)?;
            names.push(name);
            // Deeper than any path can be: a cycle, which a live tree never has.
            if names.len() > crate::path::MAX_PATH {
                return Err(gone());
            }
            at = parent;
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }

    /// A handle of `inode`, counted open.
    fn opened(&self, inode: Arc<Inode>, options: &OpenOptions) -> File {
        inode.opens.fetch_add(1, Ordering::AcqRel);
        File {
            fs: self.clone(),
            inode,
            read: options.read,
            write: options.write,
        }
    }

    /// Opens an existing file for reading.
    pub fn open_read(&self, path: &str) -> Result<File> {
        self.open_file(path, OpenOptions::default())
    }

    /// Creates (or opens and keeps) a file for reading and writing.
    pub fn create(&self, path: &str) -> Result<File> {
        self.open_file(path, OpenOptions::create())
    }

    /// Makes a directory.
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.inner
            .create(path, Kind::Dir, mode, self.masking, "", 0, self.owner)
            .map(drop)
    }

    /// Makes every missing directory above `path` (mode 0o755), as `mkdir -p` of its parent
    /// would; on failure, the directory that could not be made and why.
    pub fn create_parents(&self, path: &str) -> std::result::Result<(), (String, FsError)> {
        let parent = std::path::Path::new(path)
            .parent()
            .unwrap_or(std::path::Path::new("/"));
        let mut at = String::new();
        for part in parent.components().skip(1) {
            at.push('/');
            at.push_str(&part.as_os_str().to_string_lossy());
            match self.mkdir(&at, 0o755) {
                Ok(()) | Err(FsError::Exists(_)) => {}
                Err(e) => return Err((at, e)),
            }
        }
        Ok(())
    }

    /// Makes `path` a symbolic link to `target` (1..=4095 bytes, any path: the file system
    /// stores it and never follows it itself).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        self.inner
            .create(
                path,
                Kind::Symlink,
                0o777,
                Masking::NONE,
                target,
                0,
                self.owner,
            )
            .map(drop)
    }

    /// Makes a FIFO, a socket's name or a device node (`kind`) at `path`, with permission
    /// bits `mode` and, for a device, device number `rdev` (else 0): a name and attributes
    /// only — the kernel serves them through `locus mount`; [`Fs::open_file`] refuses them.
    pub fn mknod(&self, path: &str, kind: Kind, mode: u32, rdev: u64) -> Result<()> {
        if !kind.is_special() {
            return Err(FsError::Invalid(format!(
                "{path}: mknod makes FIFOs, sockets and device nodes, not a {kind:?}"
            )));
        }
        if !kind.is_device() && rdev != 0 {
            return Err(FsError::Invalid(format!(
                "{path}: a {kind:?} has no device number ({rdev} given)"
            )));
        }
        self.inner
            .create(path, kind, mode, self.masking, "", rdev, self.owner)
            .map(drop)
    }

    /// The first symbolic link a walk of `path` meets — before its last name, or at it too
    /// when `follow_last` — as (the path through the link, its target); `None` when there is
    /// none, or the walk fails otherwise (the operation that follows reports that). Free when
    /// the file system has never held a link since it was opened.
    pub fn first_link(&self, path: &str, follow_last: bool) -> Option<(String, String)> {
        if !self.inner.symlinks.load(Ordering::Acquire) {
            return None;
        }
        let found = if follow_last {
            self.inner.resolve_follow(path)
        } else {
            self.inner.resolve_parent(path).map(|(dir, _)| dir)
        };
        match found {
            Err(FsError::Symlink { link, target }) => Some((link, target)),
            _ => None,
        }
    }

    /// The target of the symbolic link at `path`.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let inode = self.inner.resolve(path)?;
        if inode.kind != Kind::Symlink {
            return Err(FsError::Invalid(format!("{path} is not a symbolic link")));
        }
        Ok(inode.target.to_string())
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        self.inner.remove(path, true)
    }

    /// Removes a file's name; its blocks are freed once it has no name left and its last
    /// handle closes.
    pub fn unlink(&self, path: &str) -> Result<()> {
        self.inner.remove(path, false)
    }

    /// Gives the file or symbolic link at `existing` (a link there is not followed) the
    /// further name `new`: a hard link, one journal record. `NotPermitted` for a directory,
    /// `Exists` when `new` names something.
    pub fn link(&self, existing: &str, new: &str) -> Result<()> {
        self.inner.link(existing, new)
    }

    /// A new file with no name in directory `dir` (`open(dir, O_TMPFILE)`), opened for
    /// writing (and reading with `read`): it takes its owner, mode (`mode`, with this
    /// handle's umask or the directory's default ACL) and ACL as a file created in `dir`
    /// would, and only its handles reach it. [`File::link`] gives it a name; without one it
    /// is gone at its last close, or after a crash. With `exclusive` (`O_TMPFILE |
    /// O_EXCL`) it can never be named: `File::link` answers `NotFound`.
    pub fn create_unnamed(
        &self,
        dir: &str,
        mode: u32,
        read: bool,
        exclusive: bool,
    ) -> Result<File> {
        let inode = self
            .inner
            .create_unnamed(dir, mode, exclusive, self.masking, self.owner)?;
        // Opened by `create_unnamed` already.
        Ok(File {
            fs: self.clone(),
            inode,
            read,
            write: true,
        })
    }

    /// Moves `from` to `to` atomically, replacing a file there (or an empty directory, when
    /// moving a directory).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(from, to)
    }

    /// Swaps what `a` and `b` name, atomically (`renameat2(RENAME_EXCHANGE)`): both must
    /// exist (`NotFound`), of any kinds — a file and a directory may trade places — but a
    /// directory may not end up inside itself (`Invalid`). One journal record.
    pub fn exchange(&self, a: &str, b: &str) -> Result<()> {
        self.inner.exchange(a, b)
    }

    /// Sets the size of the file at `path`.
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let inode = self.inner.resolve_follow(path)?;
        if inode.kind == Kind::Dir {
            return Err(FsError::IsDir(path.to_owned()));
        }
        if inode.kind != Kind::File {
            return Err(FsError::Invalid(format!(
                "{path} is a {:?}, which has no size to set",
                inode.kind
            )));
        }
        self.inner.set_len(&inode, size)
    }

    /// Changes permission bits.
    pub fn chmod(&self, path: &str, mode: u32) -> Result<()> {
        self.inner.set_mode(path, mode)
    }

    /// [`File::drop_privileges`] of what `path` names (a symbolic link there is itself the
    /// target, and has no set-ID bits: `lchown` of a link asks too).
    pub fn drop_privileges(&self, path: &str) -> Result<bool> {
        let inode = self.inner.resolve(path)?;
        self.inner.drop_privileges(&inode)
    }

    /// Attributes of what `path` leads to (a symbolic link there is reported).
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let inode = self.inner.resolve_follow(path)?;
        Ok(self.inner.stat_of(&inode))
    }

    /// Attributes of `path` itself: a symbolic link's own.
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        let inode = self.inner.resolve(path)?;
        Ok(self.inner.stat_of(&inode))
    }

    /// Sets the access and modification times (ns since the epoch; `None` leaves one as it
    /// is) of what `path` leads to, or with `follow` false of `path` itself; the change time
    /// becomes now. Journaled like every metadata change.
    pub fn set_times(
        &self,
        path: &str,
        atime: Option<u64>,
        mtime: Option<u64>,
        follow: bool,
    ) -> Result<()> {
        let inode = self.node(path, follow)?;
        self.inner.set_times(&inode, atime, mtime)
    }

    /// Sets the owning user and group (`None`: unchanged) of what `path` leads to, or with
    /// `follow` false of `path` itself (`lchown`). Anything but a directory loses its
    /// set-user-ID bit, and its set-group-ID bit when group execution is on, as `chown(2)`
    /// does on Linux. The file system keeps owners and does not check who asks: that is the
    /// caller's part (the kernel's permission check through `locus mount`).
    pub fn set_owner(
        &self,
        path: &str,
        uid: Option<u32>,
        gid: Option<u32>,
        follow: bool,
    ) -> Result<()> {
        let inode = self.node(path, follow)?;
        self.inner.set_owner(&inode, uid, gid)
    }

    /// The inode `path` leads to (`follow`) or names itself.
    fn node(&self, path: &str, follow: bool) -> Result<Arc<Inode>> {
        if follow {
            self.inner.resolve_follow(path)
        } else {
            self.inner.resolve(path)
        }
    }

    /// Sets extended attribute `name` (a `user.`, `trusted.` or `security.` name, or a POSIX
    /// ACL, [`crate::ACL_ACCESS`] or [`crate::ACL_DEFAULT`], kept in step with the mode; see
    /// [`crate::MAX_XATTR_VALUE`] and [`crate::MAX_XATTR_BYTES`] for the limits) of what
    /// `path` leads to, or with `follow` false of `path` itself, to `value`, as `how`
    /// allows. Journaled; the change time becomes now. Who may is the caller's check.
    pub fn set_xattr(
        &self,
        path: &str,
        name: &str,
        value: &[u8],
        how: XattrSet,
        follow: bool,
    ) -> Result<()> {
        let inode = self.node(path, follow)?;
        self.inner.set_xattr(&inode, name, value, how, false)
    }

    /// [`Fs::set_xattr`], and when it sets the access ACL ([`crate::ACL_ACCESS`]) the
    /// set-group-ID bit goes in the same record — what the kernel asks when the caller is
    /// neither in the file's group nor holds `CAP_FSETID` (as `chmod` would clear it).
    pub fn set_xattr_clearing_sgid(
        &self,
        path: &str,
        name: &str,
        value: &[u8],
        how: XattrSet,
        follow: bool,
    ) -> Result<()> {
        let inode = self.node(path, follow)?;
        self.inner.set_xattr(&inode, name, value, how, true)
    }

    /// The value of extended attribute `name` (`NoData` when there is none).
    pub fn get_xattr(&self, path: &str, name: &str, follow: bool) -> Result<Vec<u8>> {
        let inode = self.node(path, follow)?;
        get_xattr(&inode, name)
    }

    /// The names of the extended attributes, sorted.
    pub fn list_xattrs(&self, path: &str, follow: bool) -> Result<Vec<String>> {
        let inode = self.node(path, follow)?;
        Ok(list_xattrs(&inode))
    }

    /// Removes extended attribute `name` (`NoData` when there is none).
    pub fn remove_xattr(&self, path: &str, name: &str, follow: bool) -> Result<()> {
        let inode = self.node(path, follow)?;
        self.inner.remove_xattr(&inode, name)
    }

    /// The entries of a directory, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.inner.resolve_follow(path)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir(path.to_owned()));
        }
        let entries = dir.entries().clone();
        Ok(entries
            .into_iter()
            .filter_map(|(name, ino)| {
                let kind = self.inner.inode(ino)?.kind;
                Some(DirEntry { name, ino, kind })
            })
            .collect())
    }

    /// Claims the calling thread's slot now — its log area and journal made if the slot is
    /// new; when every slot a thread may own is taken, a shared slot's, on which the
    /// thread will take turns — instead of at the thread's first change. A server thread
    /// that calls this as it starts never makes them later, when the volume may be full:
    /// there they come out of the checkpoint's reserve, which writers then wait to see
    /// repaid (a `locus mount` whose other queue thread served its first write on a full
    /// volume showed no room after a removal freed some).
    pub fn claim_thread_slot(&self) -> Result<()> {
        self.inner.slot().map(drop)
    }

    /// A persistent buffer of `len` bytes on the calling thread's node, to fill and commit
    /// with [`File::write_buffer`] without a copy. One of a block or less is a page a
    /// committed overwrite replaced, when there is one (as for `File::write_at`'s
    /// single-block writes; see [`Inner::alloc_lent_buffer`]).
    pub fn buffer(&self, len: u64) -> Result<Buffer> {
        if len == 0 || len > MAX_IO {
            return Err(FsError::Invalid(format!(
                "buffer of {len} bytes; 1..={MAX_IO}"
            )));
        }
        let extent = self.inner.alloc_lent_buffer(len)?;
        let (region, offset) = self.inner.region_at(extent.start.raw())?;
        Ok(Buffer {
            fs: self.clone(),
            region: region.slice(offset, len)?,
            extent: Some(extent),
            len,
        })
    }

    /// Persistent buffers for `len` bytes: one, or — when free memory has no single extent
    /// that large (it fragments as blocks replaced by remapped writes are freed) — pieces of
    /// the largest power-of-two size it still has, down to 4 KiB, each with its offset in the
    /// `len` bytes, a multiple of its size (so that whole blocks stay remappable). `NoSpace`
    /// only when not even 4 KiB is free beyond the file system's reserve.
    pub fn buffers(&self, len: u64) -> Result<Buffers> {
        let mut pieces: SmallVec<[Piece<Buffer>; 1]> = SmallVec::new();
        // On failure the pieces got so far drop with `pieces`, and go back to the volume.
        alloc_halving(len, BLOCK, usize::MAX, &mut pieces, |_, n| self.buffer(n))?;
        Ok(pieces.into_iter().map(|p| (p.at, p.item)).collect())
    }

    /// Waits until every write logged so far is part of its file.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.drain()
    }

    /// Runs `f` with the checkpoint held between two passes: nothing the checkpoint writes
    /// (files' blocks, snapshots, the root) changes while `f` runs, so with the caller's
    /// own writers stopped the media holds still — what recovery would find if the process
    /// died now. How a mount server checks its live volume (`locus fsck` of a mounted
    /// volume). Writers are not stopped: one that needs the checkpoint (a full log, an
    /// `fsync`) waits until `f` returns; `f` must not wait for such a writer. The file
    /// system's own writer, idle-time defragmentation, is paused (after the window it is
    /// rewriting, if any).
    pub fn quiesced<R>(&self, f: impl FnOnce() -> R) -> R {
        let _paused = self
            .inner
            .defrag
            .pause
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _hold = self
            .inner
            .checkpoint_hold
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f()
    }

    /// The volume's size and the memory free for files, in bytes, and the files and
    /// directories there are: what `statfs` reports. Free counts the volume's free memory
    /// and the pages the file system keeps for small writes (`Recycled`), which any
    /// allocation that finds the volume short takes back — so overwriting files in place
    /// does not make the volume look fuller — and the room left in the buffers the
    /// writers' threads are filling, which a writer that finds the volume short takes back
    /// the same way. Available is free less the reserve the checkpoint keeps (see
    /// [`Space::available_bytes`]).
    pub fn space(&self) -> Space {
        let devices = self.inner.volume.stats();
        let free_bytes = devices.iter().map(|d| d.free_bytes).sum::<u64>()
            + self.inner.recycled.held() * BLOCK
            + self.inner.unused_buffer_bytes();
        Space {
            total_bytes: devices.iter().map(|d| d.capacity_bytes).sum(),
            free_bytes,
            available_bytes: free_bytes.saturating_sub(self.inner.reserve_bytes()),
            files: self.inner.stats().inodes,
        }
    }

    /// The files open with no name — removed while open, or made by
    /// [`Fs::create_unnamed`] and not named — and the memory their blocks hold, which comes
    /// back at their last close (what `df` counts and no listing shows). One pass over the
    /// inode table: for a report, not a hot path.
    pub fn nameless(&self) -> Nameless {
        let inodes = self.inner.table();
        let mut nameless = Nameless::default();
        for inode in inodes.values() {
            if inode.attr().unlinked {
                nameless.files += 1;
                nameless.bytes += inode.extents.read().expect("extent map").mapped_blocks() * BLOCK;
            }
        }
        nameless
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        self.inner.stats()
    }

    /// What recovery replayed when this file system was opened: nothing after a clean
    /// unmount, the logged writes and journal records a crash (or kill) left otherwise.
    pub fn replayed(&self) -> super::ReplaySummary {
        self.inner.replayed
    }

    /// Stops the checkpoint thread where it is, without moving what is logged or writing a
    /// snapshot: the media is left as a crash after the last returned operation would leave
    /// it. For recovery tests.
    #[doc(hidden)]
    pub fn abandon(self) {
        // The checkpoint's own failure, if any, is part of what the test looks at next.
        let _ = self.mount.stop(true);
    }

    /// Rewrites every window of `path` that idle-time defragmentation would, now and outside
    /// its budget, whatever the checkpoint mode; the windows rewritten. For crash tests of
    /// the rewrite itself.
    #[doc(hidden)]
    pub fn defragment_now(&self, path: &str) -> Result<u64> {
        let inode = self.inner.resolve(path)?;
        let windows = inode
            .size
            .load(Ordering::Acquire)
            .div_ceil(crate::defrag::WINDOW_BYTES);
        let mut rewritten = 0;
        for window in 0..windows {
            if self.inner.rewrite_window(inode.ino, window, true)?
                == crate::defrag::Outcome::Rewritten
            {
                rewritten += 1;
            }
        }
        Ok(rewritten)
    }

    /// The volume under the file system.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.inner.volume
    }

    /// Checkpoints everything, writes a final snapshot and stops the checkpoint thread. Other
    /// clones of this handle and open files fail with `Shutdown` afterwards.
    pub fn unmount(self) -> Result<()> {
        self.mount.stop(false)
    }

    /// [`Fs::unmount`] for a process about to exit: the same final checkpoint and snapshot,
    /// but the in-memory tables (an inode, its names and extent map per file) are left for
    /// the exit to reclaim instead of being freed one by one — on a volume of 30,000 files
    /// that was a twentieth of a short program's run. Open files and other clones of this
    /// handle fail with `Shutdown` afterwards, as after `unmount`.
    pub fn unmount_at_exit(self) -> Result<()> {
        let stopped = self.mount.stop(false);
        std::mem::forget(self);
        stopped
    }
}

/// An open file. Reads and writes are positional; every write is atomic and durable when it
/// returns. Closing (or dropping) checkpoints what was logged.
#[derive(Debug)]
pub struct File {
    pub(super) fs: Fs,
    pub(super) inode: Arc<Inode>,
    read: bool,
    write: bool,
}

impl File {
    fn writable(&self) -> Result<()> {
        if !self.write {
            return Err(FsError::BadHandle(
                "the file is not open for writing".into(),
            ));
        }
        self.fs.inner.check_running()
    }

    /// Writes `data` at `offset`: copied into a preliminary buffer with non-temporal stores,
    /// then committed by one log record.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        self.writable()?;
        self.fs.inner.write_at(&self.inode, data, offset)?;
        self.after_write()
    }

    /// A mapped file's writes reach its blocks before the write returns, so the mappings see
    /// them (`crate::fs::mapped`).
    fn after_write(&self) -> Result<()> {
        if self.inode.mapped.load(Ordering::Acquire) > 0 {
            self.fs.inner.drain()?;
        }
        Ok(())
    }

    /// Commits a filled persistent buffer as the bytes at `offset`, without copying it. Its
    /// whole blocks are later remapped into the file when `offset` is 4 KiB aligned.
    pub fn write_buffer(&self, buffer: Buffer, offset: u64) -> Result<()> {
        self.writable()?;
        let inner = &self.fs.inner;
        // Checked while the buffer is still the caller's: an error frees it on drop.
        check_io(offset, buffer.len)?;
        let slot = inner.slot()?;
        let len = buffer.len;
        inner.write_buffer(&slot, &self.inode, buffer.into_extent(), len, offset)?;
        self.after_write()
    }

    /// Another handle to this file, open for reading whatever this one's mode: for the
    /// program that holds this handle to copy its file out (the preload library moves the
    /// bytes of a file without a name into memory at a fork, write-only ones too). It is an
    /// open handle like any: a file without a name stays until both are closed.
    pub fn reader(&self) -> File {
        self.inode.opens.fetch_add(1, Ordering::AcqRel);
        File {
            fs: self.fs.clone(),
            inode: Arc::clone(&self.inode),
            read: true,
            write: false,
        }
    }

    /// Reads at `offset`; returns the bytes read (short at the end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if !self.read {
            return Err(FsError::BadHandle(
                "the file is not open for reading".into(),
            ));
        }
        self.fs.inner.accessed(&self.inode);
        let size = self.inode.size.load(Ordering::Acquire);
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset).min(MAX_IO);
        let _range = self
            .fs
            .inner
            .lock_range(&self.inode, offset, n, LockMode::Shared)?;
        // The size may have shrunk while waiting.
        let size = self.inode.size.load(Ordering::Acquire);
        let n = n.min(size.saturating_sub(offset));
        self.fs
            .inner
            .read_into(&self.inode, offset, &mut buf[..n as usize])?;
        Ok(n as usize)
    }

    /// Lends the bytes of `[offset, offset + len)`, clipped to the file, to `f` as slices in
    /// file order — the persistent memory that holds them, not a copy (holes lend zeros) —
    /// and returns how many bytes they cover with what `f` returned. Writers of the range
    /// and the checkpoint wait while `f` runs, so it should only hand the bytes on (a
    /// socket send that would block should copy what is left and return).
    pub fn read_with<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<(u64, R)> {
        if !self.read {
            return Err(FsError::BadHandle(
                "the file is not open for reading".into(),
            ));
        }
        self.fs.inner.accessed(&self.inode);
        let size = self.inode.size.load(Ordering::Acquire);
        let n = len.min(size.saturating_sub(offset)).min(MAX_IO);
        if n == 0 {
            return Ok((0, f(&[])));
        }
        let range = self
            .fs
            .inner
            .lock_range(&self.inode, offset, n, LockMode::Shared)?;
        let size = self.inode.size.load(Ordering::Acquire);
        let n = n.min(size.saturating_sub(offset));
        let result = lend::lend(&self.fs.inner, &self.inode, range.guard(), offset, n, f)?;
        Ok((n, result))
    }

    /// The parts of `[offset, offset + len)` (clipped to the file) that hold written data, as
    /// sorted, disjoint `[start, end)` byte ranges; everything else is a hole that reads as
    /// zeros and uses no memory. Ranges follow the 4 KiB blocks of checkpointed extents and
    /// the exact bytes of writes still in the logs.
    pub fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<std::ops::Range<u64>>> {
        let end = offset.saturating_add(len).min(self.len());
        if offset >= end {
            return Ok(Vec::new());
        }
        // The checkpoint moves a write from the overlay to the extents under its range lock.
        let _range = self.fs.inner.range_locks.lock(
            self.inode.ino,
            offset,
            end - offset,
            LockMode::Shared,
        )?;
        let mut ranges: Vec<std::ops::Range<u64>> = self
            .inode
            .extents
            .read()
            .expect("extent map")
            .lookup(offset / BLOCK, end.div_ceil(BLOCK))
            .into_iter()
            .map(|run| {
                let start = run.file_block * BLOCK;
                start.max(offset)..(start + run.blocks * BLOCK).min(end)
            })
            .collect();
        ranges.extend(
            self.inode
                .overlay
                .lookup(offset, end)
                .into_iter()
                .map(|piece| piece.start..piece.end),
        );
        ranges.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u64>> = Vec::with_capacity(ranges.len());
        for range in ranges.into_iter().filter(|r| r.start < r.end) {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        Ok(merged)
    }

    /// Makes `[offset, offset + len)` read as zeros and gives the memory of the whole blocks
    /// inside it back to the volume (a hole, as `fallocate(PUNCH_HOLE | KEEP_SIZE)`): those
    /// blocks are unmapped by one journal record, the partial blocks at the edges get zeros
    /// written. The size never changes; the part of the range beyond the end is ignored.
    /// Not bounded by [`MAX_IO`]: no data moves.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.writable()?;
        within_largest_file(offset, len)?;
        self.fs.inner.punch_hole(&self.inode, offset, len)
    }

    /// Allocates the blocks of `[offset, offset + len)` (`fallocate` without `PUNCH_HOLE`):
    /// every hole among the blocks the range touches gets a zeroed block, so that writes
    /// there cannot fail for want of space and the file's allocated bytes count them. With
    /// `keep_size` false the size grows to `offset + len` if it is below
    /// (`FALLOC_FL_KEEP_SIZE`: unchanged, the blocks past the end stay allocated until a
    /// truncation). `NoSpace`, with nothing changed, when the volume has less free memory
    /// than the holes need; `TooLarge` past the largest file; `Invalid` for an empty range.
    /// Durable on return; modification and change times become now.
    pub fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.writable()?;
        nonempty_within_largest_file(offset, len)?;
        self.fs.inner.allocate(&self.inode, offset, len, keep_size)
    }

    /// Makes `[offset, offset + len)` zeros with its blocks allocated
    /// (`FALLOC_FL_ZERO_RANGE`): a hole punched over it ([`File::punch_hole`]), then its
    /// blocks allocated ([`File::allocate`], zeroed); the size grows to cover the range
    /// unless `keep_size`. Each step is durable and atomic on its own: a crash between them
    /// leaves the hole, which reads as the same zeros. Errors as `allocate`'s; a volume
    /// without room for the range's holes is `NoSpace` before anything changes.
    pub fn zero_range(&self, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.writable()?;
        nonempty_within_largest_file(offset, len)?;
        // The punch gives back the blocks the range has; the room needed is its holes'.
        self.fs.inner.room_to_allocate(&self.inode, offset, len)?;
        self.punch_hole(offset, len)?;
        self.allocate(offset, len, keep_size)
    }

    /// `fallocate(2)` by its Linux `mode`: 0 and `FALLOC_FL_KEEP_SIZE` are
    /// [`File::allocate`], `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` is
    /// [`File::punch_hole`], `FALLOC_FL_ZERO_RANGE` (with or without `KEEP_SIZE`) is
    /// [`File::zero_range`]; other modes (collapse, insert, unshare, a punch that would not
    /// keep the size) are `NotSupported`, an empty range `Invalid`. The one reading of the
    /// modes that `locus mount`, the preload library and the C API share.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        nonempty_within_largest_file(offset, len)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => self.allocate(offset, len, keep_size),
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => self.punch_hole(offset, len),
            libc::FALLOC_FL_ZERO_RANGE => self.zero_range(offset, len, keep_size),
            _ => Err(FsError::NotSupported(format!(
                "fallocate mode {mode:#x} (0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | \
                 FALLOC_FL_KEEP_SIZE and FALLOC_FL_ZERO_RANGE are supported)"
            ))),
        }
    }

    /// Sets the size (grow with zeros or shrink).
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.writable()?;
        self.fs.inner.set_len(&self.inode, size)
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.inode.size.load(Ordering::Acquire)
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Attributes.
    pub fn stat(&self) -> Stat {
        self.fs.inner.stat_of(&self.inode)
    }

    /// Clears the set-user-ID bit, and the set-group-ID bit when group execution is on, as
    /// the kernel's file systems do when a process without `CAP_FSETID` writes or truncates
    /// a file (the file system does not know the writer's capabilities: its caller, who
    /// does, asks). Durable on return; `true` when the mode changed. Any handle may.
    pub fn drop_privileges(&self) -> Result<bool> {
        self.fs.inner.drop_privileges(&self.inode)
    }

    /// Sets the access and modification times (ns since the epoch; `None` leaves one as it
    /// is); the change time becomes now. Any handle may: `futimens` with explicit times
    /// needs ownership, not write access, which the caller checks.
    pub fn set_times(&self, atime: Option<u64>, mtime: Option<u64>) -> Result<()> {
        self.fs.inner.check_running()?;
        self.fs.inner.set_times(&self.inode, atime, mtime)
    }

    /// Sets the owning user and group (`None`: unchanged), as [`Fs::set_owner`] does, of
    /// this file (`fchown`; even after its last name is gone).
    pub fn set_owner(&self, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        self.fs.inner.check_running()?;
        self.fs.inner.set_owner(&self.inode, uid, gid)
    }

    /// [`Fs::chmod`] of this file (`fchmod`; even after its last name is gone).
    pub fn chmod(&self, mode: u32) -> Result<()> {
        self.fs.inner.set_mode_of(&self.inode, mode)
    }

    /// [`Fs::set_xattr`] of this file (even after its last name is gone).
    pub fn set_xattr(&self, name: &str, value: &[u8], how: XattrSet) -> Result<()> {
        self.fs.inner.check_running()?;
        self.fs
            .inner
            .set_xattr(&self.inode, name, value, how, false)
    }

    /// [`Fs::set_xattr_clearing_sgid`] of this file.
    pub fn set_xattr_clearing_sgid(&self, name: &str, value: &[u8], how: XattrSet) -> Result<()> {
        self.fs.inner.check_running()?;
        self.fs.inner.set_xattr(&self.inode, name, value, how, true)
    }

    /// [`Fs::get_xattr`] of this file.
    pub fn get_xattr(&self, name: &str) -> Result<Vec<u8>> {
        get_xattr(&self.inode, name)
    }

    /// [`Fs::list_xattrs`] of this file.
    pub fn list_xattrs(&self) -> Vec<String> {
        list_xattrs(&self.inode)
    }

    /// [`Fs::remove_xattr`] of this file.
    pub fn remove_xattr(&self, name: &str) -> Result<()> {
        self.fs.inner.check_running()?;
        self.fs.inner.remove_xattr(&self.inode, name)
    }

    /// A barrier: every write returned before is durable (they were at return already).
    pub fn sync_all(&self) -> Result<()> {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.fs.inner.check_running()
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.inode.ino
    }

    /// Gives the file the further name `new` (`linkat(fd, "", AT_EMPTY_PATH)`) — or its
    /// first, a file from [`Fs::create_unnamed`], which then stays after its last close.
    /// `NotFound` when its names were all removed, `Exists` when `new` names something.
    pub fn link(&self, new: &str) -> Result<()> {
        let shown = format!("inode {}", self.inode.ino);
        self.fs.inner.link_inode(&self.inode, &shown, new)
    }

    /// The file system this file belongs to.
    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// Closes the file after checkpointing everything logged so far.
    pub fn close(self) -> Result<()> {
        let result = if self.write {
            self.fs.inner.drain()
        } else {
            Ok(())
        };
        drop(self);
        result
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.inode.opens.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let (unlinked, unnamed) = {
            let attr = self.inode.attr();
            (attr.unlinked, attr.unnamed)
        };
        let dropped = if unnamed {
            self.fs.inner.drop_unnamed(&self.inode)
        } else if unlinked {
            self.fs.inner.destroy(&self.inode)
        } else {
            Ok(())
        };
        if let Err(e) = dropped {
            tracing::error!(error = %e, ino = self.inode.ino, "freeing an unlinked file failed");
        }
    }
}

/// The buffers [`Fs::buffers`] returns, each with its offset in the whole: one, inline,
/// unless free memory is in pieces.
pub type Buffers = SmallVec<[(u64, Buffer); 1]>;

/// A persistent buffer from [`Fs::buffer`]: fill it, then commit it with
/// [`File::write_buffer`]. Dropped uncommitted, its memory goes back to the volume.
#[derive(Debug)]
pub struct Buffer {
    pub(super) fs: Fs,
    pub(super) region: Region,
    pub(super) extent: Option<Extent>,
    pub(super) len: u64,
}

impl Buffer {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty buffer (never: buffers hold at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` in at `offset` (non-temporal stores).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.region.write_nt(offset, data)?;
        Ok(())
    }

    /// Copies out.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.region.read(offset, buf)?;
        Ok(())
    }

    /// The node the buffer's memory is on, if known.
    pub fn node(&self) -> Option<u32> {
        self.extent
            .and_then(|e| self.fs.inner.volume.device_node(e.device()))
    }

    pub(super) fn into_extent(mut self) -> Extent {
        self.extent
            .take()
            .expect("an uncommitted buffer has its extent")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(extent) = self.extent.take()
            && let Err(e) = self.fs.inner.volume.free(extent)
        {
            tracing::error!(error = %e, "freeing an uncommitted buffer failed");
        }
    }
}

/// What [`Fs::nameless`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Nameless {
    /// Files open with no name.
    pub files: u64,
    /// The bytes their mapped blocks hold.
    pub bytes: u64,
}

/// What [`Fs::space`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// The volume's data capacity.
    pub total_bytes: u64,
    /// Memory free for files (see [`Fs::space`]): `statfs`'s `f_bfree`.
    pub free_bytes: u64,
    /// What of it new data can still take: free memory less the reserve the checkpoint
    /// keeps for the next snapshot and for pages under pending partial writes (at least
    /// 1 MiB; it grows with pending metadata). A write that needs more than this is
    /// `ENOSPC`, so this is `statfs`'s `f_bavail` — what `df` shows as available; before,
    /// `df` showed the reserve as available on a volume that refused every write.
    pub available_bytes: u64,
    /// Files and directories.
    pub files: u64,
}

/// `TooLarge` unless `[offset, offset + len)` ends within the largest file.
fn within_largest_file(offset: u64, len: u64) -> Result<()> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > MAX_FILE_SIZE)
    {
        return Err(FsError::TooLarge(format!(
            "{len} bytes at offset {offset} end beyond the largest file ({MAX_FILE_SIZE})"
        )));
    }
    Ok(())
}

/// [`within_largest_file`], and `Invalid` for an empty range (`fallocate`'s rule).
fn nonempty_within_largest_file(offset: u64, len: u64) -> Result<()> {
    if len == 0 {
        return Err(FsError::Invalid(format!(
            "an empty range (0 bytes at offset {offset})"
        )));
    }
    within_largest_file(offset, len)
}
