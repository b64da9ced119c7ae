//! `locus bench fs`: the library file system against `pwrite`/`pread` on a tmpfs file (the
//! MBS-LVM paper's baseline), same workload, same run.
//!
//! Both engines get a file of `--size` bytes, written in full first. Each case runs for
//! `--seconds` with 1 or 2 threads on the one file: random cases pick block-aligned offsets
//! over the whole file (or, with `--random-over thread`, each thread within its own stretch:
//! writers of disjoint ranges), sequential ones give each thread its own stretch. Write cases on
//! locus include waiting, at the end, for the checkpoint to move everything into the file, so
//! the numbers are sustained ones; write amplification is bytes stored to persistent memory
//! over bytes written by the caller, from the file system's own counters. CPU per operation:
//! the calling threads' (`CLOCK_THREAD_CPUTIME_ID`, both engines) and, for locus writes,
//! the checkpoint thread's on top (`FsStats::checkpoint_cpu_ns`) — what a write costs in
//! all, which on a machine with few cores decides how writers scale.

use std::fs::File as StdFile;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::output::outln;
use crate::size::parse_size;

/// The file system (locus) against pwrite/pread on tmpfs: random and sequential writes and
/// reads, several block sizes, 1 and 2 threads on one file. Besides IOPS, GB/s and their
/// ratio: locus's write amplification, its writers' waits for the checkpoint, and CPU time
/// per operation (`locus us/op`: the calling threads' + the checkpoint thread's; `tmpfs`:
/// the calling threads', kernel time included). After each locus case the bench waits until
/// the file system is idle (checkpoint and idle-time defragmentation done), so that this
/// work never runs during a tmpfs case and its writes count in the case's amplification.
/// Every page of the scratch volume is mapped before the first case, as in a volume in use.
/// With 1 and 2 threads, each case's two-thread/one-thread ratio follows the table; for writes
/// on two CPUs, with the most two writers could make of one there given the checkpoint's CPU
/// time per write (two writers and the checkpoint share the CPUs, where one writer had a CPU
/// to itself).
#[derive(Debug, Args)]
pub struct FsBenchArgs {
    /// Print one JSON object per case and engine instead of a table.
    #[arg(long)]
    json: bool,

    /// Also draw the locus/tmpfs ratio of every case (.svg or .png).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// File size (both engines).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,

    /// Block sizes, comma-separated.
    #[arg(long, default_value = "1K,4K,64K,2M", value_delimiter = ',', value_parser = parse_size)]
    bs: Vec<u64>,

    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,

    /// Operations to run, comma-separated: randwrite, seqwrite, randread, seqread.
    #[arg(long, default_value = "randwrite,seqwrite,randread,seqread", value_delimiter = ',', value_parser = parse_op)]
    ops: Vec<Op>,

    /// Where random cases pick their offsets: `file` (every thread over the whole file) or
    /// `thread` (each thread over its own stretch of the file, as sequential cases do: writers
    /// of disjoint ranges of one file).
    #[arg(long, default_value = "file", value_parser = parse_random_over)]
    random_over: RandomOver,

    /// Seconds per case.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,

    /// Runs of each case per engine, alternating locus and tmpfs; each engine's median run
    /// (by IOPS) is reported, with the range of the rounds' locus/tmpfs ratios (a shared
    /// machine's drift then hits both engines alike, and shows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,

    /// Preliminary buffers per thread (1..=16).
    #[arg(long, default_value_t = 16)]
    prelim_buffers: usize,

    /// Bytes of each preliminary buffer.
    #[arg(long, default_value = "2M", value_parser = parse_size)]
    prelim_buffer_size: u64,

    /// When the file system checkpoints: `background` (continuously, the normal mode) or
    /// `on-demand` (only when a writer runs out of log or buffer space, and at the end of each
    /// case, whose time includes it): the second measures logging alone.
    #[arg(long, default_value = "background", value_parser = parse_checkpoint)]
    checkpoint: fs::CheckpointMode,

    /// Format the locus file system with data checksums (a crc32c per 4 KiB block, stored
    /// as blocks are written and verified on every read): run with and without to see what
    /// they cost.
    #[arg(long)]
    data_checksums: bool,

