//! The latency probe: ns per dependent load from each CPU node into each memory node.
//!
//! For every memory node, a buffer larger than the last-level cache is mapped, bound to that
//! node with `mbind` before first touch, filled with one random cycle through all of its
//! cache lines (Sattolo's algorithm, so the cycle visits every line and prefetchers cannot
//! guess the next one), and its placement checked with `move_pages`. Then, for every node
//! with CPUs, a thread pinned to one CPU of that node follows the chain and reports the
//! mean time per load — the idle-latency matrix of the MBS-LVM paper's Fig. 1(b).
//!
//! Pairs are measured one after another, never concurrently, so they do not disturb each
//! other's bandwidth.

use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::error::{Result, TopologyError};
use crate::sys::{self, AnonMapping};
use crate::{CpuId, NodeId, Topology, cpulist};

/// One probe step per cache line: the chain stores one pointer per 64-byte line.
const LINE_BYTES: u64 = 64;
const WORDS_PER_LINE: usize = (LINE_BYTES / 8) as usize;

/// Smallest buffer the probe accepts (below this it measures the L1/L2 cache, not memory).
pub const MIN_BUFFER_BYTES: u64 = 64 << 10;
/// Largest buffer the probe accepts; the chain index costs 4 bytes per line on top.
pub const MAX_BUFFER_BYTES: u64 = 64 << 30;
/// Automatic sizing never picks less than this, even on machines with small caches.
const AUTO_MIN_BUFFER_BYTES: u64 = 64 << 20;
/// Automatic sizing uses at most this share (1/N) of a node's free memory.
const AUTO_FREE_MEMORY_DIVISOR: u64 = 4;
/// Bounds on the number of timed loads per pair.
pub const MIN_LOADS: u64 = 1_000;
/// See [`MIN_LOADS`].
pub const MAX_LOADS: u64 = 10_000_000_000;
/// How many pages per buffer `move_pages` checks.
const PLACEMENT_SAMPLES: usize = 1024;

/// Probe parameters.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// Buffer size per memory node; `None` sizes it automatically: twice the largest CPU
    /// cache, at least 64 MiB, at most a quarter of the node's free memory.
    pub buffer_bytes: Option<u64>,
    /// Timed dependent loads per (CPU node, memory node) pair.
    pub loads: u64,
    /// Seed of the random cycle, so runs can be repeated exactly.
    pub seed: u64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            buffer_bytes: None,
            loads: 1 << 23,
            seed: 0x1_0c05,
        }
    }
}

/// One measured pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeSample {
    /// Node of the CPU that issued the loads.
    pub cpu_node: NodeId,
    /// The CPU the probing thread was pinned to.
    pub cpu: CpuId,
    /// Node the buffer was bound to (and verified to be on).
    pub memory_node: NodeId,
    /// Mean nanoseconds per dependent load.
    pub latency_ns: f64,
    /// Buffer size used for this memory node.
    pub buffer_bytes: u64,
}

/// All measured pairs of one probe run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// Timed loads per pair.
    pub loads_per_pair: u64,
    /// Largest CPU cache the buffer was sized against, if known.
    pub cache_bytes: Option<u64>,
    /// Seed of the random cycle.
    pub seed: u64,
    /// One sample per (CPU node, memory node) pair, by CPU node then memory node.
    pub samples: Vec<ProbeSample>,
}

impl ProbeReport {
    /// The measured latency from CPUs of `cpu_node` to memory on `memory_node`.
    pub fn latency_ns(&self, cpu_node: NodeId, memory_node: NodeId) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.cpu_node == cpu_node && s.memory_node == memory_node)
            .map(|s| s.latency_ns)
    }
}

