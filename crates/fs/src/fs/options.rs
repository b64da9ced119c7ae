//! How a file system is laid out (`FormatOptions`), run (`FsOptions`), and how a file is
//! opened (`OpenOptions`), with the checks of each.

use super::MAX_IO;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::range_lock::RangeLocks;
use crate::root::MAX_SLOTS;

/// How a new file system is laid out.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Thread slots, 2..=120: slot 0 is the checkpoint's, the top eighth (at least one) are
    /// shared, and each of the others is owned by a thread that changes the file system,
    /// while it lives; threads past those take turns on the shared ones, one operation at a
    /// time. A slot's log and journal are made when a thread first needs it.
    pub slot_limit: u32,
    /// Records per thread's data log area (64 bytes each).
    pub log_records: u64,
    /// Bytes of each thread's metadata journal (the checkpoint's is 16 times larger).
    pub journal_bytes: u64,
    /// Range-lock granule of files: a power of two in 4 KiB..=2 MiB.
    pub granule: u64,
    /// Keep a crc32c of every 4 KiB data block and verify it on every read
    /// (`crate::checksums`); fixed for the file system's life.
    pub data_checksums: bool,
}

impl Default for FormatOptions {
    fn default() -> Self {
        Self {
            slot_limit: 64,
            log_records: 16 << 10,
            journal_bytes: 1 << 20,
            granule: 4096,
            data_checksums: false,
        }
    }
}

impl FormatOptions {
    /// The defaults, with log areas and journals shrunk for a small volume of
    /// `volume_bytes` so the file system's own structures stay a small part of it: a
    /// journal of 1/512 of the volume (64 KiB..=1 MiB; the checkpoint's is 16 times that)
    /// and a log area of one record per 16 KiB (256..=16384 records). From 512 MiB up this
    /// is [`FormatOptions::default`].
    pub fn scaled_to(volume_bytes: u64) -> Self {
        Self {
            log_records: (volume_bytes / (16 << 10)).clamp(256, 16 << 10),
            journal_bytes: (volume_bytes / 512)
                .next_power_of_two()
                .clamp(64 << 10, 1 << 20),
            ..Self::default()
        }
    }
}

/// How to run an open file system.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Preliminary buffers per thread (1..=16; the paper varies it from 1 to 16).
    pub prelim_buffers: usize,
    /// Bytes of each preliminary buffer (a multiple of 4 KiB, at least 64 KiB). Writes larger
    /// than this get a buffer of their own.
    pub prelim_buffer_bytes: u64,
    /// Most records one checkpoint batch moves.
    pub checkpoint_batch: usize,
    /// When the checkpoint runs.
    pub checkpoint: CheckpointMode,
    /// How many steps of nice value the checkpoint thread takes below the thread that opened
    /// the file system (0: none; at most down to -20). When writers and the checkpoint share
    /// too few CPUs, the boost lets the checkpoint run as soon as it has work, so the
    /// backlog of logged writes stays small — and with it the overlay each write updates —
    /// instead of growing until writers wait for buffers while a CPU idles. Lowering a nice
    /// value needs `CAP_SYS_NICE` or a high enough `RLIMIT_NICE`; without either the
    /// checkpoint runs at the opener's priority (logged at debug level).
    pub checkpoint_boost: u32,
    /// Rewrite 2 MiB windows of files that small overwrites scattered into one extent each,
    /// while the file system is idle ([`crate::defrag`]); on by default.
    pub defrag: bool,
    /// Called first in each thread the file system starts (checkpoint, defragmentation,
    /// scrub), so that a host can mark them as its own: the preload library makes their
    /// calls go straight to the C library, as its own threads' do.
    pub on_thread: Option<fn()>,
    /// Write a snapshot at unmount whenever anything changed. Without it (the default), an
    /// unmount after a small change on a file system with many files seals the journals
    /// where they end instead, and the next mount replays their records: cheaper than
    /// encoding every inode again. `locus fsck --repair` sets it, to fold what it replayed.
    pub fold_at_unmount: bool,
}

impl FsOptions {
    /// Runs [`FsOptions::on_thread`] in a thread just started.
    pub(crate) fn thread_started(&self) {
        if let Some(hook) = self.on_thread {
            hook();
        }
    }
}

