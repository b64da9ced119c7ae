//! `locus serve --metrics ADDR:PORT`: the server's counters as Prometheus text over HTTP
//! (`GET /metrics`), for scrapers. One thread answers one request at a time; a request must
//! arrive within a short timeout, so a silent client delays a scrape by at most that.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use nbd::server::{ChannelReport, Cidr, LATENCY_BUCKETS};

/// The server's side of a scrape: every channel's counters, the export names their
/// `exports` follow, and the connections negotiating.
pub type ServerView = (Vec<ChannelReport>, Vec<String>, usize);

/// What a scrape reports, gathered when it comes.
pub struct Sources {
    /// The server's counters.
    pub channels: Box<dyn Fn() -> ServerView + Send>,
    /// The file system's counters.
    pub fs: Box<dyn Fn() -> fs::FsStats + Send>,
    /// The volume's data capacity and free bytes.
    pub space: Box<dyn Fn() -> (u64, u64) + Send>,
    /// Each cache export's name and counters.
    pub caches: Box<dyn Fn() -> Vec<(String, cachedev::CacheStats)> + Send>,
}

/// A running metrics endpoint; [`Metrics::stop`] ends it.
pub struct Metrics {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read.
const MAX_REQUEST_BYTES: usize = 8 << 10;

impl Metrics {
    /// Listens on `address` and serves scrapes from clients in `allow` (empty: anyone).
    pub fn start(address: &str, allow: Vec<Cidr>, sources: Sources) -> Result<Self> {
        let listener = TcpListener::bind(address)
            .with_context(|| format!("--metrics {address}: listening (is it in use?)"))?;
        listener
            .set_nonblocking(true)
            .context("--metrics: a non-blocking listener")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            if !allow.is_empty() && !allow.iter().any(|c| c.contains(peer.ip())) {
                                tracing::warn!(%peer, "metrics request refused: the address is not in --allow");
                                continue;
                            }
                            if let Err(e) = answer(stream, &sources) {
                                tracing::debug!(%peer, error = %e, "metrics request failed");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics: accept failed");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .context("starting the metrics thread")?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops answering (before the file system closes).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request head and answers it; the connection then closes.
fn answer(mut stream: TcpStream, sources: &Sources) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST_BYTES {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head too large\n",
            );
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = render(sources);
            let body = if method == "HEAD" {
                String::new()
            } else {
                body
            };
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
        }
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "locus serves its metrics at /metrics\n",
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, kind: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// A label value, escaped as the text format asks.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family in Prometheus text: its help, type and samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn new<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, String)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{key}=\"{}\"", label(value));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Every metric, now.
pub fn render(sources: &Sources) -> String {
    let (channels, exports, negotiating) = (sources.channels)();
    let mut out = String::new();
    let where_ = |c: &ChannelReport| {
        vec![
            ("channel", c.id.to_string()),
            (
                "node",
                c.spec
                    .node
                    .map_or_else(|| "unknown".into(), |n| n.to_string()),
            ),
        ]
    };
    let per_channel = |out: &mut String,
                       name: &str,
                       kind: &str,
                       help: &str,
                       value: &dyn Fn(&ChannelReport) -> u64| {
        let mut f = Family::new(out, name, kind, help);
        for c in &channels {
            f.sample(name, &where_(c), value(c));
        }
    };
    per_channel(
        &mut out,
        "locus_nbd_connections_total",
        "counter",
        "Connections accepted by each channel.",
        &|c| c.stats.connections,
    );
    per_channel(
        &mut out,
        "locus_nbd_open_connections",
        "gauge",
        "Connections open on each channel (negotiating or in transmission).",
        &|c| c.stats.open_connections,
    );
    {
        let mut f = Family::new(
            &mut out,
            "locus_nbd_negotiating_connections",
            "gauge",
            "Connections still negotiating (limited by --max-negotiating).",
        );
        f.sample("locus_nbd_negotiating_connections", &[], negotiating);
    }
    // A counter per channel split by one label's values.
    let per_channel_by =
        |out: &mut String,
         name: &str,
         help: &str,
         label: &'static str,
         values: &dyn Fn(&ChannelReport) -> Vec<(&'static str, u64)>| {
            let mut f = Family::new(out, name, "counter", help);
            for c in &channels {
                for (value, n) in values(c) {
                    let mut labels = where_(c);
                    labels.push((label, value.into()));
                    f.sample(name, &labels, n);
                }
            }
        };
    per_channel_by(
        &mut out,
        "locus_nbd_payloads_total",
        "Write payloads received, by where they landed: on the channel's node, elsewhere, or with no node known.",
        "placement",
        &|c| {
            vec![
                ("on_node", c.stats.payloads_on_node),
                ("off_node", c.stats.payloads_off_node),
                ("unplaced", c.stats.payloads_unplaced),
            ]
        },
    );
    per_channel_by(
        &mut out,
        "locus_nbd_request_waits_total",
        "Waits of connection threads for their clients' next requests, by how they ended: caught while polling the socket, or after sleeping in a receive.",
        "how",
        &|c| {
            vec![
                ("polled", c.stats.waits_polled),
                ("slept", c.stats.waits_slept),
            ]
        },
    );
    per_channel_by(
        &mut out,
        "locus_nbd_thread_moves_total",
        "Moves of connection threads onto the CPU their client's requests arrive on (to=client) and back onto their channel's CPUs (to=channel); see --pin.",
        "to",
        &|c| {
            vec![
                ("client", c.stats.moves_to_client),
                ("channel", c.stats.moves_to_channel),
            ]
        },
    );
    let by_export = |c: &ChannelReport, i: usize| {
        let mut labels = where_(c);
        labels.push(("export", exports[i].clone()));
        labels
    };
    {
        let name = "locus_nbd_requests_total";
        let mut f = Family::new(
            &mut out,
            name,
            "counter",
            "Requests that succeeded, by channel, export and kind (read, write, other).",
        );
        for c in &channels {
            for (i, s) in c.exports.iter().enumerate() {
                for (kind, n) in [("read", s.reads), ("write", s.writes), ("other", s.others)] {
                    let mut labels = by_export(c, i);
                    labels.push(("kind", kind.into()));
                    f.sample(name, &labels, n);
                }
            }
        }
    }
    for (name, help, value) in [
        (
            "locus_nbd_request_errors_total",
            "Requests answered with an error.",
            (|s: &nbd::server::RequestSnapshot| s.errors)
                as fn(&nbd::server::RequestSnapshot) -> u64,
        ),
        (
            "locus_nbd_read_bytes_total",
            "Bytes read by clients.",
            |s| s.read_bytes,
        ),
        (
            "locus_nbd_written_bytes_total",
            "Bytes written by clients (durable when counted).",
            |s| s.written_bytes,
        ),
    ] {
        let mut f = Family::new(&mut out, name, "counter", help);
        for c in &channels {
            for (i, s) in c.exports.iter().enumerate() {
                f.sample(name, &by_export(c, i), value(s));
            }
        }
    }
    {
        let name = "locus_nbd_request_duration_seconds";
        let mut f = Family::new(
            &mut out,
            name,
            "histogram",
            "Time from a request's arrival to its reply, by channel and export.",
        );
        for c in &channels {
            for (i, s) in c.exports.iter().enumerate() {
                let mut seen = 0u64;
                // The last bucket holds everything slower: it is +Inf's.
                for (bucket, n) in s.latency.iter().enumerate().take(LATENCY_BUCKETS - 1) {
                    seen += n;
                    let mut labels = by_export(c, i);
                    labels.push(("le", format!("{:e}", (1u64 << bucket) as f64 / 1e6)));
                    f.sample(&format!("{name}_bucket"), &labels, seen);
                }
                let mut labels = by_export(c, i);
                labels.push(("le", "+Inf".into()));
                f.sample(&format!("{name}_bucket"), &labels, s.requests());
                f.sample(
                    &format!("{name}_sum"),
                    &by_export(c, i),
                    s.latency_ns_sum as f64 / 1e9,
                );
                f.sample(&format!("{name}_count"), &by_export(c, i), s.requests());
            }
        }
    }
    let fs = (sources.fs)();
    let (capacity, free) = (sources.space)();
    for (name, kind, help, value) in [
        (
            "locus_volume_capacity_bytes",
            "gauge",
            "Bytes of the volume's devices the file system may use.",
            capacity as f64,
        ),
        (
            "locus_volume_free_bytes",
            "gauge",
            "Bytes free on the volume.",
            free as f64,
        ),
        (
            "locus_fs_checkpoint_lag_operations",
            "gauge",
            "Operations logged since the oldest record the checkpoint has not finished.",
            fs.checkpoint_lag as f64,
        ),
        (
            "locus_fs_records_pending",
            "gauge",
            "Logged writes not yet moved into their files.",
            fs.records_pending as f64,
        ),
        (
            "locus_fs_checkpoint_batches_total",
            "counter",
            "Checkpoint batches committed.",
            fs.checkpoint_batches as f64,
        ),
        (
            "locus_fs_writer_give_ways_total",
            "counter",
            "Times a writer found the checkpoint more than 4096 records behind and gave up \
             its time slice to it.",
            fs.writer_give_ways as f64,
        ),
        (
            "locus_fs_unrecycled_blocks_total",
            "counter",
            "Blocks that remapped writes replaced which the recycled-page lists had no room \
             for, returned to the volume as pieces under 64 KiB (stays near zero without data \
             checksums; a count that keeps growing means free memory is being cut into pages).",
            fs.unrecycled_blocks as f64,
        ),
        (
            "locus_fs_snapshots_total",
            "counter",
            "Snapshots of the file system's metadata written (each holds metadata operations \
             off while it is written).",
            fs.snapshots as f64,
        ),
        (
            "locus_fs_snapshot_bytes",
            "gauge",
            "Bytes of the newest snapshot.",
            fs.snapshot_bytes as f64,
        ),
        (
            "locus_fs_snapshot_pause_seconds_total",
            "counter",
            "Time snapshots held metadata operations off, all together.",
            fs.snapshot_pause_total_ns as f64 / 1e9,
        ),
        (
            "locus_fs_snapshot_pause_last_seconds",
            "gauge",
            "How long the last snapshot held metadata operations off.",
            fs.snapshot_pause_last_ns as f64 / 1e9,
        ),
        (
            "locus_fs_snapshot_pause_max_seconds",
            "gauge",
            "The longest time a snapshot held metadata operations off since the volume was \
             opened.",
            fs.snapshot_pause_max_ns as f64 / 1e9,
        ),
        (
            "locus_fs_slot_turns_total",
            "counter",
            "Operations done on a turn on a shared thread slot, by threads that found every \
             slot a thread may own taken (`locus tune --thread-slots` raises the limit).",
            fs.slot_turns as f64,
        ),
        (
            "locus_fs_slot_turn_waits_total",
            "counter",
            "Turns on a shared thread slot that waited for another thread's turn to end.",
            fs.slot_turn_waits as f64,
        ),
        (
            "locus_fs_caller_bytes_total",
            "counter",
            "Bytes callers asked the file system to write.",
            fs.caller_bytes as f64,
        ),
        (
            "locus_fs_media_bytes_total",
            "counter",
            "Bytes stored to persistent memory for them (write amplification: media / caller).",
            fs.media_bytes as f64,
        ),
    ] {
        let mut f = Family::new(&mut out, name, kind, help);
        f.sample(name, &[], value);
    }
    /// A family of one label: name, kind, help, label, and (label value, sample) pairs.
    type Labelled<'a> = (&'a str, &'a str, &'a str, &'a str, &'a [(&'a str, u64)]);
    let labelled: [Labelled<'_>; 3] = [
        (
            "locus_fs_backpressure_waits_total",
            "counter",
            "Times a writer waited for the checkpoint, by what it lacked: log (a free record \
             slot in its thread's log area), buffers (a preliminary buffer whose writes are all \
             checkpointed), space (free memory on the volume), journal (room in a metadata \
             journal).",
            "reason",
            &[
                ("log", fs.waits_for_log),
                ("buffers", fs.waits_for_buffers),
                ("space", fs.waits_for_space),
                ("journal", fs.waits_for_journal),
            ],
        ),
        (
            "locus_fs_defragmented_windows_total",
            "counter",
            "2 MiB windows of files rewritten into one extent while no caller wrote, by what \
             paid for it: writes (the rewrites' budget, 1/20 of the bytes written) or reads (a \
             window read about its size in scattered pieces). Their bytes count in \
             locus_fs_media_bytes_total.",
            "earned_by",
            &[
                (
                    "writes",
                    // The two counters are read one after the other.
                    fs.defragmented_windows
                        .saturating_sub(fs.defragmented_for_reads),
                ),
                ("reads", fs.defragmented_for_reads),
            ],
        ),
        (
            "locus_fs_defrag_windows",
            "gauge",
            "Windows waiting to be rewritten: noted (looked at in the next idle spell) or \
             deferred (until more writes add budget, reads earn them, or space frees up).",
            "state",
            &[
                ("noted", fs.defrag_windows_noted),
                ("deferred", fs.defrag_windows_deferred),
            ],
        ),
    ];
    for (name, kind, help, label, samples) in labelled {
        let mut f = Family::new(&mut out, name, kind, help);
        for &(value, sample) in samples {
            f.sample(name, &[(label, value.to_owned())], sample);
        }
    }
    let caches = (sources.caches)();
    if !caches.is_empty() {
        type Field = fn(&cachedev::CacheStats) -> f64;
        let fields: [(&str, &str, &str, Field); 9] = [
            (
                "locus_cache_accesses_total",
                "counter",
                "Block accesses.",
                |s| s.accesses as f64,
            ),
            (
                "locus_cache_read_hits_total",
                "counter",
                "Reads served from DRAM or NVRAM.",
                |s| s.read_hits as f64,
            ),
            (
                "locus_cache_write_hits_total",
                "counter",
                "Writes to blocks already dirty in NVRAM.",
                |s| s.write_hits as f64,
            ),
            (
                "locus_cache_backing_reads_total",
                "counter",
                "Blocks read from the backing store for the policy.",
                |s| s.backing_reads as f64,
            ),
            (
                "locus_cache_writebacks_total",
                "counter",
                "Blocks written to the backing store.",
                |s| s.writebacks as f64,
            ),
            (
                "locus_cache_dirty_blocks",
                "gauge",
                "Dirty blocks in NVRAM awaiting write-back.",
                |s| s.dirty_blocks as f64,
            ),
            (
                "locus_cache_clean_blocks",
                "gauge",
                "Clean blocks in DRAM.",
                |s| s.clean_blocks as f64,
            ),
            (
                "locus_cache_backing_operations_total",
                "counter",
                "Backing-store operations (reads, writes, syncs).",
                |s| s.backing_ops as f64,
            ),
            (
                "locus_cache_backing_seconds_total",
                "counter",
                "Time spent in backing-store operations.",
                |s| s.backing_ns as f64 / 1e9,
            ),
        ];
        for (name, kind, help, value) in fields {
            let mut f = Family::new(&mut out, name, kind, help);
            for (export, stats) in &caches {
                f.sample(name, &[("export", export.clone())], value(stats));
            }
        }
    }
    out
}
