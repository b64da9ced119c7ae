//! The one error type of the fs crate, its kinds, and the errno each kind means to a POSIX
//! program.

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

    /// A block of a file's data fails its checksum: its bytes are not the ones written.
    #[error(
        "file {ino}: the data at offset {offset} is damaged (block at {block} fails its checksum)"
    )]
    DataChecksum {
        /// The file's inode number.
        ino: u64,
        /// The file offset of the first damaged byte the operation touched.
        offset: u64,
        /// The damaged block's global address.
        block: String,
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

    /// A path walk met a symbolic link: a component before the last, or the last one for an
    /// operation that follows it. The file system does not follow links itself (a target is
    /// a path of the caller's name space, which may lead out of the file system); the caller
    /// splices `target` in place of `link` and walks again.
    #[error("{link} is a symbolic link to `{target}`")]
    Symlink {
        /// The walked path up to and including the link.
        link: String,
        /// What the link points to.
        target: String,
    },

    /// A name over 255 bytes, or a symbolic link's target over 4095.
    #[error("{0}: file name too long")]
    NameTooLong(String),

    /// A write, size or hole reaching past the largest file ([`crate::MAX_FILE_SIZE`]).
    #[error("file too large: {0}")]
    TooLarge(String),

    /// An argument the operation cannot accept.
    #[error("invalid argument: {0}")]
    Invalid(String),

    /// An operation this file system or volume does not offer.
    #[error("not supported: {0}")]
    NotSupported(String),

    /// The operation is never allowed on this object (a second name for a directory).
    #[error("operation not permitted: {0}")]
    NotPermitted(String),

    /// No extended attribute of the name (`ENODATA`).
    #[error("{0}: no such attribute")]
    NoData(String),

    /// An extended attribute's value over the largest one (`E2BIG`).
    #[error("too big: {0}")]
    TooBig(String),

    /// An inode's extended attributes would take more than they may (`ENOSPC`).
    #[error("no room: {0}")]
    XattrFull(String),

    /// Writing through a read-only handle, or reading through a write-only one.
    #[error("bad file handle: {0}")]
    BadHandle(String),

    /// Every thread slot a thread may own is taken by a live thread. Callers of the file
    /// system never see it: a thread then takes turns on the shared slots
    /// (`Inner::slot`).
    #[error("all {0} thread slots of the file system are in use")]
    TooManyThreads(u32),

    /// The file system was unmounted or its checkpoint failed.
    #[error("the file system is shut down: {0}")]
    Shutdown(String),
}

/// What kind of failure an error is: what a caller acts on. Every caller that speaks
/// another error language (POSIX errno for the preload library and the C API, NBD errors for
/// network clients) translates from this, by an exhaustive match, never from raw integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No such file or directory (`ENOENT`).
    NotFound,
    /// The name exists (`EEXIST`).
    Exists,
    /// Not a directory (`ENOTDIR`).
    NotDir,
    /// Is a directory (`EISDIR`).
    IsDir,
    /// Directory not empty (`ENOTEMPTY`).
    NotEmpty,
    /// Name or path too long (`ENAMETOOLONG`).
    NameTooLong,
    /// Past the largest file (`EFBIG`).
    TooLarge,
    /// A symbolic link where the operation does not follow one (`ELOOP`).
    Symlink,
    /// An argument the operation cannot accept (`EINVAL`).
    Invalid,
    /// An operation this file system or volume does not offer (`EOPNOTSUPP`).
    NotSupported,
    /// Never allowed on this object (`EPERM`).
    NotPermitted,
    /// The handle does not allow the operation (`EBADF`).
    BadHandle,
    /// No extended attribute of that name (`ENODATA`).
    NoData,
    /// An extended attribute's value is too large (`E2BIG`).
    TooBig,
    /// A resource that frees itself soon: thread slots, log records (`EAGAIN`).
    TryAgain,
    /// No space on the volume (`ENOSPC`).
    NoSpace,
    /// The volume is open in another process (`EBUSY`).
    InUse,
    /// There is no volume or no file system on it (`ENODEV`).
    NoFileSystem,
    /// The file system is unmounted or stopped after a failure (`ESHUTDOWN`).
    Shutdown,
    /// Damage, or the media failed (`EIO`).
    Io,
}

impl ErrorKind {
    /// The errno a POSIX call failing this way returns.
    pub fn errno(self) -> i32 {
        match self {
            Self::NotFound => libc::ENOENT,
            Self::Exists => libc::EEXIST,
            Self::NotDir => libc::ENOTDIR,
            Self::IsDir => libc::EISDIR,
            Self::NotEmpty => libc::ENOTEMPTY,
            Self::NameTooLong => libc::ENAMETOOLONG,
            Self::TooLarge => libc::EFBIG,
            Self::Symlink => libc::ELOOP,
            Self::Invalid => libc::EINVAL,
            Self::NotSupported => libc::EOPNOTSUPP,
            Self::NotPermitted => libc::EPERM,
            Self::BadHandle => libc::EBADF,
            Self::NoData => libc::ENODATA,
            Self::TooBig => libc::E2BIG,
            Self::TryAgain => libc::EAGAIN,
            Self::NoSpace => libc::ENOSPC,
            Self::InUse => libc::EBUSY,
            Self::NoFileSystem => libc::ENODEV,
            Self::Shutdown => libc::ESHUTDOWN,
            Self::Io => libc::EIO,
        }
    }
}

impl FsError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        use volume::VolumeError;
        match self {
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Exists(_) => ErrorKind::Exists,
            Self::NotDir(_) => ErrorKind::NotDir,
            Self::IsDir(_) => ErrorKind::IsDir,
            Self::NotEmpty(_) => ErrorKind::NotEmpty,
            Self::NameTooLong(_) => ErrorKind::NameTooLong,
            Self::TooLarge(_) => ErrorKind::TooLarge,
            Self::Symlink { .. } => ErrorKind::Symlink,
            Self::Invalid(_) | Self::BadRange(_) => ErrorKind::Invalid,
            Self::NotSupported(_) => ErrorKind::NotSupported,
            Self::NotPermitted(_) => ErrorKind::NotPermitted,
            Self::BadHandle(_) => ErrorKind::BadHandle,
            Self::NoData(_) => ErrorKind::NoData,
            Self::TooBig(_) => ErrorKind::TooBig,
            Self::XattrFull(_) => ErrorKind::NoSpace,
            Self::TooManyThreads(_) | Self::LogFull { .. } => ErrorKind::TryAgain,
            Self::Volume(VolumeError::NoSpace { .. }) => ErrorKind::NoSpace,
            Self::Volume(VolumeError::InUse { .. } | VolumeError::DeviceInUse { .. }) => {
                ErrorKind::InUse
            }
            Self::Volume(VolumeError::NoVolume { .. }) | Self::NoFileSystem => {
                ErrorKind::NoFileSystem
            }
            Self::Shutdown(_) => ErrorKind::Shutdown,
            Self::Pmem(_)
            | Self::Volume(_)
            | Self::BadLogHeader { .. }
            | Self::DamagedLog { .. }
            | Self::DataChecksum { .. }
            | Self::Corrupt { .. } => ErrorKind::Io,
        }
    }

    /// The errno a POSIX call failing this way returns.
    pub fn errno(&self) -> i32 {
        self.kind().errno()
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