    /// Directory on tmpfs for the scratch volume and the baseline file.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
}

/// Where random cases pick their offsets (`--random-over`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RandomOver {
    File,
    Thread,
}

fn parse_random_over(name: &str) -> Result<RandomOver, String> {
    match name {
        "file" => Ok(RandomOver::File),
        "thread" => Ok(RandomOver::Thread),
        _ => Err(format!(
            "unknown choice {name:?}: expected file (the whole file) or thread (each thread's own stretch)"
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    RandWrite,
    SeqWrite,
    RandRead,
    SeqRead,
}

impl Op {
    const ALL: [Op; 4] = [Op::RandWrite, Op::SeqWrite, Op::RandRead, Op::SeqRead];

    fn name(self) -> &'static str {
        match self {
            Op::RandWrite => "randwrite",
            Op::SeqWrite => "seqwrite",
            Op::RandRead => "randread",
            Op::SeqRead => "seqread",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Op::RandWrite | Op::SeqWrite)
    }

    fn random(self) -> bool {
        matches!(self, Op::RandWrite | Op::RandRead)
    }
}

/// A case's waits for the checkpoint, by reason ([`fs::FsStats::waits_for_log`] and the rest).
#[derive(Debug, Clone, Serialize)]
struct WaitReasons {
    log: u64,
    buffers: u64,
    space: u64,
    journal: u64,
}

impl WaitReasons {
    fn between(before: &fs::FsStats, after: &fs::FsStats) -> Self {
        Self {
            log: after.waits_for_log - before.waits_for_log,
            buffers: after.waits_for_buffers - before.waits_for_buffers,
            space: after.waits_for_space - before.waits_for_space,
            journal: after.waits_for_journal - before.waits_for_journal,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Case {
    suite: &'static str,
    engine: &'static str,
    op: &'static str,
    bs_bytes: u64,
    threads: usize,
    /// Where a random case's offsets fell: `file` (the whole file) or `thread` (each
    /// thread's own stretch: `--random-over thread` with at least a block per thread).
    #[serde(skip_serializing_if = "Option::is_none")]
    random_over: Option<&'static str>,
    ops: u64,
    seconds: f64,
    iops: f64,
    bytes_per_sec: f64,
    /// Bytes stored per byte written (writes; tmpfs stores each byte once: 1).
    write_amplification: Option<f64>,
    /// Writers' waits for the checkpoint (locus writes).
    backpressure_waits: Option<u64>,
    /// The same, by what the writer lacked (locus writes with waits).
    #[serde(skip_serializing_if = "Option::is_none")]
    waits_by_reason: Option<WaitReasons>,
    /// CPU time of the bench's threads (the calls themselves) per operation, µs.
    cpu_us_per_op: f64,
    /// CPU time of locus's checkpoint thread per operation, µs (locus writes): what
    /// moving a write into its file costs, on top of `cpu_us_per_op`.
    checkpoint_us_per_op: Option<f64>,
    /// Runs of the case on this engine; the figures above are the median run's.
    rounds: u32,
    /// Lowest and highest IOPS of the rounds (with `--rounds` above 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    iops_range: Option<[f64; 2]>,
    /// Lowest and highest locus/tmpfs ratio of the rounds, each round's locus run against
    /// the tmpfs run beside it (locus cases, with `--rounds` above 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_range: Option<[f64; 2]>,
}

enum Engine<'a> {
    Locus(&'a fs::File),
    Tmpfs(&'a StdFile),
}

impl Engine<'_> {
    fn write(&self, data: &[u8], offset: u64) -> Result<()> {
        match self {
            Engine::Locus(f) => f.write_at(data, offset)?,
            Engine::Tmpfs(f) => f.write_all_at(data, offset)?,
        }
        Ok(())
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let n = match self {
            Engine::Locus(f) => f.read_at(buf, offset)?,
            Engine::Tmpfs(f) => f.read_at(buf, offset)?,
        };
        if n != buf.len() {
            bail!("short read: {n} of {} bytes at {offset}", buf.len());
        }
        Ok(())
    }
}

pub fn run(sysfs: &Path, args: &FsBenchArgs) -> Result<()> {
    if args.bs.iter().any(|&bs| bs == 0 || bs > args.size / 4) {
        bail!("every --bs must be between 1 byte and a quarter of --size");
    }
    if args.threads.iter().any(|&t| t == 0 || t > 64) {
        bail!("--threads must be 1..=64");
    }
    if let Some(plot) = &args.plot {
        crate::plot::check_target(plot)?;
    }
    let topology = topology::Topology::read_from(sysfs)?;
    let scratch = super::cleanup::Scratch::new(
        args.dir
            .join(format!("locus-bench-fs-{}", std::process::id())),
    );
    let volume_dir = scratch.path().join("volume");
    // Every thread that writes holds a slot with its preliminary buffers: the case's writers
    // (a slot is handed on when its thread ends), the thread that fills the file, and the
    // checkpoint's.
    let writers = args.threads.iter().copied().max().unwrap_or(1) as u64 + 2;
    let in_flight = writers * args.prelim_buffers as u64 * args.prelim_buffer_size;
    let volume_bytes = (2 * args.size + in_flight + (256 << 20)).next_multiple_of(2 << 20);
    let config = volume::default_config(&volume_dir, &topology, Some(volume_bytes))?;
    volume::Volume::format(&volume_dir, &config, true).with_context(|| {
        format!(
            "formatting a {volume_bytes}-byte scratch volume in {}",
            volume_dir.display()
        )
    })?;
    // Every page of the scratch volume mapped now, as in a volume in use (and as `locus
    // serve` and `locus mount` map theirs): otherwise the first touch of each page of a
    // preliminary buffer costs the writer a page fault in the timed cases.
    let volume = Arc::new(volume::Volume::open(
        &volume_dir,
        topology,
        &volume::OpenOptions {
            prefault: true,
            ..volume::OpenOptions::default()
        },
    )?);
    let fs = fs::Fs::format(
        volume,
        &fs::FormatOptions {
            data_checksums: args.data_checksums,
            ..fs::FormatOptions::default()
        },
        fs::FsOptions {
            prelim_buffers: args.prelim_buffers,
            prelim_buffer_bytes: args.prelim_buffer_size,
            checkpoint: args.checkpoint,
            ..fs::FsOptions::default()
        },
    )?;
    let locus = fs.create("/bench")?;
    let baseline_path = scratch.path().join("baseline.dat");
    let baseline = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&baseline_path)
        .with_context(|| format!("creating {}", baseline_path.display()))?;
    // Write both files in full first.
    let filling = crate::progress::spinner(
        format!(
            "writing the {} test files",
            crate::size::format_bytes(args.size)
        ),
        !args.json,
    );
    let chunk = pattern_bytes(2 << 20, 7);
    for offset in (0..args.size).step_by(chunk.len()) {
        let n = chunk.len().min((args.size - offset) as usize);
        locus.write_at(&chunk[..n], offset)?;
        baseline.write_all_at(&chunk[..n], offset)?;
    }
    fs.checkpoint()?;
    filling.finish_and_clear();

    let mut cases = Vec::new();
    let ops: Vec<Op> = Op::ALL
        .into_iter()
        .filter(|op| args.ops.contains(op))
        .collect();
    let rounds = args.rounds as usize;
    let total = ops.len() * args.bs.len() * args.threads.len() * 2 * rounds;
    let bar = crate::progress::steps(total as u64, "runs", !args.json);
    for op in ops {
        for &bs in &args.bs {
            for &threads in &args.threads {
                // Each engine's runs, in round order.
                let mut runs: [Vec<Case>; 2] = [Vec::new(), Vec::new()];
                for round in 0..rounds {
                    for (e, engine) in ["locus", "tmpfs"].into_iter().enumerate() {
                        bar.set_message(format!(
                            "{} {} x{threads} on {engine}{}",
                            op.name(),
                            bs_name(bs),
                            if rounds > 1 {
                                format!(", round {} of {rounds}", round + 1)
                            } else {
                                String::new()
                            }
                        ));
                        let handle = match engine {
                            "locus" => Engine::Locus(&locus),
                            _ => Engine::Tmpfs(&baseline),
                        };
                        let before = fs.stats();
                        let (ops, elapsed, cpu) = measure(&handle, &fs, op, bs, threads, args)?;
                        if engine == "locus" {
                            settle(&fs);
                        }
                        let after = fs.stats();
                        let locus_writes = engine == "locus" && op.writes();
                        let caller = after.caller_bytes - before.caller_bytes;
                        let media = after.media_bytes - before.media_bytes;
                        let secs = elapsed.as_secs_f64().max(1e-9);
                        runs[e].push(Case {
                            suite: "fs",
                            engine,
                            op: op.name(),
                            bs_bytes: bs,
                            threads,
                            random_over: op.random().then_some(match args.random_over {
                                RandomOver::Thread if args.size / bs >= threads as u64 => "thread",
                                _ => "file",
                            }),
                            ops,
                            seconds: secs,
                            iops: ops as f64 / secs,
                            bytes_per_sec: (ops * bs) as f64 / secs,
                            write_amplification: match (op.writes(), locus_writes) {
                                (false, _) => None,
                                (true, false) => Some(1.0),
                                (true, true) => Some(media as f64 / caller.max(1) as f64),
                            },
                            backpressure_waits: locus_writes
                                .then(|| after.backpressure_waits - before.backpressure_waits),
                            waits_by_reason: (locus_writes
                                && after.backpressure_waits > before.backpressure_waits)
                                .then(|| WaitReasons::between(&before, &after)),
                            cpu_us_per_op: cpu.as_secs_f64() * 1e6 / ops.max(1) as f64,
                            checkpoint_us_per_op: locus_writes.then(|| {
                                (after.checkpoint_cpu_ns - before.checkpoint_cpu_ns) as f64
                                    / 1e3
                                    / ops.max(1) as f64
                            }),
                            rounds: args.rounds,
                            iops_range: None,
                            ratio_range: None,
                        });
                        bar.inc(1);
                    }
                }
                let [locus_runs, tmpfs_runs] = runs;
                let ratios: Vec<f64> = locus_runs
                    .iter()
                    .zip(&tmpfs_runs)
                    .map(|(l, t)| l.iops / t.iops.max(1e-9))
                    .collect();
                let median = |runs| {
                    super::median_run(
                        runs,
                        |c: &Case| c.iops,
                        |c, range| {
                            c.iops_range = Some(range);
                        },
                    )
                };
                let mut l = median(locus_runs);
                if rounds > 1 {
                    l.ratio_range = Some(super::min_max(&ratios));
                }
                cases.push(l);
                cases.push(median(tmpfs_runs));
            }
        }
    }
    bar.finish_and_clear();
    drop(locus);
    fs.unmount()?;
    report(&cases, args)
}

fn parse_op(name: &str) -> Result<Op, String> {
    Op::ALL
        .into_iter()
        .find(|op| op.name() == name)
        .ok_or_else(|| {
            format!("unknown operation {name:?}: expected randwrite, seqwrite, randread or seqread")
        })
}

fn parse_checkpoint(name: &str) -> Result<fs::CheckpointMode, String> {
    match name {
        "background" => Ok(fs::CheckpointMode::Background),
        "on-demand" => Ok(fs::CheckpointMode::OnDemand),
        _ => Err(format!(
            "unknown checkpoint mode {name:?}: expected background or on-demand"
        )),
    }
}

fn pattern_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Runs one case; returns operations done, the time they took (for locus writes,
/// including the final wait for the checkpoint) and the CPU time the bench's threads used.
fn measure(
    engine: &Engine<'_>,
    fs: &fs::Fs,
    op: Op,
    bs: u64,
    threads: usize,
    args: &FsBenchArgs,
) -> Result<(u64, Duration, Duration)> {
    let barrier = Barrier::new(threads + 1);
    let deadline = Duration::from_secs_f64(args.seconds);
    let blocks = args.size / bs;
    let results: Vec<Result<(u64, Duration)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                // Named by engine, so that a profile of the bench tells the two apart.
                let name = match engine {
                    Engine::Locus(_) => format!("bench-locus-{t}"),
                    Engine::Tmpfs(_) => format!("bench-tmpfs-{t}"),
                };
                std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(scope, move || -> Result<(u64, Duration)> {
                        let allowed = topology::current_affinity().unwrap_or_default();
                        if let Some(&cpu) = allowed.get(t % allowed.len().max(1)) {
                            let _ = topology::pin_current_thread(&[cpu]);
                        }
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64 + 1);
                        let mut buf = pattern_bytes(bs as usize, t as u64 + 100);
                        let stretch = blocks / threads as u64;
                        let mut next = t as u64 * stretch;
                        let mut ops = 0u64;
                        barrier.wait();
                        let started = Instant::now();
                        let cpu_before = topology::thread_cpu_time()?;
                        loop {
                            for _ in 0..16 {
                                let block = if op.random() {
                                    match args.random_over {
                                        // More threads than blocks: no stretch of their own.
                                        RandomOver::Thread if stretch > 0 => {
                                            t as u64 * stretch + rng.random_range(0..stretch)
                                        }
                                        _ => rng.random_range(0..blocks),
                                    }
                                } else {
                                    let b = next;
                                    next += 1;
                                    if next >= (t as u64 + 1) * stretch {
                                        next = t as u64 * stretch;
                                    }
                                    b
                                };
                                if op.writes() {
                                    engine.write(&buf, block * bs)?;
                                } else {
                                    engine.read(&mut buf, block * bs)?;
                                }
                                ops += 1;
                            }
                            if started.elapsed() >= deadline {
                                return Ok((ops, topology::thread_cpu_time()? - cpu_before));
                            }
                        }
                    })
                    // As `std::thread::spawn` does: the threads already started would wait at
                    // the barrier forever.
                    .expect("spawn a bench thread")
            })
            .collect();
        barrier.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a bench thread panicked")))
            })
            .collect()
    });
    let started = Instant::now() - deadline;
    let (mut ops, mut cpu) = (0, Duration::ZERO);
    for r in results {
        let (n, used) = r?;
        ops += n;
        cpu += used;
    }
    if matches!(engine, Engine::Locus(_)) && op.writes() {
        fs.checkpoint()?;
    }
    Ok((ops, started.elapsed(), cpu))
}

