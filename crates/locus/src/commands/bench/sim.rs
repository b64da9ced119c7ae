//! `locus bench sim`: how fast the simulator replays a trace, per policy.
//!
//! Generates the brief's benchmark trace in memory (libCacheSim CSV: 5 M requests of 4 KiB
//! over 1 M blocks, zipf 0.9, 40% writes), parses it once (timed), then replays it through
//! each policy single-threaded (timed). End-to-end rate = requests / (parse + replay).

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use sim::{PolicyKind, ReadOptions, ZipfSpec};

use crate::output::outln;
use crate::size::parse_size;

/// Requests per second of trace parsing and of each policy's replay (single thread).
#[derive(Debug, Args)]
pub struct SimBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Requests in the generated trace.
    #[arg(long, default_value_t = 5_000_000)]
    requests: u64,

    /// Distinct blocks in the generated trace.
    #[arg(long, default_value_t = 1_000_000)]
    blocks: u64,

    /// DRAM size for the replays.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    dram: u64,

    /// NVRAM size for the replays.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    nvram: u64,
}

#[derive(Debug, Serialize)]
struct Case {
    suite: &'static str,
    op: String,
    requests: u64,
    seconds: f64,
    requests_per_sec: f64,
    end_to_end_requests_per_sec: Option<f64>,
}

pub fn run(args: &SimBenchArgs) -> Result<()> {
    let spec = ZipfSpec {
        requests: args.requests,
        blocks: args.blocks,
        alpha: 0.9,
        write_fraction: 0.4,
        seed: 7,
    };
    let mut csv = Vec::with_capacity(args.requests as usize * 24);
    sim::write_zipf(&spec, &mut csv)?;

    let started = Instant::now();
    let trace = sim::read_trace(csv.as_slice(), "zipf", &ReadOptions::default())?;
    let parse_seconds = started.elapsed().as_secs_f64();
    drop(csv);
    let mut cases = vec![Case {
        suite: "sim",
        op: "parse".into(),
        requests: trace.requests,
        seconds: parse_seconds,
        requests_per_sec: trace.requests as f64 / parse_seconds,
        end_to_end_requests_per_sec: None,
    }];
    let capacity = cache::Capacity {
        dram_blocks: (args.dram / trace.block_bytes) as usize,
        nvram_blocks: (args.nvram / trace.block_bytes) as usize,
    };
    let started = Instant::now();
    let futures = cache::nvmin::futures(&trace.accesses).expect("5 M accesses fit");
    let futures_seconds = started.elapsed().as_secs_f64();
    for policy in PolicyKind::ALL {
        let started = Instant::now();
        let (counters, _) = sim::run_policy(policy, capacity, &trace.accesses, Some(&futures));
        // NV-MIN's replay includes the backward pass that gives it the future.
        let seconds = started.elapsed().as_secs_f64()
            + if policy == PolicyKind::NvMin {
                futures_seconds
            } else {
                0.0
            };
        std::hint::black_box(counters);
        cases.push(Case {
            suite: "sim",
            op: policy.name().into(),
            requests: trace.requests,
            seconds,
            requests_per_sec: trace.requests as f64 / seconds,
            end_to_end_requests_per_sec: Some(trace.requests as f64 / (seconds + parse_seconds)),
        });
    }
    if args.json {
        super::print_json(&cases)?;
        return Ok(());
    }
    outln!(
        "trace: {} requests, {} distinct 4 KiB blocks, zipf 0.9, 40% writes; DRAM {} MiB, NVRAM {} MiB; one thread",
        trace.requests,
        trace.distinct_blocks,
        args.dram >> 20,
        args.nvram >> 20
    );
    outln!(
        "{:<8} {:>10} {:>16} {:>26}",
        "step",
        "seconds",
        "requests/s",
        "with parsing, requests/s"
    );
    for case in &cases {
        outln!(
            "{:<8} {:>10.3} {:>16.0} {:>26}",
            case.op,
            case.seconds,
            case.requests_per_sec,
            case.end_to_end_requests_per_sec
                .map_or_else(|| "-".into(), |r| format!("{r:.0}"))
        );
    }
    Ok(())
}
