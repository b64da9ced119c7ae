//! `locus bench mount`: the same fio job on tmpfs, on `locus mount` and on locus through the
//! preload library, side by side in one run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use super::preload::Case;
use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Measure `locus mount`: fio's `psync` engine (random writes, one file per job, the jobs
/// as separate processes) on a tmpfs directory, on a fresh locus volume mounted with `locus
/// mount` (`mount`) and mounted again with `--writeback-cache` (`mount-wb`), and the same job
/// through the preload library (as threads: the library serves one process), for each block
/// size and job count, in one run. Prints IOPS, GB/s and each locus column's ratio to tmpfs.
///
/// Every write through `mount` and the library is atomic and durable when `pwrite` returns;
/// through `mount-wb` it is durable once written back (at `fsync` or `close` at the latest);
/// tmpfs writes are never durable. The volumes live in /dev/shm and are removed after.
#[derive(Debug, Args)]
pub struct MountBenchArgs {
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

    /// The preload library (default: liblocus_preload.so next to this executable); without
    /// it the preload column is left out.
    #[arg(long)]
    library: Option<PathBuf>,
}

#[derive(Clone)]
struct Target {
    engine: &'static str,
    dir: String,
    /// (library, volume) for the preload column.
    preload: Option<(PathBuf, PathBuf)>,
    durable: bool,
}

/// A `locus mount --foreground` server of a bench volume, stopped (SIGTERM) when dropped.
struct Server {
    child: Child,
    _pid: super::cleanup::ChildPid,
    point: PathBuf,
}

impl Server {
    fn start(volume: &Path, point: &Path, options: &[&str]) -> Result<Server> {
        let mut child = Command::new(std::env::current_exe().context("locating locus")?)
            .args(["mount", "--foreground", "--volume"])
            .arg(volume)
            .arg(point)
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting locus mount")?;
        let pid = super::cleanup::ChildPid::new(&child);
        let canonical = point.canonicalize()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !volume::is_locus_mount(&canonical) {
            if let Some(status) = child.try_wait()? {
                bail!("locus mount stopped before mounting ({status})");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("locus mount did not mount within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Server {
            child,
            _pid: pid,
            point: point.to_owned(),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let stopped = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        if self
            .point
            .canonicalize()
            .is_ok_and(|p| volume::is_locus_mount(&p))
        {
            let _ = Command::new("umount").arg("-l").arg(&self.point).status();
        }
    }
}

fn fio(target: &Target, bs: u64, numjobs: u32, args: &MountBenchArgs) -> Result<Case> {
    let mut command =
        super::preload::randwrite_command(&target.dir, bs, args.size, numjobs, args.seconds);
    if let Some((library, volume)) = &target.preload {
        // The library serves one process: fio's jobs run as its threads.
        command
            .arg("--thread")
            .env("LD_PRELOAD", library)
            .env("LOCUS_VOLUME", volume)
            .env("LOCUS_MOUNT", "/locus");
    }
    super::preload::randwrite_case(
        &mut command,
        "mount",
        target.engine,
        (bs, numjobs),
        target.durable,
    )
}

pub fn run(sysfs: &Path, args: &MountBenchArgs) -> Result<()> {
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
    let library = match &args.library {
        Some(path) => Some(super::preload::library(Some(path))?),
        None => super::preload::library(None).ok(),
    };
    let max_jobs = u64::from(*args.numjobs.iter().max().unwrap_or(&1));
    let tmpfs = super::cleanup::Scratch::shm_dir("locus-bench-mount-tmpfs")?;
    let volume = super::cleanup::Scratch::shm_dir("locus-bench-mount-volume")?;
    let point = super::cleanup::Scratch::shm_dir("locus-bench-mount-point")?;
    // One volume, used by the mount and then by the library (3 GiB of room for the
    // checkpoint to keep up with sustained overwrites).
    super::preload::make_volume_with_room(volume.path(), sysfs, max_jobs, args.size, 3 << 30)?;
    let tmpfs_target = Target {
        engine: "tmpfs",
        dir: tmpfs.path().display().to_string(),
        preload: None,
        durable: false,
    };
    let mount_target = Target {
        engine: "mount",
        dir: point.path().display().to_string(),
        preload: None,
        durable: true,
    };
    let writeback_target = Target {
        engine: "mount-wb",
        durable: false,
        ..mount_target.clone()
    };
    let preload_target = library.as_ref().map(|library| Target {
        engine: "preload",
        dir: "/locus".into(),
        preload: Some((library.clone(), volume.path().to_owned())),
        durable: true,
    });
    let grid: Vec<(u32, u64)> = args
        .numjobs
        .iter()
        .flat_map(|&n| args.bs.iter().map(move |&b| (n, b)))
        .collect();
    let columns = 3 + usize::from(preload_target.is_some());
    let bar = crate::progress::steps((grid.len() * columns) as u64, "fio runs", !args.json);
    let mut cases = Vec::new();
    let measure = |target: &Target, cases: &mut Vec<Case>| -> Result<()> {
        for &(numjobs, bs) in &grid {
            let case = format!(
                "randwrite {} x{numjobs} on {}",
                super::short_size(bs),
                target.engine
            );
            bar.set_message(case.clone());
            cases.push(fio(target, bs, numjobs, args).context(case)?);
            bar.inc(1);
        }
        Ok(())
    };
    measure(&tmpfs_target, &mut cases)?;
    {
        let _server = Server::start(volume.path(), point.path(), &[])?;
        measure(&mount_target, &mut cases)?;
    }
    {
        let _server = Server::start(volume.path(), point.path(), &["--writeback-cache"])?;
        measure(&writeback_target, &mut cases)?;
    }
    if let Some(target) = &preload_target {
        measure(target, &mut cases)?;
    }
    // Side by side: each grid point's columns together.
    let order = |e: &str| {
        ["tmpfs", "mount", "mount-wb", "preload"]
            .iter()
            .position(|&x| x == e)
    };
    cases.sort_by_key(|c| (c.numjobs, c.bs_bytes, order(c.engine)));
    bar.finish_and_clear();
    if args.json {
        super::print_json(&cases)?;
    } else {
        print_table(&cases, args)?;
    }
    Ok(())
}

fn print_table(cases: &[Case], args: &MountBenchArgs) -> Result<()> {
    outln!(
        "fio psync randwrite, one {} file per job, {} s per case; jobs as processes on tmpfs \
         (not durable), on `locus mount` (durable) and on `locus mount --writeback-cache` \
         (mount-wb: durable once written back), as threads through liblocus_preload.so \
         (durable)",
        format_bytes(args.size),
        args.seconds
    );
    outln!(
        "{:>4} {:>6} {:<8} {:>10} {:>8} {:>9} {:>8}",
        "jobs",
        "bs",
        "engine",
        "IOPS",
        "GB/s",
        "mean us",
        "/tmpfs"
    );
    for case in cases {
        let ratio = if case.engine == "tmpfs" {
            String::new()
        } else {
            cases
                .iter()
                .find(|c| {
                    c.engine == "tmpfs" && c.bs_bytes == case.bs_bytes && c.numjobs == case.numjobs
                })
                .filter(|t| t.bytes_per_sec > 0.0)
                .map(|t| format!("{:.2}x", case.bytes_per_sec / t.bytes_per_sec))
                .unwrap_or_default()
        };
        outln!(
            "{:>4} {:>6} {:<8} {:>10.0} {:>8.2} {:>9.1} {:>8}",
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
