//! `locus bench uring`: O_DIRECT random reads and writes through io_uring with each buffer
//! strategy, and fio's io_uring engine with and without registered buffers, side by side.
//!
//! The file is written in full first, so reads hit allocated blocks (reading a hole costs no
//! disk I/O). Every case runs at the same queue depth for the same time; latency is measured
//! per request from submission to completion.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use rand_offsets::Offsets;
use serde::Serialize;
use uring::{DirectFile, Engine, Op, PoolConfig, Strategy};

use crate::output::outln;
use crate::size::parse_size;

/// Random O_DIRECT reads and writes: the uDMA pool against per-request registration,
/// unregistered buffers, a bounce copy, and fio's io_uring engine (fixedbufs=0 and 1).
///
/// locus's buffers are on 2 MiB (transparent huge) pages, so a 64 KiB request is one
/// physically contiguous segment; fio's default buffers are on 4 KiB pages, sixteen segments,
/// which a virtio disk serves at half the rate or less. For a like-for-like baseline fio is
/// given huge-page buffers too (`--iomem=shmhuge`) when the system has enough free huge pages
/// (`echo 256 > /proc/sys/vm/nr_hugepages`); otherwise its cases are marked `4K pages` and
/// the ratios to them are not like for like.
#[derive(Debug, Args)]
pub struct UringBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Test file on a disk (not tmpfs: O_DIRECT) [default: a file in the system temp dir].
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// Test file size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,

    /// Block sizes, comma-separated.
    #[arg(long, default_value = "4K,64K,128K,1M,4M", value_delimiter = ',', value_parser = parse_size)]
    bs: Vec<u64>,

    /// Queue depth.
    #[arg(long, default_value_t = 32)]
    iodepth: u32,

    /// Seconds per case.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,

    /// Skip the fio cases.
    #[arg(long)]
    no_fio: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Case {
    suite: &'static str,
    engine: String,
    /// The pages the I/O buffers are on: `THP` (locus's pool memory, transparent huge pages
    /// asked for), `hugetlb` (fio's `--iomem=shmhuge`) or `4K pages` (fio's default).
    buffers: &'static str,
    op: &'static str,
    bs_bytes: u64,
    iodepth: u32,
    iops: f64,
    bytes_per_sec: f64,
    latency_mean_ns: f64,
    latency_p99_ns: u64,
}

mod rand_offsets {
    /// A small xorshift generator of aligned offsets (no allocation, no locking).
    #[derive(Debug)]
    pub struct Offsets {
        state: u64,
        slots: u64,
        bs: u64,
    }

    impl Offsets {
        pub fn new(size: u64, bs: u64, seed: u64) -> Self {
            Self {
                state: seed | 1,
                slots: (size / bs).max(1),
                bs,
            }
        }

        pub fn next(&mut self) -> u64 {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            (self.state % self.slots) * self.bs
        }
    }
}

