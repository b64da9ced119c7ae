//! The testbed's machines: small descriptions from which both the qemu command line and the
//! expected `locus topology --json` are derived.
//!
//! A description states what the guest kernel must report — including facts that qemu
//! decides and locus must discover rather than assume, such as which `/dev/pmemN` ended up
//! on which node. qemu numbers NVDIMM regions by iterating its QOM children, a hash table, so
//! the numbering follows the devices' ids, not their order on the command line; the ids here
//! were chosen so that in `four-node` no `/dev/pmemN` sits on node N (checked by a unit test).

/// How an NVDIMM is presented to locus after the guest's set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmemMode {
    /// Converted to an fs-dax namespace: `/dev/pmemN` with DAX support.
    Fsdax,
    /// Converted to device-DAX: `/dev/daxN.0`.
    Devdax,
}

impl PmemMode {
    pub fn json_kind(self) -> &'static str {
        match self {
            Self::Fsdax => "fsdax",
            Self::Devdax => "devdax",
        }
    }
}

#[derive(Debug, Clone)]
pub struct VmNode {
    /// CPUs on the node; 0 makes a CPU-less memory node.
    pub cpus: u32,
    pub memory_mib: u32,
    /// For a CPU-less node: the CPU node its memory hangs off (qemu's `initiator=`).
    pub initiator: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Nvdimm {
    pub node: u32,
    pub size_mib: u32,
    pub mode: PmemMode,
    /// The device node the guest kernel gives it (see the module comment).
    pub expected_path: &'static str,
}

/// One HMAT entry: latency and bandwidth from a CPU node to a memory node.
#[derive(Debug, Clone, Copy)]
pub struct HmatEntry {
    pub initiator: u32,
    pub target: u32,
    pub latency_ns: u32,
    pub bandwidth_mb_s: u32,
}

#[derive(Debug, Clone)]
pub struct VmTopology {
    pub name: &'static str,
    pub about: &'static str,
    pub nodes: Vec<VmNode>,
    /// SLIT, full matrix by node id (symmetric).
    pub distances: Vec<Vec<u32>>,
    /// Empty when the machine has no HMAT table.
    pub hmat: Vec<HmatEntry>,
    pub nvdimms: Vec<Nvdimm>,
    /// The node of the PCI expander bridge that holds the virtio-net NIC.
    pub nic_node: u32,
    /// The memory order locus must derive for each CPU node, nearest first, and its source.
    pub expected_orders: Vec<(u32, &'static str, Vec<u32>)>,
}

pub fn all() -> Vec<VmTopology> {
    vec![two_socket(), four_node(), cxl()]
}

pub fn by_name(name: &str) -> Option<VmTopology> {
    all().into_iter().find(|t| t.name == name)
}

fn cpu_node(cpus: u32, memory_mib: u32) -> VmNode {
    VmNode {
        cpus,
        memory_mib,
        initiator: None,
    }
}

fn two_socket() -> VmTopology {
    VmTopology {
        name: "two-socket",
        about: "2 nodes x 2 CPUs, SLIT 10/21, an fs-dax NVDIMM on node 0, a device-DAX one on \
                node 1, NIC on node 1",
        nodes: vec![cpu_node(2, 384), cpu_node(2, 384)],
        distances: vec![vec![10, 21], vec![21, 10]],
        hmat: vec![],
        nvdimms: vec![
            Nvdimm {
                node: 0,
                size_mib: 256,
                mode: PmemMode::Fsdax,
                expected_path: "/dev/pmem1",
            },
            Nvdimm {
                node: 1,
                size_mib: 256,
                mode: PmemMode::Devdax,
                expected_path: "/dev/dax0.0",
            },
        ],
        nic_node: 1,
        expected_orders: vec![(0, "slit", vec![0, 1]), (1, "slit", vec![1, 0])],
    }
}

fn four_node() -> VmTopology {
    let nvdimm = |node, expected_path| Nvdimm {
        node,
        size_mib: 128,
        mode: PmemMode::Fsdax,
        expected_path,
    };
    VmTopology {
        name: "four-node",
        about: "4 nodes x 1 CPU in two pairs (SLIT 10/21/31), an fs-dax NVDIMM per node \
                numbered out of node order, NIC on node 3",
        nodes: (0..4).map(|_| cpu_node(1, 256)).collect(),
        distances: vec![
            vec![10, 21, 31, 31],
            vec![21, 10, 31, 31],
            vec![31, 31, 10, 21],
            vec![31, 31, 21, 10],
        ],
        hmat: vec![],
        nvdimms: vec![
            nvdimm(0, "/dev/pmem2"),
            nvdimm(1, "/dev/pmem0"),
            nvdimm(2, "/dev/pmem3"),
            nvdimm(3, "/dev/pmem1"),
        ],
        nic_node: 3,
        expected_orders: vec![
            (0, "slit", vec![0, 1, 2, 3]),
            (1, "slit", vec![1, 0, 2, 3]),
            (2, "slit", vec![2, 3, 0, 1]),
            (3, "slit", vec![3, 2, 0, 1]),
        ],
    }
}

fn cxl() -> VmTopology {
    let entry = |initiator, target, latency_ns, bandwidth_mb_s| HmatEntry {
        initiator,
        target,
        latency_ns,
        bandwidth_mb_s,
    };
    VmTopology {
        name: "cxl",
        about: "2 CPU nodes + a CPU-less memory node behind node 0, HMAT latencies, an fs-dax \
                NVDIMM on node 1 only, NIC on node 0",
        nodes: vec![
            cpu_node(2, 256),
            cpu_node(2, 256),
            VmNode {
                cpus: 0,
                memory_mib: 256,
                initiator: Some(0),
            },
        ],
        distances: vec![vec![10, 21, 17], vec![21, 10, 28], vec![17, 28, 10]],
        hmat: vec![
            entry(0, 0, 80, 20_000),
            entry(0, 1, 130, 10_000),
            entry(0, 2, 170, 8_000),
            entry(1, 0, 130, 10_000),
            entry(1, 1, 80, 20_000),
            entry(1, 2, 250, 5_000),
        ],
        nvdimms: vec![Nvdimm {
            node: 1,
            size_mib: 256,
            mode: PmemMode::Fsdax,
            expected_path: "/dev/pmem0",
        }],
        nic_node: 0,
        // SLIT alone would put the CXL node second for node 0 (17 < 21); HMAT says 170 ns
        // against 80 x 21 / 10 = 168 ns for node 1, so it comes last.
        expected_orders: vec![(0, "hmat", vec![0, 1, 2]), (1, "hmat", vec![1, 0, 2])],
    }
}

impl VmTopology {
    pub fn cpu_count(&self) -> u32 {
        self.nodes.iter().map(|n| n.cpus).sum()
    }

