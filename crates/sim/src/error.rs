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

    /// The trace holds no request (no line, or only lines skipped as malformed).
    #[error("{source_name}: no requests in {lines} line(s){}", skipped_note(*.skipped))]
    NoRequests {
        /// The trace's name.
        source_name: String,
        /// Lines read.
        lines: u64,
        /// Of them, malformed lines skipped (with skip_bad).
        skipped: u64,
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

fn skipped_note(skipped: u64) -> String {
    if skipped > 0 {
        format!(", {skipped} malformed and skipped")
    } else {
        String::new()
    }
}

/// Result with [`SimError`].
pub type Result<T, E = SimError> = std::result::Result<T, E>;
