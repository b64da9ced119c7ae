//! FUSE over io_uring: one ring per CPU queue of a FUSE connection (Linux 6.14+, with the
//! `fuse` module's `enable_uring` parameter on).
//!
//! The kernel puts a request made on CPU *c* into queue *c*; a daemon thread pinned to *c*
//! waits on that queue's ring, so the request is served on the CPU that made it and both
//! wake-ups stay on one CPU. Each queue entry is two buffers registered with the kernel: a
//! 288-byte header (the `fuse_in_header` in, the `fuse_out_header` out, the opcode's own
//! argument struct, and the payload length) and a payload buffer that carries the rest of the
//! request in and the reply's arguments out. A `REGISTER` command hands an entry to the
//! kernel; its completion means a request is in the entry; `COMMIT_AND_FETCH` returns the
//! reply and hands the entry back in one submission.
//!
//! This module moves bytes only: what the bytes mean is the FUSE protocol, which the caller
//! speaks.

#![allow(
    unsafe_code,
    reason = "io_uring commands whose buffers the kernel reads and writes"
)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::memory::{ALIGN, Memory};

/// Bytes of an entry's header buffer (`struct fuse_uring_req_header`).
pub const HEADER_BYTES: usize = 288;
/// Where the opcode's argument struct starts in the header (`op_in`).
const OP_IN: usize = 128;
/// Where `struct fuse_uring_ent_in_out` starts in the header.
const ENT_IN_OUT: usize = 256;
/// Bytes of `struct fuse_out_header`.
const OUT_HEADER_BYTES: usize = 16;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// One queue of a FUSE connection served through io_uring.
pub struct FuseRing {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fuse: OwnedFd,
    qid: u16,
    payload_bytes: usize,
    entries: Vec<Entry>,
    /// Entries the kernel holds (registered or committed, not yet completed).
    with_kernel: usize,
}

impl std::fmt::Debug for FuseRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseRing")
            .field("qid", &self.qid)
            .field("entries", &self.entries.len())
            .field("with_kernel", &self.with_kernel)
            .finish_non_exhaustive()
    }
}

/// An entry's memory: the header at the start, the payload from the next page.
struct Entry {
    memory: Memory,
    /// The two iovecs `REGISTER` points at (header, payload); read by the kernel during the
    /// submission only, kept here so their address is stable.
    iov: Box<[libc::iovec; 2]>,
}

/// A request the kernel has put into an entry.
#[derive(Debug)]
pub struct FuseRequest<'a> {
    /// Which entry (to [`FuseRing::commit`]).
    pub entry: usize,
    /// The `fuse_in_header` (40 bytes).
    pub header: &'a [u8],
    /// The opcode's argument struct (`op_in`, 128 bytes; as many as the opcode has are
    /// meaningful).
    pub op_in: &'a [u8],
    /// The payload buffer: the request's remaining arguments in `[..payload_len]`, and the
    /// place for the reply's arguments.
    pub payload: &'a mut [u8],
    /// Bytes of request arguments in the payload.
    pub payload_len: usize,
}

impl FuseRing {
    /// Sets up queue `qid` of the connection whose `/dev/fuse` descriptor is `fuse` with
    /// `depth` entries of `payload_bytes` each (at least the connection's largest request),
    /// their memory on `node`, and registers them. The connection must have answered `INIT`
    /// with `FUSE_OVER_IO_URING`. The calling thread should be the one that serves the queue:
    /// the kernel delivers requests in its context.
    pub fn new(
        fuse: OwnedFd,
        qid: u16,
        depth: usize,
        payload_bytes: usize,
        node: Option<u32>,
    ) -> io::Result<Self> {
        let depth = depth.clamp(1, 64);
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build((depth * 2).next_power_of_two() as u32)?;
        let mut this = FuseRing {
            ring,
            fuse,
            qid,
            payload_bytes,
            entries: Vec::with_capacity(depth),
            with_kernel: 0,
        };
        for index in 0..depth {
            let memory = Memory::new(ALIGN + payload_bytes, node)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let base = memory.base();
            let iov = Box::new([
                libc::iovec {
                    iov_base: base.cast(),
                    iov_len: HEADER_BYTES,
                },
                libc::iovec {
                    // SAFETY: the mapping is ALIGN + payload_bytes long.
                    iov_base: unsafe { base.add(ALIGN) }.cast(),
                    iov_len: payload_bytes,
                },
            ]);
            this.entries.push(Entry { memory, iov });
            let sqe = this.command(CMD_REGISTER, 0, index, true);
            this.push(&sqe)?;
        }
        this.ring.submit()?;
        Ok(this)
    }

