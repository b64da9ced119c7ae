//! The space manager of one device: a buddy allocator over 4 KiB pages, kept in DRAM.
//!
//! Blocks are 4 KiB (order 0) to 2 MiB (order 9), aligned to their size. A request of up to
//! 2 MiB takes the smallest block that fits and returns the unused tail at once, so extents
//! are exact to the page; a longer request takes a run of adjacent free 2 MiB blocks. Freeing
//! any page range splits it into aligned blocks and merges each with its free buddy as far as
//! possible, so freeing everything always leaves only maximal blocks.
//!
//! The allocator is never stored: at open, the owner of the space (the file system) reports
//! every extent it holds and they are `reserve`d, so a crash can leak nothing. Freeing or
//! reserving a range that is not wholly allocated (respectively free) is refused, which turns
//! double frees and corrupt owner records into errors instead of silent overlap.

use std::collections::BTreeSet;

/// Allocation unit.
pub const PAGE_BYTES: u64 = 4096;
/// Largest block order: 2^9 pages = 2 MiB.
pub const MAX_ORDER: u32 = 9;
/// Pages in the largest block.
pub const MAX_BLOCK_PAGES: u64 = 1 << MAX_ORDER;

/// A buddy allocator over `total_pages` pages, numbered from 0.
#[derive(Debug, Clone)]
pub struct BuddyAllocator {
    total_pages: u64,
    free_pages: u64,
    /// Free blocks per order, by first page.
    free: Vec<BTreeSet<u64>>,
    /// One bit per page, set when the page is free: frees check for a double free with a
    /// few word operations instead of a search of every order's set (the file system's
    /// checkpoint frees one replaced 4 KiB block per overwrite, so this is on its hot path).
    free_map: Vec<u64>,
}

impl BuddyAllocator {
    /// An allocator with every page free.
    pub fn new(total_pages: u64) -> Self {
        let mut allocator = Self {
            total_pages,
            free_pages: 0,
            free: vec![BTreeSet::new(); MAX_ORDER as usize + 1],
            free_map: vec![0; total_pages.div_ceil(64) as usize],
        };
        for (start, order) in decompose(0, total_pages) {
            allocator.insert_block(start, order);
        }
        allocator
    }

    /// Pages managed.
    pub fn total_pages(&self) -> u64 {
        self.total_pages
    }

    /// Pages free now.
    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    /// Allocates `pages` contiguous pages and returns the first, or `None` when no free range
    /// of that length exists.
    pub fn alloc(&mut self, pages: u64) -> Option<u64> {
        if pages == 0 || pages > self.free_pages {
            return None;
        }
        if pages <= MAX_BLOCK_PAGES {
            let order = pages.next_power_of_two().trailing_zeros();
            let (mut start_order, start) =
                (order..=MAX_ORDER).find_map(|o| self.free[o as usize].first().map(|&b| (o, b)))?;
            self.free[start_order as usize].remove(&start);
            self.free_pages -= 1 << start_order;
            self.mark(start, 1 << start_order, false);
            while start_order > order {
                start_order -= 1;
                self.insert_block(start + (1 << start_order), start_order);
            }
            let block_pages = 1u64 << order;
            for (tail, tail_order) in decompose(start + pages, block_pages - pages) {
                self.insert_block(tail, tail_order);
            }
            return Some(start);
        }
        let blocks = pages.div_ceil(MAX_BLOCK_PAGES);
        let run_start = self.find_run(blocks)?;
        for block in 0..blocks {
            self.free[MAX_ORDER as usize].remove(&(run_start + block * MAX_BLOCK_PAGES));
        }
        self.mark(run_start, blocks * MAX_BLOCK_PAGES, false);
        self.free_pages -= blocks * MAX_BLOCK_PAGES;
        for (tail, tail_order) in decompose(run_start + pages, blocks * MAX_BLOCK_PAGES - pages) {
            self.insert_block(tail, tail_order);
        }
        Some(run_start)
    }