/// Waits (up to 10 s) until the file system has nothing left to do in the background —
/// logged writes checkpointed, scattered windows defragmented once writes have paused for
/// 100 ms (`fs::defrag`) — so that this work never runs during the tmpfs case that follows,
/// and its media writes count in the write amplification of the case that caused them.
fn settle(fs: &fs::Fs) {
    std::thread::sleep(Duration::from_millis(150));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if fs.stats().idle {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn bs_name(bs: u64) -> String {
    if bs >= 1 << 20 && bs.is_multiple_of(1 << 20) {
        format!("{}M", bs >> 20)
    } else if bs >= 1 << 10 && bs.is_multiple_of(1 << 10) {
        format!("{}K", bs >> 10)
    } else {
        format!("{bs}")
    }
}

fn report(cases: &[Case], args: &FsBenchArgs) -> Result<()> {
    let pairs: Vec<(&Case, &Case)> = cases
        .chunks(2)
        .filter_map(|pair| match pair {
            [a, b] => Some((a, b)),
            _ => None,
        })
        .collect();
    if args.json {
        super::print_json(cases)?;
    } else {
        outln!(
            "file system: locus (write_at/read_at{}) vs pwrite/pread on tmpfs; file {}{}, {} s per case{}",
            if args.data_checksums {
                ", data checksums"
            } else {
                ""
            },
            crate::size::format_bytes(args.size),
            match args.random_over {
                RandomOver::File => "",
                RandomOver::Thread => " (random offsets in each thread's own stretch)",
            },
            args.seconds,
            super::rounds_title(args.rounds, "engine")
        );
        let range_header = super::range_header(args.rounds);
        outln!(
            "{:<10} {:>5} {:>3} {:>12} {:>9} {:>12} {:>9} {:>7} {:>6} {:>6} {:>13} {:>8}{range_header}",
            "op",
            "bs",
            "thr",
            "locus IOPS",
            "GB/s",
            "tmpfs IOPS",
            "GB/s",
            "ratio",
            "WA",
            "waits",
            "locus us/op",
            "tmpfs"
        );
        for (l, t) in &pairs {
            let range = super::range_cell(l.ratio_range);
            outln!(
                "{:<10} {:>5} {:>3} {:>12.0} {:>9.2} {:>12.0} {:>9.2} {:>6.2}x {:>6} {:>6} {:>13} {:>8.2}{range}",
                l.op,
                bs_name(l.bs_bytes),
                l.threads,
                l.iops,
                l.bytes_per_sec / 1e9,
                t.iops,
                t.bytes_per_sec / 1e9,
                l.iops / t.iops.max(1e-9),
                l.write_amplification
                    .map_or("-".into(), |w| format!("{w:.3}")),
                l.backpressure_waits.map_or("-".into(), |w| w.to_string()),
                match l.checkpoint_us_per_op {
                    Some(c) => format!("{:.2}+{c:.2}", l.cpu_us_per_op),
                    None => format!("{:.2}", l.cpu_us_per_op),
                },
                t.cpu_us_per_op,
            );
        }
        for (l, _) in &pairs {
            if let Some(w) = &l.waits_by_reason {
                outln!(
                    "  {} {} x{} waited for: log {}, buffers {}, space {}, journal {}",
                    l.op,
                    bs_name(l.bs_bytes),
                    l.threads,
                    w.log,
                    w.buffers,
                    w.space,
                    w.journal
                );
            }
        }
        let cpus = topology::current_affinity().map_or(0, |c| c.len());
        for op in ["randwrite", "seqwrite", "randread", "seqread"] {
            let one: Vec<_> = pairs
                .iter()
                .filter(|(l, _)| l.op == op && l.threads == 1)
                .collect();
            for (l1, _) in one {
                if let Some((l2, _)) = pairs
                    .iter()
                    .find(|(l, _)| l.op == op && l.threads == 2 && l.bs_bytes == l1.bs_bytes)
                {
                    outln!(
                        "  {op} {}: 2 threads / 1 thread = {:.2}x{}",
                        bs_name(l1.bs_bytes),
                        l2.iops / l1.iops.max(1e-9),
                        scaling_ceiling(l1, l2, cpus)
                            .map(|(c, most)| format!(
                                " (on {cpus} CPUs, with the checkpoint's {c:.2} us a write, at \
                                 most {most:.2}x)"
                            ))
                            .unwrap_or_default()
                    );
                }
            }
        }
    }
    if let Some(path) = &args.plot {
        let labels: Vec<String> = pairs
            .iter()
            .map(|(l, _)| format!("{} {} x{}", l.op, bs_name(l.bs_bytes), l.threads))
            .collect();
        let ratios: Vec<f64> = pairs
            .iter()
            .map(|(l, t)| l.iops / t.iops.max(1e-9))
            .collect();
        crate::plot::ratio_bars(
            path,
            "locus file system / tmpfs pwrite-pread",
            "ratio (IOPS)",
            &labels,
            &ratios,
        )?;
        if !args.json {
            outln!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// The most two writer threads can make of one on a machine of two CPUs, where the two and
/// the checkpoint thread need three: each write then costs a CPU its writer's time plus the
/// checkpoint's share, so two writers make at most `2 / (w + c)` writes a second where one,
/// with a CPU to itself and the checkpoint on the other, made `1 / w` (`w`: a writer's CPU
/// time per write alone, `c`: the checkpoint's per write with two; contention between the two
/// writers only lowers it). `None` for reads, for engines without a checkpoint and on other
/// CPU counts (with one, one writer shares its CPU too; with three or more, the CPUs
/// suffice). Returns `c` and the ceiling.
fn scaling_ceiling(one: &Case, two: &Case, cpus: usize) -> Option<(f64, f64)> {
    let c = two.checkpoint_us_per_op?;
    let w = one.cpu_us_per_op;
    (cpus == 2 && w > 0.0).then(|| (c, 2.0 * w / (w + c)))
}
