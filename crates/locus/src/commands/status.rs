//! `locus status`: the volume's devices, where they are, how full, and how allocation goes.

use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::output::outln;
use crate::size::format_bytes;

/// Show the volume's devices, their nodes, space and allocation order.
///
/// For each device of the volume in the --volume directory: path, kind, NUMA node (now and
/// at format), persistence mode, capacity, free space, candidate/fat state and allocations
/// served locally and remotely by this process; then the order in which each node uses the
/// devices; the file system on the volume (files, bytes, writes waiting to be replayed),
/// checked without changing it, so FREE counts its memory as used; and each cache export's
/// NVRAM (/.cache/NAME.nvram): the dirty blocks it holds, awaiting write-back to the backing
/// store. Creates the embedded default volume (with an empty file system) if there is none,
/// and says so. While `locus mount`, `locus serve` or a program through the preload library
/// holds the volume, shows that holder's live view instead (read through the mount, or asked
/// through the control socket in the volume directory): devices, space, file-system counters
/// and the server's request counters.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    volume: String,
    uuid: String,
    devices: Vec<volume::DeviceStats>,
    /// For every node with CPUs: device indexes in allocation order.
    orders: Vec<NodeOrder>,
    /// The file system on the volume, checked without changing it.
    fs: super::volume::FsState,
    /// Cache exports' NVRAM files, read without opening the file system.
    caches: Vec<CacheNvram>,
}

