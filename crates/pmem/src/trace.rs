//! Crash images: a recording of every store, flush and fence to traced regions, and the
//! contents a power failure could leave at any crash point.
//!
//! The persistence model (x86 with ADR):
//! - a store reaches the cache first; a cache line's stores reach the media in program order
//!   (a write-back copies the line as it is at that moment), so what survives of one line is
//!   a *prefix* of its pending stores;
//! - aligned 8-byte stores are atomic, so stores are tracked in pieces that never cross an
//!   8-byte boundary;
//! - `flush` then `fence` makes a line's earlier stores durable; a flush without a fence
//!   guarantees nothing yet;
//! - non-temporal stores bypass the cache and are durable at the next fence.
//!
//! Crash point `k < fence_count()` is "just before the k-th fence executes"; point
//! `fence_count()` is the end of the trace. The images at point `k` are every combination of
//! prefixes over the lines still pending there — exhaustively when that is at most `limit`
//! images, otherwise `limit` seeded random combinations, the first four always being
//! "nothing pending persisted", "everything persisted", "everything but the line first
//! stored to" and "everything but the line last stored to". The last two are the images a
//! missing fence leaves: data stored before a commit record (in the same fence interval)
//! lost while the record survived, which random combinations of many lines almost never
//! draw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::region::{Backing, Inner, PersistenceMode, Region, lines};

const ATOMIC_BYTES: usize = 8;

/// Stores not yet durable, per (region, line start): each as (offset, bytes), in order.
type PendingStores = Vec<((usize, usize), Vec<(usize, Vec<u8>)>)>;

#[derive(Debug, Clone)]
enum Event {
    Store {
        region: usize,
        at: usize,
        data: Vec<u8>,
        nontemporal: bool,
    },
    Flush {
        region: usize,
        at: usize,
        len: usize,
    },
    Fence,
}

#[derive(Debug, Default)]
pub(crate) struct TraceState {
    initial: Vec<Vec<u8>>,
    memory: Vec<Vec<u8>>,
    events: Vec<Event>,
    fences: usize,
}

impl TraceState {
    pub(crate) fn read(&self, region: usize, at: usize, buf: &mut [u8]) {
        buf.copy_from_slice(&self.memory[region][at..at + buf.len()]);
    }

    pub(crate) fn store(&mut self, region: usize, at: usize, data: &[u8], nontemporal: bool) {
        self.memory[region][at..at + data.len()].copy_from_slice(data);
        self.events.push(Event::Store {
            region,
            at,
            data: data.to_vec(),
            nontemporal,
        });
    }

    pub(crate) fn flush(&mut self, region: usize, at: usize, len: usize) {
        self.events.push(Event::Flush { region, at, len });
    }

    pub(crate) fn fence(&mut self) {
        self.events.push(Event::Fence);
        self.fences += 1;
    }
}

/// Records stores to the regions it creates and generates crash images from the record.
#[derive(Debug, Clone, Default)]
pub struct Tracer {
    state: Arc<Mutex<TraceState>>,
}

/// The contents of every traced region after one simulated power failure.
#[derive(Debug, Clone)]
pub struct CrashImage {
    /// One buffer per region, in the order the regions were created.
    pub regions: Vec<Vec<u8>>,
    /// Which prefix of each pending line this image kept, for failure messages.
    pub description: String,
}

impl Tracer {
    /// A tracer with no regions.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new zero-filled traced region of `len` bytes.
    pub fn region(&self, len: u64) -> Region {
        self.region_with(vec![0; len as usize])
    }

    /// A new traced region starting with `initial` as its durable contents (for example, a
    /// crash image being recovered).
    pub fn region_with(&self, initial: Vec<u8>) -> Region {
        let mut state = self.state.lock().expect("trace lock");
        let index = state.memory.len();
        let len = initial.len() as u64;
        state.memory.push(initial.clone());
        state.initial.push(initial);
        drop(state);
        Region::new(
            Inner {
                backing: Backing::Traced {
                    state: Arc::clone(&self.state),
                    region: index,
                },
                mode: PersistenceMode::Traced,
            },
            len,
        )
    }

