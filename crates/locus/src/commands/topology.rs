//! `locus topology`: the machine's NUMA layout, memory devices, NICs and latency order.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use topology::{CandidateOrder, ProbeConfig, ProbeReport, Topology, cpulist};

use crate::output::{out, outln};
use crate::size::{format_bytes, parse_size};

/// Show the machine's NUMA layout, memory devices, NICs and memory order.
///
/// NUMA nodes, CPUs, memory, SLIT distances, HMAT latencies, persistent-memory devices, NICs
/// and, for each node, the order in which locus uses the nodes' memory. The order comes from the best latency source that covers a node's whole row: a measured
/// probe (with --probe), else the firmware's HMAT table, else the SLIT distance matrix.
#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// Print one JSON object instead of tables (schema in docs/topology-json.md).
    #[arg(long)]
    json: bool,

    /// Measure the load latency from every CPU node to every memory node by pointer chasing
    /// through a buffer larger than the last-level cache (takes seconds per node pair).
    #[arg(long)]
    probe: bool,

    /// Probe buffer per memory node, e.g. 256M [default: 2 x last-level cache, at least 64M,
    /// at most a quarter of the node's free memory].
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "probe")]
    probe_bytes: Option<u64>,

    /// Timed dependent loads per node pair.
    #[arg(long, value_name = "N", default_value_t = ProbeConfig::default().loads, requires = "probe")]
    probe_loads: u64,

    /// Seed of the probe's random pointer cycle.
    #[arg(long, value_name = "N", default_value_t = ProbeConfig::default().seed, requires = "probe")]
    probe_seed: u64,
}

/// The `--json` document: the topology plus what locus derives from it.
#[derive(Debug, Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    topology: &'a Topology,
    cpu_to_node: std::collections::BTreeMap<u32, u32>,
    candidate_orders: Vec<CandidateOrder>,
    probe: Option<ProbeReport>,
}

pub fn run(sysfs: &Path, args: &TopologyArgs) -> Result<()> {
    let topology = Topology::read_from(sysfs)
        .with_context(|| format!("reading the NUMA topology from {}", sysfs.display()))?;

    let probe = if args.probe {
        let config = ProbeConfig {
            buffer_bytes: args.probe_bytes,
            loads: args.probe_loads,
            seed: args.probe_seed,
        };
        let mut progress = |sample: &topology::ProbeSample| {
            if !args.json {
                eprintln!(
                    "probe: cpu {} (node {}) -> memory node {}: {:.1} ns",
                    sample.cpu, sample.cpu_node, sample.memory_node, sample.latency_ns
                );
            }
        };
        Some(topology::probe(&topology, &config, &mut progress).context("latency probe")?)
    } else {
        None
    };

    let candidate_orders = topology.candidate_orders(probe.as_ref())?;
    if args.json {
        let report = Report {
            topology: &topology,
            cpu_to_node: topology.cpu_to_node(),
            candidate_orders,
            probe,
        };
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!(
            "{}",
            render(&topology, sysfs, &candidate_orders, probe.as_ref())
        );
    }
    Ok(())
}

