//! The buddy allocator against a model of which pages are in use: random allocations,
//! frees and reservations never overlap, freeing everything coalesces fully, an allocation
//! fails only when the model has no run of free pages the allocator could have used, and a
//! reservation succeeds exactly when every page of it is free.

use proptest::prelude::*;
use volume::buddy::{BuddyAllocator, MAX_BLOCK_PAGES};

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    Free(usize),
    /// Free a range that holds at least one free page: must be refused, changing nothing.
    DoubleFree(u64, u64),
    /// Reserve a range (as an owner's extents are at open): done when all of it is free,
    /// refused and changing nothing otherwise.
    Reserve(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=40).prop_map(Op::Alloc),
        1 => (1u64..=(3 * MAX_BLOCK_PAGES)).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (any::<u64>(), 1u64..=70).prop_map(|(at, pages)| Op::DoubleFree(at, pages)),
        1 => (any::<u64>(), 1u64..=70).prop_map(|(at, pages)| Op::Reserve(at, pages)),
        1 => (any::<u64>(), 1u64..=(6 * MAX_BLOCK_PAGES)).prop_map(|(at, pages)| Op::Reserve(at, pages)),
    ]
}

/// Could an allocation of `pages` have been served from the free pages `used` leaves?
/// Up to one largest block: some aligned block of the rounded-up size must be wholly free.
/// Longer: some run of whole, aligned largest blocks must be free.
fn model_has_room(used: &[bool], pages: u64) -> bool {
    let (unit, units) = if pages <= MAX_BLOCK_PAGES {
        (pages.next_power_of_two(), 1)
    } else {
        (MAX_BLOCK_PAGES, pages.div_ceil(MAX_BLOCK_PAGES))
    };
    let span = (unit * units) as usize;
    (0..used.len())
        .step_by(unit as usize)
        .any(|start| start + span <= used.len() && used[start..start + span].iter().all(|u| !u))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn allocations_match_the_model(
        total in prop_oneof![1u64..(5 * MAX_BLOCK_PAGES), 1u64..(40 * MAX_BLOCK_PAGES)],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut buddy = BuddyAllocator::new(total);
        let mut used = vec![false; total as usize];
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(pages) => match buddy.alloc(pages) {
                    Some(start) => {
                        prop_assert!(start + pages <= total, "extent past the end");
                        for page in start..start + pages {
                            prop_assert!(!used[page as usize], "page {page} handed out twice");
                            used[page as usize] = true;
                        }
                        live.push((start, pages));
                    }
                    None => prop_assert!(
                        !model_has_room(&used, pages),
                        "refused {pages} pages though the model has an aligned free run"
                    ),
                },
                Op::Free(pick) if !live.is_empty() => {
                    let (start, pages) = live.swap_remove(pick % live.len());
                    buddy.free(start, pages).unwrap();
                    for page in start..start + pages {
                        used[page as usize] = false;
                    }
                }
                Op::Free(_) => {}
                Op::DoubleFree(at, pages) => {
                    let start = at % total;
                    let pages = pages.min(total - start);
                    let range = start as usize..(start + pages) as usize;
                    if used[range].iter().any(|u| !u) {
                        let before = buddy.free_pages();
                        prop_assert!(
                            buddy.free(start, pages).is_err(),
                            "freeing {pages} pages at {start} that include a free page was accepted"
                        );
                        prop_assert_eq!(buddy.free_pages(), before);
                    }
                }
                Op::Reserve(at, pages) => {
                    let start = at % total;
                    let pages = pages.min(total - start);
                    let range = start as usize..(start + pages) as usize;
                    let all_free = used[range.clone()].iter().all(|u| !u);
                    let before = buddy.free_pages();
                    let reserved = buddy.reserve(start, pages);
                    prop_assert_eq!(
                        reserved.is_ok(),
                        all_free,
                        "reserving {} pages at {}: {:?}",
                        pages,
                        start,
                        reserved
                    );
                    if all_free {
                        used[range].iter_mut().for_each(|u| *u = true);
                        live.push((start, pages));
                    } else {
                        prop_assert_eq!(buddy.free_pages(), before);
                    }
                }
            }
            let in_use = used.iter().filter(|&&u| u).count() as u64;
            prop_assert_eq!(buddy.free_pages(), total - in_use);
            for (start, order) in buddy.free_blocks() {
                prop_assert_eq!(start % (1 << order), 0, "misaligned free block");
                for page in start..start + (1 << order) {
                    prop_assert!(!used[page as usize], "free block over a used page");
                }
            }
        }
        for (start, pages) in live {
            buddy.free(start, pages).unwrap();
        }
        let fresh: Vec<_> = BuddyAllocator::new(total).free_blocks().collect();
        let mut after: Vec<_> = buddy.free_blocks().collect();
        after.sort_unstable();
        let mut fresh_sorted = fresh;
        fresh_sorted.sort_unstable();
        prop_assert_eq!(after, fresh_sorted, "freeing everything must coalesce fully");
    }

    #[test]
    fn exhaustion_is_none_and_nothing_else(total in 1u64..600) {
        let mut buddy = BuddyAllocator::new(total);
        let mut got = 0;
        while buddy.alloc(1).is_some() {
            got += 1;
        }
        prop_assert_eq!(got, total);
        prop_assert_eq!(buddy.free_pages(), 0);
        prop_assert_eq!(buddy.alloc(1), None);
    }
}
