//! HMAT performance attributes that the kernel exports per memory node.
//!
//! For a memory (target) node Y, `nodeY/access0/initiators/` links the initiator nodes with
//! the best access to Y and gives that best access's read/write latency (ns) and bandwidth
//! (MB/s). Access from any other initiator is only known to be no better. The kernel writes
//! these only when firmware provides an HMAT table; a missing directory means "no HMAT".

use serde::Serialize;

use crate::NodeId;
use crate::error::{Result, TopologyError};
use crate::node::NODE_DIR;
use crate::sysfs::{Sysfs, numbered};

/// HMAT `access0` attributes of one memory node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HmatAccess {
    /// Initiator nodes that have this best access (linked as `nodeX` in the directory).
    pub initiators: Vec<NodeId>,
    /// Read latency in nanoseconds, if the firmware gave one.
    pub read_latency_ns: Option<u64>,
    /// Write latency in nanoseconds, if the firmware gave one.
    pub write_latency_ns: Option<u64>,
    /// Read bandwidth in MB/s, if the firmware gave one.
    pub read_bandwidth_mb_s: Option<u64>,
    /// Write bandwidth in MB/s, if the firmware gave one.
    pub write_bandwidth_mb_s: Option<u64>,
}

/// Reads `nodeN/access0/initiators/`, or `None` when the kernel exports no HMAT data.
pub(crate) fn read_access0(sysfs: &Sysfs, node: NodeId) -> Result<Option<HmatAccess>> {
    let dir = format!("{NODE_DIR}/node{node}/access0/initiators");
    if !sysfs.exists(&dir) {
        return Ok(None);
    }
    let mut initiators = Vec::new();
    for name in sysfs.list(&dir)? {
        if let Some(id) = numbered(&name, "node") {
            initiators.push(id);
        }
    }
    initiators.sort_unstable();

    // The kernel writes 0 for an attribute the firmware left out; report that as unknown.
    let value = |file: &str| -> Result<Option<u64>> {
        Ok(sysfs
            .read_u64_optional(format!("{dir}/{file}"))?
            .filter(|&v| v != 0))
    };
    let access = HmatAccess {
        initiators,
        read_latency_ns: value("read_latency")?,
        write_latency_ns: value("write_latency")?,
        read_bandwidth_mb_s: value("read_bandwidth")?,
        write_bandwidth_mb_s: value("write_bandwidth")?,
    };
    if access.initiators.is_empty() && access.read_latency_ns.is_some() {
        return Err(TopologyError::malformed(
            sysfs.path(&dir),
            "gives a latency but links no initiator node",
        ));
    }
    Ok(Some(access))
}
