//! What the server serves: the [`Export`] trait a storage back end implements, the
//! [`Payload`] of a write it receives from, and the named set of exports.

use std::io::{self, Read};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::inbox::Inbox;
use crate::consts::errno;

/// A failed operation on an export: the protocol error to reply with and a message (sent to
/// clients that negotiated structured replies, and logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportError {
    /// `NBD_E*` value.
    pub errno: u32,
    /// What went wrong.
    pub message: String,
}

impl ExportError {
    /// An error with protocol value `errno`.
    pub fn new(errno: u32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }

    /// `NBD_EIO`.
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(errno::EIO, message)
    }
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (NBD error {})", self.message, self.errno)
    }
}

/// One block device served over NBD. Offsets and lengths reaching an export were checked
/// against its size and the negotiated limits.
///
/// A write arrives in two steps so that its payload goes once into the memory that will hold
/// it: [`Export::receive`] runs on the thread reading the connection and copies the payload,
/// as it arrives, into a staging area of the export's choosing (for locus files: a persistent
/// buffer on the channel's node), [`Export::commit`] makes it the data at `offset` (inline,
/// or later on a channel worker).
pub trait Export: Send + Sync + 'static {
    /// A received, not yet committed write payload.
    type Staged: Send + 'static;

    /// Size in bytes (a multiple of 512).
    fn size(&self) -> u64;

    /// Writes, trims and zeroing are refused with `EPERM`.
    fn read_only(&self) -> bool;

    /// One line for people (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    fn description(&self) -> String;

    /// Fills `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;

    /// Hands the bytes at `[offset, offset + len)` to `send` as slices that cover the range
    /// in order, called once. An export whose data sits in memory lends that memory (no
    /// copy) and keeps writers off it until `send` returns — which only sends what the
    /// socket takes at once and copies the rest. The default reads into `scratch`.
    fn read_with(
        &self,
        offset: u64,
        len: u32,
        scratch: &mut Vec<u8>,
        send: &mut dyn FnMut(&[&[u8]]),
    ) -> Result<(), ExportError> {
        let len = len as usize;
        scratch.resize(len, 0);
        self.read(offset, &mut scratch[..len])?;
        send(&[&scratch[..len]]);
        Ok(())
    }

    /// The parts of `[offset, offset + len)` holding data, sorted and disjoint; the rest are
    /// holes that read as zeros.
    fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<Range<u64>>, ExportError>;

    /// Receives a write payload of `payload.remaining()` bytes into a staging area. Whatever
    /// it leaves unread is skipped by the server.
    fn receive(&self, payload: &mut Payload<'_>) -> Result<Self::Staged, ExportError>;

    /// The NUMA node of the memory `staged` sits in, if the export knows it; counted per
    /// channel against the channel's node.
    fn staged_node(&self, _staged: &Self::Staged) -> Option<u32> {
        None
    }

    /// Makes a received payload the data at `offset`, durable when this returns.
    fn commit(&self, staged: Self::Staged, offset: u64) -> Result<(), ExportError>;

    /// Makes `[offset, offset + len)` read as zeros; with `provision`, every byte of it
    /// must also be backed by memory afterwards (`NBD_CMD_FLAG_NO_HOLE`).
    fn write_zeroes(&self, offset: u64, len: u64, provision: bool) -> Result<(), ExportError>;

    /// Whether `write_zeroes` of this range would cost less than writing it
    /// (`NBD_CMD_FLAG_FAST_ZERO`); must answer without changing anything.
    fn zeroes_fast(&self, offset: u64, len: u64, provision: bool) -> Result<bool, ExportError>;

    /// A hint that `[offset, offset + len)` is no longer needed.
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError>;

    /// Every write that was acknowledged is durable when this returns.
    fn flush(&self) -> Result<(), ExportError>;

    /// A hint that `[offset, offset + len)` will be read soon.
    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError>;
}

/// The payload of one write, taken from the connection as the export asks for it: piece by
/// piece as it arrives ([`Payload::receive_with`]) or into one slice ([`Payload::receive`]).
pub struct Payload<'a> {
    inbox: &'a mut Inbox,
    stream: &'a mut dyn ReadDebug,
    remaining: u32,
    received: u64,
    failed: Option<io::Error>,
    /// Longest the receive of the rest polls before it sleeps (see [`Payload::polling`]).
    poll: Duration,
    /// Runs before the receive of the rest waits (see [`Payload::before_waiting`]).
    before_waiting: Option<&'a dyn Fn()>,
}

