//! Putting a file system on a volume directory: the embedded default volume that the `locus`
//! binary and the preload library create when `LOCUS_VOLUME` names no volume yet.

use std::path::Path;
use std::sync::Arc;

use topology::Topology;
use volume::{Volume, VolumeConfig};

use crate::{FormatOptions, Fs, FsOptions, Result};

/// Creates the embedded default volume in `dir` (one emulated device per NUMA node with
/// memory, each bound to its node; see [`volume::default_config`]) with an empty file
/// system, and returns its configuration. Refuses a directory that holds a volume already,
/// and — with `NoVolume`, creating nothing — any directory but the default location or an
/// empty one ([`volume::may_create_default_in`]): a mistyped path is not a new volume.
pub fn create_default_volume(dir: &Path, topology: &Topology) -> Result<VolumeConfig> {
    if !volume::may_create_default_in(dir) {
        return Err(volume::VolumeError::NoVolume {
            dir: dir.to_owned(),
        }
        .into());
    }
    let config = volume::default_config(dir, topology, None)?;
    Volume::format(dir, &config, false)?;
    format_volume(dir, topology.clone())?;
    Ok(config)
}

/// Opens the (closed) volume in `dir` and writes an empty file system on it, laid out by
/// [`FormatOptions::scaled_to`] its capacity, replacing any file system there.
pub fn format_volume(dir: &Path, topology: Topology) -> Result<()> {
    format_volume_with(dir, topology, false, None)
}

/// [`format_volume`], with data checksums when `data_checksums` is true
/// ([`FormatOptions::data_checksums`]) and `slot_limit` thread slots when given
/// ([`FormatOptions::slot_limit`]; checked by [`Fs::format`]).
pub fn format_volume_with(
    dir: &Path,
    topology: Topology,
    data_checksums: bool,
    slot_limit: Option<u32>,
) -> Result<()> {
    // Formatting writes a few metadata pages: mapping every page of an emulated device
    // first (the open's default, for servers) would make the kernel clear all of them now,
    // seconds for a large device, for nothing.
    let options = volume::OpenOptions {
        prefault: false,
        ..Default::default()
    };
    let volume = Arc::new(Volume::open(dir, topology, &options)?);
    let capacity = volume.stats().iter().map(|d| d.capacity_bytes).sum();
    let fs = Fs::format(
        volume,
        &FormatOptions {
            data_checksums,
            slot_limit: slot_limit.unwrap_or(FormatOptions::default().slot_limit),
            ..FormatOptions::scaled_to(capacity)
        },
        FsOptions::default(),
    )?;
    fs.unmount()
}
