//! An NBD server over the codec: listeners, connections placed on NUMA channels, inline or
//! queued request submission, limits, counters, and an orderly stop.
//!
//! Threads: one acceptor per listener; one thread per connection, pinned to its channel's
//! CPUs, which negotiates and then reads requests — and with [`Submit::Inline`] executes
//! each one and replies before reading the next (the Tyche paper's better design: no
//! hand-off, no queue, the data stays in the cache of the CPU that received it). With
//! [`Submit::Queued`] the connection thread receives requests (write payloads included) and
//! queues them on its channel, whose worker threads execute them and reply as they finish,
//! so replies may leave out of order; a connection has at most
//! [`ServerConfig::max_in_flight`] requests and [`ServerConfig::max_in_flight_bytes`] of
//! write payloads queued, after which it stops reading (TCP flow control holds the client
//! back).

mod access;
mod channel;
mod conn;
mod export;
mod follow;
mod inbox;
mod net;
mod poll;
mod psk;
mod stats;
mod sys;
mod tls;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use access::Cidr;
pub use channel::ChannelSpec;
pub use export::{Export, ExportError, Exports, Payload, ReadDebug};
pub use net::Listener;
pub use psk::parse_keys as parse_psk_file;
pub use stats::{LATENCY_BUCKETS, RECORDED_CPUS, RequestSnapshot, Snapshot};
pub use sys::{
    Inherited, TerminationSignals, bind_unix, group_id, inherited_listeners, interface_addresses,
};
pub use tls::{CA_CERT, SERVER_CERT, SERVER_KEY, Tls, TlsMode};

use channel::Channel;
use net::Stream;

/// Minimum block size advertised (and enforced on clients that agreed to it): 1, as qemu-nbd
/// and nbdkit advertise — the file system takes any byte range (partial blocks of a write
/// or trim are read-modify-written), so no client needs to align anything.
pub const MIN_BLOCK_BYTES: u32 = 1;
/// Export sizes are whole sectors of this size (the kernel's NBD client works in them).
pub const SECTOR_BYTES: u32 = 512;
/// Preferred block size advertised: the file system's block.
pub const PREFERRED_BLOCK_BYTES: u32 = 4096;
/// Largest read or write payload accepted (the protocol's portable maximum, 32 MiB).
pub const MAX_PAYLOAD_BYTES: u32 = 32 << 20;
/// Default for [`ServerConfig::poll`]: longer than a queue-depth-1 client's turnaround on
/// the development machine (~20 µs), far shorter than a scheduler tick.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// How requests reach the code that executes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    /// The connection's thread executes each request itself.
    Inline,
    /// The connection's thread queues requests for its channel's workers.
    Queued,
}

impl std::str::FromStr for Submit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inline" => Ok(Self::Inline),
            "queued" => Ok(Self::Queued),
            other => Err(format!("{other:?}: inline or queued")),
        }
    }
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Inline or queued submission.
    pub submit: Submit,
    /// Worker threads per channel with queued submission.
    pub workers_per_channel: usize,
    /// Connections in transmission; a client that asks for an export while this many are
    /// is refused (`NBD_REP_ERR_POLICY` to `NBD_OPT_GO`, a close after `NBD_OPT_EXPORT_NAME`).
    pub max_connections: usize,
    /// Connections still negotiating; one more ends the oldest negotiation, so clients that
    /// open connections and never finish negotiating cannot keep others out (they do not
    /// count against [`Self::max_connections`]).
    pub max_negotiating: usize,
    /// Connections from one client address, negotiating or not (TCP; 0: no limit); more are
    /// closed at once.
    pub max_per_peer: usize,
    /// TCP clients allowed to connect (empty: any); others are closed at once. Unix-socket
    /// clients are governed by the socket file's permissions.
    pub allow: Vec<Cidr>,
    /// TLS (`NBD_OPT_STARTTLS`), optional or required; `None`: STARTTLS is unsupported.
    pub tls: Option<Tls>,
    /// Requests one connection may have queued (queued submission).
    pub max_in_flight: usize,
    /// Write payload bytes one connection may hold in received, not yet committed buffers
    /// (queued submission); a single request larger than this still goes, alone.
    pub max_in_flight_bytes: usize,
    /// A client must finish negotiating within this time.
    pub handshake_timeout: Duration,
    /// Longest a connection's thread polls its socket for the next request before it
    /// sleeps (adapted per connection; zero: never poll). See `server/poll.rs`.
    pub poll: Duration,
    /// Whether a connection's thread (inline submission) that waits on a client of small
    /// requests moves to the CPU of its channel those requests arrive on. See
    /// `server/follow.rs`.
    pub follow_client: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            submit: Submit::Inline,
            workers_per_channel: 2,
            max_connections: 256,
            max_negotiating: 32,
            max_per_peer: 0,
            allow: Vec::new(),
            tls: None,
            max_in_flight: 64,
            max_in_flight_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(30),
            poll: DEFAULT_POLL,
            follow_client: true,
        }
    }
}

