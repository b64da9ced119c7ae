//! `locus sim`: replay a block trace through the hybrid DRAM/NVRAM cache policies over a grid
//! of cache sizes; or generate a synthetic trace.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use sim::{Format, GridResult, PolicyKind, ReadOptions, ZipfSpec};

use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Replay a block trace through the NVRAM cache policies and count storage accesses.
///
/// Every write goes to NVRAM (dirty blocks), clean blocks live in DRAM; storage accesses are
/// read misses plus write-backs, the metric of the NBM paper (dirty blocks left at the end
/// are reported apart as the final flush). Policies: nbm (separate read and write recency),
/// nvlru (LRU over dirty blocks), nvmin (the paper's clairvoyant NV-MIN, which knows every future access; the paper calls it
/// the optimum, but it is beaten on some traces),
/// lru (one unified cache, ignoring the split). Each grid point is normalised to NVLRU.
///
/// With --gen zipf, writes a synthetic trace in libCacheSim's CSV form instead.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// The trace to replay.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "gen",
        conflicts_with = "gen"
    )]
    trace: Option<PathBuf>,

    /// Trace format: libcachesim, msr, fio2, fio3, blkparse, disksim [default: detected].
    #[arg(long, value_parser = Format::ALL.map(|(name, _)| name))]
    format: Option<String>,

    /// Policies, comma-separated.
    #[arg(long, default_value = "nbm,nvlru,nvmin,lru", value_delimiter = ',')]
    policy: Vec<String>,

    /// DRAM sizes, comma-separated.
    #[arg(long, default_value = "4M,16M,64M", value_delimiter = ',', value_parser = parse_size)]
    dram: Vec<u64>,

    /// NVRAM sizes, comma-separated.
    #[arg(long, default_value = "1M,2M,4M,8M,16M,32M,64M", value_delimiter = ',', value_parser = parse_size)]
    nvram: Vec<u64>,

    /// Block size requests are split into.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    block: u64,

    /// Count and skip malformed trace lines instead of stopping at the first.
    #[arg(long)]
    skip_bad: bool,

    /// Print one JSON object per grid point instead of a table.
    #[arg(long)]
    json: bool,

    /// Draw the NBM paper's Fig. 3 (storage accesses normalised to NVLRU against NVRAM size,
    /// one line per DRAM size, one panel per policy) to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// Worker threads for the grid [default: the CPUs this process may use].
    #[arg(long)]
    threads: Option<usize>,

    /// Generate a synthetic trace instead: `zipf`.
    #[arg(long = "gen", id = "gen", value_name = "KIND", value_parser = ["zipf"])]
    generate: Option<String>,

    /// Generated requests.
    #[arg(long, default_value_t = 5_000_000, requires = "gen")]
    requests: u64,

    /// Distinct blocks of the generated trace.
    #[arg(long, default_value_t = 1_000_000, requires = "gen")]
    blocks: u64,

    /// Zipf exponent of the generated trace.
    #[arg(long, default_value_t = 0.9, requires = "gen")]
    alpha: f64,

    /// Share of writes in the generated trace.
    #[arg(long, default_value_t = 0.4, requires = "gen")]
    write_fraction: f64,

    /// Seed of the generated trace.
    #[arg(long, default_value_t = 1, requires = "gen")]
    seed: u64,

    /// Where to write the generated trace [default: stdout].
    #[arg(long, value_name = "FILE", requires = "gen")]
    output: Option<PathBuf>,
}

/// One grid point as `--json` prints it (and `locus report` keeps it).
#[derive(Debug, Serialize)]
pub(crate) struct JsonPoint {
    policy: &'static str,
    dram_bytes: u64,
    nvram_bytes: u64,
    requests: u64,
    block_accesses: u64,
    storage_reads: u64,
    writebacks: u64,
    storage_accesses: u64,
    final_flush: u64,
    normalized_to_nvlru: Option<f64>,
}

impl From<&GridResult> for JsonPoint {
    fn from(r: &GridResult) -> Self {
        Self {
            policy: r.policy.name(),
            dram_bytes: r.dram_bytes,
            nvram_bytes: r.nvram_bytes,
            requests: r.requests,
            block_accesses: r.accesses,
            storage_reads: r.storage_reads,
            writebacks: r.writebacks,
            storage_accesses: r.storage_accesses(),
            final_flush: r.final_flush,
            normalized_to_nvlru: r.normalized_to_nvlru,
        }
    }
}

