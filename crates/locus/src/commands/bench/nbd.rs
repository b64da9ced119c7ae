//! `locus bench nbd`: fio's nbd engine against `locus serve` and, in the same run, against
//! `nbdkit memory` and `qemu-nbd` serving a file on tmpfs, over loopback TCP.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Measure NBD serving: fio's nbd engine (one job, queue depth 16) with random reads and
/// writes of 4 KiB, 64 KiB and 1 MiB against `locus serve`, `nbdkit memory` and `qemu-nbd`
/// (on a tmpfs file), each over loopback TCP, in one run. Servers that are not installed are
/// skipped with a note. Every export is filled before the read cases, so reads return data,
/// not holes. The servers run side by side: each case runs on every server in turn, --rounds
/// times, and the median run is reported, so a shared machine's drift hits all of them
/// alike. Prints IOPS, GB/s and locus's ratio to each other server. With --tls, locus and
/// nbdkit also run with TLS required (`locus+tls`, `nbdkit-memory+tls`): TLS engines are
/// compared with locus+tls, and locus+tls with plain locus ("TLS 0.80x": its share of plain
/// throughput).
///
/// locus serves a fresh volume in /dev/shm (removed afterwards), with every write durable
/// before its reply; nbdkit's memory plugin keeps data in DRAM, qemu-nbd in the page cache
/// (--cache=writeback), neither durable.
#[derive(Debug, Args)]
pub struct NbdBenchArgs {
    /// Print one JSON object per case instead of a table.
    #[arg(long)]
    json: bool,

    /// Seconds per run of a case.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,

    /// Runs of each case per server, alternating between servers; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: u32,

    /// Region of each export the cases touch (the exports are 1 GiB).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,

    /// Block sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values = ["4K", "64K", "1M"], value_parser = parse_size)]
    bs: Vec<u64>,

    /// Queue depth of the fio job.
    #[arg(long, default_value_t = 16)]
    iodepth: u32,

    /// Run fio on these CPUs only (a list such as 0 or 0-1), as a client its operator
    /// pinned: every server meets the same client. A pinned client shows what `locus serve
    /// --pin client` does (the connection's thread moves to the client's CPU); unpinned, the
    /// scheduler wakes fio on whichever CPU is idle.
    #[arg(long, value_name = "CPUS", value_parser = super::parse_client_cpus)]
    client_cpus: Option<String>,

    /// locus serve's submission: inline or queued.
    #[arg(long, default_value = "inline")]
    submit: String,

    /// Also measure TLS: locus serve and nbdkit memory with TLS required (credentials made
    /// for the run), as engines `locus+tls` and `nbdkit-memory+tls`, so the table shows what
    /// TLS costs each and how the two compare.
    #[arg(long)]
    tls: bool,
}

/// Starts one server.
type Starter = Box<dyn Fn() -> Result<Running>>;

/// Export size for every server.
const EXPORT_BYTES: u64 = 1 << 30;

#[derive(Debug, Serialize)]
struct Case {
    suite: &'static str,
    engine: &'static str,
    op: &'static str,
    bs_bytes: u64,
    iodepth: u32,
    iops: f64,
    bytes_per_sec: f64,
    latency_mean_ns: f64,
    /// The CPUs fio was kept on (`--client-cpus`), if any.
    client_cpus: Option<String>,
    durable: bool,
    /// Runs this case had on this server; the figures above are the median run's.
    rounds: u32,
    /// The slowest and fastest runs, to show how much the machine varied.
    bytes_per_sec_min: f64,
    bytes_per_sec_max: f64,
}

/// A server process, stopped (SIGTERM, then SIGKILL) when dropped.
pub(super) struct Running {
    pub(super) engine: &'static str,
    pub(super) child: Child,
    pub(super) port: u16,
    pub(super) durable: bool,
    /// Dropped after the child is reaped (fields drop after `drop`'s body).
    /// With TLS: the HOME whose `.pki/libnbd` holds the CA certificate clients check the
    /// server with (libnbd's default place; fio's URIs may not name local files).
    pub(super) tls_home: Option<std::path::PathBuf>,
    pub(super) _pid: super::cleanup::ChildPid,
    pub(super) _scratch: Option<super::cleanup::Scratch>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Spawns `command` (stdout and stderr to nowhere unless it set them) and waits until
    /// it listens on `port`; `scratch` is removed once the server is gone.
    pub(super) fn start(
        engine: &'static str,
        command: &mut Command,
        port: u16,
        durable: bool,
        scratch: Option<super::cleanup::Scratch>,
    ) -> Result<Running> {
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {engine}"))?;
        let mut running = Running {
            engine,
            _pid: super::cleanup::ChildPid::new(&child),
            child,
            port,
            durable,
            tls_home: None,
            _scratch: scratch,
        };
        wait_for(&mut running)?;
        Ok(running)
    }
}

