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
///
/// Then the FUSE round trip, the least any request through the mount costs: a `pread` past the
/// end of a file, which the server answers at once with no data, in a loop on one thread
/// pinned to one CPU, through the durable mount and on tmpfs. The server's request counters
/// show that each call reached it. A durable write through the mount takes at least one round
/// trip, so the bench also prints how close to tmpfs a one-job write can come at all.
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
    let round_trip = {
        let _server = Server::start(volume.path(), point.path(), &[])?;
        measure(&mount_target, &mut cases)?;
        bar.set_message("FUSE round trip");
        let seconds = args.seconds.min(ROUND_TRIP_SECONDS);
        RoundTrip::measure(point.path(), tmpfs.path(), seconds).context("FUSE round trip")?
    };
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
        super::print_json(&[round_trip])?;
    } else {
        print_table(&cases, args)?;
        print_round_trip(&round_trip, &cases)?;
    }
    Ok(())
}

/// Longest the round-trip loop runs on each side.
const ROUND_TRIP_SECONDS: f64 = 1.0;
/// Where the round-trip probe reads: far past the end of its one-block file.
const PAST_THE_END: u64 = 1 << 40;

/// What one request through the mount costs at the least, against the same call on tmpfs.
#[derive(Debug, serde::Serialize)]
struct RoundTrip {
    suite: &'static str,
    op: &'static str,
    /// The CPU the probing thread was pinned to.
    cpu: u32,
    /// Mean time of one call through the mount, and on tmpfs.
    mount_ns: f64,
    tmpfs_ns: f64,
    /// Calls made through the mount.
    calls: u64,
    /// Requests the server counted per call (1: every call was a round trip).
    requests_per_call: f64,
}

impl RoundTrip {
    /// Probes a file of the mount at `point` and one in the tmpfs directory `tmpfs`, for up
    /// to `seconds` each, from a thread pinned to the CPU this one runs on.
    fn measure(point: &Path, tmpfs: &Path, seconds: f64) -> Result<RoundTrip> {
        let cpu = topology::current_cpu().context("finding this thread's CPU")?;
        let mount_file = probe_file(&point.join("round-trip"))?;
        let tmpfs_file = probe_file(&tmpfs.join("round-trip"))?;
        let (mount_ns, tmpfs_ns, calls, requests) =
            std::thread::scope(|scope| -> Result<(f64, f64, u64, u64)> {
                scope
                    .spawn(|| {
                        topology::pin_current_thread(&[cpu])
                            .with_context(|| format!("pinning the probe to CPU {cpu}"))?;
                        // Read twice before: the difference is what one reading of the
                        // status file adds, taken off the count after.
                        let first = served_requests(point)?;
                        let before = served_requests(point)?;
                        let (mount_ns, calls) = probe(&mount_file, seconds)?;
                        let after = served_requests(point)?;
                        let (tmpfs_ns, _) = probe(&tmpfs_file, seconds)?;
                        let reading = before.saturating_sub(first);
                        let requests = after.saturating_sub(before).saturating_sub(reading);
                        Ok((mount_ns, tmpfs_ns, calls, requests))
                    })
                    .join()
                    .map_err(|_| anyhow::anyhow!("the round-trip probe panicked"))?
            })?;
        Ok(RoundTrip {
            suite: "mount",
            op: "round-trip",
            cpu,
            mount_ns,
            tmpfs_ns,
            calls,
            requests_per_call: requests as f64 / calls.max(1) as f64,
        })
    }
}

/// A file of one block at `path`, open for reading.
fn probe_file(path: &Path) -> Result<std::fs::File> {
    std::fs::write(path, [0u8; 4096]).with_context(|| format!("writing {}", path.display()))?;
    std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))
}

/// Reads past the end of `file` for `seconds`: the mean time per call, and the calls made.
fn probe(file: &std::fs::File, seconds: f64) -> Result<(f64, u64)> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 4096];
    let limit = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut calls = 0u64;
    // Checking the clock every call would add its cost to the tmpfs side's third of a
    // microsecond: in rounds of 256.
    while started.elapsed() < limit {
        for _ in 0..256 {
            let read = file
                .read_at(&mut buf, PAST_THE_END)
                .context("reading past the end of the probe file")?;
            anyhow::ensure!(read == 0, "a read past the end returned {read} bytes");
        }
        calls += 256;
    }
    Ok((started.elapsed().as_nanos() as f64 / calls as f64, calls))
}

/// Requests the server of the mount at `point` has served, from its status file (counting
/// those of this reading that came before the file's contents were made: lookup, open, read).
fn served_requests(point: &Path) -> Result<u64> {
    let status = crate::commands::status::mount_server_status(point)?;
    let fuse = &status["fuse"];
    let queued: u64 = fuse["queue_requests"]
        .as_array()
        .map(|q| q.iter().filter_map(serde_json::Value::as_u64).sum())
        .unwrap_or(0);
    let read = fuse["dev_requests"]
        .as_u64()
        .context("the mount server's status has no request counts (fuse.dev_requests)")?;
    Ok(queued + read)
}

fn print_round_trip(trip: &RoundTrip, cases: &[Case]) -> Result<()> {
    outln!(
        "FUSE round trip: a read past the end of a file, which the server answers at once, took \
         {:.2} us through the mount ({:.2} server requests per call) and {:.2} us on tmpfs, one thread \
         pinned to CPU {}.",
        trip.mount_ns / 1000.0,
        trip.requests_per_call,
        trip.tmpfs_ns / 1000.0,
        trip.cpu,
    );
    // A durable write through the mount is at least one round trip. A one-job case's time
    // per write on tmpfs is fio's own part (between its calls) plus the call: through the
    // mount it is at least that part plus a round trip. The bound for the smallest block
    // size measured with one job, where it bites.
    if let Some(tmpfs) = cases
        .iter()
        .filter(|c| c.engine == "tmpfs" && c.numjobs == 1 && c.iops > 0.0)
        .min_by_key(|c| c.bs_bytes)
        && trip.mount_ns > 0.0
    {
        let per_write = 1e9 / tmpfs.iops;
        let outside = (per_write - tmpfs.latency_mean_ns).max(0.0);
        outln!(
            "A durable write through the mount takes at least one: with one job at {}, where \
             a write took {:.2} us on tmpfs ({:.2} us of it in the call), the mount can reach \
             at most {:.2}x tmpfs here.",
            super::short_size(tmpfs.bs_bytes),
            per_write / 1000.0,
            tmpfs.latency_mean_ns / 1000.0,
            per_write / (outside + trip.mount_ns),
        );
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
