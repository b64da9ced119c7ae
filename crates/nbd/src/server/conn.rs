//! One connection: the fixed-newstyle handshake, then transmission. Requests are read by the
//! connection's thread; with inline submission it also executes them and replies, with
//! queued submission it hands them (write payloads already received) to its channel's
//! workers, which reply in whatever order they finish.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::Shared;
use super::channel::{Channel, Job};
use super::export::{Export, ExportError, Payload, skip, skip_stream};
use super::follow::Follower;
use super::inbox::Inbox;
use super::net::Stream;
use super::poll::Poller;
use super::tls::{Session, TlsMode};
use super::{MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES, PREFERRED_BLOCK_BYTES, Submit};
use crate::consts::{command, command_flags, errno, info, option, state, transmission_flags};
use crate::handshake::{self, ClientFlags, OPTION_HEADER_BYTES, OptionHeader};
use crate::option_reply;
use crate::options::{
    ERR_INVALID, ERR_POLICY, ERR_TLS_REQD, ERR_TOO_BIG, ERR_UNKNOWN, ERR_UNSUP, MAX_OPTION_BYTES,
};
use crate::reply;
use crate::request::{Limits, REQUEST_BYTES, Request};
use crate::{NbdError, NbdOption};

/// The id of the one metadata context locus serves.
const BASE_ALLOCATION_ID: u32 = 1;
const BASE_ALLOCATION: &str = "base:allocation";
/// Replies up to this size may be held back (corked); larger ones go out at once, and so
/// do the replies to writes of more than this: holding a reply back saves a system call
/// and a client wake-up per request, which is much of a small request's cost and little
/// of a large one's, while the client, its queue full, waits for the replies to send more
/// (fio at queue depth 16, 64 KiB writes: 1.64–1.78 GB/s with their replies held,
/// 2.11–2.37 GB/s with them sent at once).
const CORK_REPLY_BYTES: usize = 16 << 10;
/// Held-back replies are sent once they add up to this much, or to this many replies.
///
/// A few at a time, not the whole burst: a client that keeps a queue of requests in flight
/// sends more only as replies come back, so replies held until the connection's input runs
/// dry turn the two into a ping-pong — the client idle while the server works through the
/// burst, the server idle while the client refills it. Measured with fio (nbd engine, 4 KiB
/// random writes, queue depth 16) on the 2-core development VM: 132k–145k IOPS with the
/// whole burst held (fio busy 62–68% of the time), 164k–182k sending every 2, 4 or 8 replies
/// (fio busy 83–85%; nbdkit's memory plugin 166k–186k), the server's CPU time per request
/// the same.
const CORK_FLUSH_BYTES: usize = 128 << 10;
const CORK_FLUSH_REPLIES: usize = 4;
/// Most extents in one block-status reply.
const MAX_EXTENTS: usize = 1 << 16;

/// Replies held back on a corked connection, in wire order.
#[derive(Debug, Default)]
struct Held {
    bytes: Vec<u8>,
    replies: usize,
}

impl Held {
    /// Holds one more reply; true when the held ones should now be sent.
    fn add(&mut self, reply: &[IoSlice<'_>]) -> bool {
        for slice in reply {
            self.bytes.extend_from_slice(slice);
        }
        self.replies += 1;
        self.replies >= CORK_FLUSH_REPLIES || self.bytes.len() >= CORK_FLUSH_BYTES
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.replies = 0;
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The client said goodbye (`NBD_OPT_ABORT`, `NBD_CMD_DISC`) or closed between requests.
    Clean,
    /// The server is stopping.
    Shutdown,
    /// A socket error.
    Io(io::Error),
    /// The client broke the protocol in a way that leaves no answer.
    Protocol(String),
    /// The client was turned away (the server was at its connection limit).
    Refused(String),
}

impl From<io::Error> for End {
    fn from(e: io::Error) -> Self {
        End::Io(e)
    }
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Clean => f.write_str("closed by the client"),
            End::Shutdown => f.write_str("closed: the server is stopping"),
            End::Io(e) => write!(f, "connection error: {e}"),
            End::Protocol(m) => write!(f, "protocol violation: {m}"),
            End::Refused(m) => write!(f, "refused: {m}"),
        }
    }
}

/// What the handshake settled.
struct Negotiated<'a, E> {
    /// The transmission slot the connection holds until it ends.
    _slot: super::Slot<'a>,
    export: Arc<E>,
    name: String,
    structured: bool,
    base_allocation: bool,
    block_size_agreed: bool,
}

/// The transmission flags of an export.
pub(crate) fn transmission_flags<E: Export>(export: &E) -> u16 {
    use transmission_flags as t;
    let mut flags = t::HAS_FLAGS
        | t::SEND_FLUSH
        | t::SEND_FUA
        | t::SEND_TRIM
        | t::SEND_WRITE_ZEROES
        | t::SEND_DF
        | t::SEND_CACHE
        | t::SEND_FAST_ZERO
        // Every acknowledged write is durable in the shared file, whichever connection
        // wrote it, so FLUSH and FUA hold across connections.
        | t::CAN_MULTI_CONN;
    if export.read_only() {
        flags |= t::READ_ONLY;
    }
    flags
}

