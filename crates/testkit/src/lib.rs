//! Test helpers shared by locus's crates (only ever a dev-dependency): fixture topologies,
//! volumes over traced regions (for crash images: `pmem::Tracer` records every store and
//! fence) or over emulated devices (tmpfs files, the backend `locus` uses by default), and
//! small file-system formats that make tests reach wrap-around, backpressure and snapshots.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fs::{FormatOptions, Fs, FsOptions};
use pmem::{Region, Tracer};
use topology::Topology;
use volume::{DeviceSource, Volume};

/// The one-node fixture topology from the topology crate.
pub fn one_node() -> Topology {
    fixture("one-node")
}

/// A topology from the topology crate's committed fixtures (`crates/topology/tests/fixtures`).
///
/// # Panics
/// When the fixture does not exist or does not parse.
pub fn fixture(name: &str) -> Topology {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures")
        .join(name);
    Topology::read_from(&root)
        .unwrap_or_else(|e| panic!("fixture topology {}: {e}", root.display()))
}

/// Volume options without the periodic thread, so tests control every transition.
pub fn quiet_options() -> volume::OpenOptions {
    volume::OpenOptions {
        check_interval: None,
        ..volume::OpenOptions::default()
    }
}

/// Traced regions of `sizes`, as device sources on `nodes`.
pub fn traced_devices(tracer: &Tracer, sizes: &[u64], nodes: &[Option<u32>]) -> Vec<DeviceSource> {
    sources(
        sizes.iter().map(|&size| tracer.region(size)).collect(),
        nodes,
    )
}

/// Device sources over existing regions, on `nodes`.
pub fn sources(regions: Vec<Region>, nodes: &[Option<u32>]) -> Vec<DeviceSource> {
    assert_eq!(regions.len(), nodes.len(), "one node per region");
    regions
        .into_iter()
        .zip(nodes)
        .enumerate()
        .map(|(i, (region, &node))| DeviceSource {
            label: format!("dev{i}"),
            kind: None,
            region,
            node,
        })
        .collect()
}

/// Device sources over existing regions, all on node 0.
pub fn node0_sources(regions: Vec<Region>) -> Vec<DeviceSource> {
    let nodes = vec![Some(0); regions.len()];
    sources(regions, &nodes)
}

/// A traced one-device volume of `size` bytes, formatted (volume only), for crash images.
///
/// # Panics
/// When formatting fails.
pub fn traced_volume_device(tracer: &Tracer, size: u64) -> Region {
    let region = tracer.region(size);
    Volume::format_devices(&node0_sources(vec![region.clone()]), [5; 16]).unwrap();
    region
}

/// [`traced_volume_device`] over memory that held other data before (bytes from a seeded
/// generator, none zero): what the file system allocates is never zero unless it wrote the
/// zeros, so a crash image that lost zeroing or a copy under its record shows old bytes.
///
/// # Panics
/// When formatting fails.
pub fn traced_dirty_volume_device(tracer: &Tracer, size: u64) -> Region {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let old: Vec<u8> = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8 | 1
        })
        .collect();
    let region = tracer.region_with(old);
    Volume::format_devices(&node0_sources(vec![region.clone()]), [5; 16]).unwrap();
    region
}

/// Opens a volume over regions (traced devices or recovered images), on the one-node
/// fixture topology.
pub fn volume_over(regions: Vec<Region>) -> volume::Result<Arc<Volume>> {
    Volume::open_devices(node0_sources(regions), one_node(), &quiet_options()).map(Arc::new)
}

/// A volume directory under /dev/shm, removed when dropped.
#[derive(Debug)]
pub struct ShmVolume {
    /// The volume directory.
    pub dir: PathBuf,
}

