//! A volume directory on tmpfs: format, reopen, and a second opener told who holds it.

use volume::{Volume, VolumeError, default_config};

#[test]
fn format_open_and_lock() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let topology = topology::Topology::read_live().unwrap();
    let config = default_config(dir.path(), &topology, Some(8 << 20)).unwrap();
    assert_eq!(
        config.devices.len(),
        topology.nodes.iter().filter(|n| n.memory_bytes > 0).count()
    );
    let uuid = Volume::format(dir.path(), &config, false).unwrap();

    let again = Volume::format(dir.path(), &config, false).unwrap_err();
    assert!(
        matches!(again, VolumeError::AlreadyFormatted { .. }),
        "{again}"
    );

    let volume = Volume::open(dir.path(), topology.clone(), &testkit::quiet_options()).unwrap();
    assert_eq!(volume.uuid(), uuid);
    let second = Volume::open(dir.path(), topology.clone(), &testkit::quiet_options()).unwrap_err();
    match second {
        VolumeError::InUse { pid, .. } => assert_eq!(pid, std::process::id().to_string()),
        other => panic!("expected InUse, got {other}"),
    }
    let extent = volume.alloc_local(4096).unwrap();
    volume.region(&extent).unwrap().write(0, b"kept").unwrap();
    volume.region(&extent).unwrap().persist(0, 4).unwrap();
    drop(volume);

    let volume = Volume::open(dir.path(), topology, &testkit::quiet_options()).unwrap();
    let mut bytes = [0u8; 4];
    volume.region(&extent).unwrap().read(0, &mut bytes).unwrap();
    assert_eq!(&bytes, b"kept");
    let stats = volume.stats();
    assert!(
        stats[0].persistence.starts_with("emulated"),
        "{}",
        stats[0].persistence
    );
    assert_eq!(stats[0].node, Some(0));
}

#[test]
fn no_volume_is_a_clear_error() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let error = Volume::open(
        dir.path(),
        topology::Topology::read_live().unwrap(),
        &testkit::quiet_options(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("locus format"), "{error}");
}

/// A second directory whose `locus.toml` names the same device (copied by hand) cannot open
/// it while the first has it, nor format over it; the error names the holder. Once the first
/// closes, the device opens through either directory.
#[test]
fn a_device_is_locked_whichever_directory_names_it() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let alias = tempfile::tempdir_in("/dev/shm").unwrap();
    let topology = topology::Topology::read_live().unwrap();
    let config = default_config(dir.path(), &topology, Some(8 << 20)).unwrap();
    Volume::format(dir.path(), &config, false).unwrap();
    std::fs::copy(
        dir.path().join("locus.toml"),
        alias.path().join("locus.toml"),
    )
    .unwrap();
    let volume = Volume::open(dir.path(), topology.clone(), &testkit::quiet_options()).unwrap();
    let me = std::process::id().to_string();
    for error in [
        Volume::open(alias.path(), topology.clone(), &testkit::quiet_options()).unwrap_err(),
        Volume::format(alias.path(), &config, true).unwrap_err(),
    ] {
        match &error {
            VolumeError::DeviceInUse { device, pid } => {
                assert_eq!(*pid, me, "{error}");
                assert_eq!(device, &config.devices[0].path);
            }
            other => panic!("expected DeviceInUse, got {other}"),
        }
    }
    drop(volume);
    drop(Volume::open(alias.path(), topology, &testkit::quiet_options()).unwrap());
}