/// Serves connection `id` to its end.
pub(crate) fn serve<E: Export>(
    shared: &Arc<Shared<E>>,
    channel: &Arc<Channel<E>>,
    id: u64,
    mut stream: Stream,
) -> End {
    let mut negotiating = super::net::Deadlined {
        deadline: Instant::now() + shared.config.handshake_timeout,
        stream: &mut stream,
    };
    let negotiated = handshake(shared, &mut negotiating);
    shared.end_negotiation(id);
    let negotiated = match negotiated {
        Ok(Some(n)) => n,
        Ok(None) => {
            stream.close_tls();
            return End::Clean;
        }
        Err(end) => return end,
    };
    if let Err(e) = stream.set_read_timeout(None) {
        return End::Io(e);
    }
    let writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => return End::Io(e),
    };
    tracing::debug!(export = %negotiated.name, structured = negotiated.structured, "transmission");
    let conn = Arc::new(Conn {
        limits: Limits {
            size_bytes: negotiated.export.size(),
            transmission_flags: transmission_flags(&*negotiated.export),
            structured_replies: negotiated.structured,
            meta_contexts: negotiated.base_allocation,
            max_payload_bytes: MAX_PAYLOAD_BYTES,
            // Constraints bind only clients that asked for them in NBD_OPT_GO; the file
            // system takes any byte range, so the others get the protocol's default of 1.
            min_block_bytes: if negotiated.block_size_agreed {
                MIN_BLOCK_BYTES
            } else {
                1
            },
        },
        export_index: shared.exports.position(&negotiated.name).unwrap_or(0),
        export: negotiated.export,
        channel: Arc::clone(channel),
        writer: Mutex::new(writer),
        corked: shared.config.submit == Submit::Inline,
        pending: Mutex::default(),
        outbox: Mutex::default(),
        outbox_ready: Condvar::new(),
        backlog: Mutex::default(),
        finished: Condvar::new(),
        broken: AtomicBool::new(false),
    });
    let sender = if conn.parks() {
        let sending = Arc::clone(&conn);
        match std::thread::Builder::new()
            .name(format!("nbd-ch{}-send", channel.id))
            .spawn(move || {
                sending.channel.enter();
                sending.send_parked();
            }) {
            Ok(handle) => Some(handle),
            Err(e) => return End::Io(e),
        }
    } else {
        None
    };
    let end = transmission(shared, &conn, &mut stream);
    conn.wait_idle();
    conn.flush_pending();
    if let Some(sender) = sender {
        conn.outbox.lock().expect("outbox").closing = true;
        conn.outbox_ready.notify_all();
        let _ = sender.join();
    }
    if matches!(end, End::Clean) {
        stream.close_tls();
    }
    end
}

