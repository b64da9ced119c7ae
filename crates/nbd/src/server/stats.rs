//! A channel's counters: connections, requests by kind, bytes, errors, a latency
//! histogram with power-of-two microsecond buckets, and where the channel's work actually
//! happened — the CPUs the kernel ran its requests on (`sched_getcpu` per request) and the
//! nodes its write payloads were received into. Updated with relaxed atomics by the
//! channel's own threads only, so they stay in the channel's cache lines.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::consts::command;

/// Latency buckets: bucket `i` counts requests that took less than `2^i` µs (the last one
/// everything slower).
pub const LATENCY_BUCKETS: usize = 32;

/// CPUs the per-channel CPU set can record (ids below this; higher ones are counted as
/// unrecorded).
pub const RECORDED_CPUS: usize = CPU_WORDS * 64;
const CPU_WORDS: usize = 16;

/// A channel's own counters. Its requests are counted per export
/// ([`RequestCounters`], one set per export on each channel); the channel's totals are their
/// sum, taken at [`Counters::snapshot`], so a request is counted once.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) open_connections: AtomicU64,
    cpus: [AtomicU64; CPU_WORDS],
    cpus_unrecorded: AtomicU64,
    payloads_on_node: AtomicU64,
    payloads_off_node: AtomicU64,
    payloads_unplaced: AtomicU64,
    waits_polled: AtomicU64,
    waits_slept: AtomicU64,
    moves_to_client: AtomicU64,
    moves_to_channel: AtomicU64,
}

