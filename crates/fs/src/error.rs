//! The one error type of the fs crate, with the errno each error means to a POSIX program.

/// What can go wrong in the file system.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Persistent memory could not be accessed.
    #[error(transparent)]
    Pmem(#[from] pmem::PmemError),

    /// The volume refused (no space, bad extent, ...).
    #[error(transparent)]
    Volume(#[from] volume::VolumeError),

    /// A log area's header is damaged or of another format.
    #[error("log area: header field `{field}` is invalid: {problem}")]
    BadLogHeader {
        /// The field, as in docs/format/fs-log.md.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },

    /// A log area holds records that cannot come from a crash: damage.
    #[error("log area {area}: {problem}")]
    DamagedLog {
        /// The area's id.
        area: u32,
        /// What is inconsistent.
        problem: String,
    },

    /// A metadata structure (root, snapshot, journal) is damaged.
    #[error("{structure} is damaged: {problem}")]
    Corrupt {
        /// Which structure, e.g. "root copy 1" or "journal of slot 3 at byte 4096".
        structure: String,
        /// What is wrong.
        problem: String,
    },

    /// The volume carries no file system.
    #[error("the volume has no locus file system (format one with `locus format`)")]
    NoFileSystem,

    /// The log area has no free slot until the checkpoint retires records (backpressure).
    #[error("log area {area} is full: {pending} records wait for the checkpoint")]
    LogFull {
        /// The area's id.
        area: u32,
        /// Records appended but not retired.
        pending: u64,
    },

    /// A range lock request is malformed.
    #[error("invalid range lock: {0}")]
    BadRange(String),

    /// No such file or directory.
    #[error("{0}: no such file or directory")]
    NotFound(String),

    /// The name exists already.
    #[error("{0}: file exists")]
    Exists(String),

    /// A path component, or the target of a directory operation, is not a directory.
    #[error("{0}: not a directory")]
    NotDir(String),

    /// A file operation on a directory.
    #[error("{0}: is a directory")]
    IsDir(String),

    /// Removing or replacing a directory that has entries.
    #[error("{0}: directory not empty")]
    NotEmpty(String),

    /// A name over 255 bytes or a path over 4096.
    #[error("{0}: file name too long")]
    NameTooLong(String),

    /// An argument the operation cannot accept.
    #[error("invalid argument: {0}")]
    Invalid(String),

    /// Writing through a read-only handle, or reading through a write-only one.
    #[error("bad file handle: {0}")]
    BadHandle(String),

    /// Every thread slot is taken by a live thread.
    #[error("all {0} thread slots of the file system are in use")]
    TooManyThreads(u32),

    /// The file system was unmounted or its checkpoint failed.
    #[error("the file system is shut down: {0}")]
    Shutdown(String),
}

impl FsError {
    /// The errno a POSIX call failing this way returns.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound(_) => libc::ENOENT,
            Self::Exists(_) => libc::EEXIST,
            Self::NotDir(_) => libc::ENOTDIR,
            Self::IsDir(_) => libc::EISDIR,
            Self::NotEmpty(_) => libc::ENOTEMPTY,
            Self::NameTooLong(_) => libc::ENAMETOOLONG,
            Self::Invalid(_) | Self::BadRange(_) => libc::EINVAL,
            Self::BadHandle(_) => libc::EBADF,
            Self::TooManyThreads(_) => libc::EAGAIN,
            Self::LogFull { .. } => libc::EAGAIN,
            Self::Volume(volume::VolumeError::NoSpace { .. }) => libc::ENOSPC,
            Self::Shutdown(_) => libc::ESHUTDOWN,
            Self::NoFileSystem => libc::ENODEV,
            _ => libc::EIO,
        }
    }

    pub(crate) fn corrupt(structure: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::Corrupt {
            structure: structure.into(),
            problem: problem.into(),
        }
    }
}

/// Result with [`FsError`].
pub type Result<T, E = FsError> = std::result::Result<T, E>;
