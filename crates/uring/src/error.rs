//! The one error type of the uring crate.

use std::path::PathBuf;

/// What can go wrong doing block I/O.
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// Opening, sizing or mapping failed.
    #[error("{what}: {source}")]
    Io {
        /// What locus was doing, with the path where there is one.
        what: String,
        /// What the kernel said.
        source: std::io::Error,
    },

    /// A request the device cannot do: unaligned for O_DIRECT, past the end, too large.
    #[error("{path}: {problem}")]
    BadRequest {
        /// The device.
        path: PathBuf,
        /// Why.
        problem: String,
    },

    /// The kernel failed or shortened one I/O.
    #[error("{op} of {len} bytes at offset {offset}: {problem}")]
    Failed {
        /// "read" or "write".
        op: &'static str,
        /// Offset of the request.
        offset: u64,
        /// Length of the request.
        len: usize,
        /// What happened.
        problem: String,
    },

    /// A pool setting is out of range.
    #[error("invalid buffer pool setting: {0}")]
    Config(String),
}

/// Result with [`UringError`].
pub type Result<T, E = UringError> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UringError {
    let what = what.into();
    move |source| UringError::Io { what, source }
}
