//! The one error type of the sim crate.

/// What can go wrong reading a trace or running a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Reading the trace failed.
    #[error("{source_name}: {source}")]
    Io {
        /// The trace's name (its file name).
        source_name: String,
        /// What the kernel said.
        source: std::io::Error,
    },

    /// A trace line is malformed.
    #[error("{source_name}:{line}: {problem}")]
    Parse {
        /// The trace's name.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the line.
        problem: String,
    },

    /// The trace's format could not be told from its first lines.
    #[error("{source_name}: cannot tell the trace format ({why}); pass --format")]
    UnknownFormat {
        /// The trace's name.
        source_name: String,
        /// What the first line looked like.
        why: String,
    },

    /// The trace exceeds a limit of the simulator.
    #[error("{source_name}: {problem}")]
    TooLarge {
        /// The trace's name.
        source_name: String,
        /// Which limit.
        problem: String,
    },

    /// A simulation parameter is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// Result with [`SimError`].
pub type Result<T, E = SimError> = std::result::Result<T, E>;
