//! Block I/O to SSDs and NVMe with io_uring and `O_DIRECT`, through the uDMA registered
//! buffer pool.
//!
//! - [`DirectFile`]: a file or block device opened `O_DIRECT`.
//! - [`BufferPool`]: pinned buffers by request size — static small blocks, medium chunks of
//!   m bytes up to M (scatter/gather, merged on release, released after t idle), and
//!   per-request registration for large requests — falling back to unregistered memory when
//!   registration fails.
//! - [`fuse::FuseRing`]: one queue of a FUSE connection served over io_uring (per-CPU queues).
//! - [`Engine`]: one ring per thread with the device as a fixed file, a sparse fixed-buffer
//!   table, bounded queue depth and owned buffers; strategies for the pool and its baselines.
//!
//! Invariants: a buffer's memory stays mapped and registered while the kernel may use it
//! (buffers travel with their requests and come back with the completion); a registered slot
//! is emptied before its memory is freed; all `unsafe` of this crate is in `memory.rs`, `pool.rs`,
//! `engine.rs` and `fuse.rs`, each block with a SAFETY comment.

mod engine;
mod error;
mod file;
pub mod fuse;
mod memory;
mod pool;

pub use engine::{Completion, Engine, MAX_QUEUE_DEPTH, MAX_REQUEST_BYTES, Op, Strategy};
pub use error::{Result, UringError};
pub use file::{DirectFile, SECTOR_BYTES};
pub use memory::{ALIGN, Memory};
pub use pool::{BufferPool, IoBuf, PoolConfig, PoolStats, Registrar, Segment, Tier};