    /// CPU ids of `node`: consecutive, in node order.
    pub fn cpus_of(&self, node: u32) -> Vec<u32> {
        let first: u32 = self.nodes[..node as usize].iter().map(|n| n.cpus).sum();
        (first..first + self.nodes[node as usize].cpus).collect()
    }

    /// qemu's id for NVDIMM `index`; see the module comment for why ids matter.
    pub fn nvdimm_id(index: usize) -> String {
        format!("dimmx{index}")
    }

    /// The machine part of the qemu command line (no kernel, initrd or console options).
    pub fn qemu_args(&self, nvdimm_files: &[std::path::PathBuf]) -> Vec<String> {
        let mut args = Vec::new();
        let mut push = |parts: &[&str]| args.extend(parts.iter().map(|s| (*s).to_owned()));
        let mut machine = "pc,nvdimm=on".to_owned();
        if !self.hmat.is_empty() {
            machine.push_str(",hmat=on");
        }
        let dram_mib: u32 = self.nodes.iter().map(|n| n.memory_mib).sum();
        let nvdimm_mib: u32 = self.nvdimms.iter().map(|d| d.size_mib).sum();
        push(&["-machine", &machine]);
        push(&["-smp", &self.cpu_count().to_string()]);
        let memory = format!(
            "{dram_mib}M,slots={},maxmem={}M",
            self.nvdimms.len().max(1),
            dram_mib + nvdimm_mib.max(128)
        );
        push(&["-m", &memory]);

        for (id, node) in self.nodes.iter().enumerate() {
            push(&[
                "-object",
                &format!("memory-backend-ram,id=ram{id},size={}M", node.memory_mib),
            ]);
            let mut spec = format!("node,nodeid={id},memdev=ram{id}");
            if node.cpus > 0 {
                let cpus = self.cpus_of(id as u32);
                spec.push_str(&format!(",cpus={}-{}", cpus[0], cpus[cpus.len() - 1]));
            }
            if let Some(initiator) = node.initiator {
                spec.push_str(&format!(",initiator={initiator}"));
            }
            push(&["-numa", &spec]);
        }
        for (src, row) in self.distances.iter().enumerate() {
            for (dst, distance) in row.iter().enumerate() {
                if src != dst {
                    push(&["-numa", &format!("dist,src={src},dst={dst},val={distance}")]);
                }
            }
        }
        for entry in &self.hmat {
            let base = format!(
                "hmat-lb,initiator={},target={},hierarchy=memory",
                entry.initiator, entry.target
            );
            push(&[
                "-numa",
                &format!(
                    "{base},data-type=access-latency,latency={}",
                    entry.latency_ns
                ),
            ]);
            push(&[
                "-numa",
                &format!(
                    "{base},data-type=access-bandwidth,bandwidth={}M",
                    entry.bandwidth_mb_s
                ),
            ]);
        }
        for (index, (nvdimm, file)) in self.nvdimms.iter().zip(nvdimm_files).enumerate() {
            push(&[
                "-object",
                &format!(
                    "memory-backend-file,id=nvmem{index},share=on,mem-path={},size={}M",
                    file.display(),
                    nvdimm.size_mib
                ),
            ]);
            push(&[
                "-device",
                &format!(
                    "nvdimm,id={},memdev=nvmem{index},node={}",
                    Self::nvdimm_id(index),
                    nvdimm.node
                ),
            ]);
        }
        push(&[
            "-device",
            &format!(
                "pxb,id=pxb0,bus_nr=16,numa_node={},bus=pci.0",
                self.nic_node
            ),
        ]);
        push(&["-netdev", "user,id=net0,restrict=on"]);
        push(&["-device", "virtio-net-pci,netdev=net0,bus=pxb0,romfile="]);
        args
    }

