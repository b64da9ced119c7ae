//! What can go wrong, each naming what was being done.

/// A cache device error.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The NVRAM file's bytes are not a cache of this layout (or are damaged).
    #[error("cache NVRAM file: {problem}")]
    Format {
        /// What is wrong, naming the field or entry.
        problem: String,
    },
    /// The configuration cannot be served.
    #[error("cache configuration: {0}")]
    Config(String),
    /// The file system holding the NVRAM file failed.
    #[error("cache NVRAM: {doing}: {source}")]
    Nvram {
        /// What was being done.
        doing: String,
        /// The file system's error.
        #[source]
        source: fs::FsError,
    },
    /// The backing store failed.
    #[error("backing store: {doing}: {source}")]
    Backing {
        /// What was being done.
        doing: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A request outside the device.
    #[error("{len} bytes at {offset} are outside the {size}-byte device")]
    OutOfRange {
        /// Request offset.
        offset: u64,
        /// Request length.
        len: u64,
        /// Device size.
        size: u64,
    },
}

/// Results of this crate.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;

impl CacheError {
    pub(crate) fn nvram(doing: impl Into<String>) -> impl FnOnce(fs::FsError) -> Self {
        let doing = doing.into();
        move |source| CacheError::Nvram { doing, source }
    }

    pub(crate) fn backing(doing: impl Into<String>) -> impl FnOnce(uring::UringError) -> Self {
        let doing = doing.into();
        move |e| CacheError::Backing {
            doing,
            source: std::io::Error::other(e.to_string()),
        }
    }
}
