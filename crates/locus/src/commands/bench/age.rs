//! `locus bench age`: what long use does to a volume, measured. A database-like workload
//! (random page overwrites, appends, truncations, creates and deletes of tables) drives a
//! scratch volume past `--fill` full, then deletes tables until it is `--free` below that
//! again, round after round. Before aging and after each round the same probes run: the
//! largest write that succeeds at an unaligned offset, random 4 KiB overwrites per second and
//! 1 MiB writes per second. The fresh volume is the baseline; the after/before ratios are
//! printed with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::output::outln;
use crate::size::parse_size;

/// Age a volume with a database-like workload and measure the largest write that succeeds
/// and write throughput before and after each round.
#[derive(Debug, Args)]
pub struct AgeBenchArgs {
    /// Print one JSON object per measurement instead of a table.
    #[arg(long)]
    json: bool,

    /// Volume size (an emulated device under --dir).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    size: u64,

    /// Percent of the volume each round fills before it stops (50..=99).
    #[arg(long, default_value_t = 92)]
    fill: u8,

    /// Percent of the volume each round then frees by deleting tables (1..=40).
    #[arg(long, default_value_t = 12)]
    free: u8,

    /// Rounds of aging.
    #[arg(long, default_value_t = 3)]
    rounds: u32,

    /// Seed of the workload (the same seed ages the same way).
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Seconds of each throughput probe.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,