    fn command(&self, op: u32, commit_id: u64, index: usize, register: bool) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut builder = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), op).cmd(cmd);
        if register {
            builder = builder.addr(Some(self.entries[index].iov.as_ptr() as u64));
        }
        let sqe = builder.build().user_data(index as u64);
        if register {
            with_iovec_count(sqe, 2)
        } else {
            sqe
        }
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the iovecs and the buffers they name live in `self.entries` until the ring
        // is gone (see Drop), and the kernel uses them only through this ring.
        let pushed = unsafe { self.ring.submission().push(sqe) };
        if pushed.is_err() {
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(sqe) }
                .map_err(|_| io::Error::other("the FUSE ring's submission queue is full"))?;
        }
        self.with_kernel += 1;
        Ok(())
    }

    /// Waits for the next request and returns the entry holding it; `Ok(None)` when the
    /// connection has ended (unmounted or aborted) and no entry is left with the kernel.
    pub fn next_request(&mut self) -> io::Result<Option<usize>> {
        loop {
            if self.with_kernel == 0 {
                return Ok(None);
            }
            let completion = self.ring.completion().next();
            let Some(cqe) = completion else {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.with_kernel -= 1;
            let index = cqe.user_data() as usize;
            match cqe.result() {
                0 => return Ok(Some(index)),
                r if r == -libc::ENOTCONN || r == -libc::ECONNABORTED || r == -libc::ECANCELED => {
                    continue; // the connection is going away: this entry is done
                }
                r => {
                    return Err(io::Error::other(format!(
                        "FUSE io_uring queue {}: the kernel refused an entry: {}",
                        self.qid,
                        io::Error::from_raw_os_error(-r)
                    )));
                }
            }
        }
    }

    /// The request in `entry` (which [`FuseRing::next_request`] returned).
    pub fn request(&mut self, entry: usize) -> FuseRequest<'_> {
        let payload_bytes = self.payload_bytes;
        let base = self.entries[entry].memory.base();
        // SAFETY: the kernel wrote this entry before completing it and does not touch it again
        // until it is committed; `&mut self` makes these the only references.
        let (head, payload) = unsafe {
            (
                std::slice::from_raw_parts(base, HEADER_BYTES),
                std::slice::from_raw_parts_mut(base.add(ALIGN), payload_bytes),
            )
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[ENT_IN_OUT + 16..ENT_IN_OUT + 20]);
        FuseRequest {
            entry,
            header: &head[..40],
            op_in: &head[OP_IN..ENT_IN_OUT],
            payload,
            payload_len: (u32::from_ne_bytes(len) as usize).min(payload_bytes),
        }
    }

    /// Answers the request in `entry`: `error` (0 or a negative errno) and `out_len` bytes of
    /// reply arguments already in its payload; the entry goes back to the kernel for the next
    /// request (submitted with the next [`FuseRing::next_request`]).
    pub fn commit(&mut self, entry: usize, error: i32, out_len: usize) -> io::Result<()> {
        let base = self.entries[entry].memory.base();
        let out_len = if error == 0 { out_len } else { 0 };
        // SAFETY: the entry is ours until the commit is pushed; nothing else references it.
        let head = unsafe { std::slice::from_raw_parts_mut(base, HEADER_BYTES) };
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&head[8..16]);
        let commit_id = u64::from_ne_bytes(unique);
        let total = (OUT_HEADER_BYTES + out_len) as u32;
        head[0..4].copy_from_slice(&total.to_ne_bytes());
        head[4..8].copy_from_slice(&error.to_ne_bytes());
        head[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        head[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(out_len as u32).to_ne_bytes());
        let sqe = self.command(CMD_COMMIT_AND_FETCH, commit_id, entry, false);
        self.push(&sqe)
    }
}

impl Drop for FuseRing {
    fn drop(&mut self) {
        if self.with_kernel > 0 {
            // The kernel may still write into entries it holds: leave their memory mapped.
            for entry in self.entries.drain(..) {
                std::mem::forget(entry.memory);
            }
        }
    }
}

/// `sqe.len = count`: the io-uring crate's `UringCmd80` has no setter for the length, which
/// FUSE's `REGISTER` reads as the number of iovecs at `addr`.
fn with_iovec_count(sqe: squeue::Entry128, count: u32) -> squeue::Entry128 {
    const LEN: usize = 24; // offsetof(struct io_uring_sqe, len)
    // SAFETY: `Entry128` is `repr(C)`: a 64-byte `io_uring_sqe` followed by 64 command bytes,
    // every bit pattern valid; only the `len` field is changed.
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(sqe);
        bytes[LEN..LEN + 4].copy_from_slice(&count.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}