/// Measures every (CPU node, memory node) pair of `topology`. `on_sample` sees each sample as
/// soon as it is measured (for progress output).
pub fn probe(
    topology: &Topology,
    config: &ProbeConfig,
    on_sample: &mut dyn FnMut(&ProbeSample),
) -> Result<ProbeReport> {
    validate(config)?;
    let allowed = sys::current_affinity().map_err(|source| TopologyError::Syscall {
        call: "sched_getaffinity",
        source,
    })?;

    // Choose each CPU node's probing CPU first, so a node we may not run on fails the probe
    // before any memory is allocated.
    let mut cpu_nodes = Vec::new();
    for node in topology.nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let cpu = node
            .cpus
            .iter()
            .copied()
            .find(|c| allowed.contains(c))
            .ok_or_else(|| TopologyError::NoAllowedCpu {
                node: node.id,
                allowed: cpulist::format(&allowed),
            })?;
        cpu_nodes.push((node.id, cpu));
    }

    let mut samples = Vec::new();
    let memory_nodes = topology.nodes.iter().filter(|n| n.memory_bytes > 0);
    for memory_node in memory_nodes {
        let buffer_bytes = match config.buffer_bytes {
            Some(bytes) => bytes,
            None => auto_buffer_bytes(
                topology.last_level_cache_bytes,
                memory_node.memory_free_bytes,
            ),
        };
        if let Some(cache) = topology.last_level_cache_bytes
            && buffer_bytes <= cache
        {
            tracing::warn!(
                buffer_bytes,
                cache_bytes = cache,
                node = memory_node.id,
                "probe buffer is not larger than the last-level cache; latencies include cache hits"
            );
        }
        let chain = build_chain(memory_node.id, buffer_bytes, config.seed)?;
        for &(cpu_node, cpu) in &cpu_nodes {
            let latency_ns = measure(&chain, cpu, config.loads)?;
            let sample = ProbeSample {
                cpu_node,
                cpu,
                memory_node: memory_node.id,
                latency_ns,
                buffer_bytes: chain.len_bytes() as u64,
            };
            on_sample(&sample);
            samples.push(sample);
        }
    }
    samples.sort_by_key(|s| (s.cpu_node, s.memory_node));
    Ok(ProbeReport {
        loads_per_pair: config.loads,
        cache_bytes: topology.last_level_cache_bytes,
        seed: config.seed,
        samples,
    })
}

fn validate(config: &ProbeConfig) -> Result<()> {
    if let Some(bytes) = config.buffer_bytes
        && !(MIN_BUFFER_BYTES..=MAX_BUFFER_BYTES).contains(&bytes)
    {
        return Err(TopologyError::ProbeConfig(format!(
            "buffer of {bytes} bytes is outside {MIN_BUFFER_BYTES}..={MAX_BUFFER_BYTES}"
        )));
    }
    if !(MIN_LOADS..=MAX_LOADS).contains(&config.loads) {
        return Err(TopologyError::ProbeConfig(format!(
            "{} loads is outside {MIN_LOADS}..={MAX_LOADS}",
            config.loads
        )));
    }
    Ok(())
}

/// Twice the cache, at least [`AUTO_MIN_BUFFER_BYTES`], at most a quarter of the node's free
/// memory, and never below [`MIN_BUFFER_BYTES`]; rounded down to whole 2 MiB huge pages when
/// that large.
fn auto_buffer_bytes(cache_bytes: Option<u64>, free_bytes: u64) -> u64 {
    let wanted = cache_bytes
        .unwrap_or(0)
        .saturating_mul(2)
        .max(AUTO_MIN_BUFFER_BYTES);
    let bytes = wanted
        .min(free_bytes / AUTO_FREE_MEMORY_DIVISOR)
        .max(MIN_BUFFER_BYTES);
    let huge_page = 2 << 20;
    if bytes >= huge_page {
        bytes - bytes % huge_page
    } else {
        bytes
    }
}

