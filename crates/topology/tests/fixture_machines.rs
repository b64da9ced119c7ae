//! Reading committed sysfs trees of three machines gives exactly the expected topology,
//! including the candidate order of every node.

mod common;

use std::path::PathBuf;

use topology::{
    Candidate, CandidateOrder, HmatAccess, LatencySource, Nic, Node, PmemDevice, PmemKind, Topology,
};

const KIB: u64 = 1024;

fn node(id: u32, cpus: &[u32], total_kb: u64, free_kb: u64, distances: &[u32]) -> Node {
    Node {
        id,
        cpus: cpus.to_vec(),
        memory_bytes: total_kb * KIB,
        memory_free_bytes: free_kb * KIB,
        memory_reclaimable_bytes: 0,
        distances: distances.to_vec(),
        cpu_less: cpus.is_empty(),
        hmat_read_latency_ns: None,
        hmat: None,
    }
}

fn with_hmat(mut node: Node, initiators: &[u32], latency: [u64; 2], bandwidth: [u64; 2]) -> Node {
    node.hmat_read_latency_ns = Some(latency[0]);
    node.hmat = Some(HmatAccess {
        initiators: initiators.to_vec(),
        read_latency_ns: Some(latency[0]),
        write_latency_ns: Some(latency[1]),
        read_bandwidth_mb_s: Some(bandwidth[0]),
        write_bandwidth_mb_s: Some(bandwidth[1]),
    });
    node
}

fn nic(name: &str, node: Option<u32>, is_virtual: bool) -> Nic {
    Nic {
        name: name.to_owned(),
        node,
        is_virtual,
    }
}

fn pmem(path: &str, node: u32, size_bytes: u64, kind: PmemKind) -> PmemDevice {
    PmemDevice {
        path: PathBuf::from(path),
        node: Some(node),
        size_bytes,
        kind,
    }
}

fn slit_order(requester: u32, nodes_and_distances: &[(u32, u32)]) -> CandidateOrder {
    CandidateOrder {
        requester,
        source: LatencySource::Slit,
        candidates: nodes_and_distances
            .iter()
            .map(|&(node, distance)| Candidate {
                node,
                latency_ns: None,
                distance,
            })
            .collect(),
    }
}

#[test]
fn one_node_machine() {
    let topology = Topology::read_from(common::fixture("one-node")).unwrap();
    let expected = Topology {
        nodes: vec![node(0, &[0, 1], 4_941_992, 3_257_828, &[10])],
        pmem: vec![],
        nics: vec![
            nic("eth0", None, false),
            nic("ifb0", None, true),
            nic("ifb1", None, true),
            nic("lo", None, true),
        ],
        last_level_cache_bytes: Some(491_520 * KIB),
    };
    assert_eq!(topology, expected);
    assert_eq!(
        topology.candidate_orders(None).unwrap(),
        vec![slit_order(0, &[(0, 10)])]
    );
    assert_eq!(topology.node_of_cpu(1), Some(0));
    assert_eq!(topology.node_of_cpu(2), None);
}

#[test]
fn two_socket_server_with_an_nvdimm_and_a_nic_per_socket() {
    let topology = Topology::read_from(common::fixture("two-socket")).unwrap();
    let expected = Topology {
        nodes: vec![
            node(
                0,
                &[0, 1, 2, 3, 8, 9, 10, 11],
                196_608_000,
                190_000_000,
                &[10, 21],
            ),
            node(
                1,
                &[4, 5, 6, 7, 12, 13, 14, 15],
                197_132_288,
                191_500_000,
                &[21, 10],
            ),
        ],
        pmem: vec![
            pmem("/dev/pmem0", 0, 1_054_867_456 * 512, PmemKind::Fsdax),
            pmem("/dev/pmem1", 1, 1_054_867_456 * 512, PmemKind::Fsdax),
        ],
        nics: vec![
            nic("docker0", None, true),
            nic("ens1f0", Some(0), false),
            nic("ens2f0", Some(1), false),
            nic("lo", None, true),
        ],
        last_level_cache_bytes: Some(30_720 * KIB),
    };
    assert_eq!(topology, expected);
    assert_eq!(
        topology.candidate_orders(None).unwrap(),
        vec![
            slit_order(0, &[(0, 10), (1, 21)]),
            slit_order(1, &[(1, 10), (0, 21)])
        ]
    );
    let cpu_map = topology.cpu_to_node();
    assert_eq!(cpu_map.len(), 16);
    assert_eq!(cpu_map[&12], 1);
    assert_eq!(cpu_map[&11], 0);
}

