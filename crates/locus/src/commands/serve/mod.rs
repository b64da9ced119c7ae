//! `locus serve`: files of the volume's file system served over NBD, with one channel per
//! NUMA node.

pub mod control;
mod metrics;
mod spec;

use std::io::Write as _;
use std::net::{IpAddr, TcpListener};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use nbd::server::{
    ChannelReport, ChannelSpec, Cidr, Exports, Inherited, Listener, Server, ServerConfig, Snapshot,
    Submit, TerminationSignals, Tls, TlsMode,
};
use topology::Topology;

use exports::{AnyExport, CacheExport, ExportSpec, FsExport};
use spec::Spec;

use crate::size::{format_bytes, parse_size};

/// Where the default export lives in the file system.
const DEFAULT_EXPORT_PATH: &str = "/exports/default";
/// The default export's name (the empty name also selects it).
const DEFAULT_EXPORT_NAME: &str = "default";
/// The default export's size when it is created.
const DEFAULT_EXPORT_BYTES: u64 = 1 << 30;
/// IANA's NBD port.
const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// Serve files of the volume's file system over NBD.
///
/// Any NBD client can use the exports with no locus code: the Linux kernel (nbd-client),
/// qemu (nbd:// disks, qemu-img, qemu-io), libnbd's nbdinfo, nbdcopy and nbdsh, and fio's
/// nbd engine. With no --export, serves the default export: a 1 GiB file (/exports/default,
/// created on first use, sparse) answering the name "default" and the empty name, so
/// `nbdinfo nbd://localhost` works as is. With --export, the first export answers the
/// empty name. The volume is the embedded default unless --volume (or LOCUS_VOLUME) names
/// another; when there is none, the embedded default is created at the default location or
/// in an empty directory (anywhere else: "no volume at ...").
///
/// Every write is durable in persistent memory before its reply is sent (FLUSH and FUA are
/// barriers with nothing left to do), so the export advertises multi-connection safety.
/// Write payloads are copied with non-temporal stores into persistent buffers on the
/// receiving channel's node, which become the file's data.
///
/// Channels: one per NUMA node with CPUs (--channels to change). A channel's threads are
/// pinned to its node's CPUs; a TCP connection goes to a channel of the node of the NIC it
/// arrived on, loopback and Unix-socket connections are spread round-robin.
///
/// Listens on 127.0.0.1:10809 unless --listen or --unix say otherwise; under systemd-style
/// socket activation (LISTEN_PID/LISTEN_FDS, as `nbdinfo -- [ locus serve ]` does) it serves the
/// inherited sockets instead. SIGINT, SIGTERM or SIGHUP stop it: no new connections, every
/// request in progress finished and answered, everything checkpointed, the volume closed.
///
/// Exit status: 0 after a clean stop; 1 if it could not start (bad export, busy address,
/// unusable volume) or could not stop cleanly; 2 for bad arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// TCP address to listen on (repeatable). Default 127.0.0.1:10809 when neither --listen
    /// nor --unix is given.
    #[arg(long, value_name = "ADDR:PORT", value_parser = listen_address)]
    listen: Vec<String>,

    /// Unix-domain socket to listen on (repeatable); a stale socket file there is replaced.
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,

    /// Permissions of the --unix socket files, in octal: who may connect (writing to a socket
    /// is connecting). The default lets only this user in; 0660 with --unix-group admits a
    /// group.
    #[arg(long, value_name = "OCTAL", default_value = "0600", value_parser = parse_mode)]
    unix_mode: u32,

    /// Group owning the --unix socket files (a name or a number).
    #[arg(long, value_name = "GROUP")]
    unix_group: Option<String>,

    /// TCP clients allowed to connect, as address ranges (repeatable): 192.168.1.0/24,
    /// 10.1.2.3, fd00::/8, or `all`. Default: with --tls require, all; otherwise this host
    /// only (loopback and the host's own addresses), since plain NBD authenticates nobody.
    /// Others are closed at once with a warning naming them. Unix-socket clients are
    /// governed by --unix-mode.
    #[arg(long, value_name = "CIDR|all", value_parser = parse_allow)]
    allow: Vec<AllowArg>,

    /// TLS: off; on (clients may upgrade with STARTTLS, nbds:// URIs, or stay plain);
    /// require (nothing but STARTTLS is answered before TLS). Default: require when
    /// --tls-certificates or --tls-psk is given, else off.
    #[arg(long, value_enum, value_name = "MODE")]
    tls: Option<TlsArg>,

    /// Directory of X.509 credentials in PEM, named as qemu and nbdkit name them:
    /// server-cert.pem (the server's certificate, then any intermediates), server-key.pem,
    /// and with --tls-verify-peer ca-cert.pem.
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    tls_certificates: Option<PathBuf>,

    /// Pre-shared keys instead of certificates: a file of `identity:hexkey` lines, as
    /// `psktool -u NAME -p FILE` makes them and qemu (tls-creds-psk) and libnbd
    /// (tls-psk-file=) read them. Keep it mode 0600. Re-read when it has changed as each
    /// connection starts TLS: added and removed identities count from the next connection;
    /// a file that no longer parses is a warning, and the keys read before stay.
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,

    /// Require a client certificate signed by the directory's ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    tls_verify_peer: bool,

    /// An export (repeatable): NAME=fs:/PATH[,size=SIZE][,ro] or
    /// NAME=cache:PATH,nvram=SIZE,dram=SIZE[,policy=nbm|nvlru|lru].
    ///
    /// fs: a file of the file system. It is created (with its directories) when missing,
    /// which needs size=; an existing file is grown to size= (never shrunk). ro serves an
    /// existing file read-only.
    ///
    /// cache: the block device or file at PATH (opened O_DIRECT, read and written through
    /// io_uring) behind a cache: nvram= bytes of the volume's persistent memory for written
    /// blocks (a write is durable once there; the file /.cache/NAME.nvram), dram= bytes of
    /// memory for read blocks, the policy deciding (nbm, the default; nvlru; lru, one LRU over
    /// both sizes). A restart recovers the blocks NVRAM holds. See docs/cache.md.
    #[arg(
        long = "export",
        value_name = "NAME=fs:/PATH[,size=SIZE][,ro] | NAME=cache:PATH,nvram=SIZE,dram=SIZE[,policy=P]",
        value_parser = spec::parse
    )]
    exports: Vec<Spec>,

    /// On a clean stop, write every cache export's dirty blocks back to its backing store
    /// (which is then complete on its own, e.g. to be used without locus). Without it, dirty
    /// blocks stay in NVRAM and the next start serves them again.
    #[arg(long)]
    writeback_on_stop: bool,

    /// Do not defragment while idle. By default, once no write has come for 100 ms, 2 MiB
    /// windows of files that small overwrites scattered (64 or more pieces) are rewritten
    /// into one extent each, so later reads gather one piece of memory instead of hundreds;
    /// the rewrites count as media writes. See docs/defrag.md.
    #[arg(long)]
    pub no_defrag: bool,

    /// Size of the default export when there is no --export: created with it, or grown to
    /// it (default 1G on creation, else the file's size).
    #[arg(long, value_name = "SIZE", value_parser = parse_export_size)]
    default_size: Option<u64>,

    /// Channels (default: one per NUMA node with CPUs). Channel i runs on node i modulo the
    /// number of nodes.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    channels: Option<u32>,

    /// inline: a connection's thread executes each request itself (the paper's faster
    /// design); queued: it queues requests for its channel's worker threads, which reply out
    /// of order.
    #[arg(long, value_enum, default_value_t = SubmitArg::Inline)]
    submit: SubmitArg,

    /// Worker threads per channel with --submit queued.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,

    /// Most connections using exports; a client asking for an export beyond them is refused
    /// with a policy error. Each connection writing inline uses one of the file system's
    /// writer slots (63 by default).
    #[arg(long, value_name = "N", default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_connections: u32,

    /// Most connections still negotiating (they do not count against --max-connections); one
    /// more ends the oldest negotiation, with a warning, so clients that connect and never
    /// finish negotiating cannot keep others out.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_negotiating: u32,

    /// Most connections from one client address, negotiating or not (TCP). 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=65536))]
    max_connections_per_peer: u32,

    /// Seconds a client has to finish negotiating, from its connection — a deadline, not an
    /// idle timeout: a client that trickles bytes is closed at it like a silent one.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    handshake_timeout: u64,

    /// Longest a connection's thread polls its socket for the client's next request before
    /// it sleeps, in microseconds (0: never poll). Waking a sleeping thread costs more than
    /// serving a small request, so a client with one request in flight is answered up to
    /// twice as fast when its next request is caught by polling. The window adapts per
    /// connection: it grows while requests follow each other closely, shrinks to nothing
    /// on a connection that goes quiet, and a busy connection (requests already waiting)
    /// never polls; between tries the thread yields its CPU to anything else runnable.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = nbd::server::DEFAULT_POLL.as_micros() as u64, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    poll_us: u64,

    /// Where a connection's thread runs (inline submission). client: on its channel's CPUs,
    /// except while it waits on its client for small requests (before 7 in 8 of its last
    /// 128 requests, averaging at most 32 KiB) whose data the kernel receives on one CPU of
    /// the channel two windows running (over loopback the client's own CPU) — then on that
    /// CPU, so that request and reply wake threads on one CPU instead of interrupting
    /// another; with fio pinned to a CPU at queue depth 1 that served 4x as many requests
    /// on the development VM. A client the scheduler keeps moving is followed less and less
    /// often. node: always on the channel's CPUs. Unix-socket connections stay there too
    /// (the kernel records no receiving CPU for them). See docs/nbd.md.
    #[arg(long, value_enum, default_value_t = PinArg::Client)]
    pin: PinArg,

    /// Serve the counters as Prometheus text at http://ADDR:PORT/metrics (per channel and
    /// export: requests, bytes, errors, a latency histogram; connections; checkpoint lag;
    /// free space; cache exports' hits and write-backs). Scrapers are admitted by --allow
    /// like NBD clients. See docs/nbd.md.
    #[arg(long, value_name = "ADDR:PORT", value_parser = listen_address)]
    metrics: Option<String>,

    /// Print every channel's counters (requests, bytes, errors, latency) every SECONDS to
    /// stderr. They are always printed once at shutdown.
    #[arg(long, value_name = "SECONDS", value_parser = parse_interval)]
    stats_interval: Option<Duration>,

    /// Print the counters as JSON, one object per channel and report on its own line
    /// (fields: report, channel, node, cpus, ran_on_cpus, connections, open_connections,
    /// requests, reads, read_bytes, writes, written_bytes, others, errors, latency_us,
    /// payloads, waits; see docs/nbd.md).
    #[arg(long)]
    stats_json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TlsArg {
    Off,
    On,
    Require,
}