fn render(
    topology: &Topology,
    sysfs: &Path,
    orders: &[CandidateOrder],
    probe: Option<&ProbeReport>,
) -> String {
    let mut out = String::new();
    let nodes = &topology.nodes;
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let cache = topology
        .last_level_cache_bytes
        .map_or_else(|| "unknown".to_owned(), format_bytes);
    let _ = writeln!(
        out,
        "NUMA topology of {}: {}, {}, largest CPU cache {cache}\n",
        sysfs.display(),
        plural(nodes.len(), "node"),
        plural(topology.cpu_count(), "CPU"),
    );

    let rows: Vec<[String; 6]> = nodes
        .iter()
        .map(|n| {
            let kind = match (n.cpu_less, n.memory_bytes > 0) {
                (false, true) => "cpu+memory",
                (false, false) => "cpu only",
                (true, _) => "memory only (cpu-less)",
            };
            [
                n.id.to_string(),
                if n.cpus.is_empty() {
                    "-".to_owned()
                } else {
                    cpulist::format(&n.cpus)
                },
                format_bytes(n.memory_bytes),
                format_bytes(n.memory_free_bytes),
                kind.to_owned(),
                n.hmat_read_latency_ns
                    .map_or_else(|| "-".to_owned(), |ns| format!("{ns} ns")),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "NODE",
            "CPUS",
            "MEMORY",
            "FREE",
            "KIND",
            "HMAT READ LATENCY",
        ],
        &rows,
    );

    out.push_str("\nSLIT distances (from row node to column node)\n");
    let mut header = vec!["node".to_owned()];
    header.extend(nodes.iter().map(|n| n.id.to_string()));
    let matrix: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let mut row = vec![n.id.to_string()];
            row.extend(n.distances.iter().map(u32::to_string));
            row
        })
        .collect();
    right_aligned(&mut out, &header, &matrix);

    if let Some(probe) = probe {
        let _ = writeln!(
            out,
            "\nMeasured load latency, ns (rows: CPU node, columns: memory node; {} loads per pair)",
            probe.loads_per_pair
        );
        let memory_nodes: Vec<u32> = {
            let mut ids: Vec<u32> = probe.samples.iter().map(|s| s.memory_node).collect();
            ids.dedup();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let mut header = vec!["cpu\\mem".to_owned()];
        header.extend(memory_nodes.iter().map(u32::to_string));
        let matrix: Vec<Vec<String>> = nodes
            .iter()
            .filter(|n| !n.cpu_less)
            .map(|n| {
                let mut row = vec![n.id.to_string()];
                row.extend(memory_nodes.iter().map(|&m| {
                    probe
                        .latency_ns(n.id, m)
                        .map_or_else(|| "-".to_owned(), |ns| format!("{ns:.1}"))
                }));
                row
            })
            .collect();
        right_aligned(&mut out, &header, &matrix);
    }

    out.push_str("\nMemory order per node (nearest first; the volume allocates in this order)\n");
    for order in orders {
        let list: Vec<String> = order
            .candidates
            .iter()
            .map(|c| match c.latency_ns {
                Some(ns) => format!("{} ({ns:.0} ns)", c.node),
                None => format!("{} (distance {})", c.node, c.distance),
            })
            .collect();
        let _ = writeln!(
            out,
            "  node {}: {}  [{}]",
            order.requester,
            list.join(", "),
            order.source
        );
    }

    out.push_str("\nPersistent memory\n");
    if topology.pmem.is_empty() {
        out.push_str("  none found (locus emulates one device per node in /dev/shm)\n");
    } else {
        let rows: Vec<[String; 4]> = topology
            .pmem
            .iter()
            .map(|p| {
                [
                    format!("  {}", p.path.display()),
                    format!("{:?}", p.kind).to_lowercase(),
                    p.node.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                    format_bytes(p.size_bytes),
                ]
            })
            .collect();
        table(&mut out, &["  DEVICE", "KIND", "NODE", "SIZE"], &rows);
    }

    out.push_str("\nNetwork interfaces\n");
    let rows: Vec<[String; 2]> = topology
        .nics
        .iter()
        .map(|nic| {
            let node = match (nic.is_virtual, nic.node) {
                (true, _) => "virtual".to_owned(),
                (false, Some(node)) => format!("node {node}"),
                (false, None) => "no NUMA affinity reported".to_owned(),
            };
            [format!("  {}", nic.name), node]
        })
        .collect();
    table(&mut out, &["  INTERFACE", "NODE"], &rows);
    out
}

/// Left-aligned columns, two spaces apart.
fn table<const N: usize>(out: &mut String, header: &[&str; N], rows: &[[String; N]]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Right-aligned numeric matrix with a header row.
fn right_aligned(out: &mut String, header: &[String], rows: &[Vec<String>]) {
    let width = header
        .iter()
        .chain(rows.iter().flatten())
        .map(String::len)
        .max()
        .unwrap_or(1);
    let mut line = |cells: &[String]| {
        let text: Vec<String> = cells.iter().map(|c| format!("{c:>width$}")).collect();
        let _ = writeln!(out, "  {}", text.join("  "));
    };
    line(header);
    for row in rows {
        line(row);
    }
}
