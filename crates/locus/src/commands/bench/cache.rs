//! `locus bench cache`: fio's nbd engine against a locus cache export and, in the same run,
//! against the same backing file exported raw (`qemu-nbd --cache=none`, O_DIRECT) and
//! through nbdkit's cache filter (`nbdkit --filter=cache file`), the peer a user would pick.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

use super::nbd::{Running, free_port, installed};
use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Measure cache exports: fio's nbd engine (one job) with 4 KiB random reads, random writes,
/// a 70/30 mix on a hot set that fits the cache, and a 70/30 zipf mix over the whole file,
/// against a locus cache export (NVRAM and DRAM of --nvram/--dram, each policy of
/// --policies), the backing file exported raw by qemu-nbd (O_DIRECT), and nbdkit's cache
/// filter over its file plugin — each case on each server in one run, --rounds times with
/// the servers taking turns (the median run is reported), a fresh server per run. A hot-set
/// case first reads the hot region once, sequentially, unmeasured (the caches warm up);
/// before each server starts, the backing file's pages are dropped from the page cache.
/// Prints IOPS (the median run's, and the range), MB/s, mean latency, locus's ratio to each
/// peer, and the backing-store reads and write-backs locus counted (warm-up included).
///
/// A last engine, `floor (nbdkit memory)`, is no cache at all: nbdkit's memory plugin, which
/// keeps the export in DRAM and does nothing else, measured with the same client. It is
/// what the NBD round trip itself allows on this machine and client placement; "of floor"
/// is each locus row's share of it (a cache at 0.9 of the floor has little left to gain
/// whatever the peers do).
///
/// The backing file (--size, on the disk in --dir) is filled with data first, so reads of it
/// return data, not holes. Durability differs: locus acknowledges a write once it is in
/// NVRAM (persistent); qemu-nbd with --cache=none once it reached the disk's cache (no
/// flush); nbdkit's cache filter (cache-mode writeback) once it is in its cache file in the
/// page cache (not durable).
#[derive(Debug, Args)]
pub struct CacheBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Seconds per run of a case.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,

    /// Runs of each case per server, the servers taking turns; the median run is reported
    /// with the range, so a shared machine's drift hits every server alike.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,

    /// Backing file size.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    size: u64,

    /// The hot set of the hot-set cases (fits the cache by default).
    #[arg(long, default_value = "48M", value_parser = parse_size)]
    hot: u64,

    /// NVRAM of the locus cache.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    nvram: u64,

    /// DRAM of the locus cache.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    dram: u64,

    /// Policies of the locus cache (comma-separated: nbm, nvlru, lru).
    #[arg(long, value_delimiter = ',', default_values = ["nbm", "nvlru"])]
    policies: Vec<String>,

    /// Queue depth of the fio job.
    #[arg(long, default_value_t = 1)]
    iodepth: u32,

    /// Run fio on these CPUs only (a list such as 0 or 0-1), as a client its operator
    /// pinned: every server meets the same client. A pinned client shows what `locus serve
    /// --pin client` does (the connection's thread moves to the client's CPU); unpinned, the
    /// scheduler wakes fio on whichever CPU is idle.
    #[arg(long, value_name = "CPUS", value_parser = super::parse_client_cpus)]
    client_cpus: Option<String>,

    /// Directory of the backing file (on the disk).
    #[arg(long, default_value = "/var/tmp")]
    dir: std::path::PathBuf,
}

#[derive(Debug, Serialize)]
struct Case {
    suite: &'static str,
    workload: &'static str,
    engine: String,
    durable: bool,
    iops: f64,
    bytes_per_sec: f64,
    latency_mean_ns: f64,
    /// The CPUs fio was kept on (`--client-cpus`), if any.
    client_cpus: Option<String>,
    /// locus only: what the backing store did during the case, its warm-up included.
    backing_reads: Option<u64>,
    writebacks: Option<u64>,
    /// Runs made; the figures above are the median run's (by IOPS).
    rounds: u32,
    iops_min: f64,
    iops_max: f64,
}

/// The median run of `runs` (by IOPS), with the range.
fn median(mut runs: Vec<Case>) -> Case {
    runs.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    let (min, max) = (runs[0].iops, runs[runs.len() - 1].iops);
    let count = runs.len() as u32;
    let mut mid = runs.swap_remove(runs.len() / 2);
    mid.rounds = count;
    mid.iops_min = min;
    mid.iops_max = max;
    mid
}

