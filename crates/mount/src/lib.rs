//! `locus mount`: the volume's file system served to the kernel over FUSE, so that every
//! process on the machine uses its files through ordinary system calls — shells' pipelines,
//! a second `sqlite3` reading a live database, rsync's two processes — while one daemon owns
//! the volume.
//!
//! locus speaks the FUSE protocol itself ([`proto`], [`server`]): the `fuser` crate only
//! mounts (it knows `mount(2)` and `fusermount3`), because its request loop is a single
//! thread reading `/dev/fuse` and its `INIT` cannot ask for FUSE over io_uring.
//!
//! Transports. With FUSE over io_uring (Linux 6.14+, `fuse.enable_uring=Y`) the kernel has a
//! request queue per CPU; locus serves queue *c* on a thread pinned to CPU *c*, so a request
//! is served on the CPU that made it and neither wake-up crosses CPUs
//! ([`uring::fuse::FuseRing`]). Otherwise a thread per CPU reads `/dev/fuse` (the kernel
//! hands each request to one reader). `/dev/fuse` is read in both cases: it carries `INIT`,
//! interrupts and forgets, and every request until all io_uring queues are registered.
//!
//! The kernel speaks of inodes, the file system of paths: `server::Names` keeps the path of
//! every inode the kernel has looked up (FUSE inode numbers are the file system's, the root
//! is 1 in both) and follows renames and removals; open files are `fs::File` handles by FUSE
//! file handle, so a file unlinked while open stays usable. Symbolic links are resolved by
//! the kernel (it asks `readlink` and walks on), so every path handed to the file system is
//! free of links.
//!
//! Semantics: by default no write-back cache is negotiated, so a `write(2)` that returns has
//! been written by the file system — atomic and durable, as through the library. With
//! [`MountConfig::writeback_cache`] the kernel keeps written pages in its page cache and
//! sends them later, merged: a write is durable once `fsync`, `fdatasync`, `msync` or the
//! `close` of its file returns (the kernel writes the file's dirty pages back first), or once
//! the kernel writes it back on its own; the server's death loses what it had not sent.
//! Without the cache, regular files are opened for direct I/O when the kernel allows shared
//! mmap of direct-I/O files (Linux 6.6+): reads and writes skip the kernel's page cache (one
//! copy less each way), mappings use it and their stores reach the file system when the
//! kernel writes the pages back (`msync`, `munmap`, `fsync`), which is the durability point
//! for mapped stores. Attributes and names
//! are cached by the kernel for [`TTL`], and so are missing names (negative entries); every
//! change reaches the file system through this mount, so the caches are never stale.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::MountOption;

pub mod proto;
mod server;
mod unmount;

pub use unmount::Unmount;

use proto::{InHeader, init};
use server::{Reply, Server};

/// How long the kernel may keep attributes and names without asking again.
pub const TTL: Duration = Duration::from_secs(1);

/// A read-only file at the root, not listed by `readdir`, whose bytes are the server's live
/// view of the volume as JSON (devices, space, file system counters): how `locus status`
/// reads a volume that a mount holds. Its name cannot be created, removed or renamed.
pub const STATUS_NAME: &str = ".locus-status";
/// The status file's inode number (the file system's numbers never come near it).
const STATUS_INO: u64 = u64::MAX - 1;

/// A read-only file at the root, not listed by `readdir`, present when the mount has a
/// [`Checker`]: opening it checks the volume while the file system holds still (requests
/// wait, the checkpoint pauses between passes) and its bytes are the checker's report — how
/// `locus fsck` checks a volume that a mount holds. Its name cannot be created, removed or
/// renamed.
pub const CHECK_NAME: &str = ".locus-fsck";
/// The check file's inode number.
const CHECK_INO: u64 = u64::MAX - 2;

