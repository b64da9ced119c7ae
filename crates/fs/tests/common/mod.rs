//! Helpers for the file system's tests: volumes on emulated devices (tmpfs files bound to a
//! node, the same backend `locus` uses by default), and traced volumes for crash images.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fs::{FormatOptions, Fs, FsOptions};
use pmem::{Region, Tracer};
use volume::{DeviceSource, Volume};

/// A volume directory under /dev/shm, removed when dropped.
pub struct ShmVolume {
    pub dir: PathBuf,
}

impl Drop for ShmVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn quiet() -> volume::OpenOptions {
    volume::OpenOptions {
        check_interval: None,
        ..volume::OpenOptions::default()
    }
}

/// Formats a one-device emulated volume of `size` bytes.
pub fn shm_volume(name: &str, size: u64) -> ShmVolume {
    let dir = PathBuf::from(format!(
        "/dev/shm/locus-fs-test-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let topology = topology::Topology::read_live().unwrap();
    let config = volume::default_config(&dir, &topology, Some(size)).unwrap();
    Volume::format(&dir, &config, true).unwrap();
    ShmVolume { dir }
}

/// Opens the volume in `dir`.
pub fn open_volume(dir: &Path) -> Arc<Volume> {
    let topology = topology::Topology::read_live().unwrap();
    Arc::new(Volume::open(dir, topology, &quiet()).unwrap())
}

/// Small areas, so tests exercise wrap-around, backpressure and snapshots.
pub fn small_format() -> FormatOptions {
    FormatOptions {
        slot_limit: 16,
        log_records: 256,
        journal_bytes: 64 << 10,
        granule: 4096,
    }
}

pub fn small_options() -> FsOptions {
    FsOptions {
        prelim_buffers: 2,
        prelim_buffer_bytes: 256 << 10,
        checkpoint_batch: 64,
        checkpoint: fs::CheckpointMode::Background,
    }
}

/// A traced one-device volume (crash images), formatted with a file system.
pub fn traced(tracer: &Tracer, size: u64) -> Region {
    let region = tracer.region(size);
    Volume::format_devices(&sources(vec![region.clone()]), [5; 16]).unwrap();
    region
}

pub fn sources(regions: Vec<Region>) -> Vec<DeviceSource> {
    regions
        .into_iter()
        .enumerate()
        .map(|(i, region)| DeviceSource {
            label: format!("dev{i}"),
            kind: None,
            region,
            node: Some(0),
        })
        .collect()
}

/// Opens a volume over regions (traced or recovered images).
pub fn volume_over(regions: Vec<Region>) -> volume::Result<Arc<Volume>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/tests/fixtures/one-node");
    let topology = topology::Topology::read_from(root).unwrap();
    Volume::open_devices(sources(regions), topology, &quiet()).map(Arc::new)
}

pub fn format_over(regions: Vec<Region>) -> Fs {
    Fs::format(
        volume_over(regions).unwrap(),
        &small_format(),
        small_options(),
    )
    .unwrap()
}

/// Deterministic bytes for (tag, offset).
pub fn pattern(tag: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (offset + i))
                .wrapping_mul(0x2545_F491_4F6C_DD1D);
            (x >> 56) as u8
        })
        .collect()
}