fn handshake<'s, E: Export>(
    shared: &'s Shared<E>,
    stream: &mut super::net::Deadlined<'_>,
) -> Result<Option<Negotiated<'s, E>>, End> {
    let full = || {
        format!(
            "the server is serving its maximum of {} connections; try later",
            shared.config.max_connections
        )
    };
    stream.write_all(&handshake::greeting())?;
    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags)?;
    let client = ClientFlags::decode(flags).map_err(protocol)?;
    let tls_required = shared
        .config
        .tls
        .as_ref()
        .is_some_and(|t| t.mode == TlsMode::Require);
    let mut structured = false;
    // The export the last NBD_OPT_SET_META_CONTEXT selected base:allocation on.
    let mut selected: Option<String> = None;
    loop {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        stream.read_exact(&mut header)?;
        let header = OptionHeader::decode(&header).map_err(protocol)?;
        let code = header.option;
        if header.len > MAX_OPTION_BYTES {
            if code == option::EXPORT_NAME {
                return Err(End::Protocol(format!(
                    "export name of {} bytes",
                    header.len
                )));
            }
            skip_stream(stream, u64::from(header.len))?;
            let message = format!(
                "option data of {} bytes (at most {MAX_OPTION_BYTES})",
                header.len
            );
            stream.write_all(&option_reply::error(code, ERR_TOO_BIG, &message))?;
            continue;
        }
        let mut data = vec![0u8; header.len as usize];
        stream.read_exact(&mut data)?;
        let decoded = match NbdOption::decode(code, &data) {
            Ok(decoded) => decoded,
            Err(NbdError::Option { reply, message, .. }) => {
                stream.write_all(&option_reply::error(code, reply, &message))?;
                continue;
            }
            Err(e) => return Err(protocol(e)),
        };
        if tls_required && !stream.stream.is_tls() {
            match decoded {
                NbdOption::StartTls | NbdOption::Abort => {}
                // It has no error reply: the protocol says to hang up.
                NbdOption::ExportName(_) => {
                    return Err(End::Refused(
                        "NBD_OPT_EXPORT_NAME before STARTTLS on a server that requires TLS".into(),
                    ));
                }
                _ => {
                    let message = "this server requires TLS: send NBD_OPT_STARTTLS first";
                    stream.write_all(&option_reply::error(code, ERR_TLS_REQD, message))?;
                    continue;
                }
            }
        }
        let find = |name: &str| {
            shared
                .exports
                .find(name)
                .map(|(n, e)| (n.to_owned(), Arc::clone(e)))
        };
        match decoded {
            NbdOption::ExportName(name) => {
                let Some((name, export)) = find(&name) else {
                    return Err(End::Protocol(format!("no export named {name:?}")));
                };
                // This option has no error reply: a client turned away is only closed.
                let Some(slot) = shared.take_slot() else {
                    return Err(End::Refused(full()));
                };
                let reply = handshake::export_name_reply(
                    export.size(),
                    transmission_flags(&*export),
                    client.no_zeroes,
                );
                stream.write_all(&reply)?;
                let base_allocation = structured && selected.as_deref() == Some(name.as_str());
                return Ok(Some(Negotiated {
                    _slot: slot,
                    export,
                    name,
                    structured,
                    base_allocation,
                    block_size_agreed: false,
                }));
            }
            NbdOption::Abort => {
                // The client may already have closed; the reply is a courtesy.
                let _ = stream.write_all(&option_reply::ack(code));
                return Ok(None);
            }
            NbdOption::List => {
                let mut out = Vec::new();
                for (name, export) in shared.exports.iter() {
                    out.extend(option_reply::server(code, name, &export.description()));
                }
                out.extend(option_reply::ack(code));
                stream.write_all(&out)?;
            }
            NbdOption::StartTls => {
                let Some(tls) = &shared.config.tls else {
                    let message = "TLS is not enabled on this server (locus serve --tls)";
                    stream.write_all(&option_reply::error(code, ERR_UNSUP, message))?;
                    continue;
                };
                if stream.stream.is_tls() {
                    let message = "TLS is already on";
                    stream.write_all(&option_reply::error(code, ERR_INVALID, message))?;
                    continue;
                }
                stream.write_all(&option_reply::ack(code))?;
                let session = Session::new(tls, stream.stream)?;
                // A failed TLS handshake is a client that could not prove itself (or
                // could not check us): the operator's business, so a refusal (WARN).
                session
                    .handshake(stream.deadline)
                    .map_err(|e| End::Refused(format!("TLS handshake failed: {e}")))?;
                *stream.stream = Stream::Tls(Arc::new(session));
                // Negotiation starts over inside TLS: nothing said in plain text holds.
                structured = false;
                selected = None;
            }
            NbdOption::Info { go, name, requests } => {
                let Some((canonical, export)) = find(&name) else {
                    let message = format!("no export named {name:?}");
                    stream.write_all(&option_reply::error(code, ERR_UNKNOWN, &message))?;
                    continue;
                };
                // Taken before any reply, so a refused GO answers only the refusal.
                let slot = if go {
                    match shared.take_slot() {
                        Some(slot) => Some(slot),
                        None => {
                            stream.write_all(&option_reply::error(code, ERR_POLICY, &full()))?;
                            continue;
                        }
                    }
                } else {
                    None
                };
                let mut out =
                    option_reply::info_export(code, export.size(), transmission_flags(&*export));
                if requests.contains(&info::NAME) {
                    out.extend(option_reply::info_text(code, info::NAME, &canonical));
                }
                if requests.contains(&info::DESCRIPTION) {
                    out.extend(option_reply::info_text(
                        code,
                        info::DESCRIPTION,
                        &export.description(),
                    ));
                }
                out.extend(option_reply::info_block_size(
                    code,
                    MIN_BLOCK_BYTES,
                    PREFERRED_BLOCK_BYTES,
                    MAX_PAYLOAD_BYTES,
                ));
                out.extend(option_reply::ack(code));
                stream.write_all(&out)?;
                if let Some(slot) = slot {
                    let base_allocation =
                        structured && selected.as_deref() == Some(canonical.as_str());
                    return Ok(Some(Negotiated {
                        _slot: slot,
                        export,
                        name: canonical,
                        structured,
                        base_allocation,
                        block_size_agreed: requests.contains(&info::BLOCK_SIZE),
                    }));
                }
            }
            NbdOption::StructuredReply => {
                structured = true;
                stream.write_all(&option_reply::ack(code))?;
            }
            NbdOption::MetaContext { set, name, queries } => {
                if !structured {
                    let message = "negotiate structured replies before metadata contexts";
                    stream.write_all(&option_reply::error(code, ERR_INVALID, message))?;
                    continue;
                }
                let Some((canonical, _)) = find(&name) else {
                    let message = format!("no export named {name:?}");
                    stream.write_all(&option_reply::error(code, ERR_UNKNOWN, &message))?;
                    continue;
                };
                // Listing with no query, or with the namespace wildcard, shows every context.
                let matched = queries
                    .iter()
                    .any(|q| q == BASE_ALLOCATION || (!set && (q == "base:" || q == "base:*")))
                    || (!set && queries.is_empty());
                let mut out = Vec::new();
                if matched {
                    out.extend(option_reply::meta_context(
                        code,
                        BASE_ALLOCATION_ID,
                        BASE_ALLOCATION,
                    ));
                }
                out.extend(option_reply::ack(code));
                stream.write_all(&out)?;
                if set {
                    selected = matched.then_some(canonical);
                }
            }
            NbdOption::Unknown(other) => {
                let message = format!("option {other} is not supported");
                stream.write_all(&option_reply::error(code, ERR_UNSUP, &message))?;
            }
        }
    }
}

fn protocol(e: NbdError) -> End {
    let (NbdError::Disconnect(m)
    | NbdError::Option { message: m, .. }
    | NbdError::Request { message: m, .. }) = e;
    End::Protocol(m)
}