    /// The guest's NVDIMM set-up: the mode for the NVDIMM on each node.
    pub fn mode_of_node(&self, node: u32) -> Option<PmemMode> {
        self.nvdimms.iter().find(|d| d.node == node).map(|d| d.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_consistent() {
        for topology in all() {
            let n = topology.nodes.len();
            assert_eq!(topology.distances.len(), n, "{}", topology.name);
            for (i, row) in topology.distances.iter().enumerate() {
                assert_eq!(row.len(), n, "{}", topology.name);
                assert_eq!(row[i], 10, "{}", topology.name);
                for (j, &d) in row.iter().enumerate() {
                    assert_eq!(
                        d, topology.distances[j][i],
                        "{} is asymmetric",
                        topology.name
                    );
                }
            }
            // The guest set-up picks a mode per node, so one NVDIMM per node at most.
            let mut nodes: Vec<u32> = topology.nvdimms.iter().map(|d| d.node).collect();
            nodes.dedup();
            assert_eq!(nodes.len(), topology.nvdimms.len(), "{}", topology.name);
            for node in &topology.nodes {
                assert_eq!(
                    node.cpus == 0,
                    node.initiator.is_some(),
                    "{}",
                    topology.name
                );
            }
        }
    }

    #[test]
    fn four_node_numbers_no_pmem_after_its_node() {
        let topology = by_name("four-node").unwrap();
        for nvdimm in &topology.nvdimms {
            assert_ne!(nvdimm.expected_path, format!("/dev/pmem{}", nvdimm.node));
        }
    }

    #[test]
    fn cpus_are_numbered_by_node() {
        let topology = by_name("cxl").unwrap();
        assert_eq!(topology.cpus_of(0), vec![0, 1]);
        assert_eq!(topology.cpus_of(1), vec![2, 3]);
        assert_eq!(topology.cpus_of(2), Vec::<u32>::new());
    }
}