/// A file at the root, readable by the mount's owner only, not listed by `readdir`: opening
/// it starts a scrub of the file data (`fs::Fs::scrub_live`, beside the requests) on a
/// thread of the server's — or joins the one running — and a read of the open file from
/// offset 0 returns that scrub's status as JSON (`fs::ScrubStatus`; reads further on
/// continue the same bytes), so its reader polls until `running` is false: how `locus
/// scrub` scrubs a volume that a mount holds. Its name cannot
/// be created, removed or renamed.
pub const SCRUB_NAME: &str = ".locus-scrub";
/// The scrub file's inode number.
const SCRUB_INO: u64 = u64::MAX - 3;

/// Checks the volume for [`CHECK_NAME`]: called with no request in flight and the
/// checkpoint held ([`fs::Fs::quiesced`]), so the media holds still while it reads them;
/// what it returns is the check file's contents.
#[derive(Clone)]
pub struct Checker(pub Arc<dyn Fn() -> Vec<u8> + Send + Sync>);

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checker")
    }
}

/// The largest write (and read) locus asks one request to carry: 2 MiB, the file system's
/// chunk, so a 2 MiB `write(2)` (from a page-aligned buffer) is one atomic write. The kernel
/// grants at most its limit (see [`request_bytes`]).
const MAX_REQUEST: usize = 2 << 20;
/// The kernel's limit on a request's pages (`fs.fuse.max_pages_limit`, Linux 6.13+; root may
/// raise it). Kernels without it fix the limit at 256 pages.
pub const PAGES_LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";
/// The smallest buffer the kernel accepts for a request (`FUSE_MIN_READ_BUFFER`).
const MIN_BUFFER: usize = 8192;
/// io_uring entries per CPU queue: one being served, one already holding the next request.
const QUEUE_DEPTH: usize = 2;

/// The kernel switch for FUSE over io_uring.
pub const URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// How requests travel between the kernel and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring when the kernel offers it, `/dev/fuse` reads otherwise.
    #[default]
    Auto,
    /// FUSE over io_uring, per-CPU queues; mounting fails when the kernel does not offer it.
    IoUring,
    /// `read(2)`/`write(2)` on `/dev/fuse`, a thread per CPU.
    Read,
}

/// How a volume is mounted.
#[derive(Debug, Clone, Default)]
pub struct MountConfig {
    /// Refuse every change (`EROFS`), and tell the kernel so.
    pub read_only: bool,
    /// Let other users than the one who mounted use the files (`allow_other`; the kernel
    /// then checks permissions, as it always does here).
    pub allow_other: bool,
    /// Keep extended attributes; without, their requests are `ENOSYS`, after which the
    /// kernel stops sending them (each costs a round trip it cannot cache).
    pub xattrs: bool,
    /// Keep POSIX ACLs and have the kernel enforce them (`FUSE_POSIX_ACL`); the server then
    /// applies each create's umask itself, except under a default ACL. Needs `xattrs`.
    pub acl: bool,
    /// How requests travel.
    pub transport: Transport,
    /// Let the kernel cache writes in its page cache and send them later, merged
    /// (`FUSE_WRITEBACK_CACHE`): small writes run at the page cache's speed, and a write is
    /// durable once `fsync`, `fdatasync`, `msync` or the `close` of its file returns, not when
    /// it returns. Mounting fails when the kernel does not offer it.
    pub writeback_cache: bool,
    /// What opening [`CHECK_NAME`] runs (no check file without one).
    pub checker: Option<Checker>,
}

/// What the mount negotiated with the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol minor version in use.
    pub minor: u32,
    /// Requests are served from per-CPU io_uring queues.
    pub io_uring: bool,
    /// Regular files use direct I/O (shared mmap still works).
    pub direct_io: bool,
    /// The kernel caches writes and sends them later ([`MountConfig::writeback_cache`]).
    pub writeback_cache: bool,
    /// With the write-back cache: the kernel still holds the mount's dirty pages to FUSE's
    /// default, a strict 1% share of the machine's dirty limit (lifting it needs root), so a
    /// writer whose cached pages pass that waits for them to be written back.
    pub strict_dirty_limit: bool,
    /// Threads serving requests.
    pub threads: usize,
    /// The most data one request carries: a `write(2)` larger than this reaches the file
    /// system as several writes, each atomic, in order.
    pub max_write: usize,
    /// POSIX ACLs are kept and the kernel enforces them.
    pub acl: bool,
}

