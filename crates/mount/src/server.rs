//! What each FUSE request does to the file system: the inode-to-path table, open handles,
//! and one function per opcode. Shared by every serving thread: the file system is
//! concurrent, the tables are behind locks held for map look-ups only, and changes of names
//! are serialised with the table updates they imply.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fs::{FsError, Kind, OpenOptions, Owner, Stat, XattrSet};
use smallvec::{SmallVec, smallvec};

use crate::proto::{self, Attr, InHeader, Malformed, Reader, Writer, fattr, op};
use crate::{CHECK_INO, CHECK_NAME, Checker, SCRUB_INO, SCRUB_NAME, STATUS_INO, STATUS_NAME, TTL};

/// The block size reported to `stat` and `statfs`.
const BLOCK: u32 = 4096;

/// Where each inode the kernel knows is: its directory and name, and how many of the
/// kernel's lookups hold it. A path is built by walking up to the root, so renaming a
/// directory changes one entry, not one per inode below it, and removing or renaming a name
/// costs the same whatever the table holds. An inode leaves the table when the kernel
/// forgets its last lookup (`FORGET`, `BATCH_FORGET`) or its name is removed; the kernel
/// keeps a directory while it knows anything below it, so a known inode's ancestors are
/// known too.
#[derive(Debug)]
pub(crate) struct Names {
    known: HashMap<u64, Known>,
}

#[derive(Debug)]
struct Known {
    /// `(parent, name)` of each name the kernel was given for the inode and still has: one,
    /// but a file with hard links can be known by several. Paths are built from the first.
    names: SmallVec<[(u64, Box<str>); 1]>,
    /// Entry replies the kernel has not forgotten (the root's is never counted down).
    lookups: u64,
}

impl Default for Names {
    fn default() -> Self {
        let root = Known {
            names: smallvec![(fs::ROOT_INO, "".into())],
            lookups: 1,
        };
        Names {
            known: HashMap::from([(fs::ROOT_INO, root)]),
        }
    }
}

impl Names {
    /// The path of `ino` from the root; ESTALE when the kernel names an inode the table no
    /// longer holds (its name was removed).
    fn path(&self, ino: u64) -> Result<String, i32> {
        let mut names = Vec::new();
        let mut at = ino;
        while at != fs::ROOT_INO {
            let (parent, name) = self
                .known
                .get(&at)
                .and_then(|k| k.names.first())
                .ok_or(libc::ESTALE)?;
            names.push(&**name);
            // A cycle cannot be made by the operations below; refuse rather than spin.
            if names.len() > self.known.len() {
                return Err(libc::ESTALE);
            }
            at = *parent;
        }
        if names.is_empty() {
            return Ok("/".into());
        }
        let mut path = String::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for name in names.iter().rev() {
            path.push('/');
            path.push_str(name);
        }
        Ok(path)
    }

    fn child(&self, parent: u64, name: &str) -> Result<String, i32> {
        if parent == fs::ROOT_INO && [STATUS_NAME, CHECK_NAME, SCRUB_NAME].contains(&name) {
            return Err(libc::EPERM); // the status, check and scrub files' names
        }
        if name.is_empty() || name.contains('/') {
            return Err(libc::EINVAL);
        }
        Ok(join(&self.path(parent)?, name))
    }

    /// An entry reply for `ino`, named `name` in `parent`, is going to the kernel.
    fn looked_up(&mut self, ino: u64, parent: u64, name: &str) {
        if ino == fs::ROOT_INO {
            return;
        }
        let known = self.known.entry(ino).or_insert_with(|| Known {
            names: SmallVec::new(),
            lookups: 0,
        });
        if !known
            .names
            .iter()
            .any(|(p, n)| (*p, &**n) == (parent, name))
        {
            known.names.push((parent, name.into()));
        }
        known.lookups += 1;
    }

    /// An entry reply for `ino` that gave it no name (an unnamed file, `O_TMPFILE`).
    fn counted(&mut self, ino: u64) {
        self.known
            .entry(ino)
            .or_insert_with(|| Known {
                names: SmallVec::new(),
                lookups: 0,
            })
            .lookups += 1;
    }

    /// `ino`'s name `from` (`(parent, name)`) is now `name` in `parent` (a rename).
    fn moved(&mut self, ino: u64, from: (u64, &str), parent: u64, name: &str) {
        if let Some(known) = self.known.get_mut(&ino) {
            match known.names.iter_mut().find(|(p, n)| (*p, &**n) == from) {
                Some(old) => *old = (parent, name.into()),
                None => known.names.push((parent, name.into())),
            }
        }
    }

    /// `ino`'s name `name` in `parent` is gone; with its last known name, the inode leaves
    /// the table (the kernel has no entry left that leads to it).
    fn removed(&mut self, ino: u64, parent: u64, name: &str) {
        if ino == fs::ROOT_INO {
            return;
        }
        if let Some(known) = self.known.get_mut(&ino) {
            known.names.retain(|(p, n)| (*p, &**n) != (parent, name));
            if known.names.is_empty() {
                self.known.remove(&ino);
            }
        }
    }

    /// The kernel forgot `lookups` of its lookups of `ino`.
    fn forget(&mut self, ino: u64, lookups: u64) {
        if ino == fs::ROOT_INO {
            return;
        }
        if let Some(known) = self.known.get_mut(&ino) {
            known.lookups = known.lookups.saturating_sub(lookups);
            if known.lookups == 0 {
                self.known.remove(&ino);
            }
        }
    }

    /// Inodes in the table, the root included.
    fn len(&self) -> usize {
        self.known.len()
    }
}

/// An open directory: its entries, read at `opendir`.
#[derive(Debug)]
struct Listing {
    entries: Vec<(u64, Kind, String)>,
}

#[derive(Debug)]
enum Handle {
    File(fs::File),
    Dir(Listing),
    /// The status or check file's bytes, made at `open`.
    Made(Vec<u8>),
    /// The scrub file: a read at offset 0 says how the scrub is going now, and reads
    /// further on continue those bytes.
    Scrub(Mutex<Vec<u8>>),
}

/// What a request asks for in reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// This many bytes of reply arguments (possibly none).
    Out(usize),
    /// No reply at all (`FORGET`, `INTERRUPT`).
    None,
}