impl std::fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("stream", &self.stream)
            .field("remaining", &self.remaining)
            .field("received", &self.received)
            .field("failed", &self.failed)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

/// `Read` that can be debug-printed (a connection's socket).
pub trait ReadDebug: Read + std::fmt::Debug {
    /// What has arrived, without waiting (`WouldBlock` when nothing has). A reader that
    /// cannot tell says `WouldBlock`, and its payloads are never polled for.
    fn read_now(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Acknowledges what was received at once, where the transport has acknowledgements
    /// and the connection asks for it (see `Acks` in `server/net.rs`).
    fn acknowledge(&mut self) {}
}

impl ReadDebug for std::os::unix::net::UnixStream {}

impl<'a> Payload<'a> {
    /// A payload of `len` bytes: first what `inbox` holds, then more from `stream`.
    pub(crate) fn new(inbox: &'a mut Inbox, stream: &'a mut dyn ReadDebug, len: u32) -> Self {
        Self {
            inbox,
            stream,
            remaining: len,
            received: 0,
            failed: None,
            poll: Duration::ZERO,
            before_waiting: None,
        }
    }

    /// Runs `f` whenever the rest of the payload has not arrived yet, before waiting for it:
    /// replies held back go out then, as before any other wait, so that none waits behind a
    /// payload that trickles in (a client whose queue is full needs them to send more).
    pub(crate) fn before_waiting(mut self, f: &'a dyn Fn()) -> Self {
        self.before_waiting = Some(f);
        self
    }

    /// Polls for the rest of the payload for up to `limit` before sleeping in a receive.
    /// The rest of a payload is on its way when a receive finds it short — the client is
    /// sending it — and a thread asleep in `recv` must be woken by the sender's every
    /// segment: on the development VM those wake-ups were half of fio's time at 64 KiB
    /// writes (queue depth 16), which ran at 1.3 GB/s sleeping and 1.8 GB/s polling.
    pub(crate) fn polling(mut self, limit: Duration) -> Self {
        self.poll = limit;
        self
    }

    /// Bytes not yet received.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Receives the rest of the payload, calling `f(at, piece)` for each piece in order
    /// (`at`: the piece's offset in the payload) as it arrives. The pieces are lent from the
    /// connection's input buffer, which stays in the CPU's cache: copying them on is cheap.
    /// A connection failure is reported as `EIO` and ends the connection afterwards; an
    /// error from `f` stops the receive (the server skips the rest).
    pub fn receive_with(
        &mut self,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), ExportError>,
    ) -> Result<(), ExportError> {
        self.check_alive()?;
        while self.remaining > 0 {
            if self.inbox.buffered().is_empty() {
                self.refill()?;
            }
            let n = self.inbox.buffered().len().min(self.remaining as usize);
            f(self.received, &self.inbox.buffered()[..n])?;
            self.take(n);
        }
        Ok(())
    }

    /// Receives exactly `buf.len()` bytes (at most [`Payload::remaining`]) into `buf`. A
    /// connection failure is reported as `EIO` here and ends the connection afterwards.
    pub fn receive(&mut self, buf: &mut [u8]) -> Result<(), ExportError> {
        if buf.len() > self.remaining as usize {
            return Err(ExportError::new(
                errno::EINVAL,
                format!(
                    "asked for {} payload bytes, {} remain",
                    buf.len(),
                    self.remaining
                ),
            ));
        }
        self.check_alive()?;
        let mut got = 0;
        while got < buf.len() {
            if self.inbox.buffered().is_empty() {
                self.refill()?;
            }
            let n = self.inbox.buffered().len().min(buf.len() - got);
            buf[got..got + n].copy_from_slice(&self.inbox.buffered()[..n]);
            self.take(n);
            got += n;
        }
        Ok(())
    }