/// A running mount. [`Mounted::finished`] says when the kernel has ended it (`umount`,
/// `fusermount -u`); [`Mounted::unmount`] unmounts it from here.
pub struct Mounted {
    session: Option<fuser::Session<Unused>>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    running: Arc<AtomicUsize>,
    server: Arc<Server>,
    negotiated: Negotiated,
    mountpoint: std::path::PathBuf,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("negotiated", &self.negotiated)
            .field("running", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Mounted {
    /// Whether the kernel has ended the mount (every serving thread has returned).
    pub fn finished(&self) -> bool {
        self.running.load(Ordering::Acquire) == 0
    }

    /// What was negotiated with the kernel.
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// Asks the kernel to unmount, and says whether the mount point was busy: then it stays
    /// mounted and served (ask again later), where [`Mounted::unmount`] would wait for as
    /// long as a process keeps a file open or its working directory there. On `Done` the
    /// kernel has written back what it cached and ended the connection, and
    /// [`Mounted::finished`] turns true as the serving threads see it end.
    pub fn request_unmount(&self) -> io::Result<Unmount> {
        unmount::unmount(&self.mountpoint)
    }

    /// Unmounts (if the kernel has not already) and waits for the serving threads to end.
    pub fn unmount(mut self) -> io::Result<()> {
        self.end()
    }

    fn end(&mut self) -> io::Result<()> {
        // Dropping the session unmounts; the threads then see the connection end.
        drop(self.session.take());
        let mut first = Ok(());
        for thread in self.threads.drain(..) {
            let ended = thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a FUSE serving thread panicked")));
            if first.is_ok() {
                first = ended;
            }
        }
        self.server.close_all();
        self.server.stop_scrub();
        first
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// fuser mounts; locus serves. Its loop is never run.
struct Unused;
impl fuser::Filesystem for Unused {}

/// Mounts `fs` at `mountpoint` and serves it from background threads.
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
    let session = fuser::Session::new(Unused, mountpoint, &options)?;
    let mut dev = File::from(session.as_fd().try_clone_to_owned()?);
    let mut server = Server::new(fs, config.read_only, config.checker.clone());
    server.set_xattrs(config.xattrs);
    let wanted = Wanted {
        transport: config.transport,
        acl: config.xattrs && config.acl,
        writeback: config.writeback_cache && !config.read_only,
    };
    let hello = handshake(&mut dev, wanted)?;
    // The write-back cache needs the page cache: direct I/O only without it.
    let direct_io = hello.direct_io && !hello.writeback;
    server.set_direct_io(direct_io);
    server.set_writeback(hello.writeback);
    server.set_max_write(hello.max_write);
    server.set_acl(hello.acl, hello.setxattr_ext);
    if hello.io_uring {
        server.set_queues(possible_cpus());
    }
    let server = Arc::new(server);

    let cpus = online_cpus();
    let running = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    let spawn = |name: String, work: Box<dyn FnOnce() -> io::Result<()> + Send>| {
        running.fetch_add(1, Ordering::AcqRel);
        let running = Arc::clone(&running);
        std::thread::Builder::new().name(name).spawn(move || {
            let ended = work();
            if let Err(e) = &ended {
                tracing::error!(error = %e, "a FUSE serving thread stopped");
            }
            running.fetch_sub(1, Ordering::AcqRel);
            ended
        })
    };
    let readers = if hello.io_uring { 1 } else { cpus.len().max(2) };
    for i in 0..readers {
        let dev = dev.try_clone()?;
        let server = Arc::clone(&server);
        threads.push(spawn(
            format!("locus-fuse-{i}"),
            Box::new(move || serve_dev(dev, &server, hello.max_write)),
        )?);
    }
    if hello.io_uring {
        for qid in 0..possible_cpus() {
            let fd = dev.as_fd().try_clone_to_owned()?;
            let server = Arc::clone(&server);
            let pin = cpus.contains(&qid).then_some(qid);
            threads.push(spawn(
                format!("locus-fuse-q{qid}"),
                Box::new(move || serve_queue(fd, qid, pin, &server, hello.max_write)),
            )?);
        }
    }
    // With the write-back cache, dirty pages of this mount are held to the machine's dirty
    // limits, as a kernel file system's are, instead of FUSE's default (a strict 1% share).
    let strict_dirty_limit = hello.writeback
        && match lift_strict_dirty_limit(mountpoint) {
            Ok(()) => false,
            Err(why) => {
                tracing::warn!(
                    problem = %why,
                    "the kernel holds this mount's dirty pages to FUSE's strict 1% share of the \
                     dirty limit: writers wait for write-back once that much is cached"
                );
                true
            }
        };
    let negotiated = Negotiated {
        minor: hello.minor,
        io_uring: hello.io_uring,
        direct_io,
        writeback_cache: hello.writeback,
        strict_dirty_limit,
        threads: threads.len(),
        max_write: hello.max_write,
        acl: hello.acl,
    };
    tracing::info!(?negotiated, "FUSE connection set up");
    Ok(Mounted {
        session: Some(session),
        threads,
        running,
        server,
        negotiated,
        mountpoint: mountpoint.to_owned(),
    })
}

/// Where the kernel keeps the write-back settings of the file system mounted at `mountpoint`
/// (its backing device, named by the mount's device number).
fn bdi_dir(mountpoint: &Path) -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    Ok(Path::new("/sys/class/bdi").join(format!("{}:{}", libc::major(dev), libc::minor(dev))))
}

/// Turns off the strict dirty limit the kernel gives every FUSE mount (`strict_limit`: its
/// dirty pages may not pass its share of the dirty limit — 1% for FUSE — even while the
/// machine as a whole is far below it), so that this mount's dirty pages count against the
/// machine's limits as a kernel file system's do. Needs root; `Err` says why not. Called
/// once the server answers requests (finding the mount's device asks it for the root's
/// attributes).
fn lift_strict_dirty_limit(mountpoint: &Path) -> Result<(), String> {
    let dir = bdi_dir(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let file = dir.join("strict_limit");
    std::fs::write(&file, "0").map_err(|e| format!("{}: {e}", file.display()))
}

/// The bytes of data one request may carry: [`MAX_REQUEST`], or the kernel's limit when that
/// is lower. Asking for more than the limit would not get larger requests (the kernel cuts
/// them to its limit), but the io_uring buffers must hold what is asked.
fn request_bytes() -> usize {
    let pages = std::fs::read_to_string(PAGES_LIMIT)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(256);
    pages.clamp(1, MAX_REQUEST / 4096) * 4096
}

/// What `INIT` settled.
#[derive(Debug)]
struct Hello {
    minor: u32,
    io_uring: bool,
    direct_io: bool,
    /// The kernel caches writes (`WRITEBACK_CACHE` granted).
    writeback: bool,
    /// The most data one request carries.
    max_write: usize,
    /// The kernel enforces POSIX ACLs the server keeps.
    acl: bool,
    /// SETXATTR requests carry `setxattr_flags`.
    setxattr_ext: bool,
}

/// What the server asks of the kernel in `INIT`.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    transport: Transport,
    /// POSIX ACLs enforced by the kernel.
    acl: bool,
    /// The write-back cache (refused by the kernel: the mount fails).
    writeback: bool,
}

/// Answers the kernel's `INIT`, the first request on a new connection.
fn handshake(dev: &mut File, asked: Wanted) -> io::Result<Hello> {
    let Wanted {
        transport,
        acl,
        writeback,
    } = asked;
    let max_write = request_bytes();
    let mut buf = vec![0u8; max_write.max(MIN_BUFFER) + 4096];
    let n = loop {
        match dev.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let h = InHeader::parse(&buf[..n]).map_err(|e| io::Error::other(e.0))?;
    if h.opcode != proto::op::INIT {
        return Err(io::Error::other(format!(
            "the kernel's first FUSE request is opcode {}, not INIT",
            h.opcode
        )));
    }
    let mut r = proto::Reader::new(&buf[proto::IN_HEADER..n], "fuse_init_in");
    let to_io = |e: proto::Malformed| io::Error::other(e.0);
    let (major, minor) = (r.u32().map_err(to_io)?, r.u32().map_err(to_io)?);
    let max_readahead = r.u32().map_err(to_io)?;
    let flags = u64::from(r.u32().map_err(to_io)?);
    let offered = if flags & init::INIT_EXT != 0 {
        flags | u64::from(r.u32().map_err(to_io)?) << 32
    } else {
        flags
    };
    if major != proto::MAJOR || minor < proto::MIN_MINOR {
        let error = -libc::EPROTO;
        reply(dev, h.unique, error, &[])?;
        return Err(io::Error::other(format!(
            "the kernel speaks FUSE {major}.{minor}; locus needs {}.{} or newer",
            proto::MAJOR,
            proto::MIN_MINOR
        )));
    }
    let minor = minor.min(proto::MAX_MINOR);
    let io_uring = match transport {
        Transport::Read => false,
        Transport::Auto => offered & init::OVER_IO_URING != 0,
        Transport::IoUring if offered & init::OVER_IO_URING != 0 => true,
        Transport::IoUring => {
            reply(dev, h.unique, -libc::EPROTO, &[])?;
            return Err(io::Error::other(format!(
                "the kernel does not offer FUSE over io_uring (Linux 6.14 or newer with \
                 `echo Y > {URING_SWITCH}` as root)"
            )));
        }
    };
    let direct_io = offered & init::DIRECT_IO_ALLOW_MMAP != 0;
    let mut wanted = init::ASYNC_READ
        | init::BIG_WRITES
        | init::PARALLEL_DIROPS
        | init::MAX_PAGES
        | init::HANDLE_KILLPRIV_V2
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO
        | init::INIT_EXT
        | init::DIRECT_IO_ALLOW_MMAP;
    if io_uring {
        wanted |= init::OVER_IO_URING;
    }
    if writeback {
        if offered & init::WRITEBACK_CACHE == 0 {
            reply(dev, h.unique, -libc::EPROTO, &[])?;
            return Err(io::Error::other(
                "the kernel does not offer FUSE's write-back cache (--writeback-cache)",
            ));
        }
        wanted |= init::WRITEBACK_CACHE;
    }
    if acl {
        // The kernel applies no umask then (a default ACL replaces it); the server does.
        wanted |= init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
    }
    let granted = wanted & offered;
    let acl = granted & init::POSIX_ACL != 0;
    let setxattr_ext = granted & init::SETXATTR_EXT != 0;
    let mut out = [0u8; 64];
    let mut w = proto::Writer::new(&mut out);
    let fill = (|| {
        w.u32(proto::MAJOR)?;
        w.u32(minor)?;
        w.u32(max_readahead)?;
        w.u32(granted as u32)?;
        w.u16(64)?; // max_background
        w.u16(48)?; // congestion_threshold
        w.u32(max_write as u32)?;
        w.u32(1)?; // time_gran: nanoseconds
        w.u16((max_write / 4096) as u16)?; // max_pages
        w.u16(0)?; // map_alignment
        w.u32((granted >> 32) as u32)?; // flags2
        w.zeros(28)
    })();
    fill.map_err(io::Error::from_raw_os_error)?;
    reply(dev, h.unique, 0, &out)?;
    Ok(Hello {
        minor,
        io_uring,
        direct_io,
        writeback: granted & init::WRITEBACK_CACHE != 0,
        max_write,
        acl,
        setxattr_ext,
    })
}

/// Writes one reply to `/dev/fuse`.
fn reply(dev: &mut File, unique: u64, error: i32, args: &[u8]) -> io::Result<()> {
    let mut header = [0u8; proto::OUT_HEADER];
    let len = (proto::OUT_HEADER + args.len()) as u32;
    header[0..4].copy_from_slice(&len.to_ne_bytes());
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    let written = dev.write_vectored(&[IoSlice::new(&header), IoSlice::new(args)]);
    match written {
        Ok(n) if n == len as usize => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "the kernel took {n} of a {len}-byte FUSE reply"
        ))),
        // The request was interrupted and is gone: nothing to answer.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Serves requests read from `/dev/fuse` until the connection ends.
fn serve_dev(mut dev: File, server: &Server, max_write: usize) -> io::Result<()> {
    let mut buf = vec![0u8; max_write.max(MIN_BUFFER) + 4096];
    server.start_thread();
    loop {
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // Interrupted, or a request that was interrupted before we read it.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                // Unmounted (or aborted): the connection is over.
                Some(libc::ENODEV | libc::ECONNABORTED) => return Ok(()),
                _ => return Err(e),
            },
        };
        server.count_dev();
        let h = match InHeader::parse(&buf[..n]) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(problem = %e, "malformed FUSE request header; ignored");
                continue;
            }
        };
        let body = &mut buf[proto::IN_HEADER..n.max(proto::IN_HEADER)];
        let split = proto::arg_bytes(h.opcode, server.setxattr_ext()).min(body.len());
        let body_len = body.len();
        // Names and data follow the argument struct; the reply is written over them.
        let whole = &mut buf[proto::IN_HEADER..];
        let (arg, rest) = whole.split_at_mut(split);
        let served = server.serve(&h, arg, rest, body_len - split);
        let (error, len) = match served {
            Ok(Reply::None) => continue,
            Ok(Reply::Out(len)) => (0, len),
            Err(e) => (-e, 0),
        };
        reply(&mut dev, h.unique, error, &rest[..len])?;
    }
}

