//! On the live machine (and, through `cargo xtask vm-test`, in multi-node guests): a thread
//! pinned to each CPU node allocates until the volume is full. Its extents must come from its
//! own node's device until that device is fat, then from each next device in the node's
//! latency order — CPU-less memory nodes included — and the kernel must report every
//! extent's pages on the node of the device it came from (`move_pages`).

use std::collections::BTreeMap;

use volume::{OpenOptions, Volume, VolumeError};

const DEVICE_BYTES: u64 = 8 << 20;
const EXTENT_BYTES: u64 = 64 << 10;

#[test]
fn each_node_fills_its_own_device_first_then_follows_its_latency_order() {
    let topology = topology::Topology::read_live().unwrap();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let config = volume::default_config(dir.path(), &topology, Some(DEVICE_BYTES)).unwrap();
    Volume::format(dir.path(), &config, false).unwrap();
    let options = OpenOptions {
        check_interval: None,
        ..OpenOptions::default()
    };
    let volume = Volume::open(dir.path(), topology.clone(), &options).unwrap();
    let device_node: BTreeMap<u32, u32> = volume
        .stats()
        .iter()
        .map(|d| (d.index, d.node.expect("emulated devices have a node")))
        .collect();
    let cpu_less: Vec<u32> = topology
        .nodes
        .iter()
        .filter(|n| n.cpu_less)
        .map(|n| n.id)
        .collect();

    for node in topology.nodes.iter().filter(|n| !n.cpu_less) {
        let expected_nodes = topology.candidate_order(node.id, None).unwrap().node_ids();
        let order = volume.device_order(node.id).unwrap();
        let order_nodes: Vec<u32> = order.iter().map(|d| device_node[d]).collect();
        assert_eq!(
            order_nodes, expected_nodes,
            "node {}: devices not in latency order",
            node.id
        );
        for &memory_only in &cpu_less {
            assert!(
                order_nodes.contains(&memory_only),
                "CPU-less node {memory_only} is not a candidate"
            );
        }

        let before = volume.stats();
        let (extents, runs) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    topology::pin_current_thread(&node.cpus).unwrap();
                    let cpu = topology::current_cpu().unwrap();
                    assert_eq!(topology.node_of_cpu(cpu), Some(node.id), "pinned off node");
                    let mut extents = Vec::new();
                    let mut runs: Vec<u32> = Vec::new();
                    loop {
                        match volume.alloc_local(EXTENT_BYTES) {
                            Ok(extent) => {
                                if runs.last() != Some(&extent.device()) {
                                    if let Some(&previous) = runs.last() {
                                        let left = &volume.stats()[previous as usize];
                                        assert!(
                                            left.free_bytes * 100 < left.data_bytes * 2 || runs.len() >= order.len(),
                                            "node {}: left device {previous} with {} of {} bytes free",
                                            node.id,
                                            left.free_bytes,
                                            left.data_bytes
                                        );
                                    }
                                    runs.push(extent.device());
                                }
                                extents.push(extent);
                            }
                            Err(VolumeError::NoSpace { .. }) => break,
                            Err(other) => panic!("node {}: {other}", node.id),
                        }
                    }
                    (extents, runs)
                })
                .join()
                .unwrap()
        });
        assert_eq!(
            &runs[..order.len()],
            order.as_slice(),
            "node {}: device sequence {runs:?}",
            node.id
        );

        // The kernel's view: every extent's first page is on its device's node.
        let addresses: Vec<usize> = extents
            .iter()
            .map(|e| volume.region(e).unwrap().address_of(0).unwrap())
            .collect();
        let placed = topology::page_nodes(&addresses).unwrap();
        for (extent, &found) in extents.iter().zip(&placed) {
            assert_eq!(
                i64::from(found),
                i64::from(device_node[&extent.device()]),
                "node {}: extent {} is on node {found}",
                node.id,
                extent.start
            );
        }

        // The volume's view: local allocations on the local device, remote elsewhere.
        let after = volume.stats();
        for (then, now) in before.iter().zip(&after) {
            let served = extents.iter().filter(|e| e.device() == now.index).count() as u64;
            let (local, remote) = (
                now.allocations_local - then.allocations_local,
                now.allocations_remote - then.allocations_remote,
            );
            if now.node == Some(node.id) {
                assert_eq!((local, remote), (served, 0), "device {}", now.index);
            } else {
                assert_eq!((local, remote), (0, served), "device {}", now.index);
            }
        }
        println!(
            "node {}: {} extents, device runs {runs:?}, all pages on their device's node",
            node.id,
            extents.len()
        );

        for extent in extents {
            volume.free(extent).unwrap();
        }
        assert!(
            volume
                .stats()
                .iter()
                .all(|d| d.free_bytes == d.data_bytes && d.state == "candidate")
        );
    }
}

