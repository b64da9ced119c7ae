//! The I/O engine: one io_uring per thread, the device registered as fixed file 0, a sparse
//! fixed-buffer table, bounded queue depth, and owned buffers (a buffer goes in with its
//! request and comes back with the completion, error or not).
//!
//! Strategies, in the same code so they can be measured side by side:
//! - [`Strategy::Pool`]: the uDMA pool; fixed ops (`READ_FIXED`, `READV_FIXED` for several
//!   segments of one registered buffer) for registered segments;
//! - [`Strategy::PerRequest`]: fresh memory registered before and unregistered after each
//!   request (what SPDK's per-request DMA allocation amounts to);
//! - [`Strategy::Unregistered`]: pool memory, never registered (plain `READ`/`READV`);
//! - [`Strategy::Bounce`]: the caller's data copied through registered bounce buffers.

#![allow(
    unsafe_code,
    reason = "io_uring submission: the kernel reads and writes our buffers"
)]

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

use crate::error::{Result, UringError, io};
use crate::file::DirectFile;
use crate::memory::Memory;
use crate::pool::{BufferPool, IoBuf, PoolConfig, PoolStats, Registrar, Segment};

/// Largest request: 64 MiB.
pub const MAX_REQUEST_BYTES: usize = 64 << 20;
/// Largest queue depth.
pub const MAX_QUEUE_DEPTH: u32 = 1024;

/// How buffers are provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The uDMA three-tier registered pool.
    Pool,
    /// Register and unregister fresh memory per request.
    PerRequest,
    /// Pool memory, unregistered.
    Unregistered,
    /// Unregistered caller buffers copied through registered bounce buffers.
    Bounce,
}

impl Strategy {
    /// All, in report order.
    pub const ALL: [Strategy; 4] = [
        Strategy::Pool,
        Strategy::PerRequest,
        Strategy::Unregistered,
        Strategy::Bounce,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::PerRequest => "per-request",
            Self::Unregistered => "unregistered",
            Self::Bounce => "bounce",
        }
    }
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Device to buffer.
    Read,
    /// Buffer to device.
    Write,
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag.
    pub tag: u64,
    /// Read or write.
    pub op: Op,
    /// Device offset.
    pub offset: u64,
    /// The buffer, back to the caller (holding the data read, for reads).
    pub buf: IoBuf,
    /// Bytes transferred, or what went wrong.
    pub result: Result<usize>,
    /// Submission to completion.
    pub latency: Duration,
}

struct InFlight {
    tag: u64,
    op: Op,
    offset: u64,
    buf: IoBuf,
    len: usize,
    parts_left: u32,
    done_bytes: usize,
    error: Option<String>,
    started: Instant,
    /// For vectored ops: the iovecs must live until the kernel has read them.
    iovecs: Vec<Vec<libc::iovec>>,
    /// Bounce strategy: the registered bounce buffer the I/O really used.
    bounce: Option<IoBuf>,
}

/// The ring's sparse buffer table, as the pool's registrar.
struct Table<'a> {
    ring: &'a IoUring,
}

impl Registrar for Table<'_> {
    fn register(&mut self, slot: u16, memory: &Memory) -> std::io::Result<()> {
        let iovec = libc::iovec {
            iov_base: memory.base().cast(),
            iov_len: memory.len(),
        };
        // SAFETY: the memory stays mapped until the pool unregisters the slot (pool chunks,
        // small blocks and large buffers are unregistered before they are dropped).
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(slot), &[iovec], None)
        }
        .map(drop)
    }

    fn unregister(&mut self, slot: u16) -> std::io::Result<()> {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec clears the slot; no memory is handed to the kernel.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(slot), &[empty], None)
        }
        .map(drop)
    }
}

/// One thread's I/O engine over one device.
pub struct Engine {
    ring: IoUring,
    file: DirectFile,
    pool: BufferPool,
    /// Bounce strategy: the callers' ordinary (unregistered, reused) buffers.
    caller_pool: Option<BufferPool>,
    strategy: Strategy,
    queue_depth: u32,
    slab: Vec<Option<InFlight>>,
    free_tags: Vec<usize>,
    in_flight: u32,
    ready: VecDeque<Completion>,
    vectored_fixed: bool,
}

// SAFETY: the engine owns its ring, its buffers and the iovecs of its in-flight requests
// (raw pointers into buffers it also owns); nothing in it is tied to the creating thread (the
// ring is not `SINGLE_ISSUER`). Moving it to another thread moves all of that together, and
// `&mut self` on every operation keeps it to one thread at a time.
unsafe impl Send for Engine {}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("strategy", &self.strategy)
            .field("queue_depth", &self.queue_depth)
            .finish()
    }
}

