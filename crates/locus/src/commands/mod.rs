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

/// The end of the "recovery replayed ..." line for `torn` writes a crash cut short (open
/// dropped them: their data failed the checksums their records carry, so they never
/// returned); nothing when there were none.
pub(crate) fn torn_note(torn: u64) -> String {
    if torn == 0 {
        String::new()
    } else {
        format!("; {torn} write(s) a crash cut short (never acknowledged) were dropped")
    }
}
