//! Real devices on this machine: an emulated device on tmpfs bound to a node (placement
//! checked with the kernel's `move_pages`), an ordinary file with `msync`, a DAX attempt on a
//! non-DAX file system, and the region API's bounds and persistence behaviour.

use pmem::{Device, DeviceKind, DeviceSpec, FlushPolicy, PersistenceMode, PmemError};

fn spec(path: std::path::PathBuf, kind: DeviceKind, node: Option<u32>) -> DeviceSpec {
    DeviceSpec {
        path,
        kind,
        node,
        flush: FlushPolicy::Auto,
    }
}

fn shm_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("/dev/shm is a tmpfs")
}

#[test]
fn emulated_device_pages_land_on_its_node_and_data_survives_reopening() {
    let dir = shm_dir();
    let path = dir.path().join("node0.pmem");
    let spec = spec(path.clone(), DeviceKind::Emulated, Some(0));
    let device = Device::create(&spec, 8 << 20).unwrap();
    assert!(
        matches!(device.mode(), PersistenceMode::Emulated(_)),
        "{}",
        device.mode()
    );
    assert_eq!(device.size_bytes(), 8 << 20);
    // Placement queries see pages mapped into this process: map them all first.
    device.prefault();
    let nodes = device.sample_page_nodes(64).unwrap();
    assert_eq!(
        nodes,
        vec![0; 64],
        "pages must be allocated on node 0 at creation"
    );

    let region = device.region();
    region.write(4096, b"locality").unwrap();
    region.store_u64(8192, 0xfeed_f00d).unwrap();
    region.write_nt(1 << 20, &[7u8; 3 << 16]).unwrap();
    region.persist(0, 8 << 20).unwrap();
    drop(device);

    let device = Device::open(&spec).unwrap();
    let mut buf = [0u8; 8];
    device.region().read(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"locality");
    assert_eq!(device.region().load_u64(8192).unwrap(), 0xfeed_f00d);
    let mut bulk = vec![0u8; 3 << 16];
    device.region().read(1 << 20, &mut bulk).unwrap();
    assert!(bulk.iter().all(|&b| b == 7));
}

#[test]
fn emulated_device_must_be_on_tmpfs() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let error = Device::create(
        &spec(dir.path().join("x"), DeviceKind::Emulated, Some(0)),
        1 << 20,
    )
    .unwrap_err();
    assert!(error.to_string().contains("must be on tmpfs"), "{error}");
}

#[test]
fn ordinary_file_uses_msync_and_dax_is_refused_off_a_dax_mount() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("disk.pmem");
    let device = Device::create(&spec(path.clone(), DeviceKind::File, None), 1 << 20).unwrap();
    assert_eq!(device.mode(), PersistenceMode::Msync);
    device.region().write(100, b"durable").unwrap();
    device.region().persist(100, 7).unwrap();
    drop(device);
    assert_eq!(&std::fs::read(&path).unwrap()[100..107], b"durable");

    assert_eq!(DeviceKind::detect(&path).unwrap(), DeviceKind::File);
    let error = Device::open(&spec(path, DeviceKind::DaxFile, None)).unwrap_err();
    assert!(matches!(error, PmemError::WrongKind { .. }), "{error:?}");
    assert!(error.to_string().contains("-o dax"), "{error}");
}

/// A DAX file that cannot be mapped with `MAP_SYNC` (not on a DAX mount) fails after the
/// file was made and its blocks allocated: the file is given back — removed when the call
/// made it, emptied when it existed — instead of left holding its size on the disk.
#[test]
fn a_device_file_whose_creation_fails_is_given_back() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("dax.pmem");
    let dax = spec(path.clone(), DeviceKind::DaxFile, None);
    let error = Device::create(&dax, 4 << 20).unwrap_err();
    assert!(error.to_string().contains("-o dax"), "{error}");
    assert!(!path.exists(), "a file the failed call made is removed");
    std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
    let error = Device::create(&dax, 4 << 20).unwrap_err();
    assert!(error.to_string().contains("-o dax"), "{error}");
    let left = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (left.len(), left.blocks()),
        (0, 0),
        "an existing file is emptied"
    );
}