/// When the checkpoint moves logged writes into files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// Continuously, in the background (the paper's design).
    #[default]
    Background,
    /// Only when something needs it: a writer out of log space or buffers, a close, a
    /// checkpoint call, a full journal, unmount. Writes stay in the logs meanwhile (reads see
    /// them through the overlay); useful to measure logging alone, and for recovery tests.
    OnDemand,
}

impl FsOptions {
    /// Whether the idle-time defragmenter runs: asked for, with the checkpoint in the
    /// background (an on-demand checkpoint's logs hold only what callers wrote, for
    /// measurements and tests). Windows are noted only then — noted with no thread to take
    /// them, they would pile up and the file system would never be idle.
    pub(crate) fn defragments(&self) -> bool {
        self.defrag && self.checkpoint == CheckpointMode::Background
    }
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            // 32 MiB in flight per writer, in pieces small enough that the checkpoint frees
            // one soon: a buffer is reused only once every write in it is checkpointed, and
            // with 4 of 8 MiB, random 64 KiB writes waited for the checkpoint ~2000 times a
            // second (`bench fs --bs 64K --threads 1`: 1.5x–1.7x tmpfs; 2.4x with 16 of 2 MiB,
            // small writes unchanged).
            prelim_buffers: 16,
            prelim_buffer_bytes: 2 << 20,
            checkpoint_batch: 4096,
            checkpoint: CheckpointMode::Background,
            // Two writers of random 4 KiB blocks on two CPUs with the checkpoint (`bench fs
            // --threads 2`, alternated runs): 0.76–0.79 M IOPS at the opener's priority,
            // backlog up to 33 k records; 0.96–1.10 M with 10 steps, backlog under 8.5 k and
            // no writer ever waiting for buffers (5 steps: no gain in two runs).
            checkpoint_boost: 10,
            defrag: true,
            on_thread: None,
            fold_at_unmount: false,
        }
    }
}

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Create the file if missing.
    pub create: bool,
    /// With `create`: fail if it exists.
    pub exclusive: bool,
    /// Cut the file to zero bytes (needs `write`).
    pub truncate: bool,
    /// Permission bits for a created file.
    pub mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read: true,
            write: false,
            create: false,
            exclusive: false,
            truncate: false,
            mode: 0o644,
        }
    }
}

impl OpenOptions {
    /// Read and write an existing file.
    pub fn read_write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }

    /// Read and write, creating the file if missing.
    pub fn create() -> Self {
        Self {
            write: true,
            create: true,
            ..Self::default()
        }
    }
}

/// Checks a thread-slot limit (format, and `Fs::tune` later).
pub(crate) fn check_slot_limit(limit: u32) -> Result<()> {
    if !(2..=MAX_SLOTS).contains(&limit) {
        return Err(FsError::Invalid(format!(
            "slot limit {limit}: 2..={MAX_SLOTS}"
        )));
    }
    Ok(())
}

/// Checks a format request.
pub(crate) fn check_format(options: &FormatOptions) -> Result<()> {
    check_slot_limit(options.slot_limit)?;
    if !(64..=crate::log::MAX_RECORDS).contains(&options.log_records) {
        return Err(FsError::Invalid(format!(
            "log records {}: 64..={}",
            options.log_records,
            crate::log::MAX_RECORDS
        )));
    }
    if options.journal_bytes < (64 << 10) || options.journal_bytes > (1 << 30) {
        return Err(FsError::Invalid(format!(
            "journal bytes {}: 64 KiB..=1 GiB",
            options.journal_bytes
        )));
    }
    RangeLocks::new(options.granule)?;
    Ok(())
}

/// Checks run options.
pub(crate) fn check_options(options: &FsOptions) -> Result<()> {
    if !(1..=16).contains(&options.prelim_buffers) {
        return Err(FsError::Invalid(format!(
            "preliminary buffers {}: 1..=16",
            options.prelim_buffers
        )));
    }
    if options.prelim_buffer_bytes < (64 << 10)
        || !options.prelim_buffer_bytes.is_multiple_of(BLOCK)
        || options.prelim_buffer_bytes > MAX_IO
    {
        return Err(FsError::Invalid(format!(
            "preliminary buffer bytes {}: a multiple of 4 KiB in 64 KiB..=1 GiB",
            options.prelim_buffer_bytes
        )));
    }
    if options.checkpoint_batch == 0 {
        return Err(FsError::Invalid("checkpoint batch of 0 records".into()));
    }
    Ok(())
}
