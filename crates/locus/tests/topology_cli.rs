//! `locus topology` as a user runs it: the JSON document's documented fields, the tables,
//! and errors for a broken sysfs tree.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures")
        .join(name)
}

fn locus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(args)
        .output()
        .expect("run locus")
}

fn topology_json(fixture_name: &str) -> Value {
    let sysfs = fixture(fixture_name);
    let output = locus(&["--sysfs", sysfs.to_str().unwrap(), "topology", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

#[test]
fn json_has_the_documented_fields() {
    let doc = topology_json("four-node-cxl");
    let nodes: Vec<Value> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            json!({
                "id": n["id"], "cpus": n["cpus"], "memory_bytes": n["memory_bytes"],
                "distances": n["distances"], "cpu_less": n["cpu_less"],
                "hmat_read_latency_ns": n["hmat_read_latency_ns"],
            })
        })
        .collect();
    assert_eq!(
        Value::Array(nodes),
        json!([
            {"id": 0, "cpus": [0, 1], "memory_bytes": 8_589_934_592u64, "distances": [10, 21, 21, 17],
             "cpu_less": false, "hmat_read_latency_ns": 80},
            {"id": 1, "cpus": [2, 3], "memory_bytes": 8_589_934_592u64, "distances": [21, 10, 21, 28],
             "cpu_less": false, "hmat_read_latency_ns": 80},
            {"id": 2, "cpus": [4, 5], "memory_bytes": 8_589_934_592u64, "distances": [21, 21, 10, 28],
             "cpu_less": false, "hmat_read_latency_ns": 80},
            {"id": 3, "cpus": [], "memory_bytes": 17_179_869_184u64, "distances": [17, 28, 28, 10],
             "cpu_less": true, "hmat_read_latency_ns": 250},
        ])
    );
    assert_eq!(
        doc["pmem"],
        json!([
            {"path": "/dev/pmem0", "node": 2, "size_bytes": 17_179_869_184u64, "kind": "fsdax"},
            {"path": "/dev/pmem1", "node": 0, "size_bytes": 8_589_934_592u64, "kind": "fsdax"},
            {"path": "/dev/dax3.0", "node": 1, "size_bytes": 4_294_967_296u64, "kind": "devdax"},
        ])
    );
    assert_eq!(
        doc["nics"],
        json!([
            {"name": "enp3s0", "node": 2, "virtual": false},
            {"name": "eth1", "node": 1, "virtual": false},
            {"name": "lo", "node": null, "virtual": true},
        ])
    );
    assert_eq!(
        doc["cpu_to_node"],
        json!({"0": 0, "1": 0, "2": 1, "3": 1, "4": 2, "5": 2})
    );
    let orders: Vec<(Value, Value, Vec<Value>)> = doc["candidate_orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let nodes = o["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["node"].clone());
            (o["requester"].clone(), o["source"].clone(), nodes.collect())
        })
        .collect();
    assert_eq!(
        orders,
        vec![
            (
                json!(0),
                json!("hmat"),
                vec![json!(0), json!(1), json!(2), json!(3)]
            ),
            (
                json!(1),
                json!("hmat"),
                vec![json!(1), json!(0), json!(2), json!(3)]
            ),
            (
                json!(2),
                json!("hmat"),
                vec![json!(2), json!(0), json!(1), json!(3)]
            ),
        ]
    );
    assert_eq!(doc["probe"], Value::Null);
}

#[test]
fn table_shows_nodes_distances_order_devices_and_nics() {
    let sysfs = fixture("two-socket");
    let output = locus(&["--sysfs", sysfs.to_str().unwrap(), "topology"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "2 nodes, 16 CPUs",
        "0-3,8-11",
        "4-7,12-15",
        "node 0: 0 (distance 10), 1 (distance 21)  [slit]",
        "/dev/pmem1  fsdax  1     503.00 GiB",
        "ens2f0     node 1",
        "docker0    virtual",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

#[test]
fn broken_tree_exits_nonzero_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("locus-empty-sysfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = locus(&["--sysfs", dir.to_str().unwrap(), "topology"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("devices/system/node/online"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn probe_options_require_probe() {
    let output = locus(&["topology", "--probe-loads", "5000"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--probe"));
}
