//! Channels (the Tyche design): every structure a request touches belongs to one channel,
//! and a channel belongs to one NUMA node — its threads run on that node's CPUs, the write
//! payloads they receive land in memory allocated by those threads (so on that node), and
//! its counters are written by its own threads only. With queued submission a channel also
//! owns a request queue and worker threads pinned like its connections.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::conn::{Conn, complete};
use super::export::{Export, ExportError};
use super::stats::{Counters, RequestCounters, RequestSnapshot, Snapshot};
use crate::request::Request;

/// Where a channel runs: a node and the CPUs its threads are pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSpec {
    /// The NUMA node (`None` when the machine reports none).
    pub node: Option<u32>,
    /// CPUs the channel's threads may run on (empty: not pinned).
    pub cpus: Vec<u32>,
}

/// A request ready to execute: checked, and for writes with the payload received.
pub(crate) struct Job<E: Export> {
    pub(crate) conn: Arc<Conn<E>>,
    pub(crate) request: Request,
    pub(crate) staged: Option<Result<E::Staged, ExportError>>,
    pub(crate) started: Instant,
}

struct Queue<E: Export> {
    jobs: VecDeque<Job<E>>,
    closed: bool,
    /// Workers asleep waiting for a job: a job is announced only when one is, so a busy
    /// channel makes no wake-up system call per request.
    idle: usize,
}

/// One channel.
pub(crate) struct Channel<E: Export> {
    pub(crate) id: usize,
    pub(crate) spec: ChannelSpec,
    pub(crate) counters: Counters,
    /// Requests by export (in the server's export order), on this channel.
    pub(crate) by_export: Box<[RequestCounters]>,
    queue: Mutex<Queue<E>>,
    ready: Condvar,
}

impl<E: Export> std::fmt::Debug for Channel<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("id", &self.id)
            .field("spec", &self.spec)
            .finish()
    }
}

impl<E: Export> Channel<E> {
    pub(crate) fn new(id: usize, spec: ChannelSpec, exports: usize) -> Self {
        Self {
            id,
            spec,
            counters: Counters::default(),
            by_export: (0..exports).map(|_| RequestCounters::default()).collect(),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
                idle: 0,
            }),
            ready: Condvar::new(),
        }
    }

    /// Pins the calling thread to the channel's CPUs.
    pub(crate) fn enter(&self) {
        if self.spec.cpus.is_empty() {
            return;
        }
        if let Err(e) = topology::pin_current_thread(&self.spec.cpus) {
            tracing::warn!(channel = self.id, error = %e, "could not pin a thread to the channel's CPUs; it runs unpinned");
        }
    }

    pub(crate) fn enqueue(&self, job: Job<E>) {
        let mut queue = self.queue.lock().expect("channel queue");
        queue.jobs.push_back(job);
        let wake = queue.idle > 0;
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
    }

    /// Starts `workers` threads that execute queued requests until [`Channel::close`].
    pub(crate) fn start_workers(self: &Arc<Self>, workers: usize) -> Vec<JoinHandle<()>> {
        (0..workers)
            .map(|w| {
                let channel = Arc::clone(self);
                std::thread::Builder::new()
                    .name(format!("nbd-ch{}-w{w}", self.id))
                    .spawn(move || channel.work())
                    .expect("spawning a channel worker")
            })
            .collect()
    }

    fn work(&self) {
        self.enter();
        let mut scratch = Vec::new();
        loop {
            let job = {
                let mut queue = self.queue.lock().expect("channel queue");
                loop {
                    if let Some(job) = queue.jobs.pop_front() {
                        break job;
                    }
                    if queue.closed {
                        return;
                    }
                    queue.idle += 1;
                    queue = self.ready.wait(queue).expect("channel queue");
                    queue.idle -= 1;
                }
            };
            complete(job, &mut scratch);
        }
    }

    /// Lets the workers finish what is queued, then stop.
    pub(crate) fn close(&self) {
        self.queue.lock().expect("channel queue").closed = true;
        self.ready.notify_all();
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        self.counters.snapshot(&self.by_export)
    }

    pub(crate) fn export_snapshots(&self) -> Vec<RequestSnapshot> {
        self.by_export
            .iter()
            .map(RequestCounters::snapshot)
            .collect()
    }
}