impl Drop for ShmVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Formats a one-device emulated volume of `size` bytes in a fresh directory under
/// /dev/shm named after `name` and the process.
///
/// # Panics
/// When the machine's topology cannot be read or formatting fails.
pub fn shm_volume(name: &str, size: u64) -> ShmVolume {
    let dir = PathBuf::from(format!("/dev/shm/locus-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let topology = Topology::read_live().unwrap();
    let config = volume::default_config(&dir, &topology, Some(size)).unwrap();
    Volume::format(&dir, &config, true).unwrap();
    ShmVolume { dir }
}

/// Runs `expect` on `fs` live, after a crash (`abandon`: the journal replays) and after an
/// unmount (the snapshot loads), reopening the file system in the volume at `dir` with
/// [`small_options`]; `expect` gets when it runs ("live", "after a crash", ...).
///
/// # Panics
/// When `expect` does, or the file system does not reopen or unmount.
pub fn check_across_crash_and_unmount(fs: Fs, dir: &Path, expect: impl Fn(&Fs, &str)) {
    expect(&fs, "live");
    fs.abandon();
    let fs = Fs::open(open_volume(dir), small_options()).unwrap();
    expect(&fs, "after a crash");
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(dir), small_options()).unwrap();
    expect(&fs, "after an unmount");
    fs.unmount().unwrap();
}

/// Opens the volume in `dir` on the machine's topology.
///
/// # Panics
/// When it does not open.
pub fn open_volume(dir: &Path) -> Arc<Volume> {
    let topology = Topology::read_live().unwrap();
    Arc::new(Volume::open(dir, topology, &quiet_options()).unwrap())
}

/// Small file-system areas, so tests exercise wrap-around, backpressure and snapshots.
pub fn small_format() -> FormatOptions {
    FormatOptions {
        slot_limit: 16,
        log_records: 256,
        journal_bytes: 64 << 10,
        granule: 4096,
        data_checksums: false,
    }
}

/// Small preliminary buffers and batches, with the background checkpoint.
pub fn small_options() -> FsOptions {
    FsOptions {
        prelim_buffers: 2,
        prelim_buffer_bytes: 256 << 10,
        checkpoint_batch: 64,
        checkpoint: fs::CheckpointMode::Background,
        defrag: true,
        ..FsOptions::default()
    }
}

/// A file system ([`small_format`], [`small_options`]) formatted over regions.
///
/// # Panics
/// When the volume does not open or formatting fails.
pub fn format_over(regions: Vec<Region>) -> Fs {
    Fs::format(
        volume_over(regions).unwrap(),
        &small_format(),
        small_options(),
    )
    .unwrap()
}

/// Deterministic bytes for (tag, offset): what a test writes and later expects back.
pub fn pattern(tag: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (offset + i))
                .wrapping_mul(0x2545_F491_4F6C_DD1D);
            (x >> 56) as u8
        })
        .collect()
}

/// Checks every crash image an operation left between fences `first` and `last` of `tracer`
/// (up to `per_point` images per fence): `observe` recovers each image (the single traced
/// region's bytes) and returns what it finds, which must equal `after`, or `before` at any
/// point but the last (the operation returned there). `explain` says how a wrong state
/// differs, for the failure message. Panics, naming the point and the image, on the first
/// wrong one, or if no image shows the operation done or none shows it not done; returns
/// how many images were checked.
#[allow(
    clippy::too_many_arguments,
    reason = "one check's inputs, all distinct"
)]
pub fn check_crash_images<S: PartialEq>(
    name: &str,
    tracer: &Tracer,
    (first, last): (usize, usize),
    per_point: usize,
    before: &S,
    after: &S,
    mut observe: impl FnMut(usize, &pmem::CrashImage) -> S,
    explain: impl Fn(&S) -> String,
) -> usize {
    let (mut saw_before, mut saw_after, mut images) = (false, false, 0);
    for point in first..=last {
        for image in tracer.crash_images(point, per_point, point as u64) {
            images += 1;
            let got = observe(point, &image);
            if got == *after {
                saw_after = true;
            } else if got == *before && point < last {
                saw_before = true;
            } else {
                panic!(
                    "{name}: point {point}/{last} ({}): neither before nor after: {}",
                    image.description,
                    explain(&got)
                );
            }
        }
    }
    assert!(saw_after, "{name}: no image shows the operation done");
    assert!(saw_before, "{name}: no image shows the operation not done");
    images
}

/// The one emulated device file of the volume in `volume`.
///
/// # Panics
/// When the volume directory has none.
pub fn emulated_device(volume: &Path) -> PathBuf {
    std::fs::read_dir(volume)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pmem"))
        .expect("an emulated device file")
}

/// Flips a bit of the 4th byte of `marker` where it first lies on the one emulated device of
/// the volume in `volume` (the device file, under whatever process has it mapped): damage to
/// the block of a file written with `marker` in it.
///
/// # Panics
/// When the marker is not on the device.
pub fn damage_marked_block(volume: &Path, marker: &[u8]) {
    let device = emulated_device(volume);
    let image = std::fs::read(&device).unwrap();
    let at = image
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("the marked block is on the device");
    drop(image);
    poke(&device, (at + 3) as u64, marker[3] ^ 0x20);
}

/// Writes `byte` at `offset` of the file at `path`: damage to a device file, made under
/// whatever process has it mapped (the file is the memory it maps).
///
/// # Panics
/// When the file cannot be written.
pub fn poke(path: &Path, offset: u64, byte: u8) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(&[byte], offset)
        .unwrap();
}
