//! `locus cache replay`: a block trace replayed over NBD against a cache export, one request
//! at a time, and the backing-store traffic the server counted compared with what `locus sim`
//! computes for the same trace, policy and sizes.

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cache::{Capacity, Op};
use clap::{Args, Subcommand, ValueEnum};
use nbd::consts::{
    IHAVEOPT, NBD_MAGIC, OPTION_REPLY_MAGIC, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, client_flags,
    command, option, reply,
};
use sim::{Format, ReadOptions};

use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Work with cache devices (exports `NAME=cache:PATH,...` of `locus serve`).
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    Replay(ReplayArgs),
}

/// Replay a block trace over NBD against a cache export and check the simulator's counts.
///
/// Starts `locus serve` with a cache export of the given sizes and policy over a scratch
/// volume (in /dev/shm) and a scratch backing file (in --dir, on the disk), replays the trace
/// as one NBD request per block access, one at a time, verifying that every read returns the
/// last data written there, stops the server, and prints the backing-store reads and
/// write-backs the server counted beside those `locus sim` computes for the same trace,
/// policy and sizes. The export writes back only when the policy evicts (`writeback=off`), as
/// the simulator does. Trace blocks are numbered densely, as the simulator does, so the backing
/// file holds exactly the blocks the trace touches. Exits 1 if the counts differ.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace (the formats `locus sim` reads).
    #[arg(long)]
    trace: PathBuf,

    /// Trace format: libcachesim, msr, fio2, fio3, blkparse, disksim [default: detected].
    #[arg(long, value_parser = ["libcachesim", "msr", "fio2", "fio3", "blkparse", "disksim"])]
    format: Option<String>,

    /// NVRAM of the cache (a multiple of 4K).
    #[arg(long, value_parser = parse_size)]
    nvram: u64,

    /// DRAM of the cache (a multiple of 4K).
    #[arg(long, value_parser = parse_size)]
    dram: u64,

    /// The policy.
    #[arg(long, value_enum, default_value_t = PolicyArg::Nbm)]
    policy: PolicyArg,

    /// Directory for the scratch backing file.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PolicyArg {
    Nbm,
    Nvlru,
    Lru,
}

impl PolicyArg {
    fn name(self) -> &'static str {
        match self {
            PolicyArg::Nbm => "nbm",
            PolicyArg::Nvlru => "nvlru",
            PolicyArg::Lru => "lru",
        }
    }

    fn sim(self) -> sim::PolicyKind {
        match self {
            PolicyArg::Nbm => sim::PolicyKind::Nbm,
            PolicyArg::Nvlru => sim::PolicyKind::NvLru,
            PolicyArg::Lru => sim::PolicyKind::Lru,
        }
    }
}

pub fn run(args: &CacheArgs) -> Result<()> {
    match &args.command {
        CacheCommand::Replay(args) => replay(args),
    }
}

const BLOCK: u64 = cachedev::BLOCK_BYTES as u64;

/// Removes a scratch path (directory or file) when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0).or_else(|_| std::fs::remove_file(&self.0));
    }
}

