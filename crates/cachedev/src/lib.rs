//! The cache device: a slow backing store (an SSD, a file opened `O_DIRECT`) behind
//! persistent memory, with the NBM policy (or NVLRU, or a unified LRU) deciding.
//!
//! - NVRAM holds dirty blocks: a write is acknowledged once its block and index entry are in
//!   NVRAM, which is a file of the locus file system (`nvram`, laid out as `format` says,
//!   docs/format/cache.md): its blocks are the volume's persistent memory, and each write to
//!   it is atomic and durable when it returns.
//! - DRAM holds clean blocks.
//! - The backing store is read and written through the `uring` engine, every transfer in a
//!   buffer of the uDMA pool (`backing`).
//! - The `cache` crate's policies decide: the device carries out exactly the actions they
//!   emit (`device`), so it and `locus sim` count the same backing-store reads and
//!   write-backs for the same accesses.
//!
//! Invariants: a dirty block leaves NVRAM only after the backing store has it durably
//! (written and synced); a slot's data is written before the index entry naming it, and a
//! slot is reused only once its entry says free, so a crash at any point leaves NVRAM plus
//! the backing store equal to the acknowledged writes; reads consult NVRAM, then DRAM, then
//! the backing store, and a block is in at most one tier, so no read is stale.

mod backing;
mod device;
mod error;
pub mod format;
mod nvram;

pub use device::{
    BLOCK_BYTES, CacheConfig, CacheDevice, CacheStats, PolicyKind, Watermarks, WriteBackReport,
};
pub use error::{CacheError, Result};
pub use nvram::{NvramSummary, summarize_offline};
