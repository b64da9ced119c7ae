//! Crash images of the cache device's NVRAM updates: each operation is recorded on a traced
//! persistent-memory volume, then for every fence it executed (with the possible sets of
//! pending cache lines that reached the media) the file system and the cache device are
//! recovered from the image, over the same backing file, and every block must read as before
//! the operation or as after it — never a mix, never a block lost. At the last fence (the
//! operation returned) it must read as after.
//!
//! The backing file is a real file, not traced: it holds what the device wrote to it by the
//! end of the operation. A write-back's data reaches it (synced) before the NVRAM entry is
//! freed, so an image that still has the block dirty holds the same bytes in NVRAM.

use std::path::PathBuf;

use cachedev::{BLOCK_BYTES, CacheConfig, CacheDevice, PolicyKind};
use fs::{CheckpointMode, Fs, FsOptions};
use pmem::Tracer;

const BLOCK: u64 = BLOCK_BYTES as u64;
const BLOCKS: u64 = 16;
const NVRAM_PATH: &str = "/.cache/c.nvram";
const IMAGES_PER_POINT: usize = 6;

fn options() -> FsOptions {
    FsOptions {
        checkpoint: CheckpointMode::OnDemand,
        ..testkit::small_options()
    }
}

/// NVRAM 3 blocks, DRAM 2, no background write-back: only the operation writes.
fn config() -> CacheConfig {
    CacheConfig {
        nvram_bytes: 3 * BLOCK,
        dram_bytes: 2 * BLOCK,
        policy: PolicyKind::Nbm,
        writeback: None,
    }
}

fn contents(device: &CacheDevice) -> Vec<u8> {
    let mut all = vec![0u8; (BLOCKS * BLOCK) as usize];
    device.read(0, &mut all).unwrap();
    all
}

fn fill(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag ^ (i as u8).wrapping_mul(31)).collect()
}

/// Runs `setup`, then records `op` and checks every crash image of it.
fn check_op(name: &str, setup: impl Fn(&CacheDevice), op: impl Fn(&CacheDevice)) {
    let dir = tempfile::Builder::new()
        .prefix("locus-cachedev-crash")
        .tempdir_in("/var/tmp")
        .unwrap();
    let backing: PathBuf = dir.path().join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(BLOCKS * BLOCK)
        .unwrap();
    let tracer = Tracer::new();
    let region = testkit::traced_dirty_volume_device(&tracer, 8 << 20);
    let fs = Fs::format(
        testkit::volume_over(vec![region]).unwrap(),
        &testkit::small_format(),
        options(),
    )
    .unwrap();
    let device = CacheDevice::open(&fs, NVRAM_PATH, &backing, &config()).unwrap();
    setup(&device);
    let before = contents(&device);
    let first = tracer.fence_count();
    op(&device);
    let last = tracer.fence_count();
    let after = contents(&device);
    assert_ne!(before, after, "{name}: the operation changed nothing");
    assert!(last > first, "{name}: no fence");
    drop(device);
    let images = testkit::check_crash_images(
        name,
        &tracer,
        (first, last),
        IMAGES_PER_POINT,
        &before,
        &after,
        |point, image| {
            let replay = Tracer::new();
            let volume =
                testkit::volume_over(vec![replay.region_with(image.regions[0].clone())]).unwrap();
            let recovered = Fs::open(volume, options()).unwrap_or_else(|e| {
                panic!(
                    "{name}: point {point} ({}): the file system: {e}",
                    image.description
                )
            });
            let device = CacheDevice::open(&recovered, NVRAM_PATH, &backing, &config())
                .unwrap_or_else(|e| {
                    panic!(
                        "{name}: point {point} ({}): the cache: {e}",
                        image.description
                    )
                });
            let got = contents(&device);
            drop(device);
            recovered.abandon();
            got
        },
        |got| {
            let differs: Vec<u64> = (0..BLOCKS)
                .filter(|&b| {
                    let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
                    got[r.clone()] != after[r.clone()] && got[r.clone()] != before[r]
                })
                .collect();
            format!("blocks {differs:?} are neither, or blocks mix the two")
        },
    );
    eprintln!(
        "{name}: {} fences, {images} images, all before or after",
        last - first
    );
}

#[test]
fn a_write_into_a_free_slot() {
    check_op(
        "new dirty block",
        |_| {},
        |d| {
            d.write(5 * BLOCK, &fill(1, BLOCK as usize)).unwrap();
        },
    );
}

#[test]
fn an_overwrite_of_a_dirty_block() {
    check_op(
        "write hit",
        |d| d.write(2 * BLOCK, &fill(2, BLOCK as usize)).unwrap(),
        |d| d.write(2 * BLOCK, &fill(3, BLOCK as usize)).unwrap(),
    );
}

#[test]
fn a_partial_block_write() {
    check_op(
        "read-modify-write",
        |d| d.write(7 * BLOCK, &fill(4, BLOCK as usize)).unwrap(),
        |d| d.write(7 * BLOCK + 100, &fill(5, 1000)).unwrap(),
    );
}

#[test]
fn a_write_that_evicts_a_dirty_block() {
    check_op(
        "write-back then put dirty",
        |d| {
            for b in [1, 3, 9] {
                d.write(b * BLOCK, &fill(b as u8, BLOCK as usize)).unwrap();
            }
            // Read one so that its write-back victim may move to DRAM.
            let mut one = vec![0u8; BLOCK as usize];
            d.read(BLOCK, &mut one).unwrap();
        },
        |d| d.write(12 * BLOCK, &fill(6, BLOCK as usize)).unwrap(),
    );
}

#[test]
fn a_discard_of_a_dirty_block() {
    check_op(
        "drop dirty",
        |d| d.write(4 * BLOCK, &fill(7, BLOCK as usize)).unwrap(),
        |d| d.discard(4 * BLOCK, BLOCK).unwrap(),
    );
}