fn replay(args: &ReplayArgs) -> Result<()> {
    for (what, bytes) in [("--nvram", args.nvram), ("--dram", args.dram)] {
        if !bytes.is_multiple_of(BLOCK) {
            bail!("{what} {bytes} is not a multiple of the 4096-byte block");
        }
    }
    if args.nvram == 0 {
        bail!("--nvram must hold at least one block");
    }
    let file = std::fs::File::open(&args.trace)
        .with_context(|| format!("opening {}", args.trace.display()))?;
    let options = ReadOptions {
        format: args
            .format
            .as_deref()
            .map(|f| Format::from_name(f).expect("clap checked")),
        block_bytes: BLOCK,
        skip_bad: false,
    };
    let trace = sim::read_trace(
        BufReader::with_capacity(1 << 20, file),
        &args.trace.display().to_string(),
        &options,
    )?;
    if trace.accesses.is_empty() {
        bail!("{}: the trace has no requests", args.trace.display());
    }
    let capacity = Capacity {
        dram_blocks: (args.dram / BLOCK) as usize,
        nvram_blocks: (args.nvram / BLOCK) as usize,
    };
    let (expected, _) = sim::run_policy(args.policy.sim(), capacity, &trace.accesses, None);

    // The server: a scratch volume with room for the NVRAM file, a scratch backing file.
    let volume = Scratch(PathBuf::from(format!(
        "/dev/shm/locus-cache-replay-{}",
        std::process::id()
    )));
    std::fs::create_dir(&volume.0).with_context(|| {
        format!(
            "creating the scratch volume directory {}",
            volume.0.display()
        )
    })?;
    let backing = Scratch(
        args.dir
            .join(format!("locus-cache-replay-{}.img", std::process::id())),
    );
    let blocks = u64::from(trace.distinct_blocks).max(1);
    let backing_bytes = blocks * BLOCK;
    std::fs::File::create(&backing.0)
        .and_then(|f| f.set_len(backing_bytes))
        .with_context(|| format!("creating the backing file {}", backing.0.display()))?;
    let exe = std::env::current_exe().context("finding the locus executable")?;
    let volume_bytes = (args.nvram + args.nvram / 64 + (64 << 20)).next_multiple_of(1 << 20);
    let formatted = Command::new(&exe)
        .args(["format", "--volume"])
        .arg(&volume.0)
        .arg(format!("--emulate={volume_bytes}"))
        .output()
        .context("running locus format")?;
    if !formatted.status.success() {
        bail!(
            "locus format failed: {}",
            String::from_utf8_lossy(&formatted.stderr)
        );
    }
    let socket = volume.0.join("replay.sock");
    let log = volume.0.join("serve.log");
    let export = format!(
        "replay=cache:{},nvram={},dram={},policy={},writeback=off",
        backing.0.display(),
        args.nvram,
        args.dram,
        args.policy.name()
    );
    let mut server = Command::new(&exe)
        .args(["serve", "--stats-json", "--volume"])
        .arg(&volume.0)
        .arg("--unix")
        .arg(&socket)
        .args(["--export", &export])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting locus serve")?;
    let result = (|| -> Result<Replayed> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stream = loop {
            if let Some(status) = server.try_wait()? {
                bail!(
                    "locus serve exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Ok(stream) = UnixStream::connect(&socket) {
                break stream;
            }
            if Instant::now() > deadline {
                bail!("locus serve did not listen within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let size = handshake(&mut stream, "replay")?;
        if size != backing_bytes {
            bail!("the export has {size} bytes, not {backing_bytes}");
        }
        let started = Instant::now();
        let mut versions = vec![0u32; blocks as usize];
        let mut block = vec![0u8; BLOCK as usize];
        for (i, access) in trace.accesses.iter().enumerate() {
            let id = u64::from(access.block);
            match access.op {
                Op::Write => {
                    let version = i as u32 + 1;
                    fill(&mut block, id, version);
                    request(&mut stream, command::WRITE, id * BLOCK, &block, None)?;
                    versions[id as usize] = version;
                }
                Op::Read => {
                    let mut got = vec![0u8; BLOCK as usize];
                    request(&mut stream, command::READ, id * BLOCK, &[], Some(&mut got))?;
                    let version = versions[id as usize];
                    if version == 0 {
                        if got.iter().any(|&b| b != 0) {
                            bail!("access {i}: block {id} was never written but reads non-zero");
                        }
                    } else {
                        fill(&mut block, id, version);
                        if got != block {
                            bail!("access {i}: block {id} does not read back its last write");
                        }
                    }
                }
            }
        }
        let elapsed = started.elapsed();
        request(&mut stream, command::DISC, 0, &[], None).ok();
        Ok(Replayed { elapsed })
    })();
    // Stop the server cleanly, whatever happened, and read its totals.
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let status = server.wait()?;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let replayed = result?;
    if !status.success() {
        bail!("locus serve did not stop cleanly ({status}): {said}");
    }
    let totals = said
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["report"] == "total" && v["cache"] == "replay")
        .with_context(|| format!("the server printed no cache totals: {said}"))?;
    let stats = &totals["stats"];
    let count = |key: &str| stats[key].as_u64().unwrap_or(u64::MAX);
    let device = [
        ("accesses", count("accesses"), trace.accesses.len() as u64),
        ("read hits", count("read_hits"), expected.read_hits),
        ("write hits", count("write_hits"), expected.write_hits),
        (
            "backing reads",
            count("backing_reads"),
            expected.storage_reads,
        ),
        ("write-backs", count("writebacks"), expected.writebacks),
    ];
    let equal = device.iter().all(|&(_, got, want)| got == want);
    if args.json {
        let mut object = serde_json::Map::new();
        object.insert("trace".into(), args.trace.display().to_string().into());
        object.insert("policy".into(), args.policy.name().into());
        object.insert("dram_bytes".into(), args.dram.into());
        object.insert("nvram_bytes".into(), args.nvram.into());
        for (name, got, want) in device {
            let key = name.replace([' ', '-'], "_");
            object.insert(key, serde_json::json!({ "device": got, "sim": want }));
        }
        object.insert("equal".into(), equal.into());
        object.insert("seconds".into(), replayed.elapsed.as_secs_f64().into());
        outln!("{}", serde_json::Value::Object(object));
    } else {
        outln!(
            "{}: {} block accesses over NBD in {:.2} s, {} cache, DRAM {}, NVRAM {}",
            args.trace.display(),
            trace.accesses.len(),
            replayed.elapsed.as_secs_f64(),
            args.policy.name(),
            format_bytes(args.dram),
            format_bytes(args.nvram)
        );
        outln!("{:<14} {:>12} {:>12}", "", "device", "locus sim");
        for (name, got, want) in device {
            outln!(
                "{name:<14} {got:>12} {want:>12}{}",
                if got == want { "" } else { "   DIFFERENT" }
            );
        }
    }
    if !equal {
        bail!("the device's counts differ from the simulator's");
    }
    Ok(())
}

struct Replayed {
    elapsed: Duration,
}

/// Block `id`'s content for write number `version`.
fn fill(block: &mut [u8], id: u64, version: u32) {
    for (i, chunk) in block.chunks_exact_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&id.to_le_bytes());
        chunk[8..12].copy_from_slice(&version.to_le_bytes());
        chunk[12..16].copy_from_slice(&(i as u32).to_le_bytes());
    }
}

