//! Candidate order: for a requesting node, every memory node from nearest to farthest.
//!
//! The volume monitor (MBS-LVM's Algorithm 1) walks this list to pick the device for a write.
//! The order comes from the best source that covers the whole row, so one row never compares
//! nanoseconds with SLIT units:
//!
//! 1. **probe** — measured ns per load from the requester's CPUs, when every candidate was
//!    measured from this requester;
//! 2. **hmat** — firmware latencies. HMAT gives each memory node's latency only from its best
//!    initiators; from any other requester the latency is estimated by scaling with SLIT:
//!    `L(Y) × slit(X,Y) / min over best initiators I of slit(I,Y)`. Used when every candidate
//!    has an HMAT read latency;
//! 3. **slit** — the distance matrix, always present.
//!
//! Ties break by SLIT distance, then node id, so the order is deterministic.

use serde::Serialize;

use crate::error::{Result, TopologyError};
use crate::probe::ProbeReport;
use crate::{NodeId, Topology};

/// Where a candidate order's latencies came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencySource {
    /// Measured by the latency probe.
    Probe,
    /// From the firmware's HMAT table (scaled by SLIT for non-best initiators).
    Hmat,
    /// From the firmware's SLIT distance matrix.
    Slit,
}

impl std::fmt::Display for LatencySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Probe => "probe",
            Self::Hmat => "hmat",
            Self::Slit => "slit",
        })
    }
}

/// One memory node in a candidate order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The memory node.
    pub node: NodeId,
    /// Latency in ns from the requester by the row's source (`None` when the source is SLIT).
    pub latency_ns: Option<f64>,
    /// SLIT distance from the requester.
    pub distance: u32,
}

/// The memory nodes ordered for one requesting node, nearest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateOrder {
    /// The node whose CPUs are asking.
    pub requester: NodeId,
    /// Where this row's order came from.
    pub source: LatencySource,
    /// Every memory node, nearest first.
    pub candidates: Vec<Candidate>,
}

impl CandidateOrder {
    /// The node ids in order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.candidates.iter().map(|c| c.node).collect()
    }
}

impl Topology {
    /// Nodes that can hold data: they have memory, or a persistent-memory device sits on them.
    pub fn memory_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.memory_bytes > 0 || self.pmem.iter().any(|p| p.node == Some(n.id)))
            .map(|n| n.id)
            .collect()
    }

    /// The candidate order for `requester`, using `probe` when it covers the whole row.
    pub fn candidate_order(
        &self,
        requester: NodeId,
        probe: Option<&ProbeReport>,
    ) -> Result<CandidateOrder> {
        let requester_index = self.node_index(requester)?;
        let targets = self.memory_nodes();
        let distance = |target: NodeId| -> u32 {
            let target_index = self
                .node_index(target)
                .expect("memory nodes are online nodes");
            self.nodes[requester_index].distances[target_index]
        };

        let measured: Option<Vec<f64>> = probe.and_then(|p| {
            targets
                .iter()
                .map(|&t| p.latency_ns(requester, t))
                .collect()
        });
        let hmat: Option<Vec<f64>> = targets
            .iter()
            .map(|&t| self.hmat_estimate_ns(requester, t))
            .collect();
        let (source, latencies) = match (measured, hmat) {
            (Some(ns), _) => (LatencySource::Probe, Some(ns)),
            (None, Some(ns)) => (LatencySource::Hmat, Some(ns)),
            (None, None) => (LatencySource::Slit, None),
        };

        let mut candidates: Vec<Candidate> = targets
            .iter()
            .enumerate()
            .map(|(i, &node)| Candidate {
                node,
                latency_ns: latencies.as_ref().map(|l| l[i]),
                distance: distance(node),
            })
            .collect();
        candidates.sort_by(|a, b| {
            let by_latency = match (a.latency_ns, b.latency_ns) {
                (Some(x), Some(y)) => x.total_cmp(&y),
                _ => std::cmp::Ordering::Equal,
            };
            by_latency
                .then(a.distance.cmp(&b.distance))
                .then(a.node.cmp(&b.node))
        });
        Ok(CandidateOrder {
            requester,
            source,
            candidates,
        })
    }

    /// Candidate orders for every node that has CPUs (the only nodes that issue writes).
    pub fn candidate_orders(&self, probe: Option<&ProbeReport>) -> Result<Vec<CandidateOrder>> {
        self.nodes
            .iter()
            .filter(|n| !n.cpu_less)
            .map(|n| self.candidate_order(n.id, probe))
            .collect()
    }

    /// HMAT read latency of `target` as seen from `requester`, estimated with SLIT when the
    /// requester is not one of the target's best initiators.
    fn hmat_estimate_ns(&self, requester: NodeId, target: NodeId) -> Option<f64> {
        let target_node = self.node(target)?;
        let access = target_node.hmat.as_ref()?;
        let latency = access.read_latency_ns? as f64;
        if access.initiators.contains(&requester) {
            return Some(latency);
        }
        let target_index = self.node_index(target).ok()?;
        let best_initiator_distance = access
            .initiators
            .iter()
            .filter_map(|&i| self.node(i).map(|n| n.distances[target_index]))
            .min()?;
        let requester_distance = self.node(requester)?.distances[target_index];
        Some(latency * f64::from(requester_distance) / f64::from(best_initiator_distance))
    }

    fn node_index(&self, id: NodeId) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or(TopologyError::UnknownNode { node: id })
    }
}
