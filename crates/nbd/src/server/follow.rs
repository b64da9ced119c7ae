//! Serving a latency-bound connection on the CPU its requests arrive on.
//!
//! A client that waits for each reply before it sends its next request (queue depth 1, or a
//! guest's synchronous I/O) pays two wake-ups per request: the server's thread woken by the
//! request, the client's woken by the reply. When the two threads sit on different CPUs each
//! wake-up is an inter-processor interrupt, and on a virtual machine whose other vCPU has
//! halted that costs tens of microseconds; on one CPU it is a context switch. Measured on
//! the development machine (2 vCPUs, fio's nbd engine at queue depth 1 over loopback TCP,
//! 4 KiB requests to a file export, fio pinned to CPU 0): the connection thread free to run on
//! both CPUs served 22.7 k reads and 26.0 k writes per second; pinned to fio's CPU, 106 k
//! and 105 k. At queue depth 16 the same pinning moved 4 KiB reads from 189 k to 174 k,
//! writes from 150 k to 198 k, 64 KiB reads from 3.22 to 2.94 GB/s, and halved 1 MiB
//! transfers (4.7 → 2.8 GB/s reads, 5.0 → 2.3 GB/s writes): a connection that moves bulk
//! data is bound by copies and wants every CPU of its node.
//!
//! So a connection's thread (inline submission) looks at its last [`WINDOW`] requests: when
//! it waited for its client before at least half of them and they averaged at most
//! [`SMALL_BYTES`], it pins itself to the CPU the kernel last received the connection's data
//! on (`SO_INCOMING_CPU`: over loopback the client's CPU; from a network card, the CPU that
//! handled its receive queue), if that CPU is one of its channel's; otherwise it runs on its
//! channel's CPUs, as every thread of the channel does. This keeps Tyche's rule — a
//! channel's requests are served on its node — and narrows it to one CPU of that node only
//! while the connection is waiting on its client rather than on a CPU. Unix-domain sockets
//! do not record a receiving CPU; their connections stay on the channel's CPUs.

use super::net::Stream;
use super::stats::Counters;

/// Requests per decision.
pub(crate) const WINDOW: u32 = 128;

/// The largest mean transfer (read or write payload) of a window that may follow the client.
pub(crate) const SMALL_BYTES: u64 = 32 << 10;

/// Where a connection's thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Place {
    /// On every CPU of its channel.
    #[default]
    Channel,
    /// On this CPU alone.
    Cpu(u32),
}

/// Windows a follow must last before it counts as settled (and forgives earlier misses).
const SETTLED: u32 = 8;

/// A follow that the client left before it settled holds the thread home for 2^strikes
/// windows; strikes stop growing here (2^10 windows: ~131 k requests).
const MAX_STRIKES: u32 = 10;

/// Where a connection's thread should run, decided from one window at a time. A client
/// whose requests arrive on one CPU two windows running is followed there; one that the
/// scheduler keeps moving (the wake-up of an unpinned client goes to whichever CPU is idle,
/// which is seldom the one its server thread occupies) is followed less and less often.
#[derive(Debug, Default)]
struct Placement {
    place: Place,
    /// The client's CPU at the end of the previous window, while home.
    seen: Option<u32>,
    /// Windows to stay home before following again.
    hold: u32,
    strikes: u32,
    /// Windows spent on the client's CPU in the current follow.
    stayed: u32,
}

impl Placement {
    /// The move to make after a window that was (or was not) `latency_bound`, whose client's
    /// data last arrived on `target` (a CPU the thread may run on), if any.
    fn next(&mut self, latency_bound: bool, target: Option<u32>) -> Option<Place> {
        let target = target.filter(|_| latency_bound);
        match self.place {
            Place::Channel => {
                if self.hold > 0 {
                    self.hold -= 1;
                    self.seen = None;
                    return None;
                }
                let steady = target.is_some() && target == self.seen;
                self.seen = target;
                let cpu = target.filter(|_| steady)?;
                self.stayed = 0;
                self.place = Place::Cpu(cpu);
                Some(self.place)
            }
            Place::Cpu(cpu) => {
                if target == Some(cpu) {
                    self.stayed += 1;
                    if self.stayed >= SETTLED {
                        self.strikes = 0;
                    }
                    return None;
                }
                if latency_bound && self.stayed < SETTLED {
                    // The client moved away before the follow settled.
                    self.strikes = (self.strikes + 1).min(MAX_STRIKES);
                    self.hold = 1 << self.strikes;
                }
                self.seen = None;
                self.place = Place::Channel;
                Some(self.place)
            }
        }
    }
}

/// One connection thread's placement, decided every [`WINDOW`] requests.
#[derive(Debug)]
pub(crate) struct Follower {
    enabled: bool,
    /// The CPUs the thread may run on when it does not follow its client (its channel's).
    home: Vec<u32>,
    placement: Placement,
    requests: u32,
    waits: u32,
    bytes: u64,
}

impl Follower {
    /// A follower of the calling thread, which runs on its channel's CPUs now; it moves the
    /// thread only when `enabled`.
    pub(crate) fn new(enabled: bool) -> Self {
        let home = if enabled {
            topology::current_affinity().unwrap_or_default()
        } else {
            Vec::new()
        };
        Self {
            enabled: enabled && !home.is_empty(),
            home,
            placement: Placement::default(),
            requests: 0,
            waits: 0,
            bytes: 0,
        }
    }

