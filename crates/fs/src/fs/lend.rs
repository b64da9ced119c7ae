//! Lending a file's bytes in place (`File::read_with`): the one place the file system makes
//! shared references into persistent memory, and so the one place it calls an `unsafe`
//! function.
//!
//! `pmem::Region::lend` needs a promise that nothing stores to the lent ranges while the
//! closure runs. The file system keeps it by its ownership of memory and its range locks, and
//! this function takes the range guard itself, so that it cannot be called without holding
//! the range it lends.

#![allow(
    unsafe_code,
    reason = "Region::lend's contract, kept by the range lock this function borrows"
)]

use pmem::Region;

use super::{Inner, ZEROS};
use crate::error::Result;
use crate::inode::Inode;
use crate::range_lock::RangeGuard;

/// Lends `[offset, offset + len)` of `inode` to `f` as slices, in file order: the persistent
/// memory holding each byte (newest logged data over checkpointed extents) and [`ZEROS`] for
/// holes.
///
/// # Panics
/// When `range` does not hold `[offset, offset + len)` of this inode's locks.
pub(crate) fn lend<R>(
    inner: &Inner,
    inode: &Inode,
    range: &RangeGuard<'_>,
    offset: u64,
    len: u64,
    f: impl FnOnce(&[&[u8]]) -> R,
) -> Result<R> {
    assert!(
        range.covers(&inner.range_locks, inode.ino, offset, len),
        "lending bytes {offset}..{} of a file without holding them",
        offset + len
    );
    let pieces = inner.pieces(inode, offset, len)?;
    let parts: Vec<(&Region, u64, u64)> = pieces
        .iter()
        .filter_map(|&(len, place)| place.map(|(region, at)| (region, at, len)))
        .collect();
    // SAFETY: every lent range holds bytes of `[offset, offset + len)` of this file: a
    // checkpointed block of its extent map or a logged write's buffer in its overlay. The file
    // system stores to such memory only (a) into a writer's buffer before it enters the
    // overlay, (b) by the checkpoint copying into the file's blocks under an exclusive range
    // lock, (c) by truncation and hole punching, which hold the range exclusively, and (d) after
    // freeing it, which follows its removal from the maps under those same locks. `range`
    // holds the whole range shared (asserted above) for all of `f`, so none of them can
    // happen meanwhile; no other code of this process writes the volume's memory (the volume
    // is locked to this process), and no other process maps it.
    unsafe {
        Region::lend(&parts, |lent| {
            let mut lent = lent.iter();
            let mut slices: Vec<&[u8]> = Vec::with_capacity(pieces.len());
            for &(len, place) in &pieces {
                if place.is_some() {
                    slices.push(lent.next().expect("one lent slice per pmem piece"));
                } else {
                    let mut left = len as usize;
                    while left > 0 {
                        let n = left.min(ZEROS.len());
                        slices.push(&ZEROS[..n]);
                        left -= n;
                    }
                }
            }
            f(&slices)
        })
    }
    .map_err(Into::into)
}
