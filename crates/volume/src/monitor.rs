//! The monitor of MBS-LVM's Algorithm 1: for each requesting node, a *candidate* list of
//! devices ordered by access latency, and a *fat* set of devices too full to be chosen.
//!
//! A device turns fat when its free space falls below `fat_below` and becomes a candidate
//! again only above `candidate_above` (hysteresis, so a device near the line does not flip
//! on every allocation). States change when an allocation or free crosses a threshold, and a
//! periodic check (a sleeping thread, never a busy loop) re-evaluates every device. Each
//! state change recomputes, for every node, the first non-fat device of its list; the hot
//! path, [`Monitor::decide_target`], is a single atomic load.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const NO_TARGET: u32 = u32::MAX;

/// Free-space thresholds, in basis points (1/100 of a percent) of a device's data space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// A candidate turns fat when free space drops below this (default 2%).
    pub fat_below_bp: u64,
    /// A fat device becomes a candidate again when free space rises above this (default 5%).
    pub candidate_above_bp: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            fat_below_bp: 200,
            candidate_above_bp: 500,
        }
    }
}

/// Candidate and fat lists for every requesting node.
#[derive(Debug)]
pub struct Monitor {
    thresholds: Thresholds,
    capacity_bytes: Vec<u64>,
    free_bytes: Vec<AtomicU64>,
    fat: Vec<AtomicBool>,
    /// Devices in latency order, per requesting node id (empty for ids that are not nodes).
    orders: Vec<Vec<u32>>,
    /// First non-fat device of each node's order, or `NO_TARGET`.
    targets: Vec<AtomicU32>,
    /// Serialises state changes and target recomputation (rare), never the hot path.
    transitions: Mutex<()>,
    transition_count: AtomicU64,
}

impl Monitor {
    /// A monitor for devices with these data capacities and free bytes, where `orders[node]`
    /// lists every device in the order node `node` should use them.
    pub fn new(
        thresholds: Thresholds,
        capacity_bytes: Vec<u64>,
        free_bytes: &[u64],
        orders: Vec<Vec<u32>>,
    ) -> Self {
        assert!(
            thresholds.fat_below_bp <= thresholds.candidate_above_bp,
            "hysteresis inverted"
        );
        let monitor = Self {
            thresholds,
            fat: capacity_bytes
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            free_bytes: free_bytes.iter().map(|&f| AtomicU64::new(f)).collect(),
            capacity_bytes,
            targets: orders.iter().map(|_| AtomicU32::new(NO_TARGET)).collect(),
            orders,
            transitions: Mutex::new(()),
            transition_count: AtomicU64::new(0),
        };
        for device in 0..monitor.capacity_bytes.len() {
            let below = monitor.below(
                device,
                monitor.free_bytes[device].load(Ordering::Relaxed),
                monitor.thresholds.fat_below_bp,
            );
            monitor.fat[device].store(below, Ordering::Relaxed);
        }
        monitor.recompute_targets();
        monitor
    }

    /// The device node `node`'s next allocation should come from: the nearest candidate.
    /// `None` when every device is fat (allocation then tries the fat ones) or `node` is not
    /// a known node. O(1).
    pub fn decide_target(&self, node: u32) -> Option<u32> {
        let target = self.targets.get(node as usize)?.load(Ordering::Acquire);
        (target != NO_TARGET).then_some(target)
    }

    /// All devices in `node`'s latency order (candidates and fat alike).
    pub fn order(&self, node: u32) -> Option<&[u32]> {
        self.orders
            .get(node as usize)
            .filter(|o| !o.is_empty())
            .map(Vec::as_slice)
    }

    /// Whether a device is on the fat list.
    pub fn is_fat(&self, device: u32) -> bool {
        self.fat[device as usize].load(Ordering::Acquire)
    }

    /// Free bytes of a device as last reported.
    pub fn free_bytes(&self, device: u32) -> u64 {
        self.free_bytes[device as usize].load(Ordering::Acquire)
    }

    /// How many candidate/fat transitions have happened (for tests and stats).
    pub fn transitions(&self) -> u64 {
        self.transition_count.load(Ordering::Relaxed)
    }

    /// Records a device's new free space and moves it between the lists if it crossed a
    /// threshold.
    pub fn update(&self, device: u32, free_bytes: u64) {
        self.free_bytes[device as usize].store(free_bytes, Ordering::Release);
        if self.should_flip(device as usize, free_bytes) {
            self.flip_checked(device as usize);
        }
    }

    /// Re-evaluates every device (the periodic check).
    pub fn check_all(&self) {
        for device in 0..self.capacity_bytes.len() {
            let free = self.free_bytes[device].load(Ordering::Acquire);
            if self.should_flip(device, free) {
                self.flip_checked(device);
            }
        }
    }

