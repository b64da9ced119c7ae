//! Real DAX devices, where the machine has them (the testbed's guests do; this host does
//! not): every device-DAX device maps with cache-flush persistence on the node sysfs names,
//! and round-trips data; every fs-dax block device, once it carries an ext4 file system
//! mounted with `-o dax`, holds DAX files mapped with `MAP_SYNC`.

use std::path::Path;
use std::process::Command;

use pmem::{Device, DeviceKind, DeviceSpec, FlushPolicy, PersistenceMode};
use topology::{PmemKind, Topology};

fn round_trip(device: &Device) {
    let region = device.region();
    let pattern: Vec<u8> = (0..(3 << 16)).map(|i: u32| (i * 31 % 251) as u8).collect();
    region.write_nt(1 << 20, &pattern).unwrap();
    region.write(4096, b"dax").unwrap();
    region.persist(0, region.len()).unwrap();
    let mut back = vec![0u8; pattern.len()];
    region.read(1 << 20, &mut back).unwrap();
    assert_eq!(back, pattern);
}

#[test]
fn dax_devices_map_with_cache_flush_persistence() {
    let topology = Topology::read_live().unwrap();
    if topology.pmem.is_empty() {
        println!("no persistent-memory devices on this machine; nothing to check");
        return;
    }
    for found in &topology.pmem {
        match found.kind {
            PmemKind::Devdax => {
                let spec = DeviceSpec {
                    path: found.path.clone(),
                    kind: DeviceKind::DevDax,
                    node: None,
                    flush: FlushPolicy::Auto,
                };
                assert_eq!(DeviceKind::detect(&found.path).unwrap(), DeviceKind::DevDax);
                let device = Device::open(&spec).unwrap();
                assert!(
                    matches!(device.mode(), PersistenceMode::CacheFlush(_)),
                    "{}",
                    device.mode()
                );
                assert_eq!(device.size_bytes(), found.size_bytes);
                assert_eq!(device.numa_node(), found.node, "{}", found.path.display());
                round_trip(&device);
                println!(
                    "{}: device-DAX, {} bytes, node {:?}, {}",
                    found.path.display(),
                    device.size_bytes(),
                    device.numa_node(),
                    device.mode()
                );
            }
            PmemKind::Fsdax => dax_file_on(&found.path, found.node),
        }
    }
}

/// Makes an ext4 file system on `block`, mounts it with `-o dax`, and maps a file on it.
fn dax_file_on(block: &Path, node: Option<u32>) {
    let mount_point = std::env::temp_dir().join(format!(
        "locus-dax-{}",
        block.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&mount_point).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .arg(block)
        .status();
    match mkfs {
        Ok(status) if status.success() => {}
        other => {
            println!(
                "{}: cannot run mkfs.ext4 ({other:?}); DAX file check skipped",
                block.display()
            );
            return;
        }
    }
    let mounted = Command::new("mount")
        .args(["-t", "ext4", "-o", "dax"])
        .arg(block)
        .arg(&mount_point)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount -o dax {} failed", block.display());
    let path = mount_point.join("locus.img");
    assert_eq!(
        DeviceKind::detect(&path).unwrap(),
        DeviceKind::DaxFile,
        "a new file on a dax mount"
    );
    let spec = DeviceSpec {
        path: path.clone(),
        kind: DeviceKind::DaxFile,
        node: None,
        flush: FlushPolicy::Auto,
    };
    let device = Device::create(&spec, 16 << 20).unwrap();
    assert!(
        matches!(device.mode(), PersistenceMode::CacheFlush(_)),
        "{}",
        device.mode()
    );
    assert_eq!(device.numa_node(), node, "{}", path.display());
    round_trip(&device);
    println!(
        "{}: DAX file on {}, node {:?}, {}",
        path.display(),
        block.display(),
        device.numa_node(),
        device.mode()
    );
    drop(device);
    let _ = Command::new("umount").arg(&mount_point).status();
}
