//! An LRU order kept as a queue of (time, block) stamps: every touch appends a stamp, and a
//! stamp is valid only while it is the block's latest for this order. The oldest valid stamp
//! is the least recently used block. Touches are O(1); each stamp is popped at most once, so
//! finding victims is O(1) amortised; the queue is compacted when stale stamps dominate, so
//! memory stays proportional to the live blocks.

use std::collections::VecDeque;

use crate::policy::BlockId;

/// Times are request sequence numbers, starting at 1 (0 means "never").
pub type Time = u64;

#[derive(Debug, Default)]
pub(crate) struct LazyLru {
    stamps: VecDeque<(Time, BlockId)>,
    /// The time of the newest stamp ever popped from the front: every stamp at or before it
    /// is gone, every later one (unless compacted away as stale) is still queued.
    watermark: Time,
    /// Queue length that triggers the next compaction (doubles with the live stamps, so
    /// compaction stays O(1) amortised).
    compact_at: usize,
}

impl LazyLru {
    /// Whether a stamp of time `time` can still be in the queue.
    #[inline]
    pub(crate) fn may_hold(&self, time: Time) -> bool {
        time > self.watermark
    }

    #[inline]
    pub(crate) fn touch(&mut self, time: Time, block: BlockId) {
        self.stamps.push_back((time, block));
    }

    /// Puts back a stamp older than the watermark (its original left the queue) at its place
    /// in time order: before every queued stamp, among others put back the same way. Such
    /// stamps are few (blocks re-entering an order by an old time), so the walk is short.
    /// A stamp put back earlier and still queued is not added twice.
    pub(crate) fn reinsert_old(&mut self, time: Time, block: BlockId) {
        debug_assert!(!self.may_hold(time), "a stamp still queued is not put back");
        let at = self.stamps.iter().take_while(|&&(t, _)| t < time).count();
        let queued = self
            .stamps
            .iter()
            .skip(at)
            .take_while(|&&(t, _)| t == time)
            .any(|&(_, b)| b == block);
        if !queued {
            self.stamps.insert(at, (time, block));
        }
    }

    /// The oldest stamp for which `valid` holds, removed along with every stale stamp before
    /// it. `on_drop` sees each stale stamp as it is discarded.
    #[inline]
    pub(crate) fn pop_oldest(
        &mut self,
        mut valid: impl FnMut(Time, BlockId) -> bool,
        mut on_drop: impl FnMut(Time, BlockId),
    ) -> Option<(Time, BlockId)> {
        while let Some((time, block)) = self.stamps.pop_front() {
            self.watermark = self.watermark.max(time);
            if valid(time, block) {
                return Some((time, block));
            }
            on_drop(time, block);
        }
        None
    }

    /// Like `pop_oldest`, but leaves the valid stamp in place.
    #[inline]
    pub(crate) fn peek_oldest(
        &mut self,
        mut valid: impl FnMut(Time, BlockId) -> bool,
        mut on_drop: impl FnMut(Time, BlockId),
    ) -> Option<(Time, BlockId)> {
        while let Some(&(time, block)) = self.stamps.front() {
            if valid(time, block) {
                return Some((time, block));
            }
            self.stamps.pop_front();
            self.watermark = self.watermark.max(time);
            on_drop(time, block);
        }
        None
    }

    /// Drops the stamps `keep` rejects once the queue has doubled since the last compaction.
    #[inline]
    pub(crate) fn compact_if_needed(&mut self, mut keep: impl FnMut(Time, BlockId) -> bool) {
        if self.stamps.len() > self.compact_at {
            self.stamps.retain(|&(time, block)| keep(time, block));
            self.compact_at = 2 * self.stamps.len() + 4096;
        }
    }

    /// Stamps queued (live and stale).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.stamps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_stamps_are_compacted_away() {
        let mut lru = LazyLru::default();
        let mut latest = [0u64; 4];
        for time in 1..=1_000_000u64 {
            let block = (time % 4) as BlockId;
            latest[block as usize] = time;
            lru.touch(time, block);
            lru.compact_if_needed(|t, b| latest[b as usize] == t);
        }
        assert!(lru.len() <= 2 * 4 + 4096 + 1, "queue grew to {}", lru.len());
        let oldest = lru.pop_oldest(|t, b| latest[b as usize] == t, |_, _| {});
        assert_eq!(oldest, Some((999_997, 1)));
        assert!(!lru.may_hold(999_997));
        assert!(lru.may_hold(999_998));
    }
}