fn read_u16(s: &mut impl Read) -> Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(s: &mut impl Read) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(s: &mut impl Read) -> Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Fixed-newstyle negotiation with `NBD_OPT_GO` for `name`; returns the export's size.
fn handshake(s: &mut UnixStream, name: &str) -> Result<u64> {
    if read_u64(s)? != NBD_MAGIC || read_u64(s)? != IHAVEOPT {
        bail!("the server did not greet as a newstyle NBD server");
    }
    let _flags = read_u16(s)?;
    s.write_all(&(client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES).to_be_bytes())?;
    let mut data = Vec::new();
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    let mut opt = Vec::new();
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&option::GO.to_be_bytes());
    opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
    opt.extend_from_slice(&data);
    s.write_all(&opt)?;
    let mut size = None;
    loop {
        if read_u64(s)? != OPTION_REPLY_MAGIC {
            bail!("bad option reply magic");
        }
        let _option = read_u32(s)?;
        let kind = read_u32(s)?;
        let len = read_u32(s)? as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body)?;
        match kind {
            reply::ACK => break,
            reply::INFO if body.len() >= 12 && body[..2] == [0, 0] => {
                size = Some(u64::from_be_bytes(body[2..10].try_into().expect("8 bytes")));
            }
            reply::INFO => {}
            k if k & reply::ERROR_BIT != 0 => bail!(
                "the server refused export {name:?}: {}",
                String::from_utf8_lossy(&body)
            ),
            k => bail!("unexpected option reply {k}"),
        }
    }
    size.context("the server sent no export size")
}

/// One request, waited for: writes send `payload`, reads fill `out`.
fn request(
    s: &mut UnixStream,
    kind: u16,
    offset: u64,
    payload: &[u8],
    out: Option<&mut [u8]>,
) -> Result<()> {
    let len = out.as_ref().map_or(payload.len(), |o| o.len()) as u32;
    let mut head = Vec::with_capacity(28 + payload.len());
    head.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    head.extend_from_slice(&0u16.to_be_bytes());
    head.extend_from_slice(&kind.to_be_bytes());
    head.extend_from_slice(&1u64.to_be_bytes());
    head.extend_from_slice(&offset.to_be_bytes());
    head.extend_from_slice(&(if kind == command::DISC { 0 } else { len }).to_be_bytes());
    head.extend_from_slice(payload);
    s.write_all(&head)?;
    if kind == command::DISC {
        return Ok(());
    }
    if read_u32(s)? != SIMPLE_REPLY_MAGIC {
        bail!("bad reply magic");
    }
    let error = read_u32(s)?;
    let _handle = read_u64(s)?;
    if error != 0 {
        bail!("the server answered NBD error {error} at offset {offset}");
    }
    if let Some(out) = out {
        s.read_exact(out)?;
    }
    Ok(())
}
