//! Size of the largest CPU cache, which the latency probe's buffer must exceed.

use crate::Result;
use crate::sysfs::{Sysfs, numbered};

/// Largest data or unified cache reported for the CPUs of `nodes` (each node's CPUs), in
/// bytes; `None` when the kernel exports no cache information (some VMs and architectures).
///
/// One CPU per node is read — the first that reports caches: the largest cache is the
/// last-level one, which a node's CPUs share (a socket's, or a chiplet's of the same size),
/// and every process that mounts a volume reads the topology. Reading every CPU's caches
/// cost a process start about eight sysfs files per CPU: ~2,000 on a two-socket machine
/// of 256 hardware threads.
pub(crate) fn largest_cache_bytes(sysfs: &Sysfs, nodes: &[&[u32]]) -> Result<Option<u64>> {
    let mut largest: Option<u64> = None;
    for cpus in nodes {
        for &cpu in *cpus {
            let dir = format!("devices/system/cpu/cpu{cpu}/cache");
            let mut reported = false;
            for index in sysfs.list_optional(&dir)? {
                if numbered(&index, "index").is_none() {
                    continue;
                }
                reported = true;
                let kind = sysfs.read(format!("{dir}/{index}/type"))?;
                if kind.trim() == "Instruction" {
                    continue;
                }
                let size_rel = format!("{dir}/{index}/size");
                let bytes = parse_cache_size(&sysfs.read(&size_rel)?).map_err(|problem| {
                    crate::TopologyError::malformed(sysfs.path(&size_rel), problem)
                })?;
                largest = Some(largest.map_or(bytes, |l| l.max(bytes)));
            }
            if reported {
                break;
            }
        }
    }
    Ok(largest)
}

/// Parses `491520K` / `32M` / `1024` (bytes) into bytes.
fn parse_cache_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, multiplier) = match text.as_bytes().last() {
        Some(b'K') => (&text[..text.len() - 1], 1u64 << 10),
        Some(b'M') => (&text[..text.len() - 1], 1 << 20),
        Some(b'G') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("`{text}` is not a cache size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes() {
        assert_eq!(parse_cache_size("491520K\n"), Ok(491_520 * 1024));
        assert_eq!(parse_cache_size("32M"), Ok(32 << 20));
        assert_eq!(parse_cache_size("4096"), Ok(4096));
        assert!(parse_cache_size("lots").is_err());
    }
}
