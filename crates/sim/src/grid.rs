//! Running policies over a grid of DRAM and NVRAM sizes, in parallel over the cores, and
//! normalising each result to NVLRU at the same sizes (the NBM paper's Fig. 3 metric).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cache::{Access, Capacity, Counters, Lru, Nbm, NvLru, NvMin, Policy, nvmin};

use crate::error::{Result, SimError};
use crate::trace::Trace;

/// The policies the simulator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    /// NBM.
    Nbm,
    /// NVLRU (the normalisation baseline).
    NvLru,
    /// NV-MIN (offline).
    NvMin,
    /// Unified LRU.
    Lru,
}

impl PolicyKind {
    /// All, in output order.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Nbm,
        PolicyKind::NvLru,
        PolicyKind::NvMin,
        PolicyKind::Lru,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nbm => "nbm",
            Self::NvLru => "nvlru",
            Self::NvMin => "nvmin",
            Self::Lru => "lru",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One grid point's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct GridResult {
    /// Policy.
    pub policy: PolicyKind,
    /// DRAM size in bytes.
    pub dram_bytes: u64,
    /// NVRAM size in bytes.
    pub nvram_bytes: u64,
    /// Trace requests.
    pub requests: u64,
    /// Block accesses.
    pub accesses: u64,
    /// Reads from storage.
    pub storage_reads: u64,
    /// Writes to storage (write-backs, write-throughs).
    pub writebacks: u64,
    /// Dirty blocks left at the end (the final flush), not in `storage_accesses`.
    pub final_flush: u64,
    /// Read and write hits.
    pub hits: u64,
    /// Storage accesses relative to NVLRU at the same sizes (when NVLRU ran and was non-zero).
    pub normalized_to_nvlru: Option<f64>,
}

impl GridResult {
    /// Reads plus write-backs.
    pub fn storage_accesses(&self) -> u64 {
        self.storage_reads + self.writebacks
    }
}

/// Runs one policy over `accesses` at `capacity`.
pub fn run_policy(
    kind: PolicyKind,
    capacity: Capacity,
    accesses: &[Access],
    futures: Option<&[nvmin::Future]>,
) -> (Counters, u64) {
    fn drive<P: Policy>(mut policy: P, accesses: &[Access]) -> (Counters, u64) {
        let mut counters = Counters::default();
        for &access in accesses {
            policy.access(access, &mut counters);
        }
        counters.accesses = accesses.len() as u64;
        (counters, policy.dirty_blocks() as u64)
    }
    match kind {
        PolicyKind::Nbm => drive(Nbm::new(capacity), accesses),
        PolicyKind::NvLru => drive(NvLru::new(capacity), accesses),
        PolicyKind::Lru => drive(Lru::new(capacity), accesses),
        PolicyKind::NvMin => drive(
            NvMin::new(capacity, futures.expect("NV-MIN needs futures")),
            accesses,
        ),
    }
}

/// Runs every policy at every (DRAM, NVRAM) size, on up to `threads` threads. `progress` is
/// called after each grid point with (done, total).
pub fn run_grid(
    trace: &Trace,
    policies: &[PolicyKind],
    dram_bytes: &[u64],
    nvram_bytes: &[u64],
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<GridResult>> {
    if policies.is_empty() || dram_bytes.is_empty() || nvram_bytes.is_empty() {
        return Err(SimError::Invalid(
            "the grid needs at least one policy, DRAM size and NVRAM size".into(),
        ));
    }
    let block = trace.block_bytes;
    let futures =
        if policies.contains(&PolicyKind::NvMin) {
            Some(nvmin::futures(&trace.accesses).ok_or_else(|| {
                SimError::Invalid("trace too long for NV-MIN (2^32 accesses)".into())
            })?)
        } else {
            None
        };
    let mut points = Vec::new();
    for &policy in policies {
        for &dram in dram_bytes {
            for &nvram in nvram_bytes {
                points.push((policy, dram, nvram));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(points.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, points.len()) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(policy, dram, nvram)) = points.get(index) else {
                        break;
                    };
                    let capacity = Capacity {
                        dram_blocks: (dram / block) as usize,
                        nvram_blocks: (nvram / block) as usize,
                    };
                    let (counters, final_flush) =
                        run_policy(policy, capacity, &trace.accesses, futures.as_deref());
                    let result = GridResult {
                        policy,
                        dram_bytes: dram,
                        nvram_bytes: nvram,
                        requests: trace.requests,
                        accesses: counters.accesses,
                        storage_reads: counters.storage_reads,
                        writebacks: counters.writebacks,
                        final_flush,
                        hits: counters.read_hits + counters.write_hits,
                        normalized_to_nvlru: None,
                    };
                    results.lock().expect("results lock").push((index, result));
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, points.len());
                }
            });
        }
    });
    let mut results = results.into_inner().expect("results lock");
    results.sort_by_key(|(index, _)| *index);
    let mut results: Vec<GridResult> = results.into_iter().map(|(_, r)| r).collect();
    let baseline: Vec<(u64, u64, u64)> = results
        .iter()
        .filter(|r| r.policy == PolicyKind::NvLru)
        .map(|r| (r.dram_bytes, r.nvram_bytes, r.storage_accesses()))
        .collect();
    for result in &mut results {
        result.normalized_to_nvlru = baseline
            .iter()
            .find(|(d, n, _)| *d == result.dram_bytes && *n == result.nvram_bytes)
            .filter(|(_, _, accesses)| *accesses > 0)
            .map(|(_, _, accesses)| result.storage_accesses() as f64 / *accesses as f64);
    }
    Ok(results)
}
