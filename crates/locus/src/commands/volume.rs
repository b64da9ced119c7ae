//! Opening the volume named by `--volume` for the commands that need one, creating the
//! embedded default when there is none yet.

use std::path::Path;

use anyhow::{Context, Result};
use topology::Topology;
use volume::{OpenOptions, Volume, VolumeConfig};

/// Opens the volume in `dir`. With no `locus.toml` there, formats the embedded default (one
/// emulated device per node) first and says so on stderr.
pub fn open_or_create_default(dir: &Path, sysfs: &Path) -> Result<Volume> {
    let topology = Topology::read_from(sysfs)
        .with_context(|| format!("reading the NUMA topology from {}", sysfs.display()))?;
    if VolumeConfig::read(dir)?.is_none() {
        let config = volume::default_config(dir, &topology, None)?;
        Volume::format(dir, &config, false)?;
        eprintln!(
            "locus: no volume at {}; created the embedded default: {} emulated device(s), one per \
             NUMA node, each bound to its node (survives process crashes, not reboots)",
            dir.display(),
            config.devices.len()
        );
    }
    Volume::open(dir, topology, &OpenOptions::default())
        .with_context(|| format!("opening the volume at {}", dir.display()))
}
