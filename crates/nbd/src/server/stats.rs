//! A channel's counters: connections, requests by kind, bytes, errors and a latency
//! histogram with power-of-two microsecond buckets. Updated with relaxed atomics by the
//! channel's own threads only, so they stay in the channel's cache lines.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::consts::command;

/// Latency buckets: bucket `i` counts requests that took less than `2^i` µs (the last one
/// everything slower).
pub const LATENCY_BUCKETS: usize = 32;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) open_connections: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    others: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    errors: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

impl Counters {
    /// Counts one finished request.
    pub(crate) fn request(&self, cmd: u16, len: u32, ok: bool, latency: Duration) {
        let relaxed = Ordering::Relaxed;
        match (cmd, ok) {
            (command::READ, true) => {
                self.reads.fetch_add(1, relaxed);
                self.read_bytes.fetch_add(u64::from(len), relaxed);
            }
            (command::WRITE, true) => {
                self.writes.fetch_add(1, relaxed);
                self.written_bytes.fetch_add(u64::from(len), relaxed);
            }
            (_, true) => {
                self.others.fetch_add(1, relaxed);
            }
            (_, false) => {
                self.errors.fetch_add(1, relaxed);
            }
        }
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        self.latency[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, relaxed);
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            connections: load(&self.connections),
            open_connections: load(&self.open_connections),
            reads: load(&self.reads),
            writes: load(&self.writes),
            others: load(&self.others),
            read_bytes: load(&self.read_bytes),
            written_bytes: load(&self.written_bytes),
            errors: load(&self.errors),
            latency: std::array::from_fn(|i| load(&self.latency[i])),
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

    /// The change since `earlier` (open connections stay as now).
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_power_of_two_buckets_and_quantiles_read_them_back() {
        let c = Counters::default();
        for _ in 0..90 {
            c.request(command::READ, 4096, true, Duration::from_micros(20)); // < 32 µs
        }
        for _ in 0..10 {
            c.request(command::WRITE, 512, true, Duration::from_micros(700)); // < 1024 µs
        }
        c.request(command::FLUSH, 0, false, Duration::from_secs(100_000));
        let s = c.snapshot();
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
    }
}
