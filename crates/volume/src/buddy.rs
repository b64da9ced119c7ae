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

use std::collections::{BTreeMap, BTreeSet};

/// Allocation unit.
pub const PAGE_BYTES: u64 = 4096;
/// Largest block order: 2^9 pages = 2 MiB.
pub const MAX_ORDER: u32 = 9;
/// Pages in the largest block.
pub const MAX_BLOCK_PAGES: u64 = 1 << MAX_ORDER;

/// A buddy allocator over `total_pages` pages, numbered from 0.
///
/// Its memory grows with how fragmented the free space is, not with the device: free
/// largest blocks are kept as runs (one entry for a free device of any size), and the page
/// map is all zeros for free pages, so the zeroed memory the system hands out for it stays
/// unwritten — and unbacked — until pages are allocated. Every program opening a volume
/// builds its allocators; with a set entry per free 2 MiB and a map written whole, a 1 TiB
/// device cost each of them 0.1 s and 50 MB before its first byte.
#[derive(Debug, Clone)]
pub struct BuddyAllocator {
    total_pages: u64,
    free_pages: u64,
    /// Free blocks of orders below the largest, by first page.
    free: [BTreeSet<u64>; MAX_ORDER as usize],
    /// Free largest blocks, as maximal runs of adjacent ones.
    runs: Runs,
    /// One bit per page, set when the page is allocated: frees check for a double free with
    /// a few word operations instead of a search of every order's set (the file system's
    /// checkpoint frees one replaced 4 KiB block per overwrite, so this is on its hot path).
    used_map: Vec<u64>,
}

/// Free largest blocks as maximal runs: first page -> the page after the run. Runs never
/// touch (adjacent ones are merged), so a range of free largest blocks lies in one run.
#[derive(Debug, Clone, Default)]
struct Runs(BTreeMap<u64, u64>);

impl Runs {
    /// The run holding `page`, as (first, end).
    fn holding(&self, page: u64) -> Option<(u64, u64)> {
        self.0
            .range(..=page)
            .next_back()
            .filter(|&(_, &end)| page < end)
            .map(|(&first, &end)| (first, end))
    }

    /// Whether every page of `[start, start + pages)` is in a run.
    fn covers(&self, start: u64, pages: u64) -> bool {
        self.holding(start)
            .is_some_and(|(_, end)| start + pages <= end)
    }

    /// Takes `[start, start + pages)`, which [`Runs::covers`] holds, out of its run.
    fn take(&mut self, start: u64, pages: u64) {
        let (first, end) = self.holding(start).expect("taken from a free run");
        debug_assert!(start + pages <= end);
        if first == start {
            self.0.remove(&first);
        } else {
            self.0.insert(first, start);
        }
        if start + pages < end {
            self.0.insert(start + pages, end);
        }
    }

    /// Adds `[start, start + pages)`, free of every run, merging with the runs it touches.
    fn put(&mut self, start: u64, pages: u64) {
        let mut first = start;
        let mut end = start + pages;
        if let Some((&before, &before_end)) = self.0.range(..start).next_back()
            && before_end == start
        {
            self.0.remove(&before);
            first = before;
        }
        if let Some(after_end) = self.0.remove(&end) {
            end = after_end;
        }
        self.0.insert(first, end);
    }

    /// The first page of the first run of at least `pages` pages.
    fn first_fit(&self, pages: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|&(&first, &end)| end - first >= pages)
            .map(|(&first, _)| first)
    }
}

/// `[start, start + pages)` split at largest-block boundaries: the blocks before the first
/// boundary, the whole largest blocks as one range, and the blocks after the last — each
/// end's pieces as `decompose` gives them (fewer than nine of each), so a range of any
/// length costs a run operation, not one per 2 MiB.
struct Split {
    head: Vec<(u64, u32)>,
    middle: u64,
    middle_pages: u64,
    tail: Vec<(u64, u32)>,
}

impl Split {
    fn new(start: u64, pages: u64) -> Self {
        let end = start + pages;
        let middle = start.next_multiple_of(MAX_BLOCK_PAGES).min(end);
        let middle_end = (end / MAX_BLOCK_PAGES * MAX_BLOCK_PAGES).max(middle);
        Self {
            head: decompose(start, middle - start),
            middle,
            middle_pages: middle_end - middle,
            tail: decompose(middle_end, end - middle_end),
        }
    }

