//! The process-wide state: configuration, the mount (taken lazily, released at `fork` when
//! idle and at exit), the table of locus fds, directory streams, and the fork handlers.
//!
//! Lock order ([`rank`], checked in debug builds by `fs::lock_order`): `MOUNT` → `PENDING` →
//! `FDS` → `STREAMS` → the record-lock table → `APPEND` → a description's offset → the table
//! of shared mappings → a mapped file's copy → the list of copies → the file system's own
//! locks. A locus call holds `MOUNT` (read) while it calls into the file system, so that
//! `fork` cannot unmount under it, and `APPEND` or an offset while a write or read through
//! them runs; never the tables.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use fs::lock_order::{Ordered, Rank};
use fs::{Fs, FsError, FsOptions};
use parking_lot::{Mutex, RwLock};

use crate::path::{MountPrefix, Target};
use crate::{errno, real};

/// What the environment asked for.
#[derive(Debug)]
pub(crate) struct Config {
    /// `LOCUS_MOUNT` (default `/locus`).
    pub mount: MountPrefix,
    /// `LOCUS_VOLUME` (default `/dev/shm/locus`); a directory without a volume gets the
    /// embedded default on first use, as with the `locus` binary.
    pub volume: PathBuf,
    /// `LOCUS_SYSFS` (default `/sys`).
    pub sysfs: PathBuf,
    /// `LOCUS_BUSY_WAIT` (seconds, default [`DEFAULT_BUSY_WAIT`]): how long a mount waits
    /// for another process to let go of the volume before the call fails with `EBUSY`.
    pub busy_wait: std::time::Duration,
}

/// How long a mount waits for another process to let go of the volume, unless
/// `LOCUS_BUSY_WAIT` says otherwise.
pub const DEFAULT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The default mount prefix.
pub const DEFAULT_MOUNT: &str = "/locus";
/// The default volume directory (the `locus` binary's default too).
pub const DEFAULT_VOLUME: &str = volume::DEFAULT_DIR;

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
    let mount = MountPrefix::new(&prefix)?;
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
    let sysfs =
        std::env::var_os("LOCUS_SYSFS").map_or_else(|| PathBuf::from("/sys"), PathBuf::from);
    let busy_wait = match std::env::var("LOCUS_BUSY_WAIT") {
        Err(_) => DEFAULT_BUSY_WAIT,
        Ok(text) => parse_busy_wait(&text)?,
    };
    Ok(Config {
        mount,
        volume,
        sysfs,
        busy_wait,
    })
}