/// The TLS settings the arguments ask for.
fn tls(args: &ServeArgs) -> Result<Option<Tls>> {
    enum Credentials<'a> {
        X509(&'a Path),
        Psk(&'a Path),
    }
    // clap keeps --tls-certificates and --tls-psk apart.
    let credentials = match (&args.tls_certificates, &args.tls_psk) {
        (Some(dir), _) => Some(Credentials::X509(dir)),
        (None, Some(_)) if args.tls_verify_peer => bail!(
            "--tls-verify-peer checks client certificates; with --tls-psk a client proves \
             itself with its key"
        ),
        (None, Some(file)) => Some(Credentials::Psk(file)),
        (None, None) => None,
    };
    let (mode, credentials) = match (args.tls, credentials) {
        (None | Some(TlsArg::Off), None) => return Ok(None),
        (Some(TlsArg::Off), Some(_)) => {
            bail!("--tls off excludes --tls-certificates and --tls-psk")
        }
        (Some(TlsArg::On | TlsArg::Require), None) => {
            bail!(
                "--tls needs credentials: --tls-certificates DIR (server-cert.pem, \
                 server-key.pem) or --tls-psk FILE (identity:hexkey lines)"
            )
        }
        (Some(TlsArg::On), Some(credentials)) => (TlsMode::On, credentials),
        (None | Some(TlsArg::Require), Some(credentials)) => (TlsMode::Require, credentials),
    };
    let tls = match credentials {
        Credentials::X509(dir) => Tls::x509(dir, args.tls_verify_peer, mode)
            .with_context(|| format!("loading TLS credentials from {}", dir.display()))?,
        Credentials::Psk(file) => Tls::psk(file, mode)
            .with_context(|| format!("loading TLS pre-shared keys from {}", file.display()))?,
    };
    Ok(Some(tls))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PinArg {
    Client,
    Node,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SubmitArg {
    Inline,
    Queued,
}

/// An `--allow` value.
#[derive(Debug, Clone)]
enum AllowArg {
    All,
    Range(Cidr),
}

fn parse_allow(text: &str) -> Result<AllowArg, String> {
    if text == "all" {
        Ok(AllowArg::All)
    } else {
        text.parse().map(AllowArg::Range)
    }
}

fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "{text:?}: permissions in octal, 0000 to 0777 (e.g. 0660)"
        )),
    }
}

