//! A damaged sysfs tree gives an error that names the file and says what is wrong with it.

mod common;

use std::fs;
use std::path::Path;

use topology::{Topology, TopologyError};

/// Damages one file of a copy of `fixture` and returns the error reading it gives.
fn read_after(fixture: &str, damage: impl FnOnce(&Path)) -> (TopologyError, std::path::PathBuf) {
    let (_dir, root) = common::fixture_copy(fixture);
    damage(&root);
    let error = Topology::read_from(&root).expect_err("a damaged tree must not read");
    (error, root)
}

fn assert_malformed(error: &TopologyError, file: &Path, problem: &str) {
    match error {
        TopologyError::Malformed {
            path,
            problem: found,
        } => {
            assert_eq!(path, file, "wrong file named in `{error}`");
            assert!(
                found.contains(problem),
                "`{found}` does not say `{problem}`"
            );
        }
        other => panic!("expected Malformed for {}, got {other:?}", file.display()),
    }
    assert!(
        error.to_string().contains(&file.display().to_string()),
        "message hides the file"
    );
}

#[test]
fn bad_cpulist() {
    let (error, root) = read_after("two-socket", |root| {
        fs::write(root.join("devices/system/node/node1/cpulist"), "4-7,12-x\n").unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node1/cpulist"),
        "not a number",
    );
}

#[test]
fn cpu_on_two_nodes() {
    let (error, root) = read_after("two-socket", |root| {
        fs::write(
            root.join("devices/system/node/node1/cpulist"),
            "3-7,12-15\n",
        )
        .unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node1/cpulist"),
        "CPU 3 is also listed by node 0",
    );
}

#[test]
fn ragged_distance_matrix() {
    let (error, root) = read_after("four-node-cxl", |root| {
        fs::write(
            root.join("devices/system/node/node2/distance"),
            "21 21 10\n",
        )
        .unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node2/distance"),
        "ragged",
    );
}

#[test]
fn wrong_self_distance() {
    let (error, root) = read_after("two-socket", |root| {
        fs::write(root.join("devices/system/node/node1/distance"), "21 11\n").unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node1/distance"),
        "to itself is 11",
    );
}

#[test]
fn missing_node_directory_files() {
    for file in ["meminfo", "cpulist", "distance"] {
        let (error, root) = read_after("two-socket", |root| {
            fs::remove_file(root.join("devices/system/node/node1").join(file)).unwrap();
        });
        let expected = root.join("devices/system/node/node1").join(file);
        match &error {
            TopologyError::Read { path, source } => {
                assert_eq!(path, &expected);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected Read error for {file}, got {other:?}"),
        }
        assert!(error.to_string().contains(&expected.display().to_string()));
    }
}

#[test]
fn online_node_without_a_directory() {
    let (error, root) = read_after("one-node", |root| {
        fs::write(root.join("devices/system/node/online"), "0-1\n").unwrap();
        fs::write(root.join("devices/system/node/node0/distance"), "10 20\n").unwrap();
    });
    let expected = root.join("devices/system/node/node1/cpulist");
    assert!(
        matches!(&error, TopologyError::Read { path, .. } if path == &expected),
        "{error:?}"
    );
}

#[test]
fn online_list_longer_than_distance_rows() {
    let (error, root) = read_after("one-node", |root| {
        fs::write(root.join("devices/system/node/online"), "0-1\n").unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node0/distance"),
        "ragged",
    );
}

#[test]
fn missing_online_list() {
    let (error, root) = read_after("one-node", |root| {
        fs::remove_file(root.join("devices/system/node/online")).unwrap();
    });
    assert!(
        matches!(&error, TopologyError::Read { path, .. } if path == &root.join("devices/system/node/online")),
        "{error:?}"
    );
}

#[test]
fn meminfo_of_the_wrong_node() {
    let (error, root) = read_after("two-socket", |root| {
        let file = root.join("devices/system/node/node1/meminfo");
        let text = fs::read_to_string(&file)
            .unwrap()
            .replace("Node 1 ", "Node 0 ");
        fs::write(file, text).unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node1/meminfo"),
        "not node 1",
    );
}

#[test]
fn garbage_hmat_latency() {
    let (error, root) = read_after("four-node-cxl", |root| {
        let file = root.join("devices/system/node/node3/access0/initiators/read_latency");
        fs::write(file, "fast\n").unwrap();
    });
    assert_malformed(
        &error,
        &root.join("devices/system/node/node3/access0/initiators/read_latency"),
        "expected an unsigned number",
    );
}

#[test]
fn garbage_device_numa_node() {
    let (error, root) = read_after("two-socket", |root| {
        let file = root.join("block/pmem1/device/numa_node");
        fs::write(file, "one\n").unwrap();
    });
    assert_malformed(
        &error,
        &root.join("block/pmem1/device/numa_node"),
        "NUMA node id or -1",
    );
}

#[test]
fn oversized_attribute_is_refused() {
    let (error, root) = read_after("one-node", |root| {
        let file = root.join("devices/system/node/node0/cpulist");
        fs::write(file, "0,".repeat(100_000)).unwrap();
    });
    assert!(
        matches!(&error, TopologyError::Read { path, source }
            if path == &root.join("devices/system/node/node0/cpulist")
            && source.to_string().contains("not a sysfs attribute")),
        "{error:?}"
    );
}
