//! The one error type of the volume crate.

use std::path::PathBuf;

use crate::address::GlobalAddress;

/// Everything that can go wrong formatting, opening or allocating from a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A device could not be mapped or accessed.
    #[error(transparent)]
    Pmem(#[from] pmem::PmemError),

    /// The machine's topology could not be read.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),

    /// A file of the volume directory (config, lock) could not be read or written.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What locus was doing.
        action: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },

    /// `locus.toml` is not a valid volume description.
    #[error("{path}: {problem}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },

    /// No volume exists at the given directory.
    #[error("no volume at {dir} (no locus.toml); create one with `locus format`")]
    NoVolume {
        /// The volume directory.
        dir: PathBuf,
    },

    /// Another process has the volume open.
    #[error("volume {dir} is in use by pid {pid}")]
    InUse {
        /// The volume directory.
        dir: PathBuf,
        /// The process holding the lock, as it recorded itself.
        pid: String,
    },

    /// A device of the volume is open through another volume directory (a copied or
    /// hand-written `locus.toml` naming the same device).
    #[error(
        "device {device} is in use by pid {pid} (through another volume directory that names          the same device); a device belongs to one volume, opened by one process"
    )]
    DeviceInUse {
        /// The device.
        device: PathBuf,
        /// The process holding it, from the kernel's lock table (`unknown` if it cannot
        /// be read).
        pid: String,
    },

    /// A volume already exists where `format` was asked to create one.
    #[error("{dir} already holds a volume; pass --force to format over it")]
    AlreadyFormatted {
        /// The volume directory.
        dir: PathBuf,
    },

    /// A device has no locus superblock (never formatted, or a crash interrupted format).
    #[error("{device}: not formatted as a locus volume device (no superblock)")]
    NotFormatted {
        /// The device path.
        device: String,
    },

    /// A superblock field holds a value no locus version writes.
    #[error("{device}: superblock field `{field}` is invalid: {problem}")]
    BadSuperblock {
        /// The device path.
        device: String,
        /// The field's name, as in docs/format/volume.md.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },

    /// The devices do not form one complete volume.
    #[error("{problem}")]
    Mismatch {
        /// Which devices disagree and how.
        problem: String,
    },

    /// No device has room for the allocation.
    #[error("no space: no device can hold {len_bytes} more bytes")]
    NoSpace {
        /// The requested length.
        len_bytes: u64,
    },

    /// An allocation request that can never be satisfied.
    #[error("invalid allocation of {len_bytes} bytes: {problem}")]
    BadRequest {
        /// The requested length.
        len_bytes: u64,
        /// Why it is invalid.
        problem: String,
    },

    /// An extent does not name allocatable space of this volume, or overlaps one already
    /// owned (a double free or corrupt owner records).
    #[error("extent {start}+{len_bytes}: {problem}")]
    BadExtent {
        /// Start of the extent.
        start: GlobalAddress,
        /// Its length.
        len_bytes: u64,
        /// What is wrong.
        problem: String,
    },

    /// The requesting node is not a node of this machine.
    #[error("node {node} is not an online NUMA node")]
    UnknownNode {
        /// The node asked for.
        node: u32,
    },
}

/// Result with [`VolumeError`].
pub type Result<T, E = VolumeError> = std::result::Result<T, E>;
