//! `locus bench volume`: allocation and free throughput of the volume manager, and where the
//! space came from.
//!
//! Runs on a scratch volume of emulated devices (one per node, under /dev/shm, removed
//! afterwards) so the user's volume is never touched. Each thread allocates a batch of
//! extents for its own node, then frees them, until the time is up; allocations and frees are
//! timed separately.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use topology::Topology;
use volume::{OpenOptions, Volume};

use crate::output::outln;

/// Allocation/free throughput for 1 and 2 threads at 4 KiB and 2 MiB, and the share served
/// from the requesting thread's own node.
#[derive(Debug, Args)]
pub struct VolumeBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Seconds per case.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,

    /// Size of each node's emulated device (at least 320M: two threads each hold a batch of
    /// 64 extents of 2 MiB).
    #[arg(long, default_value = "512M", value_parser = crate::size::parse_size)]
    device_size: u64,
}

#[derive(Debug, Serialize)]
struct Case {
    suite: &'static str,
    op: &'static str,
    bs_bytes: u64,
    threads: usize,
    ops: u64,
    ops_per_sec: f64,
    local_share: f64,
}

const BATCH: usize = 64;
/// The smallest device the 2 MiB cases fit: two threads' batches and the owner area.
const MIN_DEVICE_BYTES: u64 = 320 << 20;

pub fn run(sysfs: &std::path::Path, args: &VolumeBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    anyhow::ensure!(
        args.device_size >= MIN_DEVICE_BYTES,
        "--device-size must be at least 320M (two threads each hold 64 extents of 2 MiB)"
    );
    let topology = Topology::read_from(sysfs)?;
    let scratch = super::cleanup::Scratch::new(std::path::PathBuf::from(format!(
        "/dev/shm/locus-bench-volume-{}",
        std::process::id()
    )));
    let config = volume::default_config(scratch.path(), &topology, Some(args.device_size))?;
    Volume::format(scratch.path(), &config, false).context("formatting the scratch volume")?;
    let options = OpenOptions {
        check_interval: None,
        ..OpenOptions::default()
    };
    let volume = Volume::open(scratch.path(), topology, &options)?;

    let mut cases = Vec::new();
    for bs_bytes in [4u64 << 10, 2 << 20] {
        for threads in [1usize, 2] {
            let (allocs, frees, local_share) = measure(&volume, bs_bytes, threads, args.seconds)?;
            for (op, (ops, elapsed)) in [("alloc", allocs), ("free", frees)] {
                cases.push(Case {
                    suite: "volume",
                    op,
                    bs_bytes,
                    threads,
                    ops,
                    ops_per_sec: ops as f64 / elapsed.as_secs_f64().max(1e-9),
                    local_share,
                });
            }
        }
    }
    if args.json {
        for case in &cases {
            outln!("{}", serde_json::to_string(case)?);
        }
    } else {
        outln!(
            "volume manager: {} device(s) of {} MiB, batches of {BATCH}",
            volume.device_count(),
            args.device_size >> 20
        );
        outln!(
            "{:<6} {:>8} {:>8} {:>14} {:>12}",
            "op",
            "bs",
            "threads",
            "ops/s",
            "local share"
        );
        for case in &cases {
            let bs = if case.bs_bytes >= 1 << 20 {
                format!("{}M", case.bs_bytes >> 20)
            } else {
                format!("{}K", case.bs_bytes >> 10)
            };
            outln!(
                "{:<6} {:>8} {:>8} {:>14.0} {:>11.1}%",
                case.op,
                bs,
                case.threads,
                case.ops_per_sec,
                case.local_share * 100.0
            );
        }
    }
    Ok(())
}

/// Operations done and the time spent on them.
type Timed = (u64, Duration);

/// Returns (allocations, time spent allocating), (frees, time spent freeing), local share.
fn measure(
    volume: &Volume,
    bs_bytes: u64,
    threads: usize,
    seconds: f64,
) -> Result<(Timed, Timed, f64)> {
    let before: (u64, u64) = volume.stats().iter().fold((0, 0), |(l, r), d| {
        (l + d.allocations_local, r + d.allocations_remote)
    });
    let barrier = Barrier::new(threads);
    let deadline = Duration::from_secs_f64(seconds);
    let results: Vec<Result<(u64, Duration, u64, Duration)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                scope.spawn(move || {
                    // Spread threads over the CPUs this process may use, as a real workload would.
                    let allowed = topology::current_affinity().unwrap_or_default();
                    if let Some(&cpu) = allowed.get(t % allowed.len().max(1)) {
                        let _ = topology::pin_current_thread(&[cpu]);
                    }
                    barrier.wait();
                    let (mut allocs, mut alloc_time, mut frees, mut free_time) =
                        (0u64, Duration::ZERO, 0u64, Duration::ZERO);
                    let started = Instant::now();
                    let mut batch = Vec::with_capacity(BATCH);
                    while started.elapsed() < deadline {
                        let t0 = Instant::now();
                        for _ in 0..BATCH {
                            batch.push(volume.alloc_local(bs_bytes)?);
                        }
                        alloc_time += t0.elapsed();
                        allocs += BATCH as u64;
                        let t1 = Instant::now();
                        for extent in batch.drain(..) {
                            volume.free(extent)?;
                        }
                        free_time += t1.elapsed();
                        frees += BATCH as u64;
                    }
                    Ok((allocs, alloc_time, frees, free_time))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let (mut allocs, mut alloc_time, mut frees, mut free_time) =
        (0, Duration::ZERO, 0, Duration::ZERO);
    for result in results {
        let (a, at, f, ft) = result?;
        allocs += a;
        frees += f;
        // Threads run concurrently: throughput is total ops over the slowest thread's time.
        alloc_time = alloc_time.max(at);
        free_time = free_time.max(ft);
    }
    let after: (u64, u64) = volume.stats().iter().fold((0, 0), |(l, r), d| {
        (l + d.allocations_local, r + d.allocations_remote)
    });
    let (local, remote) = (after.0 - before.0, after.1 - before.1);
    let share = if local + remote == 0 {
        0.0
    } else {
        local as f64 / (local + remote) as f64
    };
    Ok(((allocs, alloc_time), (frees, free_time), share))
}