    /// Directory on tmpfs for the scratch volume.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
struct Probe {
    suite: &'static str,
    /// "fresh", or "round N".
    phase: String,
    fill_percent: f64,
    free_bytes: u64,
    /// Workload operations that aged the volume in this round (0 when fresh).
    aging_ops: u64,
    /// The largest power-of-two write (at offset 1) that succeeded.
    largest_write_bytes: u64,
    randwrite_4k_iops: f64,
    write_1m_bytes_per_sec: f64,
}

const PAGE: u64 = 4096;

pub fn run(sysfs: &std::path::Path, args: &AgeBenchArgs) -> Result<()> {
    if !(50..=99).contains(&args.fill) {
        bail!("--fill must be 50..=99 (percent)");
    }
    if !(1..=40).contains(&args.free) || args.free >= args.fill {
        bail!("--free must be 1..=40 (percent) and below --fill");
    }
    if args.size < 64 << 20 {
        bail!("--size must be at least 64M");
    }
    if !(args.seconds > 0.0 && args.seconds <= 60.0) {
        bail!("--seconds must be above 0 and at most 60");
    }
    let topology = topology::Topology::read_from(sysfs)?;
    let scratch = super::cleanup::Scratch::new(
        args.dir
            .join(format!("locus-bench-age-{}", std::process::id())),
    );
    let volume_dir = scratch.path().join("volume");
    let config = volume::default_config(&volume_dir, &topology, Some(args.size))?;
    volume::Volume::format(&volume_dir, &config, true).with_context(|| {
        format!(
            "formatting a {}-byte scratch volume in {}",
            args.size,
            volume_dir.display()
        )
    })?;
    let volume = Arc::new(volume::Volume::open(
        &volume_dir,
        topology,
        &volume::OpenOptions::default(),
    )?);
    let fs = fs::Fs::format(
        volume,
        &fs::FormatOptions::default(),
        fs::FsOptions::default(),
    )?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut tables = Tables::default();
    let seconds = Duration::from_secs_f64(args.seconds);

    let mut probes = vec![probe(&fs, "fresh".into(), 0, seconds, &mut rng)?];
    if !args.json {
        outln!("phase       full   free      aging ops  largest write  4K randwrite    1M writes");
        print_row(&probes[0])?;
    }
    for round in 1..=args.rounds {
        let spinner = crate::progress::spinner(format!("aging, round {round}"), !args.json);
        let mut ops = 0u64;
        let fill = f64::from(args.fill) / 100.0;
        while fill_ratio(&fs) < fill {
            tables.step(&fs, &mut rng)?;
            ops += 1;
            if ops > 50_000_000 {
                bail!("round {round}: the volume did not fill in 50 million operations");
            }
        }
        fs.checkpoint()?;
        let target = fill - f64::from(args.free) / 100.0;
        while fill_ratio(&fs) > target && !tables.files.is_empty() {
            tables.delete_one(&fs, &mut rng)?;
            fs.checkpoint()?;
        }
        spinner.finish_and_clear();
        let probe = probe(&fs, format!("round {round}"), ops, seconds, &mut rng)?;
        if !args.json {
            print_row(&probe)?;
        }
        probes.push(probe);
    }
    if args.json {
        return super::print_json(&probes);
    }
    let (fresh, aged) = (&probes[0], probes.last().expect("fresh at least"));
    outln!(
        "after {} round(s) / fresh: largest write {:.2}x, 4K randwrite {:.2}x, 1M writes {:.2}x",
        args.rounds,
        aged.largest_write_bytes as f64 / fresh.largest_write_bytes.max(1) as f64,
        aged.randwrite_4k_iops / fresh.randwrite_4k_iops.max(f64::MIN_POSITIVE),
        aged.write_1m_bytes_per_sec / fresh.write_1m_bytes_per_sec.max(f64::MIN_POSITIVE),
    );
    drop(fs);
    Ok(())
}

fn print_row(p: &Probe) -> Result<()> {
    outln!(
        "{:<10} {:>4.1}% {:>9} {:>10} {:>14} {:>10.0}/s {:>9}/s",
        p.phase,
        p.fill_percent,
        super::short_size(p.free_bytes),
        p.aging_ops,
        super::short_size(p.largest_write_bytes),
        p.randwrite_4k_iops,
        super::short_size(p.write_1m_bytes_per_sec as u64)
    );
    Ok(())
}

fn fill_ratio(fs: &fs::Fs) -> f64 {
    let volume = fs.volume();
    1.0 - volume.free_bytes() as f64 / volume.data_bytes() as f64
}

/// The probes, on files of their own that are deleted afterwards.
fn probe(
    fs: &fs::Fs,
    phase: String,
    aging_ops: u64,
    seconds: Duration,
    rng: &mut SmallRng,
) -> Result<Probe> {
    fs.checkpoint()?;
    let fill_percent = 100.0 * fill_ratio(fs);
    let free_bytes = fs.volume().free_bytes();
    // The largest write: powers of two from 4 KiB, at offset 1 (unaligned), until one fails.
    let largest_write_bytes = {
        let file = fs.create("/probe-largest")?;
        let mut largest = 0;
        let mut size = PAGE;
        while size <= fs::MAX_IO {
            let data = vec![0x5a; size as usize];
            match file.write_at(&data, 1) {
                Ok(()) => largest = size,
                Err(e) if e.kind() == fs::ErrorKind::NoSpace => break,
                Err(e) => return Err(e).context("the largest-write probe"),
            }
            // Start over on an empty file, so each size needs its own free space.
            file.set_len(0)?;
            fs.checkpoint()?;
            size *= 2;
        }
        drop(file);
        fs.unlink("/probe-largest")?;
        fs.checkpoint()?;
        largest
    };
    // Random 4 KiB overwrites of a 16 MiB file (or what fits), then 1 MiB appends.
    let file = fs.create("/probe-rate")?;
    let span = (16u64 << 20).min(free_bytes / 4).max(PAGE) / PAGE * PAGE;
    let chunk = vec![0xa5; 1 << 20];
    let mut at = 0;
    while at < span {
        let n = (span - at).min(chunk.len() as u64);
        file.write_at(&chunk[..n as usize], at)?;
        at += n;
    }
    fs.checkpoint()?;
    let page = vec![0x3c; PAGE as usize];
    let started = Instant::now();
    let mut writes = 0u64;
    while started.elapsed() < seconds {
        let at = rng.random_range(0..span / PAGE) * PAGE;
        match file.write_at(&page, at) {
            Ok(()) => writes += 1,
            Err(e) if e.kind() == fs::ErrorKind::NoSpace => break,
            Err(e) => return Err(e).context("the 4 KiB overwrite probe"),
        }
    }
    fs.checkpoint()?;
    let randwrite_4k_iops = writes as f64 / started.elapsed().as_secs_f64();
    file.set_len(0)?;
    fs.checkpoint()?;
    let started = Instant::now();
    let mut bytes = 0u64;
    while started.elapsed() < seconds && bytes + (1 << 20) <= free_bytes / 2 {
        match file.write_at(&chunk, bytes) {
            Ok(()) => bytes += 1 << 20,
            Err(e) if e.kind() == fs::ErrorKind::NoSpace => break,
            Err(e) => return Err(e).context("the 1 MiB write probe"),
        }
    }
    fs.checkpoint()?;
    let write_1m_bytes_per_sec = bytes as f64 / started.elapsed().as_secs_f64();
    drop(file);
    fs.unlink("/probe-rate")?;
    fs.checkpoint()?;
    Ok(Probe {
        suite: "age",
        phase,
        fill_percent,
        free_bytes,
        aging_ops,
        largest_write_bytes,
        randwrite_4k_iops,
        write_1m_bytes_per_sec,
    })
}

/// The aging workload's tables: names and sizes.
#[derive(Default)]
struct Tables {
    files: BTreeMap<String, u64>,
    next: u64,
}

impl Tables {
    /// One operation: create (3%), overwrite a page (50%), append up to 256 KiB (35%),
    /// trim up to 128 KiB off the end (10%), delete (2%). Out of space is an answer.
    fn step(&mut self, fs: &fs::Fs, rng: &mut SmallRng) -> Result<()> {
        let choice = rng.random_range(0..100);
        if self.files.len() < 4 || choice < 3 {
            let name = format!("/table{}", self.next);
            self.next += 1;
            fs.create(&name)?;
            self.files.insert(name, 0);
            return Ok(());
        }
        if choice >= 98 {
            return self.delete_one(fs, rng);
        }
        let index = rng.random_range(0..self.files.len());
        let (name, &len) = self.files.iter().nth(index).expect("in range");
        let name = name.clone();
        let file = fs.open_file(&name, fs::OpenOptions::read_write())?;
        let result = if choice < 53 {
            let at = rng.random_range(0..len.max(PAGE) / PAGE) * PAGE;
            file.write_at(&[choice as u8; PAGE as usize], at)
                .map(|()| len.max(at + PAGE))
        } else if choice < 88 {
            let size = rng.random_range(1..=256u64 << 10);
            file.write_at(&vec![choice as u8; size as usize], len)
                .map(|()| len + size)
        } else {
            let to = len.saturating_sub(rng.random_range(0..=128u64 << 10));
            file.set_len(to).map(|()| to)
        };
        match result {
            Ok(new_len) => {
                self.files.insert(name, new_len);
                Ok(())
            }
            Err(e) if e.kind() == fs::ErrorKind::NoSpace => Ok(()),
            Err(e) => Err(e).with_context(|| format!("aging {name}")),
        }
    }

    fn delete_one(&mut self, fs: &fs::Fs, rng: &mut SmallRng) -> Result<()> {
        if self.files.is_empty() {
            return Ok(());
        }
        let index = rng.random_range(0..self.files.len());
        let name = self.files.keys().nth(index).expect("in range").clone();
        fs.unlink(&name)?;
        self.files.remove(&name);
        Ok(())
    }
}