/// Maps a buffer on `node`, writes one random cycle through all its lines, and checks with
/// `move_pages` that the kernel put the pages where they were bound.
fn build_chain(node: NodeId, buffer_bytes: u64, seed: u64) -> Result<AnonMapping> {
    let len = usize::try_from(buffer_bytes)
        .map_err(|_| TopologyError::ProbeConfig("buffer larger than the address space".into()))?;
    let mut chain = AnonMapping::new(len).map_err(|source| TopologyError::Syscall {
        call: "mmap of the probe buffer",
        source,
    })?;
    chain
        .bind_to_node(node)
        .map_err(|source| TopologyError::Syscall {
            call: "mbind of the probe buffer",
            source,
        })?;
    if let Err(error) = chain.advise_huge_pages() {
        tracing::debug!(%error, "no transparent huge pages for the probe buffer");
    }

    let lines = u32::try_from(chain.len_bytes() as u64 / LINE_BYTES)
        .map_err(|_| TopologyError::ProbeConfig("buffer has more than 2^32 lines".into()))?;
    let mut next = sattolo_cycle(lines, seed);
    let words = chain.words_mut();
    for (line, &successor) in next.iter().enumerate() {
        words[line * WORDS_PER_LINE] = u64::from(successor) * WORDS_PER_LINE as u64;
    }
    next.clear();
    next.shrink_to_fit();

    let pages = chain.len_bytes() / sys::page_size();
    let stride = pages.div_ceil(PLACEMENT_SAMPLES).max(1);
    let placement = chain
        .sample_page_nodes(stride, PLACEMENT_SAMPLES)
        .map_err(|source| TopologyError::Syscall {
            call: "move_pages query",
            source,
        })?;
    let misplaced: Vec<i32> = placement
        .iter()
        .copied()
        .filter(|&n| i64::from(n) != i64::from(node))
        .collect();
    if let Some(&found) = misplaced.first() {
        return Err(TopologyError::ProbeMisplaced {
            expected: node,
            found: i64::from(found),
            misplaced: misplaced.len(),
            checked: placement.len(),
        });
    }
    Ok(chain)
}

/// A uniformly random permutation of `0..lines` that is one single cycle (Sattolo), as a
/// successor table: `next[i]` is the line visited after line `i`.
fn sattolo_cycle(lines: u32, seed: u64) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut next: Vec<u32> = (0..lines).collect();
    for i in (1..lines as usize).rev() {
        let j = rng.random_range(0..i);
        next.swap(i, j);
    }
    next
}

/// Follows the chain `loads` times from a thread pinned to `cpu`, after a warm-up pass that
/// faults in the TLB entries; returns ns per load.
fn measure(chain: &AnonMapping, cpu: CpuId, loads: u64) -> Result<f64> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                sys::pin_current_thread(&[cpu]).map_err(|source| TopologyError::Syscall {
                    call: "sched_setaffinity for the probe thread",
                    source,
                })?;
                let words = chain.words();
                let warm_up = (loads / 8).max(1);
                let position = chase(words, 0, warm_up);
                let start = Instant::now();
                let position = chase(words, position, loads);
                let elapsed = start.elapsed();
                std::hint::black_box(position);
                Ok(elapsed.as_nanos() as f64 / loads as f64)
            })
            .join()
            .expect("probe thread panicked")
    })
}

/// Dependent loads: each load's address is the previous load's value.
#[inline(never)]
fn chase(words: &[u64], mut index: usize, loads: u64) -> usize {
    for _ in 0..loads {
        index = words[index] as usize;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sattolo_makes_one_cycle_through_every_line() {
        for lines in [2u32, 3, 17, 1000] {
            let next = sattolo_cycle(lines, 7);
            let mut seen = vec![false; lines as usize];
            let mut at = 0usize;
            for _ in 0..lines {
                assert!(!seen[at], "line {at} visited twice with {lines} lines");
                seen[at] = true;
                at = next[at] as usize;
            }
            assert_eq!(at, 0, "cycle does not close after {lines} steps");
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn auto_size_respects_cache_floor_and_free_memory() {
        assert_eq!(auto_buffer_bytes(Some(480 << 20), 24 << 30), 960 << 20);
        assert_eq!(auto_buffer_bytes(Some(1 << 20), 24 << 30), 64 << 20);
        assert_eq!(auto_buffer_bytes(Some(480 << 20), 1 << 30), 256 << 20);
        assert_eq!(auto_buffer_bytes(None, 0), MIN_BUFFER_BYTES);
    }

    #[test]
    fn rejects_out_of_range_settings() {
        let config = ProbeConfig {
            buffer_bytes: Some(1),
            ..ProbeConfig::default()
        };
        assert!(matches!(
            validate(&config),
            Err(TopologyError::ProbeConfig(_))
        ));
        let config = ProbeConfig {
            loads: 1,
            ..ProbeConfig::default()
        };
        assert!(matches!(
            validate(&config),
            Err(TopologyError::ProbeConfig(_))
        ));
    }
}