pub fn run(args: &SimArgs) -> Result<()> {
    if args.generate.is_some() {
        return generate(args);
    }
    let path = args
        .trace
        .as_deref()
        .expect("clap requires --trace without --gen");
    let policies = args
        .policy
        .iter()
        .map(|name| {
            PolicyKind::from_name(name)
                .with_context(|| format!("unknown policy `{name}` (nbm, nvlru, nvmin, lru)"))
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(plot) = &args.plot {
        crate::plot::check_target(plot)?;
    }
    for (option, sizes) in [("--dram", &args.dram), ("--nvram", &args.nvram)] {
        if let Some(&bad) = sizes
            .iter()
            .find(|&&s| !s.is_multiple_of(args.block.max(1)))
        {
            anyhow::bail!(
                "{option} {} is not a whole number of {} blocks (--block): a cache holds whole \
                 blocks",
                format_bytes(bad),
                format_bytes(args.block)
            );
        }
    }
    let trace = read(path, args)?;
    eprintln!(
        "{}: {} requests ({} reads, {} writes), {} block accesses, {} distinct {} blocks{}",
        path.display(),
        trace.requests,
        trace.read_requests,
        trace.write_requests,
        trace.accesses.len(),
        trace.distinct_blocks,
        format_bytes(trace.block_bytes),
        if trace.skipped_lines > 0 {
            format!(", {} malformed lines skipped", trace.skipped_lines)
        } else {
            String::new()
        }
    );
    let threads = args
        .threads
        .unwrap_or_else(|| topology::current_affinity().map_or(1, |c| c.len().max(1)));
    let total = policies.len() * args.dram.len() * args.nvram.len();
    let bar = crate::progress::steps(total as u64, "grid points", !args.json);
    let results = sim::run_grid(
        &trace,
        &policies,
        &args.dram,
        &args.nvram,
        threads,
        &|done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();

    if args.json {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for r in &results {
            writeln!(out, "{}", serde_json::to_string(&JsonPoint::from(r))?)
                .map_err(crate::output::StdoutError)?;
        }
    } else {
        print_table(&results)?;
    }
    if let Some(plot) = &args.plot {
        crate::plot::fig3(
            plot,
            &results,
            &path.file_name().unwrap_or_default().to_string_lossy(),
        )?;
        eprintln!("plot written to {}", plot.display());
    }
    Ok(())
}

fn read(path: &Path, args: &SimArgs) -> Result<sim::Trace> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let options = ReadOptions {
        format: args
            .format
            .as_deref()
            .map(|f| Format::from_name(f).expect("clap checked")),
        block_bytes: args.block,
        skip_bad: args.skip_bad,
    };
    let name = path.display().to_string();
    let length = file.metadata().map_or(0, |m| m.len());
    let bar = crate::progress::bytes(length, "reading the trace", !args.json);
    let trace = sim::read_trace(
        BufReader::with_capacity(1 << 20, bar.wrap_read(file)),
        &name,
        &options,
    );
    bar.finish_and_clear();
    Ok(trace?)
}

fn print_table(results: &[GridResult]) -> Result<()> {
    outln!(
        "{:<6} {:>10} {:>10} {:>14} {:>12} {:>14} {:>10} {:>12}",
        "policy",
        "dram",
        "nvram",
        "storage reads",
        "write-backs",
        "storage total",
        "vs nvlru",
        "final flush"
    );
    let mut sorted: Vec<&GridResult> = results.iter().collect();
    sorted.sort_by_key(|r| (r.dram_bytes, r.nvram_bytes, r.policy));
    for r in sorted {
        outln!(
            "{:<6} {:>10} {:>10} {:>14} {:>12} {:>14} {:>10} {:>12}",
            r.policy.name(),
            format_bytes(r.dram_bytes),
            format_bytes(r.nvram_bytes),
            r.storage_reads,
            r.writebacks,
            r.storage_accesses(),
            r.normalized_to_nvlru
                .map_or_else(|| "-".into(), |n| format!("{n:.3}")),
            r.final_flush,
        );
    }
    Ok(())
}

fn generate(args: &SimArgs) -> Result<()> {
    let spec = ZipfSpec {
        requests: args.requests,
        blocks: args.blocks,
        alpha: args.alpha,
        write_fraction: args.write_fraction,
        seed: args.seed,
    };
    match &args.output {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            sim::write_zipf(&spec, &mut BufWriter::with_capacity(1 << 20, file))?;
        }
        None => {
            let stdout = std::io::stdout();
            sim::write_zipf(&spec, &mut BufWriter::with_capacity(1 << 20, stdout.lock()))?;
        }
    }
    Ok(())
}