/// The file system as FUSE sees it.
pub(crate) struct Server {
    fs: fs::Fs,
    read_only: bool,
    /// Regular files are opened for direct I/O (reads and writes bypass the kernel's page
    /// cache, one copy less; shared mappings still work because the kernel allows mmap of
    /// direct-I/O files on this connection).
    direct_io: bool,
    /// The kernel caches written pages and sends them later (`locus mount
    /// --writeback-cache`): regular files use the page cache, are opened for reading too
    /// (the kernel reads the rest of a page a write covers in part), and keep their cached
    /// pages across opens.
    writeback: bool,
    names: RwLock<Names>,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    /// Held while a request changes names, so the table follows the file system in order.
    namespace: Mutex<()>,
    /// The daemon's ids: the owner shown for files that have none recorded, and for the
    /// status and check files.
    uid: u32,
    gid: u32,
    /// Requests served, for the status file: through `/dev/fuse` reads, and per io_uring
    /// queue (index = CPU).
    dev_requests: AtomicU64,
    queue_requests: Vec<AtomicU64>,
    /// io_uring requests served on another CPU than the one whose queue they came from
    /// (the one that made them).
    served_elsewhere: AtomicU64,
    /// LOOKUPs answered with a negative entry.
    missing_names: AtomicU64,
    /// WRITE requests served; with `max_write`, the most data one carries, they show how
    /// the kernel cut callers' writes.
    write_requests: AtomicU64,
    max_write: usize,
    /// Extended-attribute requests (get, list, set, remove): `ls -l` asks each file's
    /// (its ACL check lists them), a round trip the kernel cannot cache.
    xattr_requests: AtomicU64,
    /// Extended attributes are served (else their requests are `ENOSYS`).
    xattrs: bool,
    /// POSIX ACLs are kept (the kernel enforces them); otherwise their names are
    /// `EOPNOTSUPP`, as the kernel would not enforce what was stored.
    acl: bool,
    /// SETXATTR requests carry `setxattr_flags` (`FUSE_SETXATTR_EXT`).
    setxattr_ext: bool,
    io_uring: bool,
    /// What opening the check file runs.
    checker: Option<Checker>,
    /// Every request holds it shared while it is served; opening the check file holds it
    /// exclusively, so no request is in flight while the volume is checked (new ones wait).
    still: RwLock<()>,
    /// The scrub opening the scrub file starts, one at a time.
    scrubber: fs::ScrubRunner,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("read_only", &self.read_only)
            .field("direct_io", &self.direct_io)
            .finish_non_exhaustive()
    }
}

/// Copies what `bytes` hold from `offset` on into `buf`; returns how many.
fn copy_out(bytes: &[u8], offset: u64, buf: &mut [u8]) -> usize {
    let from = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let to = from.saturating_add(buf.len()).min(bytes.len());
    buf[..to - from].copy_from_slice(&bytes[from..to]);
    to - from
}

/// Whether `ino` is one of the files the server makes (status, check, scrub).
fn made(ino: u64) -> bool {
    matches!(ino, STATUS_INO | CHECK_INO | SCRUB_INO)
}

fn errno(e: &FsError) -> i32 {
    e.errno()
}

#[allow(clippy::needless_pass_by_value, reason = "used as map_err(bad)")]
fn bad(e: Malformed) -> i32 {
    tracing::warn!(problem = %e, "malformed FUSE request");
    libc::EINVAL
}

/// The path of `name` in the directory at `dir`.
fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// `d_type` of a kind (directory entries).
fn dtype(kind: Kind) -> u32 {
    match kind {
        Kind::Dir => u32::from(libc::DT_DIR),
        Kind::Symlink => u32::from(libc::DT_LNK),
        Kind::File => u32::from(libc::DT_REG),
        Kind::Fifo => u32::from(libc::DT_FIFO),
        Kind::Socket => u32::from(libc::DT_SOCK),
        Kind::CharDevice => u32::from(libc::DT_CHR),
        Kind::BlockDevice => u32::from(libc::DT_BLK),
    }
}

fn ifmt(kind: Kind) -> u32 {
    match kind {
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::File => libc::S_IFREG,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDevice => libc::S_IFCHR,
        Kind::BlockDevice => libc::S_IFBLK,
    }
}