/// `Volume::extend` (behind `locus extend`): a volume formatted with the first node's device
/// alone, then given a device on every other node (and a second one on the first, so that a
/// one-node machine adds one too). Every node's order then holds the added devices where
/// their nodes' latency puts them, and a thread pinned to each CPU node gets its first
/// extent from a device on its own node, whose pages the kernel reports there.
#[test]
fn devices_added_later_take_their_place_in_every_nodes_order() {
    let topology = topology::Topology::read_live().unwrap();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let config = volume::default_config(dir.path(), &topology, Some(DEVICE_BYTES)).unwrap();
    let (first, others) = config.devices.split_at(1);
    let mut added = others.to_vec();
    added.push(volume::DeviceConfig {
        path: dir.path().join("added.pmem"),
        kind: None,
        node: first[0].node,
        size_bytes: Some(DEVICE_BYTES),
    });
    let formatted = volume::VolumeConfig {
        devices: first.to_vec(),
        ..config.clone()
    };
    Volume::format(dir.path(), &formatted, false).unwrap();
    let extended = Volume::extend(dir.path(), topology.clone(), &added, false).unwrap();
    assert_eq!(
        (extended.before, extended.after),
        (1, 1 + added.len() as u32)
    );
    let options = OpenOptions {
        check_interval: None,
        ..OpenOptions::default()
    };
    let volume = Volume::open(dir.path(), topology.clone(), &options).unwrap();
    assert_eq!(volume.device_count(), 1 + added.len() as u32);
    let device_node: BTreeMap<u32, u32> = volume
        .stats()
        .iter()
        .map(|d| (d.index, d.node.expect("emulated devices have a node")))
        .collect();
    for node in topology.nodes.iter().filter(|n| !n.cpu_less) {
        let expected_nodes = topology.candidate_order(node.id, None).unwrap().node_ids();
        let mut order_nodes: Vec<u32> = volume
            .device_order(node.id)
            .unwrap()
            .iter()
            .map(|d| device_node[d])
            .collect();
        assert_eq!(order_nodes.len(), device_node.len(), "node {}", node.id);
        order_nodes.dedup();
        assert_eq!(order_nodes, expected_nodes, "node {}: order", node.id);
        let extent = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    topology::pin_current_thread(&node.cpus).unwrap();
                    volume.alloc_local(EXTENT_BYTES).unwrap()
                })
                .join()
                .unwrap()
        });
        assert_eq!(device_node[&extent.device()], node.id, "node {}", node.id);
        let address = volume.region(&extent).unwrap().address_of(0).unwrap();
        let placed = topology::page_nodes(&[address]).unwrap();
        assert_eq!(i64::from(placed[0]), i64::from(node.id), "node {}", node.id);
        println!(
            "node {}: first extent from device {} ({}), on the node",
            node.id,
            extent.device(),
            if extent.device() == 0 {
                "formatted"
            } else {
                "added"
            }
        );
        volume.free(extent).unwrap();
    }
}

/// `locus extend --grow` of every device: the grown part of each is allocated on the
/// device's own node (the kernel reports each sampled page there, `move_pages`) and the volume
/// uses all of it.
#[test]
fn grown_devices_keep_their_pages_on_their_node() {
    let topology = topology::Topology::read_live().unwrap();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let config = volume::default_config(dir.path(), &topology, Some(DEVICE_BYTES)).unwrap();
    Volume::format(dir.path(), &config, false).unwrap();
    let grown = Volume::grow(
        dir.path(),
        topology.clone(),
        &[("all".into(), volume::GrowTo::By(DEVICE_BYTES))],
    )
    .unwrap();
    assert_eq!(grown.len(), config.devices.len());
    for g in &grown {
        assert_eq!((g.before, g.after), (DEVICE_BYTES, 2 * DEVICE_BYTES));
    }
    let options = OpenOptions {
        check_interval: None,
        ..OpenOptions::default()
    };
    let volume = Volume::open(dir.path(), topology, &options).unwrap();
    for device in volume.stats() {
        let node = device.node.expect("emulated devices have a node");
        assert_eq!(
            device.capacity_bytes,
            2 * DEVICE_BYTES,
            "device {}",
            device.index
        );
        let region = volume.device_region(device.index).unwrap();
        let mut byte = [0u8];
        let addresses: Vec<usize> = (0..16u64)
            .map(|i| {
                let at = DEVICE_BYTES + i * (DEVICE_BYTES / 16);
                region.read(at, &mut byte).unwrap();
                region.address_of(at).unwrap()
            })
            .collect();
        let placed = topology::page_nodes(&addresses).unwrap();
        assert!(
            placed.iter().all(|&p| i64::from(p) == i64::from(node)),
            "device {} on node {node}: grown pages on {placed:?}",
            device.index
        );
        println!(
            "device {}: grown part on node {node} ({} pages sampled)",
            device.index,
            placed.len()
        );
    }
}