/// One channel's placement and counters.
#[derive(Debug, Clone)]
pub struct ChannelReport {
    /// Channel number.
    pub id: usize,
    /// Where it runs.
    pub spec: ChannelSpec,
    /// Its counters.
    pub stats: Snapshot,
    /// Its requests by export, in [`Server::export_names`] order.
    pub exports: Vec<RequestSnapshot>,
}

pub(crate) struct Shared<E: Export> {
    pub(crate) config: ServerConfig,
    pub(crate) exports: Exports<E>,
    channels: Vec<Arc<Channel<E>>>,
    /// Local addresses of NICs with a known node.
    nic_nodes: Vec<(IpAddr, u32)>,
    pub(crate) stopping: AtomicBool,
    next_channel: AtomicUsize,
    /// Connections in transmission (at most `config.max_connections`).
    open: AtomicUsize,
    /// Connections negotiating, oldest first, with who they are (to say so when one is
    /// ended; its socket is in `live`).
    negotiating: Mutex<VecDeque<(u64, String)>>,
    peers: access::PeerCounts,
    next_id: AtomicU64,
    /// A clone of every live connection, to end them at shutdown.
    live: Mutex<HashMap<u64, Stream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A running server. Dropping it without [`Server::shutdown`] leaves its threads serving.
pub struct Server<E: Export> {
    shared: Arc<Shared<E>>,
    acceptors: Vec<(Arc<Listener>, JoinHandle<()>)>,
    workers: Vec<JoinHandle<()>>,
}

impl<E: Export> std::fmt::Debug for Server<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.shared.config)
            .field("channels", &self.shared.channels)
            .finish()
    }
}

impl<E: Export> Server<E> {
    /// A server with one channel per spec (at least one). `nic_nodes` maps this host's
    /// addresses to the node of their NIC; connections arriving on one go to a channel of
    /// that node, all others (loopback, Unix sockets, unknown NICs) are spread round-robin.
    pub fn new(
        config: ServerConfig,
        exports: Exports<E>,
        channels: Vec<ChannelSpec>,
        nic_nodes: Vec<(IpAddr, u32)>,
    ) -> Self {
        assert!(!channels.is_empty(), "a server needs at least one channel");
        let channels: Vec<Arc<Channel<E>>> = channels
            .into_iter()
            .enumerate()
            .map(|(id, spec)| Arc::new(Channel::new(id, spec, exports.len())))
            .collect();
        let workers = match config.submit {
            Submit::Inline => Vec::new(),
            Submit::Queued => channels
                .iter()
                .flat_map(|c| c.start_workers(config.workers_per_channel.max(1)))
                .collect(),
        };
        Self {
            shared: Arc::new(Shared {
                config,
                exports,
                channels,
                nic_nodes,
                stopping: AtomicBool::new(false),
                next_channel: AtomicUsize::new(0),
                open: AtomicUsize::new(0),
                negotiating: Mutex::new(VecDeque::new()),
                peers: access::PeerCounts::default(),
                next_id: AtomicU64::new(1),
                live: Mutex::new(HashMap::new()),
                threads: Mutex::new(Vec::new()),
            }),
            acceptors: Vec::new(),
            workers,
        }
    }

