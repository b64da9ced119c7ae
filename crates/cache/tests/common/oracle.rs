//! The exact offline optimum of the two-tier model, for small traces: dynamic programming
//! over every cache state (which blocks DRAM holds clean, which NVRAM holds dirty).
//!
//! Cost: storage accesses — read misses (`Load`, `Bypass`), write-backs and write-throughs;
//! dirty blocks left at the end are not counted (the simulator reports that final flush
//! apart). The actions are the model's: a read miss is bypassed or loaded into DRAM (evicting
//! any clean block when full); a write to a block not dirty drops its clean copy and goes to
//! NVRAM, writing back any dirty block when NVRAM is full, which may then move into DRAM
//! (evicting any clean block when full); without NVRAM a write goes through.
//!
//! Only demand actions are searched — nothing is evicted or written back before space is
//! needed. That loses nothing: as with Belady's demand-paging argument, an early eviction or
//! write-back can be postponed to the moment its space is used, costing the same and leaving
//! every block cached at least as long. So this is the optimum over every legal schedule, and
//! no policy may cost less (the property tests check exactly that).
//!
//! States are pairs of block sets, at most 3^blocks of them: exact up to a dozen distinct
//! blocks, exponential past that — which is why `locus sim` does not report it on real
//! traces and calls NV-MIN what it is, the paper's clairvoyant heuristic.

use std::collections::HashMap;

use cache::{Access, Capacity, Op};

/// The least storage accesses any schedule needs for `accesses` (blocks numbered below 16).
pub fn optimum(accesses: &[Access], capacity: Capacity) -> u64 {
    assert!(
        accesses.iter().all(|a| a.block < 16),
        "the oracle handles at most 16 distinct blocks"
    );
    let (d, n) = (capacity.dram_blocks as u32, capacity.nvram_blocks as u32);
    // (clean set, dirty set) → least cost so far.
    let mut states: HashMap<(u16, u16), u64> = HashMap::from([((0, 0), 0)]);
    for access in accesses {
        let bit = 1u16 << access.block;
        let mut next: HashMap<(u16, u16), u64> = HashMap::new();
        let mut offer = |state: (u16, u16), cost: u64| {
            let best = next.entry(state).or_insert(u64::MAX);
            *best = (*best).min(cost);
        };
        for (&(clean, dirty), &cost) in &states {
            match access.op {
                Op::Read if (clean | dirty) & bit != 0 => offer((clean, dirty), cost),
                Op::Read => {
                    offer((clean, dirty), cost + 1); // bypass
                    if d > 0 {
                        for loaded in insert(clean, bit, d) {
                            offer((loaded, dirty), cost + 1);
                        }
                    }
                }
                Op::Write if n == 0 => {
                    // Through to storage; a clean copy may stay (it now holds the data).
                    offer((clean, dirty), cost + 1);
                    offer((clean & !bit, dirty), cost + 1);
                }
                Op::Write if dirty & bit != 0 => offer((clean, dirty), cost),
                Op::Write => {
                    let clean = clean & !bit;
                    if dirty.count_ones() < n {
                        offer((clean, dirty | bit), cost);
                        continue;
                    }
                    for victim in bits(dirty) {
                        let dirty = (dirty & !victim) | bit;
                        offer((clean, dirty), cost + 1);
                        if d > 0 {
                            for moved in insert(clean, victim, d) {
                                offer((moved, dirty), cost + 1);
                            }
                        }
                    }
                }
            }
        }
        states = next;
    }
    states.into_values().min().unwrap_or(0)
}

/// The sets `set` can become by taking `bit` in, with at most `limit` members: `bit` added,
/// after dropping any one member when full.
fn insert(set: u16, bit: u16, limit: u32) -> Vec<u16> {
    if set.count_ones() < limit {
        vec![set | bit]
    } else {
        bits(set).map(|out| (set & !out) | bit).collect()
    }
}

fn bits(set: u16) -> impl Iterator<Item = u16> {
    (0..16).map(|i| 1u16 << i).filter(move |b| set & b != 0)
}
