//! `locus serve`'s channels are where they claim to be, seen from outside the server: on the
//! live machine and, through `cargo xtask vm-test`, in multi-node guests (with `LOCUS_BIN`
//! naming the guest's binary).
//!
//! A volume with one emulated device per node is served with one channel per node with CPUs,
//! and libnbd's `nbdcopy` writes through connections dealt over the channels, then reads the
//! data back. The checks:
//! - the kernel ran every request of a channel on that channel's node's CPUs (the server
//!   records `sched_getcpu` per request and prints it with `--stats-json`);
//! - every write payload was received into memory of the channel's node (the device the
//!   buffer came from), and the kernel holds each device's pages on its node
//!   (`/proc/PID/numa_maps` of the server);
//! - queued-mode worker threads have exactly their node's CPUs as affinity (`/proc`);
//! - a TCP connection to an address of a NIC with a known node lands on a channel of that
//!   node (in the guests the NIC sits behind a PCI expander bridge on a chosen node).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use topology::Topology;

/// Bytes each `nbdcopy` writes.
const SOURCE_BYTES: usize = 4 << 20;

fn locus() -> PathBuf {
    std::env::var_os("LOCUS_BIN").map_or_else(|| env!("CARGO_BIN_EXE_locus").into(), PathBuf::from)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// nbdcopy is required in CI and in the guests (where `LOCUS_BIN` is set); elsewhere its
/// absence skips the test.
fn have_nbdcopy() -> bool {
    let found = Command::new("nbdcopy")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none() && std::env::var_os("LOCUS_BIN").is_none(),
            "nbdcopy is missing (Debian: libnbd-bin)"
        );
        eprintln!("skipping: nbdcopy is not installed");
    }
    found
}

fn nbdcopy(from: &str, to: &str) {
    let output = Command::new("nbdcopy")
        .args(["--connections=1", from, to])
        .output()
        .expect("run nbdcopy");
    assert!(
        output.status.success(),
        "nbdcopy {from} {to}: {}",
        text(&output.stderr)
    );
}

/// A volume with one small emulated device per node, bound to it.
fn volume() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm");
    let output = Command::new(locus())
        .args(["format", "--volume", dir.path().to_str().unwrap()])
        .arg("--emulate=32M")
        .output()
        .expect("run locus format");
    assert!(output.status.success(), "{}", text(&output.stderr));
    dir
}

/// Device path → node, from the volume's locus.toml.
fn device_nodes(volume: &Path) -> BTreeMap<String, u32> {
    let config = std::fs::read_to_string(volume.join("locus.toml")).unwrap();
    let mut out = BTreeMap::new();
    let mut path = None;
    for line in config.lines() {
        if let Some(value) = line.strip_prefix("path = ") {
            path = Some(value.trim_matches('"').to_owned());
        } else if let Some(value) = line.strip_prefix("node = ") {
            out.insert(
                path.take().expect("path before node"),
                value.parse().unwrap(),
            );
        }
    }
    assert!(!out.is_empty(), "no devices in {config}");
    out
}

struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn start(volume: &Path, args: &[&str]) -> Serve {
        let log = volume.join("serve.log");
        let child = Command::new(locus())
            .args([
                "serve",
                "--volume",
                volume.to_str().unwrap(),
                "--stats-json",
            ])
            .args(["--default-size", "16M"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start locus serve");
        let mut serve = Serve { child, log };
        common::wait_until_serving(&mut serve.child, &serve.log, Duration::from_secs(120));
        serve
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn proc(&self, name: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.child.id()))
            .unwrap_or_else(|e| panic!("/proc/{}/{name}: {e}", self.child.id()))
    }

    /// (thread name, allowed CPUs) of every thread of the server.
    fn threads(&self) -> Vec<(String, Vec<u32>)> {
        let dir = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|task| {
                let task = task.unwrap().path();
                let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
                let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
                let allowed = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| topology::cpulist::parse(l.trim()).unwrap())
                    .unwrap_or_default();
                (name.trim().to_owned(), allowed)
            })
            .collect()
    }

    /// SIGTERM; the per-channel totals it printed, by channel.
    fn stop(mut self) -> Vec<Value> {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        let log = self.log();
        assert!(status.success(), "locus serve exited with {status}: {log}");
        let totals: Vec<Value> = log
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<Value>(l).expect("a stats line is JSON"))
            .filter(|v| v["report"] == "total")
            .collect();
        assert!(!totals.is_empty(), "no totals printed: {log}");
        totals
    }
}

fn numbers(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{value} is not an array"))
        .iter()
        .map(|n| n.as_u64().unwrap() as u32)
        .collect()
}

/// Checks one channel's totals against the machine; returns its node.
fn check_channel(topology: &Topology, channel: &Value) -> u32 {
    let id = &channel["channel"];
    let node = channel["node"].as_u64().expect("a channel with a node") as u32;
    let cpus = numbers(&channel["cpus"]);
    let node_cpus = &topology.node(node).expect("the channel's node exists").cpus;
    assert_eq!(
        &cpus, node_cpus,
        "channel {id} is pinned to CPUs other than node {node}'s"
    );
    let ran_on = numbers(&channel["ran_on_cpus"]);
    assert!(
        ran_on.iter().all(|cpu| node_cpus.contains(cpu)),
        "channel {id} (node {node}, CPUs {node_cpus:?}) ran requests on CPUs {ran_on:?}"
    );
    let writes = channel["writes"].as_u64().unwrap();
    let payloads = &channel["payloads"];
    assert_eq!(
        (
            payloads["on_node"].as_u64(),
            payloads["off_node"].as_u64(),
            payloads["unplaced"].as_u64()
        ),
        (Some(writes), Some(0), Some(0)),
        "channel {id} (node {node}): write payloads not all received on its node: {channel}"
    );
    assert_eq!(channel["errors"], 0, "channel {id}: {channel}");
    node
}