/// A small tmpfs mounted for a test, unmounted when dropped (mounting needs root).
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount(size: &str) -> Self {
        let dir = shm_dir();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs (root only)");
        Self(dir)
    }

    fn free_bytes(&self) -> u64 {
        pmem::available_bytes(self.0.path()).unwrap()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// A device larger than the free room of its file system is refused before anything is
/// allocated, naming both numbers, and leaves no file: `fallocate` there would fill the file
/// system first (and ext4 keeps what a failed one allocated). A device that fits is made, and
/// one more that does not fit beside it is refused the same way.
#[test]
fn a_device_larger_than_the_room_of_its_file_system_is_refused_before_allocating() {
    let small = SmallTmpfs::mount("48M");
    let free = small.free_bytes();
    for (name, kind, node) in [
        ("file.pmem", DeviceKind::File, None),
        ("emulated.pmem", DeviceKind::Emulated, Some(0)),
    ] {
        let path = small.0.path().join(name);
        let error = Device::create(&spec(path.clone(), kind, node), 64 << 20).unwrap_err();
        assert!(
            matches!(error, PmemError::NoRoom { .. }),
            "{kind:?}: {error:?}"
        );
        assert!(
            error.to_string().contains("needs 67108864 more bytes"),
            "{error}"
        );
        assert!(!path.exists(), "{kind:?}: no file is left");
        assert_eq!(
            small.free_bytes(),
            free,
            "{kind:?}: nothing stays allocated"
        );
    }
    let first = small.0.path().join("a.pmem");
    let device = Device::create(&spec(first, DeviceKind::File, None), 32 << 20).unwrap();
    let second = small.0.path().join("b.pmem");
    let error =
        Device::create(&spec(second.clone(), DeviceKind::File, None), 32 << 20).unwrap_err();
    assert!(matches!(error, PmemError::NoRoom { .. }), "{error:?}");
    assert!(!second.exists());
    drop(device);
    // A tmpfs without a limit (`size=0`) reports no blocks at all: not "no room".
    let unlimited = SmallTmpfs::mount("0");
    assert_eq!(unlimited.free_bytes(), u64::MAX);
    let path = unlimited.0.path().join("emulated.pmem");
    let device = Device::create(&spec(path, DeviceKind::Emulated, Some(0)), 8 << 20).unwrap();
    assert_eq!(device.size_bytes(), 8 << 20);
}

#[test]
fn kinds_are_detected_from_the_path() {
    let dir = shm_dir();
    assert_eq!(
        DeviceKind::detect(&dir.path().join("new")).unwrap(),
        DeviceKind::Emulated
    );
}

#[test]
fn accesses_outside_a_region_are_errors() {
    let dir = shm_dir();
    let device = Device::create(
        &spec(dir.path().join("d"), DeviceKind::Emulated, None),
        1 << 20,
    )
    .unwrap();
    let region = device.region().slice(4096, 8192).unwrap();
    assert!(matches!(
        region.write(8190, &[0; 4]),
        Err(PmemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        region.read(u64::MAX, &mut [0; 1]),
        Err(PmemError::OutOfBounds { .. })
    ));
    assert!(matches!(
        region.store_u64(4, 1),
        Err(PmemError::Misaligned { .. })
    ));
    assert!(region.slice(8000, 500).is_err());
    region.write(0, b"x").unwrap();
    let mut byte = [0u8; 1];
    device.region().read(4096, &mut byte).unwrap();
    assert_eq!(&byte, b"x", "a slice writes through to the device");
}

#[test]
fn a_new_file_off_tmpfs_and_off_dax_is_an_ordinary_file() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    assert_eq!(
        DeviceKind::detect(&dir.path().join("new.img")).unwrap(),
        DeviceKind::File
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the probe file is removed"
    );
}

/// This thread's minor page faults so far (`/proc/thread-self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let fields = &stat[stat.rfind(')').unwrap() + 2..];
    fields.split(' ').nth(7).unwrap().parse().unwrap()
}

/// Faults taken storing one byte into each of the 512 pages of the 2 MiB at `at`.
fn faults_writing(region: &pmem::Region, at: u64) -> u64 {
    let before = minor_faults();
    for page in 0..512 {
        region.write(at + page * 4096, &[1]).unwrap();
    }
    minor_faults() - before
}

