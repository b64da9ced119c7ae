//! The one error type of the pmem crate.

use std::io;
use std::path::PathBuf;

/// What can go wrong mapping a device or accessing a region.
#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    /// A device file could not be opened, created, sized or mapped.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The device path.
        path: PathBuf,
        /// What locus was doing, e.g. "mmap with MAP_SYNC".
        action: &'static str,
        /// What the kernel said.
        source: io::Error,
    },

    /// The path is not the kind of device it was said to be.
    #[error("{path}: {problem}")]
    WrongKind {
        /// The device path.
        path: PathBuf,
        /// Why it does not fit, in words.
        problem: String,
    },

    /// A device file needs more room than its file system has free.
    #[error(
        "{path}: needs {lacking} more bytes and its file system has {free} free; give a \
         smaller size, or free room there"
    )]
    NoRoom {
        /// The device path.
        path: PathBuf,
        /// Bytes the file lacks of the size asked for.
        lacking: u64,
        /// Bytes free for an unprivileged user on the file system.
        free: u64,
    },

    /// An access fell outside its region. Offsets that come from media are checked against
    /// this before use, so corrupt metadata yields this error rather than a wild access.
    #[error("access of {len} bytes at offset {offset} is outside a region of {region_len} bytes")]
    OutOfBounds {
        /// Offset of the access within the region.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },

    /// An 8-byte atomic access was not 8-byte aligned.
    #[error("8-byte access at offset {offset} is not 8-byte aligned")]
    Misaligned {
        /// The offending offset (absolute within the device).
        offset: u64,
    },
}

/// Result with [`PmemError`].
pub type Result<T, E = PmemError> = std::result::Result<T, E>;
