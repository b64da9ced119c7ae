//! The five experiments: what each section runs, and how its cases become findings, plots
//! and tables. Every number on the page comes from a case a run reported; a case that is
//! missing (a server not installed, a suite that failed) leaves its cell empty, never a
//! made-up value.

use std::io::{BufReader, Cursor};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Value, json};
use sim::{GridResult, PolicyKind, ReadOptions, ZipfSpec};

use super::{Machine, ReportArgs, Run, Runner, Scale, SectionId};
use crate::commands::bench::short_size;
use crate::plot::{Bars, bars_svg, fig3_svg};

/// One section of the report.
#[derive(Debug, Serialize)]
pub struct Section {
    pub id: SectionId,
    pub title: &'static str,
    /// The paper, as cited.
    pub paper: &'static str,
    /// What the paper claims, in a sentence or two.
    pub claim: &'static str,
    /// Each headline comparison: the paper's number beside this machine's.
    pub findings: Vec<Finding>,
    /// What a reader needs to read the numbers right (machine limits, what is durable).
    pub notes: Vec<String>,
    pub runs: Vec<Run>,
    /// Drawn from `runs` (not in the JSON, which holds the cases themselves).
    #[serde(skip)]
    pub figures: Vec<Figure>,
    #[serde(skip)]
    pub tables: Vec<Table>,
}

/// A headline comparison.
#[derive(Debug, Serialize)]
pub struct Finding {
    pub what: String,
    /// What the paper reports for it.
    pub paper: Option<String>,
    /// What was measured here.
    pub here: String,
    /// The measured ratio (the measured value, for write amplification and shares).
    pub value: Option<f64>,
}

#[derive(Debug)]
pub struct Figure {
    pub caption: String,
    pub svg: String,
}

#[derive(Debug)]
pub struct Table {
    pub caption: String,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Progress-bar steps of a section (one per run).
pub fn steps(id: SectionId, traces: usize) -> u64 {
    match id {
        SectionId::MbsLvm => 2,
        SectionId::Libpubl => (SWEEP.len() + 2) as u64,
        SectionId::Tyche => 2,
        SectionId::Nbm => 1 + traces as u64,
        SectionId::Udma => 1,
    }
}

pub fn build(
    id: SectionId,
    runner: &Runner,
    scale: &Scale,
    machine: &Machine,
    args: &ReportArgs,
) -> Section {
    let mut section = match id {
        SectionId::MbsLvm => mbs_lvm(runner, scale, machine, args.preload_library.as_deref()),
        SectionId::Libpubl => libpubl(runner, scale),
        SectionId::Tyche => tyche(runner, scale, machine),
        SectionId::Nbm => nbm(runner, scale, &args.traces),
        SectionId::Udma => udma(runner, scale, args.disk_file.as_deref()),
    };
    for run in &section.runs {
        if let Some(error) = &run.error {
            section
                .notes
                .push(format!("Not measured — {}: {error}", run.label));
        }
    }
    section
}

impl Section {
    fn new(id: SectionId, title: &'static str, paper: &'static str, claim: &'static str) -> Self {
        Self {
            id,
            title,
            paper,
            claim,
            findings: Vec::new(),
            notes: Vec::new(),
            runs: Vec::new(),
            figures: Vec::new(),
            tables: Vec::new(),
        }
    }

    fn finding(&mut self, what: String, paper: Option<&str>, here: String, value: Option<f64>) {
        self.findings.push(Finding {
            what,
            paper: paper.map(str::to_owned),
            here,
            value,
        });
    }

    /// Adds a bar chart, or a note saying why it could not be drawn. Charts with no measured
    /// bar at all are left out (the runs' errors already say why).
    fn bars(&mut self, caption: String, bars: &Bars<'_>) {
        if bars
            .series
            .iter()
            .all(|(_, values)| values.iter().all(Option::is_none))
        {
            return;
        }
        match bars_svg(bars) {
            Ok(svg) => self.figures.push(Figure { caption, svg }),
            Err(e) => self
                .notes
                .push(format!("Plot `{}` not drawn: {e:#}", bars.title)),
        }
    }

