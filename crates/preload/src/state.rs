//! The process-wide state: configuration, the mount (taken lazily, released at `fork` when
//! idle and at exit), the table of locus fds, directory streams, and the fork handlers.
//!
//! Lock order: `MOUNT` → `FDS` → `STREAMS` → the lock table → `APPEND`. A locus call never
//! holds one of them while it calls into the file system, except `MOUNT` (read), which a
//! path operation holds so that `fork` cannot unmount under it.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use fs::{Fs, FsError, FsOptions};
use parking_lot::{Mutex, RwLock};

use crate::locks::{Locks, Owner, Space};
use crate::path::{Mount, Target};
use crate::{errno, real};

/// What the environment asked for.
#[derive(Debug)]
pub(crate) struct Config {
    /// `LOCUS_MOUNT` (default `/locus`).
    pub mount: Mount,
    /// `LOCUS_VOLUME` (default `/dev/shm/locus`); a directory without a volume gets the
    /// embedded default on first use, as with the `locus` binary.
    pub volume: PathBuf,
    /// `LOCUS_SYSFS` (default `/sys`).
    pub sysfs: PathBuf,
}

/// The default mount prefix.
pub const DEFAULT_MOUNT: &str = "/locus";
/// The default volume directory (the `locus` binary's default too).
pub const DEFAULT_VOLUME: &str = "/dev/shm/locus";

static CONFIG: OnceLock<Option<Config>> = OnceLock::new();

/// The configuration; `None` (after one message on stderr) when it is unusable, in which
/// case every path is the kernel's.
pub(crate) fn config() -> Option<&'static Config> {
    CONFIG
        .get_or_init(|| {
            let _inside = Guard::enter();
            match read_config() {
                Ok(config) => Some(config),
                Err(problem) => {
                    eprintln!("locus preload: disabled: {problem}");
                    None
                }
            }
        })
        .as_ref()
}

fn read_config() -> Result<Config, String> {
    let prefix = std::env::var("LOCUS_MOUNT").unwrap_or_else(|_| DEFAULT_MOUNT.into());
    let mount = Mount::new(&prefix)?;
    let volume = match std::env::var_os("LOCUS_VOLUME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_VOLUME),
    };
    let volume = std::path::absolute(&volume)
        .map_err(|e| format!("LOCUS_VOLUME={}: {e}", volume.display()))?;
    use std::os::unix::ffi::OsStrExt;
    if let Target::Locus { .. } = mount.classify(volume.as_os_str().as_bytes()) {
        return Err(format!(
            "the volume directory {} lies under LOCUS_MOUNT={prefix}",
            volume.display()
        ));
    }
    let sysfs = std::env::var_os("LOCUS_SYSFS").map_or_else(|| PathBuf::from("/sys"), PathBuf::from);
    Ok(Config {
        mount,
        volume,
        sysfs,
    })
}