impl Counters {
    /// Counts a wait for a client's next request that polling caught (`polled`) or that
    /// ended in a blocking receive.
    pub(crate) fn waited(&self, polled: bool) {
        let counter = if polled {
            &self.waits_polled
        } else {
            &self.waits_slept
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection thread's move onto its client's CPU (`to_client`) or back onto
    /// its channel's CPUs.
    pub(crate) fn moved(&self, to_client: bool) {
        let counter = if to_client {
            &self.moves_to_client
        } else {
            &self.moves_to_channel
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the CPU the calling thread runs on as it finishes a request.
    pub(crate) fn ran_request(&self) {
        self.ran_on(topology::current_cpu().ok());
    }

    /// Adds `cpu` to the set of CPUs the channel ran on. The word is only written when the
    /// bit is new, so a pinned channel stops writing it after its first requests.
    fn ran_on(&self, cpu: Option<u32>) {
        let Some(cpu) = cpu.map(|c| c as usize).filter(|&c| c < RECORDED_CPUS) else {
            self.cpus_unrecorded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let (word, bit) = (&self.cpus[cpu / 64], 1u64 << (cpu % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Counts one write payload received into memory on `payload_node`, for a channel on
    /// `channel_node` (either may be unknown).
    pub(crate) fn payload(&self, channel_node: Option<u32>, payload_node: Option<u32>) {
        let counter = match (channel_node, payload_node) {
            (Some(channel), Some(payload)) if channel == payload => &self.payloads_on_node,
            (Some(_), Some(_)) => &self.payloads_off_node,
            _ => &self.payloads_unplaced,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The channel's counters with its requests summed over `by_export`.
    pub(crate) fn snapshot(&self, by_export: &[RequestCounters]) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut requests = RequestSnapshot::default();
        for export in by_export {
            requests.add(&export.snapshot());
        }
        Snapshot {
            connections: load(&self.connections),
            open_connections: load(&self.open_connections),
            reads: requests.reads,
            writes: requests.writes,
            others: requests.others,
            read_bytes: requests.read_bytes,
            written_bytes: requests.written_bytes,
            errors: requests.errors,
            latency: requests.latency,
            cpus: std::array::from_fn(|i| load(&self.cpus[i])),
            cpus_unrecorded: load(&self.cpus_unrecorded),
            payloads_on_node: load(&self.payloads_on_node),
            payloads_off_node: load(&self.payloads_off_node),
            payloads_unplaced: load(&self.payloads_unplaced),
            waits_polled: load(&self.waits_polled),
            waits_slept: load(&self.waits_slept),
            moves_to_client: load(&self.moves_to_client),
            moves_to_channel: load(&self.moves_to_channel),
        }
    }
}

/// A copy of a channel's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Connections ever placed on the channel.
    pub connections: u64,
    /// Connections open now.
    pub open_connections: u64,
    /// Reads served.
    pub reads: u64,
    /// Writes served.
    pub writes: u64,
    /// Other requests served (flush, trim, zeroes, cache, block status).
    pub others: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests per latency bucket (see [`LATENCY_BUCKETS`]).
    pub latency: [u64; LATENCY_BUCKETS],
    /// Bit set of the CPUs (below [`RECORDED_CPUS`]) the kernel ran the channel's requests
    /// on, as `sched_getcpu` told when each finished; see [`Snapshot::cpus_used`].
    pub cpus: [u64; CPU_WORDS],
    /// Requests whose CPU could not be recorded (an id too high, or `sched_getcpu` failed).
    pub cpus_unrecorded: u64,
    /// Write payloads received into memory on the channel's own node.
    pub payloads_on_node: u64,
    /// Write payloads received into memory on another node (the channel's node had no
    /// room, or its threads were not where they were pinned).
    pub payloads_off_node: u64,
    /// Write payloads whose memory, or whose channel, has no known node.
    pub payloads_unplaced: u64,
    /// Waits for a client's next request that polling the socket caught (see `--poll-us`).
    pub waits_polled: u64,
    /// Waits for a client's next request that ended in a blocking receive (the thread slept).
    pub waits_slept: u64,
    /// Moves of a connection's thread onto the CPU its client's requests arrive on (see
    /// `--pin`).
    pub moves_to_client: u64,
    /// Moves of a connection's thread back onto its channel's CPUs.
    pub moves_to_channel: u64,
}

impl Snapshot {
    /// Requests answered.
    pub fn requests(&self) -> u64 {
        self.reads + self.writes + self.others + self.errors
    }

    /// The upper bound, in µs, of the bucket holding quantile `q` (0..=1) of latencies.
    pub fn latency_quantile_micros(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(1u64 << i);
            }
        }
        None
    }

    /// The CPUs the channel's requests ran on, ascending.
    pub fn cpus_used(&self) -> Vec<u32> {
        (0..RECORDED_CPUS as u32)
            .filter(|&cpu| self.cpus[cpu as usize / 64] & (1 << (cpu % 64)) != 0)
            .collect()
    }

    /// The change since `earlier` (open connections stay as now; the CPU set is the whole
    /// run's, since a set cannot be subtracted).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            connections: self.connections - earlier.connections,
            open_connections: self.open_connections,
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            others: self.others - earlier.others,
            read_bytes: self.read_bytes - earlier.read_bytes,
            written_bytes: self.written_bytes - earlier.written_bytes,
            errors: self.errors - earlier.errors,
            latency: std::array::from_fn(|i| self.latency[i] - earlier.latency[i]),
            cpus: self.cpus,
            cpus_unrecorded: self.cpus_unrecorded - earlier.cpus_unrecorded,
            payloads_on_node: self.payloads_on_node - earlier.payloads_on_node,
            payloads_off_node: self.payloads_off_node - earlier.payloads_off_node,
            payloads_unplaced: self.payloads_unplaced - earlier.payloads_unplaced,
            waits_polled: self.waits_polled - earlier.waits_polled,
            waits_slept: self.waits_slept - earlier.waits_slept,
            moves_to_client: self.moves_to_client - earlier.moves_to_client,
            moves_to_channel: self.moves_to_channel - earlier.moves_to_channel,
        }
    }
}

/// One export's requests on one channel: counts, bytes, errors and latencies (the same
/// buckets as the channel's, plus their sum for Prometheus histograms).
#[derive(Debug, Default)]
pub(crate) struct RequestCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    others: AtomicU64,
    errors: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    latency_ns: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

impl RequestCounters {
    pub(crate) fn record(&self, cmd: u16, len: u32, ok: bool, latency: Duration) {
        let relaxed = Ordering::Relaxed;
        let (count, bytes) = match (cmd, ok) {
            (command::READ, true) => (&self.reads, Some(&self.read_bytes)),
            (command::WRITE, true) => (&self.writes, Some(&self.written_bytes)),
            (_, true) => (&self.others, None),
            (_, false) => (&self.errors, None),
        };
        count.fetch_add(1, relaxed);
        if let Some(bytes) = bytes {
            bytes.fetch_add(u64::from(len), relaxed);
        }
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns.fetch_add(nanos, relaxed);
        let micros = nanos / 1000;
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        self.latency[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, relaxed);
    }

    pub(crate) fn snapshot(&self) -> RequestSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RequestSnapshot {
            reads: load(&self.reads),
            writes: load(&self.writes),
            others: load(&self.others),
            errors: load(&self.errors),
            read_bytes: load(&self.read_bytes),
            written_bytes: load(&self.written_bytes),
            latency_ns_sum: load(&self.latency_ns),
            latency: std::array::from_fn(|i| load(&self.latency[i])),
        }
    }
}

/// One export's request counters on one channel at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestSnapshot {
    /// Reads that succeeded.
    pub reads: u64,
    /// Writes that succeeded.
    pub writes: u64,
    /// Other requests that succeeded.
    pub others: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Sum of every request's latency, in nanoseconds.
    pub latency_ns_sum: u64,
    /// Requests by latency: bucket `i` holds those under 2^i µs (and at least 2^(i-1) µs);
    /// the last holds everything slower.
    pub latency: [u64; LATENCY_BUCKETS],
}

impl RequestSnapshot {
    /// Every request counted.
    pub fn requests(&self) -> u64 {
        self.reads + self.writes + self.others + self.errors
    }

    fn add(&mut self, other: &RequestSnapshot) {
        self.reads += other.reads;
        self.writes += other.writes;
        self.others += other.others;
        self.errors += other.errors;
        self.read_bytes += other.read_bytes;
        self.written_bytes += other.written_bytes;
        self.latency_ns_sum += other.latency_ns_sum;
        for (sum, n) in self.latency.iter_mut().zip(other.latency) {
            *sum += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_power_of_two_buckets_and_quantiles_read_them_back() {
        let c = Counters::default();
        // Two exports' requests: the channel's totals are their sum.
        let by_export = [RequestCounters::default(), RequestCounters::default()];
        let request = |export: usize, cmd, len, ok, latency| {
            c.ran_request();
            by_export[export].record(cmd, len, ok, latency);
        };
        for i in 0..90 {
            request(i % 2, command::READ, 4096, true, Duration::from_micros(20)); // < 32 µs
        }
        for _ in 0..10 {
            request(1, command::WRITE, 512, true, Duration::from_micros(700)); // < 1024 µs
        }
        request(0, command::FLUSH, 0, false, Duration::from_secs(100_000));
        let s = c.snapshot(&by_export);
        assert_eq!(s.latency[5], 90);
        assert_eq!(s.latency[10], 10);
        assert_eq!(s.latency[LATENCY_BUCKETS - 1], 1);
        assert_eq!(s.latency_quantile_micros(0.5), Some(32));
        assert_eq!(s.latency_quantile_micros(0.95), Some(1024));
        assert_eq!(
            (s.reads, s.writes, s.errors, s.requests()),
            (90, 10, 1, 101)
        );
        assert_eq!((s.read_bytes, s.written_bytes), (90 * 4096, 10 * 512));
        let cpu = topology::current_cpu().unwrap();
        assert!(
            s.cpus_used().contains(&cpu),
            "{:?} lacks {cpu}",
            s.cpus_used()
        );
    }

    #[test]
    fn export_counters_count_by_kind_and_sum_latencies() {
        let c = RequestCounters::default();
        c.record(command::READ, 4096, true, Duration::from_micros(3));
        c.record(command::WRITE, 512, true, Duration::from_micros(40));
        c.record(command::WRITE, 512, false, Duration::from_micros(40));
        c.record(command::FLUSH, 0, true, Duration::from_nanos(500));
        let s = c.snapshot();
        assert_eq!((s.reads, s.writes, s.others, s.errors), (1, 1, 1, 1));
        assert_eq!((s.read_bytes, s.written_bytes), (4096, 512));
        assert_eq!(s.latency_ns_sum, 3_000 + 40_000 + 40_000 + 500);
        assert_eq!((s.latency[0], s.latency[2], s.latency[6]), (1, 1, 2));
        assert_eq!(s.requests(), 4);
    }

    #[test]
    fn cpu_set_and_payload_nodes_are_recorded() {
        let c = Counters::default();
        for cpu in [3, 0, 3, 64, 1023] {
            c.ran_on(Some(cpu));
        }
        c.ran_on(Some(RECORDED_CPUS as u32));
        c.ran_on(None);
        c.payload(Some(1), Some(1));
        c.payload(Some(1), Some(1));
        c.payload(Some(1), Some(0));
        c.payload(None, Some(0));
        c.payload(Some(1), None);
        let s = c.snapshot(&[]);
        assert_eq!(s.cpus_used(), vec![0, 3, 64, 1023]);
        assert_eq!(s.cpus_unrecorded, 2);
        assert_eq!(
            (s.payloads_on_node, s.payloads_off_node, s.payloads_unplaced),
            (2, 1, 2)
        );
        let later = {
            c.payload(Some(1), Some(1));
            c.snapshot(&[])
        };
        assert_eq!(later.since(&s).payloads_on_node, 1);
        assert_eq!(later.since(&s).cpus_used(), vec![0, 3, 64, 1023]);
    }
}