    /// Starts accepting connections on `listener`.
    pub fn listen(&mut self, listener: Listener) {
        let listener = Arc::new(listener);
        let shared = Arc::clone(&self.shared);
        let accepting = Arc::clone(&listener);
        let handle = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || shared.accept_loop(&accepting))
            .expect("spawning an acceptor");
        self.acceptors.push((listener, handle));
    }

    /// Every channel's counters now.
    pub fn channels(&self) -> Vec<ChannelReport> {
        self.shared.reports()
    }

    /// A handle that reads the server's counters from another thread.
    pub fn monitor(&self) -> Monitor<E> {
        Monitor(Arc::clone(&self.shared))
    }
}

/// Reads a running server's counters (from any thread).
pub struct Monitor<E: Export>(Arc<Shared<E>>);

impl<E: Export> std::fmt::Debug for Monitor<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl<E: Export> Monitor<E> {
    /// Every channel's counters now.
    pub fn channels(&self) -> Vec<ChannelReport> {
        self.0.reports()
    }

    /// The exports' names, in the order of [`ChannelReport::exports`].
    pub fn export_names(&self) -> Vec<String> {
        self.0.exports.iter().map(|(n, _)| n.to_owned()).collect()
    }

    /// Connections negotiating now.
    pub fn negotiating(&self) -> usize {
        self.0
            .negotiating
            .lock()
            .expect("negotiating connections")
            .len()
    }
}

impl<E: Export> Server<E> {
    /// Stops accepting, ends every connection after the request it is executing (queued
    /// requests are finished and answered), stops the workers, and returns the final counters.
    pub fn shutdown(self) -> Vec<ChannelReport> {
        let shared = self.shared;
        shared.stopping.store(true, Ordering::Release);
        for (listener, _) in &self.acceptors {
            if let Err(e) = listener.stop() {
                tracing::warn!(listener = %listener.describe(), error = %e, "could not stop accepting");
            }
        }
        for (listener, handle) in self.acceptors {
            let _ = handle.join();
            listener.remove_path();
        }
        for stream in shared.live.lock().expect("live connections").values() {
            stream.shutdown(Shutdown::Read);
        }
        let threads = std::mem::take(&mut *shared.threads.lock().expect("connection threads"));
        for handle in threads {
            let _ = handle.join();
        }
        for channel in &shared.channels {
            channel.close();
        }
        for handle in self.workers {
            let _ = handle.join();
        }
        shared.reports()
    }
}

impl<E: Export> Shared<E> {
    fn reports(&self) -> Vec<ChannelReport> {
        self.channels
            .iter()
            .map(|c| ChannelReport {
                id: c.id,
                spec: c.spec.clone(),
                stats: c.snapshot(),
                exports: c.export_snapshots(),
            })
            .collect()
    }