/// The TCP clients let in: `--allow`, or by default everyone when TLS is required and this
/// host's own addresses otherwise.
fn allowed(args: &ServeArgs, tls: Option<&Tls>) -> Vec<Cidr> {
    if args.allow.iter().any(|a| matches!(a, AllowArg::All)) {
        return Vec::new();
    }
    if args.allow.is_empty() && tls.is_some_and(|t| t.mode() == TlsMode::Require) {
        return Vec::new();
    }
    if !args.allow.is_empty() {
        return args
            .allow
            .iter()
            .filter_map(|a| match a {
                AllowArg::Range(c) => Some(*c),
                AllowArg::All => None,
            })
            .collect();
    }
    let mut own: Vec<Cidr> = vec![
        "127.0.0.0/8".parse().expect("a range"),
        "::1".parse().expect("a range"),
    ];
    match nbd::server::interface_addresses() {
        Ok(addresses) => own.extend(addresses.into_iter().map(|(_, ip)| Cidr::host(ip))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this host's addresses; admitting loopback only");
        }
    }
    own
}

fn parse_export_size(text: &str) -> Result<u64, String> {
    exports::check_size(parse_size(text)?)
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.1..=86_400.0).contains(&seconds) {
        return Err(format!("{seconds} s: 0.1 to 86400"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

pub fn run(dir: &Path, sysfs: &Path, args: &ServeArgs) -> Result<()> {
    // Before any thread starts, so that every thread inherits the mask and the signals are
    // taken only by `wait` below.
    let signals = TerminationSignals::block().context("blocking termination signals")?;
    for (i, spec) in args.exports.iter().enumerate() {
        if args.exports[..i]
            .iter()
            .any(|other| other.name() == spec.name())
        {
            bail!("export name {:?} is given twice", spec.name());
        }
    }
    if let Some(path) = args.unix.iter().find(|p| control::is_socket_of(p, dir)) {
        bail!(
            "--unix {}: that name in the volume directory is the server's control socket \
             (`locus status` asks the server there); give the NBD socket another path",
            path.display()
        );
    }
    let tls = tls(args)?;
    let listeners = listeners(args)?;
    // Until the server owns the listeners (and removes their socket files when it stops), a
    // failed start removes the socket files it created.
    let mut sockets = SocketFiles(args.unix.clone());
    let volume = Arc::new(super::volume::open_or_create_default(dir, sysfs, true)?);
    let topology = volume.topology().clone();
    let options = fs::FsOptions {
        defrag: !args.no_defrag,
        ..fs::FsOptions::default()
    };
    let fs = fs::Fs::open(Arc::clone(&volume), options).map_err(|e| match e {
        fs::FsError::NoFileSystem => anyhow::anyhow!(
            "the volume at {} has no file system; create one with `locus format --force`",
            dir.display()
        ),
        e => anyhow::Error::new(e).context(format!("opening the file system at {}", dir.display())),
    })?;
    let replayed = fs.replayed();
    if replayed.any() {
        eprintln!(
            "locus: the volume was not stopped cleanly; recovery replayed {} logged write(s) ({}) \
             and {} metadata operation(s): every acknowledged write is back{}",
            replayed.log_records,
            format_bytes(replayed.log_bytes),
            replayed.journal_records,
            crate::commands::torn_note(replayed.torn_writes)
        );
    }
    let specs = if args.exports.is_empty() {
        vec![Spec::Fs(ExportSpec {
            name: DEFAULT_EXPORT_NAME.into(),
            path: DEFAULT_EXPORT_PATH.into(),
            size: args.default_size.or_else(|| {
                fs.stat(DEFAULT_EXPORT_PATH)
                    .is_err()
                    .then_some(DEFAULT_EXPORT_BYTES)
            }),
            read_only: false,
        })]
    } else {
        args.exports.clone()
    };
    let mut entries = Vec::with_capacity(specs.len());
    for spec in &specs {
        let export = match spec {
            Spec::Fs(spec) => AnyExport::Fs(FsExport::open(&fs, spec)?),
            Spec::Cache(spec) => {
                let export = CacheExport::open(&fs, spec)?;
                let stats = export.stats();
                if stats.dirty_blocks > 0 {
                    eprintln!(
                        "locus: cache {}: recovered {} dirty block(s) from NVRAM, awaiting \
                         write-back to {}",
                        spec.name,
                        stats.dirty_blocks,
                        spec.backing.display()
                    );
                }
                AnyExport::Cache(Box::new(export))
            }
        };
        entries.push((spec.name().to_owned(), Arc::new(export)));
    }
    let caches: Vec<(String, Arc<AnyExport>)> = entries
        .iter()
        .filter(|(_, e)| matches!(**e, AnyExport::Cache(_)))
        .cloned()
        .collect();
    // Exports may be sparse and larger than the volume (writes past its free space get
    // ENOSPC, and the server keeps serving), but an operator should know before a client
    // finds out.
    let capacity = volume.data_bytes();
    let exported: u64 = entries
        .iter()
        .map(|(_, e)| nbd::server::Export::size(&**e))
        .sum();
    if exported > capacity {
        eprintln!(
            "locus: warning: the exports add up to {} on a volume of {}: writes beyond its free \
             space will fail with ENOSPC",
            format_bytes(exported),
            format_bytes(capacity)
        );
    }
    let exports = Exports::new(entries).map_err(anyhow::Error::msg)?;
    let channels = channel_specs(&topology, args.channels);
    let allow = allowed(args, tls.as_ref());
    let config = ServerConfig {
        submit: match args.submit {
            SubmitArg::Inline => Submit::Inline,
            SubmitArg::Queued => Submit::Queued,
        },
        workers_per_channel: args.workers as usize,
        max_connections: args.max_connections as usize,
        max_negotiating: args.max_negotiating as usize,
        max_per_peer: args.max_connections_per_peer as usize,
        allow: allow.clone(),
        tls,
        handshake_timeout: Duration::from_secs(args.handshake_timeout),
        poll: Duration::from_micros(args.poll_us),
        follow_client: args.pin == PinArg::Client,
        ..ServerConfig::default()
    };
    let config_requires_tls = config
        .tls
        .as_ref()
        .is_some_and(|t| t.mode() == TlsMode::Require);
    let tls_said = config.tls.as_ref().map(|t| match t.mode() {
        TlsMode::On => format!("TLS optional ({})", t.kind()),
        TlsMode::Require => format!("TLS required ({})", t.kind()),
    });
    let mut server = Server::new(config, exports, channels, nic_nodes(&topology));
    let mut places = Vec::new();
    for listener in &listeners {
        if let Listener::Tcp(l) = listener
            && args.allow.is_empty()
            && !config_requires_tls
            && l.local_addr().is_ok_and(|a| !a.ip().is_loopback())
        {
            eprintln!(
                "locus: {} admits only this host's own addresses; --allow RANGE (or --allow all) \
                 lets other hosts connect",
                listener.describe()
            );
        }
    }
    for listener in listeners {
        places.push(listener.describe());
        server.listen(listener);
    }
    sockets.0.clear();
    let described: Vec<String> = specs
        .iter()
        .map(|s| match s {
            Spec::Fs(s) => format!(
                "{} ({}{})",
                s.name,
                s.path,
                if s.read_only { ", ro" } else { "" }
            ),
            Spec::Cache(s) => format!(
                "{} (cache of {}, nvram {}, dram {}, {})",
                s.name,
                s.backing.display(),
                format_bytes(s.config.nvram_bytes),
                format_bytes(s.config.dram_bytes),
                s.config.policy.name()
            ),
        })
        .collect();
    eprintln!(
        "locus: serving {} on {} with {} ({} submission{}); stop with Ctrl-C or SIGTERM",
        described.join(", "),
        places.join(", "),
        describe_channels(&server.channels()),
        match args.submit {
            SubmitArg::Inline => "inline",
            SubmitArg::Queued => "queued",
        },
        tls_said.map_or_else(String::new, |t| format!(", {t}"))
    );

    let metrics = match &args.metrics {
        None => None,
        Some(address) => {
            let monitor = server.monitor();
            let (fs_stats, space_fs) = (fs.clone(), Arc::clone(&volume));
            let cache_list = caches.clone();
            let sources = metrics::Sources {
                channels: Box::new(move || {
                    (
                        monitor.channels(),
                        monitor.export_names(),
                        monitor.negotiating(),
                    )
                }),
                fs: Box::new(move || fs_stats.stats()),
                space: Box::new(move || (space_fs.data_bytes(), space_fs.free_bytes())),
                caches: Box::new(move || {
                    cache_list
                        .iter()
                        .filter_map(|(name, e)| match &**e {
                            AnyExport::Cache(c) => Some((name.clone(), c.stats())),
                            AnyExport::Fs(_) => None,
                        })
                        .collect()
                }),
            };
            let running = metrics::Metrics::start(address, allow, sources)?;
            eprintln!("locus: metrics at http://{address}/metrics");
            Some(running)
        }
    };
    // `locus status` and `locus scrub` of this volume ask here while the server holds it.
    let control = {
        let monitor = server.monitor();
        let (fs, held, scrubbed) = (fs.clone(), Arc::clone(&volume), fs.clone());
        // `locus fsck`: with every export's changes held and the checkpoint between passes,
        // the media hold still while they are read (reads of the exports go on).
        let check: control::Checker = {
            let (fs, dir, topology) = (fs.clone(), dir.to_owned(), volume.topology().clone());
            Box::new(move || {
                let started = Instant::now();
                let report = exports::held_still(|| {
                    fs.quiesced(|| fs::control::check_held(&dir, &topology))
                });
                tracing::info!(
                    held_ms = started.elapsed().as_millis() as u64,
                    "checked the volume for `locus fsck`; writes waited meanwhile"
                );
                serde_json::to_value(report)
                    .unwrap_or_else(|e| serde_json::json!({"error": format!("the report: {e}")}))
            })
        };
        control::Control::start(
            dir,
            move || {
                let channels: Vec<serde_json::Value> = monitor
                    .channels()
                    .iter()
                    .map(|r| stats_json("live", r, &r.stats, None))
                    .collect();
                serde_json::json!({
                    "server": "serve",
                    "server_pid": std::process::id(),
                    "uuid": volume::hex(&held.uuid()),
                    "devices": held.stats(),
                    "fs": fs.stats(),
                    "exports": monitor.export_names(),
                    "channels": channels,
                })
            },
            Some(scrubbed),
            Some(check),
            // A server keeps its volume: its clients come and go.
            None,
            control::Hooks::default(),
        )
        .context("starting the control socket")?
    };
    let stop = Arc::new(AtomicBool::new(false));
    let signal = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let signal = signals.wait();
                stop.store(true, Ordering::Release);
                signal
            })
            .context("starting the signal thread")?
    };
    let mut last = server.channels();
    let mut last_at = Instant::now();
    let tick = args.stats_interval.unwrap_or(Duration::from_secs(3600));
    let mut next = Instant::now() + tick;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50).min(tick));
        if args.stats_interval.is_some() && Instant::now() >= next {
            let now = server.channels();
            print_stats(
                "interval",
                &now,
                Some((&last, last_at.elapsed())),
                args.stats_json,
            );
            print_cache_stats("interval", &caches, args.stats_json);
            last = now;
            last_at = Instant::now();
            next += tick;
        }
    }
    let signal = signal
        .join()
        .map_err(|_| anyhow::anyhow!("the signal thread panicked"))?
        .context("waiting for a signal")?;
    eprintln!("locus: signal {signal}: stopping — finishing requests in progress");
    drop(control);
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    let reports = server.shutdown();
    print_stats("total", &reports, None, args.stats_json);
    print_cache_stats("total", &caches, args.stats_json);
    if args.writeback_on_stop {
        for (name, export) in &caches {
            if let AnyExport::Cache(cache) = &**export {
                let done = cache.write_back_all().with_context(|| {
                    format!(
                        "writing cache {name} back to {} (its dirty blocks stay in NVRAM)",
                        cache.backing().display()
                    )
                })?;
                eprintln!(
                    "locus: cache {name}: wrote {} dirty block(s) back; {} is complete on its own",
                    done.blocks,
                    cache.backing().display()
                );
            }
        }
    }
    drop(caches);
    fs.unmount()
        .context("checkpointing and closing the file system")?;
    eprintln!("locus: stopped cleanly; every acknowledged write is in its file");
    Ok(())
}