    /// Fences recorded so far.
    pub fn fence_count(&self) -> usize {
        self.state.lock().expect("trace lock").fences
    }

    /// Number of crash points: one before each fence, and the end.
    pub fn crash_points(&self) -> usize {
        self.fence_count() + 1
    }

    /// What the regions hold now (every store visible, as the running program sees them).
    pub fn contents(&self) -> Vec<Vec<u8>> {
        self.state.lock().expect("trace lock").memory.clone()
    }

    /// The images a power failure at crash point `point` could leave; see the module docs.
    pub fn crash_images(&self, point: usize, limit: usize, seed: u64) -> CrashImages {
        let state = self.state.lock().expect("trace lock");
        assert!(
            point <= state.fences,
            "crash point {point} beyond {} fences",
            state.fences
        );
        let mut durable = state.initial.clone();
        let mut pending: BTreeMap<(usize, usize), PendingLine> = BTreeMap::new();
        let mut fences_seen = 0;
        for (index, event) in state.events.iter().enumerate() {
            match event {
                Event::Fence => {
                    if fences_seen == point {
                        break;
                    }
                    fences_seen += 1;
                    pending.retain(|&(region, _), line| {
                        for (at, data) in line.stores.drain(..line.flushed) {
                            durable[region][at..at + data.len()].copy_from_slice(&data);
                        }
                        line.ages.drain(..line.flushed);
                        line.flushed = 0;
                        !line.stores.is_empty()
                    });
                }
                Event::Store {
                    region,
                    at,
                    data,
                    nontemporal,
                } => {
                    let mut offset = 0;
                    while offset < data.len() {
                        let piece_at = at + offset;
                        let room = ATOMIC_BYTES - piece_at % ATOMIC_BYTES;
                        let piece = room.min(data.len() - offset);
                        let line_start = piece_at - piece_at % crate::cpu::CACHE_LINE;
                        let line = pending.entry((*region, line_start)).or_default();
                        line.ages.push(index);
                        line.stores
                            .push((piece_at, data[offset..offset + piece].to_vec()));
                        if *nontemporal {
                            line.flushed = line.stores.len();
                        }
                        offset += piece;
                    }
                }
                Event::Flush { region, at, len } => {
                    for line_start in lines(*at, *len) {
                        if let Some(line) = pending.get_mut(&(*region, line_start)) {
                            line.flushed = line.stores.len();
                        }
                    }
                }
            }
        }
        // A line's age is that of its first store no fence made durable.
        let by_age = |newest: bool| {
            let ages = pending.values().map(|line| line.ages[0]);
            let age = if newest { ages.max() } else { ages.min() };
            age.and_then(|age| pending.values().position(|l| l.ages[0] == age))
        };
        let (oldest, newest) = (by_age(false), by_age(true));
        let lines: PendingStores = pending
            .into_iter()
            .map(|(key, line)| (key, line.stores))
            .collect();
        let total = lines.iter().fold(1u128, |product, (_, stores)| {
            product.saturating_mul(stores.len() as u128 + 1)
        });
        let exhaustive = total <= limit as u128;
        let count = if exhaustive {
            total as usize
        } else {
            limit.max(4)
        };
        CrashImages {
            durable,
            lines,
            exhaustive,
            total,
            count,
            produced: 0,
            point,
            seed,
            rng: SmallRng::seed_from_u64(seed),
            oldest,
            newest,
        }
    }
}

#[derive(Debug, Default)]
struct PendingLine {
    stores: Vec<(usize, Vec<u8>)>,
    flushed: usize,
    /// The event of each store, in order.
    ages: Vec<usize>,
}

