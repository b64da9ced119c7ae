//! Persistent memory: the only crate that maps it or stores to it.
//!
//! - [`Device`] maps a backing store whole: emulated (tmpfs file bound to a NUMA node), a DAX
//!   file (`MAP_SYNC`), device-DAX, or an ordinary file (`msync`), and reports which
//!   [`PersistenceMode`] it got.
//! - [`Region`] is a bounds-checked window with the persistence primitives: copy in and out,
//!   atomic aligned 8-byte store/load (the commit primitive), non-temporal bulk copy,
//!   `flush`, `fence`, `persist`. Flush instructions are chosen by CPUID at run time (clwb,
//!   else clflushopt, else clflush) and skipped on eADR platforms.
//! - [`Tracer`] makes recording regions and generates the [`CrashImage`]s a power failure
//!   could leave, for the crash tests of every layer above.
//!
//! Invariants: all `unsafe` of the storage stack's data path lives here, each block with a
//! SAFETY comment; no reference into persistent memory leaves this crate except through
//! `Region::lend`, an `unsafe fn` whose caller promises no store meanwhile; every access is
//! bounds-checked against its region before it is made; on an ordinary file (`Msync`),
//! `write_nt` and `flush` write their range back with `msync` before they return.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("locus's pmem layer uses x86-64 cache-flush instructions");

mod checksum;
mod cpu;
mod device;
mod error;
mod mapping;
mod region;
mod trace;

pub use checksum::data_checksum;
pub use cpu::{CACHE_LINE, FlushInstruction, prefetch, prefetch_for_write};
pub use device::{Device, DeviceKind, DeviceSpec, FlushPolicy, give_back};
pub use error::{PmemError, Result};
pub use mapping::{MsyncRecorder, available_bytes};
pub use region::{PersistenceMode, Region, fence_all};
pub use trace::{CrashImage, CrashImages, Tracer};
