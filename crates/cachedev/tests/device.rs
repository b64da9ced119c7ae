//! The cache device against a byte model, over a real backing file on the disk (O_DIRECT
//! through io_uring) and a real NVRAM file on an emulated persistent-memory volume: random
//! whole and partial writes and reads, crashes of the file system and the device between
//! them (the NVRAM recovered, the backing store as the device left it), the policy's counts
//! equal to the policy run alone (what `locus sim` counts), and damaged or mismatched NVRAM
//! files refused with the problem named.

use std::path::PathBuf;

use cache::{Access, Capacity, Counters, Op, Policy};
use cachedev::{BLOCK_BYTES, CacheConfig, CacheDevice, CacheError, PolicyKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = BLOCK_BYTES as u64;
const NVRAM_PATH: &str = "/cache/test.nvram";

/// A policy run on its own, counting as the simulator does.
type Reference = Box<dyn FnMut(Access, &mut Counters)>;

/// A backing file on the disk (not tmpfs: O_DIRECT as an SSD would see it).
fn backing_file(blocks: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("locus-cachedev")
        .tempdir_in("/var/tmp")
        .unwrap();
    let path = dir.path().join("backing.img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(blocks * BLOCK).unwrap();
    (dir, path)
}

/// A volume with an empty file system.
struct Volume {
    shm: testkit::ShmVolume,
}

impl Volume {
    fn new(name: &str) -> Self {
        let shm = testkit::shm_volume(name, 64 << 20);
        let fs = fs::Fs::format(
            testkit::open_volume(&shm.dir),
            &testkit::small_format(),
            testkit::small_options(),
        )
        .unwrap();
        fs.unmount().unwrap();
        Volume { shm }
    }

    fn open(&self) -> fs::Fs {
        fs::Fs::open(
            testkit::open_volume(&self.shm.dir),
            testkit::small_options(),
        )
        .unwrap()
    }
}

/// Write-back only on eviction (the simulator's model).
fn config(policy: PolicyKind, nvram_blocks: u64, dram_blocks: u64) -> CacheConfig {
    CacheConfig {
        nvram_bytes: nvram_blocks * BLOCK,
        dram_bytes: dram_blocks * BLOCK,
        policy,
        writeback: None,
    }
}

/// With background write-back where the policy has an order for it.
fn config_background(policy: PolicyKind, nvram_blocks: u64, dram_blocks: u64) -> CacheConfig {
    CacheConfig {
        writeback: (policy != PolicyKind::Lru)
            .then_some(cachedev::Watermarks { high: 50, low: 25 }),
        ..config(policy, nvram_blocks, dram_blocks)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Random writes (whole blocks and unaligned ranges) and reads against a byte model, the
/// file system and the device "crashing" (dropped without unmount or write-back) every few
/// hundred operations; after each restart the whole device must equal the model.
fn model_run(policy: PolicyKind, seed: u64) {
    let blocks = 256;
    let volume = Volume::new(&format!("cachedev-model-{}", policy.name()));
    let (_dir, backing) = backing_file(blocks);
    let config = config_background(policy, 24, 16);
    let mut model = vec![0u8; (blocks * BLOCK) as usize];
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..4 {
        let fs = volume.open();
        let device = CacheDevice::open(&fs, NVRAM_PATH, &backing, &config).unwrap();
        // Everything acknowledged before the crash is there.
        let mut all = vec![0u8; model.len()];
        device.read(0, &mut all).unwrap();
        assert!(
            all == model,
            "{policy:?} round {round}: the device differs from the model after restart"
        );
        for op in 0..400 {
            // A hot set of 48 blocks (twice NVRAM) and the odd cold block.
            let block = if rng.random_bool(0.8) {
                rng.random_range(0..48)
            } else {
                rng.random_range(0..blocks)
            };
            match rng.random_range(0..10) {
                0..4 => {
                    let data = pattern(seed ^ (round * 1000 + op), BLOCK as usize);
                    device.write(block * BLOCK, &data).unwrap();
                    model[(block * BLOCK) as usize..][..data.len()].copy_from_slice(&data);
                }
                4..6 => {
                    let at = block * BLOCK + rng.random_range(0..BLOCK);
                    let len = rng.random_range(1..3 * BLOCK).min(blocks * BLOCK - at);
                    let data = pattern(seed ^ (round * 1000 + op) ^ 0xFF, len as usize);
                    device.write(at, &data).unwrap();
                    model[at as usize..][..data.len()].copy_from_slice(&data);
                }
                6 => {
                    // TRIM: whole blocks inside the range read as zeros after it.
                    let at = block * BLOCK + rng.random_range(0..BLOCK);
                    let len = rng.random_range(1..4 * BLOCK).min(blocks * BLOCK - at);
                    device.discard(at, len).unwrap();
                    let (first, end) = (at.div_ceil(BLOCK) * BLOCK, (at + len) / BLOCK * BLOCK);
                    if first < end {
                        model[first as usize..end as usize].fill(0);
                    }
                }
                7 => {
                    let at = block * BLOCK + rng.random_range(0..BLOCK);
                    let len = rng.random_range(1..4 * BLOCK).min(blocks * BLOCK - at);
                    device.write_zeroes(at, len).unwrap();
                    model[at as usize..(at + len) as usize].fill(0);
                }
                _ => {
                    let at = block * BLOCK + rng.random_range(0..BLOCK);
                    let len = rng.random_range(1..2 * BLOCK).min(blocks * BLOCK - at);
                    let mut out = vec![0u8; len as usize];
                    device.read(at, &mut out).unwrap();
                    assert!(
                        out[..] == model[at as usize..][..len as usize],
                        "{policy:?} round {round} op {op}: read {len} at {at} differs"
                    );
                }
            }
        }
        let stats = device.stats();
        assert!(
            stats.dirty_blocks > 0,
            "the run leaves dirty blocks: {stats:?}"
        );
        assert!(
            stats.writebacks > 0,
            "the hot set overflows NVRAM: {stats:?}"
        );
        drop(device);
        fs.abandon(); // a crash: no checkpoint, no unmount
    }
}

#[test]
fn nbm_matches_a_byte_model_across_crashes() {
    model_run(PolicyKind::Nbm, 1);
}

#[test]
fn nvlru_matches_a_byte_model_across_crashes() {
    model_run(PolicyKind::NvLru, 2);
}

#[test]
fn lru_matches_a_byte_model_across_crashes() {
    model_run(PolicyKind::Lru, 3);
}

/// The backing store alone, read outside the cache, holds every block the device wrote back
/// and never a block that is still dirty in NVRAM with newer data than it.
#[test]
fn written_back_blocks_are_on_the_backing_store_itself() {
    let volume = Volume::new("cachedev-backing");
    let (_dir, backing) = backing_file(64);
    let fs = volume.open();
    let device =
        CacheDevice::open(&fs, NVRAM_PATH, &backing, &config(PolicyKind::Nbm, 4, 4)).unwrap();
    for block in 0..16u64 {
        device
            .write(block * BLOCK, &pattern(block, BLOCK as usize))
            .unwrap();
    }
    let stats = device.stats();
    assert_eq!(stats.dirty_blocks, 4);
    assert_eq!(stats.writebacks, 12, "16 writes through a 4-block NVRAM");
    let raw = std::fs::read(&backing).unwrap();
    let mut on_backing = 0;
    for block in 0..16u64 {
        let here = &raw[(block * BLOCK) as usize..][..BLOCK as usize];
        if here == pattern(block, BLOCK as usize) {
            on_backing += 1;
        } else {
            assert!(
                here.iter().all(|&b| b == 0),
                "block {block}: neither old nor new"
            );
        }
    }
    assert_eq!(on_backing, 12, "exactly the written-back blocks");
    drop(device);
    fs.unmount().unwrap();
}

/// For the same whole-block accesses, the device's policy counters equal the policy's own
/// (what the simulator reports), and its backing-store traffic is what they say.
#[test]
fn device_counts_equal_the_policy_run_alone() {
    for policy in [PolicyKind::Nbm, PolicyKind::NvLru, PolicyKind::Lru] {
        let volume = Volume::new(&format!("cachedev-counts-{}", policy.name()));
        let (_dir, backing) = backing_file(128);
        let fs = volume.open();
        let capacity = Capacity {
            dram_blocks: 8,
            nvram_blocks: 6,
        };
        let device = CacheDevice::open(
            &fs,
            NVRAM_PATH,
            &backing,
            &config(
                policy,
                capacity.nvram_blocks as u64,
                capacity.dram_blocks as u64,
            ),
        )
        .unwrap();
        let mut alone = Counters::default();
        let mut reference: Reference = match policy {
            PolicyKind::Nbm => {
                let mut p = cache::Nbm::new(capacity);
                Box::new(move |a, c| p.access(a, c))
            }
            PolicyKind::NvLru => {
                let mut p = cache::NvLru::new(capacity);
                Box::new(move |a, c| p.access(a, c))
            }
            PolicyKind::Lru => {
                let mut p = cache::Lru::new(capacity);
                Box::new(move |a, c| p.access(a, c))
            }
        };
        let mut rng = StdRng::seed_from_u64(7);
        let mut buf = vec![0u8; BLOCK as usize];
        for i in 0..3000u64 {
            let block: u32 = if rng.random_bool(0.7) {
                rng.random_range(0..20)
            } else {
                rng.random_range(0..128)
            };
            let op = if rng.random_bool(0.4) {
                Op::Write
            } else {
                Op::Read
            };
            reference(Access { block, op }, &mut alone);
            alone.accesses += 1;
            match op {
                Op::Write => device
                    .write(u64::from(block) * BLOCK, &pattern(i, BLOCK as usize))
                    .unwrap(),
                Op::Read => device.read(u64::from(block) * BLOCK, &mut buf).unwrap(),
            }
        }
        let counted = device.policy_counters();
        assert_eq!(counted, alone, "{policy:?}");
        let stats = device.stats();
        assert_eq!(stats.backing_reads, alone.storage_reads, "{policy:?}");
        assert_eq!(stats.writebacks, alone.writebacks, "{policy:?}");
        assert!(
            alone.writebacks > 100 && alone.storage_reads > 100,
            "{alone:?}"
        );
        drop(device);
        fs.unmount().unwrap();
    }
}

fn nvram_bytes(fs: &fs::Fs) -> Vec<u8> {
    let file = fs.open_read(NVRAM_PATH).unwrap();
    let mut all = vec![0u8; file.len() as usize];
    let mut done = 0;
    while done < all.len() {
        let n = file.read_at(&mut all[done..], done as u64).unwrap();
        assert!(n > 0);
        done += n;
    }
    all
}

/// A damaged index entry or header is refused, naming it, and nothing is changed; a
/// configuration that does not match the file is refused, naming the difference.
#[test]
fn damaged_or_mismatched_nvram_is_refused_with_the_problem_named() {
    let volume = Volume::new("cachedev-damage");
    let (_dir, backing) = backing_file(32);
    let fs = volume.open();
    let good = config(PolicyKind::Nbm, 4, 4);
    let device = CacheDevice::open(&fs, NVRAM_PATH, &backing, &good).unwrap();
    device.write(0, &pattern(1, BLOCK as usize)).unwrap();
    drop(device);

    let e = CacheDevice::open(&fs, NVRAM_PATH, &backing, &config(PolicyKind::Nbm, 8, 4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("NVRAM slots 4, not 8"), "{e}");

    // Flip a bit in entry 0 (the written block's).
    let before = nvram_bytes(&fs);
    let file = fs
        .open_file(NVRAM_PATH, fs::OpenOptions::read_write())
        .unwrap();
    let at = BLOCK + 9;
    file.write_at(&[before[at as usize] ^ 0x04], at).unwrap();
    drop(file);
    let e = CacheDevice::open(&fs, NVRAM_PATH, &backing, &good).unwrap_err();
    assert!(matches!(e, CacheError::Format { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("index entry 0") && e.contains("checksum"), "{e}");
    let mut after = nvram_bytes(&fs);
    after[at as usize] ^= 0x04;
    assert!(after == before, "refusing changed nothing");

    // A header that is not a cache's.
    let file = fs
        .open_file(NVRAM_PATH, fs::OpenOptions::read_write())
        .unwrap();
    file.write_at(b"NOTCACHE", 0).unwrap();
    drop(file);
    let e = CacheDevice::open(&fs, NVRAM_PATH, &backing, &good)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no cache header"), "{e}");
    fs.unmount().unwrap();
}

#[test]
fn requests_outside_the_device_and_bad_sizes_are_refused() {
    let volume = Volume::new("cachedev-bounds");
    let (_dir, backing) = backing_file(8);
    let fs = volume.open();
    let e = CacheDevice::open(&fs, NVRAM_PATH, &backing, &config(PolicyKind::Nbm, 0, 4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one block"), "{e}");
    let odd = CacheConfig {
        nvram_bytes: 5000,
        ..config(PolicyKind::Nbm, 1, 0)
    };
    let e = CacheDevice::open(&fs, NVRAM_PATH, &backing, &odd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nvram=5000 is not a multiple"), "{e}");
    let device =
        CacheDevice::open(&fs, NVRAM_PATH, &backing, &config(PolicyKind::Nbm, 2, 2)).unwrap();
    let e = device.write(8 * BLOCK - 1, &[1, 2]).unwrap_err();
    assert!(matches!(e, CacheError::OutOfRange { .. }), "{e}");
    let mut out = [0u8; 2];
    device.read(8 * BLOCK - 2, &mut out).unwrap();
    drop(device);
    fs.unmount().unwrap();
}

/// Above the high watermark the background writer writes blocks back, in the policy's order,
/// down to the low one — with no eviction asking for it — and the backing store has them.
#[test]
fn background_write_back_runs_between_the_watermarks() {
    for policy in [PolicyKind::Nbm, PolicyKind::NvLru] {
        let volume = Volume::new(&format!("cachedev-background-{}", policy.name()));
        let (_dir, backing) = backing_file(64);
        let fs = volume.open();
        // 20 NVRAM blocks: start above 10, stop at 5.
        let device =
            CacheDevice::open(&fs, NVRAM_PATH, &backing, &config_background(policy, 20, 4))
                .unwrap();
        for block in 0..12u64 {
            device
                .write(block * BLOCK, &pattern(block, BLOCK as usize))
                .unwrap();
        }
        // The writer wakes when the 11th block makes NVRAM fuller than 10 and writes back
        // down to 5; the 12th write may land during that batch, leaving 6.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while device.stats().dirty_blocks > 6 {
            assert!(
                std::time::Instant::now() < deadline,
                "{policy:?}: not written back: {:?}",
                device.stats()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let stats = device.stats();
        assert!(
            (5..=6).contains(&stats.dirty_blocks),
            "{policy:?}: down to the low mark, no further: {stats:?}"
        );
        let written = 12 - stats.dirty_blocks;
        assert_eq!(stats.writebacks, written, "{policy:?}: {stats:?}");
        // The oldest writes went first (both policies' order for blocks written once).
        let raw = std::fs::read(&backing).unwrap();
        for block in 0..12u64 {
            let on_backing = raw[(block * BLOCK) as usize..][..BLOCK as usize]
                == pattern(block, BLOCK as usize)[..];
            assert_eq!(on_backing, block < written, "{policy:?}: block {block}");
        }
        // Everything still reads back.
        let mut out = vec![0u8; BLOCK as usize];
        for block in 0..12u64 {
            device.read(block * BLOCK, &mut out).unwrap();
            assert!(
                out == pattern(block, BLOCK as usize),
                "{policy:?}: block {block}"
            );
        }
        drop(device);
        fs.unmount().unwrap();
    }
}
