//! A file's extent map: runs of file blocks (4 KiB) mapped to runs of volume pages.
//!
//! Unmapped blocks are holes and read as zeros. Mapping a range replaces whatever was mapped
//! there and hands back the replaced pieces, which the caller frees once the change is
//! durable. Runs that happen to be contiguous on both sides are not merged: a run is what one
//! write put there, and merging would only save memory for sequential writers.

use std::collections::BTreeMap;

/// Bytes per file block (and per volume page).
pub const BLOCK: u64 = 4096;

/// A mapped run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First file block.
    pub file_block: u64,
    /// Blocks in the run.
    pub blocks: u64,
    /// Global address of the first block's page.
    pub addr: u64,
}

impl Run {
    fn end(&self) -> u64 {
        self.file_block + self.blocks
    }

    /// The part of this run inside `[from, to)`, if any.
    fn clip(&self, from: u64, to: u64) -> Option<Run> {
        let start = self.file_block.max(from);
        let end = self.end().min(to);
        (start < end).then(|| Run {
            file_block: start,
            blocks: end - start,
            addr: self.addr + (start - self.file_block) * BLOCK,
        })
    }
}

/// The runs of one file, keyed by first file block; runs never overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentMap {
    runs: BTreeMap<u64, Run>,
    blocks: u64,
}

impl ExtentMap {
    /// An empty map (a file of holes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Mapped blocks.
    pub fn mapped_blocks(&self) -> u64 {
        self.blocks
    }

    /// Number of runs.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Every run, in file order.
    pub fn runs(&self) -> impl Iterator<Item = Run> + '_ {
        self.runs.values().copied()
    }

    /// Maps `blocks` blocks from `file_block` to the pages at `addr`; returns the pieces that
    /// were mapped there before (to free once the change is durable).
    pub fn map(&mut self, file_block: u64, blocks: u64, addr: u64) -> Vec<Run> {
        let replaced = self.unmap(file_block, file_block + blocks);
        self.runs.insert(
            file_block,
            Run {
                file_block,
                blocks,
                addr,
            },
        );
        self.blocks += blocks;
        replaced
    }

    /// Removes every mapping at or beyond `file_block` (truncation); returns what was mapped.
    pub fn truncate(&mut self, file_block: u64) -> Vec<Run> {
        self.unmap(file_block, u64::MAX)
    }

    /// Removes every mapping of blocks `[from, to)` (a hole punched); returns what was mapped.
    pub fn punch(&mut self, from: u64, to: u64) -> Vec<Run> {
        self.unmap(from, to)
    }

    /// The page of one block, or `None` for a hole.
    pub fn get(&self, file_block: u64) -> Option<u64> {
        let (_, run) = self.runs.range(..=file_block).next_back()?;
        (file_block < run.end()).then(|| run.addr + (file_block - run.file_block) * BLOCK)
    }

    /// The mapped pieces inside `[from, to)` (file blocks), in order; gaps are holes.
    pub fn lookup(&self, from: u64, to: u64) -> Vec<Run> {
        let mut out = Vec::new();
        if let Some((_, run)) = self.runs.range(..from).next_back()
            && let Some(piece) = run.clip(from, to)
        {
            out.push(piece);
        }
        out.extend(
            self.runs
                .range(from..to)
                .filter_map(|(_, run)| run.clip(from, to)),
        );
        out
    }

    /// Removes `[from, to)` and returns the removed pieces; runs straddling an edge are split.
    fn unmap(&mut self, from: u64, to: u64) -> Vec<Run> {
        let mut affected: Vec<Run> = Vec::new();
        if let Some((_, run)) = self.runs.range(..from).next_back()
            && run.end() > from
        {
            affected.push(*run);
        }
        affected.extend(self.runs.range(from..to).map(|(_, run)| *run));
        let mut removed = Vec::with_capacity(affected.len());
        for run in affected {
            self.runs.remove(&run.file_block);
            self.blocks -= run.blocks;
            if let Some(left) = run.clip(run.file_block, from) {
                self.runs.insert(left.file_block, left);
                self.blocks += left.blocks;
            }
            if let Some(right) = run.clip(to, run.end()) {
                self.runs.insert(right.file_block, right);
                self.blocks += right.blocks;
            }
            if let Some(middle) = run.clip(from, to) {
                removed.push(middle);
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block-by-block model: file block -> page address.
    fn model_of(map: &ExtentMap, upto: u64) -> Vec<Option<u64>> {
        (0..upto).map(|b| map.get(b)).collect()
    }

    #[test]
    fn mapping_over_runs_splits_them_and_returns_the_replaced_pages() {
        let mut map = ExtentMap::new();
        assert!(map.map(0, 10, 1 << 20).is_empty());
        let replaced = map.map(3, 2, 9 << 20);
        assert_eq!(
            replaced,
            vec![Run {
                file_block: 3,
                blocks: 2,
                addr: (1 << 20) + 3 * BLOCK
            }]
        );
        assert_eq!(map.get(2), Some((1 << 20) + 2 * BLOCK));
        assert_eq!(map.get(3), Some(9 << 20));
        assert_eq!(map.get(4), Some((9 << 20) + BLOCK));
        assert_eq!(map.get(5), Some((1 << 20) + 5 * BLOCK));
        assert_eq!(map.get(10), None);
        assert_eq!(map.mapped_blocks(), 10);
        assert_eq!(map.run_count(), 3);
    }

    #[test]
    fn truncate_returns_everything_beyond() {
        let mut map = ExtentMap::new();
        map.map(0, 4, 0x10000);
        map.map(8, 4, 0x90000);
        let freed: u64 = map.truncate(2).iter().map(|r| r.blocks).sum();
        assert_eq!(freed, 6);
        assert_eq!(map.mapped_blocks(), 2);
        assert_eq!(map.get(1), Some(0x10000 + BLOCK));
        assert_eq!(map.get(2), None);
        assert_eq!(map.lookup(0, 100).len(), 1);
    }

    proptest::proptest! {
        /// Random maps and truncations agree with a per-block model, and every page handed
        /// back is one the model held.
        #[test]
        fn agrees_with_a_block_model(ops in proptest::collection::vec((0u64..64, 1u64..16, proptest::bool::ANY), 1..60)) {
            let mut map = ExtentMap::new();
            let mut model: Vec<Option<u64>> = vec![None; 80];
            let mut next_addr = 1u64 << 30;
            for (start, len, truncate) in ops {
                let mut expect_freed: Vec<u64> = Vec::new();
                let freed = if truncate {
                    for slot in model.iter_mut().skip(start as usize) {
                        expect_freed.extend(slot.take());
                    }
                    map.truncate(start)
                } else {
                    let addr = next_addr;
                    next_addr += len * BLOCK;
                    for b in start..start + len {
                        expect_freed.extend(model[b as usize].replace(addr + (b - start) * BLOCK));
                    }
                    map.map(start, len, addr)
                };
                let mut got: Vec<u64> = freed
                    .iter()
                    .flat_map(|r| (0..r.blocks).map(move |i| r.addr + i * BLOCK))
                    .collect();
                got.sort_unstable();
                expect_freed.sort_unstable();
                proptest::prop_assert_eq!(got, expect_freed);
                proptest::prop_assert_eq!(model_of(&map, 80), model.clone());
                let pieces = map.lookup(5, 40);
                let covered: u64 = pieces.iter().map(|r| r.blocks).sum();
                let expect = model[5..40].iter().filter(|m| m.is_some()).count() as u64;
                proptest::prop_assert_eq!(covered, expect);
            }
        }
    }
}