/// Each cache export's counters: hits, misses, write-backs, dirty blocks, backing-store
/// latency.
fn print_cache_stats(report: &str, caches: &[(String, Arc<AnyExport>)], json: bool) {
    for (name, export) in caches {
        let AnyExport::Cache(cache) = &**export else {
            continue;
        };
        let s = cache.stats();
        let latency_us = if s.backing_ops == 0 {
            0.0
        } else {
            s.backing_ns as f64 / s.backing_ops as f64 / 1000.0
        };
        if json {
            let line = serde_json::json!({
                "report": report,
                "cache": name,
                "policy": cache.policy().name(),
                "stats": s,
                "backing_latency_us": latency_us,
            });
            eprintln!("{line}");
        } else {
            eprintln!(
                "locus: {report}: cache {name} ({}): {} accesses, {} read hits, {} write hits, \
                 {} backing reads, {} write-backs, {} partial-block reads, {} dirty blocks, {} \
                 clean blocks, backing store {} ops at {latency_us:.1} µs",
                cache.policy().name(),
                s.accesses,
                s.read_hits,
                s.write_hits,
                s.backing_reads,
                s.writebacks,
                s.partial_reads,
                s.dirty_blocks,
                s.clean_blocks,
                s.backing_ops
            );
        }
    }
}

