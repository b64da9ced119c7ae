//! NUMA nodes: which are online, their CPUs, memory and SLIT distance rows.

use serde::Serialize;

use crate::error::{Result, TopologyError};
use crate::hmat::{self, HmatAccess};
use crate::sysfs::Sysfs;
use crate::{CpuId, NodeId, cpulist};

/// Where the kernel keeps its node directories, relative to the sysfs root.
pub(crate) const NODE_DIR: &str = "devices/system/node";

/// The SLIT distance of a node to itself (ACPI defines it; Linux rejects any other value).
pub const LOCAL_DISTANCE: u32 = 10;

/// The largest SLIT value; 255 means "unreachable" in ACPI.
pub const MAX_DISTANCE: u32 = 255;

/// One online NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    /// The kernel's node id.
    pub id: NodeId,
    /// CPUs on this node, ascending.
    pub cpus: Vec<CpuId>,
    /// `MemTotal` of the node, in bytes.
    pub memory_bytes: u64,
    /// `MemFree` of the node at the time of reading, in bytes.
    pub memory_free_bytes: u64,
    /// Memory of the node the kernel can take back on demand at the time of reading, in
    /// bytes: page cache other than shared memory (`FilePages` − `Shmem`) and reclaimable
    /// slab (`SReclaimable`); 0 where the kernel does not say. On a machine that has been
    /// reading files, most of what is not free is this.
    pub memory_reclaimable_bytes: u64,
    /// SLIT distances to every node of the topology, in the order of `Topology::nodes`.
    pub distances: Vec<u32>,
    /// True for a node with memory and no CPUs (CXL memory expanders, some HBM and
    /// persistent-memory nodes).
    pub cpu_less: bool,
    /// The HMAT read latency of this node as memory, from its best initiators, if known.
    pub hmat_read_latency_ns: Option<u64>,
    /// The HMAT `access0` attributes of this node as memory, when the firmware has HMAT.
    pub hmat: Option<HmatAccess>,
}

/// Reads every online node. The returned nodes are in ascending id order, and each node's
/// `distances` has one entry per returned node, in the same order.
pub(crate) fn read_nodes(sysfs: &Sysfs) -> Result<Vec<Node>> {
    let online_rel = format!("{NODE_DIR}/online");
    let online_text = sysfs.read(&online_rel)?;
    let ids = cpulist::parse(&online_text)
        .map_err(|problem| TopologyError::malformed(sysfs.path(&online_rel), problem))?;
    if ids.is_empty() {
        return Err(TopologyError::malformed(
            sysfs.path(&online_rel),
            "no node is online",
        ));
    }

    let mut nodes = Vec::with_capacity(ids.len());
    for &id in &ids {
        nodes.push(read_node(sysfs, id, ids.len())?);
    }
    check_cpus_disjoint(sysfs, &nodes)?;
    Ok(nodes)
}

fn read_node(sysfs: &Sysfs, id: NodeId, node_count: usize) -> Result<Node> {
    let dir = format!("{NODE_DIR}/node{id}");

    let cpulist_rel = format!("{dir}/cpulist");
    let cpus = cpulist::parse(&sysfs.read(&cpulist_rel)?)
        .map_err(|problem| TopologyError::malformed(sysfs.path(&cpulist_rel), problem))?;

    let meminfo_rel = format!("{dir}/meminfo");
    let meminfo = parse_meminfo(&sysfs.read(&meminfo_rel)?, id)
        .map_err(|problem| TopologyError::malformed(sysfs.path(&meminfo_rel), problem))?;

    let distance_rel = format!("{dir}/distance");
    let distances = parse_distances(&sysfs.read(&distance_rel)?, node_count)
        .map_err(|problem| TopologyError::malformed(sysfs.path(&distance_rel), problem))?;

    let hmat = hmat::read_access0(sysfs, id)?;
    Ok(Node {
        id,
        cpu_less: cpus.is_empty(),
        cpus,
        memory_bytes: meminfo.total,
        memory_free_bytes: meminfo.free,
        memory_reclaimable_bytes: meminfo.reclaimable(),
        distances,
        hmat_read_latency_ns: hmat.as_ref().and_then(|h| h.read_latency_ns),
        hmat,
    })
}

/// What a node's `meminfo` says, in bytes.
#[derive(Debug, Default, PartialEq, Eq)]
struct Meminfo {
    total: u64,
    free: u64,
    file_pages: u64,
    shmem: u64,
    slab_reclaimable: u64,
}

impl Meminfo {
    /// Page cache that is not shared memory, and reclaimable slab.
    fn reclaimable(&self) -> u64 {
        self.file_pages.saturating_sub(self.shmem) + self.slab_reclaimable
    }
}

