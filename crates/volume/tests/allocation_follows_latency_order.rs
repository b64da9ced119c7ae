//! Allocation on a four-node machine (three CPU nodes and a CPU-less CXL node, HMAT): each
//! node allocates from its own device until it turns fat, then from the next device in its
//! latency order; a full volume gives NoSpace with every extent's data intact.

use pmem::Tracer;
use volume::{Extent, GlobalAddress, Volume, VolumeError};

const DEVICE_BYTES: u64 = 6 << 20; // 4 MiB of data space each: 1024 pages

fn four_node_volume() -> (Tracer, Volume) {
    let tracer = Tracer::new();
    let nodes = [Some(0), Some(1), Some(2), Some(3)];
    let devices = testkit::traced_devices(&tracer, &[DEVICE_BYTES; 4], &nodes);
    Volume::format_devices(&devices, [9; 16]).unwrap();
    let volume = Volume::open_devices(
        devices,
        testkit::fixture("four-node-cxl"),
        &testkit::quiet_options(),
    )
    .unwrap();
    (tracer, volume)
}

#[test]
fn orders_follow_the_topology_and_include_the_cpu_less_node() {
    let (_tracer, volume) = four_node_volume();
    assert_eq!(
        volume.device_order(0),
        Some(vec![0, 1, 2, 3]),
        "HMAT order of node 0"
    );
    assert_eq!(volume.device_order(2), Some(vec![2, 0, 1, 3]));
    assert_eq!(volume.decide_target(1), Some(1));
    assert_eq!(volume.decide_target(9), None);
    assert!(matches!(
        volume.alloc(4096, 9),
        Err(VolumeError::UnknownNode { node: 9 })
    ));
}

#[test]
fn local_until_fat_then_the_next_nearest_then_no_space_with_data_intact() {
    let (_tracer, volume) = four_node_volume();
    let mut extents: Vec<(Extent, u8)> = Vec::new();
    let mut devices_used = Vec::new();
    loop {
        match volume.alloc(64 << 10, 0) {
            Ok(extent) => {
                let tag = (extents.len() % 251) as u8;
                volume
                    .region(&extent)
                    .unwrap()
                    .write(0, &[tag; 64])
                    .unwrap();
                if devices_used.last() != Some(&extent.device()) {
                    devices_used.push(extent.device());
                }
                extents.push((extent, tag));
            }
            Err(VolumeError::NoSpace { len_bytes }) => {
                assert_eq!(len_bytes, 64 << 10);
                break;
            }
            Err(other) => panic!("expected NoSpace, got {other}"),
        }
    }
    // Device 0 until fat, then 1, 2, and the CXL node last; then the fat tails in order.
    assert_eq!(&devices_used[..4], &[0, 1, 2, 3], "{devices_used:?}");
    assert_eq!(extents.len(), 4 * 64, "every 64 KiB of data space was used");
    for (extent, tag) in &extents {
        let mut bytes = [0u8; 64];
        volume.region(extent).unwrap().read(0, &mut bytes).unwrap();
        assert_eq!(bytes, [*tag; 64], "extent {} lost its data", extent.start);
    }
    let stats = volume.stats();
    assert_eq!(stats[0].allocations_local, 64);
    assert_eq!(stats[1].allocations_remote, 64);
    assert!(stats.iter().all(|s| s.state == "fat" && s.free_bytes == 0));

    // Freeing above the 5% line makes device 0 the target again.
    for (extent, _) in extents.iter().filter(|(e, _)| e.device() == 0).take(4) {
        volume.free(*extent).unwrap();
    }
    assert_eq!(volume.decide_target(0), Some(0));
    assert_eq!(
        volume.alloc(4096, 2).unwrap().device(),
        0,
        "node 2's nearest non-fat device"
    );
}

#[test]
fn owner_records_rebuild_the_allocator_and_bad_ones_are_refused() {
    let (_tracer, volume) = four_node_volume();
    let owned = Extent {
        start: GlobalAddress::new(0, 2 << 20),
        len_bytes: 3 << 20,
    };
    volume.mark_owned([owned]).unwrap();
    assert_eq!(volume.stats()[0].free_bytes, 1 << 20);
    let next = volume.alloc(1 << 20, 0).unwrap();
    assert_eq!(
        next.start,
        GlobalAddress::new(0, 5 << 20),
        "the allocator skips owned space"
    );

    let twice = volume.mark_owned([owned]).unwrap_err();
    assert!(twice.to_string().contains("not all free"), "{twice}");
    let outside = Extent {
        start: GlobalAddress::new(0, 4096),
        len_bytes: 4096,
    };
    assert!(
        volume
            .mark_owned([outside])
            .unwrap_err()
            .to_string()
            .contains("allocatable")
    );
    let no_device = Extent {
        start: GlobalAddress::new(7, 2 << 20),
        len_bytes: 4096,
    };
    assert!(
        volume
            .free(no_device)
            .unwrap_err()
            .to_string()
            .contains("no device 7")
    );
    assert!(volume.free(next).is_ok());
    assert!(
        volume
            .free(next)
            .unwrap_err()
            .to_string()
            .contains("double free")
    );
}

#[test]
fn requests_out_of_range_are_refused() {
    let (_tracer, volume) = four_node_volume();
    assert!(matches!(
        volume.alloc(0, 0),
        Err(VolumeError::BadRequest { .. })
    ));
    assert!(matches!(
        volume.alloc(volume::MAX_ALLOC_BYTES + 1, 0),
        Err(VolumeError::BadRequest { .. })
    ));
    assert!(
        matches!(volume.alloc(5 << 20, 0), Err(VolumeError::NoSpace { .. })),
        "larger than any device"
    );
}