/// A connection in transmission, shared by its reading thread and (queued) the channel's
/// workers.
pub(crate) struct Conn<E: Export> {
    limits: Limits,
    export: Arc<E>,
    /// The export's place in the server's list (its counters on the channel).
    export_index: usize,
    pub(crate) channel: Arc<Channel<E>>,
    writer: Mutex<Stream>,
    /// Inline submission holds small replies back while more requests are already queued
    /// on the socket, and sends them a few at a time ([`CORK_FLUSH_REPLIES`]) and before it
    /// would wait: one system call (and one wake-up of the client) for several replies
    /// instead of one each.
    corked: bool,
    pending: Mutex<Held>,
    /// Queued submission: replies (or their rests) the socket did not take at once, in wire
    /// order, sent by the connection's sender thread so that no worker ever waits for one
    /// client's socket. Bytes go out either straight from a worker — only while this is
    /// empty, holding its lock and the writer — or from here by the sender, which holds the
    /// writer from taking a reply until it is sent, so replies never interleave.
    outbox: Mutex<Outbox>,
    outbox_ready: Condvar,
    backlog: Mutex<Backlog>,
    finished: Condvar,
    broken: AtomicBool,
}

/// Parked replies.
#[derive(Debug, Default)]
struct Outbox {
    replies: std::collections::VecDeque<Vec<u8>>,
    /// The connection is ending: the sender sends what is parked and stops.
    closing: bool,
}

impl<E: Export> std::fmt::Debug for Conn<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("limits", &self.limits)
            .finish()
    }
}

/// A connection's requests taken on and not yet answered, and the write payload bytes they
/// hold in received buffers.
#[derive(Debug, Default)]
struct Backlog {
    requests: usize,
    bytes: usize,
    /// Reply bytes parked in the outbox (queued submission): they hold memory like
    /// payloads, so the reader stops taking requests while too many wait for the client.
    parked: usize,
    /// Threads waiting for a request to finish: `done` wakes them only when there are any,
    /// so the common path makes no system call (a condition variable's notify always does).
    waiting: usize,
}

impl Backlog {
    /// Whether one more request holding `bytes` fits within `(requests, bytes)` limits; a
    /// connection with nothing in flight may always take one (any payload the protocol
    /// allows must be servable).
    fn admits(&self, bytes: usize, (max_requests, max_bytes): (usize, usize)) -> bool {
        (self.requests == 0 && self.parked == 0)
            || (self.requests < max_requests
                && self.bytes + bytes <= max_bytes
                && self.parked <= max_bytes)
    }
}

/// Bytes a request holds while in flight: a write's received payload.
fn payload_bytes(request: &Request) -> usize {
    if request.command == command::WRITE {
        request.length as usize
    } else {
        0
    }
}

impl<E: Export> Conn<E> {
    /// Counts a finished request on the channel and under its export.
    fn record(&self, request: &Request, ok: bool, latency: std::time::Duration) {
        let (command, length) = (request.command, request.length);
        self.channel.counters.ran_request();
        self.channel.by_export[self.export_index].record(command, length, ok, latency);
    }

    fn wait_idle(&self) {
        let mut n = self.backlog.lock().expect("backlog");
        while n.requests > 0 {
            n.waiting += 1;
            n = self.finished.wait(n).expect("in-flight count");
            n.waiting -= 1;
        }
    }

    /// Waits until `request` may be taken on (within `limits`), and counts it in flight.
    fn admit(&self, request: &Request, limits: (usize, usize)) {
        let bytes = payload_bytes(request);
        let mut n = self.backlog.lock().expect("backlog");
        while !n.admits(bytes, limits) {
            n.waiting += 1;
            n = self.finished.wait(n).expect("in-flight count");
            n.waiting -= 1;
        }
        n.requests += 1;
        n.bytes += bytes;
    }

    /// `request` is finished (or was dropped before it ran).
    fn done(&self, request: &Request) {
        let mut n = self.backlog.lock().expect("backlog");
        n.requests -= 1;
        n.bytes -= payload_bytes(request);
        let wake = n.waiting > 0;
        drop(n);
        if wake {
            self.finished.notify_all();
        }
    }

    /// Sends one reply made of `slices` (or, corked, queues a small one); a failure breaks
    /// the connection (its reader stops).
    fn send(&self, slices: &mut [IoSlice<'_>]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        if self.corked {
            let len: usize = slices.iter().map(|s| s.len()).sum();
            let mut pending = self.pending.lock().expect("pending replies");
            if len <= CORK_REPLY_BYTES {
                if pending.add(slices) {
                    self.write(&mut [IoSlice::new(&pending.bytes)]);
                    pending.clear();
                }
                return;
            }
            drop(pending);
        }
        self.send_uncorked(slices);
    }

