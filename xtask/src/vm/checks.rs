//! Host-side checks of what the guest printed, against the topology description.
//!
//! Every check returns the list of differences in words; empty means it passed.

use serde_json::Value;

use super::topology::VmTopology;

/// Parameters of the probe step; the check verifies the guest used them.
pub const PROBE_BUFFER_BYTES: u64 = 2 << 20;
pub const PROBE_LOADS: u64 = 20_000;

/// `locus topology --json` must describe the machine exactly.
pub fn topology_json(topology: &VmTopology, stdout: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let doc: Value = match serde_json::from_str(stdout) {
        Ok(doc) => doc,
        Err(error) => return vec![format!("output is not JSON: {error}")],
    };

    let nodes = doc["nodes"].as_array().cloned().unwrap_or_default();
    expect(
        &mut problems,
        "node count".into(),
        topology.nodes.len().into(),
        &nodes.len().into(),
    );
    for (id, node) in topology.nodes.iter().enumerate() {
        let Some(found) = nodes.get(id) else { continue };
        let id_u32 = id as u32;
        expect(
            &mut problems,
            format!("node {id} id"),
            id.into(),
            &found["id"],
        );
        expect(
            &mut problems,
            format!("node {id} cpus"),
            topology.cpus_of(id_u32).into(),
            &found["cpus"],
        );
        expect(
            &mut problems,
            format!("node {id} cpu_less"),
            (node.cpus == 0).into(),
            &found["cpu_less"],
        );
        expect(
            &mut problems,
            format!("node {id} distances"),
            topology.distances[id].clone().into(),
            &found["distances"],
        );
        let hmat = topology
            .hmat
            .iter()
            .filter(|e| e.target == id_u32)
            .map(|e| e.latency_ns)
            .min()
            .map_or(Value::Null, Value::from);
        expect(
            &mut problems,
            format!("node {id} hmat_read_latency_ns"),
            hmat,
            &found["hmat_read_latency_ns"],
        );
        let memory = found["memory_bytes"].as_u64().unwrap_or(0);
        let configured = u64::from(node.memory_mib) << 20;
        if memory == 0 || memory > configured {
            problems.push(format!(
                "node {id} memory_bytes: expected between 1 and {configured}, found {memory}"
            ));
        }
    }

    let mut expected_pmem: Vec<(String, u32, &str)> = topology
        .nvdimms
        .iter()
        .map(|d| (d.expected_path.to_owned(), d.node, d.mode.json_kind()))
        .collect();
    expected_pmem.sort();
    let mut found_pmem: Vec<(String, u32, &str)> = doc["pmem"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let kind = match p["kind"].as_str() {
                Some("fsdax") => "fsdax",
                Some("devdax") => "devdax",
                _ => "?",
            };
            let node = p["node"].as_u64().map_or(u32::MAX, |n| n as u32);
            (p["path"].as_str().unwrap_or("?").to_owned(), node, kind)
        })
        .collect();
    found_pmem.sort();
    if expected_pmem != found_pmem {
        problems.push(format!(
            "pmem (path, node, kind): expected {expected_pmem:?}, found {found_pmem:?}"
        ));
    }
    for (device, nvdimm) in doc["pmem"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&topology.nvdimms)
    {
        let size = device["size_bytes"].as_u64().unwrap_or(0);
        let raw = u64::from(nvdimm.size_mib) << 20;
        // fs-dax and device-DAX keep some of the namespace for their page map and alignment.
        if size == 0 || size > raw {
            problems.push(format!(
                "{} size_bytes {size} is not in 1..={raw}",
                device["path"]
            ));
        }
    }

    let expected_nics = serde_json::json!([
        {"name": "eth0", "node": topology.nic_node, "virtual": false},
        {"name": "lo", "node": null, "virtual": true},
    ]);
    if doc["nics"] != expected_nics {
        problems.push(format!(
            "nics: expected {expected_nics}, found {}",
            doc["nics"]
        ));
    }

    let found_orders: Vec<(u64, String, Vec<u64>)> = doc["candidate_orders"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|o| {
            let nodes = o["candidates"].as_array().cloned().unwrap_or_default();
            (
                o["requester"].as_u64().unwrap_or(u64::MAX),
                o["source"].as_str().unwrap_or("?").to_owned(),
                nodes
                    .iter()
                    .map(|c| c["node"].as_u64().unwrap_or(u64::MAX))
                    .collect(),
            )
        })
        .collect();
    let expected_orders: Vec<(u64, String, Vec<u64>)> = topology
        .expected_orders
        .iter()
        .map(|(requester, source, nodes)| {
            (
                u64::from(*requester),
                (*source).to_owned(),
                nodes.iter().map(|&n| u64::from(n)).collect(),
            )
        })
        .collect();
    if found_orders != expected_orders {
        problems.push(format!(
            "candidate orders (requester, source, nodes): expected {expected_orders:?}, found {found_orders:?}"
        ));
    }
    problems
}

#[expect(
    clippy::needless_pass_by_value,
    reason = "call sites build the description and the value inline; borrowing adds only noise"
)]
fn expect(problems: &mut Vec<String>, what: String, expected: Value, found: &Value) {
    if &expected != found {
        problems.push(format!("{what}: expected {expected}, found {found}"));
    }
}