/// Unix socket files this start created, removed if it fails before the server owns them.
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `--listen`: an address and a port, a host name allowed (`localhost:10809`, `[::1]:10809`).
fn listen_address(text: &str) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    let example = "e.g. 127.0.0.1:10809, 0.0.0.0:10809 or [::1]:10809";
    if text.parse::<u16>().is_ok() {
        return Err(format!(
            "`{text}` is only a port; --listen takes ADDR:PORT ({example})"
        ));
    }
    if !text.contains(':') {
        return Err(format!(
            "`{text}` has no port; --listen takes ADDR:PORT ({example})"
        ));
    }
    match text.to_socket_addrs().map(|mut addresses| addresses.next()) {
        Ok(Some(_)) => Ok(text.to_owned()),
        Ok(None) => Err(format!("`{text}` names no address")),
        Err(e) => Err(format!("`{text}` is not ADDR:PORT ({example}): {e}")),
    }
}

fn listeners(args: &ServeArgs) -> Result<Vec<Listener>> {
    if let Some(inherited) =
        nbd::server::inherited_listeners().context("adopting sockets from LISTEN_FDS")?
    {
        if !args.listen.is_empty() || !args.unix.is_empty() {
            bail!("--listen/--unix and socket activation (LISTEN_FDS) exclude each other");
        }
        if inherited.is_empty() {
            bail!("socket activation passed no sockets (LISTEN_FDS=0)");
        }
        return Ok(inherited
            .into_iter()
            .map(|i| match i {
                Inherited::Tcp(l) => Listener::Tcp(l),
                Inherited::Unix(l) => Listener::Unix(l, None),
            })
            .collect());
    }
    let mut out = Vec::new();
    let tcp: Vec<&str> = if args.listen.is_empty() && args.unix.is_empty() {
        vec![DEFAULT_LISTEN]
    } else {
        args.listen.iter().map(String::as_str).collect()
    };
    for address in tcp {
        let listener = TcpListener::bind(address)
            .with_context(|| format!("listening on {address} (is another server using it?)"))?;
        out.push(Listener::Tcp(listener));
    }
    let group = args
        .unix_group
        .as_deref()
        .map(|g| nbd::server::group_id(g).with_context(|| format!("--unix-group {g:?}")))
        .transpose()?;
    for path in &args.unix {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                bail!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                );
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{}: another server is listening there", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        let listener = nbd::server::bind_unix(path, args.unix_mode, group)
            .with_context(|| format!("listening on {}", path.display()))?;
        out.push(Listener::Unix(listener, Some(path.clone())));
    }
    Ok(out)
}