    /// Reads and drops what the export left; fails if the connection does.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        skip(self.inbox, self.stream, u64::from(self.remaining))
    }

    fn check_alive(&self) -> Result<(), ExportError> {
        match &self.failed {
            Some(e) => Err(ExportError::io(format!("connection failed: {e}"))),
            None => Ok(()),
        }
    }

    fn take(&mut self, n: usize) {
        self.inbox.consume(n);
        self.remaining -= n as u32;
        self.received += n as u64;
    }

    fn refill(&mut self) -> Result<(), ExportError> {
        let left = u64::from(self.remaining);
        if self.before_waiting.is_some() || !self.poll.is_zero() {
            // Taken at the first try that finds nothing, after the held-back replies went
            // out; what has arrived already is taken without either.
            let before_waiting = self.before_waiting;
            let mut started: Option<Instant> = None;
            loop {
                match self.inbox.fill_from_now(&mut *self.stream, left) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => return self.received(other),
                }
                let since = *started.get_or_insert_with(|| {
                    if let Some(f) = before_waiting {
                        f();
                    }
                    Instant::now()
                });
                if since.elapsed() >= self.poll {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let filled = self.inbox.fill_within_payload(&mut *self.stream, left);
        self.received(filled)
    }

    /// A receive inside the payload: the client is sending the rest of it, and its
    /// acknowledgement goes at once.
    fn received(&mut self, result: io::Result<()>) -> Result<(), ExportError> {
        if result.is_ok() {
            self.stream.acknowledge();
        }
        self.fail_on(result)
    }

    fn fail_on(&mut self, result: io::Result<()>) -> Result<(), ExportError> {
        result.map_err(|e| {
            let message = format!("connection failed inside a write payload: {e}");
            self.failed = Some(e);
            ExportError::io(message)
        })
    }
}

/// Reads and drops `len` bytes of a connection: first what `inbox` holds, then from
/// `stream`.
pub(crate) fn skip(inbox: &mut Inbox, stream: &mut dyn ReadDebug, len: u64) -> io::Result<()> {
    let mut left = len;
    while left > 0 {
        if inbox.buffered().is_empty() {
            inbox.fill_within_payload(stream, left)?;
        }
        let n = (inbox.buffered().len() as u64).min(left) as usize;
        inbox.consume(n);
        left -= n as u64;
    }
    Ok(())
}

/// Reads and drops `len` bytes of a connection with nothing buffered (the handshake reads
/// exactly what it needs).
pub(crate) fn skip_stream(stream: &mut dyn ReadDebug, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut stream.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "connection closed {} bytes before the end of a payload",
                len - copied
            ),
        ));
    }
    Ok(())
}

/// The named exports of a server; the first is the default (it answers the empty name).
#[derive(Debug)]
pub struct Exports<E> {
    entries: Vec<(String, Arc<E>)>,
}

impl<E> Exports<E> {
    /// Exports in listing order; the first is the default. Names must be unique, non-empty
    /// and at most 4096 bytes.
    pub fn new(entries: Vec<(String, Arc<E>)>) -> Result<Self, String> {
        if entries.is_empty() {
            return Err("a server needs at least one export".into());
        }
        for (i, (name, _)) in entries.iter().enumerate() {
            if name.is_empty() || name.len() > crate::consts::MAX_STRING_BYTES {
                return Err(format!(
                    "export name {name:?}: 1 to {} bytes",
                    crate::consts::MAX_STRING_BYTES
                ));
            }
            if entries[..i].iter().any(|(other, _)| other == name) {
                return Err(format!("export name {name:?} is given twice"));
            }
        }
        Ok(Self { entries })
    }

    /// The export a client asked for by name; the empty name is the default export.
    pub fn find(&self, name: &str) -> Option<(&str, &Arc<E>)> {
        self.position(name).map(|i| {
            let (n, e) = &self.entries[i];
            (n.as_str(), e)
        })
    }

