//! Helpers for the volume's boundary tests.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use pmem::{Region, Tracer};
use topology::Topology;
use volume::DeviceSource;

/// The one-node fixture topology from the topology crate.
pub fn one_node() -> Topology {
    fixture("one-node")
}

/// A topology from the topology crate's committed fixtures.
pub fn fixture(name: &str) -> Topology {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../topology/tests/fixtures")
        .join(name);
    Topology::read_from(root).unwrap()
}

/// Traced regions of `sizes`, as device sources on `nodes`.
pub fn traced_devices(tracer: &Tracer, sizes: &[u64], nodes: &[Option<u32>]) -> Vec<DeviceSource> {
    sizes
        .iter()
        .zip(nodes)
        .enumerate()
        .map(|(i, (&size, &node))| DeviceSource {
            label: format!("dev{i}"),
            kind: None,
            region: tracer.region(size),
            node,
        })
        .collect()
}

/// Device sources over existing regions.
pub fn sources(regions: Vec<Region>, nodes: &[Option<u32>]) -> Vec<DeviceSource> {
    regions
        .into_iter()
        .zip(nodes)
        .enumerate()
        .map(|(i, (region, &node))| DeviceSource {
            label: format!("dev{i}"),
            kind: None,
            region,
            node,
        })
        .collect()
}

/// Options without the periodic thread, so tests control every transition.
pub fn quiet_options() -> volume::OpenOptions {
    volume::OpenOptions {
        check_interval: None,
        ..volume::OpenOptions::default()
    }
}