/// (name, fio arguments, whether it stays in the hot set).
const WORKLOADS: [(&str, &[&str], bool); 4] = [
    ("randread hot", &["--rw=randread"], true),
    ("randwrite hot", &["--rw=randwrite"], true),
    ("70/30 hot", &["--rw=randrw", "--rwmixread=70"], true),
    (
        "70/30 zipf",
        &[
            "--rw=randrw",
            "--rwmixread=70",
            "--random_distribution=zipf:1.1",
        ],
        false,
    ),
];

pub fn run(args: &CacheBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    anyhow::ensure!(
        args.hot <= args.size && args.size.is_multiple_of(4096) && args.size > 0,
        "--size must be whole 4 KiB blocks and hold --hot"
    );
    for policy in &args.policies {
        anyhow::ensure!(
            ["nbm", "nvlru", "lru"].contains(&policy.as_str()),
            "--policies: nbm, nvlru or lru, not {policy}"
        );
    }
    for tool in ["fio", "qemu-nbd", "nbdkit"] {
        if !installed(tool) {
            bail!("{tool} is not installed (Debian: fio, qemu-utils, nbdkit)");
        }
    }
    let backing = super::cleanup::Scratch::new(
        args.dir
            .join(format!("locus-bench-cache-{}.img", std::process::id())),
    );
    fill(backing.path(), args.size)?;
    let mut cases = Vec::new();
    let engines = args.policies.len() + 3;
    let bar = crate::progress::steps(
        (WORKLOADS.len() * engines) as u64 * u64::from(args.rounds),
        "fio runs",
        !args.json,
    );
    for (workload, fio_args, hot) in WORKLOADS {
        let region = if hot { args.hot } else { args.size };
        // Runs by engine: locus per policy, the raw export, nbdkit's cache, the floor.
        let mut runs: Vec<Vec<Case>> = (0..engines).map(|_| Vec::new()).collect();
        for _ in 0..args.rounds {
            for (i, policy) in args.policies.iter().enumerate() {
                forget_cached(backing.path())?;
                let mut server = start_locus(backing.path(), args, policy)?;
                warm(server.port, region, hot)?;
                let report = fio(server.port, fio_args, region, args)?;
                let log = stop(&mut server)?;
                let counts = totals(&log)?;
                runs[i].push(case(
                    workload,
                    format!("locus {policy}"),
                    true,
                    &report,
                    Some(counts),
                ));
                bar.inc(1);
            }
            forget_cached(backing.path())?;
            let server = start_qemu_nbd(backing.path())?;
            warm(server.port, region, hot)?;
            let report = fio(server.port, fio_args, region, args)?;
            drop(server);
            runs[engines - 3].push(case(
                workload,
                "raw (qemu-nbd)".into(),
                false,
                &report,
                None,
            ));
            bar.inc(1);
            forget_cached(backing.path())?;
            let server = start_nbdkit_cache(backing.path())?;
            warm(server.port, region, hot)?;
            let report = fio(server.port, fio_args, region, args)?;
            drop(server);
            runs[engines - 2].push(case(workload, "nbdkit cache".into(), false, &report, None));
            bar.inc(1);
            let server = start_nbdkit_memory(args.size)?;
            warm(server.port, region, hot)?;
            let report = fio(server.port, fio_args, region, args)?;
            drop(server);
            runs[engines - 1].push(case(workload, FLOOR.into(), false, &report, None));
            bar.inc(1);
        }
        cases.extend(runs.into_iter().map(median));
    }
    bar.finish_and_clear();
    for case in &mut cases {
        case.client_cpus.clone_from(&args.client_cpus);
    }
    if args.json {
        return super::print_json(&cases);
    }
    outln!(
        "4 KiB random I/O over NBD, queue depth {}, {}; median of {} runs of {} s per case and server, servers taking turns, each run after a warm-up read of the hot set; backing file {} ({}), hot set {}; locus cache NVRAM {}, DRAM {} (backing counts: the median run's, warm-up included)",
        args.iodepth,
        super::client_placement(args.client_cpus.as_deref()),
        args.rounds,
        args.seconds,
        backing.path().display(),
        format_bytes(args.size),
        format_bytes(args.hot),
        format_bytes(args.nvram),
        format_bytes(args.dram)
    );
    outln!(
        "{:<14} {:<22} {:>9} {:>13} {:>9} {:>9} {:>8} {:>9} {:>8} {:>13} {:>11}",
        "workload",
        "engine",
        "IOPS",
        "IOPS range",
        "MB/s",
        "mean us",
        "vs raw",
        "vs nbdkit",
        "of floor",
        "backing reads",
        "write-backs"
    );
    for c in &cases {
        let peer = |engine: &str| {
            cases
                .iter()
                .find(|p| p.workload == c.workload && p.engine == engine)
                .map(|p| p.iops)
        };
        let ratio = |engine: &str| match (c.backing_reads, peer(engine)) {
            (Some(_), Some(p)) if p > 0.0 => format!("{:.2}x", c.iops / p),
            _ => String::new(),
        };
        outln!(
            "{:<14} {:<22} {:>9.0} {:>13} {:>9.1} {:>9.1} {:>8} {:>9} {:>8} {:>13} {:>11}",
            c.workload,
            c.engine,
            c.iops,
            format!("{:.0}-{:.0}", c.iops_min, c.iops_max),
            c.bytes_per_sec / 1e6,
            c.latency_mean_ns / 1000.0,
            ratio("raw (qemu-nbd)"),
            ratio("nbdkit cache"),
            ratio(FLOOR),
            c.backing_reads.map(|n| n.to_string()).unwrap_or_default(),
            c.writebacks.map(|n| n.to_string()).unwrap_or_default()
        );
    }
    Ok(())
}