/// The crash images at one crash point, produced one at a time.
#[derive(Debug)]
pub struct CrashImages {
    durable: Vec<Vec<u8>>,
    lines: PendingStores,
    exhaustive: bool,
    total: u128,
    count: usize,
    produced: usize,
    point: usize,
    seed: u64,
    rng: SmallRng,
    /// Which of `lines` was first stored to, and which last (by first pending store).
    oldest: Option<usize>,
    newest: Option<usize>,
}

impl CrashImages {
    /// True when the images are every possible one, false when they are a random sample.
    pub fn is_exhaustive(&self) -> bool {
        self.exhaustive
    }

    /// How many distinct images a crash at this point could leave (saturating).
    pub fn possible(&self) -> u128 {
        self.total
    }

    /// Cache lines with stores not yet durable at this point.
    pub fn pending_lines(&self) -> usize {
        self.lines.len()
    }
}

impl Iterator for CrashImages {
    type Item = CrashImage;

    fn next(&mut self) -> Option<CrashImage> {
        if self.produced >= self.count {
            return None;
        }
        let index = self.produced;
        self.produced += 1;
        let prefixes: Vec<usize> = if self.exhaustive {
            let mut rest = index;
            self.lines
                .iter()
                .map(|(_, stores)| {
                    let radix = stores.len() + 1;
                    let digit = rest % radix;
                    rest /= radix;
                    digit
                })
                .collect()
        } else if index == 0 {
            vec![0; self.lines.len()]
        } else if index <= 3 {
            let dropped = match index {
                2 => self.oldest,
                3 => self.newest,
                _ => None,
            };
            self.lines
                .iter()
                .enumerate()
                .map(|(i, (_, stores))| if Some(i) == dropped { 0 } else { stores.len() })
                .collect()
        } else {
            self.lines
                .iter()
                .map(|(_, stores)| self.rng.random_range(0..=stores.len()))
                .collect()
        };

        let mut regions = self.durable.clone();
        let mut described = Vec::new();
        for (((region, line), stores), &keep) in self.lines.iter().zip(&prefixes) {
            for (at, data) in &stores[..keep] {
                regions[*region][*at..*at + data.len()].copy_from_slice(data);
            }
            described.push(format!("r{region}+{line:#x}:{keep}/{}", stores.len()));
        }
        let description = format!(
            "crash point {}, image {index} of {} ({}, seed {}): {}",
            self.point,
            self.count,
            if self.exhaustive {
                "exhaustive"
            } else {
                "sampled"
            },
            self.seed,
            described.join(" ")
        );
        Some(CrashImage {
            regions,
            description,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(tracer: &Tracer, point: usize) -> Vec<Vec<u8>> {
        tracer
            .crash_images(point, 1 << 16, 1)
            .map(|image| image.regions[0].clone())
            .collect()
    }

    /// A sample always holds the images a missing fence leaves: everything persisted but the
    /// line stored to first (data lost under its commit record), and but the line stored to
    /// last — whatever the lines' addresses.
    #[test]
    fn samples_drop_the_oldest_and_the_newest_line() {
        let tracer = Tracer::new();
        let region = tracer.region(64 * 8);
        // Stored to in the order 5, 2, 7, 0, 3 (never in address order), no fence.
        for (n, line) in [5u64, 2, 7, 0, 3].into_iter().enumerate() {
            region.write(line * 64, &[n as u8 + 1; 8]).unwrap();
        }
        let images: Vec<Vec<u8>> = tracer
            .crash_images(0, 4, 9)
            .map(|image| image.regions[0].clone())
            .collect();
        assert_eq!(images.len(), 4, "32 possible images, 4 sampled");
        let kept = |image: &Vec<u8>| -> Vec<u64> {
            (0..8u64)
                .filter(|&l| image[(l * 64) as usize] != 0)
                .collect()
        };
        assert_eq!(kept(&images[0]), Vec::<u64>::new());
        assert_eq!(kept(&images[1]), vec![0, 2, 3, 5, 7]);
        assert_eq!(kept(&images[2]), vec![0, 2, 3, 7], "all but the oldest (5)");
        assert_eq!(kept(&images[3]), vec![0, 2, 5, 7], "all but the newest (3)");
    }

    #[test]
    fn unflushed_stores_may_or_may_not_persist() {
        let tracer = Tracer::new();
        let region = tracer.region(128);
        region.write(0, &[1; 8]).unwrap();
        region.write(64, &[2; 8]).unwrap();
        let found = images(&tracer, 0);
        assert_eq!(found.len(), 4);
        let pairs: std::collections::BTreeSet<(u8, u8)> =
            found.iter().map(|i| (i[0], i[64])).collect();
        assert_eq!(
            pairs,
            [(0, 0), (0, 2), (1, 0), (1, 2)].into_iter().collect()
        );
    }

    #[test]
    fn flushed_and_fenced_stores_are_durable() {
        let tracer = Tracer::new();
        let region = tracer.region(128);
        region.write(0, &[1; 8]).unwrap();
        region.persist(0, 8).unwrap();
        region.write(64, &[2; 8]).unwrap();
        // At the end, line 0 is durable and line 64 may or may not be.
        let end = images(&tracer, tracer.fence_count());
        assert_eq!(end.len(), 2);
        assert!(end.iter().all(|i| i[0] == 1));
        // Just before the fence, line 0 may or may not be durable and line 64 was not yet
        // written.
        let before = images(&tracer, 0);
        assert_eq!(before.len(), 2);
        assert!(before.iter().all(|i| i[64] == 0));
        assert!(before.iter().any(|i| i[0] == 0) && before.iter().any(|i| i[0] == 1));
    }

    #[test]
    fn a_flush_without_a_fence_guarantees_nothing() {
        let tracer = Tracer::new();
        let region = tracer.region(64);
        region.write(0, &[9; 8]).unwrap();
        region.flush(0, 8).unwrap();
        let end = images(&tracer, tracer.fence_count());
        assert_eq!(end.len(), 2);
        assert!(end.iter().any(|i| i[0] == 0));
    }

    #[test]
    fn same_line_stores_persist_in_order() {
        let tracer = Tracer::new();
        let region = tracer.region(64);
        region.store_u64(0, 1).unwrap();
        region.store_u64(8, 2).unwrap();
        let found = images(&tracer, 0);
        let states: Vec<(u8, u8)> = found.iter().map(|i| (i[0], i[8])).collect();
        assert_eq!(
            states,
            vec![(0, 0), (1, 0), (1, 2)],
            "never the later store alone"
        );
    }

    #[test]
    fn wide_stores_tear_at_eight_byte_boundaries_only() {
        let tracer = Tracer::new();
        let region = tracer.region(64);
        region.write(4, &[7; 8]).unwrap();
        for image in images(&tracer, 0) {
            assert!(
                image[4..8].iter().all(|&b| b == image[4]),
                "torn inside a word: {image:?}"
            );
            assert!(image[8..12].iter().all(|&b| b == image[8]));
        }
    }

    #[test]
    fn nontemporal_stores_are_durable_at_the_fence() {
        let tracer = Tracer::new();
        let region = tracer.region(256);
        region.write_nt(0, &[5; 256]).unwrap();
        region.fence();
        let end = images(&tracer, 1);
        assert_eq!(end, vec![vec![5; 256]]);
    }

    #[test]
    fn large_points_are_sampled_with_their_seed() {
        let tracer = Tracer::new();
        let region = tracer.region(64 * 40);
        for line in 0..40 {
            region.write(line * 64, &[1; 8]).unwrap();
        }
        let sampled = tracer.crash_images(0, 100, 42);
        assert!(!sampled.is_exhaustive());
        assert_eq!(sampled.possible(), 1u128 << 40);
        let first: Vec<String> = sampled.map(|i| i.description).collect();
        assert_eq!(first.len(), 100);
        assert!(first[5].contains("seed 42"));
        let again: Vec<String> = tracer
            .crash_images(0, 100, 42)
            .map(|i| i.description)
            .collect();
        assert_eq!(first, again, "the same seed gives the same images");
    }
}