impl Engine {
    /// An engine over `file` with at most `queue_depth` requests in flight.
    pub fn new(
        file: DirectFile,
        strategy: Strategy,
        mut config: PoolConfig,
        queue_depth: u32,
    ) -> Result<Self> {
        if queue_depth == 0 || queue_depth > MAX_QUEUE_DEPTH {
            return Err(UringError::Config(format!(
                "queue depth {queue_depth} is not in 1..={MAX_QUEUE_DEPTH}"
            )));
        }
        if strategy == Strategy::Unregistered {
            config.register = false;
        }
        // One engine per thread: its buffers live on the node of the thread that creates it.
        if config.node.is_none() {
            config.node = topology::current_cpu()
                .ok()
                .and_then(|cpu| topology::Topology::read_live().ok()?.node_of_cpu(cpu));
        }
        if strategy == Strategy::PerRequest {
            config.per_request = true;
            config.large_slots = config.large_slots.max(queue_depth as u16);
        }
        // A few entries per request: scatter/gather requests become one op per segment run.
        let ring = IoUring::new((queue_depth * 4).next_power_of_two())
            .map_err(io("creating an io_uring"))?;
        ring.submitter()
            .register_files(&[file.file().as_raw_fd()])
            .map_err(io("registering the device with io_uring"))?;
        ring.submitter()
            .register_buffers_sparse(config.table_slots())
            .map_err(io("creating the fixed-buffer table"))?;
        let mut probe = io_uring::Probe::new();
        let vectored_fixed = ring.submitter().register_probe(&mut probe).is_ok()
            && probe.is_supported(opcode::ReadvFixed::CODE)
            && probe.is_supported(opcode::WritevFixed::CODE);
        let caller_pool = if strategy == Strategy::Bounce {
            let plain = PoolConfig {
                register: false,
                ..config.clone()
            };
            Some(BufferPool::new(plain, &mut Table { ring: &ring })?)
        } else {
            None
        };
        let pool = BufferPool::new(config, &mut Table { ring: &ring })?;
        Ok(Self {
            ring,
            file,
            pool,
            caller_pool,
            strategy,
            queue_depth,
            slab: Vec::new(),
            free_tags: Vec::new(),
            in_flight: 0,
            ready: VecDeque::new(),
            vectored_fixed,
        })
    }