/// `LOCUS_BUSY_WAIT`: a number of seconds from 0 (fail at once) to an hour.
fn parse_busy_wait(text: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| {
        format!("LOCUS_BUSY_WAIT={text}: not a number of seconds (such as 1 or 0.5)")
    })?;
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(format!(
            "LOCUS_BUSY_WAIT={text}: seconds from 0 (do not wait) to 3600"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

thread_local! {
    /// Set while this thread runs locus code: every call it makes passes straight to libc.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// Set while a mount on this thread must not wait for another holder of the volume
    /// ([`without_busy_wait`]).
    static NO_BUSY_WAIT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `op` with mounts that fail with `EBUSY` at once, silently, when another process
/// holds the volume: for a caller that has an answer of its own then.
pub(crate) fn without_busy_wait<T>(op: impl FnOnce() -> T) -> T {
    let outer = NO_BUSY_WAIT.with(|w| w.replace(true));
    let result = op();
    NO_BUSY_WAIT.with(|w| w.set(outer));
    result
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
    // A load of a line every core keeps shared; a store only after a release request
    // cleared it.
    if !ACTIVE.load(Ordering::Relaxed) {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    let _inside = Guard::enter();
    catch_unwind(AssertUnwindSafe(op)).unwrap_or_else(|_| {
        eprintln!("locus preload: internal error (panic); the call fails with EIO");
        Err(libc::EIO)
    })
}

// ---------------------------------------------------------------------------------------
// The mount.

/// The library's lock ranks, in order; all below the file system's (`fs::lock_order`).
pub(crate) mod rank {
    use fs::lock_order::Rank;

    pub(crate) const MOUNT: Rank = Rank::new(1, "the preload mount");
    pub(crate) const PENDING: Rank = Rank::new(2, "the list of suspended fds");
    pub(crate) const FDS: Rank = Rank::new(3, "the fd table");
    pub(crate) const STREAMS: Rank = Rank::new(4, "the set of directory streams");
    pub(crate) const LOCK_TABLE: Rank = Rank::new(5, "the record-lock table");
    pub(crate) const APPEND: Rank = Rank::new(6, "the append lock");
    pub(crate) const POSITION: Rank = Rank::new(7, "a description's offset");
    pub(crate) const MAPS: Rank = Rank::new(8, "the table of shared mappings");
    pub(crate) const COPY: Rank = Rank::new(9, "a mapped file's copy in memory");
    pub(crate) const COPIES: Rank = Rank::new(10, "the list of mapped files' copies");
    pub(crate) const DAMAGE: Rank = Rank::new(11, "a mapped file's list of damaged pages");
}

/// Takes `lock` with its rank.
pub(crate) fn ordered<G>(rank: Rank, lock: impl FnOnce() -> G) -> Ordered<G> {
    Ordered::take(rank, lock)
}

static MOUNT: RwLock<Option<Fs>> = RwLock::new(None);

/// Held by a call that changes the file system without going through [`with_fs`] (a
/// write-back of mapped stores at `msync` or `munmap`), as `with_fs` holds it: so that
/// `locus fsck`'s check through the control socket finds no change in progress.
pub(crate) fn calls_held() -> Ordered<parking_lot::RwLockReadGuard<'static, Option<Fs>>> {
    ordered(rank::MOUNT, || MOUNT.read())
}
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Runs `op` on the mounted file system, mounting it first if needed. The mount stays held
/// (shared) for the duration, so `fork` cannot release it underneath.
pub(crate) fn with_fs<T>(op: impl FnOnce(&Fs) -> Result<T, c_int>) -> Result<T, c_int> {
    loop {
        {
            let mounted = ordered(rank::MOUNT, || MOUNT.read());
            if let Some(fs) = mounted.as_ref() {
                return op(fs);
            }
        }
        let mut mounted = ordered(rank::MOUNT, || MOUNT.write());
        if mounted.is_none() {
            // The file system's threads (checkpoint, defragmentation, the volume's monitor)
            // start in the mount and inherit this thread's signal mask: with every signal
            // blocked there, a signal sent to the process reaches one of the program's
            // threads. (A program that blocks a signal in its own threads and waits for it
            // with `sigwait` or a signalfd would otherwise see it taken — and acted on with
            // its default action, often the end of the process — by a thread of ours.)
            let fs = topology::with_signals_blocked(mount)?;
            crate::suspended::sweep(&fs);
            follow_cwd(&fs);
            start_control(&fs);
            let id = volume_id(&fs);
            MOUNTED_VOLUME[0].store((id >> 64) as u64, Ordering::Relaxed);
            MOUNTED_VOLUME[1].store(id as u64, Ordering::Relaxed);
            *mounted = Some(fs);
            *MOUNTED_AT.lock() = Some(std::time::Instant::now());
        }
    }
}

/// The control socket of the mounted volume (`fs::control`): `locus status` and `locus
/// scrub` of the volume this process holds ask here. Started after each mount, under
/// `MOUNT` (write), and stopped under it before each unmount, so that it never outlives the
/// file system it answers for; a `fork` or the exit stops it (and a scrub it runs).
static CONTROL: Mutex<Option<fs::control::Control>> = Mutex::new(None);

/// How long `locus fsck` of the volume waits for the program's locus calls in progress to end
/// (one may wait itself, for a record lock another thread holds: the check then gives up).
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The control socket's check of the volume (`locus fsck`): with no locus call of the
/// program in progress — each holds `MOUNT` shared, and the check holds it exclusively, so
/// the program's threads wait at their next call — and the checkpoint held, the media hold
/// still while they are read. Stores through shared mappings of a file's blocks go on; they
/// change data, never what the check reads.
fn checker(fs: Fs, dir: PathBuf) -> fs::control::Checker {
    Box::new(move || {
        let Some(_calls) = MOUNT.try_write_for(CHECK_WAIT) else {
            return serde_json::json!({
                "error": format!(
                    "a locus call of the program stayed in progress for {} s (waiting for a \
                     lock?); run fsck again",
                    CHECK_WAIT.as_secs()
                )
            });
        };
        let topology = fs.volume().topology().clone();
        fs.quiesced(|| {
            serde_json::to_value(fs::control::check_held(&dir, &topology))
                .unwrap_or_else(|e| serde_json::json!({"error": format!("the report: {e}")}))
        })
    })
}

/// When this process last mounted the volume (`None` while it is not mounted).
static MOUNTED_AT: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// The uuid of the volume this process mounted last, halves high then low (0: none yet):
/// handed over with the fds over `exec`, so that an image that mounts another volume (a
/// different `LOCUS_VOLUME`) does not take one of that volume's files for the fd's.
static MOUNTED_VOLUME: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn mounted_volume() -> u128 {
    (u128::from(MOUNTED_VOLUME[0].load(Ordering::Relaxed)) << 64)
        | u128::from(MOUNTED_VOLUME[1].load(Ordering::Relaxed))
}

fn volume_id(fs: &Fs) -> u128 {
    u128::from_be_bytes(fs.volume().uuid())
}

/// How long a mount is kept at least before another process's request makes the library
/// let go of it: each process that waited for the volume gets to use it.
const HOLD_AT_LEAST: std::time::Duration = std::time::Duration::from_millis(20);

/// How many times its mount's cost a process keeps the volume at least before it lets go:
/// two programs that take turns spend at most a fifth of their time mounting (a mount
/// reads the whole snapshot: about 3 µs per file).
const HOLD_PER_MOUNT_COST: u32 = 4;

/// What this process's last mount cost (the file system's open, not the wait before it).
static MOUNT_COST_NS: AtomicU64 = AtomicU64::new(0);

/// How long a mount is kept at least: [`HOLD_AT_LEAST`], or [`HOLD_PER_MOUNT_COST`] times
/// what it cost, whichever is longer.
fn hold_at_least() -> std::time::Duration {
    let cost = std::time::Duration::from_nanos(MOUNT_COST_NS.load(Ordering::Relaxed));
    HOLD_AT_LEAST.max(cost * HOLD_PER_MOUNT_COST)
}

/// Set by every locus call, cleared by each release request ([`idle_now`]): a holder that
/// made no locus call since the last request is quiet — blocked on something else (a full
/// pipe, a terminal) or done with the volume for now — and lets go before its
/// [`hold_at_least`] is over. (Without it, each turn of `sqlite3 a.db .dump | sqlite3 b.db`
/// waited out the hold of a stage stalled on the pipe: 5 MB took 8 s.)
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether the program can let go of the volume for another process between its calls
/// ([`release_now`]) and mount it again at its next locus call, as after a `fork`: it has
/// held the mount for [`hold_at_least`] or is `quiet` (no locus call since the last
/// request, [`ACTIVE`]), and holds nothing that could not be taken up again
/// as it was — no shared mapping, no directory stream, no open file without a name (it
/// could not be reopened). Open files are suspended and reopened at their next use, by inode
/// number, with their offsets, as across a fork ([`reopen`]); the kernel keeps their locks
/// meanwhile ([`crate::locks`]).
fn idle(quiet: bool) -> Result<(), String> {
    if crate::calls::shared::any() {
        return Err("the program has shared mappings of locus files".into());
    }
    if STREAM_COUNT.load(Ordering::Relaxed) > 0 {
        return Err("the program has locus directories open".into());
    }
    if OPEN.load(Ordering::Relaxed) > 0 {
        let nameless = ordered(rank::FDS, || FDS.read())
            .as_ref()
            .is_some_and(|table| table.values().any(FdEntry::is_nameless));
        if nameless {
            return Err("the program has a locus file without a name open".into());
        }
    }
    if !quiet
        && MOUNTED_AT
            .lock()
            .is_some_and(|at| at.elapsed() < hold_at_least())
    {
        return Err("the program mounted the volume just now".into());
    }
    Ok(())
}

/// The control socket's answer to a release request: idle, and no locus call in progress.
fn idle_now() -> Result<(), String> {
    let Some(_calls) = MOUNT.try_write() else {
        ACTIVE.store(true, Ordering::Relaxed);
        return Err("a locus call of the program is in progress".into());
    };
    idle(!ACTIVE.swap(false, Ordering::Relaxed))
}

/// Lets go of the volume for the process that asked (`fs::control::RELEASE_REQUEST`), on a
/// thread of the library's own: with no locus call in progress and the program still idle,
/// stops the control socket, suspends the program's open locus fds and unmounts cleanly, as
/// before a `fork`. The program mounts again at its next locus call (waiting, in turn, for
/// the other to let go), and reopens a suspended fd at its first use.
fn release_now() {
    let Some(mut mounted) = MOUNT.try_write_for(std::time::Duration::from_millis(100)) else {
        return;
    };
    // Quiet still if no call came since the request.
    if mounted.is_none() || idle(!ACTIVE.load(Ordering::Relaxed)).is_err() {
        return;
    }
    let suspended = {
        let mut pending = ordered(rank::PENDING, || PENDING.lock());
        let mut fds = ordered(rank::FDS, || FDS.write());
        // Reads and writes of open fds run without `MOUNT`: one in progress holds its
        // description, which the program keeps the volume for. Lookups threads remember
        // are void from here on, and the fence pairs with the one in `desc`: a call that
        // takes a remembered description either shows here as one more holder of it, or
        // finds the generation moved and looks again (and waits for the table).
        table_changed();
        std::sync::atomic::fence(Ordering::SeqCst);
        if fds.as_ref().is_some_and(descriptions_in_use) {
            return;
        }
        let suspended = suspend_all(&mut fds, &mut pending);
        table_changed();
        suspended
    };
    stop_control();
    // Dropping descriptions closes their files: before the unmount.
    drop(suspended);
    *MOUNTED_AT.lock() = None;
    if let Some(fs) = mounted.take()
        && let Err(e) = fs.unmount()
    {
        eprintln!("locus preload: letting go of the volume for another process: {e}");
    }
    *RELEASED_AT.lock() = Some(std::time::Instant::now());
}

/// When this process last let go of the volume for another that asked ([`release_now`]).
static RELEASED_AT: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// How long a process that let go of the volume for another keeps from mounting it again:
/// the one that asked polls for it every millisecond once told, and must get to it first
/// (a program busy with its open files otherwise took the volume back at once, and a
/// `cat` beside it failed with `EBUSY` in 26 runs of 40).
const GIVE_WAY: std::time::Duration = std::time::Duration::from_millis(5);

/// Before a mount: waits out what is left of [`GIVE_WAY`] after this process let go.
fn give_way_after_release() {
    let Some(at) = RELEASED_AT.lock().take() else {
        return;
    };
    let left = GIVE_WAY.saturating_sub(at.elapsed());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// Whether a description in the fd `table` is held by more than the table's entries: a
/// call of the program is using it.
fn descriptions_in_use(table: &HashMap<c_int, FdEntry>) -> bool {
    let mut entries: HashMap<*const Desc, usize> = HashMap::new();
    for slot in table.values() {
        *entries.entry(Arc::as_ptr(&slot.desc)).or_default() += 1;
    }
    table
        .values()
        .any(|slot| Arc::strong_count(&slot.desc) > entries[&Arc::as_ptr(&slot.desc)])
}

/// Starts answering on the volume's control socket for `fs`, just mounted. A socket that
/// cannot be made (a volume directory this user cannot write, a path too long for a socket
/// address) leaves the volume without one, silently: the program's own work goes on, and
/// `locus status` then names this process as the volume's holder and no more.
fn start_control(fs: &Fs) {
    let Some(config) = config() else {
        return;
    };
    let held = fs.clone();
    // Read when asked (on the control thread), not at every mount.
    let status = move || {
        let volume = held.volume();
        serde_json::json!({
            "server": "preload",
            "server_pid": std::process::id(),
            "program": volume::command_line(std::process::id()).unwrap_or_default(),
            "uuid": volume::hex(&volume.uuid()),
            "devices": volume.stats(),
            "fs": held.stats(),
        })
    };
    let hooks = fs::control::Hooks {
        on_thread: library_thread,
        keep_fd: |fd| {
            use std::os::fd::{FromRawFd, IntoRawFd};
            let moved = move_internal(fd.into_raw_fd());
            // SAFETY: `move_internal` returns the fd it was given or a duplicate it made in
            // its place (closing the given one): ours either way.
            unsafe { std::os::fd::OwnedFd::from_raw_fd(moved) }
        },
    };
    // The thread (and a scrub thread it starts) inherits this thread's signal mask: every
    // signal blocked, as for the file system's threads (`with_fs`).
    let started = topology::with_signals_blocked(|| {
        fs::control::Control::start(
            &config.volume,
            status,
            Some(fs.clone()),
            Some(checker(fs.clone(), config.volume.clone())),
            Some(fs::control::Release {
                idle: Box::new(idle_now),
                release: release_now,
            }),
            hooks,
        )
    });
    if let Ok(control) = started {
        *CONTROL.lock() = Some(control);
    }
}

/// Stops the control socket's thread (a scrub it runs stops too, and is waited for) and
/// removes the socket. Called with `MOUNT` held for writing, before the unmount.
fn stop_control() {
    let control = CONTROL.lock().take();
    drop(control);
}

/// The control thread and the file system's and volume's threads are the library's own:
/// their calls go straight to the C library (a `munmap` of theirs never waits for the table
/// of shared mappings, which a write-back may hold while it waits for the checkpoint), and
/// they may close the fds moved out of the program's way.
fn library_thread() {
    INSIDE.with(|i| i.set(true));
}

/// The mount point of a `locus mount` server that holds the volume (while this process has
/// not mounted it itself): locus paths then go to that mount, through the kernel, instead
/// of failing with `EBUSY`. Found once per process (`volume::find_served`); until then,
/// each locus call before this process mounts looks for the server's record.
pub(crate) fn served_mount() -> Option<&'static [u8]> {
    static SERVED: OnceLock<Vec<u8>> = OnceLock::new();
    if let Some(point) = SERVED.get() {
        return Some(point);
    }
    if ordered(rank::MOUNT, || MOUNT.read()).is_some() {
        return None;
    }
    let config = config()?;
    let served = {
        let _inside = Guard::enter();
        volume::find_served(&config.volume)?
    };
    if served.pid == std::process::id() {
        return None;
    }
    use std::os::unix::ffi::OsStrExt;
    let point = served.mountpoint.as_os_str().as_bytes().to_vec();
    Some(SERVED.get_or_init(|| point))
}

fn mount() -> Result<Fs, c_int> {
    let config = config().ok_or(libc::EIO)?;
    give_way_after_release();
    let opened = (|| -> Result<Fs, FsError> {
        let topology = topology::Topology::read_from(&config.sysfs)
            .map_err(|e| FsError::Invalid(format!("reading the NUMA topology: {e}")))?;
        if volume::VolumeConfig::read(&config.volume)?.is_none() {
            // Refused (NoVolume, so ENODEV) unless it is the default location or an empty
            // directory: a mistyped LOCUS_VOLUME is not a new volume.
            let created = fs::create_default_volume(&config.volume, &topology)?;
            eprintln!(
                "locus preload: no volume at {}; created the embedded default ({} emulated \
                 device(s), one per NUMA node) with an empty file system",
                config.volume.display(),
                created.devices.len()
            );
        }
        // A preloaded program may live for milliseconds: its pages fault in as it uses them
        // rather than all at start (a 4 GiB device took ~0.3 s to map whole).
        let options = volume::OpenOptions {
            prefault: false,
            on_thread: Some(library_thread),
            ..Default::default()
        };
        // Right after `umount` of a `locus mount` of the volume, its server may still be
        // closing it: wait for that rather than fail with EBUSY. Another process holding
        // it is waited for up to `LOCUS_BUSY_WAIT` (`while_busy`).
        let wait = if NO_BUSY_WAIT.with(Cell::get) {
            std::time::Duration::ZERO
        } else {
            config.busy_wait
        };
        let volume = while_busy(wait, &config.volume, || {
            volume::after_stopping_server(
                &config.volume,
                || volume::Volume::open(&config.volume, topology.clone(), &options),
                |_| {},
            )
        })?;
        let options = FsOptions {
            on_thread: Some(library_thread),
            ..FsOptions::default()
        };
        let started = std::time::Instant::now();
        let fs = Fs::open(Arc::new(volume), options)?;
        MOUNT_COST_NS.store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(fs)
    })();
    opened.map_err(|e| {
        let errno = e.errno();
        let answered = NO_BUSY_WAIT.with(Cell::get) && errno == libc::EBUSY;
        // Once per process: programs then print their usual message for the errno.
        if !answered && !REPORTED.swap(true, Ordering::Relaxed) {
            eprintln!(
                "locus preload: cannot mount {} (volume {}): {e}",
                String::from_utf8_lossy(config.mount.prefix()),
                config.volume.display()
            );
        }
        errno
    })
}

/// Runs `open` again while it fails because another process holds the volume (or one of
/// its devices), for up to `wait`: a process often holds a volume for only a moment. A
/// shell's child in a locus working directory resolves `.` while it looks its command up
/// in `PATH` (bash does), which mounts the volume there until the `exec` — so in `ls f |
/// cat` run in /locus, the child about to become `cat` and the `ls` beside it both mount,
/// and without the wait one of them failed with `EBUSY` (`ls` did in about a third of the
/// runs). A holder through this library is asked to let go (`release_now` there); one
/// that keeps files open past `wait` gets the caller `EBUSY` then, and `locus serve`,
/// which never lets go, at once.
fn while_busy<T>(
    wait: std::time::Duration,
    dir: &std::path::Path,
    mut open: impl FnMut() -> Result<T, volume::VolumeError>,
) -> Result<T, volume::VolumeError> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let result = open();
        let busy = matches!(
            &result,
            Err(volume::VolumeError::InUse { .. } | volume::VolumeError::DeviceInUse { .. })
        );
        let left = wait.saturating_sub(started.elapsed());
        if !busy || left.is_zero() {
            return result;
        }
        // A program through this library lets go between its calls when asked (`release_now`
        // there); a holder that never does (`locus serve`) says so, and is not waited for.
        let mut releasing = false;
        if let Err(volume::VolumeError::InUse { .. }) = &result
            && let Some(Ok(reply)) = fs::control::ask(dir, fs::control::RELEASE_REQUEST)
        {
            if reply.get("error").is_some_and(|e| !e.is_null()) {
                return result;
            }
            releasing = reply.get("releasing") == Some(&serde_json::Value::Bool(true));
        }
        // A holder that is letting go gives way for a moment (`GIVE_WAY`): look often.
        if releasing {
            pause = std::time::Duration::from_millis(1);
        }
        std::thread::sleep(pause.min(left));
        if !releasing {
            pause = (pause * 2).min(std::time::Duration::from_millis(20));
        }
    }
}

/// Unmounts cleanly at process exit (checkpoint, snapshot), unless another thread is busy
/// in the file system: then the exit is a crash, which recovery handles.
extern "C" fn unmount_at_exit() {
    // stdio flushes its buffers after the atexit handlers: streams over locus files must
    // write theirs while the file system is still mounted.
    // SAFETY: fflush(NULL) flushes every stream; no arguments to get wrong.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    let _inside = Guard::enter();
    crate::calls::shared::sync_all();
    let Some(mut mounted) = MOUNT.try_write_for(std::time::Duration::from_secs(1)) else {
        return;
    };
    // The process ends: its control thread need not be waited for.
    if let Some(control) = CONTROL.lock().take() {
        control.abandon();
    }
    if PENDING_COUNT.load(Ordering::Relaxed) > 0 {
        let inos: Vec<u64> = ordered(rank::PENDING, || PENDING.lock())
            .iter()
            .map(|h| h.ino)
            .collect();
        crate::suspended::forget(inos);
    }
    if let Some(fs) = mounted.take()
        && let Err(e) = fs.unmount_at_exit()
    {
        eprintln!("locus preload: unmounting at exit: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Open file descriptions and the fd table.

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Bumped in a forked child: descriptions from before belong to the parent.
static EPOCH: AtomicU64 = AtomicU64::new(0);

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
    pub pos: Offset,
    /// Its own fd of the inode's lock file, for its OFD and `flock` locks ([`crate::locks`]),
    /// opened at its first such lock; moved into the handoff when it is suspended.
    lock_fd: Mutex<Option<c_int>>,
}

/// A description's file offset and, once the description has crossed a `fork` or an
/// `exec`, its cell in the table processes share ([`crate::offsets`]). A change made under
/// the lock reaches the cell when the lock is let go: a process that ends without its exit
/// handlers (dash ends with `_exit`) has left its offsets for the next process all the same.
#[derive(Debug)]
pub(crate) struct Offset {
    value: Mutex<u64>,
    /// 0: no cell (yet).
    cell: std::sync::atomic::AtomicU32,
}

impl Offset {
    fn new(value: u64, cell: Option<u32>) -> Self {
        Self {
            value: Mutex::new(value),
            cell: std::sync::atomic::AtomicU32::new(cell.unwrap_or(0)),
        }
    }

    /// The offset, locked (rank [`rank::POSITION`], through [`ordered`]).
    pub(crate) fn lock(&self) -> OffsetGuard<'_> {
        OffsetGuard {
            value: self.value.lock(),
            cell: &self.cell,
        }
    }
}

/// The locked offset; letting go of it stores it into its cell, if it has one.
pub(crate) struct OffsetGuard<'a> {
    value: parking_lot::MutexGuard<'a, u64>,
    cell: &'a std::sync::atomic::AtomicU32,
}

impl std::ops::Deref for OffsetGuard<'_> {
    type Target = u64;
    fn deref(&self) -> &u64 {
        &self.value
    }
}