/// Parses `nodeN/meminfo`. Every line must name node `id`; `MemTotal` and `MemFree` must be
/// there, the page-cache lines may not be (0 then).
fn parse_meminfo(text: &str, id: NodeId) -> Result<Meminfo, String> {
    let mut total = None;
    let mut free = None;
    let (mut file_pages, mut shmem, mut slab_reclaimable) = (None, None, None);
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_no = index + 1;
        let rest = line
            .strip_prefix("Node ")
            .ok_or_else(|| format!("line {line_no} does not start with `Node `"))?;
        let (node_text, rest) = rest
            .split_once(' ')
            .ok_or_else(|| format!("line {line_no} has no field after the node id"))?;
        if node_text.parse::<NodeId>().ok() != Some(id) {
            return Err(format!(
                "line {line_no} is about node `{node_text}`, not node {id}"
            ));
        }
        let (key, value) = rest
            .split_once(':')
            .ok_or_else(|| format!("line {line_no} has no `:` after its field name"))?;
        let target = match key.trim() {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            "FilePages" => &mut file_pages,
            "Shmem" => &mut shmem,
            "SReclaimable" => &mut slab_reclaimable,
            _ => continue,
        };
        let mut words = value.split_whitespace();
        let number: u64 = words
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("line {line_no}: {} has no number", key.trim()))?;
        let bytes = match words.next() {
            Some("kB") => number.checked_mul(1024),
            None => Some(number),
            Some(unit) => return Err(format!("line {line_no}: unknown unit `{unit}`")),
        }
        .ok_or_else(|| format!("line {line_no}: {} overflows", key.trim()))?;
        *target = Some(bytes);
    }
    let total = total.ok_or("no MemTotal line")?;
    let free = free.ok_or("no MemFree line")?;
    if free > total {
        return Err(format!(
            "MemFree ({free} bytes) exceeds MemTotal ({total} bytes)"
        ));
    }
    Ok(Meminfo {
        total,
        free,
        file_pages: file_pages.unwrap_or(0),
        shmem: shmem.unwrap_or(0),
        slab_reclaimable: slab_reclaimable.unwrap_or(0),
    })
}

/// Parses one SLIT row; it must have exactly one entry per online node.
fn parse_distances(text: &str, node_count: usize) -> Result<Vec<u32>, String> {
    let mut row = Vec::with_capacity(node_count);
    for word in text.split_whitespace() {
        let distance: u32 = word
            .parse()
            .map_err(|_| format!("distance `{word}` is not a number"))?;
        if !(LOCAL_DISTANCE..=MAX_DISTANCE).contains(&distance) {
            return Err(format!(
                "distance {distance} is outside the SLIT range {LOCAL_DISTANCE}..={MAX_DISTANCE}"
            ));
        }
        row.push(distance);
    }
    if row.len() != node_count {
        return Err(format!(
            "has {} distances but {node_count} nodes are online (ragged distance matrix)",
            row.len()
        ));
    }
    Ok(row)
}

/// Checks the matrix as a whole: self-distances are local and no CPU is on two nodes.
fn check_cpus_disjoint(sysfs: &Sysfs, nodes: &[Node]) -> Result<()> {
    let mut owner = std::collections::BTreeMap::new();
    for (index, node) in nodes.iter().enumerate() {
        let self_distance = node.distances[index];
        if self_distance != LOCAL_DISTANCE {
            return Err(TopologyError::malformed(
                sysfs.path(format!("{NODE_DIR}/node{}/distance", node.id)),
                format!(
                    "distance of node {} to itself is {self_distance}, expected {LOCAL_DISTANCE}",
                    node.id
                ),
            ));
        }
        for &cpu in &node.cpus {
            if let Some(other) = owner.insert(cpu, node.id) {
                return Err(TopologyError::malformed(
                    sysfs.path(format!("{NODE_DIR}/node{}/cpulist", node.id)),
                    format!("CPU {cpu} is also listed by node {other}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "Node 1 MemTotal:        3762392 kB\n\
                           Node 1 MemFree:         3275188 kB\n\
                           Node 1 MemUsed:          487204 kB\n";

    #[test]
    fn meminfo_in_bytes() {
        let parsed = parse_meminfo(MEMINFO, 1).unwrap();
        assert_eq!(
            (parsed.total, parsed.free, parsed.reclaimable()),
            (3_762_392 * 1024, 3_275_188 * 1024, 0)
        );
    }

    #[test]
    fn page_cache_that_is_not_shared_memory_and_reclaimable_slab_count_as_reclaimable() {
        let text = "Node 0 MemTotal:       24000000 kB\n\
                    Node 0 MemFree:         4188144 kB\n\
                    Node 0 FilePages:      17000000 kB\n\
                    Node 0 Shmem:           1100000 kB\n\
                    Node 0 KReclaimable:     300000 kB\n\
                    Node 0 SReclaimable:     250000 kB\n";
        let parsed = parse_meminfo(text, 0).unwrap();
        assert_eq!(parsed.free, 4_188_144 * 1024);
        assert_eq!(
            parsed.reclaimable(),
            (17_000_000 - 1_100_000 + 250_000) * 1024
        );
    }

    #[test]
    fn meminfo_of_another_node_is_rejected() {
        assert!(
            parse_meminfo(MEMINFO, 0)
                .unwrap_err()
                .contains("not node 0")
        );
    }

    #[test]
    fn meminfo_without_total_is_rejected() {
        let err = parse_meminfo("Node 0 MemFree: 1 kB\n", 0).unwrap_err();
        assert!(err.contains("no MemTotal"), "{err}");
    }

    #[test]
    fn distances_must_match_node_count() {
        assert_eq!(parse_distances("10 21\n", 2), Ok(vec![10, 21]));
        assert!(
            parse_distances("10 21 31\n", 2)
                .unwrap_err()
                .contains("ragged")
        );
        assert!(
            parse_distances("10 x\n", 2)
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse_distances("10 300\n", 2)
                .unwrap_err()
                .contains("SLIT range")
        );
    }
}
