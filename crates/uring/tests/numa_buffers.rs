//! On the live machine (and in the testbed's multi-node guests): an engine created by a
//! thread pinned to each CPU node keeps every tier's buffers on that node (`move_pages`),
//! and data round-trips through them with O_DIRECT.
//!
//! The device is `LOCUS_URING_TEST_DEVICE` (the guests pass a virtio disk) or, by default, a
//! file under the build's temporary directory.

use uring::{DirectFile, Engine, Op, PoolConfig, Strategy};

#[test]
fn every_tier_lives_on_the_node_of_the_thread_using_it() {
    let topology = topology::Topology::read_live().unwrap();
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).ok();
    let path = match std::env::var_os("LOCUS_URING_TEST_DEVICE") {
        Some(device) => std::path::PathBuf::from(device),
        None => scratch
            .as_ref()
            .expect("a scratch directory")
            .path()
            .join("disk.img"),
    };
    let sizes = [4096usize, 256 << 10, 4 << 20, 6 << 20];
    for (n, node) in topology
        .nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .enumerate()
    {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    topology::pin_current_thread(&node.cpus).unwrap();
                    let file = DirectFile::open(&path, Some(64 << 20)).unwrap();
                    let mut engine =
                        Engine::new(file, Strategy::Pool, PoolConfig::default(), 4).unwrap();
                    for (i, &len) in sizes.iter().enumerate() {
                        let buf = engine.buffer(len, Op::Write).unwrap();
                        let addresses: Vec<usize> =
                            buf.segments().iter().map(|s| s.address as usize).collect();
                        let placed = topology::page_nodes(&addresses).unwrap();
                        assert!(
                            placed.iter().all(|&p| p == node.id as i32),
                            "node {}: a {len}-byte {:?} buffer is on {placed:?}",
                            node.id,
                            buf.tier()
                        );
                        engine.release(buf);
                        let offset = ((n * sizes.len() + i) as u64 % 8) * (8 << 20);
                        let data: Vec<u8> = (0..len).map(|b| (b * 31 + i + n) as u8).collect();
                        engine.write_all(offset, &data).unwrap();
                        assert_eq!(
                            engine.read_exact(offset, len).unwrap(),
                            data,
                            "node {} size {len}",
                            node.id
                        );
                    }
                    println!(
                        "node {}: small, medium, exact-m and large buffers on node {}; data intact",
                        node.id, node.id
                    );
                })
                .join()
                .unwrap();
        });
    }
}
