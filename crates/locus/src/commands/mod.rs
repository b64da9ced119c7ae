//! One module per subcommand, plus the shared volume opener.

pub mod bench;
pub mod cache;
pub mod credentials;
pub mod extend;
pub mod format;
pub mod fsck;
pub mod mount;
pub mod report;
pub mod scrub;
pub mod serve;
pub mod sim;
pub mod status;
pub mod topology;
pub mod tune;
mod volume;