#[test]
fn populating_for_writes_maps_the_stretches_asked_for_and_only_on_emulated_devices() {
    let dir = shm_dir();
    let emulated = spec(dir.path().join("node0.pmem"), DeviceKind::Emulated, Some(0));
    drop(Device::create(&emulated, 8 << 20).unwrap());
    // A fresh mapping: no page of it in this process's page tables yet.
    let device = Device::open(&emulated).unwrap();
    let region = device.region();
    // Ten bytes in the second 2 MiB map all of it, and only it.
    region.populate_for_writes((3 << 20) + 5, 10);
    let populated = faults_writing(region, 2 << 20);
    let untouched = faults_writing(region, 4 << 20);
    assert!(
        populated < 16 && untouched >= 400,
        "faults writing 512 pages: {populated} populated, {untouched} not"
    );
    // A slice's offsets are its own; the end of the device is not passed.
    region
        .slice(6 << 20, 2 << 20)
        .unwrap()
        .populate_for_writes((1 << 20) + 7, 10 << 20);
    assert!(faults_writing(region, 6 << 20) < 16);

    // An ordinary file's pages would be dirtied: left to fault in as they are written.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = spec(dir.path().join("disk.pmem"), DeviceKind::File, None);
    drop(Device::create(&file, 4 << 20).unwrap());
    let device = Device::open(&file).unwrap();
    device.region().populate_for_writes(0, 2 << 20);
    assert!(faults_writing(device.region(), 0) >= 400);
}

/// The `ShmemPmdMapped` kilobytes `/proc/self/smaps` reports for the mapping starting at
/// `start`.
fn huge_mapped_kib(start: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_mapping = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((from, _)) = range.split_once('-')
            && let Ok(from) = usize::from_str_radix(from, 16)
        {
            in_mapping = from == start;
            continue;
        }
        if in_mapping && let Some(kib) = line.strip_prefix("ShmemPmdMapped:") {
            return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
        }
    }
    panic!("no mapping at {start:#x} in /proc/self/smaps");
}

/// Whether this kernel makes huge pages of a tmpfs file on request (`MADV_COLLAPSE`, 6.1+),
/// unless its administrator denied them to every tmpfs.
fn kernel_collapses_tmpfs() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let minor: u32 = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let denied = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map_or(true, |s| s.contains("[deny]"));
    (major, minor) >= (6, 1) && !denied
}

#[test]
fn a_prefaulted_emulated_device_is_mapped_in_huge_pages_with_its_bytes_kept() {
    let dir = shm_dir();
    let emulated = spec(dir.path().join("node0.pmem"), DeviceKind::Emulated, Some(0));
    // Not a whole number of huge pages: the tail keeps small ones.
    drop(Device::create(&emulated, (8 << 20) + (64 << 10)).unwrap());
    let written: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    {
        let device = Device::open(&emulated).unwrap();
        device.region().write(1 << 20, &written).unwrap();
    }
    let device = Device::open(&emulated).unwrap();
    let region = device.region();
    let start = region.address_of(0).unwrap();
    assert_eq!(start % (2 << 20), 0, "mapping at {start:#x}");
    if !kernel_collapses_tmpfs() {
        eprintln!("skipped: this kernel does not collapse tmpfs pages into huge pages");
        return;
    }
    assert_eq!(huge_mapped_kib(start), 0, "before prefaulting");
    device.prefault();
    assert_eq!(huge_mapped_kib(start), 8 << 10, "after prefaulting");
    let mut read = vec![0u8; written.len()];
    region.read(1 << 20, &mut read).unwrap();
    assert!(read == written, "bytes changed by the collapse");
    // Another mapping of the same file maps the huge pages as they are.
    let again = Device::open(&emulated).unwrap();
    again.prefault();
    assert_eq!(
        huge_mapped_kib(again.region().address_of(0).unwrap()),
        8 << 10
    );

    // An ordinary file's mapping is left as it is.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = spec(dir.path().join("disk.pmem"), DeviceKind::File, None);
    drop(Device::create(&file, 4 << 20).unwrap());
    let device = Device::open(&file).unwrap();
    device.prefault();
    assert_eq!(huge_mapped_kib(device.region().address_of(0).unwrap()), 0);
}
