//! The candidate order uses the best latency source that covers a whole row: probe, then
//! HMAT, then SLIT.

mod common;

use std::fs;

use topology::{LatencySource, ProbeReport, ProbeSample, Topology};

fn sample(cpu_node: u32, memory_node: u32, latency_ns: f64) -> ProbeSample {
    ProbeSample {
        cpu_node,
        cpu: cpu_node * 2,
        memory_node,
        latency_ns,
        buffer_bytes: 1 << 26,
    }
}

fn report(samples: Vec<ProbeSample>) -> ProbeReport {
    ProbeReport {
        loads_per_pair: 1000,
        cache_bytes: None,
        seed: 1,
        samples,
    }
}

#[test]
fn a_complete_probe_row_overrides_hmat() {
    let topology = Topology::read_from(common::fixture("four-node-cxl")).unwrap();
    // Measured: from node 0 the CXL node is faster than remote DRAM, against HMAT's claim.
    let probe = report(vec![
        sample(0, 0, 90.0),
        sample(0, 1, 180.0),
        sample(0, 2, 175.0),
        sample(0, 3, 150.0),
    ]);
    let order = topology.candidate_order(0, Some(&probe)).unwrap();
    assert_eq!(order.source, LatencySource::Probe);
    assert_eq!(order.node_ids(), vec![0, 3, 2, 1]);
    assert_eq!(order.candidates[1].latency_ns, Some(150.0));

    // Node 1's row was not measured, so it stays on HMAT.
    let order = topology.candidate_order(1, Some(&probe)).unwrap();
    assert_eq!(order.source, LatencySource::Hmat);
}

#[test]
fn a_partial_probe_row_is_not_used() {
    let topology = Topology::read_from(common::fixture("four-node-cxl")).unwrap();
    let probe = report(vec![sample(0, 0, 90.0), sample(0, 3, 10.0)]);
    let order = topology.candidate_order(0, Some(&probe)).unwrap();
    assert_eq!(order.source, LatencySource::Hmat);
    assert_eq!(order.node_ids(), vec![0, 1, 2, 3]);
}

#[test]
fn missing_hmat_for_one_node_falls_back_to_slit_for_the_row() {
    let (_dir, root) = common::fixture_copy("four-node-cxl");
    fs::remove_dir_all(root.join("devices/system/node/node1/access0")).unwrap();
    let topology = Topology::read_from(&root).unwrap();
    assert_eq!(topology.nodes[1].hmat, None);
    let order = topology.candidate_order(0, None).unwrap();
    assert_eq!(order.source, LatencySource::Slit);
    // SLIT puts the CXL node (17) before the remote sockets (21, 21; ties by id).
    assert_eq!(order.node_ids(), vec![0, 3, 1, 2]);
    assert!(order.candidates.iter().all(|c| c.latency_ns.is_none()));
}

#[test]
fn equal_distances_break_ties_by_node_id() {
    let topology = Topology::read_from(common::fixture("four-node-cxl")).unwrap();
    let order = topology.candidate_order(2, None).unwrap();
    assert_eq!(order.node_ids(), vec![2, 0, 1, 3]);
}

#[test]
fn unknown_requester_is_an_error() {
    let topology = Topology::read_from(common::fixture("two-socket")).unwrap();
    let error = topology.candidate_order(7, None).unwrap_err();
    assert_eq!(error.to_string(), "node 7 is not an online NUMA node");
}

#[test]
fn cpu_less_nodes_are_candidates_for_every_requester_but_never_requesters() {
    let topology = Topology::read_from(common::fixture("four-node-cxl")).unwrap();
    let orders = topology.candidate_orders(None).unwrap();
    assert_eq!(
        orders.iter().map(|o| o.requester).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(orders.iter().all(|o| o.node_ids().contains(&3)));
}