    /// Sends one reply made of `slices` now, after any held back; a failure breaks the
    /// connection.
    fn send_uncorked(&self, slices: &mut [IoSlice<'_>]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        // Held through both writes: same lock order as everywhere, held-back replies first.
        let mut pending = self
            .corked
            .then(|| self.pending.lock().expect("pending replies"));
        if let Some(pending) = pending.as_mut()
            && !pending.bytes.is_empty()
        {
            self.write(&mut [IoSlice::new(&pending.bytes)]);
            pending.clear();
        }
        self.write(slices);
        drop(pending);
    }

    /// Sends the replies held back.
    fn flush_pending(&self) {
        if !self.corked {
            return;
        }
        let mut pending = self.pending.lock().expect("pending replies");
        if !pending.bytes.is_empty() {
            if !self.broken.load(Ordering::Relaxed) {
                self.write(&mut [IoSlice::new(&pending.bytes)]);
            }
            pending.clear();
        }
    }

    fn write(&self, slices: &mut [IoSlice<'_>]) {
        if self.parks() {
            self.send_or_park(slices);
            return;
        }
        let mut writer = self.writer.lock().expect("connection writer");
        if let Err(e) = writer.write_all_slices(slices) {
            self.break_on(&writer, &e);
        }
    }

    /// Whether replies that cannot go at once are parked (queued submission: workers
    /// serve every connection of the channel and must never wait for one).
    fn parks(&self) -> bool {
        !self.corked
    }

    /// Sends one reply without waiting: what the socket takes now goes now (when nothing is
    /// parked and the sender is not mid-reply), the rest is parked for the sender.
    fn send_or_park(&self, slices: &mut [IoSlice<'_>]) {
        let outbox = self.outbox.lock().expect("outbox");
        let mut unsent: &mut [IoSlice<'_>] = slices;
        if outbox.replies.is_empty()
            && let Ok(mut writer) = self.writer.try_lock()
        {
            match writer.send_now(&mut unsent) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    self.break_on(&writer, &e);
                    return;
                }
            }
        }
        let mut rest = Vec::with_capacity(unsent.iter().map(|s| s.len()).sum());
        for slice in unsent.iter() {
            rest.extend_from_slice(slice);
        }
        self.park(outbox, rest);
    }

    /// Queues `reply` (the next bytes due after what is parked) for the sender.
    fn park(&self, mut outbox: std::sync::MutexGuard<'_, Outbox>, reply: Vec<u8>) {
        if reply.is_empty() || self.broken.load(Ordering::Relaxed) {
            return;
        }
        self.backlog.lock().expect("backlog").parked += reply.len();
        outbox.replies.push_back(reply);
        drop(outbox);
        self.outbox_ready.notify_one();
    }

    /// The sender thread: sends parked replies in order, waiting on the socket as long as
    /// the client takes, until the connection ends and nothing is left.
    fn send_parked(&self) {
        loop {
            {
                let mut outbox = self.outbox.lock().expect("outbox");
                while outbox.replies.is_empty() && !outbox.closing {
                    outbox = self.outbox_ready.wait(outbox).expect("outbox");
                }
                if outbox.replies.is_empty() {
                    return;
                }
            }
            // The writer first, then the reply: no worker can slip a reply in between.
            let mut writer = self.writer.lock().expect("connection writer");
            let Some(reply) = self.outbox.lock().expect("outbox").replies.pop_front() else {
                continue;
            };
            if !self.broken.load(Ordering::Relaxed)
                && let Err(e) = writer.write_all_slices(&mut [IoSlice::new(&reply)])
            {
                self.break_on(&writer, &e);
            }
            drop(writer);
            let mut backlog = self.backlog.lock().expect("backlog");
            backlog.parked -= reply.len();
            let wake = backlog.waiting > 0;
            drop(backlog);
            if wake {
                self.finished.notify_all();
            }
        }
    }

    /// A send failed: the connection is finished.
    fn break_on(&self, stream: &Stream, e: &io::Error) {
        tracing::debug!(error = %e, "sending a reply failed; closing the connection");
        self.broken.store(true, Ordering::Relaxed);
        stream.shutdown(Shutdown::Both);
    }

    /// Holds a small reply back (corked connections); true when the held-back replies
    /// should now be sent. Never waits for the socket.
    fn hold(&self, slices: &mut [IoSlice<'_>]) -> bool {
        self.pending.lock().expect("pending replies").add(slices)
    }

    /// The connection's writer, with every held-back reply sent first; `None` once the
    /// connection is broken.
    fn writer_after_pending(&self) -> Option<std::sync::MutexGuard<'_, Stream>> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        // Same lock order as `send`: held-back replies, then the writer.
        let pending = self
            .corked
            .then(|| self.pending.lock().expect("pending replies"));
        let mut writer = self.writer.lock().expect("connection writer");
        if let Some(mut pending) = pending
            && !pending.bytes.is_empty()
        {
            let result = writer.write_all_slices(&mut [IoSlice::new(&pending.bytes)]);
            pending.clear();
            if let Err(e) = result {
                self.break_on(&writer, &e);
                return None;
            }
        }
        Some(writer)
    }

    fn reply_error(&self, request: &Request, error: &ExportError) {
        let structured_only = matches!(request.command, command::READ | command::BLOCK_STATUS);
        if self.limits.structured_replies && structured_only {
            let chunk = reply::error(request.cookie, error.errno, &error.message);
            self.send(&mut [IoSlice::new(&chunk)]);
        } else {
            let header = reply::simple(request.cookie, error.errno);
            self.send(&mut [IoSlice::new(&header)]);
        }
    }

    fn reply_ok(&self, request: &Request) {
        let header = reply::simple(request.cookie, 0);
        if request.command == command::WRITE && request.length as usize > CORK_REPLY_BYTES {
            self.send_uncorked(&mut [IoSlice::new(&header)]);
        } else {
            self.send(&mut [IoSlice::new(&header)]);
        }
    }
}

fn transmission<E: Export>(shared: &Shared<E>, conn: &Arc<Conn<E>>, stream: &mut Stream) -> End {
    let mut scratch = Vec::new();
    let mut inbox = Inbox::default();
    let mut poller = Poller::new(shared.config.poll);
    let mut follower =
        Follower::new(shared.config.follow_client && shared.config.submit == Submit::Inline);
    loop {
        if conn.broken.load(Ordering::Relaxed) {
            return End::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "a reply could not be sent",
            ));
        }
        let mut header = [0u8; REQUEST_BYTES];
        match read_header(conn, stream, &mut header, &mut inbox, &mut poller) {
            Ok(true) => {}
            Ok(false) if shared.stopping.load(Ordering::Acquire) => return End::Shutdown,
            Ok(false) => return End::Clean,
            Err(e) => return End::Io(e),
        }
        let started = Instant::now();
        let request = match Request::decode(&header) {
            Ok(r) => r,
            Err(e) => return protocol(e),
        };
        match request.check(&conn.limits) {
            Ok(()) => {}
            Err(NbdError::Request { errno, message }) => {
                if request.has_payload()
                    && let Err(e) = skip(&mut inbox, stream, u64::from(request.length))
                {
                    return End::Io(e);
                }
                conn.reply_error(&request, &ExportError::new(errno, message));
                conn.record(&request, false, started.elapsed());
                continue;
            }
            Err(e) => return protocol(e),
        }
        if request.command == command::DISC {
            return End::Clean;
        }
        // Admitted before its payload is received: the limits bound the buffers a queued
        // connection holds, not just its requests.
        match shared.config.submit {
            Submit::Inline => conn.admit(&request, (1, usize::MAX)),
            Submit::Queued => conn.admit(
                &request,
                (
                    shared.config.max_in_flight,
                    shared.config.max_in_flight_bytes,
                ),
            ),
        }
        let staged = if request.command == command::WRITE {
            let flush = || conn.flush_pending();
            let mut payload = Payload::new(&mut inbox, stream, request.length)
                .polling(shared.config.poll)
                .before_waiting(&flush);
            let staged = conn.export.receive(&mut payload);
            if let Err(e) = payload.finish() {
                conn.done(&request);
                return End::Io(e);
            }
            if let Ok(staged) = &staged {
                let node = conn.export.staged_node(staged);
                conn.channel.counters.payload(conn.channel.spec.node, node);
            }
            Some(staged)
        } else {
            None
        };
        let payload = match request.command {
            command::READ | command::WRITE => request.length,
            _ => 0,
        };
        let job = Job {
            conn: Arc::clone(conn),
            request,
            staged,
            started,
        };
        match shared.config.submit {
            Submit::Inline => complete(job, &mut scratch),
            Submit::Queued => conn.channel.enqueue(job),
        }
        follower.request(
            payload,
            poller.take_waited(),
            stream,
            &conn.channel.counters,
        );
    }
}

