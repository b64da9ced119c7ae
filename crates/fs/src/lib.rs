//! The crash-atomic library file system (Libpubl) on the volume — its foundations so far:
//!
//! - [`log`]: per-thread log areas of checksummed records that point at persistent user
//!   buffers, persisted before a write returns, retired by the checkpoint through one 8-byte
//!   commit word, recovered with torn records rejected;
//! - [`range_lock`]: per-file range locks at 4 KiB–2 MiB granularity.
//!
//! The namespace, the data path that joins buffers, logs and extents, the checkpoint and the
//! public API are not built yet (issue 5); nothing outside the tests uses this crate.

mod error;
pub mod log;
pub mod range_lock;

pub use error::{FsError, Result};
pub use log::{LogArea, LogRecord};
pub use range_lock::{LockMode, RangeGuard, RangeLocks};