impl std::ops::DerefMut for OffsetGuard<'_> {
    fn deref_mut(&mut self) -> &mut u64 {
        &mut self.value
    }
}

impl Drop for OffsetGuard<'_> {
    fn drop(&mut self) {
        let cell = self.cell.load(Ordering::Relaxed);
        if cell != 0 {
            crate::offsets::store(cell, *self.value);
        }
    }
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
            pos: Offset::new(0, None),
            lock_fd: Mutex::new(None),
        }
    }

    /// The description's fd of its inode's lock file, opened at the first call.
    pub(crate) fn lock_fd(&self) -> Result<c_int, c_int> {
        let mut fd = self.lock_fd.lock();
        if let Some(fd) = *fd {
            return Ok(fd);
        }
        let opened = crate::locks::open_lock_file(self.ino)?;
        *fd = Some(opened);
        Ok(opened)
    }

    /// A description reopened for one handed over: at `pos`, sharing `cell` with the
    /// processes that hold the same description.
    fn reopened(node: Node, h: &Handoff, path: String, pos: u64, lock_fd: Option<c_int>) -> Self {
        let mut desc = Self::new(node, path, h.ino, h.status);
        desc.pos = Offset::new(pos, h.cell);
        desc.lock_fd = Mutex::new(lock_fd);
        desc
    }

    /// The description's offset cell, taken now (holding the offset) if it has none, for
    /// the description to cross a `fork` or an `exec`; `None` when the table is full or
    /// cannot be made (the offset then crosses by value).
    fn share_offset(&self) -> Option<u32> {
        let pos = ordered(rank::POSITION, || self.pos.lock());
        match self.pos.cell.load(Ordering::Relaxed) {
            0 => {
                let cell = crate::offsets::allocate(*pos)?;
                self.pos.cell.store(cell, Ordering::Relaxed);
                Some(cell)
            }
            cell => Some(cell),
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
    /// The description's last fd closed: its OFD and `flock` locks go with its lock fd.
    fn drop(&mut self) {
        if let Some(fd) = self.lock_fd.get_mut().take() {
            crate::locks::close(fd);
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
pub(crate) struct FdEntry {
    pub desc: Arc<Desc>,
    /// `FD_CLOEXEC` as the program set it (the kernel's reservation always has it).
    pub cloexec: bool,
}

impl FdEntry {
    /// A usable fd of a file with no name (removed while open, or made with `O_TMPFILE`),
    /// which no path leads back to.
    fn is_nameless(&self) -> bool {
        self.desc.usable().is_ok()
            && matches!(&self.desc.node, Node::File(f) if f.stat().nlink == 0)
    }
}

const BITMAP_FDS: usize = 1 << 16;
static BITS: [AtomicU64; BITMAP_FDS / 64] = [const { AtomicU64::new(0) }; BITMAP_FDS / 64];
/// Locus fds at or above `BITMAP_FDS` (looked up in the table).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Locus fds plus locus directory streams: zero means `fork` may release the mount.
static OPEN: AtomicUsize = AtomicUsize::new(0);
static FDS: RwLock<Option<HashMap<c_int, FdEntry>>> = RwLock::new(None);

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

/// The locus fds in `first..=last`, ascending (suspended ones included, as [`is_locus`]
/// counts them).
pub(crate) fn locus_fds_in(first: c_int, last: c_int) -> Vec<c_int> {
    let mut found = Vec::new();
    if first > last || last < 0 {
        return found;
    }
    let first = first.max(0) as usize;
    let bitmap_last = (last as usize).min(BITMAP_FDS - 1);
    if first <= bitmap_last {
        for (word, slot) in BITS
            .iter()
            .enumerate()
            .take(bitmap_last / 64 + 1)
            .skip(first / 64)
        {
            let mut bits = slot.load(Ordering::Relaxed);
            while bits != 0 {
                let fd = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if (first..=bitmap_last).contains(&fd) {
                    found.push(fd as c_int);
                }
            }
        }
    }
    if last as usize >= BITMAP_FDS && HIGH.load(Ordering::Relaxed) > 0 {
        let low = first.max(BITMAP_FDS) as c_int;
        let table = ordered(rank::FDS, || FDS.read());
        let mut high: Vec<c_int> = table
            .as_ref()
            .map(|t| {
                t.keys()
                    .copied()
                    .filter(|fd| (low..=last).contains(fd))
                    .collect()
            })
            .unwrap_or_default();
        high.sort_unstable();
        found.extend(high);
    }
    found
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

/// The entry of a locus fd; a suspended one (see "Suspending fds") is reopened first, and
/// if that cannot happen now (the volume is busy), its error is returned.
pub(crate) fn entry(fd: c_int) -> Result<FdEntry, c_int> {
    loop {
        if PENDING_COUNT.load(Ordering::Relaxed) > 0 {
            adopt_suspended()?;
        }
        let found = ordered(rank::FDS, || FDS.read())
            .as_ref()
            .and_then(|t| t.get(&fd).cloned());
        if let Some(entry) = found {
            return Ok(entry);
        }
        // Suspended between the two looks (the program let go of the volume for another
        // process, on the library's thread): reopened at the next turn of the loop.
        let suspended = ordered(rank::PENDING, || PENDING.lock())
            .iter()
            .any(|h| h.fd == fd);
        if !suspended {
            return Err(libc::EBADF);
        }
    }
}

/// Raised after every change of the fd table (`install`, `uninstall`, `fork`): a thread's
/// cached lookups ([`LOOKUPS`]) hold for the generation they were made in.
static FD_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Lookups a thread remembers.
const CACHED_LOOKUPS: usize = 4;

thread_local! {
    /// This thread's last lookups: fd, the table's generation then, and the description
    /// (weak: a remembered lookup must not keep a closed fd's file open).
    static LOOKUPS: std::cell::RefCell<[(c_int, u64, std::sync::Weak<Desc>); CACHED_LOOKUPS]> =
        const { std::cell::RefCell::new([const { (-1, u64::MAX, std::sync::Weak::new()) }; CACHED_LOOKUPS]) };
}

/// The description of a locus fd. Every read and write asks: a lookup this thread made
/// while the table has not changed since is taken without the table's lock (whose shared
/// counter every thread's calls would otherwise pass back and forth between cores).
pub(crate) fn desc(fd: c_int) -> Result<Arc<Desc>, c_int> {
    let generation = FD_GENERATION.load(Ordering::Acquire);
    let remembered = LOOKUPS
        .try_with(|lookups| {
            lookups
                .borrow()
                .iter()
                .find(|(f, g, _)| *f == fd && *g == generation)
                .and_then(|(_, _, desc)| desc.upgrade())
        })
        .ok()
        .flatten();
    if let Some(desc) = remembered {
        // Pairs with the fence in `release_now`: a release that checked this description's
        // holders before this thread took it has moved the generation by now.
        std::sync::atomic::fence(Ordering::SeqCst);
        if FD_GENERATION.load(Ordering::Relaxed) == generation {
            return Ok(desc);
        }
    }
    let desc = entry(fd)?.desc;
    // Remembered with the generation read before the lookup: a change in between makes the
    // next call look again.
    let _ = LOOKUPS.try_with(|lookups| {
        let mut lookups = lookups.borrow_mut();
        let at = lookups
            .iter()
            .position(|(f, _, _)| *f == fd)
            .unwrap_or(fd as usize % CACHED_LOOKUPS);
        lookups[at] = (fd, generation, Arc::downgrade(&desc));
    });
    Ok(desc)
}

/// The fd table changed: every remembered lookup is void.
fn table_changed() {
    FD_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Records `fd` (already reserved from the kernel) as a locus fd; returns what it replaced.
pub(crate) fn install(fd: c_int, slot: FdEntry) -> Option<FdEntry> {
    let mut fds = ordered(rank::FDS, || FDS.write());
    let replaced = fds.get_or_insert_with(HashMap::new).insert(fd, slot);
    table_changed();
    if replaced.is_none() {
        mark(fd, true);
        OPEN.fetch_add(1, Ordering::Relaxed);
    }
    replaced
}

/// Forgets `fd` as a locus fd; returns its entry (none for a suspended fd, which is simply
/// dropped).
pub(crate) fn uninstall(fd: c_int) -> Option<FdEntry> {
    if PENDING_COUNT.load(Ordering::Relaxed) > 0 {
        let mut pending = ordered(rank::PENDING, || PENDING.lock());
        if let Some(i) = pending.iter().position(|h| h.fd == fd) {
            let closed = pending.swap_remove(i);
            PENDING_COUNT.store(pending.len(), Ordering::Relaxed);
            mark(fd, false);
            if !pending.iter().any(|h| h.ino == closed.ino) {
                crate::suspended::forget([closed.ino]);
            }
            // The description's lock fd goes to another of its fds, or with the last one.
            if closed.lock >= 0 {
                match pending.iter_mut().find(|h| h.group == closed.group) {
                    Some(sibling) => sibling.lock = closed.lock,
                    None => crate::locks::close(closed.lock),
                }
            }
            crate::locks::release_process(closed.ino);
            return None;
        }
    }
    let mut fds = ordered(rank::FDS, || FDS.write());
    let removed = fds.as_mut()?.remove(&fd);
    table_changed();
    if removed.is_some() {
        mark(fd, false);
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
    removed
}

/// Sets the program's view of `FD_CLOEXEC`.
pub(crate) fn set_cloexec(fd: c_int, cloexec: bool) -> Result<(), c_int> {
    let mut fds = ordered(rank::FDS, || FDS.write());
    let slot = fds
        .as_mut()
        .and_then(|t| t.get_mut(&fd))
        .ok_or(libc::EBADF)?;
    slot.cloexec = cloexec;
    Ok(())
}

/// Drops a description reference the table gave up, outside every lock. A description
/// inherited over `fork` is leaked instead: dropping it would touch the parent's file system.
pub(crate) fn release(slot: FdEntry) {
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

/// Moves an fd this library opened for itself (the volume's lock file, its devices) far
/// above the numbers programs pick: shells `dup2` onto 3..9 and 10.. at will, and must not
/// close the volume lock or a device under the file system. The new number is the lowest
/// free one from half the fd limit up (never below 64); if none is free, `fd` stays.
pub(crate) fn move_internal(fd: c_int) -> c_int {
    let base = internal_base();
    if fd >= base {
        INTERNAL.lock().insert(fd);
        return fd;
    }
    // SAFETY: our own fd; the duplicate keeps close-on-exec (the library's fds never cross an
    // exec), the original is closed only when the move succeeded.
    unsafe {
        let moved = real::fcntl(fd, libc::F_DUPFD_CLOEXEC, base as libc::c_ulong);
        if moved < 0 {
            return fd;
        }
        real::close(fd);
        INTERNAL.lock().insert(moved);
        moved
    }
}

/// The library's own fds at or above [`internal_base`]: the program cannot close them
/// (`close`, `close_range`, `closefrom`, a close loop over every number) nor `dup2` onto
/// them. Closing the volume lock's fd would let another process open the volume while this
/// one still writes to it. An fd left below the base (none was free above it) is not
/// protected.
static INTERNAL: Mutex<BTreeSet<c_int>> = Mutex::new(BTreeSet::new());

/// True when `fd` is one of the library's own fds. One comparison for the numbers programs
/// use; a set lookup only at or above half the fd limit.
#[inline]
pub(crate) fn is_internal(fd: c_int) -> bool {
    fd >= internal_base() && INTERNAL.lock().contains(&fd)
}

/// The library's own fds in `first..=last`, ascending.
pub(crate) fn internal_in(first: c_int, last: c_int) -> Vec<c_int> {
    if last < internal_base() {
        return Vec::new();
    }
    INTERNAL.lock().range(first..=last).copied().collect()
}

/// Forgets an internal fd the library itself is closing.
pub(crate) fn forget_internal(fd: c_int) {
    if fd >= internal_base() {
        INTERNAL.lock().remove(&fd);
    }
}

/// Where the library's own fds go: half the soft fd limit (never below 64).
fn internal_base() -> c_int {
    static BASE: OnceLock<c_int> = OnceLock::new();
    *BASE.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-pointer.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        let soft = if ok {
            limit.rlim_cur.min(1 << 20)
        } else {
            1024
        };
        ((soft / 2) as c_int).max(64)
    })
}

/// Opens a locus fd for `desc`, returning the number.
pub(crate) fn new_fd(desc: Desc, cloexec: bool) -> Result<c_int, c_int> {
    let fd = reserve(None)?;
    install(
        fd,
        FdEntry {
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
    ordered(rank::STREAMS, || STREAMS.lock())
        .get_or_insert_with(HashSet::new)
        .insert(ptr);
    STREAM_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// True when `ptr` is one of our streams.
#[inline]
pub(crate) fn is_stream(ptr: usize) -> bool {
    STREAM_COUNT.load(Ordering::Relaxed) > 0
        && ordered(rank::STREAMS, || STREAMS.lock())
            .as_ref()
            .is_some_and(|s| s.contains(&ptr))
}

/// Forgets a stream; false when it was not ours.
pub(crate) fn remove_stream(ptr: usize) -> bool {
    let removed = ordered(rank::STREAMS, || STREAMS.lock())
        .as_mut()
        .is_some_and(|s| s.remove(&ptr));
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
    // Shared mappings first: they hold files open, and stop being the volume's.
    crate::calls::shared::detach_all();
    // SAFETY (all raw locking here): each lock taken is released by exactly one of
    // `after_fork_parent` / `after_fork_child`, in the same thread of the same process
    // image, before either returns.
    std::mem::forget(MOUNT.write());
    // Before any other lock: its thread takes none of the library's, and holds file-system
    // handles the unmount below must not find.
    stop_control();
    std::mem::forget(PENDING.lock());
    std::mem::forget(FDS.write());
    // SAFETY: we hold FDS and PENDING exclusively (forgotten guards above).
    let dropped = unsafe { suspend_all(&mut *FDS.data_ptr(), &mut *PENDING.data_ptr()) };
    table_changed();
    // Dropping descriptions releases their locks: before the lock table is taken.
    drop(dropped);
    std::mem::forget(STREAMS.lock());
    for table in crate::locks::mutexes() {
        std::mem::forget(table.lock());
    }
    std::mem::forget(APPEND.lock());
    // SAFETY: we hold MOUNT exclusively (forgotten guard above).
    let mounted = unsafe { &mut *MOUNT.data_ptr() };
    if let Some(fs) = mounted.take()
        && let Err(e) = fs.unmount()
    {
        eprintln!("locus preload: unmounting before fork: {e}");
    }
}

/// Suspends every open locus fd: its description (path, inode, offset, flags) moves to the
/// pending list, to be reopened on next use by whichever process that is. Returns the
/// descriptions, to be dropped by the caller.
fn suspend_all(
    fds: &mut Option<HashMap<c_int, FdEntry>>,
    pending: &mut Vec<Handoff>,
) -> Vec<FdEntry> {
    let Some(table) = fds.as_mut() else {
        return Vec::new();
    };
    let mut dropped = Vec::with_capacity(table.len());
    // Descriptions of nameless files already moved into memory, by id: the fd that holds each.
    let mut moved = HashMap::new();
    for (fd, slot) in table.drain() {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        if slot.is_nameless() {
            // Reopened by its path, it would be another file or none: its bytes go to a
            // memory file on the same fd instead, and the locus file with its last close.
            keep_in_memory(fd, &slot, &mut moved);
            dropped.push(slot);
        } else if slot.desc.usable().is_ok() {
            pending.push(Handoff::of(fd, &slot, true));
            dropped.push(slot);
        } else {
            mark(fd, false);
            std::mem::forget(slot);
        }
    }
    PENDING_COUNT.store(pending.len(), Ordering::Relaxed);
    crate::suspended::note(pending.iter().map(|h| h.ino));
    dropped
}

/// [`into_memory_file`], or, when that fails, closing `fd` with a message saying why; `fd`
/// is no locus fd afterwards either way.
fn keep_in_memory(fd: c_int, entry: &FdEntry, moved: &mut HashMap<u64, c_int>) {
    if let Err(problem) = into_memory_file(fd, entry, moved) {
        eprintln!(
            "locus preload: fd {fd} is a file with no name (removed while open, or made with \
             O_TMPFILE), which cannot outlive a fork or exec here ({problem}): closed"
        );
        // SAFETY: the reservation fd of this locus fd, which is closed.
        unsafe { real::close(fd) };
    }
    mark(fd, false);
}

/// Moves the bytes of the nameless file open as `fd` into a memory file (`memfd`) that takes
/// the fd's number over, with the description's offset, access mode, status flags and the
/// fd's close-on-exec flag; fds of a description already moved (`moved`) are made
/// duplicates of it, sharing its offset as before. No path leads back to a file without a
/// name once the volume is let go, and its bytes were never to outlive the process (nothing
/// names them, recovery drops them): DRAM loses nothing a crash would not. From then on the
/// fd is the kernel's — after a fork, parent and child share it as they would a tmpfs file's.
/// Refused (the caller closes the fd) when the file is larger than half the free memory.
fn into_memory_file(
    fd: c_int,
    entry: &FdEntry,
    moved: &mut HashMap<u64, c_int>,
) -> Result<(), String> {
    let cloexec = if entry.cloexec { libc::O_CLOEXEC } else { 0 };
    let desc = &entry.desc;
    if let Some(&holder) = moved.get(&desc.id) {
        // SAFETY: `holder` is a kernel fd this pass made; `fd` is a reservation, replaced.
        if unsafe { real::dup3(holder, fd, cloexec) } < 0 {
            return Err(format!("dup3: {}", std::io::Error::last_os_error()));
        }
        return Ok(());
    }
    let file = desc.file().map_err(|e| format!("errno {e}"))?.reader();
    let size = file.len();
    // SAFETY: a plain C struct, for which all zeros is a valid value.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: sysinfo fills the struct it is given, which lives through the call.
    if unsafe { libc::sysinfo(&mut info) } == 0 {
        let free = info.freeram * u64::from(info.mem_unit);
        if size > free / 2 {
            return Err(format!(
                "{size} bytes, more than half of the {free} bytes of free memory"
            ));
        }
    }
    let os_error = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: a NUL-terminated name; the fd returned is ours.
    let memory = unsafe { libc::memfd_create(c"locus-nameless".as_ptr(), libc::MFD_CLOEXEC) };
    if memory < 0 {
        return Err(os_error("memfd_create"));
    }
    let filled = crate::calls::mapped_copy::fill_memory_file(memory, &file)
        .map_err(|e| format!("copying it: {}", std::io::Error::from_raw_os_error(e)))
        .and_then(|()| {
            let status = desc.status.load(Ordering::Relaxed);
            let access = status & libc::O_ACCMODE;
            // The memory file is read-write; a description that was not gets its own mode
            // through /proc (the memory file's, as `open` of /proc/self/fd/N gives).
            let target = if access == libc::O_RDWR {
                memory
            } else {
                let path = std::ffi::CString::new(format!("/proc/self/fd/{memory}"))
                    .expect("no NUL in a number");
                // SAFETY: a NUL-terminated path; the fd returned is ours.
                let reopened = unsafe { real::open(path.as_ptr(), access | libc::O_CLOEXEC, 0) };
                if reopened < 0 {
                    return Err(os_error("reopening the memory file"));
                }
                reopened
            };
            let pos = *ordered(rank::POSITION, || desc.pos.lock());
            // SAFETY: `target` is ours; the flags and offset are the description's.
            let done = unsafe {
                real::fcntl(
                    target,
                    libc::F_SETFL,
                    (status & libc::O_APPEND) as libc::c_ulong,
                ) == 0
                    && real::lseek64(target, pos as libc::off_t, libc::SEEK_SET) >= 0
                    && real::dup3(target, fd, cloexec) >= 0
            };
            let result = if done {
                Ok(())
            } else {
                Err(os_error("giving the fd the memory file"))
            };
            if target != memory {
                // SAFETY: ours, duplicated onto `fd` (or failed) already.
                unsafe { real::close(target) };
            }
            result
        });
    // SAFETY: ours; `fd` holds the description now (or the move failed).
    unsafe { real::close(memory) };
    filled?;
    moved.insert(desc.id, fd);
    Ok(())
}

fn unlock_all() {
    // SAFETY: `before_fork` took each of these locks in this thread and forgot the guards.
    unsafe {
        APPEND.force_unlock();
        for table in crate::locks::mutexes() {
            table.force_unlock();
        }
        STREAMS.force_unlock();
        FDS.force_unlock_write();
        PENDING.force_unlock();
        MOUNT.force_unlock_write();
    }
}

extern "C" fn after_fork_parent() {
    unlock_all();
}

/// Before `posix_spawn`, which runs no fork handlers: what a fork does in the parent —
/// every locus fd suspended, the volume released — so the program spawned can mount it
/// (with the fds and working directory handed over) while this process waits; this one
/// mounts again on its next locus call.
pub(crate) fn release_for_child() {
    if ordered(rank::MOUNT, || MOUNT.read()).is_none() && OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    before_fork();
    after_fork_parent();
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
    unlock_all();
    // The child holds the suspended files too, and may outlive the parent.
    if PENDING_COUNT.load(Ordering::Relaxed) > 0 {
        let inos: Vec<u64> = PENDING.lock().iter().map(|h| h.ino).collect();
        crate::suspended::note(inos);
    }
}

/// Registers the fork and exit handlers (run once, from the library's constructor).
pub(crate) fn install_handlers() {
    receive_handoff();
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

// ---------------------------------------------------------------------------------------
// The working directory inside locus.

static CWD: RwLock<Option<String>> = RwLock::new(None);
static CWD_SET: AtomicBool = AtomicBool::new(false);

/// The locus directory the process has `chdir`ed into, if any: relative paths (with
/// `AT_FDCWD`) resolve against it.
pub(crate) fn cwd() -> Option<String> {
    if !CWD_SET.load(Ordering::Relaxed) {
        return None;
    }
    CWD.read().clone()
}

/// Sets (or, with `None`, clears: the kernel's working directory applies again) the locus
/// working directory.
pub(crate) fn set_cwd(dir: Option<String>) {
    let mut cwd = CWD.write();
    CWD_SET.store(dir.is_some(), Ordering::Relaxed);
    *cwd = dir;
    *CWD_STAT.lock() = None;
    CWD_INO.store(0, Ordering::Relaxed);
}

/// The working directory's inode number (0: not known yet), so that it follows its
/// directory when another process renames it while this one has let go of the volume.
static CWD_INO: AtomicU64 = AtomicU64::new(0);

/// Records the inode number of the locus working directory just set.
pub(crate) fn set_cwd_ino(ino: u64) {
    CWD_INO.store(ino, Ordering::Relaxed);
}

/// The working directory, after mounting the volume if it was let go (each mount lets the
/// working directory follow its directory, [`follow_cwd`]); `None` when it is not a locus
/// directory, or was mounted already (nothing can have moved it then).
pub(crate) fn cwd_after_mount() -> Result<Option<String>, c_int> {
    if ordered(rank::MOUNT, || MOUNT.read()).is_some() {
        return Ok(None);
    }
    run(|| with_fs(|_| Ok(())))?;
    Ok(cwd())
}

/// At a mount: the working directory follows its directory if another process renamed it
/// while this process had let go of the volume, as the kernel's follows a renamed
/// directory; its inode number is learned at the first mount that finds it by path (after
/// an `exec` that did not hand it over).
fn follow_cwd(fs: &Fs) {
    let Some(path) = cwd() else {
        return;
    };
    let known = CWD_INO.load(Ordering::Relaxed);
    if let Ok(st) = fs.stat(&path)
        && (known == 0 || st.ino == known)
    {
        CWD_INO.store(st.ino, Ordering::Relaxed);
        return;
    }
    if known != 0
        && let Ok(moved) = fs.dir_path(known)
    {
        *CWD.write() = Some(moved);
    }
}

/// What `stat` said of the working directory when this process (or the one it was forked
/// from) changed into it; see [`cwd_stat`].
static CWD_STAT: Mutex<Option<libc::stat>> = Mutex::new(None);

/// Records `stat` of the locus working directory just set.
pub(crate) fn set_cwd_stat(st: libc::stat) {
    *CWD_STAT.lock() = Some(st);
    set_cwd_ino(st.st_ino);
}

/// `stat` of the working directory as of the `chdir` into it, if this process image made
/// it: the answer to `stat(".")` while another process holds the volume (a shell's child
/// looking its command up in `PATH` resolves `.`, and would otherwise wait for the holder
/// or fail — and a holder writing into a pipe to that very child waits for it in turn).
pub(crate) fn cwd_stat() -> Option<libc::stat> {
    if !CWD_SET.load(Ordering::Relaxed) {
        return None;
    }
    *CWD_STAT.lock()
}

// ---------------------------------------------------------------------------------------
// Handing locus fds over `exec`.
//
// `exec` replaces the process image and with it the mount, so a locus fd the program meant
// to keep (no `FD_CLOEXEC`) — a shell's `cmd < /locus/f` — would be lost. Before `exec` the
// library describes each such fd (number, inode, offset, status flags, path), the volume's
// uuid and the locus working directory in `LOCUS_PRELOAD_HANDOFF`, and lets the fd's kernel
// reservation survive the exec. The new image's copy of the library reads the description
// at load and reopens the files on first use ([`reopen`]: by inode number, on the volume
// the uuid names). The old image's mount simply ends with the exec; every acknowledged
// write is durable, and the next mount recovers the rest.

/// The environment variable carrying the description.
pub const HANDOFF_ENV: &str = "LOCUS_PRELOAD_HANDOFF";

#[derive(Debug, Clone)]
struct Handoff {
    fd: c_int,
    ino: u64,
    /// The offset when handed over; the cell's, when there is one, is newer.
    pos: u64,
    status: c_int,
    path: String,
    cloexec: bool,
    /// The fds of one description share a group (and are reopened as one description).
    group: u64,
    /// The description's offset cell ([`crate::offsets`]).
    cell: Option<u32>,
    /// The uuid of the volume the file is on (0: not known).
    volume: u128,
    /// The description's lock fd ([`Desc::lock_fd`]; -1: none), kept open meanwhile.
    lock: c_int,
}

impl Handoff {
    /// The handoff of the open locus fd `fd` (`slot`, usable in this image): its offset
    /// shared from now on ([`Desc::share_offset`]), its description's id as the group, its
    /// lock fd — taken from the description when it is being suspended (`take_lock`: the
    /// description is dropped next, and must not close it), else only named (an `exec`).
    fn of(fd: c_int, slot: &FdEntry, take_lock: bool) -> Self {
        let desc = &slot.desc;
        let cell = desc.share_offset();
        let pos = *ordered(rank::POSITION, || desc.pos.lock());
        let lock = if take_lock {
            desc.lock_fd.lock().take()
        } else {
            *desc.lock_fd.lock()
        };
        Self {
            fd,
            ino: desc.ino,
            pos,
            status: desc.status.load(Ordering::Relaxed),
            path: desc.path.clone(),
            cloexec: slot.cloexec,
            group: desc.id,
            cell,
            volume: mounted_volume(),
            lock: lock.unwrap_or(-1),
        }
    }

    /// Its line in `LOCUS_PRELOAD_HANDOFF` (read back by [`receive_handoff`]).
    fn line(&self) -> String {
        format!(
            "fd {} {} {} {} {} {} {} {}",
            self.fd,
            self.ino,
            self.pos,
            self.status,
            hex(self.path.as_bytes()),
            self.group,
            self.cell.unwrap_or(0),
            self.lock
        )
    }
}

static PENDING: Mutex<Vec<Handoff>> = Mutex::new(Vec::new());
static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// The description to hand over and the fds whose reservations must survive, or `None`
/// when nothing needs handing over.
pub(crate) fn handoff_for_exec() -> Option<(String, Vec<c_int>)> {
    keep_nameless_for_exec();
    let mut lines = Vec::new();
    let mut fds = Vec::new();
    if let Some(table) = ordered(rank::FDS, || FDS.read()).as_ref() {
        for (&fd, slot) in table {
            if slot.cloexec || slot.desc.usable().is_err() {
                continue;
            }
            let handoff = Handoff::of(fd, slot, false);
            crate::suspended::note([handoff.ino]);
            lines.push(handoff.line());
            fds.push(fd);
            if handoff.lock >= 0 {
                fds.push(handoff.lock);
            }
        }
    }
    {
        let pending = ordered(rank::PENDING, || PENDING.lock());
        // A suspended description's lock fd rides with one of its fds, maybe one not kept.
        let group_locks: HashMap<u64, c_int> = pending
            .iter()
            .filter(|h| h.lock >= 0)
            .map(|h| (h.group, h.lock))
            .collect();
        for h in pending.iter().filter(|h| !h.cloexec) {
            let mut h = h.clone();
            h.lock = group_locks.get(&h.group).copied().unwrap_or(-1);
            lines.push(h.line());
            fds.push(h.fd);
            if h.lock >= 0 {
                fds.push(h.lock);
            }
        }
    }
    for (ino, fd) in crate::locks::process_fds() {
        lines.push(format!("plock {ino} {fd}"));
        fds.push(fd);
    }
    if !lines.is_empty()
        && let Some(table) = crate::offsets::handover_fd()
    {
        lines.push(format!("offsets {table}"));
        fds.push(table);
    }
    if !lines.is_empty() && mounted_volume() != 0 {
        lines.push(format!("volume {:032x}", mounted_volume()));
    }
    if let Some(dir) = cwd() {
        lines.push(format!(
            "cwd {} {}",
            hex(dir.as_bytes()),
            CWD_INO.load(Ordering::Relaxed)
        ));
    }
    fds.sort_unstable();
    fds.dedup();
    (!lines.is_empty()).then(|| (lines.join(";"), fds))
}

/// Before `exec`: an fd of a file with no name that the program keeps (no `FD_CLOEXEC`)
/// cannot be handed over by path, so it becomes a memory file now ([`into_memory_file`]),
/// which the kernel carries over the exec as any fd.
fn keep_nameless_for_exec() {
    let mut moved = HashMap::new();
    let mut gone = Vec::new();
    {
        let mut fds = ordered(rank::FDS, || FDS.write());
        let Some(table) = fds.as_mut() else {
            return;
        };
        let nameless: Vec<c_int> = table
            .iter()
            .filter(|(_, slot)| !slot.cloexec && slot.is_nameless())
            .map(|(&fd, _)| fd)
            .collect();
        for fd in nameless {
            let slot = table.remove(&fd).expect("listed above");
            OPEN.fetch_sub(1, Ordering::Relaxed);
            keep_in_memory(fd, &slot, &mut moved);
            gone.push(slot);
        }
        if !gone.is_empty() {
            table_changed();
        }
    }
    // Dropping descriptions releases their locks: with the table no longer held.
    drop(gone);
}

/// Reads a handed-over description (at library load; nothing is mounted yet).
fn receive_handoff() {
    let Some(text) = std::env::var_os(HANDOFF_ENV) else {
        return;
    };
    // SAFETY: the name is a literal; the process is still single-threaded (library load).
    unsafe { libc::unsetenv(c"LOCUS_PRELOAD_HANDOFF".as_ptr()) };
    let text = text.to_string_lossy();
    let mut pending = Vec::new();
    // The handing image's description ids, renumbered into this image's.
    let mut groups: HashMap<u64, u64> = HashMap::new();
    let mut cells = false;
    let mut volume = 0;
    for item in text.split(';') {
        let fields: Vec<&str> = item.split(' ').collect();
        match fields.as_slice() {
            ["fd", fd, ino, pos, status, path, group, cell, lock] => {
                let parsed = (|| {
                    let group = group.parse::<u64>().ok()?;
                    Some(Handoff {
                        fd: fd.parse().ok()?,
                        ino: ino.parse().ok()?,
                        pos: pos.parse().ok()?,
                        status: status.parse().ok()?,
                        path: unhex(path)?,
                        cloexec: false,
                        group: *groups
                            .entry(group)
                            .or_insert_with(|| NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                        cell: Some(cell.parse::<u32>().ok()?).filter(|&c| c != 0),
                        volume: 0,
                        lock: lock.parse::<c_int>().ok().filter(|&l| l >= -1)?,
                    })
                })();
                match parsed {
                    Some(h) if h.fd >= 0 => {
                        cells |= h.cell.is_some();
                        pending.push(h);
                    }
                    _ => eprintln!("locus preload: ignoring a malformed handed-over fd: {item}"),
                }
            }
            ["offsets", fd] => {
                let received = fd
                    .parse::<c_int>()
                    .map_err(|e| format!("{fd}: {e}"))
                    .and_then(crate::offsets::receive);
                if let Err(problem) = received {
                    eprintln!(
                        "locus preload: ignoring the handed-over table of offsets: {problem}"
                    );
                }
            }
            ["plock", ino, fd] => match (ino.parse::<u64>(), fd.parse::<c_int>()) {
                (Ok(ino), Ok(fd)) if fd >= 0 => crate::locks::adopt_process_fd(ino, fd),
                _ => eprintln!("locus preload: ignoring a malformed handed-over lock: {item}"),
            },
            ["volume", id] => match u128::from_str_radix(id, 16) {
                Ok(parsed) if id.len() == 32 => volume = parsed,
                _ => eprintln!("locus preload: ignoring a malformed volume id: {id}"),
            },
            ["cwd", path, ino] => match (unhex(path), ino.parse::<u64>()) {
                (Some(dir), Ok(ino)) => {
                    set_cwd(Some(dir));
                    set_cwd_ino(ino);
                }
                _ => eprintln!("locus preload: ignoring a malformed working directory: {item}"),
            },
            _ => eprintln!("locus preload: ignoring a malformed handover entry: {item}"),
        }
    }
    if cells && crate::offsets::handover_fd().is_none() {
        // Without the table the cells name nothing: the offsets handed over by value serve.
        for h in &mut pending {
            h.cell = None;
        }
    }
    let mut adopted = HashSet::new();
    for h in &mut pending {
        h.volume = volume;
        mark(h.fd, true);
        if h.lock >= 0 && adopted.insert(h.lock) {
            crate::locks::adopt(h.lock);
        }
    }
    crate::suspended::hold_only(&pending.iter().map(|h| h.ino).collect());
    PENDING_COUNT.store(pending.len(), Ordering::Relaxed);
    let std_fds: Vec<c_int> = pending.iter().map(|h| h.fd).filter(|fd| *fd <= 2).collect();
    *ordered(rank::PENDING, || PENDING.lock()) = pending;
    for fd in std_fds {
        crate::calls::stdio::follow_std(fd, true);
    }
}

/// Reopens every suspended or handed-over fd (on the first call that needs one). When the
/// volume cannot be mounted now, they stay suspended and the mount's error is returned.
fn adopt_suspended() -> Result<(), c_int> {
    let _inside = Guard::enter();
    // Mount first, holding nothing (lock order: MOUNT before PENDING).
    with_fs(|_| Ok(()))?;
    let list = std::mem::take(&mut *ordered(rank::PENDING, || PENDING.lock()));
    PENDING_COUNT.store(0, Ordering::Relaxed);
    // Open again from here on (or gone): no longer held suspended.
    crate::suspended::forget(list.iter().map(|h| h.ino));
    // The fds that shared a description share the one reopened (`2>&1`), and its lock fd,
    // which rides with one of them.
    let mut reopened: HashMap<u64, Arc<Desc>> = HashMap::new();
    let mut group_locks: HashMap<u64, c_int> = HashMap::new();
    for h in list.iter().filter(|h| h.lock >= 0) {
        if let Some(&other) = group_locks.get(&h.group)
            && other != h.lock
        {
            crate::locks::close(h.lock);
        } else {
            group_locks.insert(h.group, h.lock);
        }
    }
    for h in list {
        let desc = match reopened.get(&h.group) {
            Some(desc) => Ok(Arc::clone(desc)),
            None => {
                with_fs(|fs| Ok(reopen(fs, &h, group_locks.get(&h.group).copied()).map(Arc::new)))
                    .unwrap_or_else(|e| Err(std::io::Error::from_raw_os_error(e).to_string()))
            }
        };
        if desc.is_ok() {
            group_locks.remove(&h.group);
        }
        match desc {
            Ok(desc) => {
                reopened.insert(h.group, Arc::clone(&desc));
                install(
                    h.fd,
                    FdEntry {
                        desc,
                        cloexec: h.cloexec,
                    },
                );
                // The reservation is ours again: keep it from leaking into a later exec
                // unless handed over.
                // SAFETY: our reservation fd.
                unsafe { real::fcntl(h.fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
            }
            Err(why) => {
                eprintln!(
                    "locus preload: fd {} ({}) cannot be reopened after the volume was let go \
                     (a fork, an exec, or another process's turn): {why}; closed",
                    h.fd, h.path,
                );
                mark(h.fd, false);
                // SAFETY: the reservation left for this fd.
                unsafe { real::close(h.fd) };
                crate::locks::release_process(h.ino);
            }
        }
    }
    // Descriptions that could not be reopened: their locks go.
    for (_, fd) in group_locks {
        crate::locks::close(fd);
    }
    Ok(())
}

/// The description `h` names, opened again on `fs` by its inode number, so that a file or
/// directory another process renamed meanwhile (`mv`, a log rotated) is still the fd's, as
/// with a kernel file system (a directory's description takes its path as it is now). Why
/// not, when it cannot be.
fn reopen(fs: &Fs, h: &Handoff, lock_fd: Option<c_int>) -> Result<Desc, String> {
    let here = volume_id(fs);
    if h.volume != 0 && h.volume != here {
        return Err(format!(
            "it was open on the volume with uuid {:032x}, this process mounted the one with \
             uuid {here:032x} (LOCUS_VOLUME changed)",
            h.volume
        ));
    }
    let access = h.status & libc::O_ACCMODE;
    let options = fs::OpenOptions {
        read: access != libc::O_WRONLY,
        write: access != libc::O_RDONLY,
        ..Default::default()
    };
    let (node, path) = match fs.open_ino(h.ino, options) {
        Ok(file) => (Node::File(file), h.path.clone()),
        Err(FsError::NotFound(_)) => {
            return Err("another process removed the file meanwhile".into());
        }
        // Its path as it is now: directory descriptions read and resolve names by path.
        Err(FsError::IsDir(_)) => match fs.dir_path(h.ino) {
            Ok(path) => (Node::Dir(Mutex::new(None)), path),
            Err(_) => return Err("another process removed the directory meanwhile".into()),
        },
        Err(e) => return Err(e.to_string()),
    };
    // Where the last process to use the description left it.
    let pos = h.cell.and_then(crate::offsets::load).unwrap_or(h.pos);
    Ok(Desc::reopened(node, h, path, pos, lock_fd))
}

#[cfg(test)]
mod tests {
    use super::parse_busy_wait;
    use std::time::Duration;

    #[test]
    fn busy_waits_are_seconds_from_zero_to_an_hour() {
        assert_eq!(parse_busy_wait("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_busy_wait(" 2 "), Ok(Duration::from_secs(2)));
        assert_eq!(parse_busy_wait("0"), Ok(Duration::ZERO));
        for bad in ["-1", "nan", "inf", "3601", "1s", ""] {
            let problem = parse_busy_wait(bad).unwrap_err();
            assert!(
                problem.starts_with(&format!("LOCUS_BUSY_WAIT={bad}:")),
                "{problem}"
            );
        }
    }
}
