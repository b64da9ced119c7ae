//! A cache that carries out a policy's actions and checks each is legal.

#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod oracle;

use std::collections::BTreeSet;

use cache::{Access, Action, BlockId, Capacity, Counters, Op, Policy, Sink, Tier};

/// Replays actions against explicit DRAM and NVRAM sets, panicking on the first illegal one.
#[derive(Debug)]
pub struct CheckedCache {
    pub capacity: Capacity,
    /// One unified capacity instead of per-tier limits (for the LRU baseline).
    pub unified: bool,
    pub dram: BTreeSet<BlockId>,
    pub nvram: BTreeSet<BlockId>,
    pub counters: Counters,
    pub current: Option<Access>,
    /// Storage accesses caused by the current access.
    pub storage_now: u32,
}

impl CheckedCache {
    pub fn new(capacity: Capacity, unified: bool) -> Self {
        Self {
            capacity,
            unified,
            dram: BTreeSet::new(),
            nvram: BTreeSet::new(),
            counters: Counters::default(),
            current: None,
            storage_now: 0,
        }
    }

    fn check_capacity(&self, action: Action) {
        if self.unified {
            let total = self.capacity.dram_blocks + self.capacity.nvram_blocks;
            assert!(
                self.dram.len() + self.nvram.len() <= total,
                "over capacity after {action:?}"
            );
        } else {
            assert!(
                self.dram.len() <= self.capacity.dram_blocks,
                "DRAM over capacity after {action:?}"
            );
            assert!(
                self.nvram.len() <= self.capacity.nvram_blocks,
                "NVRAM over capacity after {action:?}"
            );
        }
        assert!(
            self.dram.is_disjoint(&self.nvram),
            "a block in both tiers after {action:?}"
        );
    }
}

impl Sink for CheckedCache {
    fn action(&mut self, action: Action) {
        self.counters.action(action);
        let access = self.current.expect("actions come during an access");
        match action {
            Action::ReadHit { block, tier } => {
                assert_eq!(
                    access,
                    Access {
                        block,
                        op: Op::Read
                    }
                );
                let set = if tier == Tier::Dram {
                    &self.dram
                } else {
                    &self.nvram
                };
                assert!(set.contains(&block), "read hit on {block} not in {tier:?}");
            }
            Action::WriteHit { block } => {
                assert_eq!(
                    access,
                    Access {
                        block,
                        op: Op::Write
                    }
                );
                assert!(
                    self.nvram.contains(&block),
                    "write hit on {block} not dirty"
                );
            }
            Action::Load { block } | Action::Bypass { block } => {
                assert_eq!(
                    access,
                    Access {
                        block,
                        op: Op::Read
                    }
                );
                assert!(
                    !self.dram.contains(&block) && !self.nvram.contains(&block),
                    "miss on cached {block}"
                );
                self.storage_now += 1;
                if matches!(action, Action::Load { .. }) {
                    self.dram.insert(block);
                }
            }
            Action::EvictClean { block } => {
                assert!(self.dram.remove(&block), "evicting {block} not in DRAM");
            }
            Action::PutDirty { block } => {
                assert_eq!(
                    access,
                    Access {
                        block,
                        op: Op::Write
                    }
                );
                assert!(
                    !self.dram.contains(&block),
                    "{block} put dirty while a clean copy is in DRAM"
                );
                assert!(self.nvram.insert(block), "{block} already dirty");
            }
            Action::WriteBack { block } => {
                assert!(
                    self.nvram.remove(&block),
                    "writing back {block} not in NVRAM"
                );
                self.storage_now += 1;
            }
            Action::MoveToDram { block } => {
                assert!(
                    !self.nvram.contains(&block),
                    "moving {block} still in NVRAM"
                );
                assert!(self.dram.insert(block), "{block} already in DRAM");
            }
            Action::DropDirty { block } => {
                assert!(self.nvram.remove(&block), "dropping {block} not in NVRAM");
            }
            Action::WriteThrough { block } => {
                assert_eq!(
                    access,
                    Access {
                        block,
                        op: Op::Write
                    }
                );
                assert!(!self.nvram.contains(&block));
                self.storage_now += 1;
            }
        }
        self.check_capacity(action);
    }
}

/// Runs `accesses` through `policy`, checking every action; returns the counters.
pub fn run_checked<P: Policy>(
    policy: &mut P,
    accesses: &[Access],
    capacity: Capacity,
    unified: bool,
) -> Counters {
    let mut cache = CheckedCache::new(capacity, unified);
    for &access in accesses {
        cache.current = Some(access);
        cache.storage_now = 0;
        cache.counters.accesses += 1;
        policy.access(access, &mut cache);
        assert!(
            cache.storage_now <= 3,
            "one access caused {} storage accesses",
            cache.storage_now
        );
    }
    assert_eq!(
        policy.dirty_blocks(),
        cache.nvram.len(),
        "dirty count disagrees with the actions"
    );
    if !unified {
        assert_eq!(
            policy.clean_blocks(),
            cache.dram.len(),
            "clean count disagrees with the actions"
        );
    }
    cache.counters
}

/// Parses "W a, R b, ..." with single-letter block names.
pub fn trace(text: &str) -> Vec<Access> {
    text.split(',')
        .map(|item| {
            let item = item.trim();
            let (op, name) = item.split_at(1);
            let block = u32::from(name.trim().as_bytes()[0] - b'a');
            let op = match op {
                "R" => Op::Read,
                "W" => Op::Write,
                other => panic!("bad op {other}"),
            };
            Access { block, op }
        })
        .collect()
}
