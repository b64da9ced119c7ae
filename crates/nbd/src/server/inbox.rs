//! A connection's input buffer: bytes received from the client and not yet used.
//!
//! Requests are taken from the socket in as large pieces as have arrived: one receive can
//! bring several request headers and write payloads, so a busy connection makes far fewer
//! than one system call per request. Write payloads are handed to the export piece by piece
//! straight out of this buffer, which stays hot in the CPU's cache; the file-system export
//! copies them into its persistent buffer with non-temporal stores, which need no cache-line
//! write-back afterwards. Receiving straight into persistent memory instead leaves every line
//! dirty in the cache (the kernel copies with ordinary stores) and each must then be written
//! back with `clwb`: measured on the development machine, that path moved 3.8 GB/s (4 KiB
//! pieces) to 4.8 GB/s (1 MiB), the bounce through a cache-hot buffer plus the non-temporal
//! copy 10.7 to 14 GB/s.

use std::io::{self, Read};

/// Size of a connection's input buffer: large enough that a queue of 4 KiB writes arrives in
/// one receive, small enough to stay in a core's L2 cache.
pub(crate) const INBOX_BYTES: usize = 128 << 10;

/// Received bytes `buf[start..end]` waiting to be used.
pub(crate) struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("buffered", &(self.end - self.start))
            .finish()
    }
}

impl Default for Inbox {
    fn default() -> Self {
        Self::with_capacity(INBOX_BYTES)
    }
}

impl Inbox {
    /// An empty buffer of `capacity` bytes (at least one request header).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        assert!(
            capacity >= crate::request::REQUEST_BYTES,
            "an inbox holds at least one request header"
        );
        Self {
            buf: vec![0u8; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The bytes received and not yet used.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Marks the first `n` buffered bytes used.
    pub(crate) fn consume(&mut self, n: usize) {
        assert!(
            n <= self.end - self.start,
            "consumed more than was received"
        );
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Receives whatever has arrived (at least one byte, waiting for it) into the free
    /// space; `Ok(0)` at the end of the stream.
    pub(crate) fn fill(&mut self, stream: &mut dyn Read) -> io::Result<usize> {
        let space = self.make_room();
        let n = stream.read(space)?;
        self.end += n;
        Ok(n)
    }

    /// [`Inbox::fill`] in the middle of a payload with `left` bytes to come: the end of the
    /// stream is an error that says so; an interrupted receive is retried by the caller's
    /// loop (it returns with nothing added).
    pub(crate) fn fill_within_payload(
        &mut self,
        stream: &mut dyn Read,
        left: u64,
    ) -> io::Result<()> {
        within_payload(self.fill(stream), left)
    }

    /// [`Inbox::fill_within_payload`] without waiting: `WouldBlock` when nothing has arrived.
    pub(crate) fn fill_from_now(
        &mut self,
        stream: &mut dyn super::export::ReadDebug,
        left: u64,
    ) -> io::Result<()> {
        within_payload(self.fill_now(stream), left)
    }

    /// Like [`Inbox::fill`], without waiting: `WouldBlock` when nothing has arrived.
    pub(crate) fn fill_now(
        &mut self,
        stream: &mut dyn super::export::ReadDebug,
    ) -> io::Result<usize> {
        let n = stream.read_now(self.make_room())?;
        self.end += n;
        Ok(n)
    }

    /// The free space, after moving a leftover to the front when the tail is short. What is
    /// moved is less than a request header in steady state: payload pieces are used up
    /// before the next receive.
    fn make_room(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < self.buf.len() / 4 && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        assert!(self.end < self.buf.len(), "receiving into a full inbox");
        &mut self.buf[self.end..]
    }
}

/// What a receive inside a payload with `left` bytes to come amounts to: the end of the
/// stream is an error that says so, an interrupted receive added nothing.
fn within_payload(received: io::Result<usize>, left: u64) -> io::Result<()> {
    match received {
        Ok(0) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed {left} bytes before the end of a payload"),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per read, like a socket under load.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn bytes_come_out_in_order_across_refills_and_compaction() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for step in [1, 29, 64, 1000] {
            for take in [1, 28, 63, 100] {
                let mut inbox = Inbox::with_capacity(128);
                let mut stream = Trickle { data: &data, step };
                let mut out = Vec::new();
                loop {
                    let n = inbox.buffered().len().min(take);
                    if n > 0 {
                        out.extend_from_slice(&inbox.buffered()[..n]);
                        inbox.consume(n);
                        continue;
                    }
                    if inbox.fill(&mut stream).expect("read") == 0 {
                        break;
                    }
                }
                assert_eq!(out, data, "step {step}, take {take}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "consumed more than was received")]
    fn consuming_past_the_received_bytes_is_a_bug() {
        let mut inbox = Inbox::with_capacity(64);
        inbox
            .fill(&mut Trickle {
                data: &[1, 2, 3],
                step: 3,
            })
            .expect("read");
        inbox.consume(4);
    }
}
