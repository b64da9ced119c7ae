//! `locus bench preload`: the same fio job on tmpfs and on locus through
//! `liblocus_preload.so`, side by side in one run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Measure unmodified programs on locus: fio's `psync` engine (random writes, one file per
/// job, `--thread`) on a tmpfs directory and on locus files through the preload library,
/// for each block size and job count, in one run. A third column runs the tmpfs job with
/// the library loaded, to show what it costs calls it passes through. Prints IOPS, GB/s and
/// locus's ratio to tmpfs.
///
/// locus runs on a fresh volume in /dev/shm (removed afterwards) whose pages are all
/// allocated before the first case, as in a volume in use (it holds twice the files and
/// 3 GiB per second of a case, 1 to 6 GiB, more: that much memory for the bench's run);
/// every write is atomic and durable when fio's `pwrite` returns. tmpfs writes are neither.
#[derive(Debug, Args)]
pub struct PreloadBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Seconds per case.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,

    /// File size per job.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,

    /// Block sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values = ["1K", "4K", "64K", "2M"], value_parser = parse_size)]
    bs: Vec<u64>,

    /// Job counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2])]
    numjobs: Vec<u32>,

    /// Runs of each case per column, the columns alternating; each column's median run (by
    /// IOPS) is reported, with the range of the rounds' locus/tmpfs ratios (a shared
    /// machine's drift then hits every column alike, and shows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,

    /// The preload library (default: liblocus_preload.so next to this executable, as
    /// `cargo build --release` leaves it).
    #[arg(long)]
    library: Option<PathBuf>,
}

/// One fio run's result (shared with `bench mount`).
#[derive(Debug, Serialize)]
pub(super) struct Case {
    pub(super) suite: &'static str,
    pub(super) engine: &'static str,
    pub(super) op: &'static str,
    pub(super) bs_bytes: u64,
    pub(super) numjobs: u32,
    pub(super) iops: f64,
    pub(super) bytes_per_sec: f64,
    pub(super) latency_mean_ns: f64,
    pub(super) durable: bool,
    /// Runs of the case on this column; the figures above are the median run's.
    pub(super) rounds: u32,
    /// Lowest and highest IOPS of the rounds (with `--rounds` above 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) iops_range: Option<[f64; 2]>,
    /// Lowest and highest locus/tmpfs throughput ratio of the rounds, each round's locus run
    /// against the tmpfs run of the same round (locus cases, with `--rounds` above 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ratio_range: Option<[f64; 2]>,
}

/// Where one column's fio runs.
struct Target {
    engine: &'static str,
    dir: String,
    preload: Option<(PathBuf, PathBuf)>,
    durable: bool,
}