/// One channel per node with CPUs, or `count` channels dealt round-robin over those nodes.
fn channel_specs(topology: &Topology, count: Option<u32>) -> Vec<ChannelSpec> {
    let nodes: Vec<ChannelSpec> = topology
        .nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| ChannelSpec {
            node: Some(n.id),
            cpus: n.cpus.clone(),
        })
        .collect();
    if nodes.is_empty() {
        let count = count.unwrap_or(1) as usize;
        return vec![
            ChannelSpec {
                node: None,
                cpus: Vec::new()
            };
            count
        ];
    }
    let count = count.map_or(nodes.len(), |c| c as usize);
    (0..count).map(|i| nodes[i % nodes.len()].clone()).collect()
}

/// This host's addresses on NICs whose node is known.
fn nic_nodes(topology: &Topology) -> Vec<(IpAddr, u32)> {
    let addresses = match nbd::server::interface_addresses() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list interface addresses; connections are spread over channels");
            return Vec::new();
        }
    };
    addresses
        .into_iter()
        .filter_map(|(name, ip)| {
            let node = topology.nics.iter().find(|n| n.name == name)?.node?;
            Some((ip, node))
        })
        .collect()
}

fn describe_channels(reports: &[ChannelReport]) -> String {
    let parts: Vec<String> = reports
        .iter()
        .map(|r| match r.spec.node {
            Some(node) => format!(
                "{} on node {node} (CPUs {})",
                r.id,
                topology::cpulist::format(&r.spec.cpus)
            ),
            None => format!("{} unpinned", r.id),
        })
        .collect();
    format!(
        "{} channel{}: {}",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" },
        parts.join(", ")
    )
}