    fn table(&mut self, caption: &str, head: &[&str], rows: Vec<Vec<String>>) {
        if !rows.is_empty() {
            self.tables.push(Table {
                caption: caption.to_owned(),
                head: head.iter().map(|h| (*h).to_owned()).collect(),
                rows,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading cases.

/// The case whose fields equal all of `want`.
fn find<'a>(cases: &'a [Value], want: &[(&str, Value)]) -> Option<&'a Value> {
    cases
        .iter()
        .find(|c| want.iter().all(|(k, v)| c.get(*k) == Some(v)))
}

/// The case of `run` for one engine, operation and block size (the suites' common keys).
fn case<'a>(run: &'a Run, engine: &str, op: &str, bs: u64) -> Option<&'a Value> {
    find(
        run.cases(),
        &[
            ("engine", json!(engine)),
            ("op", json!(op)),
            ("bs_bytes", json!(bs)),
        ],
    )
}

/// A case's throughput in bytes per second.
fn rate(case: Option<&Value>) -> Option<f64> {
    field(case, "bytes_per_sec")
}

fn field(case: Option<&Value>, name: &str) -> Option<f64> {
    case?.get(name)?.as_f64()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn geomean(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|&v| v <= 0.0) {
        return None;
    }
    Some((values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp())
}

fn times(r: f64) -> String {
    format!("{r:.2}x")
}

fn times_or_dash(r: Option<f64>) -> String {
    r.map_or_else(|| "—".to_owned(), times)
}

fn gbps(case: Option<&Value>) -> String {
    rate(case).map_or_else(|| "—".to_owned(), |b| format!("{:.2}", b / 1e9))
}

fn iops(case: Option<&Value>) -> String {
    match field(case, "iops") {
        None => "—".to_owned(),
        Some(v) if v >= 1e6 => format!("{:.2} M", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.0} k", v / 1e3),
        Some(v) => format!("{v:.0}"),
    }
}

/// A ratio with the two measurements it divides: `1.37x (3.79 vs 2.77 GB/s)`.
fn versus(ratio: f64, a: &str, b: &str, unit: &str) -> String {
    format!("{} ({a} vs {b} {unit})", times(ratio))
}

/// The smallest and largest of `values`, as `a–b`.
fn range(values: &[f64]) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{}–{}", times(lo), times(hi))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A size in words: `4 KiB`, `2 MiB`.
fn human(bytes: u64) -> String {
    crate::size::format_bytes(bytes).replace(".00 ", " ")
}

fn size_arg(bytes: u64) -> String {
    format!("{}M", bytes >> 20)
}

fn list(values: &[u64]) -> String {
    values
        .iter()
        .map(|&b| short_size(b))
        .collect::<Vec<_>>()
        .join(",")
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------
// MBS-LVM.

fn mbs_lvm(
    runner: &Runner,
    scale: &Scale,
    machine: &Machine,
    preload_library: Option<&Path>,
) -> Section {
    const BS: [u64; 4] = [KIB, 4 * KIB, 64 * KIB, 2 * MIB];
    let mut section = Section::new(
        SectionId::MbsLvm,
        "MBS-LVM: writes allocated from the nearest device",
        "Yongseob Lee and Sungyong Park, “MBS-LVM: A High-Performance Logical Volume \
         Manager for Memory Bus-Connected Storages over NUMA Servers”",
        "A volume manager that pools every NUMA node's memory-bus storage into one address \
         space and allocates each write from the device nearest the writing thread; on a \
         four-node server, fio random writes on tmpfs ported onto it ran up to 20 times faster \
         than on the original tmpfs, and scaled with the nodes.",
    );
    let jobs = scale
        .threads
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let seconds = scale.seconds.to_string();
    let mut args = strings(&[
        "preload",
        "--seconds",
        &seconds,
        "--size",
        &size_arg(scale.file_bytes),
        "--bs",
        &list(&BS),
        "--numjobs",
        &jobs,
    ]);
    if let Some(library) = preload_library {
        args.push("--library".to_owned());
        args.push(library.display().to_string());
    }
    let preload = runner.bench("MBS-LVM: fio random writes on locus and on tmpfs", &args);
    let volume = runner.bench(
        "MBS-LVM: where allocations come from",
        &strings(&["volume", "--seconds", &seconds]),
    );

    let cell = |engine: &str, bs: u64, jobs: usize| {
        find(
            preload.cases(),
            &[
                ("engine", json!(engine)),
                ("bs_bytes", json!(bs)),
                ("numjobs", json!(jobs)),
            ],
        )
    };
    let mut series = Vec::new();
    let mut rows = Vec::new();
    let mut best: Option<(f64, u64, usize)> = None;
    for &jobs in &scale.threads {
        let mut values = Vec::new();
        for bs in BS {
            let (locus, tmpfs) = (cell("locus", bs, jobs), cell("tmpfs", bs, jobs));
            let q = ratio(rate(locus), rate(tmpfs));
            values.push(q);
            if let Some(q) = q {
                if best.is_none_or(|(b, _, _)| q > b) {
                    best = Some((q, bs, jobs));
                }
                if bs == 4 * KIB {
                    section.finding(
                        format!("4 KiB random writes, {jobs} job(s): locus / tmpfs"),
                        Some("up to 20x (fio random writes, 4 NUMA nodes)"),
                        versus(q, &iops(locus), &iops(tmpfs), "IOPS"),
                        Some(q),
                    );
                }
            }
            if locus.is_some() || tmpfs.is_some() {
                rows.push(vec![
                    short_size(bs),
                    jobs.to_string(),
                    iops(locus),
                    gbps(locus),
                    iops(tmpfs),
                    gbps(tmpfs),
                    times_or_dash(q),
                ]);
            }
        }
        series.push((format!("{jobs} job(s)"), values));
    }
    if let Some((q, bs, jobs)) = best {
        section.finding(
            "best cell: locus / tmpfs".to_owned(),
            Some("up to 20x"),
            format!("{} ({} writes, {jobs} job(s))", times(q), human(bs)),
            Some(q),
        );
    }
    let allocations = volume
        .cases()
        .iter()
        .filter(|c| c.get("op") == Some(&json!("alloc")))
        .max_by_key(|c| c.get("threads").and_then(Value::as_u64));
    if let Some(share) = field(allocations, "local_share") {
        section.finding(
            "allocations served from the allocating thread's own node".to_owned(),
            Some("as many as the local device can hold"),
            format!(
                "{:.1}% ({} thread(s), {} node(s))",
                share * 100.0,
                field(allocations, "threads").unwrap_or(0.0),
                machine.numa_nodes
            ),
            Some(share),
        );
    }
    if machine.numa_nodes == 1 {
        section.notes.push(
            "This machine has one NUMA node: every allocation is local, so the remote-access \
             penalty the paper removes cannot appear, and the ratios compare locus's write path \
             with tmpfs's. The NUMA testbed (`cargo xtask vm-test`, step `placement`) checks on \
             two- and four-node guests that each node's writers are served from their own \
             node's device first, and that the pages really are on that node."
                .to_owned(),
        );
    }
    section.notes.push(
        "locus runs fio unmodified through its preload library, one file per job; every locus \
         write is atomic and durable when pwrite returns, tmpfs writes are neither."
            .to_owned(),
    );
    let categories: Vec<String> = BS.iter().map(|&b| short_size(b)).collect();
    section.bars(
        "Throughput of locus over tmpfs, per block size and job count (1 = as fast as tmpfs)."
            .to_owned(),
        &Bars {
            title: "fio psync random writes: locus / tmpfs",
            y_desc: "locus / tmpfs throughput",
            categories: &categories,
            series: &series,
            reference: Some(1.0),
        },
    );
    section.table(
        "fio psync random writes, one file per job (GB/s in 10^9 bytes per second)",
        &[
            "block",
            "jobs",
            "locus IOPS",
            "locus GB/s",
            "tmpfs IOPS",
            "tmpfs GB/s",
            "locus / tmpfs",
        ],
        rows,
    );
    section.runs = vec![preload, volume];
    section
}

// ---------------------------------------------------------------------------------------
// Libpubl.

/// Preliminary buffers per thread in the sweep (the paper's 1..16).
const SWEEP: [usize; 5] = [1, 2, 4, 8, 16];

fn libpubl(runner: &Runner, scale: &Scale) -> Section {
    const SWEEP_BS: [u64; 2] = [4 * KIB, 64 * KIB];
    const BS: [u64; 4] = [KIB, 4 * KIB, 64 * KIB, 2 * MIB];
    let mut section = Section::new(
        SectionId::Libpubl,
        "Libpubl: persistent user buffers as logs",
        "Jaewon Jung, Jungsik Choi and Hwansoo Han, “Libpubl: Exploiting Persistent User \
         Buffers as Logs for Write Atomicity”, HotStorage '21",
        "A library file system whose writes log into persistent buffers the writer owns, so \
         logged data is not written twice; a background checkpoint moves logs into files while \
         writers go on (3,363 MB/s against 2,754 foreground-only), more preliminary buffers \
         keep writers from waiting for it (1,872 MB/s with one, 3,394 with sixteen), and \
         throughput is 2.08x that of the file systems compared.",
    );
    let seconds = scale.seconds.to_string();
    let size = size_arg(scale.file_bytes);
    // `locus bench fs`, one thread, the given sizes and operations, plus `extra` options.
    let fs_run = |label: &str, bs: &[u64], ops: &str, extra: [&str; 2]| {
        let mut args = strings(&[
            "fs",
            "--seconds",
            &seconds,
            "--size",
            &size,
            "--bs",
            &list(bs),
            "--ops",
            ops,
            "--threads",
            "1",
        ]);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        runner.bench(label, &args)
    };
    let sweep: Vec<(usize, Run)> = SWEEP
        .iter()
        .map(|&n| {
            let label = format!("Libpubl: {n} preliminary buffer(s) per thread");
            let buffers = n.to_string();
            let run = fs_run(
                &label,
                &SWEEP_BS,
                "seqwrite",
                ["--prelim-buffers", &buffers],
            );
            (n, run)
        })
        .collect();
    let modes: Vec<(&str, Run)> = [
        ("background", "background"),
        ("foreground-only", "on-demand"),
    ]
    .into_iter()
    .map(|(name, mode)| {
        let label = format!("Libpubl: {name} checkpoint");
        let run = fs_run(&label, &BS, "seqwrite,randwrite", ["--checkpoint", mode]);
        (name, run)
    })
    .collect();
    // The sweep.
    let mut series = Vec::new();
    let mut rows = Vec::new();
    for bs in SWEEP_BS {
        let mut values = Vec::new();
        for (n, run) in &sweep {
            let (locus, tmpfs) = (
                case(run, "locus", "seqwrite", bs),
                case(run, "tmpfs", "seqwrite", bs),
            );
            values.push(rate(locus).map(|b| b / 1e9));
            if locus.is_some() {
                rows.push(vec![
                    n.to_string(),
                    short_size(bs),
                    gbps(locus),
                    field(locus, "backpressure_waits")
                        .map_or_else(|| "—".to_owned(), |w| format!("{w:.0}")),
                    gbps(tmpfs),
                ]);
            }
        }
        let first = values.first().copied().flatten();
        let last = values.last().copied().flatten();
        if let Some(q) = ratio(last, first) {
            section.finding(
                format!(
                    "sequential {} writes: {} preliminary buffers / {}",
                    human(bs),
                    SWEEP[SWEEP.len() - 1],
                    SWEEP[0]
                ),
                Some("1.81x (3,394 vs 1,872 MB/s)"),
                versus(
                    q,
                    &format!("{:.2}", last.unwrap_or_default()),
                    &format!("{:.2}", first.unwrap_or_default()),
                    "GB/s",
                ),
                Some(q),
            );
        }
        series.push((format!("{} writes", short_size(bs)), values));
    }
    let categories: Vec<String> = SWEEP.iter().map(ToString::to_string).collect();
    section.bars(
        "Sequential-write throughput of one thread by the number of its preliminary buffers."
            .to_owned(),
        &Bars {
            title: "Sequential writes by preliminary buffers per thread",
            y_desc: "GB/s",
            categories: &categories,
            series: &series,
            reference: None,
        },
    );
    section.table(
        "Preliminary-buffer sweep: sequential writes, one thread (checkpoint waits: times the \
         writer waited for the checkpoint to free a buffer)",
        &[
            "buffers",
            "block",
            "locus GB/s",
            "checkpoint waits",
            "tmpfs GB/s",
        ],
        rows,
    );

    // Background against foreground-only checkpoint, and write amplification.
    let (background, foreground) = (&modes[0].1, &modes[1].1);
    let mut categories = Vec::new();
    let mut series = vec![
        ("background".to_owned(), Vec::new()),
        ("foreground-only".to_owned(), Vec::new()),
    ];
    let mut gains = Vec::new();
    let mut rows = Vec::new();
    for op in ["seqwrite", "randwrite"] {
        for bs in BS {
            let bg = case(background, "locus", op, bs);
            let fg = case(foreground, "locus", op, bs);
            let tmpfs = case(background, "tmpfs", op, bs);
            let (bg_rate, fg_rate) = (rate(bg), rate(fg));
            categories.push(format!("{} {}", &op[..op.len() - 5], short_size(bs)));
            series[0].1.push(bg_rate.map(|b| b / 1e9));
            series[1].1.push(fg_rate.map(|b| b / 1e9));
            let q = ratio(bg_rate, fg_rate);
            gains.extend(q);
            if op == "seqwrite" && bs == 4 * KIB {
                if let Some(q) = q {
                    section.finding(
                        "sequential 4 KiB writes: background / foreground-only checkpoint"
                            .to_owned(),
                        Some("1.22x (3,363 vs 2,754 MB/s)"),
                        versus(q, &gbps(bg), &gbps(fg), "GB/s"),
                        Some(q),
                    );
                }
                if let Some(t) = ratio(bg_rate, rate(tmpfs)) {
                    section.finding(
                        "sequential 4 KiB writes: locus / tmpfs".to_owned(),
                        Some("2.08x over the file systems compared (Ext4-DAX, NOVA, Libnvmmio)"),
                        versus(t, &gbps(bg), &gbps(tmpfs), "GB/s"),
                        Some(t),
                    );
                }
            }
            if bg.is_some() || fg.is_some() {
                let wa = |c: Option<&Value>| {
                    field(c, "write_amplification")
                        .map_or_else(|| "—".to_owned(), |w| format!("{w:.3}"))
                };
                rows.push(vec![
                    op.to_owned(),
                    short_size(bs),
                    gbps(bg),
                    gbps(fg),
                    times_or_dash(q),
                    wa(bg),
                    gbps(tmpfs),
                ]);
            }
        }
    }
    if let Some(g) = geomean(&gains) {
        section.finding(
            format!(
                "background / foreground-only, geometric mean of {} cases",
                gains.len()
            ),
            None,
            format!("{} (range {})", times(g), range(&gains)),
            Some(g),
        );
    }
    section.bars(
        "Single-thread write throughput with the background checkpoint and with writers \
         checkpointing only when they run out of space (foreground-only; each case's time \
         includes its final checkpoint)."
            .to_owned(),
        &Bars {
            title: "Background against foreground-only checkpoint",
            y_desc: "GB/s",
            categories: &categories,
            series: &series,
            reference: None,
        },
    );
    let mut wa_series = Vec::new();
    for op in ["randwrite", "seqwrite"] {
        let values: Vec<Option<f64>> = BS
            .iter()
            .map(|&bs| field(case(background, "locus", op, bs), "write_amplification"))
            .collect();
        wa_series.push((op.to_owned(), values));
    }
    for bs in [4 * KIB, 2 * MIB] {
        if let Some(wa) = field(
            case(background, "locus", "randwrite", bs),
            "write_amplification",
        ) {
            section.finding(
                format!("write amplification of random {} writes", human(bs)),
                Some("logged data is not written a second time (the user's buffer is the log)"),
                format!("{wa:.3} bytes stored per byte written"),
                Some(wa),
            );
            if bs == 4 * KIB && wa > 1.5 {
                section.notes.push(
                    "Aligned writes smaller than 64 KiB are copied from their log into the \
                     file's blocks when checkpointed (which keeps extent maps small), so their \
                     bytes are stored twice; 1 KiB writes are partial blocks and are always \
                     copied. Writes of 64 KiB and more are remapped, not copied."
                        .to_owned(),
                );
            }
        }
    }
    let wa_categories: Vec<String> = BS.iter().map(|&b| short_size(b)).collect();
    section.bars(
        "Bytes stored to persistent memory per byte written, from the file system's own \
         counters (1 = every byte stored once)."
            .to_owned(),
        &Bars {
            title: "Write amplification by write size",
            y_desc: "bytes stored / bytes written",
            categories: &wa_categories,
            series: &wa_series,
            reference: Some(1.0),
        },
    );
    section.table(
        "Checkpoint modes, one thread (write amplification of the background run)",
        &[
            "op",
            "block",
            "background GB/s",
            "foreground-only GB/s",
            "background / foreground",
            "write amplification",
            "tmpfs GB/s",
        ],
        rows,
    );
    section.notes.push(
        "The file system runs on a scratch volume of emulated persistent memory (files on \
         tmpfs bound to the node); tmpfs is the same memory without atomicity or durability."
            .to_owned(),
    );
    section.runs = sweep
        .into_iter()
        .map(|(_, r)| r)
        .chain(modes.into_iter().map(|(_, r)| r))
        .collect();
    section
}

// ---------------------------------------------------------------------------------------
// Tyche.

fn tyche(runner: &Runner, scale: &Scale, machine: &Machine) -> Section {
    let sizes: &[u64] = if scale.quick {
        &[4 * KIB, 64 * KIB]
    } else {
        &[4 * KIB, 64 * KIB, MIB]
    };
    let mut section = Section::new(
        SectionId::Tyche,
        "Tyche: NUMA-aware network storage with inline submission",
        "Pilar González-Férez and Angelos Bilas, “Mitigation of NUMA and synchronization \
         effects in high-speed network storage over raw Ethernet” (the Tyche protocol), The \
         Journal of Supercomputing 72(11)",
        "Mapping each channel and its resources to the NUMA node of its NIC almost removes NUMA \
         effects (which cost up to 2x); threads that submit requests inline are preferable to \
         queues that trade locks for context switches.",
    );
    let seconds = scale.seconds.to_string();
    let runs: Vec<Run> = ["inline", "queued"]
        .into_iter()
        .map(|mode| {
            runner.bench(
                &format!("Tyche: NBD serving, {mode} submission"),
                &strings(&[
                    "nbd",
                    "--seconds",
                    &seconds,
                    "--rounds",
                    &scale.nbd_rounds.to_string(),
                    "--size",
                    &size_arg(scale.file_bytes),
                    "--bs",
                    &list(sizes),
                    "--submit",
                    mode,
                ]),
            )
        })
        .collect();
    let (inline, queued) = (&runs[0], &runs[1]);
    let mut categories = Vec::new();
    let mut series = vec![
        ("locus inline".to_owned(), Vec::new()),
        ("locus queued".to_owned(), Vec::new()),
        ("qemu-nbd".to_owned(), Vec::new()),
    ];
    let (mut inline_gain, mut over_nbdkit) = (Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for op in ["randread", "randwrite"] {
        for &bs in sizes {
            let i = case(inline, "locus", op, bs);
            let q = case(queued, "locus", op, bs);
            let nbdkit_i = case(inline, "nbdkit-memory", op, bs);
            let nbdkit_q = case(queued, "nbdkit-memory", op, bs);
            let qemu = case(inline, "qemu-nbd", op, bs);
            categories.push(format!("{} {}", &op[4..], short_size(bs)));
            series[0].1.push(ratio(rate(i), rate(nbdkit_i)));
            series[1].1.push(ratio(rate(q), rate(nbdkit_q)));
            series[2].1.push(ratio(rate(qemu), rate(nbdkit_i)));
            let gain = ratio(rate(i), rate(q));
            inline_gain.extend(gain);
            over_nbdkit.extend(ratio(rate(i), rate(nbdkit_i)));
            if i.is_some() || q.is_some() {
                rows.push(vec![
                    op.to_owned(),
                    short_size(bs),
                    gbps(i),
                    gbps(q),
                    gbps(nbdkit_i),
                    gbps(qemu),
                    times_or_dash(gain),
                ]);
            }
        }
    }
    if let Some(g) = geomean(&inline_gain) {
        section.finding(
            format!(
                "inline / queued submission, geometric mean of {} cases",
                inline_gain.len()
            ),
            Some("inline preferable to queued"),
            format!("{} (range {})", times(g), range(&inline_gain)),
            Some(g),
        );
    }
    if let Some(g) = geomean(&over_nbdkit) {
        section.finding(
            format!(
                "locus (inline) / nbdkit memory, geometric mean of {} cases",
                over_nbdkit.len()
            ),
            None,
            format!("{} (range {})", times(g), range(&over_nbdkit)),
            Some(g),
        );
    }
    section.finding(
        "NUMA nodes the channels were placed on".to_owned(),
        Some("one channel per NIC, on the NIC's node"),
        format!("{} node(s)", machine.numa_nodes),
        Some(machine.numa_nodes as f64),
    );
    if machine.numa_nodes == 1 {
        section.notes.push(
            "One NUMA node here: every channel and the NIC are on it, so placement changes \
             nothing on this machine. The testbed's `serve_numa` step (`cargo xtask vm-test`) \
             checks on multi-node guests that each channel's requests run on its node's CPUs, \
             its write payloads land in its node's memory and TCP connections go to the NIC \
             node's channel."
                .to_owned(),
        );
    }
    section.notes.push(
        "fio's nbd engine, one job at queue depth 16, over loopback TCP; the median of the \
         rounds. locus replies once a write is durable; nbdkit's memory plugin keeps data in \
         DRAM and qemu-nbd in the page cache, neither durable."
            .to_owned(),
    );
    section.bars(
        "Throughput relative to nbdkit's memory plugin measured in the same run (1 = as fast \
         as nbdkit)."
            .to_owned(),
        &Bars {
            title: "NBD random I/O: throughput / nbdkit memory",
            y_desc: "throughput / nbdkit memory",
            categories: &categories,
            series: &series,
            reference: Some(1.0),
        },
    );
    section.table(
        "NBD random I/O, GB/s",
        &[
            "op",
            "block",
            "locus inline",
            "locus queued",
            "nbdkit memory",
            "qemu-nbd",
            "inline / queued",
        ],
        rows,
    );
    section.runs = runs;
    section
}

// ---------------------------------------------------------------------------------------
// NBM.

/// The cache sizes of a trace's grid, as fractions of its footprint (distinct blocks), each
/// rounded down to a power of two: DRAM about 1/64, 1/16 and 1/4, NVRAM about 1/256 to 1/4.
/// The grid scales with the trace, so every trace sees the same range of cache pressure,
/// from a cache that holds a sliver of its blocks to one that holds a quarter.
fn grid_sizes(trace: &sim::Trace) -> (Vec<u64>, Vec<u64>) {
    let block = trace.block_bytes.max(1);
    let footprint = u64::from(trace.distinct_blocks) * block;
    let size = |divisor: u64| {
        let bytes = (footprint / divisor).max(block);
        1u64 << (63 - bytes.leading_zeros())
    };
    let pick = |divisors: &[u64]| {
        let mut sizes: Vec<u64> = divisors.iter().map(|&d| size(d).max(block)).collect();
        sizes.dedup();
        sizes
    };
    (pick(&[64, 16, 4]), pick(&[256, 128, 64, 32, 16, 8, 4]))
}

/// Where a trace of the NBM section comes from.
enum Source<'a> {
    /// Generated in memory.
    Zipf(ZipfSpec),
    /// A file the user gave (`--trace`), in any format `locus sim` reads.
    File(&'a Path),
}

impl Source<'_> {
    fn name(&self) -> String {
        match self {
            Source::Zipf(spec) => format!(
                "generated zipf trace (α {}, {}% writes)",
                spec.alpha,
                spec.write_fraction * 100.0
            ),
            Source::File(path) => path
                .file_name()
                .unwrap_or(path.as_os_str())
                .to_string_lossy()
                .into_owned(),
        }
    }

    /// The `locus sim` command that replays it (the grid's sizes are added once known).
    fn command(&self) -> String {
        match self {
            Source::Zipf(spec) => format!(
                "locus sim --gen zipf --requests {} --blocks {} --alpha {} --write-fraction {} \
                 --seed {} --output zipf.csv && locus sim --trace zipf.csv",
                spec.requests, spec.blocks, spec.alpha, spec.write_fraction, spec.seed
            ),
            Source::File(path) => format!("locus sim --trace {}", path.display()),
        }
    }

    fn load(&self) -> Result<sim::Trace> {
        match self {
            Source::Zipf(spec) => {
                let mut bytes = Vec::new();
                sim::write_zipf(spec, &mut bytes)?;
                Ok(sim::read_trace(
                    Cursor::new(bytes),
                    "zipf",
                    &ReadOptions::default(),
                )?)
            }
            Source::File(path) => {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                Ok(sim::read_trace(
                    BufReader::with_capacity(1 << 20, file),
                    &path.display().to_string(),
                    &ReadOptions::default(),
                )?)
            }
        }
    }
}

/// A trace's grid, replayed in-process.
struct Replay {
    name: String,
    summary: String,
    dram: Vec<u64>,
    nvram: Vec<u64>,
    results: Vec<GridResult>,
}

fn nbm(runner: &Runner, scale: &Scale, traces: &[PathBuf]) -> Section {
    let mut section = Section::new(
        SectionId::Nbm,
        "NBM: a hybrid DRAM/NVRAM cache",
        "Jisun Kim, Yunjoo Park, Sunhwa A. Nam, Hyunkyung Choi, KyungWoon Cho and Hyokyung \
         Bahn, “Improving cloud system performances by adopting NVRAM-based storage systems” \
         (NBM: NVRAM block management), 2016",
        "Dirty blocks in NVRAM, clean ones in DRAM: NBM keeps write recency apart from read \
         recency and moves recently read write-back victims to DRAM, so it needs fewer storage \
         accesses than NVLRU, most of all when NVRAM is under pressure (Fig. 3); the paper \
         presents the clairvoyant NV-MIN as the optimum.",
    );
    let spec = ZipfSpec {
        requests: scale.zipf_requests,
        blocks: scale.zipf_blocks,
        alpha: 0.9,
        write_fraction: 0.4,
        seed: 1,
    };
    let threads = topology::current_affinity().map_or(1, |c| c.len().max(1));
    let sources: Vec<Source<'_>> = std::iter::once(Source::Zipf(spec))
        .chain(traces.iter().map(|p| Source::File(p)))
        .collect();
    let mut replays = Vec::new();
    for source in sources {
        let name = source.name();
        let label = format!("NBM: Fig. 3 on {name}");
        let mut command = source.command();
        let (outcome, seconds) = runner.step(&label, || -> Result<Replay> {
            let trace = source.load()?;
            let (dram, nvram) = grid_sizes(&trace);
            command = format!("{command} --dram {} --nvram {}", list(&dram), list(&nvram));
            let summary = format!(
                "{name}: {} requests ({} reads, {} writes), {} distinct 4 KiB blocks",
                trace.requests, trace.read_requests, trace.write_requests, trace.distinct_blocks
            );
            let results =
                sim::run_grid(&trace, &PolicyKind::ALL, &dram, &nvram, threads, &|_, _| {})?;
            Ok(Replay {
                name: name.clone(),
                summary,
                dram,
                nvram,
                results,
            })
        });
        let (cases, error) = match &outcome {
            Ok(replay) => (
                replay
                    .results
                    .iter()
                    .map(|r| serde_json::to_value(crate::commands::sim::JsonPoint::from(r)))
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap_or_default(),
                None,
            ),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        };
        section.runs.push(Run {
            label,
            command,
            seconds,
            cases,
            error,
        });
        replays.extend(outcome.ok());
    }
    for replay in &replays {
        nbm_findings(&mut section, replay);
    }
    section.notes.push(
        "Storage accesses are read misses plus write-backs (dirty blocks left at the end are \
         not counted), normalised to NVLRU at the same sizes; below 1 is fewer accesses than \
         NVLRU. The policies are the ones the cache device runs (`locus cache replay` checks \
         the device's counts against the simulator's)."
            .to_owned(),
    );
    section
}

fn nbm_findings(section: &mut Section, replay: &Replay) {
    let point = |policy: PolicyKind, dram: u64, nvram: u64| {
        replay
            .results
            .iter()
            .find(|r| r.policy == policy && r.dram_bytes == dram && r.nvram_bytes == nvram)
    };
    let nbm: Vec<&GridResult> = replay
        .results
        .iter()
        .filter(|r| r.policy == PolicyKind::Nbm && r.normalized_to_nvlru.is_some())
        .collect();
    let values: Vec<f64> = nbm.iter().filter_map(|r| r.normalized_to_nvlru).collect();
    if let Some(best) = nbm.iter().min_by(|a, b| {
        a.normalized_to_nvlru
            .partial_cmp(&b.normalized_to_nvlru)
            .unwrap_or(std::cmp::Ordering::Equal)
    }) {
        let value = best.normalized_to_nvlru.unwrap_or(1.0);
        section.finding(
            format!(
                "{}: NBM / NVLRU storage accesses, best grid point",
                replay.name
            ),
            Some("below 1, lowest when NVRAM is small"),
            format!(
                "{value:.3} at DRAM {}, NVRAM {} (mean over the grid {:.3})",
                short_size(best.dram_bytes),
                short_size(best.nvram_bytes),
                values.iter().sum::<f64>() / values.len() as f64
            ),
            Some(value),
        );
    }
    let mut compared = 0;
    let mut nbm_better = 0;
    for r in &nbm {
        if let Some(min) = point(PolicyKind::NvMin, r.dram_bytes, r.nvram_bytes) {
            compared += 1;
            if r.storage_accesses() < min.storage_accesses() {
                nbm_better += 1;
            }
        }
    }
    if compared > 0 {
        section.finding(
            format!(
                "{}: grid points where NBM needs fewer accesses than NV-MIN",
                replay.name
            ),
            Some("none (NV-MIN presented as the optimum)"),
            format!("{nbm_better} of {compared}"),
            Some(f64::from(nbm_better)),
        );
    }
    match fig3_svg(&replay.results, &replay.name) {
        Ok(svg) => section.figures.push(Figure {
            caption: format!(
                "The paper's Fig. 3 on {}: storage accesses of each policy normalised to NVLRU, \
                 by NVRAM size, one line per DRAM size.",
                replay.summary
            ),
            svg,
        }),
        Err(e) => section
            .notes
            .push(format!("Fig. 3 for {} not drawn: {e:#}", replay.name)),
    }
    let mut head = vec!["NBM / NVLRU".to_owned()];
    head.extend(
        replay
            .nvram
            .iter()
            .map(|&n| format!("NVRAM {}", short_size(n))),
    );
    let rows = replay
        .dram
        .iter()
        .map(|&d| {
            let mut row = vec![format!("DRAM {}", short_size(d))];
            row.extend(replay.nvram.iter().map(|&n| {
                point(PolicyKind::Nbm, d, n)
                    .and_then(|r| r.normalized_to_nvlru)
                    .map_or_else(|| "—".to_owned(), |v| format!("{v:.3}"))
            }));
            row
        })
        .collect();
    section.tables.push(Table {
        caption: format!("NBM's storage accesses over NVLRU's on {}", replay.name),
        head,
        rows,
    });
}

// ---------------------------------------------------------------------------------------
// uDMA.

fn udma(runner: &Runner, scale: &Scale, disk_file: Option<&Path>) -> Section {
    const ENGINES: [(&str, &str); 6] = [
        ("pool", "uDMA pool"),
        ("per-request", "per-request registration"),
        ("unregistered", "unregistered"),
        ("bounce", "bounce copy"),
        ("fio-fixed", "fio fixedbufs"),
        ("fio-unfixed", "fio"),
    ];
    let sizes: &[u64] = if scale.quick {
        &[4 * KIB, 64 * KIB, MIB]
    } else {
        &[4 * KIB, 16 * KIB, 64 * KIB, 128 * KIB, MIB]
    };
    let mut section = Section::new(
        SectionId::Udma,
        "uDMA: a pinned buffer pool for user-space I/O",
        "uDMA, a user-level DMA mechanism for NVMe SSDs with a pinned memory pool in size \
         tiers (MDPI, 2023)",
        "Keeping DMA buffers pinned in a pool of size tiers, instead of allocating and pinning \
         memory for every request, makes NVMe I/O at least 17% faster than SPDK's per-request \
         allocation.",
    );
    let seconds = scale.seconds.to_string();
    let file_size = if scale.quick { "256M" } else { "1G" };
    let mut args = strings(&[
        "uring",
        "--seconds",
        &seconds,
        "--size",
        file_size,
        "--bs",
        &list(sizes),
    ]);
    if let Some(file) = disk_file {
        args.push("--file".to_owned());
        args.push(file.display().to_string());
    }
    let run = runner.bench("uDMA: io_uring O_DIRECT I/O by buffer strategy", &args);
    let case = |engine: &str, op: &str, bs: u64| case(&run, engine, op, bs);
    let mut categories = Vec::new();
    let mut series: Vec<(String, Vec<Option<f64>>)> = ENGINES
        .iter()
        .filter(|(e, _)| *e != "per-request")
        .map(|(_, name)| ((*name).to_owned(), Vec::new()))
        .collect();
    let mut rows = Vec::new();
    for op in ["randread", "randwrite"] {
        let (mut over_pinning, mut over_plain) = (Vec::new(), Vec::new());
        for &bs in sizes {
            let baseline = rate(case("per-request", op, bs));
            categories.push(format!("{} {}", &op[4..], short_size(bs)));
            for ((engine, _), (_, values)) in ENGINES
                .iter()
                .filter(|(e, _)| *e != "per-request")
                .zip(series.iter_mut())
            {
                values.push(ratio(rate(case(engine, op, bs)), baseline));
            }
            let pool = rate(case("pool", op, bs));
            over_pinning.extend(ratio(pool, baseline));
            over_plain.extend(ratio(pool, rate(case("unregistered", op, bs))));
            if case("pool", op, bs).is_some() {
                let mut row = vec![op.to_owned(), short_size(bs)];
                row.extend(ENGINES.iter().map(|(e, _)| gbps(case(e, op, bs))));
                row.push(times_or_dash(ratio(pool, baseline)));
                rows.push(row);
            }
        }
        if let Some(g) = geomean(&over_pinning) {
            section.finding(
                format!("{op}: pool / per-request registration, geometric mean over sizes"),
                Some("at least 1.17x"),
                format!("{} (range {})", times(g), range(&over_pinning)),
                Some(g),
            );
        }
        if let Some(g) = geomean(&over_plain) {
            section.finding(
                format!("{op}: pool / unregistered buffers, geometric mean over sizes"),
                None,
                format!("{} (range {})", times(g), range(&over_plain)),
                Some(g),
            );
        }
    }
    if run
        .cases()
        .iter()
        .any(|c| c.get("buffers") == Some(&json!("4K pages")))
    {
        section.notes.push(
            "fio's buffers were on 4 KiB pages (the system had too few free huge pages for \
             `--iomem=shmhuge`), so its cases are not like for like with locus's huge-page \
             buffers; `echo 256 > /proc/sys/vm/nr_hugepages` makes them so."
                .to_owned(),
        );
    }
    section.notes.push(
        "Random O_DIRECT I/O at queue depth 32 through io_uring on a file on this machine's \
         disk. Per-request registration takes fresh memory and registers it before every \
         request and unregisters it after (what per-request DMA allocation amounts to: the \
         cost the paper's pool removes); unregistered buffers are pool memory used without \
         registration; a bounce copy copies the caller's data through registered buffers."
            .to_owned(),
    );
    section.bars(
        "Throughput of each buffer strategy relative to per-request registration (1), per \
         operation and request size."
            .to_owned(),
        &Bars {
            title: "io_uring O_DIRECT I/O: throughput / per-request registration",
            y_desc: "throughput / per-request",
            categories: &categories,
            series: &series,
            reference: Some(1.0),
        },
    );
    let mut head = vec!["op", "block"];
    head.extend(ENGINES.iter().map(|(_, name)| *name));
    head.push("pool / per-request");
    section.table("io_uring O_DIRECT random I/O, GB/s", &head, rows);
    section.runs = vec![run];
    section
}