    /// Counts a request that moved `bytes` of payload and whether the thread waited for it;
    /// at the end of a window, places the thread.
    pub(crate) fn request(
        &mut self,
        bytes: u32,
        waited: bool,
        stream: &Stream,
        counters: &Counters,
    ) {
        if !self.enabled {
            return;
        }
        self.requests += 1;
        self.waits += u32::from(waited);
        self.bytes += u64::from(bytes);
        if self.requests < WINDOW {
            return;
        }
        let latency_bound = latency_bound(self.requests, self.waits, self.bytes);
        (self.requests, self.waits, self.bytes) = (0, 0, 0);
        let target = latency_bound
            .then(|| stream.incoming_cpu())
            .flatten()
            .filter(|cpu| self.home.contains(cpu));
        let Some(want) = self.placement.next(latency_bound, target) else {
            return;
        };
        let pinned = match want {
            Place::Cpu(cpu) => topology::pin_current_thread(&[cpu]),
            Place::Channel => topology::pin_current_thread(&self.home),
        };
        match pinned {
            Ok(()) => counters.moved(matches!(want, Place::Cpu(_))),
            Err(e) => {
                // Stop trying where the thread is: the error would repeat.
                tracing::warn!(error = %e, "could not move a connection's thread; it stays where it runs");
                self.enabled = false;
            }
        }
    }
}

/// Whether a window of `requests` — `waits` of them waited for, `bytes` moved in all — is
/// bound by its client's latency rather than by copying: a client with one request in
/// flight makes the thread wait before every request, one with more keeps some queued.
fn latency_bound(requests: u32, waits: u32, bytes: u64) -> bool {
    requests > 0 && waits * 8 >= requests * 7 && bytes <= SMALL_BYTES * u64::from(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_waiting_on_small_requests_is_latency_bound() {
        assert!(latency_bound(WINDOW, WINDOW, 4096 * u64::from(WINDOW)));
        assert!(latency_bound(
            WINDOW,
            WINDOW / 8 * 7,
            SMALL_BYTES * u64::from(WINDOW)
        ));
    }

    #[test]
    fn requests_already_queued_or_bulk_payloads_are_not() {
        // Requests already queued: the thread is the bottleneck, not the client.
        assert!(!latency_bound(
            WINDOW,
            WINDOW / 8 * 7 - 1,
            4096 * u64::from(WINDOW)
        ));
        // Bulk transfers want every CPU of the node for their copies.
        assert!(!latency_bound(
            WINDOW,
            WINDOW,
            (SMALL_BYTES + 1) * u64::from(WINDOW)
        ));
        assert!(!latency_bound(0, 0, 0));
    }

    #[test]
    fn a_client_that_stays_on_one_cpu_is_followed_there_and_kept() {
        let mut placement = Placement::default();
        assert_eq!(
            placement.next(true, Some(3)),
            None,
            "one window is not yet steady"
        );
        assert_eq!(placement.next(true, Some(3)), Some(Place::Cpu(3)));
        for _ in 0..100 {
            assert_eq!(placement.next(true, Some(3)), None);
        }
        // Its queue deepens: back to the channel, and following again costs no wait.
        assert_eq!(placement.next(false, Some(3)), Some(Place::Channel));
        assert_eq!(placement.next(true, Some(3)), None);
        assert_eq!(placement.next(true, Some(3)), Some(Place::Cpu(3)));
    }

    #[test]
    fn a_client_the_scheduler_keeps_moving_is_followed_ever_less_often() {
        let mut placement = Placement::default();
        let mut windows_followed = 0;
        let mut follows = Vec::new();
        let mut cpu = 0;
        for window in 0..20_000u32 {
            // Two windows on one CPU, then the client moves: long enough to be followed,
            // too short to settle.
            if window % 3 == 2 {
                cpu = 1 - cpu;
            }
            if let Some(Place::Cpu(_)) = placement.next(true, Some(cpu)) {
                follows.push(window);
            }
            windows_followed += u32::from(placement.place != Place::Channel);
        }
        assert!(follows.len() < 40, "followed {} times", follows.len());
        assert!(
            windows_followed < 200,
            "{windows_followed} windows on the client's CPU"
        );
        // The waits between follows grew.
        let gaps: Vec<u32> = follows.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.last() > gaps.first(), "gaps {gaps:?}");
    }

    #[test]
    fn a_follow_that_settles_forgives_earlier_misses() {
        let mut placement = Placement::default();
        placement.next(true, Some(0));
        placement.next(true, Some(0));
        assert_eq!(placement.next(true, Some(1)), Some(Place::Channel));
        assert_eq!(placement.strikes, 1);
        for _ in 0..placement.hold {
            assert_eq!(placement.next(true, Some(1)), None, "held home");
        }
        placement.next(true, Some(1));
        assert_eq!(placement.next(true, Some(1)), Some(Place::Cpu(1)));
        for _ in 0..SETTLED {
            placement.next(true, Some(1));
        }
        assert_eq!(placement.strikes, 0);
        // A later move of the client costs no wait then.
        assert_eq!(placement.next(true, Some(0)), Some(Place::Channel));
        assert_eq!(placement.hold, 0);
    }
}
