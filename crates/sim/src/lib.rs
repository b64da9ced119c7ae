//! Trace-driven simulation of the hybrid DRAM/NVRAM cache policies of the `cache` crate:
//! trace readers for the formats storage engineers bring, a grid of cache sizes run in
//! parallel, results normalised to NVLRU, and a synthetic zipf trace generator.
//!
//! No I/O of its own: traces come in as `BufRead`, generated traces go out to a `Write`, and
//! the `locus` binary owns files, progress bars and plots.

mod error;
mod generate;
mod grid;
pub mod trace;

pub use error::{Result, SimError};
pub use generate::{ZipfSpec, write_zipf};
pub use grid::{GridResult, PolicyKind, run_grid, run_policy};
pub use trace::{Format, ReadOptions, Trace, read_trace};