/// Every device mapping in the server has its pages on the device's node only.
fn check_device_pages(serve: &Serve, devices: &BTreeMap<String, u32>) {
    let maps = serve.proc("numa_maps");
    for (path, node) in devices {
        let line = maps
            .lines()
            .find(|l| l.contains(&format!("file={path}")))
            .unwrap_or_else(|| panic!("{path} is not mapped by the server:\n{maps}"));
        let mut pages_on_node = 0u64;
        for field in line.split_whitespace() {
            let Some((key, count)) = field.split_once('=') else {
                continue;
            };
            let Some(on) = key.strip_prefix('N').and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            assert_eq!(
                on, *node,
                "{path} (node {node}) has pages on node {on}: {line}"
            );
            pages_on_node += count.parse::<u64>().unwrap();
        }
        assert!(pages_on_node > 0, "{path}: no resident pages: {line}");
    }
}

#[test]
fn channels_run_on_their_nodes_and_receive_writes_into_their_nodes_memory() {
    if !have_nbdcopy() {
        return;
    }
    let topology = Topology::read_live().unwrap();
    let cpu_nodes = topology.nodes.iter().filter(|n| !n.cpus.is_empty()).count();
    let volume = volume();
    let devices = device_nodes(volume.path());
    let source = volume.path().join("source");
    let data: Vec<u8> = (0..SOURCE_BYTES).map(|_| rand::random::<u8>()).collect();
    std::fs::write(&source, &data).unwrap();
    let back = volume.path().join("back");
    let socket = volume.path().join("nbd.sock");
    let uri = format!("nbd+unix:///?socket={}", socket.display());

    for submit in ["inline", "queued"] {
        let serve = Serve::start(
            volume.path(),
            &[
                "--unix",
                socket.to_str().unwrap(),
                "--submit",
                submit,
                "--workers",
                "1",
            ],
        );
        // Unix connections are dealt round-robin: two writing connections per channel.
        for _ in 0..2 * cpu_nodes {
            nbdcopy(source.to_str().unwrap(), &uri);
        }
        nbdcopy(&uri, back.to_str().unwrap());
        let read = std::fs::read(&back).unwrap();
        assert!(
            read[..SOURCE_BYTES] == data[..],
            "{submit}: the export does not read back what was written"
        );
        check_device_pages(&serve, &devices);
        let threads = serve.threads();
        let totals = serve.stop();
        assert_eq!(
            totals.len(),
            cpu_nodes,
            "{submit}: one channel per node with CPUs"
        );
        let mut nodes = Vec::new();
        for channel in &totals {
            nodes.push(check_channel(&topology, channel));
            assert!(
                channel["connections"].as_u64() >= Some(2) && channel["writes"].as_u64() > Some(0),
                "{submit}: channel {} was left out: {channel}",
                channel["channel"]
            );
            if submit == "queued" {
                let prefix = format!("nbd-ch{}-w", channel["channel"]);
                let workers: Vec<_> = threads
                    .iter()
                    .filter(|(name, _)| name.starts_with(&prefix))
                    .collect();
                assert!(
                    !workers.is_empty(),
                    "no {prefix}* threads among {threads:?}"
                );
                for (name, allowed) in workers {
                    assert_eq!(
                        allowed,
                        &numbers(&channel["cpus"]),
                        "{name} may run on CPUs other than its channel's"
                    );
                }
            }
        }
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(
            nodes.len(),
            cpu_nodes,
            "{submit}: channels share nodes: {totals:?}"
        );
        eprintln!("{submit}: {} channels checked", totals.len());
    }

    // TCP to an address of a NIC with a known node: every connection on that node's channel.
    let nics: Vec<(IpAddr, u32)> = nbd::server::interface_addresses()
        .unwrap()
        .into_iter()
        // IPv4 only: an IPv6 link-local address cannot be used without its scope.
        .filter(|(_, ip)| ip.is_ipv4() && !ip.is_loopback())
        .filter_map(|(name, ip)| Some((ip, topology.nics.iter().find(|n| n.name == name)?.node?)))
        .collect();
    if nics.is_empty() {
        eprintln!("no NIC with a known node has an address; the NIC placement is not checked here");
    }
    for (ip, nic_node) in nics {
        let port = TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = std::net::SocketAddr::new(ip, port).to_string();
        let serve = Serve::start(volume.path(), &["--listen", &address]);
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        for _ in 0..2 * cpu_nodes {
            nbdcopy(source.to_str().unwrap(), &format!("nbd://{host}:{port}"));
        }
        for channel in serve.stop() {
            let node = check_channel(&topology, &channel);
            let connections = channel["connections"].as_u64().unwrap();
            if node == nic_node {
                assert!(
                    connections > 0,
                    "NIC on node {nic_node}: its channel got nothing: {channel}"
                );
            } else {
                assert_eq!(
                    connections, 0,
                    "{ip} is on node {nic_node}'s NIC: {channel}"
                );
            }
        }
        eprintln!("{ip} (NIC on node {nic_node}): every connection on node {nic_node}'s channel");
    }
}