    fn accept_loop(self: &Arc<Self>, listener: &Listener) {
        loop {
            let accepted = listener.accept();
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            match accepted {
                Ok((stream, local)) => self.start(stream, local),
                Err(e) => {
                    // Out of fds or memory: wait for connections to end rather than spin.
                    tracing::warn!(listener = %listener.describe(), error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn place(&self, local: Option<IpAddr>) -> usize {
        if let Some(ip) = local.filter(|ip| !ip.is_loopback())
            && let Some(&(_, node)) = self.nic_nodes.iter().find(|(a, _)| *a == ip)
        {
            let best = self
                .channels
                .iter()
                .filter(|c| c.spec.node == Some(node))
                .min_by_key(|c| c.counters.open_connections.load(Ordering::Relaxed));
            if let Some(channel) = best {
                return channel.id;
            }
        }
        self.next_channel.fetch_add(1, Ordering::Relaxed) % self.channels.len()
    }

    fn start(self: &Arc<Self>, stream: Stream, local: Option<IpAddr>) {
        let peer = stream.peer();
        let peer_ip = stream.peer_ip();
        if let Some(ip) = peer_ip {
            let allow = &self.config.allow;
            if !allow.is_empty() && !allow.iter().any(|c| c.contains(ip)) {
                tracing::warn!(%peer, "connection refused: the address is not in --allow");
                return;
            }
            if !self.peers.enter(ip, self.config.max_per_peer) {
                tracing::warn!(
                    %peer,
                    limit = self.config.max_per_peer,
                    "connection refused: the address has its maximum of connections open"
                );
                return;
            }
        }
        // From here on the peer's count is released by `Leave` whatever happens.
        let leave = Leave {
            shared: Arc::clone(self),
            peer_ip,
        };
        let mut threads = self.threads.lock().expect("connection threads");
        threads.retain(|t| !t.is_finished());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            tracing::warn!(%peer, "could not duplicate a connection's socket; closing it");
            return;
        };
        self.live
            .lock()
            .expect("live connections")
            .insert(id, clone);
        self.admit_negotiation(id, &peer);
        let shared = Arc::clone(self);
        let channel = Arc::clone(&self.channels[self.place(local)]);
        channel.counters.connections.fetch_add(1, Ordering::Relaxed);
        channel
            .counters
            .open_connections
            .fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-ch{}-c{id}", channel.id))
            .spawn(move || {
                let _leave = leave;
                channel.enter();
                let end = conn::serve(&shared, &channel, id, stream);
                match &end {
                    conn::End::Clean | conn::End::Shutdown => {
                        tracing::debug!(connection = id, channel = channel.id, %peer, "{end}");
                    }
                    conn::End::Io(_) => {
                        tracing::info!(connection = id, channel = channel.id, %peer, "{end}");
                    }
                    // A client that breaks the protocol is an operator's business (a bug
                    // or an attack), as is one turned away: logged at the default level,
                    // with who it was.
                    conn::End::Protocol(_) | conn::End::Refused(_) => {
                        tracing::warn!(connection = id, channel = channel.id, %peer, "{end}");
                    }
                }
                channel
                    .counters
                    .open_connections
                    .fetch_sub(1, Ordering::Relaxed);
                shared.end_negotiation(id);
                shared.live.lock().expect("live connections").remove(&id);
            });
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                tracing::warn!(error = %e, "could not start a connection thread; closing it");
                self.end_negotiation(id);
                self.live.lock().expect("live connections").remove(&id);
            }
        }
    }

    /// Registers a new negotiation; at the limit, the oldest one is ended to make room (a
    /// real client negotiates in milliseconds, so the oldest is the likeliest to be stuck
    /// or hostile).
    fn admit_negotiation(&self, id: u64, peer: &str) {
        let mut negotiating = self.negotiating.lock().expect("negotiating connections");
        while negotiating.len() >= self.config.max_negotiating.max(1) {
            let Some((old, who)) = negotiating.pop_front() else {
                break;
            };
            tracing::warn!(
                connection = old,
                peer = %who,
                limit = self.config.max_negotiating,
                newcomer = %peer,
                "ending the oldest unfinished negotiation: too many connections are negotiating"
            );
            if let Some(stream) = self.live.lock().expect("live connections").get(&old) {
                stream.shutdown(Shutdown::Both);
            }
        }
        negotiating.push_back((id, peer.to_owned()));
    }

    /// Connection `id` finished negotiating (or ended).
    pub(crate) fn end_negotiation(&self, id: u64) {
        let mut negotiating = self.negotiating.lock().expect("negotiating connections");
        if let Some(at) = negotiating.iter().position(|(n, _)| *n == id) {
            negotiating.remove(at);
        }
    }

    /// Takes one of the `max_connections` transmission slots, if one is free.
    pub(crate) fn take_slot(&self) -> Option<Slot<'_>> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.config.max_connections).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot { open: &self.open })
    }
}

/// A transmission slot, given back when dropped.
pub(crate) struct Slot<'a> {
    open: &'a AtomicUsize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Releases a connection's place in its peer's count.
struct Leave<E: Export> {
    shared: Arc<Shared<E>>,
    peer_ip: Option<IpAddr>,
}

impl<E: Export> Drop for Leave<E> {
    fn drop(&mut self) {
        if let Some(ip) = self.peer_ip {
            self.shared.peers.leave(ip);
        }
    }
}