    /// The device.
    pub fn file(&self) -> &DirectFile {
        &self.file
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Whether the kernel has `READV_FIXED`/`WRITEV_FIXED` (Linux 6.15).
    pub fn has_vectored_fixed(&self) -> bool {
        self.vectored_fixed
    }

    /// A buffer for a request of `len` bytes. With the pool, waits for in-flight requests to
    /// return buffers when the medium tier is full; falls back to unregistered memory only if
    /// nothing is in flight to wait for.
    pub fn buffer(&mut self, len: usize, op: Op) -> Result<IoBuf> {
        if len == 0 || len > MAX_REQUEST_BYTES {
            return Err(UringError::Config(format!(
                "buffer of {len} bytes is not in 1..={MAX_REQUEST_BYTES}"
            )));
        }
        let for_write = op == Op::Write;
        if let Some(plain) = &mut self.caller_pool {
            // The caller's buffer is ordinary memory; the bounce happens at submit.
            return plain.get(len, for_write, &mut Table { ring: &self.ring });
        }
        loop {
            let mut table = Table { ring: &self.ring };
            if let Some(buf) = self.pool.try_get(len, for_write, &mut table)? {
                return Ok(buf);
            }
            if self.in_flight == 0 {
                return self.pool.get(len, for_write, &mut table);
            }
            self.wait_one()?;
        }
    }

    /// Returns a buffer once the caller is done with it.
    pub fn release(&mut self, buf: IoBuf) {
        let mut table = Table { ring: &self.ring };
        match &mut self.caller_pool {
            Some(plain) => plain.put(buf, &mut table),
            None => self.pool.put(buf, &mut table),
        }
    }

    /// Queues a request; blocks (completing earlier ones) while the queue is full. The
    /// request is submitted to the kernel at once.
    ///
    /// A refused request (unaligned, past the end, longer than its buffer) gives its buffer
    /// back to the pool, so nothing leaks.
    pub fn submit(&mut self, op: Op, buf: IoBuf, offset: u64, len: usize, tag: u64) -> Result<()> {
        let refusal = match self.file.check(offset, len) {
            Err(error) => Some(error),
            Ok(()) if len > buf.len() => Some(UringError::Config(format!(
                "a {len}-byte request on a {}-byte buffer",
                buf.len()
            ))),
            Ok(()) => None,
        };
        if let Some(error) = refusal {
            self.release(buf);
            return Err(error);
        }
        while self.in_flight >= self.queue_depth {
            self.wait_one()?;
        }
        let mut bounce = None;
        if self.strategy == Strategy::Bounce {
            let mut table = Table { ring: &self.ring };
            let mut staging = loop {
                if let Some(b) = self.pool.try_get(len, op == Op::Write, &mut table)? {
                    break b;
                }
                self.wait_one()?;
                table = Table { ring: &self.ring };
            };
            if op == Op::Write {
                staging.copy_from(&buf, len);
            }
            bounce = Some(staging);
        }
        let index = self.free_tags.pop().unwrap_or_else(|| {
            self.slab.push(None);
            self.slab.len() - 1
        });
        let io_buf = bounce.as_ref().unwrap_or(&buf);
        let (entries, iovecs) = self.build(op, io_buf.segments(), offset, len, index as u64);
        let parts = entries.len() as u32;
        self.slab[index] = Some(InFlight {
            tag,
            op,
            offset,
            buf,
            len,
            parts_left: parts,
            done_bytes: 0,
            error: None,
            started: Instant::now(),
            iovecs,
            bounce,
        });
        for entry in entries {
            // SAFETY: every address in the entry points into the request's buffer (or bounce
            // buffer) and iovecs, which the slab keeps alive until the completion arrives.
            while unsafe { self.ring.submission().push(&entry) }.is_err() {
                self.ring.submit().map_err(io("io_uring submit"))?;
            }
        }
        self.in_flight += 1;
        self.ring.submit().map_err(io("io_uring submit"))?;
        Ok(())
    }

    /// Completions ready now, waiting until at least `min` are (bounded by what is in flight).
    pub fn reap(&mut self, min: usize) -> Result<Vec<Completion>> {
        while self.ready.len() < min && self.in_flight > 0 {
            self.wait_one()?;
        }
        self.collect()?;
        Ok(self.ready.drain(..).collect())
    }

    /// Waits for one request to finish.
    fn wait_one(&mut self) -> Result<()> {
        let before = self.ready.len();
        while self.ready.len() == before && self.in_flight > 0 {
            self.ring.submit_and_wait(1).map_err(io("io_uring wait"))?;
            self.collect()?;
        }
        Ok(())
    }

    fn collect(&mut self) -> Result<()> {
        let completions: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (user_data, result) in completions {
            let index = user_data as usize;
            let request = self.slab[index]
                .as_mut()
                .expect("completion for a request in flight");
            if result < 0 {
                request
                    .error
                    .get_or_insert_with(|| std::io::Error::from_raw_os_error(-result).to_string());
            } else {
                request.done_bytes += result as usize;
            }
            request.parts_left -= 1;
            if request.parts_left == 0 {
                let mut request = self.slab[index].take().expect("present");
                self.free_tags.push(index);
                self.in_flight -= 1;
                if let Some(staging) = request.bounce.take() {
                    if request.op == Op::Read && request.error.is_none() {
                        request.buf.copy_from(&staging, request.len);
                    }
                    let mut table = Table { ring: &self.ring };
                    self.pool.put(staging, &mut table);
                }
                drop(request.iovecs);
                let op_name = if request.op == Op::Read {
                    "read"
                } else {
                    "write"
                };
                let result = match request.error {
                    Some(problem) => Err(UringError::Failed {
                        op: op_name,
                        offset: request.offset,
                        len: request.len,
                        problem,
                    }),
                    None if request.done_bytes != request.len => Err(UringError::Failed {
                        op: op_name,
                        offset: request.offset,
                        len: request.len,
                        problem: format!("short transfer of {} bytes", request.done_bytes),
                    }),
                    None => Ok(request.done_bytes),
                };
                self.ready.push_back(Completion {
                    tag: request.tag,
                    op: request.op,
                    offset: request.offset,
                    buf: request.buf,
                    result,
                    latency: request.started.elapsed(),
                });
            }
        }
        Ok(())
    }

    /// The submission entries for one request: consecutive segments of one registered buffer
    /// become one fixed op (vectored when there are several and the kernel has it), other
    /// segments plain ops; each covers its part of the file range.
    fn build(
        &self,
        op: Op,
        segments: &[Segment],
        offset: u64,
        len: usize,
        user_data: u64,
    ) -> (Vec<io_uring::squeue::Entry>, Vec<Vec<libc::iovec>>) {
        let fd = types::Fixed(0);
        let mut entries = Vec::new();
        let mut iovecs = Vec::new();
        let mut remaining = len;
        let mut position = offset;
        let mut index = 0;
        while remaining > 0 {
            let first = segments[index];
            // Group following segments of the same registered buffer when vectored fixed ops exist.
            let mut group = vec![first];
            while self.vectored_fixed
                && first.fixed.is_some()
                && index + group.len() < segments.len()
                && segments[index + group.len()].fixed == first.fixed
                && group.iter().map(|s| s.len).sum::<usize>() < remaining
            {
                group.push(segments[index + group.len()]);
            }
            index += group.len();
            let mut pieces: Vec<libc::iovec> = Vec::new();
            let mut group_len = 0;
            for segment in &group {
                let n = segment.len.min(remaining - group_len);
                if n == 0 {
                    break;
                }
                pieces.push(libc::iovec {
                    iov_base: segment.address.cast(),
                    iov_len: n,
                });
                group_len += n;
            }
            let n = group_len as u32;
            let entry = match (op, first.fixed, pieces.len()) {
                (Op::Read, Some(slot), 1) => opcode::ReadFixed::new(fd, first.address, n, slot)
                    .offset(position)
                    .build(),
                (Op::Write, Some(slot), 1) => opcode::WriteFixed::new(fd, first.address, n, slot)
                    .offset(position)
                    .build(),
                (Op::Read, Some(slot), _) => {
                    opcode::ReadvFixed::new(fd, pieces.as_ptr(), pieces.len() as u32, slot)
                        .offset(position)
                        .build()
                }
                (Op::Write, Some(slot), _) => {
                    opcode::WritevFixed::new(fd, pieces.as_ptr(), pieces.len() as u32, slot)
                        .offset(position)
                        .build()
                }
                (Op::Read, None, _) => opcode::Read::new(fd, first.address, n)
                    .offset(position)
                    .build(),
                (Op::Write, None, _) => opcode::Write::new(fd, first.address, n)
                    .offset(position)
                    .build(),
            };
            entries.push(entry.user_data(user_data));
            iovecs.push(pieces);
            remaining -= group_len;
            position += group_len as u64;
        }
        (entries, iovecs)
    }

    /// Writes `data` at `offset` and waits for it (a convenience for tests and tools).
    pub fn write_all(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let mut buf = self.buffer(data.len(), Op::Write)?;
        buf.fill_from(data);
        self.submit(Op::Write, buf, offset, data.len(), u64::MAX)?;
        self.finish_one(u64::MAX, None).map(drop)
    }

    /// Reads `len` bytes at `offset` and waits for them.
    pub fn read_exact(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut data = vec![0u8; len];
        let n = self.read_into(offset, &mut data)?;
        data.truncate(n);
        Ok(data)
    }

    /// Reads `out.len()` bytes at `offset` into `out` and waits for them; returns the bytes
    /// read.
    pub fn read_into(&mut self, offset: u64, out: &mut [u8]) -> Result<usize> {
        let buf = self.buffer(out.len(), Op::Read)?;
        self.submit(Op::Read, buf, offset, out.len(), u64::MAX - 1)?;
        self.finish_one(u64::MAX - 1, Some(out))
    }

    /// Waits for request `tag`; a read's bytes go to `out`. Returns the bytes transferred.
    fn finish_one(&mut self, tag: u64, out: Option<&mut [u8]>) -> Result<usize> {
        loop {
            if let Some(position) = self.ready.iter().position(|c| c.tag == tag) {
                let completion = self.ready.remove(position).expect("found");
                let result = completion.result.inspect(|&n| {
                    if let Some(out) = out {
                        completion.buf.copy_to(&mut out[..n]);
                    }
                });
                self.release(completion.buf);
                return result;
            }
            self.wait_one()?;
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Requests still in the kernel must finish before their buffers are freed. A wait a
        // signal interrupted is retried. Any other failure leaves requests the kernel may
        // still be working on: their buffers are leaked, never freed (each keeps the memory
        // it points into mapped, so leaking it keeps that memory mapped too).
        while self.in_flight > 0 {
            let waited = self.ring.submit_and_wait(1);
            let failure = match waited {
                Ok(_) => self.collect().err().map(|e| e.to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => None,
                Err(e) => Some(e.to_string()),
            };
            if let Some(problem) = failure {
                tracing::error!(
                    in_flight = self.in_flight,
                    %problem,
                    "cannot drain the io_uring; leaking the buffers of its requests"
                );
                for request in self.slab.drain(..).flatten() {
                    std::mem::forget(request);
                }
                return;
            }
        }
    }
}
