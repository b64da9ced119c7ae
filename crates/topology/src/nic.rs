//! Network interfaces and the NUMA node each is attached to.
//!
//! `class/net/IF/device` exists only for interfaces backed by hardware. The `numa_node`
//! attribute sits on the bus device (the PCI function), which is the `device` itself for a
//! plain PCI NIC but its parent for virtio-net (`device` is the virtio device). So the lookup
//! walks from `device` up the device tree to the first `numa_node`, staying inside
//! `devices/`. A value of -1 means the platform gave no affinity.

use std::path::Path;

use serde::Serialize;

use crate::NodeId;
use crate::error::{Result, TopologyError};
use crate::sysfs::{Sysfs, parse_numa_node};

/// Bound on how far up the device tree the `numa_node` lookup climbs (PCI bridges nest, but
/// not this deep).
const MAX_DEVICE_DEPTH: usize = 16;

/// One network interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nic {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// The node the NIC's device is attached to; `None` for virtual interfaces and devices
    /// without a known affinity.
    pub node: Option<NodeId>,
    /// True for interfaces with no device behind them (`lo`, bridges, tunnels).
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
}

/// Lists every network interface in natural name order.
pub(crate) fn read_nics(sysfs: &Sysfs) -> Result<Vec<Nic>> {
    let mut nics = Vec::new();
    for name in sysfs.list_optional("class/net")? {
        let device = sysfs.path(format!("class/net/{name}/device"));
        if !device.exists() {
            nics.push(Nic {
                name,
                node: None,
                is_virtual: true,
            });
            continue;
        }
        let node = device_numa_node(sysfs, &device)?;
        nics.push(Nic {
            name,
            node,
            is_virtual: false,
        });
    }
    Ok(nics)
}

fn device_numa_node(sysfs: &Sysfs, device: &Path) -> Result<Option<NodeId>> {
    let read_err = |source| TopologyError::Read {
        path: device.to_path_buf(),
        source,
    };
    let device = std::fs::canonicalize(device).map_err(read_err)?;
    let devices_root = std::fs::canonicalize(sysfs.path("devices")).ok();
    for dir in device.ancestors().take(MAX_DEVICE_DEPTH) {
        if let Some(root) = &devices_root
            && (!dir.starts_with(root) || dir == root)
        {
            break;
        }
        let attribute = dir.join("numa_node");
        match std::fs::read_to_string(&attribute) {
            Ok(text) => {
                return parse_numa_node(&text)
                    .map_err(|problem| TopologyError::malformed(attribute, problem));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(TopologyError::Read {
                    path: attribute,
                    source,
                });
            }
        }
    }
    Ok(None)
}
