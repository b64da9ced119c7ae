//! Hybrid DRAM/NVRAM cache policies, as pure code: block accesses in, actions out, no I/O.
//! The trace simulator (`sim`) and the cache device run the very same policies.
//!
//! - [`Nbm`]: separate read (LRR) and write (LRW) recency histories; NVRAM evicts the least
//!   recently written block; a written-back block that was recently read moves to DRAM.
//! - [`NvLru`]: LRU over dirty blocks by any access, LRU over clean blocks.
//! - [`NvMin`]: the paper's clairvoyant NV-MIN, from next-read/next-write times
//!   ([`nvmin::futures`]); the paper calls it optimal, it is not (see its module).
//! - [`Lru`]: one unified LRU of DRAM + NVRAM capacity, ignoring the split (a baseline).
//!
//! Invariants every split policy keeps (checked by replaying their actions in tests): dirty
//! blocks never exceed NVRAM capacity, clean blocks never exceed DRAM capacity, a block is in
//! at most one tier, and every action is legal for the cache's state when it is issued.

mod block_table;
mod lazy_lru;
mod lru;
mod nbm;
mod nvlru;
pub mod nvmin;
mod policy;

pub use lru::Lru;
pub use nbm::Nbm;
pub use nvlru::NvLru;
pub use nvmin::NvMin;
pub use policy::{
    Access, Action, BlockId, Capacity, Counters, Discard, Op, Policy, Sink, Tier, WriteBackAhead,
};