/// One cache export's NVRAM as a stopped volume holds it.
#[derive(Debug, Serialize)]
struct CacheNvram {
    /// The export's name.
    name: String,
    /// The NVRAM file.
    path: String,
    /// What its index says, or why it could not be read.
    #[serde(flatten)]
    state: CacheNvramState,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum CacheNvramState {
    Read(cachedev::NvramSummary),
    Unreadable { error: String },
}

/// Every cache NVRAM file on the stopped volume (none when the file system is absent or
/// damaged: the file system line says why).
fn caches(offline: &fs::Result<fs::OfflineFs<'_>>, fs: &super::volume::FsState) -> Vec<CacheNvram> {
    let (Ok(offline), super::volume::FsState::Present(_)) = (offline, fs) else {
        return Vec::new();
    };
    let dir = exports::NVRAM_DIR;
    offline
        .files_in(dir)
        .into_iter()
        .filter_map(|path| {
            let name = path
                .strip_prefix(dir)?
                .trim_start_matches('/')
                .strip_suffix(".nvram")?
                .to_owned();
            let state = match cachedev::summarize_offline(offline, &path) {
                Ok(summary) => CacheNvramState::Read(summary),
                Err(e) => CacheNvramState::Unreadable {
                    error: e.to_string(),
                },
            };
            Some(CacheNvram { name, path, state })
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct NodeOrder {
    node: u32,
    devices: Vec<u32>,
    target: Option<u32>,
    /// Whether a device of the volume is on this node: without one, every write of its
    /// threads goes to another node's memory.
    has_local_device: bool,
}

pub fn run(dir: &Path, sysfs: &Path, args: &StatusArgs) -> Result<()> {
    if let Some(served) = volume::find_served(dir) {
        return served_status(dir, &served, args);
    }
    if let Some(live) = super::serve::control::ask(dir) {
        let live = live.context("asking the process that holds the volume for its status")?;
        if live["server"] == "preload" {
            return program_status(dir, &live, args);
        }
        return serve_status(dir, &live, args);
    }
    let volume = super::volume::open_or_create_default(dir, sysfs, false)?;
    // First: checking the file system marks the memory it owns, which the targets and the
    // free space below must count.
    let offline = fs::Fs::offline(&volume);
    let fs = super::volume::FsState::of_offline(&offline);
    volume.refresh_targets();
    let orders: Vec<NodeOrder> = volume
        .topology()
        .nodes
        .iter()
        .filter(|n| !n.cpu_less)
        .filter_map(|n| {
            Some(NodeOrder {
                node: n.id,
                devices: volume.device_order(n.id)?,
                target: volume.decide_target(n.id),
                has_local_device: (0..volume.device_count())
                    .any(|d| volume.device_node(d) == Some(n.id)),
            })
        })
        .collect();
    let caches = caches(&offline, &fs);
    let report = Report {
        volume: dir.display().to_string(),
        uuid: volume::hex(&volume.uuid()),
        devices: volume.stats(),
        orders,
        fs,
        caches,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    outln!(
        "volume {} ({} device(s)), uuid {}",
        report.volume,
        report.devices.len(),
        report.uuid
    );
    outln!();
    let rows: Vec<[String; 9]> = report
        .devices
        .iter()
        .map(|d| {
            let node = match (d.node, d.node_at_format) {
                (Some(now), Some(then)) if now != then => format!("{now} (was {then})"),
                (Some(now), _) => now.to_string(),
                (None, _) => "-".into(),
            };
            [
                d.index.to_string(),
                d.path.clone(),
                d.kind.clone().unwrap_or_else(|| "-".into()),
                node,
                format_bytes(d.capacity_bytes),
                format_bytes(d.free_bytes),
                d.state.to_string(),
                format!("{}/{}", d.allocations_local, d.allocations_remote),
                d.persistence.clone(),
            ]
        })
        .collect();
    let header = [
        "DEV",
        "PATH",
        "KIND",
        "NODE",
        "CAPACITY",
        "FREE",
        "STATE",
        "LOCAL/REMOTE",
        "PERSISTENCE",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| -> Result<()> {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect();
        outln!("{}", text.join("  ").trim_end());
        Ok(())
    };
    line(header.to_vec())?;
    for row in &rows {
        line(row.iter().map(String::as_str).collect())?;
    }
    for d in &report.devices {
        if let Some(bytes) = d.unrecorded_bytes {
            outln!(
                "device {} is {} long, but the volume uses {} of it: growing it stopped before \
                 its new size was recorded (`locus extend --volume DIR` records it)",
                d.index,
                format_bytes(bytes),
                format_bytes(d.capacity_bytes)
            );
        }
    }
    outln!();
    outln!("{}", super::volume::describe_fs(&report.fs));
    if let super::volume::FsState::Present(check) = &report.fs {
        outln!(
            "{}",
            slots_line(check.slots, check.slot_limit, check.slot_bytes)
        );
    }
    for cache in &report.caches {
        match &cache.state {
            CacheNvramState::Read(s) if s.dirty_blocks > 0 => outln!(
                "cache {}: {} dirty block(s) ({}) in {} awaiting write-back to its backing \
                 store (the next `locus serve` with this export writes them back; \
                 --writeback-on-stop empties it)",
                cache.name,
                s.dirty_blocks,
                format_bytes(s.dirty_blocks * u64::from(s.block_bytes)),
                cache.path
            ),
            CacheNvramState::Read(s) => outln!(
                "cache {}: no dirty blocks in {} ({} slots): its backing store is complete",
                cache.name,
                cache.path,
                s.slots
            ),
            CacheNvramState::Unreadable { error } => {
                outln!(
                    "cache {}: {} cannot be read: {error}",
                    cache.name,
                    cache.path
                );
            }
        }
    }
    outln!();
    outln!("Allocation order per node (the first non-fat device is the target):");
    for order in &report.orders {
        let list: Vec<String> = order.devices.iter().map(u32::to_string).collect();
        outln!(
            "  node {}: devices {}  target {}",
            order.node,
            list.join(", "),
            order
                .target
                .map_or_else(|| "none (all fat)".into(), |t| t.to_string())
        );
        if !order.has_local_device {
            outln!(
                "    node {} has CPUs but no device: its threads write to other nodes' memory \
                 (`locus extend --emulate` or `--device PATH,node={},size=SIZE` adds one, on a \
                 stopped volume)",
                order.node,
                order.node
            );
        }
    }
    if report
        .devices
        .iter()
        .any(|d| d.kind.as_deref() == Some("emulated"))
    {
        outln!();
        outln!(
            "Emulated devices live in shared memory: they survive process crashes, not reboots."
        );
    }
    Ok(())
}

/// The live status a `locus mount` server publishes in its mount at `mountpoint` (the
/// `.locus-status` file): devices, space, file system and request counters.
pub(crate) fn mount_server_status(mountpoint: &Path) -> Result<serde_json::Value> {
    let file = mountpoint.join(mount::STATUS_NAME);
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading the mount server's status from {}", file.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("the mount server's status in {}", file.display()))
}

/// The status of a volume a `locus mount` server holds, read through its mount (the
/// server's live view: devices, space, file system counters).
fn served_status(dir: &Path, served: &volume::Served, args: &StatusArgs) -> Result<()> {
    let live = mount_server_status(&served.mountpoint)?;
    if args.json {
        let served_by = serde_json::json!({ "pid": served.pid, "mountpoint": served.mountpoint });
        return print_live_json(dir, &live, &served_by, &["fuse", "nameless", "scrub"]);
    }
    print_live_volume(
        dir,
        &live,
        &format!(
            "served by `locus mount` (pid {}) at {}",
            served.pid,
            served.mountpoint.display()
        ),
    )?;
    let nameless = &live["nameless"];
    if let (Some(files @ 1..), Some(bytes)) =
        (nameless["files"].as_u64(), nameless["bytes"].as_u64())
    {
        outln!(
            "held open without a name (removed while open, or O_TMPFILE): {files} file(s), {} \
             — free again at their last close",
            format_bytes(bytes)
        );
    }
    let fuse = &live["fuse"];
    let queues: Vec<String> = fuse["queue_requests"]
        .as_array()
        .map(|q| {
            q.iter()
                .enumerate()
                .map(|(cpu, n)| format!("cpu {cpu}: {n}"))
                .collect()
        })
        .unwrap_or_default();
    if let Some(bytes) = fuse["max_write"].as_u64() {
        let how = if fuse["writeback_cache"].as_bool() == Some(true) {
            ", through the kernel's write-back cache (durable once written back: at fsync, \
             msync or close at the latest)"
        } else {
            " (a larger write(2) comes in several, each atomic)"
        };
        outln!(
            "writes: {} requests of at most {}{how}",
            fuse["write_requests"],
            format_bytes(bytes)
        );
    }
    if fuse["io_uring"].as_bool() == Some(true) {
        outln!(
            "requests: FUSE over io_uring, by the CPU that made them: {}; served on another \
             CPU: {}; through /dev/fuse: {}",
            queues.join(", "),
            fuse["served_elsewhere"],
            fuse["dev_requests"]
        );
    } else {
        outln!(
            "requests: through /dev/fuse reads: {}",
            fuse["dev_requests"]
        );
    }
    Ok(())
}

/// The status of a volume a `locus serve` holds, asked through its control socket
/// ([`super::serve::control`]): devices, space, file system and request counters, live.
fn serve_status(dir: &Path, live: &serde_json::Value, args: &StatusArgs) -> Result<()> {
    if args.json {
        let served_by = serde_json::json!({ "pid": live["server_pid"], "server": "serve" });
        return print_live_json(dir, live, &served_by, &["exports", "channels", "scrub"]);
    }
    print_live_volume(dir, live, &super::serve::control::held_by(live))?;
    let names: Vec<&str> = live["exports"]
        .as_array()
        .map(|e| e.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    outln!("exports: {}", names.join(", "));
    for c in live["channels"].as_array().cloned().unwrap_or_default() {
        let bytes = |key: &str| format_bytes(c[key].as_u64().unwrap_or(0));
        outln!(
            "channel {} ({}): {} connections ({} open), {} requests: {} reads ({}), {} writes \
             ({}), {} other, {} errors",
            c["channel"],
            c["node"]
                .as_u64()
                .map_or_else(|| "no node".into(), |n| format!("node {n}")),
            c["connections"],
            c["open_connections"],
            c["requests"],
            c["reads"],
            bytes("read_bytes"),
            c["writes"],
            bytes("written_bytes"),
            c["others"],
            c["errors"]
        );
    }
    Ok(())
}

/// The status of a volume a program holds through the preload library, asked through the
/// control socket its library answers on: devices, space and the file system's counters,
/// live, and which program it is.
fn program_status(dir: &Path, live: &serde_json::Value, args: &StatusArgs) -> Result<()> {
    if args.json {
        let served_by = serde_json::json!({
            "pid": live["server_pid"],
            "server": "preload",
            "program": live["program"],
        });
        return print_live_json(dir, live, &served_by, &["scrub"]);
    }
    print_live_volume(dir, live, &super::serve::control::held_by(live))
}

/// The line about the last scrub a server ran for `locus scrub` (none when it ran none).
fn print_scrub(live: &serde_json::Value) -> Result<()> {
    let Ok(scrub) = serde_json::from_value::<fs::ScrubStatus>(live["scrub"].clone()) else {
        return Ok(());
    };
    let read = format_bytes(scrub.blocks * 4096);
    if scrub.running {
        outln!(
            "scrub: running for {:.1} s, {} of {} file(s) read, {read}",
            scrub.seconds,
            scrub.files_done,
            scrub.files_total
        );
        return Ok(());
    }
    match (&scrub.report, &scrub.error) {
        (Some(report), _) => outln!(
            "last scrub{}: {} in {:.1} s, {} file(s), {read}{}",
            ago(scrub.ended_seconds_ago),
            if report.damaged.is_empty() {
                "clean".to_owned()
            } else {
                format!("{} damaged block(s)", report.damaged.len())
            },
            scrub.seconds,
            report.files,
            if report.damaged.is_empty() {
                ""
            } else {
                " (`locus scrub` names them)"
            }
        ),
        (None, Some(error)) => outln!(
            "last scrub{}: failed after {:.1} s: {error}",
            ago(scrub.ended_seconds_ago),
            scrub.seconds
        ),
        (None, None) => {}
    }
    Ok(())
}

/// " (ended 5 min ago)" and the like.
fn ago(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds else {
        return String::new();
    };
    let s = seconds as u64;
    let when = match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    };
    format!(" (ended {when} ago)")
}

/// A server's live status as `--json` prints it: the volume, `served_by`, the devices and
/// the file system (`fs_live`), and the keys of `live` that only this kind of server has.
fn print_live_json(
    dir: &Path,
    live: &serde_json::Value,
    served_by: &serde_json::Value,
    own: &[&str],
) -> Result<()> {
    let mut report = serde_json::json!({
        "volume": dir.display().to_string(),
        "served_by": served_by,
        "uuid": live["uuid"],
        "devices": live["devices"],
        "fs_live": live["fs"],
    });
    for key in own {
        report[*key] = live[*key].clone();
    }
    outln!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// The head of a server's live status: the volume, who holds it (`held_by`: "served by
/// `locus serve` (pid 9)"), the device table and the file-system line.
fn print_live_volume(dir: &Path, live: &serde_json::Value, held_by: &str) -> Result<()> {
    outln!(
        "volume {} ({} device(s)), uuid {}",
        dir.display(),
        live["devices"].as_array().map_or(0, Vec::len),
        live["uuid"].as_str().unwrap_or("?")
    );
    outln!("{held_by}: its live view");
    outln!();
    outln!("DEV  NODE  CAPACITY    FREE        PATH");
    for d in live["devices"].as_array().cloned().unwrap_or_default() {
        let bytes = |key: &str| format_bytes(d[key].as_u64().unwrap_or(0));
        // JSON values ignore widths: every cell becomes a string first.
        outln!(
            "{:<4} {:<5} {:<11} {:<11} {}",
            d["index"].to_string(),
            d["node"]
                .as_u64()
                .map_or_else(|| "-".into(), |n| n.to_string()),
            bytes("capacity_bytes"),
            bytes("free_bytes"),
            d["path"].as_str().unwrap_or("?")
        );
    }
    let fs = &live["fs"];
    outln!();
    outln!(
        "file system: {} files and directories, {} logged write(s) waiting for the checkpoint, \
         write amplification {:.3}",
        fs["inodes"],
        fs["records_pending"],
        fs["write_amplification"].as_f64().unwrap_or(0.0)
    );
    let count = |key: &str| fs[key].as_u64().unwrap_or(0);
    outln!(
        "idle-time defragmentation: {} window(s) rewritten ({} earned by reads), {} noted, {} \
         put off",
        count("defragmented_windows"),
        count("defragmented_for_reads"),
        count("defrag_windows_noted"),
        count("defrag_windows_deferred")
    );
    outln!(
        "{}",
        checkpoint_line(
            fs["checkpoint_nice"].as_i64(),
            count("checkpoint_priority_raised"),
            count("writer_give_ways")
        )
    );
    outln!(
        "{}",
        snapshots_line(
            count("snapshots"),
            count("snapshot_bytes"),
            count("snapshot_pause_last_ns"),
            count("snapshot_pause_max_ns")
        )
    );
    outln!(
        "{}",
        slots_line(count("slots"), count("slot_limit"), count("slot_bytes"))
    );
    if let Some(turns) = turns_line(count("slot_turns"), count("slot_turn_waits")) {
        outln!("{turns}");
    }
    print_scrub(live)
}

/// The checkpoint thread's priority and how often writers gave way to it.
fn checkpoint_line(nice: Option<i64>, raised: u64, give_ways: u64) -> String {
    let priority = match nice {
        None => "not started".to_owned(),
        Some(nice) if raised > 0 => {
            format!("nice {nice}, {raised} steps above the server's priority")
        }
        Some(nice) => format!(
            "nice {nice}, the server's own priority (no privilege to raise it: writers far \
             ahead give way to it instead)"
        ),
    };
    format!("checkpoint thread: {priority}; writers gave way to it {give_ways} time(s)")
}

/// How much work threads did taking turns on the shared slots, and what to do about it;
/// nothing when none did.
fn turns_line(turns: u64, waits: u64) -> Option<String> {
    (turns > 0).then(|| {
        format!(
            "shared slots: {turns} operation(s) done on a turn by threads that found every slot \
             a thread may own taken, {waits} of them after waiting for another thread's turn \
             (`locus tune --thread-slots` raises the limit while the volume is not in use)"
        )
    })
}

/// How many snapshots the server wrote, how large the newest is, and how long they held
/// metadata operations off (the stall a file system of many files sees now and then).
fn snapshots_line(count: u64, bytes: u64, last_ns: u64, max_ns: u64) -> String {
    let size = format!("the newest {}", format_bytes(bytes));
    if count == 0 {
        return format!("snapshots: none written since the volume was opened ({size})");
    }
    format!(
        "snapshots: {count} written since the volume was opened, {size}; metadata operations \
         waited {} for the last, {} at most",
        format_pause(last_ns),
        format_pause(max_ns)
    )
}

/// A pause in the unit that reads best: µs below a millisecond, ms below a second.
fn format_pause(ns: u64) -> String {
    match ns {
        0..1_000_000 => format!("{:.0} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

/// Where the memory of thread slots goes, which `df` counts as used on an empty volume.
fn slots_line(slots: u64, limit: u64, bytes: u64) -> String {
    // `limit` is 0 in a report from before it was kept.
    let of = if limit > 0 {
        let owned = fs::ownable_slots(limit);
        format!(" of {limit} ({owned} a thread may own, the rest shared)")
    } else {
        String::new()
    };
    format!(
        "thread slots: {slots}{of}, holding {} of logs and journals (the checkpoint's, and one \
         per thread for the most threads that have used the file system at once; kept for \
         reuse)",
        format_bytes(bytes)
    )
}