/// Serves io_uring queue `qid` (requests made on CPU `qid`) on this thread, pinned to that
/// CPU when it is online.
fn serve_queue(
    fd: std::os::fd::OwnedFd,
    qid: usize,
    pin: Option<usize>,
    server: &Server,
    max_write: usize,
) -> io::Result<()> {
    let mut node = None;
    if let Some(cpu) = pin {
        if let Err(e) = topology::pin_current_thread(&[cpu as topology::CpuId]) {
            tracing::warn!(cpu, error = %e, "cannot pin the FUSE queue's thread");
        }
        node = cpu_node(cpu);
    }
    let qid = u16::try_from(qid).map_err(|_| io::Error::other("more than 65536 CPUs"))?;
    let mut ring =
        uring::fuse::FuseRing::new(fd, qid, QUEUE_DEPTH, max_write.max(MIN_BUFFER), node)?;
    server.start_thread();
    while let Some(entry) = ring.next_request()? {
        server.count_queue(usize::from(qid));
        let request = ring.request(entry);
        let (error, len) = match InHeader::parse(request.header) {
            Ok(h) => match server.serve(&h, request.op_in, request.payload, request.payload_len) {
                Ok(Reply::Out(len)) => (0, len),
                // No reply on the ring: forgets and interrupts come through /dev/fuse.
                Ok(Reply::None) => (0, 0),
                Err(e) => (-e, 0),
            },
            Err(e) => {
                tracing::error!(problem = %e, "malformed FUSE request header on io_uring");
                (-libc::EIO, 0)
            }
        };
        ring.commit(entry, error, len)?;
    }
    Ok(())
}

/// The CPUs this process may run on.
fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpus = topology::cpulist::parse(text.trim()).unwrap_or_default();
    let cpus: Vec<usize> = cpus.into_iter().map(|c| c as usize).collect();
    if cpus.is_empty() { vec![0] } else { cpus }
}

/// How many queues the kernel makes: one per possible CPU.
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    topology::cpulist::parse(text.trim())
        .ok()
        .and_then(|c| c.into_iter().max())
        .map_or(1, |max| max as usize + 1)
}

/// The NUMA node of `cpu`, for its queue's buffers.
fn cpu_node(cpu: usize) -> Option<u32> {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
}