fn case(
    workload: &'static str,
    engine: String,
    durable: bool,
    report: &serde_json::Value,
    counts: Option<(u64, u64)>,
) -> Case {
    let job = &report["jobs"][0];
    let side = |key: &str, field: &str| job[key][field].as_f64().unwrap_or(0.0);
    let iops = side("read", "iops") + side("write", "iops");
    let bytes = side("read", "bw_bytes") + side("write", "bw_bytes");
    let (r, w) = (side("read", "iops"), side("write", "iops"));
    let latency = if r + w > 0.0 {
        (side("read", "clat_ns_mean") * r + side("write", "clat_ns_mean") * w) / (r + w)
    } else {
        0.0
    };
    let latency = if latency > 0.0 {
        latency
    } else {
        let mean = |key: &str| job[key]["clat_ns"]["mean"].as_f64().unwrap_or(0.0);
        if r + w > 0.0 {
            (mean("read") * r + mean("write") * w) / (r + w)
        } else {
            0.0
        }
    };
    Case {
        suite: "cache",
        workload,
        engine,
        durable,
        iops,
        bytes_per_sec: bytes,
        latency_mean_ns: latency,
        client_cpus: None,
        backing_reads: counts.map(|c| c.0),
        writebacks: counts.map(|c| c.1),
        rounds: 1,
        iops_min: iops,
        iops_max: iops,
    }
}

/// Writes `size` bytes of non-zero data to a fresh file, with O_DIRECT-friendly chunks.
fn fill(path: &std::path::Path, size: u64) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)
        .with_context(|| format!("creating the backing file {}", path.display()))?;
    let chunk: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 | 1)
        .collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(())
}

/// Drops the backing file's pages from the page cache (`dd iflag=nocache count=0`), so a
/// server reading it through the page cache starts as cold as one reading it O_DIRECT.
fn forget_cached(path: &std::path::Path) -> Result<()> {
    let status = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()
        .context("running dd to drop the backing file's cached pages")?;
    anyhow::ensure!(status.success(), "dd iflag=nocache failed");
    Ok(())
}

/// Warms a hot-set case: one sequential read of the hot region (not measured).
fn warm(port: u16, region: u64, hot: bool) -> Result<()> {
    if !hot {
        return Ok(());
    }
    let mut command = Command::new("fio");
    command.args([
        "--name=locus-bench-cache-warm",
        "--ioengine=nbd",
        &format!("--uri=nbd://127.0.0.1:{port}/"),
        "--rw=read",
        "--bs=4k",
        &format!("--size={region}"),
        "--output-format=json",
    ]);
    super::fio_report(&mut command).map(drop)
}