    /// Where the export `name` (the empty name: the first) is in listing order.
    pub fn position(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            (!self.entries.is_empty()).then_some(0)
        } else {
            self.entries.iter().position(|(n, _)| n == name)
        }
    }

    /// How many exports there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none (never, for a server's exports).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every export, in listing order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<E>)> {
        self.entries.iter().map(|(n, e)| (n.as_str(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// A reader whose non-blocking receives find nothing `misses` times, then `rest`; a
    /// blocking receive is counted and returns `rest` too.
    #[derive(Debug)]
    struct Script {
        misses: usize,
        rest: Vec<u8>,
        blocking: usize,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.blocking += 1;
            self.misses = 0;
            self.read_now(buf)
        }
    }

    impl ReadDebug for Script {
        fn read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.misses > 0 {
                self.misses -= 1;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = self.rest.len().min(buf.len());
            buf[..n].copy_from_slice(&self.rest[..n]);
            self.rest.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn the_rest_of_a_payload_is_polled_for_after_held_replies_go_out() {
        let cases = [
            // (misses before the rest arrives, poll limit, blocking receives, flushes)
            (0, Duration::from_secs(5), 0, 0), // already there: nothing to flush, no wait
            (3, Duration::from_secs(5), 0, 1), // caught polling
            (3, Duration::ZERO, 1, 1),         // not polling: sleeps, after the flush
        ];
        for (misses, limit, blocking, flushes) in cases {
            let mut stream = Script {
                misses,
                rest: vec![7u8; 4096],
                blocking: 0,
            };
            let mut inbox = Inbox::with_capacity(8192);
            let flushed = std::cell::Cell::new(0);
            let flush = || flushed.set(flushed.get() + 1);
            let mut buf = vec![0u8; 4096];
            Payload::new(&mut inbox, &mut stream, 4096)
                .polling(limit)
                .before_waiting(&flush)
                .receive(&mut buf)
                .expect("the payload");
            assert_eq!(buf, vec![7u8; 4096]);
            assert_eq!(
                (stream.blocking, flushed.get()),
                (blocking, flushes),
                "{misses} misses, polling for {limit:?}"
            );
        }
    }

    /// Over a real socket, the payload arriving in uneven pieces: every byte lands at its
    /// offset, and what follows the payload stays buffered or on the socket, in order.
    #[test]
    fn payload_pieces_arrive_in_order_and_the_next_request_is_left_alone() {
        for split in [0usize, 1, 100, 4095, 4096] {
            let (mut client, mut server) = UnixStream::pair().expect("socket pair");
            let payload: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
            let following: Vec<u8> = (0..64u8).map(|i| 200u8.wrapping_add(i)).collect();
            client.write_all(&payload[..split]).expect("send");
            let sender = std::thread::spawn({
                let mut client = client.try_clone().expect("clone");
                let rest = [&payload[split..], &following[..]].concat();
                move || {
                    std::thread::sleep(Duration::from_millis(20));
                    client.write_all(&rest).expect("send");
                }
            });
            let mut inbox = Inbox::with_capacity(1000);
            let mut buf = vec![0u8; 4096];
            let mut p = Payload::new(&mut inbox, &mut server, 4096);
            p.receive(&mut buf[..10]).expect("a first slice");
            p.receive_with(|at, piece| {
                let at = at as usize;
                buf[at..at + piece.len()].copy_from_slice(piece);
                Ok(())
            })
            .expect("the rest, piece by piece");
            assert_eq!(p.remaining(), 0);
            p.finish().expect("nothing left to skip");
            sender.join().expect("sender");
            assert_eq!(buf, payload, "split {split}");
            drop(client);
            let mut rest = inbox.buffered().to_vec();
            server.read_to_end(&mut rest).expect("rest");
            assert_eq!(rest, following, "split {split}");
        }
    }

    #[test]
    fn what_an_export_leaves_is_skipped_up_to_the_next_request() {
        let (mut client, mut server) = UnixStream::pair().expect("socket pair");
        client.write_all(&[1u8; 3000]).expect("send");
        client.write_all(b"next").expect("send");
        drop(client);
        let mut inbox = Inbox::with_capacity(512);
        let mut p = Payload::new(&mut inbox, &mut server, 3000);
        let mut first = [0u8; 100];
        p.receive(&mut first).expect("part");
        let e = p
            .receive_with(|_, _| Err(ExportError::new(errno::ENOSPC, "full")))
            .expect_err("the export gave up");
        assert_eq!(e.errno, errno::ENOSPC);
        p.finish().expect("skipped");
        let mut rest = inbox.buffered().to_vec();
        server.read_to_end(&mut rest).expect("rest");
        assert_eq!(rest, b"next");
    }

    #[test]
    fn a_payload_cut_short_is_an_io_error_that_ends_the_connection() {
        let (mut client, mut server) = UnixStream::pair().expect("socket pair");
        client.write_all(&[7u8; 100]).expect("send");
        drop(client);
        let mut inbox = Inbox::default();
        let mut buf = vec![0u8; 512];
        let mut p = Payload::new(&mut inbox, &mut server, 512);
        let e = p.receive(&mut buf).expect_err("cut short");
        assert_eq!(e.errno, errno::EIO);
        assert!(
            e.message.contains("412 bytes before the end"),
            "{}",
            e.message
        );
        assert!(p.finish().is_err());
    }
}
