//! The one error type of the fs crate.

/// What can go wrong in the file system's structures.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Persistent memory could not be accessed.
    #[error(transparent)]
    Pmem(#[from] pmem::PmemError),

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
}

/// Result with [`FsError`].
pub type Result<T, E = FsError> = std::result::Result<T, E>;
