//! On an ordinary-file device (persisted with `msync`, where a CPU fence persists nothing),
//! every write path writes its data back to the file before the write returns: a plain
//! write, a zero-copy buffer commit, and the checkpoint's copy of a short overwrite into the
//! file's block. Checked by recording which address ranges reach `msync`.

use std::sync::Arc;

use fs::{Fs, OpenOptions};
use pmem::MsyncRecorder;
use volume::{DeviceConfig, Volume, VolumeConfig};

/// Every offset of the device file at which `needle` occurs.
fn occurrences(device: &std::path::Path, needle: &[u8]) -> Vec<u64> {
    let bytes = std::fs::read(device).unwrap();
    bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(at, _)| at as u64)
        .collect()
}

/// Asserts that every copy of `needle` on the device was written back by one `msync`.
fn assert_synced(
    recorder: &MsyncRecorder,
    volume: &Volume,
    device: &std::path::Path,
    needle: &[u8],
    what: &str,
) {
    let found = occurrences(device, needle);
    assert!(!found.is_empty(), "{what}: the data is not on the device");
    let region = volume.device_region(0).unwrap();
    for at in found {
        let address = region.address_of(at).unwrap();
        assert!(
            recorder.covered(address, needle.len()),
            "{what}: the copy at device offset {at} never reached msync"
        );
    }
}

#[test]
fn every_write_path_reaches_the_file() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("file-device-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let device = dir.join("device.img");
    let config = VolumeConfig {
        flush: "auto".into(),
        devices: vec![DeviceConfig {
            path: device.clone(),
            kind: Some("file".into()),
            node: Some(0),
            size_bytes: Some(16 << 20),
        }],
    };
    Volume::format(&dir, &config, false).unwrap();
    let volume = testkit::open_volume(&dir);
    assert_eq!(
        volume.device_region(0).unwrap().mode(),
        pmem::PersistenceMode::Msync
    );
    let recorder = MsyncRecorder::start();
    let fs = Fs::format(
        Arc::clone(&volume),
        &testkit::small_format(),
        testkit::small_options(),
    )
    .unwrap();
    let file = fs.open_file("/f", OpenOptions::create()).unwrap();

    let written = testkit::pattern(1, 0, 4096);
    file.write_at(&written, 0).unwrap();
    assert_synced(&recorder, &volume, &device, &written, "File::write_at");

    let committed = testkit::pattern(2, 8192, 8192);
    let mut buffer = fs.buffer(committed.len() as u64).unwrap();
    buffer.write(0, &committed).unwrap();
    file.write_buffer(buffer, 8192).unwrap();
    assert_synced(
        &recorder,
        &volume,
        &device,
        &committed,
        "File::write_buffer",
    );

    // A short overwrite inside a checkpointed block is copied into the block in place.
    fs.checkpoint().unwrap();
    let overwrite = testkit::pattern(3, 100, 512);
    file.write_at(&overwrite, 100).unwrap();
    fs.checkpoint().unwrap();
    assert!(
        occurrences(&device, &overwrite).len() >= 2,
        "the checkpoint copied the overwrite into the file's block"
    );
    assert_synced(
        &recorder,
        &volume,
        &device,
        &overwrite,
        "the checkpoint's copy",
    );

    drop(recorder);
    drop(file);
    fs.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