/// `locus topology --json --probe` must report every (CPU node, memory node) pair once, from
/// a CPU of the right node, with the requested buffer. Latencies under TCG mean nothing, so
/// only their presence is checked.
pub fn probe_json(topology: &VmTopology, stdout: &str) -> Vec<String> {
    let doc: Value = match serde_json::from_str(stdout) {
        Ok(doc) => doc,
        Err(error) => return vec![format!("output is not JSON: {error}")],
    };
    let mut problems = Vec::new();
    let samples = doc["probe"]["samples"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut found: Vec<(u64, u64)> = Vec::new();
    for sample in &samples {
        let cpu_node = sample["cpu_node"].as_u64().unwrap_or(u64::MAX);
        let memory_node = sample["memory_node"].as_u64().unwrap_or(u64::MAX);
        found.push((cpu_node, memory_node));
        let cpu = sample["cpu"].as_u64().unwrap_or(u64::MAX);
        let node_cpus = u32::try_from(cpu_node)
            .ok()
            .filter(|&n| (n as usize) < topology.nodes.len())
            .map(|n| topology.cpus_of(n))
            .unwrap_or_default();
        if !node_cpus.iter().any(|&c| u64::from(c) == cpu) {
            problems.push(format!(
                "sample {cpu_node}->{memory_node} ran on CPU {cpu}, not on node {cpu_node}"
            ));
        }
        let latency = sample["latency_ns"].as_f64().unwrap_or(0.0);
        if !(latency.is_finite() && latency > 0.0) {
            problems.push(format!(
                "sample {cpu_node}->{memory_node} has latency {latency}"
            ));
        }
        if sample["buffer_bytes"].as_u64() != Some(PROBE_BUFFER_BYTES) {
            problems.push(format!(
                "sample {cpu_node}->{memory_node} used {} bytes",
                sample["buffer_bytes"]
            ));
        }
    }
    let mut expected = Vec::new();
    for (cpu_node, node) in topology.nodes.iter().enumerate() {
        if node.cpus == 0 {
            continue;
        }
        for memory_node in 0..topology.nodes.len() {
            expected.push((cpu_node as u64, memory_node as u64));
        }
    }
    found.sort_unstable();
    if found != expected {
        problems.push(format!(
            "probed pairs: expected {expected:?}, found {found:?}"
        ));
    }
    if doc["probe"]["loads_per_pair"].as_u64() != Some(PROBE_LOADS) {
        problems.push(format!(
            "loads_per_pair: {}",
            doc["probe"]["loads_per_pair"]
        ));
    }
    for order in doc["candidate_orders"].as_array().into_iter().flatten() {
        if order["source"] != "probe" {
            problems.push(format!(
                "node {} order not from the probe: {}",
                order["requester"], order["source"]
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::topology::by_name;

    /// What a correct guest prints for `cxl`, reduced to the fields the check reads.
    fn cxl_document() -> Value {
        let node = |id: u32, cpus: Vec<u32>, distances: Vec<u32>, hmat: u32| {
            serde_json::json!({
                "id": id, "cpus": cpus, "cpu_less": cpus.is_empty(), "distances": distances,
                "hmat_read_latency_ns": hmat, "memory_bytes": 200u64 << 20,
            })
        };
        let order = |requester: u32, nodes: Vec<u32>| {
            let candidates: Vec<Value> = nodes
                .into_iter()
                .map(|n| serde_json::json!({"node": n}))
                .collect();
            serde_json::json!({"requester": requester, "source": "hmat", "candidates": candidates})
        };
        serde_json::json!({
            "nodes": [
                node(0, vec![0, 1], vec![10, 21, 17], 80),
                node(1, vec![2, 3], vec![21, 10, 28], 80),
                node(2, vec![], vec![17, 28, 10], 170),
            ],
            "pmem": [{"path": "/dev/pmem0", "node": 1, "kind": "fsdax", "size_bytes": 250u64 << 20}],
            "nics": [
                {"name": "eth0", "node": 0, "virtual": false},
                {"name": "lo", "node": null, "virtual": true},
            ],
            "candidate_orders": [order(0, vec![0, 1, 2]), order(1, vec![1, 0, 2])],
        })
    }

    #[test]
    fn a_correct_report_passes() {
        let topology = by_name("cxl").unwrap();
        assert_eq!(
            topology_json(&topology, &cxl_document().to_string()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_kind_of_difference_is_reported() {
        let topology = by_name("cxl").unwrap();
        type Mutation = (&'static str, fn(&mut Value));
        let mutations: [Mutation; 5] = [
            ("cpu_less", |d| d["nodes"][2]["cpu_less"] = false.into()),
            ("distances", |d| d["nodes"][1]["distances"][2] = 17.into()),
            ("pmem", |d| d["pmem"][0]["node"] = 0.into()),
            ("nics", |d| d["nics"][0]["node"] = Value::Null),
            ("candidate orders", |d| {
                d["candidate_orders"][0]["source"] = "slit".into();
            }),
        ];
        for (what, mutate) in mutations {
            let mut document = cxl_document();
            mutate(&mut document);
            let problems = topology_json(&topology, &document.to_string());
            assert_eq!(problems.len(), 1, "{what}: {problems:?}");
            assert!(problems[0].contains(what), "{what}: {problems:?}");
        }
        assert!(topology_json(&topology, "not json")[0].contains("not JSON"));
    }
}