    /// Returns `[start, start + pages)` to the free pool. Every page of it must be allocated.
    pub fn free(&mut self, start: u64, pages: u64) -> Result<(), String> {
        self.check_range(start, pages)?;
        if let Some(page) = self.first_free(start, pages) {
            return Err(format!(
                "pages {start}+{pages} include page {page}, which is free already (double free?)"
            ));
        }
        for (piece, order) in decompose(start, pages) {
            self.insert_block(piece, order);
        }
        Ok(())
    }

    /// Marks `[start, start + pages)` allocated. Every page of it must be free.
    pub fn reserve(&mut self, start: u64, pages: u64) -> Result<(), String> {
        self.check_range(start, pages)?;
        let pieces = decompose(start, pages);
        // Check first, so a refused reservation changes nothing.
        for &(piece, order) in &pieces {
            if self.containing_free_block(piece, order).is_none() {
                return Err(format!(
                    "pages {piece}..{} are not all free (owned twice?)",
                    piece + (1 << order)
                ));
            }
        }
        for (piece, order) in pieces {
            let (mut block, mut block_order) = self
                .containing_free_block(piece, order)
                .expect("checked above");
            self.free[block_order as usize].remove(&block);
            self.free_pages -= 1 << block_order;
            self.mark(block, 1 << block_order, false);
            while block_order > order {
                block_order -= 1;
                let upper = block + (1 << block_order);
                if piece >= upper {
                    self.insert_block_no_merge(block, block_order);
                    block = upper;
                } else {
                    self.insert_block_no_merge(upper, block_order);
                }
            }
            debug_assert_eq!(block, piece);
        }
        Ok(())
    }

    /// Free blocks as (first page, order), for invariant checks and reports.
    pub fn free_blocks(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.free
            .iter()
            .enumerate()
            .flat_map(|(order, set)| set.iter().map(move |&start| (start, order as u32)))
    }

    /// The largest allocation that would succeed now, in pages (runs of 2 MiB blocks count).
    pub fn largest_free_run(&self) -> u64 {
        let top = &self.free[MAX_ORDER as usize];
        let mut best = 0;
        let mut run = 0;
        let mut previous: Option<u64> = None;
        for &block in top {
            run = if previous == Some(block.wrapping_sub(MAX_BLOCK_PAGES)) {
                run + 1
            } else {
                1
            };
            best = best.max(run);
            previous = Some(block);
        }
        if best > 0 {
            return best * MAX_BLOCK_PAGES;
        }
        (0..MAX_ORDER)
            .rev()
            .find(|&o| !self.free[o as usize].is_empty())
            .map_or(0, |o| 1 << o)
    }

    fn check_range(&self, start: u64, pages: u64) -> Result<(), String> {
        match start.checked_add(pages) {
            Some(end) if pages > 0 && end <= self.total_pages => Ok(()),
            _ => Err(format!(
                "pages {start}+{pages} are outside 0..{}",
                self.total_pages
            )),
        }
    }

    /// The first free page in `[start, start + pages)`, if any.
    fn first_free(&self, start: u64, pages: u64) -> Option<u64> {
        map_words(start, pages).find_map(|(word, mask)| {
            let hits = self.free_map[word] & mask;
            (hits != 0).then(|| word as u64 * 64 + u64::from(hits.trailing_zeros()))
        })
    }

    /// Sets (`free`) or clears the free-map bits of `[start, start + pages)`.
    fn mark(&mut self, start: u64, pages: u64, free: bool) {
        for (word, mask) in map_words(start, pages) {
            if free {
                self.free_map[word] |= mask;
            } else {
                self.free_map[word] &= !mask;
            }
        }
    }

    fn containing_free_block(&self, piece: u64, order: u32) -> Option<(u64, u32)> {
        (order..=MAX_ORDER).find_map(|o| {
            let block = piece & !((1u64 << o) - 1);
            self.free[o as usize].contains(&block).then_some((block, o))
        })
    }

    fn find_run(&self, blocks: u64) -> Option<u64> {
        let mut run_start = None;
        let mut run = 0;
        let mut previous: Option<u64> = None;
        for &block in &self.free[MAX_ORDER as usize] {
            if previous == Some(block.wrapping_sub(MAX_BLOCK_PAGES)) {
                run += 1;
            } else {
                run_start = Some(block);
                run = 1;
            }
            if run == blocks {
                return run_start;
            }
            previous = Some(block);
        }
        None
    }

