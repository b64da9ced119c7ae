//! `locus report`: a small version of each seed paper's headline experiment, run on this
//! machine and written as one self-contained HTML page (SVG plots inline) plus the JSON it
//! was drawn from.
//!
//! The measurements are the `locus bench` suites, run as child processes of this executable
//! with `--json`: each suite already measures locus and its baseline side by side and cleans
//! up its own scratch volumes and servers, and a suite that fails (a missing fio, a temp
//! directory on tmpfs that refuses O_DIRECT) costs its section, not the report. The cache
//! simulation runs in-process through the `sim` crate. Each section states the paper's
//! claim, what was measured here, and the ratio; `sections.rs` holds the experiments,
//! `html.rs` the page.

mod html;
mod sections;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::Value;

use crate::output::outln;

/// Run a small version of each seed paper's headline experiment on this machine and write
/// one HTML report (plots inline) and the JSON it was drawn from.
///
/// Five sections, one per design locus joins: MBS-LVM (fio random writes through the preload
/// library against tmpfs over block sizes and job counts, and where allocations came from),
/// Libpubl (preliminary-buffer count sweep, background against foreground-only checkpoint,
/// write amplification), Tyche (inline against queued NBD submission, against nbdkit and
/// qemu-nbd), NBM (the paper's Fig. 3 on a generated trace and on every --trace) and uDMA
/// (the pinned pool against per-request registration, unregistered buffers and a bounce
/// copy). Each states the paper's claim, the number measured here and the ratio.
///
/// Writes DIR/report.html and DIR/report.json. The measurements run on scratch volumes in
/// /dev/shm and a scratch file in the temp directory (or --disk-file); nothing of the
/// user's is touched. Needs fio (preload, nbd and uring sections), nbdkit and qemu-nbd for
/// the NBD baselines (skipped with a note if missing) and a TrueType font for the plots.
/// With --quick the whole report takes about two minutes on two cores; without, about ten. Exit
/// status 1 if any section could not be measured (the report is written all the same).
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Directory for report.html and report.json (created if missing; a report already
    /// there is replaced).
    #[arg(long, short, value_name = "DIR", default_value = "locus-report")]
    output: PathBuf,

    /// A small version of every experiment: shorter cases, fewer sizes and rounds.
    #[arg(long)]
    quick: bool,

    /// Seconds per measured case [default: 0.5 with --quick, 2 otherwise].
    #[arg(long)]
    seconds: Option<f64>,

    /// A block trace for the NBM section, in any format `locus sim` reads (repeatable). A
    /// generated zipf trace is always included.
    #[arg(long = "trace", value_name = "FILE")]
    traces: Vec<PathBuf>,

    /// The file the io_uring section does O_DIRECT I/O on (on a disk, not tmpfs; created and
    /// removed) [default: one in the temp directory].
    #[arg(long, value_name = "PATH")]
    disk_file: Option<PathBuf>,

    /// The preload library the MBS-LVM section runs fio through [default:
    /// liblocus_preload.so next to this executable, as `cargo build --release` leaves it].
    #[arg(long, value_name = "PATH")]
    preload_library: Option<PathBuf>,

    /// Only these sections, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<SectionId>,
}

/// The five sections, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SectionId {
    MbsLvm,
    Libpubl,
    Tyche,
    Nbm,
    Udma,
}

impl SectionId {
    const ALL: [SectionId; 5] = [
        SectionId::MbsLvm,
        SectionId::Libpubl,
        SectionId::Tyche,
        SectionId::Nbm,
        SectionId::Udma,
    ];
}

/// How big the experiments are: `--quick` or the full report.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    quick: bool,
    seconds: f64,
    /// File size of the file-system and preload cases.
    file_bytes: u64,
    /// Job and thread counts: powers of two up to the CPUs this process may use (1 and 2
    /// at least).
    threads: Vec<usize>,
    /// Runs per NBD case and server (the median is reported).
    nbd_rounds: u32,
    /// Requests and distinct blocks of the generated trace.
    zipf_requests: u64,
    zipf_blocks: u64,
}

impl Scale {
    fn new(quick: bool, seconds: Option<f64>) -> Result<Self> {
        let seconds = seconds.unwrap_or(if quick { 0.5 } else { 2.0 });
        if !(seconds > 0.0 && seconds <= 60.0) {
            bail!("--seconds must be in (0, 60]");
        }
        let cpus = topology::current_affinity().map_or(1, |c| c.len().max(1));
        let threads = std::iter::successors(Some(1usize), |t| Some(t * 2))
            .take_while(|&t| t <= cpus.max(2))
            .collect();
        Ok(Self {
            quick,
            seconds,
            file_bytes: if quick { 64 << 20 } else { 256 << 20 },
            threads,
            nbd_rounds: if quick { 1 } else { 3 },
            zipf_requests: if quick { 400_000 } else { 2_000_000 },
            zipf_blocks: if quick { 100_000 } else { 500_000 },
        })
    }
}

/// What the report says about the machine it ran on.
#[derive(Debug, Serialize)]
pub struct Machine {
    cpu_model: String,
    cpus: usize,
    numa_nodes: usize,
    memory_bytes: u64,
    pmem_devices: usize,
    kernel: String,
}

impl Machine {
    fn read(topology: &topology::Topology) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or_else(|| "unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned());
        Self {
            cpu_model,
            cpus: topology.cpu_count(),
            numa_nodes: topology.nodes.len(),
            memory_bytes: topology.nodes.iter().map(|n| n.memory_bytes).sum(),
            pmem_devices: topology.pmem.len(),
            kernel,
        }
    }
}

/// The whole report, as report.json holds it.
#[derive(Debug, Serialize)]
pub struct Report {
    locus_version: &'static str,
    generated_utc: String,
    elapsed_seconds: f64,
    scale: Scale,
    machine: Machine,
    sections: Vec<sections::Section>,
}