#[test]
fn four_nodes_with_a_cpu_less_cxl_node_hmat_and_scrambled_pmem_numbering() {
    let topology = Topology::read_from(common::fixture("four-node-cxl")).unwrap();
    let gib = 1u64 << 30;
    let expected = Topology {
        nodes: vec![
            with_hmat(
                node(0, &[0, 1], 8_388_608, 8_000_000, &[10, 21, 21, 17]),
                &[0],
                [80, 80],
                [20_000, 18_000],
            ),
            with_hmat(
                node(1, &[2, 3], 8_388_608, 8_100_000, &[21, 10, 21, 28]),
                &[1],
                [80, 80],
                [20_000, 18_000],
            ),
            with_hmat(
                node(2, &[4, 5], 8_388_608, 8_200_000, &[21, 21, 10, 28]),
                &[2],
                [80, 80],
                [20_000, 18_000],
            ),
            with_hmat(
                node(3, &[], 16_777_216, 16_777_216, &[17, 28, 28, 10]),
                &[0],
                [250, 300],
                [8_000, 6_000],
            ),
        ],
        // pmem0 is on node 2 and pmem1 on node 0; the BTT device pmem2s cannot do DAX and
        // dax4.0 is onlined as system RAM (kmem), so neither is listed.
        pmem: vec![
            pmem("/dev/pmem0", 2, 16 * gib, PmemKind::Fsdax),
            pmem("/dev/pmem1", 0, 8 * gib, PmemKind::Fsdax),
            pmem("/dev/dax3.0", 1, 4 * gib, PmemKind::Devdax),
        ],
        // eth1 is virtio-net: its numa_node sits on the parent PCI function.
        nics: vec![
            nic("enp3s0", Some(2), false),
            nic("eth1", Some(1), false),
            nic("lo", None, true),
        ],
        last_level_cache_bytes: Some(16 * 1024 * KIB),
    };
    assert_eq!(topology, expected);
    assert!(topology.nodes[3].cpu_less);
    assert_eq!(topology.memory_nodes(), vec![0, 1, 2, 3]);

    // HMAT decides, not SLIT: for node 0 the CXL node 3 is nearer than node 1 by SLIT
    // (17 < 21) but last by latency (250 ns > 80 x 21 / 10 = 168 ns). Requesters that are not
    // node 3's best initiator see its latency scaled by SLIT: 250 x 28 / 17.
    let hmat = |requester: u32, rows: &[(u32, f64, u32)]| CandidateOrder {
        requester,
        source: LatencySource::Hmat,
        candidates: rows
            .iter()
            .map(|&(node, ns, distance)| Candidate {
                node,
                latency_ns: Some(ns),
                distance,
            })
            .collect(),
    };
    let cxl_scaled = 250.0 * 28.0 / 17.0;
    assert_eq!(
        topology.candidate_orders(None).unwrap(),
        vec![
            hmat(
                0,
                &[
                    (0, 80.0, 10),
                    (1, 168.0, 21),
                    (2, 168.0, 21),
                    (3, 250.0, 17)
                ]
            ),
            hmat(
                1,
                &[
                    (1, 80.0, 10),
                    (0, 168.0, 21),
                    (2, 168.0, 21),
                    (3, cxl_scaled, 28)
                ]
            ),
            hmat(
                2,
                &[
                    (2, 80.0, 10),
                    (0, 168.0, 21),
                    (1, 168.0, 21),
                    (3, cxl_scaled, 28)
                ]
            ),
        ]
    );
}

/// The largest cache is read from one CPU per node — the first that reports caches — not
/// from every CPU (which cost each process that mounts a volume ~8 sysfs reads per CPU):
/// a garbled size on a node's second CPU is never read, and a node whose first CPU reports
/// no caches is read from its next one.
#[test]
fn the_largest_cache_is_read_from_one_cpu_per_node() {
    let (_dir, root) = common::fixture_copy("two-socket");
    let cpu = root.join("devices/system/cpu");
    std::fs::write(cpu.join("cpu1/cache/index3/size"), "garbage\n").unwrap();
    std::fs::remove_dir_all(cpu.join("cpu4/cache")).unwrap();
    std::fs::write(cpu.join("cpu5/cache/index3/size"), "65536K\n").unwrap();
    let topology = Topology::read_from(&root).expect("the garbled size is not read");
    assert_eq!(topology.last_level_cache_bytes, Some(65_536 * KIB));
}