fn fio(
    port: u16,
    fio_args: &[&str],
    region: u64,
    args: &CacheBenchArgs,
) -> Result<serde_json::Value> {
    let mut command = Command::new("fio");
    command
        .args([
            "--name=locus-bench-cache",
            "--ioengine=nbd",
            &format!("--uri=nbd://127.0.0.1:{port}/"),
            "--bs=4k",
            &format!("--iodepth={}", args.iodepth),
            &format!("--size={region}"),
            "--numjobs=1",
            "--randrepeat=0",
            "--norandommap",
            "--time_based",
            &format!("--runtime={}ms", (args.seconds * 1000.0) as u64),
            "--output-format=json",
        ])
        .args(fio_args);
    super::pin_fio(&mut command, args.client_cpus.as_deref());
    super::fio_report(&mut command)
}

fn start_locus(backing: &std::path::Path, args: &CacheBenchArgs, policy: &str) -> Result<Running> {
    let scratch = super::cleanup::Scratch::shm_dir("locus-bench-cache")?;
    let dir = scratch.path().to_owned();
    let exe = std::env::current_exe().context("finding the locus binary")?;
    let volume_bytes = (args.nvram + args.nvram / 32 + (64 << 20)).next_multiple_of(1 << 20);
    let formatted = Command::new(&exe)
        .args(["format", "--volume"])
        .arg(&dir)
        .arg(format!("--emulate={volume_bytes}"))
        .output()
        .context("running locus format")?;
    if !formatted.status.success() {
        bail!(
            "locus format: {}",
            String::from_utf8_lossy(&formatted.stderr)
        );
    }
    let port = free_port()?;
    let log = dir.join("serve.log");
    Running::start(
        "locus",
        Command::new(exe)
            .args(["serve", "--stats-json", "--volume"])
            .arg(&dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--export",
                &format!(
                    "c=cache:{},nvram={},dram={},policy={policy}",
                    backing.display(),
                    args.nvram,
                    args.dram
                ),
            ])
            .stderr(std::fs::File::create(&log)?),
        port,
        true,
        Some(scratch),
    )
}

/// Stops locus (SIGTERM) and returns its log.
fn stop(server: &mut Running) -> Result<String> {
    let _ = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            bail!("locus serve did not stop within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server
        ._scratch
        .as_ref()
        .map(|s| s.path().join("serve.log"))
        .context("locus's scratch directory")?;
    Ok(std::fs::read_to_string(log).unwrap_or_default())
}

/// The cache's backing reads and write-backs from locus's `--stats-json` totals.
fn totals(log: &str) -> Result<(u64, u64)> {
    let totals = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["report"] == "total" && v["cache"] == "c")
        .with_context(|| format!("locus printed no cache totals: {log}"))?;
    let n = |key: &str| totals["stats"][key].as_u64().unwrap_or(0);
    Ok((n("backing_reads"), n("writebacks")))
}

fn start_qemu_nbd(backing: &std::path::Path) -> Result<Running> {
    let port = free_port()?;
    Running::start(
        "qemu-nbd",
        Command::new("qemu-nbd")
            .args([
                "--persistent",
                "--format=raw",
                "--cache=none",
                "--aio=io_uring",
            ])
            .args(["--bind=127.0.0.1", &format!("--port={port}")])
            .arg(backing)
            .stderr(Stdio::null()),
        port,
        false,
        None,
    )
}

/// The engine name of the round-trip floor.
const FLOOR: &str = "floor (nbdkit memory)";

/// nbdkit on loopback with `plugin` (a plugin and its arguments, filters first).
fn start_nbdkit(engine: &'static str, plugin: &[&std::ffi::OsStr]) -> Result<Running> {
    let port = free_port()?;
    Running::start(
        engine,
        Command::new("nbdkit")
            .args([
                "--foreground",
                "--exit-with-parent",
                "-p",
                &port.to_string(),
            ])
            .args(["--ipaddr", "127.0.0.1"])
            .args(plugin)
            .stderr(Stdio::null()),
        port,
        false,
        None,
    )
}

/// nbdkit's memory plugin: the export in DRAM, nothing behind it.
fn start_nbdkit_memory(size: u64) -> Result<Running> {
    let size = size.to_string();
    start_nbdkit("nbdkit-memory", &["memory".as_ref(), size.as_ref()])
}

fn start_nbdkit_cache(backing: &std::path::Path) -> Result<Running> {
    start_nbdkit(
        "nbdkit-cache",
        &[
            "--filter=cache".as_ref(),
            "file".as_ref(),
            backing.as_os_str(),
        ],
    )
}
