//! The one error type of the topology crate.

use std::io;
use std::path::PathBuf;

use crate::NodeId;

/// Everything that can go wrong while reading the machine's topology or probing it.
///
/// Every variant that comes from a file names that file, so a user can look at it.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A file or directory that must exist could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The sysfs path that failed.
        path: PathBuf,
        /// What the kernel said.
        source: io::Error,
    },

    /// A file was readable but its contents are not what the kernel writes there.
    #[error("{path}: {problem}")]
    Malformed {
        /// The sysfs path whose contents are wrong.
        path: PathBuf,
        /// What is wrong, in words.
        problem: String,
    },

    /// A node id was asked for that is not online.
    #[error("node {node} is not an online NUMA node")]
    UnknownNode {
        /// The node asked for.
        node: NodeId,
    },

    /// A kernel NUMA system call (`mbind`, `move_pages`, `sched_setaffinity`, `mmap`) failed.
    #[error("{call}: {source}")]
    Syscall {
        /// The call and what it was doing.
        call: &'static str,
        /// What the kernel said.
        source: io::Error,
    },

    /// The process may not run on any CPU of a node, so that node cannot be probed from.
    #[error("no CPU of node {node} is in this process's CPU affinity mask (allowed: {allowed})")]
    NoAllowedCpu {
        /// The node that has no usable CPU.
        node: NodeId,
        /// The CPUs the process may use, as a cpulist.
        allowed: String,
    },

    /// Probe memory bound to one node was found on another, so its measurement would lie.
    #[error(
        "probe memory bound to node {expected} was found on node {found} \
         ({misplaced} of {checked} sampled pages misplaced)"
    )]
    ProbeMisplaced {
        /// The node the memory was bound to.
        expected: NodeId,
        /// A node the kernel reported for some of the pages (a negative errno if not resident).
        found: i64,
        /// How many sampled pages were not on `expected`.
        misplaced: usize,
        /// How many pages were sampled.
        checked: usize,
    },

    /// A probe parameter is out of its allowed range.
    #[error("invalid probe setting: {0}")]
    ProbeConfig(String),
}

impl TopologyError {
    pub(crate) fn malformed(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        Self::Malformed {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

/// Result with [`TopologyError`].
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;