/// One measurement: a `locus bench` suite run (or a simulation), with every case it
/// reported.
#[derive(Debug, Serialize)]
pub struct Run {
    /// What it measures, as the progress bar and the page say it.
    label: String,
    /// The command that reproduces it.
    command: String,
    seconds: f64,
    cases: Vec<Value>,
    /// Why it produced nothing, if it failed.
    error: Option<String>,
}

impl Run {
    fn cases(&self) -> &[Value] {
        &self.cases
    }
}

/// Runs the measurements, one step of the progress bar each.
pub struct Runner {
    exe: PathBuf,
    sysfs: PathBuf,
    bar: ProgressBar,
}

impl Runner {
    /// Runs `locus bench ARGS --json` and collects its cases.
    fn bench(&self, label: &str, args: &[String]) -> Run {
        self.bar.set_message(label.to_owned());
        let started = Instant::now();
        let output = Command::new(&self.exe)
            .arg("--sysfs")
            .arg(&self.sysfs)
            .arg("bench")
            .args(args)
            .arg("--json")
            .stdin(Stdio::null())
            .output();
        let seconds = started.elapsed().as_secs_f64();
        self.bar.inc(1);
        let command = format!("locus bench {}", args.join(" "));
        let (cases, error) = match output {
            Err(e) => (
                Vec::new(),
                Some(format!("could not start {}: {e}", self.exe.display())),
            ),
            Ok(output) => {
                let cases: Vec<Value> = String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .filter(|l| l.starts_with('{'))
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                let error = if !output.status.success() {
                    Some(last_lines(&String::from_utf8_lossy(&output.stderr), 4))
                } else if cases.is_empty() {
                    Some("the suite reported no cases".to_owned())
                } else {
                    None
                };
                (cases, error)
            }
        };
        if let Some(error) = &error {
            self.bar
                .suspend(|| eprintln!("{label}: not measured: {error}"));
        }
        Run {
            label: label.to_owned(),
            command,
            seconds,
            cases,
            error,
        }
    }

    /// Runs in-process work as one step.
    fn step<T>(&self, label: &str, work: impl FnOnce() -> T) -> (T, f64) {
        self.bar.set_message(label.to_owned());
        let started = Instant::now();
        let result = work();
        self.bar.inc(1);
        (result, started.elapsed().as_secs_f64())
    }
}

/// The last `n` non-empty lines of a child's stderr, joined: its error message.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(n)..].join(" / ");
    if tail.is_empty() {
        "the suite failed without a message".to_owned()
    } else {
        tail
    }
}

pub fn run(sysfs: &Path, args: &ReportArgs) -> Result<()> {
    let scale = Scale::new(args.quick, args.seconds)?;
    for trace in &args.traces {
        std::fs::metadata(trace).with_context(|| format!("--trace {}", trace.display()))?;
    }
    crate::plot::check_font()?;
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let html_path = args.output.join("report.html");
    let json_path = args.output.join("report.json");
    // Refuse an unwritable place before minutes of measuring, leaving nothing behind.
    for path in [&html_path, &json_path] {
        crate::output::check_writable(path)
            .with_context(|| format!("{} cannot be written", path.display()))?;
    }
    let topology = topology::Topology::read_from(sysfs)?;
    let machine = Machine::read(&topology);
    let wanted: Vec<SectionId> = if args.only.is_empty() {
        SectionId::ALL.to_vec()
    } else {
        SectionId::ALL
            .into_iter()
            .filter(|s| args.only.contains(s))
            .collect()
    };
    let steps: u64 = wanted
        .iter()
        .map(|&s| sections::steps(s, args.traces.len()))
        .sum();
    let runner = Runner {
        exe: std::env::current_exe().context("locating the locus executable")?,
        sysfs: sysfs.to_owned(),
        bar: crate::progress::steps(steps, "steps", true),
    };
    eprintln!(
        "locus report ({}): {} step(s), writing {}",
        if scale.quick { "quick" } else { "full" },
        steps,
        html_path.display()
    );
    let started = Instant::now();
    let generated_utc = utc_now();
    let mut built = Vec::new();
    for id in wanted {
        built.push(sections::build(id, &runner, &scale, &machine, args));
    }
    // `sections::steps` says how many runs each section makes; keep it honest.
    debug_assert_eq!(
        runner.bar.position(),
        steps,
        "sections::steps is out of date"
    );
    runner.bar.finish_and_clear();
    let report = Report {
        locus_version: env!("CARGO_PKG_VERSION"),
        generated_utc,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        scale,
        machine,
        sections: built,
    };
    let page = html::render(&report)?;
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(&html_path, page).with_context(|| format!("writing {}", html_path.display()))?;

    for section in &report.sections {
        outln!("{}", section.title);
        for finding in &section.findings {
            outln!(
                "  {}: here {}{}",
                finding.what,
                finding.here,
                finding
                    .paper
                    .as_deref()
                    .map_or_else(String::new, |p| format!("; paper: {p}"))
            );
        }
        for run in section.runs.iter().filter(|r| r.error.is_some()) {
            outln!(
                "  not measured: {}: {}",
                run.label,
                run.error.as_deref().unwrap_or_default()
            );
        }
    }
    outln!(
        "report written to {} and {} in {:.0} s",
        html_path.display(),
        json_path.display(),
        report.elapsed_seconds
    );
    let failed = report
        .sections
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.error.is_some())
        .count();
    if failed > 0 {
        bail!("{failed} measurement(s) failed; their sections say why");
    }
    Ok(())
}

/// The current time in UTC as `2026-11-25 14:03 UTC`.
fn utc_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute()
    )
}
