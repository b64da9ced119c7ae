//! `locus mount`: the volume's file system served to the kernel over FUSE, so that every
//! process on the machine uses its files through ordinary system calls — shells' pipelines,
//! a second `sqlite3` reading a live database, rsync's two processes — while one daemon owns
//! the volume.
//!
//! The kernel speaks of inodes, the file system of paths: [`Names`] keeps the path of every
//! inode the kernel has looked up (FUSE inode numbers are the file system's, the root is 1 in
//! both) and follows renames and removals; open files are `fs::File` handles by FUSE file
//! handle, so a file unlinked while open stays usable. Symbolic links are resolved by the
//! kernel (it asks `readlink` and walks on), so every path handed to the file system is free
//! of links.
//!
//! Semantics: no write-back cache is negotiated, so a `write(2)` that returns has been
//! written by the file system — atomic and durable, as through the library. Attributes and
//! names are cached by the kernel for [`TTL`]; every change reaches the file system through
//! this mount, so the caches are never stale. Shared `mmap` goes through the kernel's page
//! cache: stores reach the file system when the kernel writes the pages back (`msync`,
//! `munmap`, `fsync`), which is the durability point for mapped stores.
//!
//! The request loop is fuser's, one thread: requests are served one at a time. The file
//! system itself is concurrent; a loop per node over cloned `/dev/fuse` descriptors is the
//! way to serve requests near their CPU (ARCHITECTURE.md, `mount`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fs::{FsError, Kind, OpenOptions, Stat};
use fuser::consts::FOPEN_DIRECT_IO;
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow,
};

/// How long the kernel may keep attributes and names without asking again.
pub const TTL: Duration = Duration::from_secs(1);

/// The block size reported to `stat` and `statfs`.
const BLOCK: u32 = 4096;

/// A read-only file at the root, not listed by `readdir`, whose bytes are the server's live
/// view of the volume as JSON (devices, space, file system counters): how `locus status`
/// reads a volume that a mount holds. Its name cannot be created, removed or renamed.
pub const STATUS_NAME: &str = ".locus-status";
/// The status file's inode number (the file system's numbers never come near it).
const STATUS_INO: u64 = u64::MAX - 1;

/// How a volume is mounted.
#[derive(Debug, Clone, Default)]
pub struct MountConfig {
    /// Refuse every change (`EROFS`), and tell the kernel so.
    pub read_only: bool,
    /// Let other users than the one who mounted use the files (`allow_other`; the kernel
    /// then checks permissions, as it always does here).
    pub allow_other: bool,
}

