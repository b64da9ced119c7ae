//! Persistent-memory devices the kernel exposes, and the node each sits on.
//!
//! Two kinds matter to locus:
//! - fs-dax capable block devices `/dev/pmemN` (`/sys/block/pmemN`, with `queue/dax` = 1);
//!   a file system mounted with `-o dax` on them gives DAX files;
//! - device-DAX character devices `/dev/daxX.Y` (`/sys/bus/dax/devices/daxX.Y`) bound to the
//!   `device_dax` driver. A dax device bound to `kmem` is already system RAM (a memory node)
//!   and an unbound one has no character device, so neither is listed.
//!
//! The node is the device's `numa_node`: the online node nearest to it, which is where the
//! CPUs that should write to it run. BTT (`pmemNs`) and raw-mode namespaces cannot do DAX and
//! are skipped with a log line.

use std::path::PathBuf;

use serde::Serialize;

use crate::NodeId;
use crate::error::{Result, TopologyError};
use crate::sysfs::{Sysfs, numbered};

/// Block-layer size unit: `/sys/block/X/size` counts 512-byte sectors whatever the device.
const SECTOR_BYTES: u64 = 512;

/// How a persistent-memory device is accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PmemKind {
    /// A block device that supports a DAX file system (`/dev/pmemN`).
    Fsdax,
    /// A device-DAX character device (`/dev/daxX.Y`), mapped directly.
    Devdax,
}

/// One persistent-memory device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PmemDevice {
    /// The device node, e.g. `/dev/pmem0` or `/dev/dax1.0`.
    pub path: PathBuf,
    /// The NUMA node nearest the device, if the kernel knows one.
    pub node: Option<NodeId>,
    /// Capacity in bytes.
    pub size_bytes: u64,
    /// fs-dax block device or device-DAX.
    pub kind: PmemKind,
}

/// Lists fs-dax block devices and device-DAX devices, fs-dax first, each in natural order.
pub(crate) fn read_pmem(sysfs: &Sysfs) -> Result<Vec<PmemDevice>> {
    let mut devices = read_fsdax(sysfs)?;
    devices.extend(read_devdax(sysfs)?);
    Ok(devices)
}

fn read_fsdax(sysfs: &Sysfs) -> Result<Vec<PmemDevice>> {
    let mut devices = Vec::new();
    for name in sysfs.list_optional("block")? {
        if numbered(&name, "pmem").is_none() {
            continue;
        }
        let dir = format!("block/{name}");
        let dax = sysfs
            .read_u64_optional(format!("{dir}/queue/dax"))?
            .unwrap_or(0);
        if dax != 1 {
            tracing::info!(device = %name, "skipping pmem block device without DAX support");
            continue;
        }
        let sectors = sysfs.read_u64(format!("{dir}/size"))?;
        let size_bytes = sectors.checked_mul(SECTOR_BYTES).ok_or_else(|| {
            TopologyError::malformed(sysfs.path(format!("{dir}/size")), "size overflows 64 bits")
        })?;
        devices.push(PmemDevice {
            path: PathBuf::from(format!("/dev/{name}")),
            node: sysfs.read_numa_node(format!("{dir}/device/numa_node"))?,
            size_bytes,
            kind: PmemKind::Fsdax,
        });
    }
    Ok(devices)
}

fn read_devdax(sysfs: &Sysfs) -> Result<Vec<PmemDevice>> {
    let mut devices = Vec::new();
    for name in sysfs.list_optional("bus/dax/devices")? {
        if !is_dax_name(&name) {
            continue;
        }
        let dir = format!("bus/dax/devices/{name}");
        let driver = std::fs::read_link(sysfs.path(format!("{dir}/driver")))
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
        if driver.as_deref() != Some("device_dax") {
            tracing::info!(
                device = %name,
                driver = driver.as_deref().unwrap_or("none"),
                "skipping dax device not bound to device_dax"
            );
            continue;
        }
        let size_bytes = sysfs.read_u64(format!("{dir}/size"))?;
        if size_bytes == 0 {
            continue;
        }
        devices.push(PmemDevice {
            path: PathBuf::from(format!("/dev/{name}")),
            node: sysfs.read_numa_node(format!("{dir}/numa_node"))?,
            size_bytes,
            kind: PmemKind::Devdax,
        });
    }
    Ok(devices)
}

/// `daxX.Y` with decimal X and Y.
fn is_dax_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("dax") else {
        return false;
    };
    let Some((region, id)) = rest.split_once('.') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(region) && digits(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dax_names() {
        assert!(is_dax_name("dax0.0"));
        assert!(is_dax_name("dax12.3"));
        assert!(!is_dax_name("dax0"));
        assert!(!is_dax_name("dax.0"));
        assert!(!is_dax_name("daxa.0"));
    }
}