/// The kind of a special file `mknod` asks for by its mode's type bits.
fn special_kind(mode: u32) -> Option<Kind> {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => Some(Kind::Fifo),
        libc::S_IFSOCK => Some(Kind::Socket),
        libc::S_IFCHR => Some(Kind::CharDevice),
        libc::S_IFBLK => Some(Kind::BlockDevice),
        _ => None,
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Server {
    pub(crate) fn new(fs: fs::Fs, read_only: bool, checker: Option<Checker>) -> Self {
        let names = Names::default();
        // Shown as the owner of the status and check files, and of files made before
        // the file system kept owners.
        let Owner { uid, gid } = fs.owner();
        Server {
            fs,
            read_only,
            direct_io: false,
            writeback: false,
            names: RwLock::new(names),
            handles: RwLock::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            namespace: Mutex::new(()),
            uid,
            gid,
            dev_requests: AtomicU64::new(0),
            queue_requests: Vec::new(),
            served_elsewhere: AtomicU64::new(0),
            missing_names: AtomicU64::new(0),
            write_requests: AtomicU64::new(0),
            max_write: 0,
            xattr_requests: AtomicU64::new(0),
            xattrs: true,
            acl: false,
            setxattr_ext: false,
            io_uring: false,
            checker,
            still: RwLock::new(()),
            scrubber: fs::ScrubRunner::new(),
        }
    }

    /// Requests will come from `queues` io_uring queues as well as `/dev/fuse`.
    pub(crate) fn set_queues(&mut self, queues: usize) {
        self.io_uring = queues > 0;
        self.queue_requests = (0..queues).map(|_| AtomicU64::new(0)).collect();
    }

    /// Counts a request read from `/dev/fuse`.
    pub(crate) fn count_dev(&self) {
        self.dev_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request taken from io_uring queue `qid` (made on CPU `qid`), and whether it
    /// is being served on another CPU.
    pub(crate) fn count_queue(&self, qid: usize) {
        if let Some(c) = self.queue_requests.get(qid) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if topology::current_cpu().is_ok_and(|cpu| cpu as usize != qid) {
            self.served_elsewhere.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serves extended attributes, or answers their requests `ENOSYS` (`locus mount
    /// --no-xattrs`).
    pub(crate) fn set_xattrs(&mut self, on: bool) {
        self.xattrs = on;
    }

    /// Keeps POSIX ACLs (the kernel agreed to enforce them); `setxattr_ext`: SETXATTR
    /// requests carry `setxattr_flags`.
    pub(crate) fn set_acl(&mut self, on: bool, setxattr_ext: bool) {
        self.acl = on;
        self.setxattr_ext = setxattr_ext;
    }

    /// Whether SETXATTR requests carry `setxattr_flags` (their argument struct's length).
    pub(crate) fn setxattr_ext(&self) -> bool {
        self.setxattr_ext
    }

    /// The most data one request carries, as negotiated (for the status file).
    pub(crate) fn set_max_write(&mut self, bytes: usize) {
        self.max_write = bytes;
    }

    /// Opens regular files for direct I/O from now on (the connection allows mmap of them).
    pub(crate) fn set_direct_io(&mut self, on: bool) {
        self.direct_io = on;
    }

    /// The kernel caches written pages from now on (it agreed to `WRITEBACK_CACHE`).
    pub(crate) fn set_writeback(&mut self, on: bool) {
        self.writeback = on;
    }

    /// Drops every open handle (the connection is gone).
    pub(crate) fn close_all(&self) {
        self.handles
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Stops a running scrub and waits for it (before the file system is unmounted).
    pub(crate) fn stop_scrub(&self) {
        self.scrubber.stop();
    }

    /// The scrub file's bytes: the status of the scrub its opening started or joined.
    fn scrub_status(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(&self.scrubber.status()).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    fn names(&self) -> std::sync::RwLockReadGuard<'_, Names> {
        self.names.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn names_mut(&self) -> std::sync::RwLockWriteGuard<'_, Names> {
        self.names.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, ino: u64) -> Result<String, i32> {
        self.names().path(ino)
    }

    fn child(&self, parent: u64, name: &str) -> Result<String, i32> {
        self.names().child(parent, name)
    }

    /// The file system as the request's caller, who owns what it creates. (The kernel
    /// checked the caller's permissions already: the mount has `default_permissions`.)
    fn caller(&self, h: &InHeader) -> fs::Fs {
        self.fs.as_owner(Owner {
            uid: h.uid,
            gid: h.gid,
        })
    }

    /// The caller's handle for a create with the `umask` the kernel passed: the file
    /// system takes it from the mode, unless a default ACL decides (with ACLs on, the
    /// kernel leaves both to the server; without, it has masked the mode already, and
    /// default ACLs the volume holds are not inherited, as on a kernel file system mounted
    /// `noacl`).
    fn creator(&self, h: &InHeader, umask: u32) -> fs::Fs {
        let fs = self.caller(h).with_umask(umask);
        if self.acl {
            fs
        } else {
            fs.without_default_acls()
        }
    }

    fn attr(&self, st: &Stat) -> Attr {
        Attr {
            ino: st.ino,
            size: st.size,
            blocks: st.allocated.div_ceil(512),
            atime_ns: st.atime_ns,
            mtime_ns: st.mtime_ns,
            ctime_ns: st.ctime_ns,
            mode: ifmt(st.kind) | (st.mode & 0o7777),
            nlink: u32::try_from(st.nlink).unwrap_or(u32::MAX),
            rdev: st.rdev,
            uid: st.uid.unwrap_or(self.uid),
            gid: st.gid.unwrap_or(self.gid),
            blksize: BLOCK,
        }
    }

    /// The status or check file's attributes (`ino`).
    fn made_attr(&self, ino: u64) -> Attr {
        let now = now_ns();
        Attr {
            ino,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            // Opening the check file holds every request, opening the scrub file reads every
            // block of the volume: the mount owner's only (an `--allow-other` mount's other
            // users get EACCES). The status file anyone may read.
            mode: libc::S_IFREG | if ino == STATUS_INO { 0o444 } else { 0o400 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            blksize: BLOCK,
            ..Attr::default()
        }
    }

    /// The attributes of `ino`: by path, or through an open handle when the name is gone.
    fn stat(&self, ino: u64) -> Result<Stat, i32> {
        if let Ok(path) = self.path(ino)
            && let Ok(st) = self.fs.lstat(&path)
            && st.ino == ino
        {
            return Ok(st);
        }
        match self.open_file(ino).as_deref() {
            Some(Handle::File(f)) => Ok(f.stat()),
            _ => Err(libc::ENOENT),
        }
    }

    /// An open handle of file `ino`: how an inode without a name (unlinked while open, or
    /// made by `O_TMPFILE`) is reached.
    fn open_file(&self, ino: u64) -> Option<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .find(|h| matches!(&***h, Handle::File(f) if f.ino() == ino))
            .cloned()
    }

    /// Looks `path` up and remembers it: the entry the kernel caches.
    /// The attributes of `path` (`name` in directory `parent`) for an entry reply, counted
    /// as one more lookup the kernel holds.
    fn entry(&self, parent: u64, name: &str, path: &str) -> Result<Attr, i32> {
        let st = self.fs.lstat(path).map_err(|e| errno(&e))?;
        self.names_mut().looked_up(st.ino, parent, name);
        Ok(self.attr(&st))
    }

    /// The inode `path` names, if any (before a change that removes or moves the name).
    fn ino_of(&self, path: &str) -> Option<u64> {
        self.fs.lstat(path).ok().map(|st| st.ino)
    }

    fn writable(&self) -> Result<(), i32> {
        if self.read_only {
            Err(libc::EROFS)
        } else {
            Ok(())
        }
    }

    fn add(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(handle));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, i32> {
        self.handles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    fn take(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh)
    }

    /// How a file opened with `flags` is opened in the file system. With the write-back
    /// cache a write-only open reads too: the kernel reads the rest of each page a write
    /// covers in part, through any handle of the file that writes (it checked the caller's
    /// right to open it write-only; the handle is never the caller's to read from).
    fn open_options(&self, flags: u32) -> OpenOptions {
        let access = flags as i32 & libc::O_ACCMODE;
        OpenOptions {
            read: self.writeback || access != libc::O_WRONLY,
            write: access != libc::O_RDONLY,
            ..OpenOptions::default()
        }
    }

    /// The check file's bytes: the checker's report, made with no request in flight (this
    /// one, an `OPEN` of the check file, is served without the shared hold — see
    /// [`Server::serve`]) and the checkpoint held.
    fn check(&self) -> Result<Vec<u8>, i32> {
        let checker = self.checker.as_ref().ok_or(libc::ENOENT)?;
        let _still = self.still.write().unwrap_or_else(PoisonError::into_inner);
        let started = std::time::Instant::now();
        let report = self.fs.quiesced(|| (checker.0)());
        tracing::info!(
            held_ms = started.elapsed().as_millis() as u64,
            "checked the volume for `locus fsck`; requests waited meanwhile"
        );
        Ok(report)
    }

    /// The status file's bytes, now.
    fn status(&self) -> Vec<u8> {
        let volume = self.fs.volume();
        let status = serde_json::json!({
            "server_pid": std::process::id(),
            "uuid": volume::hex(&volume.uuid()),
            "devices": volume.stats(),
            "fs": self.fs.stats(),
            "nameless": self.fs.nameless(),
            // The last scrub `locus scrub` started through this mount (null: none yet).
            "scrub": Some(self.scrubber.status()).filter(|s| s.id > 0),
            "fuse": {
                "io_uring": self.io_uring,
                "direct_io": self.direct_io,
                "writeback_cache": self.writeback,
                // Inodes the kernel holds lookups on (the root included): forgotten ones
                // leave, so this follows the kernel's inode cache, not the files ever seen.
                "known_inodes": self.names().len(),
                "dev_requests": self.dev_requests.load(Ordering::Relaxed),
                "queue_requests": self
                    .queue_requests
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .collect::<Vec<_>>(),
                "served_elsewhere": self.served_elsewhere.load(Ordering::Relaxed),
                // Lookups answered "no such name" (which the kernel then caches).
                "missing_names": self.missing_names.load(Ordering::Relaxed),
                "max_write": self.max_write,
                "acl": self.acl,
                "write_requests": self.write_requests.load(Ordering::Relaxed),
                "xattr_requests": self.xattr_requests.load(Ordering::Relaxed),
            },
        });
        let mut bytes = serde_json::to_vec_pretty(&status).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Called by each serving thread as it starts: claims its file system slot while the
    /// volume has room for the slot's log and journal ([`fs::Fs::claim_thread_slot`]), so
    /// that which thread serves a request never decides whether a full volume has room.
    /// A read-only mount writes nothing; a slot that cannot be claimed now is claimed at
    /// the thread's first change, as before.
    pub(crate) fn start_thread(&self) {
        if self.read_only {
            return;
        }
        if let Err(e) = self.fs.claim_thread_slot() {
            tracing::debug!(error = %e, "a serving thread claims its slot at its first change");
        }
    }

    /// Serves one request: `arg` is the opcode's argument struct, `buf[..in_len]` the rest of
    /// the request (names, written data); the reply's arguments are written into `buf`.
    pub(crate) fn serve(
        &self,
        h: &InHeader,
        arg: &[u8],
        buf: &mut [u8],
        in_len: usize,
    ) -> Result<Reply, i32> {
        let in_len = in_len.min(buf.len());
        // Opening the check file takes the hold exclusively itself; a shared one here would
        // wait for it forever.
        let _still = (h.opcode != op::OPEN || h.nodeid != CHECK_INO)
            .then(|| self.still.read().unwrap_or_else(PoisonError::into_inner));
        match h.opcode {
            op::FORGET => {
                let lookups = Reader::new(arg, "fuse_forget_in").u64().map_err(bad)?;
                self.names_mut().forget(h.nodeid, lookups);
                Ok(Reply::None)
            }
            op::BATCH_FORGET => {
                let count = Reader::new(arg, "fuse_batch_forget_in")
                    .u32()
                    .map_err(bad)?;
                let mut r = Reader::new(&buf[..in_len], "fuse_forget_one");
                let mut names = self.names_mut();
                for _ in 0..count {
                    let (ino, lookups) = (r.u64().map_err(bad)?, r.u64().map_err(bad)?);
                    names.forget(ino, lookups);
                }
                Ok(Reply::None)
            }
            op::INTERRUPT => Ok(Reply::None),
            op::DESTROY => {
                self.close_all();
                Ok(Reply::Out(0))
            }
            op::READ => self.read(arg, buf).map(Reply::Out),
            op::WRITE => {
                self.write_requests.fetch_add(1, Ordering::Relaxed);
                self.write(arg, buf, in_len).map(Reply::Out)
            }
            opcode => {
                if matches!(
                    opcode,
                    op::GETXATTR | op::LISTXATTR | op::SETXATTR | op::REMOVEXATTR
                ) {
                    self.xattr_requests.fetch_add(1, Ordering::Relaxed);
                    if !self.xattrs {
                        return Err(libc::ENOSYS);
                    }
                }
                // Every other request is small: take its names out of the buffer, then reply
                // into it.
                let rest = buf[..in_len].to_vec();
                let mut w = Writer::new(buf);
                self.other(opcode, h, arg, &rest, &mut w)?;
                Ok(Reply::Out(w.len()))
            }
        }
    }

    fn other(
        &self,
        opcode: u32,
        h: &InHeader,
        arg: &[u8],
        rest: &[u8],
        w: &mut Writer<'_>,
    ) -> Result<(), i32> {
        let ino = h.nodeid;
        let mut r = Reader::new(arg, "the request's arguments");
        match opcode {
            op::LOOKUP => {
                let [name] = proto::names(rest).map_err(bad)?;
                if ino == fs::ROOT_INO && name == STATUS_NAME {
                    return proto::entry(w, &self.made_attr(STATUS_INO), Duration::ZERO);
                }
                if ino == fs::ROOT_INO && name == CHECK_NAME {
                    if self.checker.is_none() {
                        return Err(libc::ENOENT);
                    }
                    return proto::entry(w, &self.made_attr(CHECK_INO), Duration::ZERO);
                }
                if ino == fs::ROOT_INO && name == SCRUB_NAME {
                    return proto::entry(w, &self.made_attr(SCRUB_INO), Duration::ZERO);
                }
                match self.entry(ino, name, &self.child(ino, name)?) {
                    Ok(attr) => proto::entry(w, &attr, TTL),
                    // A missing name is cached by the kernel as such (a negative dentry):
                    // a name can only appear through this mount, which the kernel sees,
                    // so the cache cannot go stale. Programs probe missing names often
                    // (include and library search paths, make's implicit rules, sqlite's
                    // journal files), and each would otherwise be a round trip here.
                    Err(libc::ENOENT) => {
                        self.missing_names.fetch_add(1, Ordering::Relaxed);
                        proto::no_entry(w, TTL)
                    }
                    Err(e) => Err(e),
                }
            }
            op::GETATTR => {
                if made(ino) {
                    return proto::attr_out(w, &self.made_attr(ino), Duration::ZERO);
                }
                let st = self.stat(ino)?;
                proto::attr_out(w, &self.attr(&st), TTL)
            }
            op::SETATTR => {
                let attr = self
                    .setattr(ino, &mut r)
                    .map_err(|e| e.unwrap_or_else(bad))?;
                proto::attr_out(w, &attr, TTL)
            }
            op::READLINK => {
                let path = self.path(ino)?;
                let target = self.fs.readlink(&path).map_err(|e| errno(&e))?;
                w.bytes(target.as_bytes())
            }
            op::SYMLINK => {
                let [name, target] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                self.caller(h)
                    .symlink(target, &path)
                    .map_err(|e| errno(&e))?;
                proto::entry(w, &self.entry(ino, name, &path)?, TTL)
            }
            op::MKNOD => {
                let (mode, rdev, umask) = (r.u32(), r.u32(), r.u32());
                let (mode, rdev, umask) =
                    (mode.map_err(bad)?, rdev.map_err(bad)?, umask.map_err(bad)?);
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                if let Some(kind) = special_kind(mode) {
                    // A name and attributes: the kernel serves the FIFO, socket or device
                    // itself and never asks this server to open one.
                    let rdev = if kind.is_device() {
                        proto::decode_dev(rdev)
                    } else {
                        0
                    };
                    self.creator(h, umask)
                        .mknod(&path, kind, mode & 0o7777, rdev)
                        .map_err(|e| errno(&e))?;
                    return proto::entry(w, &self.entry(ino, name, &path)?, TTL);
                }
                if mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(libc::EINVAL);
                }
                let options = OpenOptions {
                    create: true,
                    exclusive: true,
                    mode: mode & 0o7777,
                    ..OpenOptions::default()
                };
                drop(
                    self.creator(h, umask)
                        .open_file(&path, options)
                        .map_err(|e| errno(&e))?,
                );
                proto::entry(w, &self.entry(ino, name, &path)?, TTL)
            }
            op::MKDIR => {
                let (mode, umask) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                self.creator(h, umask)
                    .mkdir(&path, mode & 0o7777)
                    .map_err(|e| errno(&e))?;
                proto::entry(w, &self.entry(ino, name, &path)?, TTL)
            }
            op::UNLINK | op::RMDIR => {
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                let gone = self.ino_of(&path);
                if opcode == op::UNLINK {
                    self.fs.unlink(&path)
                } else {
                    self.fs.rmdir(&path)
                }
                .map_err(|e| errno(&e))?;
                if let Some(gone) = gone {
                    self.names_mut().removed(gone, ino, name);
                }
                Ok(())
            }
            op::RENAME | op::RENAME2 => {
                let newdir = r.u64().map_err(bad)?;
                let flags = if opcode == op::RENAME2 {
                    r.u32().map_err(bad)?
                } else {
                    0
                };
                let [name, newname] = proto::names(rest).map_err(bad)?;
                self.rename(ino, name, newdir, newname, flags)
            }
            op::LINK => {
                let old = r.u64().map_err(bad)?;
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                if made(old) {
                    return Err(libc::EPERM);
                }
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                match self.path(old) {
                    Ok(existing) => self.fs.link(&existing, &path),
                    // No name: an `O_TMPFILE` file getting its first (`linkat`), through its
                    // handle.
                    Err(e) => match self.open_file(old).as_deref() {
                        Some(Handle::File(file)) => file.link(&path),
                        _ => return Err(e),
                    },
                }
                .map_err(|e| errno(&e))?;
                proto::entry(w, &self.entry(ino, name, &path)?, TTL)
            }
            op::OPEN => {
                let (flags, open_flags) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
                let (fh, reply_flags) = self.open(ino, flags)?;
                if open_flags & proto::OPEN_KILL_SUIDGID != 0
                    && let Handle::File(file) = &*self.handle(fh)?
                {
                    file.drop_privileges().map_err(|e| errno(&e))?;
                }
                proto::open_out(w, fh, reply_flags)
            }
            op::CREATE => {
                let (flags, mode, umask, open_flags) = (r.u32(), r.u32(), r.u32(), r.u32());
                let (flags, mode, umask) =
                    (flags.map_err(bad)?, mode.map_err(bad)?, umask.map_err(bad)?);
                let open_flags = open_flags.map_err(bad)?;
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                let _ns = lock(&self.namespace);
                let path = self.child(ino, name)?;
                let options = OpenOptions {
                    create: true,
                    exclusive: flags as i32 & libc::O_EXCL != 0,
                    truncate: flags as i32 & libc::O_TRUNC != 0,
                    mode: mode & 0o7777,
                    ..self.open_options(flags)
                };
                let file = self
                    .creator(h, umask)
                    .open_file(&path, options)
                    .map_err(|e| errno(&e))?;
                // An existing file truncated by `O_TRUNC`.
                if open_flags & proto::OPEN_KILL_SUIDGID != 0 {
                    file.drop_privileges().map_err(|e| errno(&e))?;
                }
                let attr = self.attr(&file.stat());
                self.names_mut().looked_up(attr.ino, ino, name);
                let fh = self.add(Handle::File(file));
                proto::entry(w, &attr, TTL)?;
                proto::open_out(w, fh, self.file_open_flags())
            }
            op::TMPFILE => {
                // `open(dir, O_TMPFILE)`: a file with no name (the kernel sends "/" as its
                // name), reached through the handle until a `LINK` names it.
                let (flags, mode, umask) = (r.u32(), r.u32(), r.u32());
                let (flags, mode, umask) =
                    (flags.map_err(bad)?, mode.map_err(bad)?, umask.map_err(bad)?);
                self.writable()?;
                let dir = self.path(ino)?;
                let file = self
                    .creator(h, umask)
                    .create_unnamed(
                        &dir,
                        mode & 0o7777,
                        self.open_options(flags).read,
                        flags as i32 & libc::O_EXCL != 0,
                    )
                    .map_err(|e| errno(&e))?;
                let attr = self.attr(&file.stat());
                self.names_mut().counted(attr.ino);
                let fh = self.add(Handle::File(file));
                proto::entry(w, &attr, TTL)?;
                proto::open_out(w, fh, self.file_open_flags())
            }
            op::STATFS => self.statfs(w),
            op::RELEASE => {
                // Dropped, not `File::close`d: that waits for the checkpoint to move every
                // record logged so far, which durability does not need (a write is durable
                // when it returns) and which cost every create-and-close a wake-up of the
                // checkpoint thread (43 us of the 77 us a create and close took here).
                let fh = r.u64().map_err(bad)?;
                match self.take(fh).map(Arc::try_unwrap) {
                    // Still in use by a request in flight: closed when that ends.
                    Some(Ok(Handle::File(_) | Handle::Made(_) | Handle::Scrub(_)) | Err(_)) => {
                        Ok(())
                    }
                    Some(Ok(Handle::Dir(_))) | None => Err(libc::EBADF),
                }
            }
            op::FLUSH => {
                // Every write is durable when it returns: nothing is held back.
                let fh = r.u64().map_err(bad)?;
                match &*self.handle(fh)? {
                    Handle::File(_) | Handle::Made(_) | Handle::Scrub(_) => Ok(()),
                    Handle::Dir(_) => Err(libc::EISDIR),
                }
            }
            op::FSYNC => {
                let fh = r.u64().map_err(bad)?;
                match &*self.handle(fh)? {
                    Handle::File(f) => f.sync_all().map_err(|e| errno(&e)),
                    Handle::Made(_) | Handle::Scrub(_) => Ok(()),
                    Handle::Dir(_) => Err(libc::EISDIR),
                }
            }
            op::OPENDIR => {
                let listing = self.listing(ino)?;
                proto::open_out(w, self.add(Handle::Dir(listing)), 0)
            }
            op::READDIR | op::READDIRPLUS => {
                let (fh, offset, size) = (r.u64(), r.u64(), r.u32());
                let (fh, offset, size) =
                    (fh.map_err(bad)?, offset.map_err(bad)?, size.map_err(bad)?);
                let handle = self.handle(fh)?;
                let Handle::Dir(listing) = &*handle else {
                    return Err(libc::EBADF);
                };
                // With attributes, each entry's path is the directory's (built once) and
                // its name.
                let dir = if opcode == op::READDIRPLUS {
                    Some(self.path(ino)?)
                } else {
                    None
                };
                let room = (size as usize).min(w.room());
                let mut out = vec![0u8; room];
                let mut dw = Writer::new(&mut out);
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (entry_ino, kind, name)) in listing.entries.iter().enumerate().skip(skip) {
                    let dirent = (*entry_ino, (i + 1) as u64, dtype(*kind), name.as_str());
                    let Some(dir) = &dir else {
                        if !proto::dirent(&mut dw, dirent) {
                            break;
                        }
                        continue;
                    };
                    // `.` and `..` go without attributes (the kernel takes no lookup of
                    // them), and so does a name that no longer leads to the inode listed.
                    let attr = (i >= 2)
                        .then(|| self.fs.lstat(&join(dir, name)).ok())
                        .flatten()
                        .filter(|st| st.ino == *entry_ino)
                        .map(|st| self.attr(&st));
                    if !proto::direntplus(&mut dw, attr.as_ref(), dirent, TTL) {
                        break;
                    }
                    // Counted only once sent: the kernel holds a lookup of each entry it got
                    // with attributes, and forgets it as it forgets a `LOOKUP`'s.
                    if attr.is_some() {
                        self.names_mut().looked_up(*entry_ino, ino, name);
                    }
                }
                let n = dw.len();
                w.bytes(&out[..n])
            }
            op::RELEASEDIR => {
                let fh = r.u64().map_err(bad)?;
                match self.take(fh).as_deref() {
                    Some(Handle::Dir(_)) => Ok(()),
                    _ => Err(libc::EBADF),
                }
            }
            // Metadata operations are durable when they return.
            op::FSYNCDIR => Ok(()),
            op::FALLOCATE => {
                let (fh, offset, length, mode) = (r.u64(), r.u64(), r.u64(), r.u32());
                let (fh, offset, length, mode) = (
                    fh.map_err(bad)?,
                    offset.map_err(bad)?,
                    length.map_err(bad)?,
                    mode.map_err(bad)?,
                );
                self.fallocate(fh, offset, length, mode as i32)
            }
            op::LSEEK => {
                let (fh, offset, whence) = (r.u64(), r.u64(), r.u32());
                let (fh, offset, whence) =
                    (fh.map_err(bad)?, offset.map_err(bad)?, whence.map_err(bad)?);
                let at = self.lseek(fh, offset, whence as i32)?;
                w.u64(at)
            }
            op::COPY_FILE_RANGE => {
                let fields: [Result<u64, Malformed>; 7] = std::array::from_fn(|_| r.u64());
                let [fh_in, off_in, _nodeid_out, fh_out, off_out, len, flags] = fields;
                let (fh_in, off_in, fh_out) = (
                    fh_in.map_err(bad)?,
                    off_in.map_err(bad)?,
                    fh_out.map_err(bad)?,
                );
                let (off_out, len, flags) = (
                    off_out.map_err(bad)?,
                    len.map_err(bad)?,
                    flags.map_err(bad)?,
                );
                if flags != 0 {
                    return Err(libc::EINVAL);
                }
                let copied = self.copy_range(fh_in, off_in, fh_out, off_out, len)?;
                w.u32(copied)?; // fuse_write_out
                w.u32(0)
            }
            op::SETXATTR => {
                let (size, flags) = (r.u32().map_err(bad)?, r.u32().map_err(bad)?);
                let kill_sgid =
                    self.setxattr_ext && r.u32().map_err(bad)? & proto::SETXATTR_ACL_KILL_SGID != 0;
                let end = rest.iter().position(|&b| b == 0).ok_or_else(|| {
                    bad(Malformed("the attribute name is not NUL-terminated".into()))
                })?;
                let name = std::str::from_utf8(&rest[..end])
                    .map_err(|_| bad(Malformed("the attribute name is not UTF-8".into())))?;
                let value = rest[end + 1..].get(..size as usize).ok_or_else(|| {
                    bad(Malformed(format!(
                        "a {size}-byte attribute value in {} bytes",
                        rest.len() - end - 1
                    )))
                })?;
                let how = match flags as i32 {
                    0 => XattrSet::Any,
                    libc::XATTR_CREATE => XattrSet::Create,
                    libc::XATTR_REPLACE => XattrSet::Replace,
                    _ => return Err(libc::EINVAL),
                };
                self.writable()?;
                if self.hides(name) {
                    return Err(libc::EOPNOTSUPP);
                }
                if kill_sgid {
                    return self.on_inode(
                        ino,
                        |path| {
                            self.fs
                                .set_xattr_clearing_sgid(path, name, value, how, false)
                        },
                        |file| file.set_xattr_clearing_sgid(name, value, how),
                    );
                }
                self.on_inode(
                    ino,
                    |path| self.fs.set_xattr(path, name, value, how, false),
                    |file| file.set_xattr(name, value, how),
                )
            }
            op::GETXATTR | op::LISTXATTR => {
                let size = r.u32().map_err(bad)? as usize;
                let value = if opcode == op::GETXATTR {
                    let [name] = proto::names(rest).map_err(bad)?;
                    if self.hides(name) {
                        return Err(libc::ENODATA);
                    }
                    self.on_inode(
                        ino,
                        |path| self.fs.get_xattr(path, name, false),
                        |file| file.get_xattr(name),
                    )?
                } else {
                    // Each name NUL-terminated, one after another.
                    let names = self.on_inode(
                        ino,
                        |path| self.fs.list_xattrs(path, false),
                        |file| Ok(file.list_xattrs()),
                    )?;
                    names
                        .iter()
                        .filter(|n| !self.hides(n))
                        .flat_map(|n| n.bytes().chain([0]))
                        .collect()
                };
                // Size 0 asks how large; a buffer too small is ERANGE, as from the kernel.
                if size == 0 {
                    w.u32(value.len() as u32)?;
                    w.u32(0)
                } else if value.len() > size {
                    Err(libc::ERANGE)
                } else {
                    w.bytes(&value)
                }
            }
            op::REMOVEXATTR => {
                let [name] = proto::names(rest).map_err(bad)?;
                self.writable()?;
                if self.hides(name) {
                    return Err(libc::EOPNOTSUPP);
                }
                self.on_inode(
                    ino,
                    |path| self.fs.remove_xattr(path, name, false),
                    |file| file.remove_xattr(name),
                )
            }
            _ => Err(libc::ENOSYS),
        }
    }

    /// Whether attribute `name` is a POSIX ACL on a mount without ACLs: what the volume
    /// holds stays, unseen and unchanged, since the kernel would not enforce it.
    fn hides(&self, name: &str) -> bool {
        !self.acl && (name == fs::ACL_ACCESS || name == fs::ACL_DEFAULT)
    }

    /// Runs `by_path` on the path of `ino` (the inode itself, a symbolic link's own), or
    /// `by_file` on an open handle of it when it has no name left.
    fn on_inode<T>(
        &self,
        ino: u64,
        by_path: impl FnOnce(&str) -> fs::Result<T>,
        by_file: impl FnOnce(&fs::File) -> fs::Result<T>,
    ) -> Result<T, i32> {
        if made(ino) {
            return Err(libc::EOPNOTSUPP);
        }
        if let Ok(path) = self.path(ino) {
            return by_path(&path).map_err(|e| errno(&e));
        }
        // The table is locked for the look-up only, never across a file system call.
        let handle = self
            .handles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .find(|h| matches!(&***h, Handle::File(f) if f.ino() == ino))
            .cloned();
        match handle.as_deref() {
            Some(Handle::File(file)) => by_file(file).map_err(|e| errno(&e)),
            _ => Err(libc::ENOENT),
        }
    }

    fn file_open_flags(&self) -> u32 {
        if self.direct_io {
            proto::FOPEN_DIRECT_IO | proto::FOPEN_PARALLEL_DIRECT_WRITES
        } else if self.writeback {
            proto::FOPEN_KEEP_CACHE
        } else {
            0
        }
    }

    fn open(&self, ino: u64, flags: u32) -> Result<(u64, u32), i32> {
        if made(ino) {
            if flags as i32 & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(libc::EACCES);
            }
            let handle = match ino {
                STATUS_INO => Handle::Made(self.status()),
                CHECK_INO => Handle::Made(self.check()?),
                _ => {
                    let started = self.scrubber.start(&self.fs).map_err(|e| errno(&e))?;
                    tracing::info!(
                        scrub = started.id,
                        "scrubbing the file data for `locus scrub`"
                    );
                    Handle::Scrub(Mutex::default())
                }
            };
            // Direct I/O: the kernel reads to the end of the bytes, whatever the size said.
            return Ok((self.add(handle), proto::FOPEN_DIRECT_IO));
        }
        let options = self.open_options(flags);
        if options.write {
            self.writable()?;
        }
        let path = self.path(ino)?;
        let file = self.fs.open_file(&path, options).map_err(|e| errno(&e))?;
        if file.ino() != ino {
            return Err(libc::ESTALE);
        }
        Ok((self.add(Handle::File(file)), self.file_open_flags()))
    }

    fn read(&self, arg: &[u8], buf: &mut [u8]) -> Result<usize, i32> {
        let mut r = Reader::new(arg, "fuse_read_in");
        let (fh, offset, size) = (r.u64(), r.u64(), r.u32());
        let (fh, offset, size) = (fh.map_err(bad)?, offset.map_err(bad)?, size.map_err(bad)?);
        let size = (size as usize).min(buf.len());
        let handle = self.handle(fh)?;
        match &*handle {
            Handle::Made(bytes) => Ok(copy_out(bytes, offset, &mut buf[..size])),
            Handle::Scrub(status) => {
                let mut status = lock(status);
                if offset == 0 {
                    *status = self.scrub_status();
                }
                Ok(copy_out(&status, offset, &mut buf[..size]))
            }
            Handle::Dir(_) => Err(libc::EISDIR),
            Handle::File(file) => {
                let mut done = 0;
                while done < size {
                    let n = file
                        .read_at(&mut buf[done..size], offset + done as u64)
                        .map_err(|e| errno(&e))?;
                    if n == 0 {
                        break;
                    }
                    done += n;
                }
                Ok(done)
            }
        }
    }

    fn write(&self, arg: &[u8], buf: &mut [u8], in_len: usize) -> Result<usize, i32> {
        let mut r = Reader::new(arg, "fuse_write_in");
        let (fh, offset, size, write_flags) = (r.u64(), r.u64(), r.u32(), r.u32());
        let (fh, offset, size) = (fh.map_err(bad)?, offset.map_err(bad)?, size.map_err(bad)?);
        let write_flags = write_flags.map_err(bad)?;
        let size = size as usize;
        if size > in_len {
            return Err(bad(Malformed(format!(
                "a write of {size} bytes carries {in_len}"
            ))));
        }
        let handle = self.handle(fh)?;
        let Handle::File(file) = &*handle else {
            return Err(libc::EBADF);
        };
        // Before the data, as the kernel's file systems do: a set-user-ID program is never
        // on the media with a stranger's bytes and its privileges.
        if write_flags & proto::WRITE_KILL_SUIDGID != 0 {
            file.drop_privileges().map_err(|e| errno(&e))?;
        }
        file.write_at(&buf[..size], offset).map_err(|e| errno(&e))?;
        let mut w = Writer::new(buf);
        w.u32(size as u32)?;
        w.u32(0)?;
        Ok(w.len())
    }

    /// `SETATTR`: `Err(None)` is a malformed request.
    fn setattr(&self, ino: u64, r: &mut Reader<'_>) -> Result<Attr, Result<i32, Malformed>> {
        let valid = r.u32().map_err(Err)?;
        r.skip(4).map_err(Err)?;
        let fh = r.u64().map_err(Err)?;
        let size = r.u64().map_err(Err)?;
        r.skip(8).map_err(Err)?; // lock_owner
        let atime = r.u64().map_err(Err)?;
        let mtime = r.u64().map_err(Err)?;
        r.skip(8).map_err(Err)?; // ctime
        let atimensec = r.u32().map_err(Err)?;
        let mtimensec = r.u32().map_err(Err)?;
        r.skip(4).map_err(Err)?; // ctimensec
        let mode = r.u32().map_err(Err)?;
        r.skip(4).map_err(Err)?;
        let uid = r.u32().map_err(Err)?;
        let gid = r.u32().map_err(Err)?;
        let has = |bit: u32| valid & bit != 0;
        let done = (|| {
            if made(ino) {
                return Err(libc::EPERM);
            }
            self.writable()?;
            let path = self.path(ino);
            let handle = if has(fattr::FH) {
                Some(self.handle(fh)?)
            } else if path.is_err() {
                // No name (`fchmod`, `futimens` of a file unlinked while open or made by
                // `O_TMPFILE`): through a handle.
                self.open_file(ino)
            } else {
                None
            };
            let file = match handle.as_deref() {
                Some(Handle::File(f)) => Some(f),
                _ => None,
            };
            if has(fattr::SIZE) {
                match file {
                    Some(file) => file.set_len(size),
                    None => self.fs.truncate(path.as_deref().map_err(|&e| e)?, size),
                }
                .map_err(|e| errno(&e))?;
            }
            // `chown`: the kernel checked that the caller may (`default_permissions`).
            // The change clears set-ID bits itself, in the same record.
            if has(fattr::UID) || has(fattr::GID) {
                let uid = has(fattr::UID).then_some(uid);
                let gid = has(fattr::GID).then_some(gid);
                match file {
                    Some(file) => file.set_owner(uid, gid),
                    None => {
                        let path = path.as_deref().map_err(|&e| e)?;
                        self.fs.set_owner(path, uid, gid, false)
                    }
                }
                .map_err(|e| errno(&e))?;
            }
            if has(fattr::MODE) {
                match file {
                    Some(file) => file.chmod(mode & 0o7777),
                    None => self
                        .fs
                        .chmod(path.as_deref().map_err(|&e| e)?, mode & 0o7777),
                }
                .map_err(|e| errno(&e))?;
            }
            // A truncation by a process without CAP_FSETID (a change of owner was flagged
            // too, and cleared the bits above).
            if has(fattr::KILL_SUIDGID) {
                match file {
                    Some(file) => file.drop_privileges(),
                    None => self.fs.drop_privileges(path.as_deref().map_err(|&e| e)?),
                }
                .map_err(|e| errno(&e))?;
            }
            let when = |set: u32, now: u32, secs: u64, nsec: u32| {
                if has(now) {
                    Some(now_ns())
                } else if has(set) {
                    Some(
                        secs.saturating_mul(1_000_000_000)
                            .saturating_add(u64::from(nsec)),
                    )
                } else {
                    None
                }
            };
            let atime = when(fattr::ATIME, fattr::ATIME_NOW, atime, atimensec);
            let mtime = when(fattr::MTIME, fattr::MTIME_NOW, mtime, mtimensec);
            if atime.is_some() || mtime.is_some() {
                match (file, path.as_deref()) {
                    (Some(file), _) => file.set_times(atime, mtime),
                    (None, Ok(path)) => self.fs.set_times(path, atime, mtime, false),
                    (None, Err(&e)) => return Err(e),
                }
                .map_err(|e| errno(&e))?;
            }
            let st = self.stat(ino)?;
            Ok(self.attr(&st))
        })();
        done.map_err(Ok)
    }

    fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> Result<(), i32> {
        self.writable()?;
        let exchange = flags == libc::RENAME_EXCHANGE;
        if flags & !libc::RENAME_NOREPLACE != 0 && !exchange {
            return Err(libc::EINVAL); // RENAME_WHITEOUT, or flags together
        }
        let _ns = lock(&self.namespace);
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        if exchange {
            let (a, b) = (self.ino_of(&from), self.ino_of(&to));
            self.fs.exchange(&from, &to).map_err(|e| errno(&e))?;
            let mut names = self.names_mut();
            if let (Some(a), Some(b)) = (a, b)
                && a != b
            {
                names.moved(a, (parent, name), newparent, newname);
                names.moved(b, (newparent, newname), parent, name);
            }
            return Ok(());
        }
        // Names change only under the namespace lock: nothing can create `to` between the
        // look and the rename.
        let (moving, replaced) = (self.ino_of(&from), self.ino_of(&to));
        if flags & libc::RENAME_NOREPLACE != 0 && replaced.is_some() {
            return Err(libc::EEXIST);
        }
        self.fs.rename(&from, &to).map_err(|e| errno(&e))?;
        if moving.is_some() && moving == replaced {
            // Two names of one file: the rename changed nothing (POSIX), both stay.
            return Ok(());
        }
        let mut names = self.names_mut();
        if let Some(replaced) = replaced {
            names.removed(replaced, newparent, newname);
        }
        if let Some(moving) = moving {
            names.moved(moving, (parent, name), newparent, newname);
        }
        Ok(())
    }

    fn statfs(&self, w: &mut Writer<'_>) -> Result<(), i32> {
        let space = self.fs.space();
        let (total, free, files) = (space.total_bytes, space.free_bytes, space.files);
        let block = u64::from(BLOCK);
        w.u64(total / block)?; // blocks
        w.u64(free / block)?; // bfree
        w.u64(space.available_bytes / block)?; // bavail
        w.u64(files + free / block)?; // files
        w.u64(free / block)?; // ffree
        w.u32(BLOCK)?; // bsize
        w.u32(fs::MAX_NAME as u32)?; // namelen
        w.u32(BLOCK)?; // frsize
        w.zeros(4 + 6 * 4) // padding, spare
    }

    fn listing(&self, ino: u64) -> Result<Listing, i32> {
        let path = self.path(ino)?;
        let here = self.fs.lstat(&path).map_err(|e| errno(&e))?;
        if here.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        let parent = match path.rsplit_once('/') {
            Some(("", _)) | None => fs::ROOT_INO,
            Some((parent, _)) => self.fs.lstat(parent).map_or(fs::ROOT_INO, |s| s.ino),
        };
        let mut entries = vec![
            (here.ino, Kind::Dir, ".".to_owned()),
            (parent, Kind::Dir, "..".to_owned()),
        ];
        let listed = self.fs.readdir(&path).map_err(|e| errno(&e))?;
        entries.extend(listed.into_iter().map(|e| (e.ino, e.kind, e.name)));
        Ok(Listing { entries })
    }

    fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> Result<(), i32> {
        self.writable()?;
        let handle = self.handle(fh)?;
        let Handle::File(file) = &*handle else {
            return Err(libc::EBADF);
        };
        if length == 0 || i64::try_from(offset).is_err() || i64::try_from(length).is_err() {
            return Err(libc::EINVAL);
        }
        file.fallocate(mode, offset, length).map_err(|e| errno(&e))
    }

    /// `copy_file_range` inside the volume: `len` bytes (fewer at the source's end) from
    /// `off_in` of one open file to `off_out` of another (or the same: the kernel refused
    /// overlapping ranges), without the data travelling through the kernel twice. Holes
    /// stay holes: only the source's data ranges are copied; a hole over existing bytes of
    /// the target is punched there, one beyond its end is left for the size to cover. Each
    /// piece is atomic and durable as a write is; the count of bytes copied is the reply.
    fn copy_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32, i32> {
        // The file system's chunk: aligned whole pieces map as one run each.
        const CHUNK: u64 = 2 << 20;
        self.writable()?;
        let (src, dst) = (self.handle(fh_in)?, self.handle(fh_out)?);
        let (Handle::File(src), Handle::File(dst)) = (&*src, &*dst) else {
            return Err(libc::EBADF);
        };
        // The reply counts in 32 bits; whole blocks, so a longer copy goes on aligned.
        let len = len.min(u64::from(u32::MAX) & !u64::from(BLOCK - 1));
        let end = off_in.saturating_add(len).min(src.len());
        if end <= off_in {
            return Ok(0);
        }
        let out_end = off_out.checked_add(end - off_in).ok_or(libc::EFBIG)?;
        let fail = |e: FsError| errno(&e);
        let target = |at: u64| off_out + (at - off_in);
        // A hole of the source: zeros over what the target holds there, nothing past it.
        let hole = |from: u64, to: u64| -> Result<(), i32> {
            let held = dst.len().min(target(to));
            if target(from) < held {
                dst.punch_hole(target(from), held - target(from))
                    .map_err(fail)?;
            }
            Ok(())
        };
        let mut buf = vec![0u8; CHUNK.min(end - off_in) as usize];
        let mut at = off_in;
        for data in src.data_ranges(off_in, end - off_in).map_err(fail)? {
            hole(at, data.start)?;
            at = data.start;
            while at < data.end {
                let n = CHUNK.min(data.end - at) as usize;
                let got = src.read_at(&mut buf[..n], at).map_err(fail)?;
                if got == 0 {
                    break;
                }
                dst.write_at(&buf[..got], target(at)).map_err(fail)?;
                at += got as u64;
            }
        }
        hole(at, end)?;
        if dst.len() < out_end {
            dst.set_len(out_end).map_err(fail)?;
        }
        Ok((end - off_in) as u32)
    }

    fn lseek(&self, fh: u64, offset: u64, whence: i32) -> Result<u64, i32> {
        let handle = self.handle(fh)?;
        let Handle::File(file) = &*handle else {
            return Err(libc::EBADF);
        };
        let size = file.len();
        if i64::try_from(offset).is_err() || offset >= size {
            return Err(libc::ENXIO);
        }
        let ranges = file
            .data_ranges(offset, size - offset)
            .map_err(|e| errno(&e))?;
        match whence {
            libc::SEEK_DATA => ranges
                .first()
                .map(|r| r.start.max(offset))
                .ok_or(libc::ENXIO),
            libc::SEEK_HOLE => Ok(match ranges.first() {
                Some(r) if r.start <= offset => ranges
                    .windows(2)
                    .find(|w| w[0].end < w[1].start)
                    .map_or_else(|| ranges.last().map_or(size, |r| r.end), |w| w[0].end),
                _ => offset,
            }),
            _ => Err(libc::EINVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_renames_removals_and_forgets() {
        let mut n = Names::default();
        n.looked_up(2, 1, "a");
        n.looked_up(3, 2, "b");
        n.looked_up(4, 3, "c");
        n.looked_up(5, 1, "ab");
        assert_eq!(n.path(4), Ok("/a/b/c".to_owned()));
        // A directory's rename moves everything below it with it.
        n.looked_up(6, 1, "z");
        n.moved(2, (1, "a"), 6, "y");
        assert_eq!(n.path(2), Ok("/z/y".to_owned()));
        assert_eq!(n.path(4), Ok("/z/y/b/c".to_owned()));
        assert_eq!(
            n.path(5),
            Ok("/ab".to_owned()),
            "a sibling sharing the prefix stays"
        );
        n.removed(5, 1, "ab");
        assert_eq!(n.path(5), Err(libc::ESTALE));
        assert_eq!(n.child(1, "x"), Ok("/x".to_owned()));
        assert_eq!(n.child(3, "x"), Ok("/z/y/b/x".to_owned()));
        assert_eq!(n.child(1, STATUS_NAME), Err(libc::EPERM));
        assert_eq!(n.child(1, CHECK_NAME), Err(libc::EPERM));
        assert_eq!(n.child(1, "a/b"), Err(libc::EINVAL));
        // An inode stays until the kernel forgets every lookup it was given.
        n.looked_up(4, 3, "c");
        n.forget(4, 1);
        assert_eq!(n.path(4), Ok("/z/y/b/c".to_owned()));
        n.forget(4, 1);
        assert_eq!(n.path(4), Err(libc::ESTALE));
        n.forget(1, u64::MAX);
        assert_eq!(n.path(1), Ok("/".to_owned()), "the root is never forgotten");
        assert_eq!(n.len(), 4, "the root, /z, /z/y and /z/y/b");
    }
}