    /// The pieces of both ends.
    fn ends(self) -> impl Iterator<Item = (u64, u32)> {
        self.head.into_iter().chain(self.tail)
    }
}

impl BuddyAllocator {
    /// An allocator with every page free.
    pub fn new(total_pages: u64) -> Self {
        let mut allocator = Self {
            total_pages,
            free_pages: total_pages,
            free: Default::default(),
            runs: Runs::default(),
            // Zeroed memory from the system: untouched until a page is allocated.
            used_map: vec![0; total_pages.div_ceil(64) as usize],
        };
        // From page 0 the pieces are maximal already: nothing to merge.
        let split = Split::new(0, total_pages);
        if split.middle_pages > 0 {
            allocator.runs.put(split.middle, split.middle_pages);
        }
        for (start, order) in split.tail {
            allocator.free[order as usize].insert(start);
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

    /// Entries the allocator keeps to describe its free space (runs of largest blocks and
    /// smaller free blocks): what its memory grows with, besides a bit per allocated page.
    pub fn free_entries(&self) -> usize {
        self.runs.0.len() + self.free.iter().map(BTreeSet::len).sum::<usize>()
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
                (order..=MAX_ORDER).find_map(|o| self.first_free_block(o).map(|b| (o, b)))?;
            self.remove_block(start, start_order);
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
        let run_pages = pages.div_ceil(MAX_BLOCK_PAGES) * MAX_BLOCK_PAGES;
        let run_start = self.runs.first_fit(run_pages)?;
        self.runs.take(run_start, run_pages);
        self.mark(run_start, run_pages, false);
        self.free_pages -= run_pages;
        for (tail, tail_order) in decompose(run_start + pages, run_pages - pages) {
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
        let split = Split::new(start, pages);
        let (middle, middle_pages) = (split.middle, split.middle_pages);
        if middle_pages > 0 {
            self.free_pages += middle_pages;
            self.mark(middle, middle_pages, true);
            self.runs.put(middle, middle_pages);
        }
        for (piece, order) in split.ends() {
            self.insert_block(piece, order);
        }
        Ok(())
    }

    /// Marks `[start, start + pages)` allocated. Every page of it must be free.
    pub fn reserve(&mut self, start: u64, pages: u64) -> Result<(), String> {
        self.check_range(start, pages)?;
        let split = Split::new(start, pages);
        let (middle, middle_pages) = (split.middle, split.middle_pages);
        // Check first, so a refused reservation changes nothing. The ends' pieces lie in
        // largest blocks apart from the middle's, so taking one never changes another's check.
        if middle_pages > 0 && !self.runs.covers(middle, middle_pages) {
            let page = (middle..middle + middle_pages)
                .step_by(MAX_BLOCK_PAGES as usize)
                .find(|&block| !self.runs.covers(block, MAX_BLOCK_PAGES))
                .unwrap_or(middle);
            return Err(format!(
                "pages {page}..{} are not all free (owned twice?)",
                page + MAX_BLOCK_PAGES
            ));
        }
        for &(piece, order) in split.head.iter().chain(&split.tail) {
            if self.containing_free_block(piece, order).is_none() {
                return Err(format!(
                    "pages {piece}..{} are not all free (owned twice?)",
                    piece + (1 << order)
                ));
            }
        }
        if middle_pages > 0 {
            self.runs.take(middle, middle_pages);
            self.free_pages -= middle_pages;
            self.mark(middle, middle_pages, false);
        }
        for (piece, order) in split.ends() {
            let (mut block, mut block_order) = self
                .containing_free_block(piece, order)
                .expect("checked above");
            self.remove_block(block, block_order);
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

    /// Free blocks as (first page, order), for invariant checks and reports: one item per
    /// free largest block, so as long as the free space is large.
    pub fn free_blocks(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let smaller = self
            .free
            .iter()
            .enumerate()
            .flat_map(|(order, set)| set.iter().map(move |&start| (start, order as u32)));
        let largest = self.runs.0.iter().flat_map(|(&first, &end)| {
            (first..end)
                .step_by(MAX_BLOCK_PAGES as usize)
                .map(|start| (start, MAX_ORDER))
        });
        smaller.chain(largest)
    }

    /// The largest allocation that would succeed now, in pages (runs of 2 MiB blocks count).
    pub fn largest_free_run(&self) -> u64 {
        let longest = self.runs.0.iter().map(|(&first, &end)| end - first).max();
        if let Some(pages) = longest {
            return pages;
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
            let hits = !self.used_map[word] & mask;
            (hits != 0).then(|| word as u64 * 64 + u64::from(hits.trailing_zeros()))
        })
    }

    /// Clears (`free`) or sets the page-map bits of `[start, start + pages)`.
    fn mark(&mut self, start: u64, pages: u64, free: bool) {
        for (word, mask) in map_words(start, pages) {
            if free {
                self.used_map[word] &= !mask;
            } else {
                self.used_map[word] |= mask;
            }
        }
    }

    /// The lowest free block of `order`.
    fn first_free_block(&self, order: u32) -> Option<u64> {
        if order == MAX_ORDER {
            self.runs.0.first_key_value().map(|(&first, _)| first)
        } else {
            self.free[order as usize].first().copied()
        }
    }

    /// Takes the free block `start` of `order` out of the free lists (it must be free).
    fn remove_block(&mut self, start: u64, order: u32) {
        if order == MAX_ORDER {
            self.runs.take(start, MAX_BLOCK_PAGES);
        } else {
            let removed = self.free[order as usize].remove(&start);
            debug_assert!(removed, "block {start} of order {order} was not free");
        }
    }

    fn is_free_block(&self, start: u64, order: u32) -> bool {
        if order == MAX_ORDER {
            self.runs.covers(start, MAX_BLOCK_PAGES)
        } else {
            self.free[order as usize].contains(&start)
        }
    }

    fn containing_free_block(&self, piece: u64, order: u32) -> Option<(u64, u32)> {
        (order..=MAX_ORDER).find_map(|o| {
            let block = piece & !((1u64 << o) - 1);
            self.is_free_block(block, o).then_some((block, o))
        })
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
        if order == MAX_ORDER {
            self.runs.put(start, MAX_BLOCK_PAGES);
        } else {
            self.free[order as usize].insert(start);
        }
    }

    /// Adds a block below the largest order that cannot have a free buddy (the other half
    /// of a split being reserved).
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

    /// What the allocator keeps grows with the free space's pieces, not the device: a 1 TiB
    /// device, fresh, partly used in a few places, then emptied again, never needs more than
    /// a few dozen entries (with an entry per free 2 MiB block it held 512 Ki).
    #[test]
    fn a_large_device_is_described_by_its_free_runs() {
        let total = (1u64 << 40) / PAGE_BYTES;
        let mut buddy = BuddyAllocator::new(total + 3);
        assert!(buddy.free_entries() <= 3, "{}", buddy.free_entries());
        assert_eq!(buddy.largest_free_run(), total);
        let small = buddy.alloc(3).unwrap();
        let long = buddy.alloc(100_000 * MAX_BLOCK_PAGES + 5).unwrap();
        buddy.reserve(total / 2 + 17, 3 * MAX_BLOCK_PAGES).unwrap();
        let twice = buddy.reserve(total / 2, 2 * MAX_BLOCK_PAGES).unwrap_err();
        assert!(twice.contains("not all free"), "{twice}");
        assert!(buddy.free_entries() <= 40, "{}", buddy.free_entries());
        assert_eq!(
            buddy.free_pages(),
            total + 3 - 3 - (100_000 * MAX_BLOCK_PAGES + 5) - 3 * MAX_BLOCK_PAGES
        );
        buddy.free(long, 100_000 * MAX_BLOCK_PAGES + 5).unwrap();
        buddy.free(small, 3).unwrap();
        buddy.free(total / 2 + 17, 3 * MAX_BLOCK_PAGES).unwrap();
        assert_eq!(buddy.free_pages(), total + 3);
        assert!(buddy.free_entries() <= 3, "{}", buddy.free_entries());
        assert_eq!(
            buddy.alloc(total),
            Some(0),
            "the whole device is one run again"
        );
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