    /// Frees one aligned block, merging it with its free buddy upwards.
    fn insert_block(&mut self, mut start: u64, mut order: u32) {
        self.free_pages += 1 << order;
        self.mark(start, 1 << order, true);
        while order < MAX_ORDER {
            let buddy = start ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            start = start.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(start);
    }

    /// Adds a block that cannot have a free buddy (the other half of a split being reserved).
    fn insert_block_no_merge(&mut self, start: u64, order: u32) {
        self.free_pages += 1 << order;
        self.mark(start, 1 << order, true);
        self.free[order as usize].insert(start);
    }
}

/// The free-map words `[start, start + pages)` touches, each with the mask of its bits.
fn map_words(start: u64, pages: u64) -> impl Iterator<Item = (usize, u64)> {
    let end = start + pages;
    let mut page = start;
    std::iter::from_fn(move || {
        if page >= end {
            return None;
        }
        let (word, bit) = ((page / 64) as usize, page % 64);
        let span = (64 - bit).min(end - page);
        let mask = if span == 64 {
            u64::MAX
        } else {
            ((1u64 << span) - 1) << bit
        };
        page += span;
        Some((word, mask))
    })
}

/// Splits `[start, start + pages)` into the fewest aligned power-of-two blocks of at most
/// 2 MiB, in address order.
pub fn decompose(mut start: u64, mut pages: u64) -> Vec<(u64, u32)> {
    let mut pieces = Vec::new();
    while pages > 0 {
        let alignment = if start == 0 {
            MAX_ORDER
        } else {
            start.trailing_zeros().min(MAX_ORDER)
        };
        let fits = 63 - pages.leading_zeros();
        let order = alignment.min(fits);
        pieces.push((start, order));
        start += 1 << order;
        pages -= 1 << order;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decomposes_into_aligned_blocks() {
        assert_eq!(decompose(0, 1), vec![(0, 0)]);
        assert_eq!(decompose(3, 6), vec![(3, 0), (4, 2), (8, 0)]);
        assert_eq!(decompose(0, 1536), vec![(0, 9), (512, 9), (1024, 9)]);
    }

    #[test]
    fn exact_extents_and_full_coalescing() {
        let mut buddy = BuddyAllocator::new(1024);
        let a = buddy.alloc(3).unwrap();
        let b = buddy.alloc(1).unwrap();
        assert_eq!(
            (a, b),
            (0, 3),
            "the unused tail of a's 4-page block is reused at once"
        );
        assert_eq!(buddy.free_pages(), 1020);
        buddy.free(a, 3).unwrap();
        buddy.free(b, 1).unwrap();
        assert_eq!(
            buddy.free_blocks().collect::<Vec<_>>(),
            vec![(0, 9), (512, 9)]
        );
    }

    #[test]
    fn runs_longer_than_the_largest_block() {
        let mut buddy = BuddyAllocator::new(4 * 512);
        let first = buddy.alloc(1).unwrap();
        let run = buddy.alloc(2 * 512 + 7).unwrap();
        assert_eq!(
            run, 512,
            "needs three whole 2 MiB blocks after the one split for page 0"
        );
        assert_eq!(buddy.free_pages(), 4 * 512 - 1 - (2 * 512 + 7));
        assert_eq!(
            buddy.alloc(2 * 512),
            None,
            "no two adjacent whole blocks remain"
        );
        buddy.free(run, 2 * 512 + 7).unwrap();
        buddy.free(first, 1).unwrap();
        assert_eq!(buddy.free_pages(), 4 * 512);
    }

    #[test]
    fn double_free_and_double_reserve_are_refused() {
        let mut buddy = BuddyAllocator::new(64);
        let a = buddy.alloc(8).unwrap();
        buddy.free(a, 8).unwrap();
        assert!(buddy.free(a, 8).unwrap_err().contains("double free"));
        buddy.reserve(8, 4).unwrap();
        assert!(buddy.reserve(10, 4).unwrap_err().contains("not all free"));
        assert_eq!(
            buddy.free_pages(),
            60,
            "a refused reservation changes nothing"
        );
        assert!(buddy.free(60, 8).is_err(), "outside the device");
    }
}
