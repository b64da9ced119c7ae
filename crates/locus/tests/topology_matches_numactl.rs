//! On the live machine, `locus topology --json` agrees with `numactl -H` (libnuma's view of
//! the same kernel files): nodes, CPUs, memory size and the distance matrix.
//!
//! Skipped with a message when numactl is not installed, except under CI (`CI=true`), where
//! its absence is a broken set-up and fails the test.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

#[derive(Debug, Default, PartialEq)]
struct NodeView {
    cpus: Vec<u64>,
    size_mib: u64,
    distances: Vec<u64>,
}

fn parse_numactl(text: &str) -> BTreeMap<u64, NodeView> {
    let mut nodes: BTreeMap<u64, NodeView> = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["node", id, "cpus:", cpus @ ..] => {
                nodes.entry(id.parse().unwrap()).or_default().cpus =
                    cpus.iter().map(|c| c.parse().unwrap()).collect();
            }
            ["node", id, "size:", size, "MB"] => {
                nodes.entry(id.parse().unwrap()).or_default().size_mib = size.parse().unwrap();
            }
            ["node", "distances:"] => {
                let header = lines.next().unwrap();
                let columns = header.split_whitespace().skip(1).count();
                for _ in 0..columns {
                    let row = lines.next().unwrap();
                    let (id, values) = row.split_once(':').unwrap();
                    nodes
                        .entry(id.trim().parse().unwrap())
                        .or_default()
                        .distances = values
                        .split_whitespace()
                        .map(|d| d.parse().unwrap())
                        .collect();
                }
            }
            _ => {}
        }
    }
    nodes
}

#[test]
fn topology_matches_numactl_hardware() {
    let Some(numactl) = numactl_hardware() else {
        return;
    };
    let expected = parse_numactl(&numactl);
    assert!(
        !expected.is_empty(),
        "could not parse numactl -H:\n{numactl}"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["--sysfs", "/sys", "topology", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap();
    let ours: BTreeMap<u64, NodeView> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let numbers = |v: &Value| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect()
            };
            let view = NodeView {
                cpus: numbers(&n["cpus"]),
                size_mib: n["memory_bytes"].as_u64().unwrap() >> 20,
                distances: numbers(&n["distances"]),
            };
            (n["id"].as_u64().unwrap(), view)
        })
        .collect();

    // Memory can be hot-plugged while the test runs (virtual machines grow and shrink), so
    // sizes are compared only when numactl saw the same sizes before and after our read.
    let after = parse_numactl(&numactl_hardware().expect("numactl ran a moment ago"));
    let sizes = |m: &BTreeMap<u64, NodeView>| m.values().map(|v| v.size_mib).collect::<Vec<_>>();
    let mut ours = ours;
    if sizes(&after) != sizes(&expected) {
        eprintln!("memory changed during the test; comparing everything but node sizes");
        ours.values_mut().for_each(|v| v.size_mib = 0);
        let mut expected = expected;
        expected.values_mut().for_each(|v| v.size_mib = 0);
        assert_eq!(ours, expected, "numactl -H said:\n{numactl}");
    } else {
        assert_eq!(ours, expected, "numactl -H said:\n{numactl}");
    }
}

fn numactl_hardware() -> Option<String> {
    match Command::new("numactl").arg("-H").output() {
        Ok(output) if output.status.success() => Some(String::from_utf8(output.stdout).unwrap()),
        other => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "numactl -H failed under CI ({other:?}); .ci/run must install numactl"
            );
            eprintln!("skipping: numactl -H is not available here ({other:?})");
            None
        }
    }
}