pub(super) fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(super) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn wait_for(running: &mut Running) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", running.port)).is_err() {
        if let Some(status) = running.child.try_wait()? {
            bail!("{} exited with {status} before listening", running.engine);
        }
        if Instant::now() > deadline {
            bail!("{} did not listen within 60 s", running.engine);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// TLS credentials for one run: the server's directory and a HOME for clients.
struct Credentials {
    server: std::path::PathBuf,
    home: std::path::PathBuf,
    _scratch: super::cleanup::Scratch,
}

impl Credentials {
    fn make() -> Result<Self> {
        let scratch = super::cleanup::Scratch::shm_dir("locus-bench-nbd-tls")?;
        let dir = scratch.path().to_owned();
        crate::commands::credentials::make(&dir.join("made"), &["localhost".to_owned()], 2)?;
        let pki = dir.join("home/.pki/libnbd");
        std::fs::create_dir_all(&pki)?;
        std::fs::copy(dir.join("made/client/ca-cert.pem"), pki.join("ca-cert.pem"))?;
        Ok(Self {
            server: dir.join("made/server"),
            home: dir.join("home"),
            _scratch: scratch,
        })
    }
}

fn start_locus(sysfs: &Path, submit: &str, tls: Option<&Credentials>) -> Result<Running> {
    let scratch = super::cleanup::Scratch::shm_dir("locus-bench-nbd")?;
    let dir = scratch.path().to_owned();
    // A volume sized for the export (twice it: room for overwrites the checkpoint has not
    // yet taken back), not the embedded default, which is a share of free memory: smaller
    // than the export on a small machine, and on a large one gigabytes the server would
    // map and the kernel clear before the first case.
    super::preload::make_volume_with_room(&dir, sysfs, 1, EXPORT_BYTES, 0)
        .context("formatting the bench volume")?;
    let port = free_port()?;
    let exe = std::env::current_exe().context("finding the locus binary")?;
    let mut command = Command::new(exe);
    command
        .arg("--sysfs")
        .arg(sysfs)
        .args(["serve", "--volume", dir.to_str().unwrap_or_default()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--default-size", &EXPORT_BYTES.to_string()])
        .args(["--submit", submit])
        .stderr(Stdio::null());
    if let Some(tls) = tls {
        command.arg("--tls-certificates").arg(&tls.server);
    }
    let engine = if tls.is_some() { "locus+tls" } else { "locus" };
    let mut running = Running::start(engine, &mut command, port, true, Some(scratch))?;
    running.tls_home = tls.map(|t| t.home.clone());
    Ok(running)
}

fn start_nbdkit(tls: Option<&Credentials>) -> Result<Running> {
    let port = free_port()?;
    let mut command = Command::new("nbdkit");
    command
        .args([
            "--foreground",
            "--exit-with-parent",
            "-p",
            &port.to_string(),
        ])
        .args(["--ipaddr", "127.0.0.1"])
        .stderr(Stdio::null());
    if let Some(tls) = tls {
        command
            .arg("--tls=require")
            .arg(format!("--tls-certificates={}", tls.server.display()));
    }
    command.args(["memory", &EXPORT_BYTES.to_string()]);
    let engine = if tls.is_some() {
        "nbdkit-memory+tls"
    } else {
        "nbdkit-memory"
    };
    let mut running = Running::start(engine, &mut command, port, false, None)?;
    running.tls_home = tls.map(|t| t.home.clone());
    Ok(running)
}

fn start_qemu_nbd() -> Result<Running> {
    let port = free_port()?;
    let scratch = super::cleanup::Scratch::shm_dir("locus-bench-qemu-nbd")?;
    let dir = scratch.path().to_owned();
    let image = dir.join("disk.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(EXPORT_BYTES))
        .with_context(|| format!("creating {}", image.display()))?;
    Running::start(
        "qemu-nbd",
        Command::new("qemu-nbd")
            .args([
                "--persistent",
                "--shared=8",
                "--format=raw",
                "--cache=writeback",
            ])
            .args(["--bind=127.0.0.1", &format!("--port={port}")])
            .arg(&image)
            .stderr(Stdio::null()),
        port,
        false,
        Some(scratch),
    )
}

fn fio(
    server: &Running,
    rw: &str,
    bs: u64,
    size: u64,
    iodepth: u32,
    seconds: Option<f64>,
    client_cpus: Option<&str>,
) -> Result<serde_json::Value> {
    let port = server.port;
    let mut command = Command::new("fio");
    let uri = match &server.tls_home {
        // The name the certificate carries.
        Some(home) => {
            command.env("HOME", home);
            format!("--uri=nbds://localhost:{port}/")
        }
        None => format!("--uri=nbd://127.0.0.1:{port}/"),
    };
    command.args([
        "--name=locus-bench-nbd",
        "--ioengine=nbd",
        &uri,
        &format!("--rw={rw}"),
        &format!("--bs={bs}"),
        &format!("--iodepth={iodepth}"),
        &format!("--size={size}"),
        "--numjobs=1",
        "--randrepeat=0",
        "--norandommap",
        "--output-format=json",
    ]);
    super::pin_fio(&mut command, client_cpus);
    if let Some(seconds) = seconds {
        command.args([
            "--time_based".to_owned(),
            format!("--runtime={}ms", (seconds * 1000.0) as u64),
        ]);
    }
    super::fio_report(&mut command)
}

pub fn run(sysfs: &Path, args: &NbdBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be in (0, 600]"
    );
    anyhow::ensure!((1..=20).contains(&args.rounds), "--rounds: 1 to 20");
    anyhow::ensure!(
        args.submit == "inline" || args.submit == "queued",
        "--submit: inline or queued"
    );
    anyhow::ensure!(
        (1..=EXPORT_BYTES).contains(&args.size),
        "--size: 1 byte to 1 GiB"
    );
    anyhow::ensure!(
        args.bs
            .iter()
            .all(|&b| (512..=32 << 20).contains(&b) && b % 512 == 0),
        "--bs: multiples of 512 bytes up to 32M"
    );
    if !installed("fio") {
        bail!("fio is not installed (Debian: apt-get install fio)");
    }
    let mut starters: Vec<(&str, Starter)> = Vec::new();
    let submit = args.submit.clone();
    let locus_sysfs = sysfs.to_owned();
    starters.push((
        "locus",
        Box::new(move || start_locus(&locus_sysfs, &submit, None)),
    ));
    let credentials = if args.tls {
        Some(std::rc::Rc::new(
            Credentials::make().context("making TLS credentials")?,
        ))
    } else {
        None
    };
    if let Some(credentials) = &credentials {
        let submit = args.submit.clone();
        let credentials = std::rc::Rc::clone(credentials);
        let sysfs = sysfs.to_owned();
        starters.push((
            "locus+tls",
            Box::new(move || start_locus(&sysfs, &submit, Some(&credentials))),
        ));
    }
    if installed("nbdkit") {
        starters.push(("nbdkit-memory", Box::new(|| start_nbdkit(None))));
        if let Some(credentials) = &credentials {
            let credentials = std::rc::Rc::clone(credentials);
            starters.push((
                "nbdkit-memory+tls",
                Box::new(move || start_nbdkit(Some(&credentials))),
            ));
        }
    } else {
        eprintln!("note: nbdkit is not installed; skipping nbdkit memory (Debian: nbdkit)");
    }
    if installed("qemu-nbd") {
        starters.push(("qemu-nbd", Box::new(start_qemu_nbd)));
    } else {
        eprintln!("note: qemu-nbd is not installed; skipping it (Debian: qemu-utils)");
    }
    let mut servers = Vec::new();
    for (name, start) in &starters {
        let server = start().with_context(|| format!("starting {name}"))?;
        // Fill the region once so that reads find data.
        fio(
            &server,
            "write",
            1 << 20,
            args.size,
            args.iodepth,
            None,
            None,
        )
        .with_context(|| format!("filling {name}'s export"))?;
        servers.push(server);
    }
    let mut cases = Vec::new();
    let total = args.bs.len() * 2 * args.rounds as usize * servers.len();
    let bar = crate::progress::steps(total as u64, "fio runs", !args.json);
    for &bs in &args.bs {
        for op in ["randread", "randwrite"] {
            let mut runs: Vec<Vec<Case>> = servers.iter().map(|_| Vec::new()).collect();
            for round in 1..=args.rounds {
                for (server, runs) in servers.iter().zip(&mut runs) {
                    bar.set_message(format!(
                        "{op} {} on {}, round {round}",
                        super::short_size(bs),
                        server.engine
                    ));
                    runs.push(run_case(server, op, bs, args)?);
                    settle(server);
                    bar.inc(1);
                }
            }
            cases.extend(runs.into_iter().map(median));
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

/// Waits (up to 10 s) until a locus server's file system has nothing left to do in the
/// background — logged writes checkpointed, windows that small writes scattered
/// defragmented (`fs::defrag`, after 100 ms without writes) — so that this work runs between
/// turns and never during another server's timed run. Other servers have none.
fn settle(server: &Running) {
    let Some(dir) = server._scratch.as_ref().map(super::cleanup::Scratch::path) else {
        return;
    };
    std::thread::sleep(Duration::from_millis(150));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let busy = match crate::commands::serve::control::ask(dir) {
            Some(Ok(status)) => status["fs"]["idle"].as_bool() != Some(true),
            _ => false,
        };
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One timed fio run of `op` at `bs` against `server`.
fn run_case(server: &Running, op: &'static str, bs: u64, args: &NbdBenchArgs) -> Result<Case> {
    let doc = fio(
        server,
        op,
        bs,
        args.size,
        args.iodepth,
        Some(args.seconds),
        args.client_cpus.as_deref(),
    )
    .with_context(|| format!("{op} {bs} on {}", server.engine))?;
    let side = &doc["jobs"][0][if op == "randread" { "read" } else { "write" }];
    let bytes_per_sec = side["bw_bytes"].as_f64().unwrap_or(0.0);
    Ok(Case {
        suite: "nbd",
        engine: server.engine,
        op,
        bs_bytes: bs,
        iodepth: args.iodepth,
        iops: side["iops"].as_f64().unwrap_or(0.0),
        bytes_per_sec,
        latency_mean_ns: side["clat_ns"]["mean"].as_f64().unwrap_or(0.0),
        client_cpus: args.client_cpus.clone(),
        durable: server.durable,
        rounds: 1,
        bytes_per_sec_min: bytes_per_sec,
        bytes_per_sec_max: bytes_per_sec,
    })
}

/// The median run (by throughput; the lower middle one for an even count), with the number
/// of runs and their range.
fn median(mut runs: Vec<Case>) -> Case {
    assert!(!runs.is_empty(), "a case has at least one run");
    runs.sort_by(|a, b| a.bytes_per_sec.total_cmp(&b.bytes_per_sec));
    let rounds = runs.len() as u32;
    let min = runs[0].bytes_per_sec;
    let max = runs[runs.len() - 1].bytes_per_sec;
    let mut middle = runs.swap_remove((runs.len() - 1) / 2);
    middle.rounds = rounds;
    middle.bytes_per_sec_min = min;
    middle.bytes_per_sec_max = max;
    middle
}

/// The system's default TCP congestion control, which fio's sockets use: with BBR the client
/// paces its sends (see `Acks` in the nbd server's `net.rs`), so results depend on it.
fn client_congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map_or_else(|_| "unknown".to_owned(), |name| name.trim().to_owned())
}

fn print_table(cases: &[Case], args: &NbdBenchArgs) -> Result<()> {
    outln!(
        "fio nbd engine, 1 job, queue depth {}, loopback TCP (client congestion control: {}), \
         {}, {} region; median of {} runs of {} s per case and server, servers taking turns; \
         locus submission {}",
        args.iodepth,
        client_congestion_control(),
        super::client_placement(args.client_cpus.as_deref()),
        format_bytes(args.size),
        args.rounds,
        args.seconds,
        args.submit
    );
    outln!(
        "{:<10} {:>6} {:<18} {:>10} {:>8} {:>13} {:>9} {:>9} {:>11}",
        "op",
        "bs",
        "engine",
        "IOPS",
        "GB/s",
        "GB/s range",
        "mean us",
        "durable",
        "locus vs"
    );
    for case in cases {
        // TLS engines are compared with locus over TLS; locus over TLS with plain locus
        // (what TLS costs it).
        let base = match case.engine {
            "locus+tls" => None,
            e if e.ends_with("+tls") => Some("locus+tls"),
            _ => Some("locus"),
        };
        let find = |engine: &str| {
            cases
                .iter()
                .find(|c| c.engine == engine && c.op == case.op && c.bs_bytes == case.bs_bytes)
        };
        let ratio = match (base, find("locus")) {
            (Some(base), _) if case.engine != base => match find(base) {
                Some(l) if case.bytes_per_sec > 0.0 => {
                    format!("{:.2}x", l.bytes_per_sec / case.bytes_per_sec)
                }
                _ => String::new(),
            },
            (None, Some(plain)) if plain.bytes_per_sec > 0.0 => {
                format!("TLS {:.2}x", case.bytes_per_sec / plain.bytes_per_sec)
            }
            _ => String::new(),
        };
        outln!(
            "{:<10} {:>6} {:<18} {:>10.0} {:>8.2} {:>13} {:>9.1} {:>9} {:>11}",
            case.op,
            super::short_size(case.bs_bytes),
            case.engine,
            case.iops,
            case.bytes_per_sec / 1e9,
            format!(
                "{:.2}-{:.2}",
                case.bytes_per_sec_min / 1e9,
                case.bytes_per_sec_max / 1e9
            ),
            case.latency_mean_ns / 1000.0,
            if case.durable { "yes" } else { "no" },
            ratio,
        );
    }
    Ok(())
}