thread_local! {
    /// Set while this thread runs locus code: every call it makes passes straight to libc.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as running locus code until dropped.
#[derive(Debug)]
pub(crate) struct Guard {
    outer: bool,
}

impl Guard {
    pub(crate) fn enter() -> Self {
        Self {
            outer: INSIDE.with(|i| i.replace(true)),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        INSIDE.with(|i| i.set(self.outer));
    }
}

/// True while this thread runs locus code (its own calls must reach libc).
pub(crate) fn inside() -> bool {
    INSIDE.with(Cell::get)
}

/// Runs a locus operation: marks the thread, turns a panic into `EIO`.
pub(crate) fn run<T>(op: impl FnOnce() -> Result<T, c_int>) -> Result<T, c_int> {
    let _inside = Guard::enter();
    catch_unwind(AssertUnwindSafe(op)).unwrap_or_else(|_| {
        eprintln!("locus preload: internal error (panic); the call fails with EIO");
        Err(libc::EIO)
    })
}

// ---------------------------------------------------------------------------------------
// The mount.

static MOUNT: RwLock<Option<Fs>> = RwLock::new(None);
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Runs `op` on the mounted file system, mounting it first if needed. The mount stays held
/// (shared) for the duration, so `fork` cannot release it underneath.
pub(crate) fn with_fs<T>(op: impl FnOnce(&Fs) -> Result<T, c_int>) -> Result<T, c_int> {
    loop {
        {
            let mounted = MOUNT.read();
            if let Some(fs) = mounted.as_ref() {
                return op(fs);
            }
        }
        let mut mounted = MOUNT.write();
        if mounted.is_none() {
            *mounted = Some(mount()?);
        }
    }
}

fn mount() -> Result<Fs, c_int> {
    let config = config().ok_or(libc::EIO)?;
    let opened = (|| -> Result<Fs, FsError> {
        let topology = topology::Topology::read_from(&config.sysfs)
            .map_err(|e| FsError::Invalid(format!("reading the NUMA topology: {e}")))?;
        if volume::VolumeConfig::read(&config.volume)?.is_none() {
            let created = fs::create_default_volume(&config.volume, &topology)?;
            eprintln!(
                "locus preload: no volume at {}; created the embedded default ({} emulated \
                 device(s), one per NUMA node) with an empty file system",
                config.volume.display(),
                created.devices.len()
            );
        }
        let volume = volume::Volume::open(&config.volume, topology, &Default::default())?;
        Fs::open(Arc::new(volume), FsOptions::default())
    })();
    opened.map_err(|e| {
        let errno = match &e {
            FsError::Volume(volume::VolumeError::InUse { .. }) => libc::EBUSY,
            FsError::Volume(volume::VolumeError::NoVolume { .. }) | FsError::NoFileSystem => {
                libc::ENODEV
            }
            other => other.errno(),
        };
        // Once per process: programs then print their usual message for the errno.
        if !REPORTED.swap(true, Ordering::Relaxed) {
            eprintln!(
                "locus preload: cannot mount {} (volume {}): {e}",
                String::from_utf8_lossy(config.mount.prefix()),
                config.volume.display()
            );
        }
        errno
    })
}

/// Unmounts cleanly at process exit (checkpoint, snapshot), unless another thread is busy
/// in the file system: then the exit is a crash, which recovery handles.
extern "C" fn unmount_at_exit() {
    let _inside = Guard::enter();
    let Some(mut mounted) = MOUNT.try_write_for(std::time::Duration::from_secs(1)) else {
        return;
    };
    if let Some(fs) = mounted.take()
        && let Err(e) = fs.unmount()
    {
        eprintln!("locus preload: unmounting at exit: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Open file descriptions and the fd table.

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Bumped in a forked child: descriptions from before belong to the parent.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The process's advisory locks.
pub(crate) static LOCKS: OnceLock<Locks> = OnceLock::new();
pub(crate) fn locks() -> &'static Locks {
    LOCKS.get_or_init(Locks::default)
}

/// Serializes `O_APPEND` writes (find the end, write there) within the process.
pub(crate) static APPEND: Mutex<()> = Mutex::new(());

/// What an open locus fd refers to.
#[derive(Debug)]
pub(crate) enum Node {
    /// A file.
    File(fs::File),
    /// A directory; its entries are read once per pass (`getdents64`).
    Dir(Mutex<Option<Vec<crate::calls::dir::Entry>>>),
}

/// An open file description: shared by `dup`s, with its own offset and status flags.
#[derive(Debug)]
pub(crate) struct Desc {
    pub id: u64,
    epoch: u64,
    pub node: Node,
    /// The inside path it was opened by.
    pub path: String,
    pub ino: u64,
    /// Access mode and status flags (`O_APPEND`, `O_NONBLOCK`, `O_DIRECT`, ...).
    pub status: AtomicI32,
    /// The file offset (held across a `read`/`write` that uses it).
    pub pos: Mutex<u64>,
}

impl Desc {
    pub(crate) fn new(node: Node, path: String, ino: u64, status: c_int) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            epoch: EPOCH.load(Ordering::Relaxed),
            node,
            path,
            ino,
            status: AtomicI32::new(status),
            pos: Mutex::new(0),
        }
    }

    /// Refuses a description inherited over `fork`: the file system belongs to the parent.
    pub(crate) fn usable(&self) -> Result<(), c_int> {
        if self.epoch == EPOCH.load(Ordering::Relaxed) {
            Ok(())
        } else {
            report_inherited();
            Err(libc::EIO)
        }
    }

    pub(crate) fn file(&self) -> Result<&fs::File, c_int> {
        self.usable()?;
        match &self.node {
            Node::File(file) => Ok(file),
            Node::Dir(_) => Err(libc::EISDIR),
        }
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        if let Some(locks) = LOCKS.get() {
            locks.release(self.ino, Space::Record, Owner::Description(self.id));
            locks.release(self.ino, Space::Flock, Owner::Description(self.id));
        }
    }
}

fn report_inherited() {
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        eprintln!(
            "locus preload: a locus fd inherited over fork cannot be used: the file system \
             belongs to the parent process (close it, or open the file after the parent exits)"
        );
    }
}

/// One fd's entry.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub desc: Arc<Desc>,
    /// `FD_CLOEXEC` as the program set it (the kernel's reservation always has it).
    pub cloexec: bool,
}