/// Prints one line per channel: totals, or the change over an interval.
fn print_stats(
    label: &str,
    now: &[ChannelReport],
    interval: Option<(&[ChannelReport], Duration)>,
    json: bool,
) {
    let mut out = std::io::stderr().lock();
    for report in now {
        let (stats, seconds): (Snapshot, Option<f64>) = match interval {
            Some((before, elapsed)) => {
                let before = before
                    .iter()
                    .find(|b| b.id == report.id)
                    .map_or(report.stats, |b| b.stats);
                (report.stats.since(&before), Some(elapsed.as_secs_f64()))
            }
            None => (report.stats, None),
        };
        let line = if json {
            stats_json(label, report, &stats, seconds).to_string()
        } else {
            stats_text(label, report, &stats, seconds)
        };
        let _ = writeln!(out, "{line}");
    }
}

fn stats_text(
    label: &str,
    report: &ChannelReport,
    stats: &Snapshot,
    seconds: Option<f64>,
) -> String {
    let quantile = |q| {
        stats
            .latency_quantile_micros(q)
            .map_or_else(|| "-".to_owned(), |us| format!("<{us} µs"))
    };
    let per_second = seconds
        .filter(|s| *s > 0.0)
        .map(|s| format!(" ({:.0} req/s)", stats.requests() as f64 / s))
        .unwrap_or_default();
    let cpus = stats.cpus_used();
    let ran_on = if cpus.is_empty() {
        "no requests yet".to_owned()
    } else {
        format!("ran on CPUs {}", topology::cpulist::format(&cpus))
    };
    let payloads = stats.payloads_on_node + stats.payloads_off_node + stats.payloads_unplaced;
    let placed = match report.spec.node {
        Some(node) if payloads > 0 => format!(
            "; write payloads: {} on node {node}, {} elsewhere, {} unplaced",
            stats.payloads_on_node, stats.payloads_off_node, stats.payloads_unplaced
        ),
        _ => String::new(),
    };
    let waits = if stats.waits_polled + stats.waits_slept > 0 {
        format!(
            "; waits for requests: {} caught polling, {} slept",
            stats.waits_polled, stats.waits_slept
        )
    } else {
        String::new()
    };
    let moves = if stats.moves_to_client + stats.moves_to_channel > 0 {
        format!(
            "; connection threads moved to their clients' CPUs {} times, back {} times",
            stats.moves_to_client, stats.moves_to_channel
        )
    } else {
        String::new()
    };
    format!(
        "locus: {label} channel {}: {} connections ({} open), {} requests{per_second}: {} \
         reads ({}), {} writes ({}), {} other, {} errors; latency p50 {} p99 {} max {}; \
         {ran_on}{placed}{waits}{moves}",
        report.id,
        stats.connections,
        stats.open_connections,
        stats.requests(),
        stats.reads,
        format_bytes(stats.read_bytes),
        stats.writes,
        format_bytes(stats.written_bytes),
        stats.others,
        stats.errors,
        quantile(0.5),
        quantile(0.99),
        quantile(1.0),
    )
}