pub fn run(args: &UringBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    let max_bs = *args
        .bs
        .iter()
        .max()
        .context("--bs needs at least one size")?;
    anyhow::ensure!(
        args.size >= max_bs * 4,
        "--size must hold at least four of the largest blocks"
    );
    let (path, _cleanup) = match &args.file {
        Some(path) => (path.clone(), None),
        None => {
            let path =
                std::env::temp_dir().join(format!("locus-bench-uring-{}.img", std::process::id()));
            (path.clone(), Some(super::cleanup::Scratch::new(path)))
        }
    };
    prepare(&path, args.size)?;
    let duration = Duration::from_secs_f64(args.seconds);
    let fio = !args.no_fio && fio_available();
    if !args.no_fio && !fio {
        eprintln!("fio not found: install fio for the fio-fixed and fio-unfixed cases");
    }
    let mut cases = Vec::new();
    let per_case = Strategy::ALL.len() + if fio { 2 } else { 0 };
    // Huge pages fio's largest case needs (iodepth buffers of the largest block).
    let largest = args.bs.iter().copied().max().unwrap_or(0);
    let needed = (u64::from(args.iodepth) * largest).div_ceil(2 << 20) + 2;
    let fio_huge = fio && free_huge_pages() >= needed;
    if fio && !fio_huge {
        eprintln!(
            "note: fio's buffers will be on 4 KiB pages (only {} free 2 MiB huge pages, {needed} \
             needed; e.g. echo {} > /proc/sys/vm/nr_hugepages): locus's are on huge pages, so \
             the ratios to fio are not like for like at 64 KiB and up",
            free_huge_pages(),
            needed + 16
        );
    }
    let total = args.bs.len() * 2 * per_case;
    let bar = crate::progress::steps(total as u64, "runs", !args.json);
    for &bs in &args.bs {
        for op in [Op::Read, Op::Write] {
            for strategy in Strategy::ALL {
                bar.set_message(format!(
                    "{} {} {strategy:?}",
                    op_name(op),
                    super::short_size(bs)
                ));
                cases.push(measure(&path, strategy, op, bs, args.iodepth, duration)?);
                bar.inc(1);
            }
            if fio {
                for fixed in [true, false] {
                    bar.set_message(format!(
                        "{} {} fio fixedbufs={}",
                        op_name(op),
                        super::short_size(bs),
                        u8::from(fixed)
                    ));
                    cases.push(run_fio(
                        &path,
                        args.size,
                        op,
                        bs,
                        args.iodepth,
                        args.seconds,
                        fixed,
                        fio_huge,
                    )?);
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    if args.json {
        super::print_json(&cases)?;
    } else {
        print_table(&cases, &path, args.iodepth)?;
    }
    Ok(())
}

/// Creates the file and writes every block of it once.
fn prepare(path: &Path, size: u64) -> Result<()> {
    let file = DirectFile::open(path, Some(size)).with_context(|| {
        format!(
            "{}: O_DIRECT needs a disk file system, not tmpfs (use --file)",
            path.display()
        )
    })?;
    let mut engine = Engine::new(file, Strategy::Pool, PoolConfig::default(), 16)?;
    let chunk = (1u64 << 20).min(size);
    let mut offset = 0;
    while offset < size {
        let len = chunk.min(size - offset) as usize;
        let mut buf = engine.buffer(len, Op::Write)?;
        buf.fill_from(&vec![0x5a; len]);
        engine.submit(Op::Write, buf, offset, len, offset)?;
        for done in engine.reap(0)? {
            done.result?;
            engine.release(done.buf);
        }
        offset += len as u64;
    }
    for done in engine.reap(usize::MAX)? {
        done.result?;
        engine.release(done.buf);
    }
    Ok(())
}

fn measure(
    path: &Path,
    strategy: Strategy,
    op: Op,
    bs: u64,
    iodepth: u32,
    duration: Duration,
) -> Result<Case> {
    let file = DirectFile::open(path, None)?;
    let size = file.size_bytes();
    // M must hold a full queue of medium requests, or the pool itself caps the queue depth
    // (the paper leaves M to the user: "the larger, the better the concurrency").
    let defaults = PoolConfig::default();
    let queue_bytes = ((u64::from(iodepth) + 1) * bs).next_multiple_of(defaults.chunk_bytes as u64);
    let config = PoolConfig {
        max_medium_bytes: defaults.max_medium_bytes.max(queue_bytes as usize),
        ..defaults
    };
    let mut engine = Engine::new(file, strategy, config, iodepth)?;
    let mut offsets = Offsets::new(size, bs, 0x10c0 + bs);
    let mut latencies = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let len = bs as usize;
    // Warm up: one round of the queue, so first-use costs (chunk registration) are not timed
    // for the pool; per-request registration pays its cost on every request by design.
    for tag in 0..u64::from(iodepth) {
        let buf = engine.buffer(len, op)?;
        engine.submit(op, buf, offsets.next(), len, tag)?;
    }
    for done in engine.reap(usize::MAX)? {
        done.result?;
        engine.release(done.buf);
    }
    let started = Instant::now();
    let mut completed = 0u64;
    for tag in 0..u64::from(iodepth) {
        let buf = engine.buffer(len, op)?;
        engine.submit(op, buf, offsets.next(), len, tag)?;
    }
    let mut submitting = true;
    loop {
        let batch = engine.reap(1)?;
        if batch.is_empty() {
            break;
        }
        for done in batch {
            done.result
                .with_context(|| format!("{} {:?} of {bs} bytes", strategy.name(), op))?;
            latencies.record(done.latency.as_nanos().max(1) as u64)?;
            completed += 1;
            engine.release(done.buf);
            if submitting && started.elapsed() < duration {
                let buf = engine.buffer(len, op)?;
                engine.submit(op, buf, offsets.next(), len, completed)?;
            } else {
                submitting = false;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Case {
        suite: "uring",
        buffers: "THP",
        engine: strategy.name().into(),
        op: op_name(op),
        bs_bytes: bs,
        iodepth,
        iops: completed as f64 / elapsed,
        bytes_per_sec: completed as f64 * bs as f64 / elapsed,
        latency_mean_ns: latencies.mean(),
        latency_p99_ns: latencies.value_at_quantile(0.99),
    })
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Read => "randread",
        Op::Write => "randwrite",
    }
}

fn fio_available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Free 2 MiB huge pages (hugetlbfs), from /proc/meminfo.
fn free_huge_pages() -> u64 {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
        return 0;
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
    };
    if field("Hugepagesize:") != Some(2048) {
        return 0;
    }
    field("HugePages_Free:").unwrap_or(0)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one fio case's settings, all distinct"
)]
fn run_fio(
    path: &Path,
    size: u64,
    op: Op,
    bs: u64,
    iodepth: u32,
    seconds: f64,
    fixed: bool,
    huge: bool,
) -> Result<Case> {
    let mut command = Command::new("fio");
    if huge {
        command.arg("--iomem=shmhuge");
    }
    let doc = super::fio_report(command.args([
        "--name=locus-bench",
        &format!("--filename={}", path.display()),
        "--ioengine=io_uring",
        "--direct=1",
        &format!("--rw={}", op_name(op)),
        &format!("--bs={bs}"),
        &format!("--iodepth={iodepth}"),
        &format!("--size={size}"),
        &format!("--fixedbufs={}", u8::from(fixed)),
        "--time_based",
        &format!("--runtime={}ms", (seconds * 1000.0) as u64),
        "--ramp_time=0",
        "--randrepeat=0",
        "--norandommap",
        "--output-format=json",
    ]))?;
    let side = &doc["jobs"][0][if op == Op::Read { "read" } else { "write" }];
    Ok(Case {
        suite: "uring",
        engine: if fixed { "fio-fixed" } else { "fio-unfixed" }.into(),
        buffers: if huge { "hugetlb" } else { "4K pages" },
        op: op_name(op),
        bs_bytes: bs,
        iodepth,
        iops: side["iops"].as_f64().unwrap_or(0.0),
        bytes_per_sec: side["bw_bytes"].as_f64().unwrap_or(0.0),
        latency_mean_ns: side["clat_ns"]["mean"].as_f64().unwrap_or(0.0),
        latency_p99_ns: side["clat_ns"]["percentile"]["99.000000"]
            .as_u64()
            .unwrap_or(0),
    })
}

fn print_table(cases: &[Case], path: &Path, iodepth: u32) -> Result<()> {
    outln!(
        "O_DIRECT random I/O on {}, queue depth {iodepth}",
        path.display()
    );
    outln!(
        "{:<10} {:>6} {:<13} {:<9} {:>10} {:>12} {:>11} {:>11} {:>9} {:>9} {:>9}",
        "op",
        "bs",
        "engine",
        "buffers",
        "IOPS",
        "MB/s",
        "mean us",
        "p99 us",
        "vs fio-f",
        "vs per-rq",
        "vs unreg"
    );
    for case in cases {
        let find = |engine: &str| {
            cases
                .iter()
                .find(|c| c.engine == engine && c.op == case.op && c.bs_bytes == case.bs_bytes)
                .map(|c| c.bytes_per_sec)
        };
        let ratio = |engine: &str| {
            if case.engine != "pool" {
                return String::new();
            }
            find(engine)
                .filter(|&b| b > 0.0)
                .map_or_else(|| "-".into(), |b| format!("{:.2}x", case.bytes_per_sec / b))
        };
        outln!(
            "{:<10} {:>6} {:<13} {:<9} {:>10.0} {:>12.1} {:>11.1} {:>11.1} {:>9} {:>9} {:>9}",
            case.op,
            super::short_size(case.bs_bytes),
            case.engine,
            case.buffers,
            case.iops,
            case.bytes_per_sec / 1e6,
            case.latency_mean_ns / 1000.0,
            case.latency_p99_ns as f64 / 1000.0,
            ratio("fio-fixed"),
            ratio("per-request"),
            ratio("unregistered"),
        );
    }
    Ok(())
}