const BITMAP_FDS: usize = 1 << 16;
static BITS: [AtomicU64; BITMAP_FDS / 64] = [const { AtomicU64::new(0) }; BITMAP_FDS / 64];
/// Locus fds at or above `BITMAP_FDS` (looked up in the table).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Locus fds plus locus directory streams: zero means `fork` may release the mount.
static OPEN: AtomicUsize = AtomicUsize::new(0);
static FDS: RwLock<Option<HashMap<c_int, Slot>>> = RwLock::new(None);

/// True when `fd` is a locus fd: one relaxed load for fds below 65536.
#[inline]
pub(crate) fn is_locus(fd: c_int) -> bool {
    if fd < 0 {
        return false;
    }
    let fd = fd as usize;
    if fd < BITMAP_FDS {
        BITS[fd / 64].load(Ordering::Relaxed) & (1 << (fd % 64)) != 0
    } else {
        HIGH.load(Ordering::Relaxed) > 0
            && FDS
                .read()
                .as_ref()
                .is_some_and(|t| t.contains_key(&(fd as c_int)))
    }
}

fn mark(fd: c_int, on: bool) {
    let index = fd as usize;
    if index < BITMAP_FDS {
        let bit = 1u64 << (index % 64);
        if on {
            BITS[index / 64].fetch_or(bit, Ordering::Relaxed);
        } else {
            BITS[index / 64].fetch_and(!bit, Ordering::Relaxed);
        }
    } else if on {
        HIGH.fetch_add(1, Ordering::Relaxed);
    } else {
        HIGH.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The entry of a locus fd.
pub(crate) fn slot(fd: c_int) -> Option<Slot> {
    FDS.read().as_ref()?.get(&fd).cloned()
}

/// The description of a locus fd, or `EBADF`.
pub(crate) fn desc(fd: c_int) -> Result<Arc<Desc>, c_int> {
    slot(fd).map(|s| s.desc).ok_or(libc::EBADF)
}

/// Records `fd` (already reserved from the kernel) as a locus fd; returns what it replaced.
pub(crate) fn install(fd: c_int, slot: Slot) -> Option<Slot> {
    let mut fds = FDS.write();
    let replaced = fds.get_or_insert_with(HashMap::new).insert(fd, slot);
    if replaced.is_none() {
        mark(fd, true);
        OPEN.fetch_add(1, Ordering::Relaxed);
    }
    replaced
}

/// Forgets `fd` as a locus fd; returns its entry.
pub(crate) fn uninstall(fd: c_int) -> Option<Slot> {
    let mut fds = FDS.write();
    let removed = fds.as_mut()?.remove(&fd);
    if removed.is_some() {
        mark(fd, false);
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
    removed
}

/// Sets the program's view of `FD_CLOEXEC`.
pub(crate) fn set_cloexec(fd: c_int, cloexec: bool) -> Result<(), c_int> {
    let mut fds = FDS.write();
    let slot = fds
        .as_mut()
        .and_then(|t| t.get_mut(&fd))
        .ok_or(libc::EBADF)?;
    slot.cloexec = cloexec;
    Ok(())
}

/// Drops a description reference the table gave up, outside every lock. A description
/// inherited over `fork` is leaked instead: dropping it would touch the parent's file system.
pub(crate) fn release(slot: Slot) {
    if slot.desc.usable().is_ok() {
        drop(slot);
    } else {
        std::mem::forget(slot);
    }
}

/// Reserves a kernel fd number for a locus fd: a read-only descriptor of `/` with
/// `O_CLOEXEC`. Calls this library does not intercept then fail loudly on it (reading a
/// directory is `EISDIR`, writing it `EBADF`) instead of touching another file, and `close`,
/// `select` and `poll` behave as on a file. `at_least`: the lowest acceptable number.
pub(crate) fn reserve(at_least: Option<c_int>) -> Result<c_int, c_int> {
    // SAFETY: plain system calls on a literal path / our own fd.
    let fd = unsafe {
        let fd = real::open(
            c"/".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        );
        match at_least {
            Some(min) if fd >= 0 && fd < min => {
                let moved = real::fcntl(fd, libc::F_DUPFD_CLOEXEC, min as libc::c_ulong);
                let e = errno::get();
                real::close(fd);
                errno::set(e);
                moved
            }
            _ => fd,
        }
    };
    if fd < 0 { Err(errno::get()) } else { Ok(fd) }
}

/// Opens a locus fd for `desc`, returning the number.
pub(crate) fn new_fd(desc: Desc, cloexec: bool) -> Result<c_int, c_int> {
    let fd = reserve(None)?;
    install(
        fd,
        Slot {
            desc: Arc::new(desc),
            cloexec,
        },
    );
    Ok(fd)
}

// ---------------------------------------------------------------------------------------
// Directory streams (`DIR *` handed out by `opendir`/`fdopendir`).

static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static STREAM_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Remembers a stream pointer as ours.
pub(crate) fn add_stream(ptr: usize) {
    STREAMS.lock().get_or_insert_with(HashSet::new).insert(ptr);
    STREAM_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// True when `ptr` is one of our streams.
#[inline]
pub(crate) fn is_stream(ptr: usize) -> bool {
    STREAM_COUNT.load(Ordering::Relaxed) > 0
        && STREAMS.lock().as_ref().is_some_and(|s| s.contains(&ptr))
}

/// Forgets a stream; false when it was not ours.
pub(crate) fn remove_stream(ptr: usize) -> bool {
    let removed = STREAMS.lock().as_mut().is_some_and(|s| s.remove(&ptr));
    if removed {
        STREAM_COUNT.fetch_sub(1, Ordering::Relaxed);
    }
    removed
}

// ---------------------------------------------------------------------------------------
// fork and exit.

/// Before `fork`: take every lock so the child gets consistent state; if no locus fd is
/// open, release the mount (unmount cleanly, dropping the volume lock) so the child — or the
/// program it executes — can mount the volume itself.
extern "C" fn before_fork() {
    let _inside = Guard::enter();
    // SAFETY (all raw locking here): each lock taken is released by exactly one of
    // `after_fork_parent` / `after_fork_child`, in the same thread of the same process
    // image, before either returns.
    std::mem::forget(MOUNT.write());
    std::mem::forget(FDS.write());
    std::mem::forget(STREAMS.lock());
    std::mem::forget(locks().mutex().lock());
    std::mem::forget(APPEND.lock());
    if OPEN.load(Ordering::Relaxed) == 0 {
        // SAFETY: we hold MOUNT exclusively (forgotten guard above).
        let mounted = unsafe { &mut *MOUNT.data_ptr() };
        if let Some(fs) = mounted.take()
            && let Err(e) = fs.unmount()
        {
            eprintln!("locus preload: unmounting before fork: {e}");
        }
    }
}

fn unlock_all() {
    // SAFETY: `before_fork` took each of these locks in this thread and forgot the guards.
    unsafe {
        APPEND.force_unlock();
        locks().mutex().force_unlock();
        STREAMS.force_unlock();
        FDS.force_unlock_write();
        MOUNT.force_unlock_write();
    }
}

extern "C" fn after_fork_parent() {
    unlock_all();
}

/// In the child: descriptions and a mount inherited from the parent are the parent's. They
/// are never used (every call on them fails with `EIO`) and never dropped (that would run the
/// parent's file system code on shared persistent memory); the child mounts on its own once
/// the parent has let go of the volume.
extern "C" fn after_fork_child() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the lock is held by this thread (before_fork).
    let mounted = unsafe { &mut *MOUNT.data_ptr() };
    if let Some(fs) = mounted.take() {
        std::mem::forget(fs);
    }
    locks().clear();
    unlock_all();
}

/// Registers the fork and exit handlers (run once, from the library's constructor).
pub(crate) fn install_handlers() {
    // SAFETY: the handlers are `extern "C" fn()` with static lifetime.
    unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
        libc::atexit(unmount_at_exit);
    }
}
