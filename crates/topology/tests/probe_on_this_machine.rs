//! The latency probe runs on the live machine and measures every (CPU node, memory node)
//! pair. Values are not checked: the machine is shared and may be virtual.

use topology::{LatencySource, ProbeConfig, Topology};

#[test]
fn probe_measures_every_pair_and_orders_by_it() {
    let topology = Topology::read_live().unwrap();
    let config = ProbeConfig {
        buffer_bytes: Some(4 << 20),
        loads: 20_000,
        seed: 3,
    };
    let mut seen = 0;
    let report = topology::probe(&topology, &config, &mut |_| seen += 1).unwrap();

    let cpu_nodes: Vec<u32> = topology
        .nodes
        .iter()
        .filter(|n| !n.cpu_less)
        .map(|n| n.id)
        .collect();
    let memory_nodes: Vec<u32> = topology
        .nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .map(|n| n.id)
        .collect();
    assert_eq!(report.samples.len(), cpu_nodes.len() * memory_nodes.len());
    assert_eq!(seen, report.samples.len());
    for &cpu_node in &cpu_nodes {
        for &memory_node in &memory_nodes {
            let ns = report
                .latency_ns(cpu_node, memory_node)
                .expect("pair measured");
            assert!(
                ns.is_finite() && ns > 0.0,
                "{cpu_node}->{memory_node}: {ns}"
            );
        }
    }
    for sample in &report.samples {
        assert_eq!(topology.node_of_cpu(sample.cpu), Some(sample.cpu_node));
        assert_eq!(sample.buffer_bytes, 4 << 20);
    }
    for order in topology.candidate_orders(Some(&report)).unwrap() {
        assert_eq!(order.source, LatencySource::Probe);
    }
}

#[test]
fn probe_rejects_a_tiny_buffer() {
    let topology = Topology::read_live().unwrap();
    let config = ProbeConfig {
        buffer_bytes: Some(4096),
        ..ProbeConfig::default()
    };
    let error = topology::probe(&topology, &config, &mut |_| {}).unwrap_err();
    assert!(
        error.to_string().contains("invalid probe setting"),
        "{error}"
    );
}