/// Reads a request header from the connection's input; `false` when the connection closed
/// cleanly before its first byte. Replies held back are sent before the thread would wait
/// for the client, which it does polling first (see [`Poller`]).
fn read_header<E: Export>(
    conn: &Conn<E>,
    stream: &mut Stream,
    header: &mut [u8; REQUEST_BYTES],
    inbox: &mut Inbox,
    poller: &mut Poller,
) -> io::Result<bool> {
    loop {
        let buffered = inbox.buffered();
        if buffered.len() >= REQUEST_BYTES {
            header.copy_from_slice(&buffered[..REQUEST_BYTES]);
            inbox.consume(REQUEST_BYTES);
            return Ok(true);
        }
        let received = poller.fill(inbox, stream, &conn.channel.counters, || {
            conn.flush_pending();
        });
        match received {
            Ok(0) if inbox.buffered().is_empty() => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed {} bytes into a request header",
                        inbox.buffered().len()
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Executes a checked request and sends its reply; counts it on the connection's channel.
pub(crate) fn complete<E: Export>(job: Job<E>, scratch: &mut Vec<u8>) {
    let Job {
        conn,
        request,
        staged,
        started,
    } = job;
    let result = execute(&conn, &request, staged, scratch);
    if let Err(e) = &result {
        tracing::debug!(command = request.command, offset = request.offset, len = request.length, error = %e, "request failed");
        conn.reply_error(&request, e);
    }
    conn.record(&request, result.is_ok(), started.elapsed());
    conn.done(&request);
}

fn execute<E: Export>(
    conn: &Conn<E>,
    request: &Request,
    staged: Option<Result<E::Staged, ExportError>>,
    scratch: &mut Vec<u8>,
) -> Result<(), ExportError> {
    let export = &*conn.export;
    let (offset, len) = (request.offset, u64::from(request.length));
    if len == 0 && request.command != command::FLUSH {
        // A no-op (the request check let only these through): nothing to read, write,
        // trim or zero.
        drop(staged);
        if request.command == command::READ && conn.limits.structured_replies {
            let done = reply::done(request.cookie);
            conn.send(&mut [IoSlice::new(&done)]);
        } else {
            conn.reply_ok(request);
        }
        return Ok(());
    }
    match request.command {
        command::READ => return read(conn, request, scratch),
        command::WRITE => {
            let staged = staged.expect("a write carries its received payload")?;
            export.commit(staged, offset)?;
        }
        command::FLUSH => export.flush()?,
        command::TRIM => export.trim(offset, len)?,
        command::CACHE => export.cache(offset, len)?,
        command::WRITE_ZEROES => {
            let provision = request.flags & command_flags::NO_HOLE != 0;
            if request.flags & command_flags::FAST_ZERO != 0
                && !export.zeroes_fast(offset, len, provision)?
            {
                return Err(ExportError::new(
                    errno::ENOTSUP,
                    "zeroing this range would be no faster than writing it",
                ));
            }
            export.write_zeroes(offset, len, provision)?;
        }
        command::BLOCK_STATUS => return block_status(conn, request),
        other => unreachable!("command {other} passed the request check"),
    }
    conn.reply_ok(request);
    Ok(())
}

fn read<E: Export>(
    conn: &Conn<E>,
    request: &Request,
    scratch: &mut Vec<u8>,
) -> Result<(), ExportError> {
    let cookie = request.cookie;
    let len = u64::from(request.length);
    // The reply's framing: one simple header, or one chunk per data run or hole (the last
    // with the DONE flag).
    let (headers, pieces): (Vec<Vec<u8>>, Vec<Piece>) = if !conn.limits.structured_replies {
        (
            vec![reply::simple(cookie, 0).to_vec()],
            vec![(0..len, true)],
        )
    } else {
        let pieces = if request.flags & command_flags::DF != 0 {
            vec![(0..len, true)]
        } else {
            let ranges = conn.export.data_ranges(request.offset, len)?;
            pieces(request.offset, len, &ranges)
        };
        let headers = pieces
            .iter()
            .enumerate()
            .map(|(i, (range, is_data))| {
                let done = i + 1 == pieces.len();
                let at = request.offset + range.start;
                let piece_len = (range.end - range.start) as u32;
                if *is_data {
                    reply::offset_data_prefix(cookie, at, piece_len, done).to_vec()
                } else {
                    reply::offset_hole(cookie, at, piece_len, done)
                }
            })
            .collect();
        (headers, pieces)
    };
    let reply_bytes = headers.iter().map(Vec::len).sum::<usize>()
        + pieces
            .iter()
            .filter(|(_, is_data)| *is_data)
            .map(|(r, _)| (r.end - r.start) as usize)
            .sum::<usize>();

    if conn.corked && reply_bytes <= CORK_REPLY_BYTES {
        // A small reply joins the held-back ones: copied once, from the export's memory.
        let (mut full, mut short) = (false, false);
        conn.export.read_with(
            request.offset,
            request.length,
            scratch,
            &mut |data| match frame(&headers, &pieces, data) {
                Some(mut slices) => full = conn.hold(&mut slices),
                None => short = true,
            },
        )?;
        if full {
            conn.flush_pending();
        }
        return if short { Err(short_read()) } else { Ok(()) };
    }

    if conn.parks() {
        return read_parking(conn, request, scratch, &headers, &pieces);
    }

    // A large reply is sent from the export's memory itself. The export holds writers (and
    // its checkpoint) off that memory while it is lent, so only what the socket takes at
    // once is sent from it; the rest is copied out and sent after the export let go.
    let mut writer = conn.writer_after_pending();
    let Some(stream) = writer.as_deref_mut() else {
        return Ok(());
    };
    let mut lent = lend(
        conn,
        request,
        scratch,
        &headers,
        &pieces,
        Some(&mut *stream),
    )?;
    if lent.failed.is_none()
        && !lent.rest.is_empty()
        && let Err(e) = stream.write_all_slices(&mut [IoSlice::new(&lent.rest)])
    {
        lent.failed = Some(e);
    }
    if let Some(e) = lent.failed {
        conn.break_on(stream, &e);
    }
    if lent.short {
        Err(short_read())
    } else {
        Ok(())
    }
}

/// A read reply with queued submission: sent from the export's memory as far as the socket
/// takes it now (when nothing is parked and the sender is idle), the rest copied and parked
/// for the connection's sender — the worker never waits for the client.
fn read_parking<E: Export>(
    conn: &Conn<E>,
    request: &Request,
    scratch: &mut Vec<u8>,
    headers: &[Vec<u8>],
    pieces: &[Piece],
) -> Result<(), ExportError> {
    if conn.broken.load(Ordering::Relaxed) {
        return Ok(());
    }
    let outbox = conn.outbox.lock().expect("outbox");
    let mut writer = if outbox.replies.is_empty() {
        conn.writer.try_lock().ok()
    } else {
        None
    };
    let lent = lend(
        conn,
        request,
        scratch,
        headers,
        pieces,
        writer.as_deref_mut(),
    )?;
    if let Some(e) = lent.failed {
        if let Some(stream) = writer.as_deref() {
            conn.break_on(stream, &e);
        }
        return Ok(());
    }
    drop(writer);
    if lent.short {
        // Nothing of a short reply may reach the client after what went: the stream
        // would be out of step. (Only a broken export hands over less than asked.)
        return Err(short_read());
    }
    conn.park(outbox, lent.rest);
    Ok(())
}

/// What [`lend`] did with a read reply.
struct Lent {
    /// The reply's bytes the socket did not take at once (all of them without a socket).
    rest: Vec<u8>,
    /// The send failed (nothing more was sent).
    failed: Option<io::Error>,
    /// The export handed over fewer bytes than asked for.
    short: bool,
}

/// Frames a read reply around the bytes the export lends and sends what `socket` (if any)
/// takes without waiting; the rest is copied out, so nothing waits on the client while the
/// export's memory is lent.
fn lend<E: Export>(
    conn: &Conn<E>,
    request: &Request,
    scratch: &mut Vec<u8>,
    headers: &[Vec<u8>],
    pieces: &[Piece],
    mut socket: Option<&mut Stream>,
) -> Result<Lent, ExportError> {
    let mut lent = Lent {
        rest: Vec::new(),
        failed: None,
        short: false,
    };
    conn.export
        .read_with(request.offset, request.length, scratch, &mut |data| {
            let Some(mut slices) = frame(headers, pieces, data) else {
                lent.short = true;
                return;
            };
            if lent.failed.is_some() {
                return;
            }
            let mut unsent = slices.as_mut_slice();
            // Once something is held back, everything after it is too (in order).
            if let Some(stream) = socket.as_deref_mut().filter(|_| lent.rest.is_empty()) {
                match stream.send_now(&mut unsent) {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => {
                        lent.failed = Some(e);
                        return;
                    }
                }
            }
            for slice in unsent.iter() {
                lent.rest.extend_from_slice(slice);
            }
        })?;
    Ok(lent)
}

fn short_read() -> ExportError {
    ExportError::io("the export handed over fewer bytes than were asked for")
}

/// The slices of a read reply: each header, followed for data pieces by their bytes taken in
/// order from `data` (which covers the whole request; hole bytes are skipped). `None` when
/// `data` falls short.
fn frame<'a>(
    headers: &'a [Vec<u8>],
    pieces: &[Piece],
    data: &[&'a [u8]],
) -> Option<Vec<IoSlice<'a>>> {
    let mut out = Vec::with_capacity(headers.len() + data.len() + 1);
    let mut slices = data.iter();
    let mut current: &[u8] = &[];
    for (header, (range, is_data)) in headers.iter().zip(pieces) {
        out.push(IoSlice::new(header));
        let mut left = (range.end - range.start) as usize;
        while left > 0 {
            if current.is_empty() {
                current = slices.next()?;
                continue;
            }
            let n = left.min(current.len());
            if *is_data {
                out.push(IoSlice::new(&current[..n]));
            }
            current = &current[n..];
            left -= n;
        }
    }
    Some(out)
}

/// Part of a read reply relative to the request's offset, and whether it is data (or a
/// hole).
type Piece = (Range<u64>, bool);

/// Splits `[0, len)` (relative to `offset`) into data runs and holes, given the export's data
/// ranges (absolute).
fn pieces(offset: u64, len: u64, data: &[Range<u64>]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0;
    for range in data {
        let start = range.start.max(offset) - offset;
        let end = (range.end.min(offset + len)).saturating_sub(offset);
        if start >= end {
            continue;
        }
        if start > at {
            out.push((at..start, false));
        }
        out.push((start..end, true));
        at = end;
    }
    if at < len {
        out.push((at..len, false));
    }
    out
}

fn block_status<E: Export>(conn: &Conn<E>, request: &Request) -> Result<(), ExportError> {
    let len = u64::from(request.length);
    let ranges = conn.export.data_ranges(request.offset, len)?;
    let mut extents: Vec<(u32, u32)> = pieces(request.offset, len, &ranges)
        .into_iter()
        .take(MAX_EXTENTS)
        .map(|(range, is_data)| {
            let flags = if is_data {
                0
            } else {
                state::HOLE | state::ZERO
            };
            ((range.end - range.start) as u32, flags)
        })
        .collect();
    if request.flags & command_flags::REQ_ONE != 0 {
        extents.truncate(1);
    }
    let chunk = reply::block_status(request.cookie, BASE_ALLOCATION_ID, &extents, true);
    conn.send(&mut [IoSlice::new(&chunk)]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_request_with_data_runs_and_holes_in_order() {
        // Request [100, 200): data at [50, 120) and [150, 160) and [190, 400).
        let p = pieces(100, 100, &[50..120, 150..160, 190..400]);
        assert_eq!(
            p,
            vec![
                (0..20, true),
                (20..50, false),
                (50..60, true),
                (60..90, false),
                (90..100, true)
            ]
        );
        assert_eq!(pieces(0, 10, &[]), vec![(0..10, false)]);
        assert_eq!(pieces(0, 10, &[0..10, 20..30]), vec![(0..10, true)]);
    }

    #[test]
    fn in_flight_limits_bound_requests_and_payload_bytes_but_never_block_an_idle_connection() {
        let limits = (4, 100);
        let idle = Backlog::default();
        assert!(
            idle.admits(1_000, limits),
            "an oversized payload still goes alone"
        );
        let busy = Backlog {
            requests: 2,
            bytes: 60,
            ..Backlog::default()
        };
        assert!(busy.admits(40, limits));
        assert!(!busy.admits(41, limits));
        let full = Backlog {
            requests: 4,
            ..Backlog::default()
        };
        assert!(!full.admits(0, limits));
        // Replies waiting for a client that does not read hold the reader back too, even
        // with nothing in flight.
        let parked = Backlog {
            parked: 101,
            ..Backlog::default()
        };
        assert!(!parked.admits(0, limits));
        let some_parked = Backlog {
            parked: 100,
            ..Backlog::default()
        };
        assert!(some_parked.admits(0, limits));
    }

    #[test]
    fn frames_take_data_bytes_across_lent_slices_and_skip_holes() {
        let bytes: Vec<u8> = (0..10).collect();
        // Lent in uneven slices; pieces: data [0,3), hole [3,7), data [7,10).
        let lent: [&[u8]; 3] = [&bytes[..2], &bytes[2..8], &bytes[8..]];
        let headers = vec![b"A".to_vec(), b"H".to_vec(), b"B".to_vec()];
        let pieces = [(0..3, true), (3..7, false), (7..10, true)];
        let framed = frame(&headers, &pieces, &lent).unwrap();
        let joined: Vec<u8> = framed.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(joined, b"A\x00\x01\x02HB\x07\x08\x09");
        assert!(
            frame(&headers, &pieces, &lent[..2]).is_none(),
            "short data is reported"
        );
    }
}