fn stats_json(
    label: &str,
    report: &ChannelReport,
    stats: &Snapshot,
    seconds: Option<f64>,
) -> serde_json::Value {
    serde_json::json!({
        "report": label,
        "seconds": seconds,
        "channel": report.id,
        "node": report.spec.node,
        "cpus": report.spec.cpus,
        "ran_on_cpus": stats.cpus_used(),
        "connections": stats.connections,
        "open_connections": stats.open_connections,
        "requests": stats.requests(),
        "reads": stats.reads,
        "read_bytes": stats.read_bytes,
        "writes": stats.writes,
        "written_bytes": stats.written_bytes,
        "others": stats.others,
        "errors": stats.errors,
        "latency_us": {
            "p50": stats.latency_quantile_micros(0.5),
            "p99": stats.latency_quantile_micros(0.99),
            "max": stats.latency_quantile_micros(1.0),
        },
        "payloads": {
            "on_node": stats.payloads_on_node,
            "off_node": stats.payloads_off_node,
            "unplaced": stats.payloads_unplaced,
        },
        "waits": {
            "polled": stats.waits_polled,
            "slept": stats.waits_slept,
        },
        "thread_moves": {
            "to_client": stats.moves_to_client,
            "to_channel": stats.moves_to_channel,
        },
    })
}