    fn should_flip(&self, device: usize, free: u64) -> bool {
        if self.fat[device].load(Ordering::Acquire) {
            u128::from(free) * 10_000
                > u128::from(self.capacity_bytes[device])
                    * u128::from(self.thresholds.candidate_above_bp)
        } else {
            self.below(device, free, self.thresholds.fat_below_bp)
        }
    }

    fn below(&self, device: usize, free: u64, threshold_bp: u64) -> bool {
        u128::from(free) * 10_000
            < u128::from(self.capacity_bytes[device]) * u128::from(threshold_bp)
    }

    /// Flips a device's state under the transition lock, re-checking first: another thread
    /// may have flipped it already.
    fn flip_checked(&self, device: usize) {
        let _guard = self.transitions.lock().expect("monitor lock");
        let free = self.free_bytes[device].load(Ordering::Acquire);
        if !self.should_flip(device, free) {
            return;
        }
        let now_fat = !self.fat[device].load(Ordering::Acquire);
        self.fat[device].store(now_fat, Ordering::Release);
        self.transition_count.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(device, now_fat, free, "monitor: device changed lists");
        self.recompute_targets();
    }

    fn recompute_targets(&self) {
        for (order, target) in self.orders.iter().zip(&self.targets) {
            let first = order
                .iter()
                .copied()
                .find(|&d| !self.fat[d as usize].load(Ordering::Acquire));
            target.store(first.unwrap_or(NO_TARGET), Ordering::Release);
        }
    }
}

/// The periodic check: a thread that calls [`Monitor::check_all`] every `interval` until
/// dropped.
#[derive(Debug)]
pub struct PeriodicCheck {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeriodicCheck {
    /// Starts checking `monitor` every `interval`; `on_thread` runs first in its thread.
    pub fn start(monitor: Arc<Monitor>, interval: Duration, on_thread: Option<fn()>) -> Self {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("locus-monitor".into())
            .spawn(move || {
                if let Some(hook) = on_thread {
                    hook();
                }
                let (lock, wake) = &*thread_stop;
                let mut stopped = lock.lock().expect("monitor stop lock");
                while !*stopped {
                    let (guard, _) = wake
                        .wait_timeout(stopped, interval)
                        .expect("monitor stop lock");
                    stopped = guard;
                    if !*stopped {
                        monitor.check_all();
                    }
                }
            })
            .expect("spawn the monitor thread");
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PeriodicCheck {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().expect("monitor stop lock") = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two devices of 10_000 bytes; node 0 prefers device 0, node 1 device 1.
    fn monitor() -> Monitor {
        Monitor::new(
            Thresholds::default(),
            vec![10_000, 10_000],
            &[10_000, 10_000],
            vec![vec![0, 1], vec![1, 0]],
        )
    }

    #[test]
    fn local_device_is_the_target_until_it_turns_fat() {
        let monitor = monitor();
        assert_eq!(monitor.decide_target(0), Some(0));
        monitor.update(0, 200); // exactly 2%: not below, still a candidate
        assert_eq!(monitor.decide_target(0), Some(0));
        monitor.update(0, 199); // below 2%: fat
        assert!(monitor.is_fat(0));
        assert_eq!(
            monitor.decide_target(0),
            Some(1),
            "falls to the next device in latency order"
        );
        assert_eq!(monitor.decide_target(1), Some(1));
        assert_eq!(monitor.transitions(), 1);
    }

    #[test]
    fn hysteresis_keeps_a_fat_device_fat_until_five_percent() {
        let monitor = monitor();
        monitor.update(0, 100);
        assert!(monitor.is_fat(0));
        for free in [300, 400, 500] {
            monitor.update(0, free);
            assert!(monitor.is_fat(0), "still fat at {free}");
        }
        monitor.update(0, 501);
        assert!(!monitor.is_fat(0));
        assert_eq!(monitor.decide_target(0), Some(0));
        assert_eq!(monitor.transitions(), 2);
    }

    #[test]
    fn no_target_when_every_device_is_fat_or_the_node_is_unknown() {
        let monitor = monitor();
        monitor.update(0, 0);
        monitor.update(1, 0);
        assert_eq!(monitor.decide_target(0), None);
        assert_eq!(monitor.decide_target(7), None);
    }

    #[test]
    fn the_periodic_check_catches_up_without_updates() {
        let monitor = Arc::new(monitor());
        // Free space recorded without a threshold check (as after an external change).
        monitor.free_bytes[1].store(50, Ordering::Release);
        assert!(!monitor.is_fat(1));
        let check = PeriodicCheck::start(Arc::clone(&monitor), Duration::from_millis(5), None);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !monitor.is_fat(1) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(check);
        assert!(monitor.is_fat(1));
        assert_eq!(monitor.decide_target(1), Some(0));
    }
}