pub(super) fn library(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("locating the locus executable")?
            .with_file_name("liblocus_preload.so"),
    };
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release` (crate preload) or pass \
             --library",
            path.display()
        );
    }
    Ok(path)
}

/// A fresh volume in `dir`, sized for `files` files of `size` bytes plus logs, and room for
/// what cases of `seconds` each may have written before the checkpoint frees what they
/// replaced: 3 GiB per second, 1 to 6 GiB (every page of it is allocated up front).
pub(super) fn make_volume(
    dir: &Path,
    sysfs: &Path,
    files: u64,
    size: u64,
    seconds: f64,
) -> Result<()> {
    let room = ((3u64 << 30) as f64 * seconds).clamp((1u64 << 30) as f64, (6u64 << 30) as f64);
    make_volume_with_room(dir, sysfs, files, size, room as u64)
}

/// [`make_volume`] with `room` bytes beyond twice the files.
pub(super) fn make_volume_with_room(
    dir: &Path,
    sysfs: &Path,
    files: u64,
    size: u64,
    room: u64,
) -> Result<()> {
    let topology = super::super::volume::read_topology(sysfs)?;
    let nodes = topology
        .nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .count()
        .max(1) as u64;
    // Sustained random overwrites fill space faster than the checkpoint frees the blocks
    // they replace (measured: 4 KiB writes at ~550 k/s run a 1.5 GiB volume out of space in
    // about two seconds), so the volume gets generous room beyond the files themselves.
    let bytes = (files * size * 2 + room) / nodes;
    let bytes = bytes.div_ceil(2 << 20) * (2 << 20);
    let config = volume::default_config(dir, &topology, Some(bytes))
        .context("laying out the bench volume")?;
    volume::Volume::format(dir, &config, false).context("formatting the bench volume")?;
    fs::format_volume(dir, topology.clone()).context("formatting the bench file system")?;
    // Every page of the emulated devices in memory now, as in a volume that has been in use
    // (and as `locus serve` and `locus mount` map them at open): the preload library maps
    // pages as they are touched, and on a fresh volume each first touch makes the kernel
    // allocate and clear a page of the device file. Measured without this (fio 64 KiB
    // random writes, one job, six fresh volumes): 6 k to 200 k IOPS, with 0.9 to 2.7 s of
    // system time in 2 s for the same 350 k page faults — how much depends on how much of
    // the VM's memory the host must still back; with it, 199–246 k and 0.4 s every time.
    // tmpfs's own file is laid out by fio before it is timed.
    let populated = volume::OpenOptions {
        check_interval: None,
        prefault: true,
        ..Default::default()
    };
    drop(
        volume::Volume::open(dir, topology, &populated)
            .context("mapping the bench volume's pages")?,
    );
    Ok(())
}

/// fio's psync random-write job on `dir/bench.$jobnum` with these sizes and time.
pub(super) fn randwrite_command(
    dir: &str,
    bs: u64,
    size: u64,
    numjobs: u32,
    seconds: f64,
) -> Command {
    let mut command = Command::new("fio");
    command.args([
        "--name=locus-bench".to_owned(),
        "--ioengine=psync".into(),
        "--rw=randwrite".into(),
        format!("--bs={bs}"),
        format!("--size={size}"),
        format!("--numjobs={numjobs}"),
        format!("--filename_format={dir}/bench.$jobnum"),
        "--group_reporting".into(),
        "--randrepeat=0".into(),
        "--norandommap".into(),
        "--time_based".into(),
        format!("--runtime={}ms", (seconds * 1000.0) as u64),
        "--output-format=json".into(),
    ]);
    command
}

/// Runs `command` (from [`randwrite_command`]) and reads its write side into a [`Case`].
pub(super) fn randwrite_case(
    command: &mut Command,
    suite: &'static str,
    engine: &'static str,
    (bs, numjobs): (u64, u32),
    durable: bool,
) -> Result<Case> {
    let doc = super::fio_report(command)?;
    let side = &doc["jobs"][0]["write"];
    Ok(Case {
        suite,
        engine,
        op: "randwrite",
        bs_bytes: bs,
        numjobs,
        iops: side["iops"].as_f64().unwrap_or(0.0),
        bytes_per_sec: side["bw_bytes"].as_f64().unwrap_or(0.0),
        latency_mean_ns: side["lat_ns"]["mean"].as_f64().unwrap_or(0.0),
        durable,
        rounds: 1,
        iops_range: None,
        ratio_range: None,
    })
}

fn fio(target: &Target, bs: u64, numjobs: u32, args: &PreloadBenchArgs) -> Result<Case> {
    let mut command = randwrite_command(&target.dir, bs, args.size, numjobs, args.seconds);
    command.arg("--thread");
    if let Some((library, volume)) = &target.preload {
        command
            .env("LD_PRELOAD", library)
            .env("LOCUS_VOLUME", volume)
            .env("LOCUS_MOUNT", "/locus");
    }
    randwrite_case(
        &mut command,
        "preload",
        target.engine,
        (bs, numjobs),
        target.durable,
    )
}

pub fn run(sysfs: &Path, args: &PreloadBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    anyhow::ensure!(
        args.bs.iter().all(|&b| (512..=64 << 20).contains(&b)),
        "--bs: 512 bytes to 64M"
    );
    anyhow::ensure!(
        args.numjobs.iter().all(|&n| (1..=64).contains(&n)),
        "--numjobs: 1 to 64"
    );
    anyhow::ensure!(
        args.bs.iter().all(|&b| b <= args.size),
        "--size must hold at least one block"
    );
    if !super::nbd::installed("fio") {
        bail!("fio is not installed (Debian: apt-get install fio)");
    }
    let library = library(args.library.as_deref())?;
    let tmpfs = super::cleanup::Scratch::shm_dir(&format!("locus-bench-preload-{}", "tmpfs"))?;
    let volume_dir =
        super::cleanup::Scratch::shm_dir(&format!("locus-bench-preload-{}", "volume"))?;
    let max_jobs = u64::from(*args.numjobs.iter().max().unwrap_or(&1));
    make_volume(volume_dir.path(), sysfs, max_jobs, args.size, args.seconds)?;
    let targets = [
        Target {
            engine: "tmpfs",
            dir: tmpfs.path().display().to_string(),
            preload: None,
            durable: false,
        },
        Target {
            engine: "locus",
            dir: "/locus".into(),
            preload: Some((library.clone(), volume_dir.path().to_owned())),
            durable: true,
        },
        Target {
            engine: "tmpfs+preload",
            dir: tmpfs.path().display().to_string(),
            preload: Some((library, volume_dir.path().to_owned())),
            durable: false,
        },
    ];
    let mut cases = Vec::new();
    let rounds = args.rounds as usize;
    let total = args.numjobs.len() * args.bs.len() * targets.len() * rounds;
    let bar = crate::progress::steps(total as u64, "fio runs", !args.json);
    for &numjobs in &args.numjobs {
        for &bs in &args.bs {
            // Each column's runs, in round order.
            let mut runs: Vec<Vec<Case>> = targets.iter().map(|_| Vec::new()).collect();
            for round in 0..rounds {
                for (target, runs) in targets.iter().zip(&mut runs) {
                    let case = format!(
                        "randwrite {} x{numjobs} on {}",
                        super::short_size(bs),
                        target.engine
                    );
                    bar.set_message(if rounds > 1 {
                        format!("{case}, round {} of {rounds}", round + 1)
                    } else {
                        case.clone()
                    });
                    let mut run = fio(target, bs, numjobs, args).context(case)?;
                    run.rounds = args.rounds;
                    runs.push(run);
                    bar.inc(1);
                }
            }
            // Per-round ratios, before the medians are taken out of the runs.
            let column = |engine: &str| targets.iter().position(|t| t.engine == engine);
            let ratios: Option<Vec<f64>> = column("locus").zip(column("tmpfs")).map(|(l, t)| {
                runs[l]
                    .iter()
                    .zip(&runs[t])
                    .map(|(l, t)| l.bytes_per_sec / t.bytes_per_sec.max(1e-9))
                    .collect()
            });
            for (target, runs) in targets.iter().zip(runs) {
                let mut median = super::median_run(
                    runs,
                    |c: &Case| c.iops,
                    |c, range| {
                        c.iops_range = Some(range);
                    },
                );
                if rounds > 1 && target.engine == "locus" {
                    median.ratio_range = ratios.as_deref().map(super::min_max);
                }
                cases.push(median);
            }
        }
    }
    bar.finish_and_clear();
    if args.json {
        super::print_json(&cases)?;
    } else {
        print_table(&cases, args)?;
    }
    Ok(())
}

fn print_table(cases: &[Case], args: &PreloadBenchArgs) -> Result<()> {
    outln!(
        "fio psync randwrite, one {} file per job, {} s per case; locus through \
         liblocus_preload.so (durable), tmpfs (not durable), tmpfs with the library loaded{}",
        format_bytes(args.size),
        args.seconds,
        super::rounds_title(args.rounds, "column")
    );
    let range_header = super::range_header(args.rounds);
    outln!(
        "{:>4} {:>6} {:<14} {:>10} {:>8} {:>9} {:>13}{range_header}",
        "jobs",
        "bs",
        "engine",
        "IOPS",
        "GB/s",
        "mean us",
        "locus/tmpfs"
    );
    for case in cases {
        let ratio = if case.engine == "locus" {
            cases
                .iter()
                .find(|c| {
                    c.engine == "tmpfs" && c.bs_bytes == case.bs_bytes && c.numjobs == case.numjobs
                })
                .filter(|t| t.bytes_per_sec > 0.0)
                .map(|t| format!("{:.2}x", case.bytes_per_sec / t.bytes_per_sec))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let range = super::range_cell(case.ratio_range);
        outln!(
            "{:>4} {:>6} {:<14} {:>10.0} {:>8.2} {:>9.1} {:>13}{range}",
            case.numjobs,
            super::short_size(case.bs_bytes),
            case.engine,
            case.iops,
            case.bytes_per_sec / 1e9,
            case.latency_mean_ns / 1000.0,
            ratio,
        );
    }
    Ok(())
}
