//! The crash-atomic library file system (Libpubl) on the volume.
//!
//! It runs inside the application's process: no system call on the data path. Every write is
//! atomic and durable when it returns, its data is written to persistent memory once, and
//! threads writing disjoint ranges of one file do not wait for each other.
//!
//! - [`Fs::format`] / [`Fs::open`] (recovery) on a [`volume::Volume`];
//! - [`File::write_at`] copies into a per-thread preliminary buffer (non-temporal stores) and
//!   appends one 64-byte checksummed record pointing at it to the thread's [`log`] area;
//! - [`Fs::buffer`] + [`File::write_buffer`] commit a caller-filled persistent buffer with no
//!   copy at all;
//! - reads see the newest data through a DRAM overlay of logged writes over each file's
//!   extent map;
//! - a background checkpoint remaps whole blocks of the buffers into files (a journaled
//!   pointer swap) and copies partial blocks, then retires the records;
//! - metadata operations (create, unlink, rename, mkdir, rmdir, truncate) are one journal
//!   record each, in the calling thread's own journal;
//! - per-file [`range_lock`]s at 4 KiB–2 MiB granularity.
//!
//! On-media formats: docs/format/fs-log.md and docs/format/fs-metadata.md. The C API for
//! other languages and the preload library: `include/locus_fs.h` (crate `fs-capi`).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let topology = topology::Topology::read_live()?;
//! let volume = Arc::new(volume::Volume::open("/dev/shm/locus".as_ref(), topology, &Default::default())?);
//! let fs = fs::Fs::open(volume, fs::FsOptions::default())?;
//! fs.mkdir("/logs", 0o755)?;
//! let file = fs.create("/logs/today")?;
//! file.write_at(b"atomic and durable on return", 0)?;
//! let mut zero_copy = fs.buffer(4096)?;
//! zero_copy.write(0, &[7u8; 4096])?;
//! file.write_buffer(zero_copy, 4096)?;
//! let mut back = vec![0u8; 8192];
//! assert_eq!(file.read_at(&mut back, 0)?, 8192);
//! fs.rename("/logs/today", "/logs/yesterday")?;
//! # Ok(()) }
//! ```

mod acl;
mod apply;
mod buffers;
mod checkpoint;
mod checksums;
mod codec;
pub mod control;
mod defrag;
mod error;
mod extent_map;
#[allow(clippy::module_inception)]
mod fs;
mod inode;
mod journal;
pub mod lock_order;
mod log;
mod overlay;
mod path;
mod pieces;
mod progress;
mod range_lock;
mod recovery;
mod root;
mod scrub;
mod setup;
mod snapshot;
mod xattr;

pub use acl::{ACCESS as ACL_ACCESS, DEFAULT as ACL_DEFAULT};
pub use error::{ErrorKind, FsError, Result};
pub use fs::{
    Buffer, Buffers, CheckpointMode, File, FormatOptions, Fs, FsOptions, FsStats, MAX_FILE_SIZE,
    MAX_IO, MappedRun, Nameless, OpenOptions, ROOT_INO, ReplaySummary, Space, ownable_slots,
    shared_slots,
};
pub use inode::{DirEntry, Owner, Stat};
pub use journal::Kind;
pub use log::{Confirmer, LogArea, LogRecord, Piece as LogPiece};
pub use path::MAX_NAME;
pub use range_lock::{LockMode, RangeGuard, RangeLocks};
pub use recovery::{ChecksumsChange, FsCheck, OfflineFs, SlotLimitChange, Tune, Tuned};
pub use root::MAX_SLOTS;
pub use scrub::{
    DamagedBlock, HeldBy, SalvageReport, ScrubProgress, ScrubReport, ScrubRunner, ScrubStatus,
};
pub use setup::{create_default_volume, format_volume, format_volume_with};
pub use xattr::{MAX_XATTR_BYTES, MAX_XATTR_NAME, MAX_XATTR_VALUE, XattrSet};
