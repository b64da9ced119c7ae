//! Checking a volume without opening it for use: every device's superblock and the devices'
//! agreement with each other, reporting every problem rather than stopping at the first.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};
use crate::lock::VolumeLock;
use crate::superblock::Superblock;
use crate::volume::hex;

/// One device as the check found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCheck {
    /// Path from `locus.toml`.
    pub path: String,
    /// The device's index, if its superblock could be read.
    pub index: Option<u32>,
    /// The volume it claims to belong to.
    pub volume_uuid: Option<String>,
    /// "ok", or what is wrong.
    pub status: String,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Per device, in `locus.toml` order.
    pub devices: Vec<DeviceCheck>,
    /// Problems: per-device ones and those between devices.
    pub problems: Vec<String>,
    /// Things worth knowing that do not stop the volume from opening (a device that moved to
    /// another node).
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// True when the volume would open.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the volume in `dir` (taking its lock, so nothing changes it meanwhile).
pub fn check(dir: &Path) -> Result<CheckReport> {
    let (_lock, config) = VolumeLock::acquire_existing(dir)?;
    check_devices(&config)
}

/// [`check`] for the process that holds the volume open (a mount server checking its own
/// volume): superblocks are written only by `format` and `extend`, which need the volume
/// closed, so an open volume's do not change.
pub fn check_held(dir: &Path) -> Result<CheckReport> {
    let config = VolumeConfig::read(dir)?.ok_or_else(|| VolumeError::NoVolume {
        dir: dir.to_owned(),
    })?;
    check_devices(&config)
}

fn check_devices(config: &VolumeConfig) -> Result<CheckReport> {
    let flush = config.flush_policy().expect("validated");
    let mut report = CheckReport {
        devices: Vec::new(),
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let mut found: Vec<(String, Superblock)> = Vec::new();
    for device in &config.devices {
        let path = device.path.display().to_string();
        let outcome = device.open_source(flush, false).and_then(|source| {
            let (superblock, from_copy) = Superblock::read_with_copy(&source.region, &path)?;
            Ok((superblock, from_copy, source.node, source.region.len()))
        });
        match outcome {
            Ok((superblock, from_copy, node, bytes)) => {
                if bytes > superblock.capacity_bytes {
                    report.warnings.push(format!(
                        "{path} has {bytes} bytes, but the volume uses {} of it: growing it \
                         stopped before its new size was recorded (`locus extend` records \
                         it; until then the rest stays unused)",
                        superblock.capacity_bytes
                    ));
                }
                if from_copy {
                    report.warnings.push(format!(
                        "{path}: its superblock was being rewritten when an extension of the \
                         volume or a grow of the device stopped; read from its copy (the next \
                         open rewrites it)"
                    ));
                }
                if let (Some(now), Some(then)) = (node, superblock.node())
                    && now != then
                {
                    report.warnings.push(format!(
                        "{path} was on node {then} at format and is on node {now} now"
                    ));
                }
                report.devices.push(DeviceCheck {
                    path: path.clone(),
                    index: Some(superblock.device_index),
                    volume_uuid: Some(hex(&superblock.volume_uuid)),
                    status: "ok".into(),
                });
                found.push((path, superblock));
            }
            Err(error) => {
                report.problems.push(error.to_string());
                report.devices.push(DeviceCheck {
                    path,
                    index: None,
                    volume_uuid: None,
                    status: error.to_string(),
                });
            }
        }
    }

    let mut uuids: BTreeMap<[u8; 16], Vec<&str>> = BTreeMap::new();
    for (path, superblock) in &found {
        uuids.entry(superblock.volume_uuid).or_default().push(path);
    }
    if uuids.len() > 1 {
        let groups: Vec<String> = uuids
            .iter()
            .map(|(uuid, paths)| format!("{} ({})", hex(uuid), paths.join(", ")))
            .collect();
        report.problems.push(format!(
            "devices belong to different volumes: {}",
            groups.join("; ")
        ));
    }
    let counts: std::collections::BTreeSet<u32> =
        found.iter().map(|(_, s)| s.device_count).collect();
    // Two counts: an extension that stopped after locus.toml listed the new devices
    // (`Volume::extend`); opening finishes it.
    let agreed = crate::extend::agreed_count(&counts);
    if counts.len() == 2 {
        report.warnings.push(format!(
            "an extension of the volume from {} to {} devices stopped before every superblock \
             counted the new devices; the next open finishes it",
            counts.first().expect("two"),
            counts.last().expect("two")
        ));
    } else if agreed.is_none() && !counts.is_empty() {
        report
            .problems
            .push(format!("devices disagree on the device count: {counts:?}"));
    }
    if let Some(&count) = counts.last() {
        let mut seen: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for (path, superblock) in &found {
            seen.entry(superblock.device_index).or_default().push(path);
        }
        for (index, paths) in &seen {
            if paths.len() > 1 {
                report.problems.push(format!(
                    "device index {index} is claimed by {}",
                    paths.join(" and ")
                ));
            }
        }
        for index in 0..count {
            if !seen.contains_key(&index) && found.len() == config.devices.len() {
                report.problems.push(format!(
                    "device {index} of {count} is missing from locus.toml"
                ));
            }
        }
        // A readable superblock that disagrees with the list is a problem whatever the others
        // say; a missing index can only be told when every device was readable.
        if config.devices.len() as u32 != count {
            report.problems.push(format!(
                "locus.toml lists {} devices, the superblocks say {count}",
                config.devices.len()
            ));
        }
    }
    Ok(report)
}
