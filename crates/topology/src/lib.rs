//! The machine as locus sees it: NUMA nodes, their CPUs, memory and distances, HMAT
//! latencies, persistent-memory devices, NICs, and the order in which each node should use
//! the others' memory.
//!
//! Everything is read from the kernel's own interfaces under a sysfs root that callers choose
//! (`/sys` on a live machine, a fixture tree in tests); no value is guessed or defaulted. A
//! file that is missing or malformed is an error naming that file. The latency probe
//! ([`probe`]) measures the real machine and needs the kernel's NUMA system calls; those live
//! in the private `sys` module, the crate's only `unsafe` code.
//!
//! Invariants of a [`Topology`]:
//! - `nodes` is in ascending id order and every node's `distances` has one entry per node,
//!   in that order, with the local distance (10) on the diagonal;
//! - every CPU belongs to exactly one node;
//! - `pmem` and `nics` are in natural name order, so output never depends on readdir order.

mod cache;
pub mod cpulist;
mod error;
mod hmat;
mod nic;
mod node;
mod order;
mod pmem;
mod probe;
mod sys;
mod sysfs;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

pub use error::{Result, TopologyError};
pub use hmat::HmatAccess;
pub use nic::Nic;
pub use node::{LOCAL_DISTANCE, Node};
pub use order::{Candidate, CandidateOrder, LatencySource};
pub use pmem::{PmemDevice, PmemKind};
pub use probe::{ProbeConfig, ProbeReport, ProbeSample, probe};
pub use sys::{
    HUGE_PAGE, bind_range, boost_current_thread, current_affinity, current_cpu,
    current_thread_nice, map_on_huge_boundary, page_nodes, page_size, pin_current_thread,
    set_current_thread_nice, thread_cpu_time, with_signals_blocked,
};
pub use sysfs::Sysfs;

/// A NUMA node id, as the kernel numbers nodes.
pub type NodeId = u32;
/// A CPU id, as the kernel numbers CPUs.
pub type CpuId = u32;

/// The default sysfs root of a live machine.
pub const LIVE_SYSFS: &str = "/sys";

/// Everything locus knows about the machine's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Online NUMA nodes in ascending id order.
    pub nodes: Vec<Node>,
    /// Persistent-memory devices (fs-dax block devices, then device-DAX).
    pub pmem: Vec<PmemDevice>,
    /// Network interfaces.
    pub nics: Vec<Nic>,
    /// Largest data or unified CPU cache, in bytes, if the kernel reports caches.
    pub last_level_cache_bytes: Option<u64>,
}

impl Topology {
    /// Reads the topology from the sysfs tree at `root`.
    pub fn read_from(root: impl AsRef<Path>) -> Result<Self> {
        Self::read(&Sysfs::new(root.as_ref()))
    }

    /// Reads the live machine's topology from `/sys`.
    pub fn read_live() -> Result<Self> {
        Self::read_from(LIVE_SYSFS)
    }

    /// Reads the topology from `sysfs`.
    pub fn read(sysfs: &Sysfs) -> Result<Self> {
        let nodes = node::read_nodes(sysfs)?;
        let pmem = pmem::read_pmem(sysfs)?;
        let nics = nic::read_nics(sysfs)?;
        let node_cpus: Vec<&[CpuId]> = nodes.iter().map(|n| n.cpus.as_slice()).collect();
        let last_level_cache_bytes = cache::largest_cache_bytes(sysfs, &node_cpus)?;
        Ok(Self {
            nodes,
            pmem,
            nics,
            last_level_cache_bytes,
        })
    }

    /// The node with id `id`, if online.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The node a CPU belongs to.
    pub fn node_of_cpu(&self, cpu: CpuId) -> Option<NodeId> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// Every CPU and its node.
    pub fn cpu_to_node(&self) -> BTreeMap<CpuId, NodeId> {
        self.nodes
            .iter()
            .flat_map(|n| n.cpus.iter().map(move |&c| (c, n.id)))
            .collect()
    }

    /// SLIT distance from one node to another.
    pub fn distance(&self, from: NodeId, to: NodeId) -> Option<u32> {
        let to_index = self.nodes.iter().position(|n| n.id == to)?;
        self.node(from).map(|n| n.distances[to_index])
    }

    /// Total CPUs on all nodes.
    pub fn cpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.cpus.len()).sum()
    }
}