/// A running mount. [`Mounted::wait`] returns when the kernel unmounts it (`umount`,
/// `fusermount -u`); [`Mounted::unmount`] unmounts it from here.
#[derive(Debug)]
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    /// Whether the kernel has ended the mount.
    pub fn finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts (if the kernel has not already) and waits for the request loop to end.
    pub fn unmount(mut self) -> io::Result<()> {
        self.end()
    }

    fn end(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if session.guard.is_finished() {
            return session
                .guard
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the FUSE request loop panicked")));
        }
        // Dropping the session unmounts and joins the loop.
        session.join();
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// Mounts `fs` at `mountpoint` and serves it from a background thread.
pub fn mount(fs: fs::Fs, mountpoint: &Path, config: &MountConfig) -> io::Result<Mounted> {
    let mut options = vec![
        MountOption::FSName("locus".into()),
        MountOption::Subtype("locus".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    options.push(if config.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    if config.allow_other {
        options.push(MountOption::AllowOther);
    }
    let server = Server::new(fs, config.read_only);
    let session = fuser::spawn_mount2(server, mountpoint, &options)?;
    Ok(Mounted {
        session: Some(session),
    })
}

/// The path of every inode the kernel knows.
#[derive(Debug, Default)]
struct Names {
    paths: HashMap<u64, String>,
}

impl Names {
    fn path(&self, ino: u64) -> Result<&str, i32> {
        self.paths.get(&ino).map(String::as_str).ok_or(libc::ESTALE)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<String, i32> {
        let name = name.to_str().ok_or(libc::EINVAL)?;
        if parent == fs::ROOT_INO && name == STATUS_NAME {
            return Err(libc::EPERM); // the status file's name
        }
        let parent = self.path(parent)?;
        Ok(if parent == "/" {
            format!("/{name}")
        } else {
            format!("{parent}/{name}")
        })
    }

    /// `from` is now `to` (a rename): it and everything below it.
    fn moved(&mut self, from: &str, to: &str) {
        let below = format!("{from}/");
        for path in self.paths.values_mut() {
            if path == from {
                *path = to.to_owned();
            } else if let Some(rest) = path.strip_prefix(&below) {
                *path = format!("{to}/{rest}");
            }
        }
    }

    /// `path` is gone.
    fn removed(&mut self, path: &str) {
        self.paths.retain(|_, p| p != path);
    }
}

/// An open directory: its entries, read at `opendir`.
#[derive(Debug)]
struct Listing {
    entries: Vec<(u64, FileType, String)>,
}

#[derive(Debug)]
enum Handle {
    File(fs::File),
    Dir(Listing),
    /// The status file's bytes, made at `open`.
    Status(Vec<u8>),
}

struct Server {
    fs: fs::Fs,
    read_only: bool,
    names: Names,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
    uid: u32,
    gid: u32,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("read_only", &self.read_only)
            .field("handles", &self.handles.len())
            .finish_non_exhaustive()
    }
}

fn errno(e: &FsError) -> i32 {
    e.errno()
}

fn kind(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn now_ns() -> u64 {
    ns(SystemTime::now())
}

impl Server {
    fn new(fs: fs::Fs, read_only: bool) -> Self {
        let mut names = Names::default();
        names.paths.insert(fs::ROOT_INO, "/".into());
        // The daemon's ids own every file (the file system keeps no owners).
        let (uid, gid) = ids();
        Server {
            fs,
            read_only,
            names,
            handles: HashMap::new(),
            next_handle: 1,
            uid,
            gid,
        }
    }

    fn attr(&self, st: &Stat) -> FileAttr {
        FileAttr {
            ino: st.ino,
            size: st.size,
            blocks: st.allocated.div_ceil(512),
            atime: time(st.atime_ns),
            mtime: time(st.mtime_ns),
            ctime: time(st.ctime_ns),
            crtime: time(st.ctime_ns),
            kind: kind(st.kind),
            perm: (st.mode & 0o7777) as u16,
            nlink: u32::try_from(st.nlink).unwrap_or(u32::MAX),
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
    }

    /// The attributes of `ino`: by path, or through an open handle when the name is gone.
    fn stat(&self, ino: u64) -> Result<Stat, i32> {
        if let Ok(path) = self.names.path(ino) {
            match self.fs.lstat(path) {
                Ok(st) if st.ino == ino => return Ok(st),
                Ok(_) | Err(_) => {}
            }
        }
        self.handles
            .values()
            .find_map(|h| match h {
                Handle::File(f) if f.ino() == ino => Some(f.stat()),
                _ => None,
            })
            .ok_or(libc::ENOENT)
    }

    /// Looks `path` up and remembers it: the entry the kernel caches.
    fn entry(&mut self, path: String) -> Result<FileAttr, i32> {
        let st = self.fs.lstat(&path).map_err(|e| errno(&e))?;
        self.names.paths.insert(st.ino, path);
        Ok(self.attr(&st))
    }

    fn writable(&self) -> Result<(), i32> {
        if self.read_only {
            Err(libc::EROFS)
        } else {
            Ok(())
        }
    }

    fn add(&mut self, handle: Handle) -> u64 {
        let fh = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(fh, handle);
        fh
    }

    fn file(&self, fh: u64) -> Result<&fs::File, i32> {
        match self.handles.get(&fh) {
            Some(Handle::File(f)) => Ok(f),
            Some(Handle::Dir(_)) => Err(libc::EISDIR),
            Some(Handle::Status(_)) => Err(libc::EACCES),
            None => Err(libc::EBADF),
        }
    }

    fn open_options(flags: i32) -> OpenOptions {
        let access = flags & libc::O_ACCMODE;
        OpenOptions {
            read: access != libc::O_WRONLY,
            write: access != libc::O_RDONLY,
            ..OpenOptions::default()
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn set_attr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<u64>,
    ) -> Result<FileAttr, i32> {
        if ino == STATUS_INO {
            return Err(libc::EPERM);
        }
        self.writable()?;
        // Owners are the mounting user's; only a no-op change is allowed.
        if owner.0.is_some_and(|u| u != self.uid) || owner.1.is_some_and(|g| g != self.gid) {
            return Err(libc::EPERM);
        }
        let path = self.names.path(ino).map(str::to_owned);
        if let Some(size) = size {
            match fh.map(|fh| self.file(fh)) {
                Some(Ok(file)) => file.set_len(size).map_err(|e| errno(&e))?,
                _ => self
                    .fs
                    .truncate(path.as_deref().map_err(|&e| e)?, size)
                    .map_err(|e| errno(&e))?,
            }
        }
        if let Some(mode) = mode {
            self.fs
                .chmod(path.as_deref().map_err(|&e| e)?, mode & 0o7777)
                .map_err(|e| errno(&e))?;
        }
        if atime.is_some() || mtime.is_some() {
            let when = |t: TimeOrNow| match t {
                TimeOrNow::Now => now_ns(),
                TimeOrNow::SpecificTime(t) => ns(t),
            };
            let (atime, mtime) = (atime.map(when), mtime.map(when));
            match (fh.map(|fh| self.file(fh)), path.as_deref()) {
                (Some(Ok(file)), _) => file.set_times(atime, mtime),
                (_, Ok(path)) => self.fs.set_times(path, atime, mtime, false),
                (_, Err(&e)) => return Err(e),
            }
            .map_err(|e| errno(&e))?;
        }
        let st = self.stat(ino)?;
        Ok(self.attr(&st))
    }

    fn status_attr(&self) -> FileAttr {
        FileAttr {
            ino: STATUS_INO,
            size: 0,
            blocks: 0,
            atime: SystemTime::now(),
            mtime: SystemTime::now(),
            ctime: SystemTime::now(),
            crtime: SystemTime::now(),
            kind: FileType::RegularFile,
            perm: 0o444,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        }
    }

    /// The status file's bytes, now.
    fn status(&self) -> Vec<u8> {
        let volume = self.fs.volume();
        let status = serde_json::json!({
            "server_pid": std::process::id(),
            "uuid": volume::hex(&volume.uuid()),
            "devices": volume.stats(),
            "fs": self.fs.stats(),
        });
        let mut bytes = serde_json::to_vec_pretty(&status).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Removes `name` from `parent` with `op` (unlink or rmdir) and forgets its path.
    fn remove(
        &mut self,
        parent: u64,
        name: &OsStr,
        op: fn(&fs::Fs, &str) -> fs::Result<()>,
    ) -> Result<(), i32> {
        self.writable()?;
        let path = self.names.child(parent, name)?;
        op(&self.fs, &path).map_err(|e| errno(&e))?;
        self.names.removed(&path);
        Ok(())
    }

    fn listing(&self, ino: u64) -> Result<Listing, i32> {
        let path = self.names.path(ino)?;
        let here = self.fs.lstat(path).map_err(|e| errno(&e))?;
        if here.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        let parent = match path.rsplit_once('/') {
            Some(("", _)) | None => fs::ROOT_INO,
            Some((parent, _)) => self.fs.lstat(parent).map_or(fs::ROOT_INO, |s| s.ino),
        };
        let mut entries = vec![
            (here.ino, FileType::Directory, ".".to_owned()),
            (parent, FileType::Directory, "..".to_owned()),
        ];
        let listed = self.fs.readdir(path).map_err(|e| errno(&e))?;
        entries.extend(listed.into_iter().map(|e| (e.ino, kind(e.kind), e.name)));
        Ok(Listing { entries })
    }
}

/// The daemon's user and group (the owner of every file).
fn ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    // /proc/self is owned by the process's effective ids.
    std::fs::metadata("/proc/self").map_or((0, 0), |m| (m.uid(), m.gid()))
}

macro_rules! reply_or {
    ($reply:ident, $result:expr, $ok:ident => $body:expr) => {
        match $result {
            Ok($ok) => $body,
            Err(e) => $reply.error(e),
        }
    };
}

impl Filesystem for Server {
    fn init(&mut self, _req: &Request<'_>, _config: &mut KernelConfig) -> Result<(), i32> {
        Ok(())
    }

    fn destroy(&mut self) {
        self.handles.clear();
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == fs::ROOT_INO && name == STATUS_NAME {
            return reply.entry(&Duration::ZERO, &self.status_attr(), 0);
        }
        let found = self.names.child(parent, name).and_then(|p| self.entry(p));
        reply_or!(reply, found, attr => reply.entry(&TTL, &attr, 0));
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == STATUS_INO {
            return reply.attr(&Duration::ZERO, &self.status_attr());
        }
        reply_or!(reply, self.stat(ino), st => reply.attr(&TTL, &self.attr(&st)));
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let done = self.set_attr(ino, mode, (uid, gid), size, atime, mtime, fh);
        reply_or!(reply, done, attr => reply.attr(&TTL, &attr));
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let target = self
            .names
            .path(ino)
            .and_then(|p| self.fs.readlink(p).map_err(|e| errno(&e)));
        reply_or!(reply, target, t => reply.data(t.as_bytes()));
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.writable().and_then(|()| {
            let path = self.names.child(parent, name)?;
            self.fs
                .mkdir(&path, mode & !umask & 0o7777)
                .map_err(|e| errno(&e))?;
            self.entry(path)
        });
        reply_or!(reply, made, attr => reply.entry(&TTL, &attr, 0));
    }

    fn mknod(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files only: no FIFOs, sockets or device nodes.
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(libc::EPERM);
        }
        let made = self.writable().and_then(|()| {
            let path = self.names.child(parent, name)?;
            let options = OpenOptions {
                create: true,
                exclusive: true,
                mode: mode & !umask & 0o7777,
                ..OpenOptions::default()
            };
            let file = self.fs.open_file(&path, options).map_err(|e| errno(&e))?;
            file.close().map_err(|e| errno(&e))?;
            self.entry(path)
        });
        reply_or!(reply, made, attr => reply.entry(&TTL, &attr, 0));
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _newparent: u64,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // One name per inode (as through the preload library).
        reply.error(libc::EPERM);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let done = self.remove(parent, name, fs::Fs::unlink);
        reply_or!(reply, done, _d => reply.ok());
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let done = self.remove(parent, name, fs::Fs::rmdir);
        reply_or!(reply, done, _d => reply.ok());
    }

    fn symlink(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let made = self.writable().and_then(|()| {
            let path = self.names.child(parent, link_name)?;
            let target = target.to_str().ok_or(libc::EINVAL)?;
            self.fs.symlink(target, &path).map_err(|e| errno(&e))?;
            self.entry(path)
        });
        reply_or!(reply, made, attr => reply.entry(&TTL, &attr, 0));
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let done = self.writable().and_then(|()| {
            let from = self.names.child(parent, name)?;
            let to = self.names.child(newparent, newname)?;
            if flags & !libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EINVAL); // RENAME_EXCHANGE, RENAME_WHITEOUT
            }
            // One request at a time: nothing can create `to` between the look and the rename.
            if flags & libc::RENAME_NOREPLACE != 0 && self.fs.lstat(&to).is_ok() {
                return Err(libc::EEXIST);
            }
            self.fs.rename(&from, &to).map_err(|e| errno(&e))?;
            self.names.removed(&to);
            self.names.moved(&from, &to);
            Ok(())
        });
        reply_or!(reply, done, _d => reply.ok());
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if ino == STATUS_INO {
            if flags & libc::O_ACCMODE != libc::O_RDONLY {
                return reply.error(libc::EACCES);
            }
            let status = self.status();
            // Direct I/O: the kernel reads to the end of the bytes, whatever the size said.
            return reply.opened(self.add(Handle::Status(status)), FOPEN_DIRECT_IO);
        }
        let opened = (|| {
            let options = Self::open_options(flags);
            if options.write {
                self.writable()?;
            }
            let path = self.names.path(ino)?.to_owned();
            let file = self.fs.open_file(&path, options).map_err(|e| errno(&e))?;
            if file.ino() != ino {
                return Err(libc::ESTALE);
            }
            Ok(self.add(Handle::File(file)))
        })();
        reply_or!(reply, opened, fh => reply.opened(fh, 0));
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if let Some(Handle::Status(bytes)) = self.handles.get(&fh) {
            let from = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let to = from.saturating_add(size as usize).min(bytes.len());
            return reply.data(&bytes[from..to]);
        }
        let read = self.file(fh).and_then(|file| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            let mut buf = vec![0u8; size as usize];
            let mut done = 0;
            while done < buf.len() {
                let n = file
                    .read_at(&mut buf[done..], offset + done as u64)
                    .map_err(|e| errno(&e))?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            buf.truncate(done);
            Ok(buf)
        });
        reply_or!(reply, read, data => reply.data(&data));
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let written = self.file(fh).and_then(|file| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            file.write_at(data, offset).map_err(|e| errno(&e))?;
            Ok(data.len() as u32)
        });
        reply_or!(reply, written, n => reply.written(n));
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _owner: u64, reply: ReplyEmpty) {
        // Every write is durable when it returns: nothing is held back.
        match self.handles.get(&fh) {
            Some(Handle::File(_) | Handle::Status(_)) => reply.ok(),
            Some(Handle::Dir(_)) => reply.error(libc::EISDIR),
            None => reply.error(libc::EBADF),
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.handles.remove(&fh) {
            Some(Handle::File(file)) => match file.close() {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            },
            Some(Handle::Status(_)) => reply.ok(),
            Some(Handle::Dir(_)) | None => reply.error(libc::EBADF),
        }
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _data: bool, reply: ReplyEmpty) {
        let synced = self
            .file(fh)
            .and_then(|f| f.sync_all().map_err(|e| errno(&e)));
        reply_or!(reply, synced, _s => reply.ok());
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let opened = self
            .listing(ino)
            .map(|listing| self.add(Handle::Dir(listing)));
        reply_or!(reply, opened, fh => reply.opened(fh, 0));
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(Handle::Dir(listing)) = self.handles.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        let skip = usize::try_from(offset).unwrap_or(0);
        for (i, (ino, kind, name)) in listing.entries.iter().enumerate().skip(skip) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some(Handle::Dir(listing)) = self.handles.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        let entries: Vec<_> = listing
            .entries
            .iter()
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(0))
            .map(|(i, e)| (i, e.clone()))
            .collect();
        let Ok(dir) = self.names.path(ino).map(str::to_owned) else {
            return reply.error(libc::ESTALE);
        };
        for (i, (_, _, name)) in entries {
            let path = match name.as_str() {
                "." => dir.clone(),
                ".." => match dir.rsplit_once('/') {
                    Some(("", _)) | None => "/".to_owned(),
                    Some((parent, _)) => parent.to_owned(),
                },
                _ if dir == "/" => format!("/{name}"),
                _ => format!("{dir}/{name}"),
            };
            let Ok(attr) = self.entry(path) else {
                continue; // removed since opendir
            };
            if reply.add(attr.ino, (i + 1) as i64, &name, &TTL, &attr, 0) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        reply: ReplyEmpty,
    ) {
        match self.handles.remove(&fh) {
            Some(Handle::Dir(_)) => reply.ok(),
            _ => reply.error(libc::EBADF),
        }
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _d: bool, reply: ReplyEmpty) {
        // Metadata operations are durable when they return.
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let stats = self.fs.volume().stats();
        let total: u64 = stats.iter().map(|d| d.capacity_bytes).sum();
        let free: u64 = stats.iter().map(|d| d.free_bytes).sum();
        let files = self.fs.stats().inodes;
        let block = u64::from(BLOCK);
        reply.statfs(
            total / block,
            free / block,
            free / block,
            files + free / block,
            free / block,
            BLOCK,
            fs::MAX_NAME as u32,
            BLOCK,
        );
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self.writable().and_then(|()| {
            let path = self.names.child(parent, name)?;
            let options = OpenOptions {
                create: true,
                exclusive: flags & libc::O_EXCL != 0,
                truncate: flags & libc::O_TRUNC != 0,
                mode: mode & !umask & 0o7777,
                ..Self::open_options(flags)
            };
            let file = self.fs.open_file(&path, options).map_err(|e| errno(&e))?;
            let attr = self.attr(&file.stat());
            self.names.paths.insert(attr.ino, path);
            Ok((attr, self.add(Handle::File(file))))
        });
        reply_or!(reply, made, made => reply.created(&TTL, &made.0, 0, made.1, 0));
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let done = self.writable().and_then(|()| {
            let file = self.file(fh)?;
            let (offset, length) = match (u64::try_from(offset), u64::try_from(length)) {
                (Ok(o), Ok(l)) if l > 0 => (o, l),
                _ => return Err(libc::EINVAL),
            };
            let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
            match mode {
                0 if end > file.len() => file.set_len(end).map_err(|e| errno(&e)),
                0 | libc::FALLOC_FL_KEEP_SIZE => Ok(()),
                m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                    file.punch_hole(offset, length).map_err(|e| errno(&e))
                }
                _ => Err(libc::EOPNOTSUPP),
            }
        });
        reply_or!(reply, done, _d => reply.ok());
    }

    fn lseek(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let found = self.file(fh).and_then(|file| {
            let offset = u64::try_from(offset).map_err(|_| libc::ENXIO)?;
            let size = file.len();
            if offset >= size {
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
        });
        reply_or!(reply, found, at => reply.offset(at as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(paths: &[(u64, &str)]) -> Names {
        Names {
            paths: paths.iter().map(|&(i, p)| (i, p.to_owned())).collect(),
        }
    }

    #[test]
    fn a_rename_moves_the_name_and_everything_below_it_only() {
        let mut n = names(&[(1, "/"), (2, "/a"), (3, "/a/b"), (4, "/a/b/c"), (5, "/ab")]);
        n.moved("/a", "/z/y");
        assert_eq!(n.path(2), Ok("/z/y"));
        assert_eq!(n.path(3), Ok("/z/y/b"));
        assert_eq!(n.path(4), Ok("/z/y/b/c"));
        assert_eq!(n.path(5), Ok("/ab"), "a sibling sharing the prefix stays");
        n.removed("/ab");
        assert_eq!(n.path(5), Err(libc::ESTALE));
        assert_eq!(n.child(1, OsStr::new("x")), Ok("/x".to_owned()));
        assert_eq!(n.child(3, OsStr::new("x")), Ok("/z/y/b/x".to_owned()));
    }
}
