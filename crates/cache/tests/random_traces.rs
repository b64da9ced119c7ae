//! On random traces and capacities: every action of every policy is legal and the tiers
//! never exceed their capacity; NBM, NVLRU and the unified LRU follow their documented rules
//! exactly (each against a reference model that spells its rule out). NV-MIN is not an
//! optimum (it can lose to NBM and NVLRU, with or without DRAM: `hand_computed_traces.rs`), so
//! no ordering between the policies is asserted — but on small traces none of them may cost
//! less than the exact optimum (`common/oracle.rs`, dynamic programming over cache states).

mod common;

use cache::{Access, Capacity, Lru, Nbm, NvLru, NvMin, Op, nvmin};
use common::run_checked;
use proptest::prelude::*;

fn accesses() -> impl Strategy<Value = Vec<Access>> {
    let blocks = 1u32..24;
    blocks.prop_flat_map(|blocks| {
        prop::collection::vec(
            (0..blocks, prop::bool::weighted(0.4)).prop_map(|(block, write)| Access {
                block,
                op: if write { Op::Write } else { Op::Read },
            }),
            0..400,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn every_action_of_every_policy_is_legal(
        accesses in accesses(),
        dram_blocks in 1usize..8,
        nvram_blocks in 0usize..8,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        let futures = nvmin::futures(&accesses).unwrap();
        let nvmin = run_checked(&mut NvMin::new(capacity, &futures), &accesses, capacity, false);
        let nbm = run_checked(&mut Nbm::new(capacity), &accesses, capacity, false);
        let nvlru = run_checked(&mut NvLru::new(capacity), &accesses, capacity, false);
        run_checked(&mut Lru::new(capacity), &accesses, capacity, true);
        // Every policy served every access.
        for counters in [&nvmin, &nbm, &nvlru] {
            prop_assert_eq!(counters.accesses, accesses.len() as u64);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn without_dram_every_action_is_still_legal(accesses in accesses(), nvram_blocks in 0usize..8) {
        let capacity = Capacity { dram_blocks: 0, nvram_blocks };
        let futures = nvmin::futures(&accesses).unwrap();
        run_checked(&mut NvMin::new(capacity, &futures), &accesses, capacity, false);
        run_checked(&mut Nbm::new(capacity), &accesses, capacity, false);
        run_checked(&mut NvLru::new(capacity), &accesses, capacity, false);
        run_checked(&mut Lru::new(capacity), &accesses, capacity, true);
    }
}

/// NBM's documented rule, spelled out with explicit orders (O(cache) per access): DRAM
/// evicts the least recently read block; NVRAM the least recently written; a written-back
/// block with a read history moves into DRAM when there is room or when its last read is more
/// recent than DRAM's least recently read block (then evicted), taking its place in DRAM's
/// order by that last read. Returns (storage reads, write-backs and write-throughs).
fn nbm_by_the_rule(accesses: &[Access], capacity: Capacity) -> (u64, u64) {
    use std::collections::HashMap;
    let (mut reads, mut writebacks) = (0u64, 0u64);
    let mut dram: Vec<(u32, u64)> = Vec::new(); // (block, place in the read order)
    let mut nvram: Vec<u32> = Vec::new();
    let mut last_read: HashMap<u32, u64> = HashMap::new();
    let mut last_write: HashMap<u32, u64> = HashMap::new();
    let evict_lrr = |dram: &mut Vec<(u32, u64)>| {
        let at = (0..dram.len()).min_by_key(|&i| dram[i].1).expect("full");
        dram.remove(at);
    };
    for (i, access) in accesses.iter().enumerate() {
        let now = i as u64 + 1;
        let b = access.block;
        match access.op {
            Op::Read => {
                if let Some(entry) = dram.iter_mut().find(|e| e.0 == b) {
                    entry.1 = now;
                } else if nvram.contains(&b) {
                } else if capacity.dram_blocks == 0 {
                    reads += 1;
                } else {
                    if dram.len() == capacity.dram_blocks {
                        evict_lrr(&mut dram);
                    }
                    reads += 1;
                    dram.push((b, now));
                }
                last_read.insert(b, now);
            }
            Op::Write => {
                if nvram.contains(&b) {
                } else if capacity.nvram_blocks == 0 {
                    writebacks += 1;
                } else {
                    dram.retain(|e| e.0 != b);
                    if nvram.len() == capacity.nvram_blocks {
                        let at = (0..nvram.len())
                            .min_by_key(|&i| last_write[&nvram[i]])
                            .expect("full");
                        let victim = nvram.remove(at);
                        writebacks += 1;
                        if let Some(&read) = last_read.get(&victim)
                            && capacity.dram_blocks > 0
                        {
                            if dram.len() < capacity.dram_blocks {
                                dram.push((victim, read));
                            } else if read > dram.iter().map(|e| e.1).min().expect("full") {
                                evict_lrr(&mut dram);
                                dram.push((victim, read));
                            }
                        }
                    }
                    nvram.push(b);
                }
                last_write.insert(b, now);
            }
        }
    }
    (reads, writebacks)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// NBM's lazy queues give exactly what the rule spelled out gives, whatever state the
    /// queues are in (a written-back block whose read stamp left the queue long ago included).
    #[test]
    fn nbm_follows_its_documented_rule(
        accesses in accesses(),
        dram_blocks in 0usize..6,
        nvram_blocks in 0usize..6,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        let nbm = run_checked(&mut Nbm::new(capacity), &accesses, capacity, false);
        prop_assert_eq!(
            (nbm.storage_reads, nbm.writebacks),
            nbm_by_the_rule(&accesses, capacity)
        );
    }
}

/// NVLRU's documented rule, spelled out (O(cache) per access): clean blocks in DRAM under
/// LRU, dirty blocks in NVRAM under one LRU ordered by every access to them, reads and writes;
/// a read miss loads into DRAM (evicting its least recently used block), or reads through
/// when there is no DRAM; a write makes the block dirty in NVRAM (dropping a DRAM copy,
/// evicting NVRAM's least recently used block, which is written back and leaves the cache),
/// or writes through when there is no NVRAM. Returns (storage reads, write-backs and
/// write-throughs).
fn nvlru_by_the_rule(accesses: &[Access], capacity: Capacity) -> (u64, u64) {
    let (mut reads, mut writebacks) = (0u64, 0u64);
    // (block, last use) per tier.
    let mut dram: Vec<(u32, u64)> = Vec::new();
    let mut nvram: Vec<(u32, u64)> = Vec::new();
    let oldest = |tier: &Vec<(u32, u64)>| (0..tier.len()).min_by_key(|&i| tier[i].1).expect("full");
    for (i, access) in accesses.iter().enumerate() {
        let now = i as u64 + 1;
        let b = access.block;
        match access.op {
            Op::Read => {
                if let Some(entry) = dram.iter_mut().chain(nvram.iter_mut()).find(|e| e.0 == b) {
                    entry.1 = now;
                } else if capacity.dram_blocks == 0 {
                    reads += 1;
                } else {
                    if dram.len() == capacity.dram_blocks {
                        dram.remove(oldest(&dram));
                    }
                    reads += 1;
                    dram.push((b, now));
                }
            }
            Op::Write => {
                if let Some(entry) = nvram.iter_mut().find(|e| e.0 == b) {
                    entry.1 = now;
                } else if capacity.nvram_blocks == 0 {
                    writebacks += 1;
                } else {
                    dram.retain(|e| e.0 != b);
                    if nvram.len() == capacity.nvram_blocks {
                        nvram.remove(oldest(&nvram));
                        writebacks += 1;
                    }
                    nvram.push((b, now));
                }
            }
        }
    }
    (reads, writebacks)
}

/// The unified LRU's documented rule: one cache of DRAM + NVRAM blocks under LRU over every
/// access; a miss takes the least recently used block's place (written back if dirty); a
/// write dirties the block in place; with no capacity at all, reads and writes go through.
fn lru_by_the_rule(accesses: &[Access], capacity: Capacity) -> (u64, u64) {
    let size = capacity.dram_blocks + capacity.nvram_blocks;
    let (mut reads, mut writebacks) = (0u64, 0u64);
    // (block, dirty, last use)
    let mut cache: Vec<(u32, bool, u64)> = Vec::new();
    for (i, access) in accesses.iter().enumerate() {
        let now = i as u64 + 1;
        let write = access.op == Op::Write;
        if let Some(entry) = cache.iter_mut().find(|e| e.0 == access.block) {
            entry.1 |= write;
            entry.2 = now;
            continue;
        }
        if size == 0 {
            if write {
                writebacks += 1;
            } else {
                reads += 1;
            }
            continue;
        }
        if cache.len() == size {
            let at = (0..cache.len()).min_by_key(|&i| cache[i].2).expect("full");
            if cache.remove(at).1 {
                writebacks += 1;
            }
        }
        if !write {
            reads += 1;
        }
        cache.push((access.block, write, now));
    }
    (reads, writebacks)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// NVLRU's and the unified LRU's lazy queues give exactly what their rules spelled out
    /// give, whatever state the queues are in.
    #[test]
    fn nvlru_and_lru_follow_their_documented_rules(
        accesses in accesses(),
        dram_blocks in 0usize..6,
        nvram_blocks in 0usize..6,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        let nvlru = run_checked(&mut NvLru::new(capacity), &accesses, capacity, false);
        prop_assert_eq!(
            (nvlru.storage_reads, nvlru.writebacks),
            nvlru_by_the_rule(&accesses, capacity)
        );
        let lru = run_checked(&mut Lru::new(capacity), &accesses, capacity, true);
        prop_assert_eq!(
            (lru.storage_reads, lru.writebacks),
            lru_by_the_rule(&accesses, capacity)
        );
    }
}

/// Accesses interleaved with background write-backs (`None`).
fn accesses_and_write_backs() -> impl Strategy<Value = Vec<Option<Access>>> {
    let blocks = 1u32..24;
    blocks.prop_flat_map(|blocks| {
        prop::collection::vec(
            prop::option::weighted(
                0.8,
                (0..blocks, prop::bool::weighted(0.5)).prop_map(|(block, write)| Access {
                    block,
                    op: if write { Op::Write } else { Op::Read },
                }),
            ),
            0..400,
        )
    })
}

/// Runs `steps` through a policy that writes back ahead, checking every action; each write-
/// back ahead removes exactly one dirty block, or reports nothing when none is dirty.
fn run_ahead<P: cache::WriteBackAhead>(
    policy: &mut P,
    steps: &[Option<Access>],
    capacity: Capacity,
) {
    let mut cache = common::CheckedCache::new(capacity, false);
    for step in steps {
        match *step {
            Some(access) => {
                cache.current = Some(access);
                policy.access(access, &mut cache);
            }
            None => {
                // Not an access: only write-backs and moves may follow.
                cache.current = Some(Access {
                    block: u32::MAX,
                    op: Op::Read,
                });
                let dirty = cache.nvram.len();
                let wrote = policy.write_back_next(&mut cache);
                assert_eq!(wrote, dirty > 0);
                assert_eq!(cache.nvram.len(), dirty.saturating_sub(1));
            }
        }
        assert_eq!(policy.dirty_blocks(), cache.nvram.len());
        assert_eq!(policy.clean_blocks(), cache.dram.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn writing_back_ahead_keeps_every_action_legal(
        steps in accesses_and_write_backs(),
        dram_blocks in 0usize..8,
        nvram_blocks in 1usize..8,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        run_ahead(&mut Nbm::new(capacity), &steps, capacity);
        run_ahead(&mut NvLru::new(capacity), &steps, capacity);
    }
}

/// Accesses with discards (`(true, block)`) among them.
fn accesses_and_discards() -> impl Strategy<Value = Vec<(bool, Access)>> {
    let blocks = 1u32..24;
    blocks.prop_flat_map(|blocks| {
        prop::collection::vec(
            (
                prop::bool::weighted(0.15),
                0..blocks,
                prop::bool::weighted(0.5),
            )
                .prop_map(|(discard, block, write)| {
                    let op = if write { Op::Write } else { Op::Read };
                    (discard, Access { block, op })
                }),
            0..400,
        )
    })
}

/// Runs `steps` through a policy, discarding where asked, checking every action: a discard
/// removes the block from whichever tier holds it and nothing else.
fn run_discards<P: cache::Discard>(
    policy: &mut P,
    steps: &[(bool, Access)],
    capacity: Capacity,
    unified: bool,
) {
    let mut cache = common::CheckedCache::new(capacity, unified);
    for &(discard, access) in steps {
        cache.current = Some(access);
        if discard {
            let (dram, nvram) = (cache.dram.clone(), cache.nvram.clone());
            policy.discard(access.block, &mut cache);
            let mut want_dram = dram.clone();
            want_dram.remove(&access.block);
            let mut want_nvram = nvram.clone();
            want_nvram.remove(&access.block);
            assert_eq!(cache.dram, want_dram, "discard of {}", access.block);
            assert_eq!(cache.nvram, want_nvram, "discard of {}", access.block);
        } else {
            policy.access(access, &mut cache);
        }
        assert_eq!(policy.dirty_blocks(), cache.nvram.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn discarding_keeps_every_action_legal(
        steps in accesses_and_discards(),
        dram_blocks in 0usize..8,
        nvram_blocks in 0usize..8,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        run_discards(&mut Nbm::new(capacity), &steps, capacity, false);
        run_discards(&mut NvLru::new(capacity), &steps, capacity, false);
        run_discards(&mut Lru::new(capacity), &steps, capacity, true);
    }
}

/// Small traces: few blocks, so that the exact optimum is computable.
fn small_traces() -> impl Strategy<Value = Vec<Access>> {
    (1u32..7).prop_flat_map(|blocks| {
        prop::collection::vec(
            (0..blocks, prop::bool::weighted(0.45)).prop_map(|(block, write)| Access {
                block,
                op: if write { Op::Write } else { Op::Read },
            }),
            0..18,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// No policy — NBM, NVLRU, or the paper's clairvoyant NV-MIN — ever costs less than the
    /// exact optimum, and each reaches it on some traces (checked below by hand).
    #[test]
    fn no_policy_beats_the_exact_optimum(
        accesses in small_traces(),
        dram_blocks in 0usize..4,
        nvram_blocks in 0usize..4,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        let optimum = common::oracle::optimum(&accesses, capacity);
        let futures = nvmin::futures(&accesses).unwrap();
        let cost = |c: cache::Counters| c.storage_accesses();
        for (name, paid) in [
            ("nbm", cost(run_checked(&mut Nbm::new(capacity), &accesses, capacity, false))),
            ("nvlru", cost(run_checked(&mut NvLru::new(capacity), &accesses, capacity, false))),
            ("nvmin", cost(run_checked(&mut NvMin::new(capacity, &futures), &accesses, capacity, false))),
        ] {
            prop_assert!(paid >= optimum, "{} paid {} below the optimum {}", name, paid, optimum);
        }
    }
}
