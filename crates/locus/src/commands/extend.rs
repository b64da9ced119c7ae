//! `locus extend`: add devices to a volume that holds files.

use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;

use crate::output::outln;
use crate::size::format_bytes;

/// Add devices to the volume, or grow one, keeping its files: a new persistent-memory or CXL
/// device, more emulated memory on a node, or a longer emulated device or device file.
///
/// The volume in the --volume directory must not be in use (`locus mount`, `locus serve` or a
/// program through the preload library holds it: stop it first). Each device is created like
/// `locus format --device` creates one (a file needs size=, an emulated device node=) and
/// joins the volume at the next index; from the next open, writes go to it as to any device,
/// from the nodes it is nearest to first. With data checksums, it gets its checksum table
/// (0.1% of it) in the same command.
///
/// Crash-safe at every point: the new devices get their superblocks, then locus.toml lists
/// them, then each old device's superblock is rewritten through a copy. A crash before
/// locus.toml changed leaves the volume as it was (run the command again); after, the next
/// open of the volume finishes the rewrite. A data-checksum volume interrupted before its
/// new tables exist refuses to open until `locus extend --volume DIR` (no --device) makes
/// them. Files are never touched: the volume only grows.
///
/// --grow lengthens one device in place (emulated devices, ordinary files, files on a DAX
/// file system; not device-DAX, whose size is its namespace's): the file first, then its
/// superblock (through its copy), then locus.toml. A crash in between leaves the device
/// used at its old size (`locus fsck` warns) until `locus extend --volume DIR` records the
/// new one.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// A device to add: PATH[,node=N][,size=SIZE][,kind=emulated|daxfile|devdax|file], as
    /// for `locus format`. Repeat for several; they get the next indexes in the order given.
    /// Without any (and without --emulate or --grow), the command finishes an extension or a
    /// grow a crash interrupted (and otherwise changes nothing).
    #[arg(long = "device", value_name = "SPEC")]
    devices: Vec<String>,

    /// Add an emulated device (a file in the volume directory whose pages are bound to its
    /// node, as `locus format --emulate` makes) on every NUMA node with memory that has no
    /// device of the volume yet, CPU-less (CXL) nodes included: each of SIZE if given, else
    /// min(a quarter of the node's free memory, 4 GiB). `locus status` names CPU nodes without
    /// a device.
    #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "",
          conflicts_with = "devices")]
    emulate: Option<String>,

    /// Grow a device of the volume in place: DEVICE,size=SIZE, where DEVICE is its index (as
    /// `locus status` shows), its path, or `all` (every device), and SIZE its new size, or
    /// +SIZE for that much more (e.g. `--grow 0,size=+1G`, `--grow all,size=+512M`). Repeat
    /// for several devices; all are checked before any grows. Its blocks are allocated now (an
    /// emulated device's on its node, refused when the node has not the memory); with data
    /// checksums its table grows in the same command.
    #[arg(long, value_name = "DEVICE,size=SIZE", conflicts_with_all = ["devices", "emulate"])]
    grow: Vec<String>,

    /// Add a device even if it holds a device of another locus volume (whose data is then
    /// lost). A device of this volume is never added twice.
    #[arg(long)]
    force: bool,
}

/// `--grow`'s DEVICE and size.
fn parse_grow(spec: &str) -> Result<(String, volume::GrowTo)> {
    let mut parts = spec.split(',');
    let device = parts.next().unwrap_or_default().trim();
    if device.is_empty() {
        anyhow::bail!("--grow {spec:?}: name the device (its index or path) before the size");
    }
    let mut size = None;
    for part in parts {
        match part.split_once('=') {
            Some(("size", value)) => {
                let value = value.trim();
                size = Some(match value.strip_prefix('+') {
                    Some(more) => volume::GrowTo::By(
                        crate::size::parse_size(more).map_err(anyhow::Error::msg)?,
                    ),
                    None => volume::GrowTo::Bytes(
                        crate::size::parse_size(value).map_err(anyhow::Error::msg)?,
                    ),
                });
            }
            _ => anyhow::bail!(
                "--grow {spec:?}: unknown part {part:?} (expected DEVICE,size=SIZE or \
                 DEVICE,size=+SIZE)"
            ),
        }
    }
    let size = size.ok_or_else(|| {
        anyhow::anyhow!("--grow {spec:?}: give the new size (DEVICE,size=SIZE or size=+SIZE)")
    })?;
    Ok((device.to_owned(), size))
}

pub fn run(dir: &Path, sysfs: &Path, args: &ExtendArgs) -> Result<()> {
    let topology = super::volume::read_topology(sysfs)?;
    let added = match &args.emulate {
        Some(size) => emulated_for_nodes_without(dir, &topology, size)?,
        None => args
            .devices
            .iter()
            .map(|spec| super::format::parse_device(spec))
            .collect::<Result<Vec<_>>>()?,
    };
    // A volume-level extension a crash interrupted, counted first through a view that writes
    // nothing: growing and opening finish it; the file system's part follows.
    let stale = if added.is_empty() {
        volume::Volume::open_view(dir, topology.clone())
            .map(|view| view.stale_superblocks())
            .unwrap_or(0)
    } else {
        0
    };
    let mut grown = Vec::new();
    if !args.grow.is_empty() {
        let wanted = args
            .grow
            .iter()
            .map(|spec| parse_grow(spec))
            .collect::<Result<Vec<_>>>()?;
        grown = super::volume::after_stopping_server(dir, || {
            volume::Volume::grow(dir, topology.clone(), &wanted)
        })
        .with_context(|| format!("growing devices of the volume at {}", dir.display()))?;
    } else if added.is_empty() {
        // A grow a crash interrupted: recorded now (before the open, which would use the
        // device at its old size).
        grown = super::volume::after_stopping_server(dir, || {
            volume::Volume::finish_growth(dir, topology.clone())
        })
        .with_context(|| format!("finishing a grow of the volume at {}", dir.display()))?;
    }
    for g in &grown {
        outln!(
            "device {} ({}): {} -> {}",
            g.index,
            g.path.display(),
            format_bytes(g.before),
            format_bytes(g.after)
        );
    }
    if !added.is_empty() {
        let extended = super::volume::after_stopping_server(dir, || {
            volume::Volume::extend(dir, topology.clone(), &added, args.force)
        })
        .with_context(|| format!("extending the volume at {}", dir.display()))?;
        outln!(
            "volume {} in {}: {} -> {} device(s)",
            volume::hex(&extended.uuid),
            dir.display(),
            extended.before,
            extended.after
        );
        for (i, (device, node)) in extended.added.iter().enumerate() {
            outln!(
                "  {}: {} ({}, {}{})",
                extended.before as usize + i,
                device.path.display(),
                device.kind.as_deref().unwrap_or("?"),
                device.size_bytes.map_or_else(|| "?".into(), format_bytes),
                node.map_or_else(String::new, |n| format!(", node {n}")),
            );
        }
    }
    let volume = super::volume::open(dir, &topology, false)?;
    if stale > 0 {
        outln!(
            "volume in {}: finished an interrupted extension to {} device(s) ({stale} \
             superblock(s) rewritten)",
            dir.display(),
            volume.device_count()
        );
    }
    let mut tables_made = 0;
    match fs::Fs::add_device_tables(&volume) {
        Ok((0, _)) => {}
        Ok((tables, bytes)) => {
            tables_made = tables;
            outln!(
                "data checksums: {tables} table(s) made for the new or grown device(s), {}",
                format_bytes(bytes)
            );
        }
        Err(fs::FsError::NoFileSystem) => {}
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "the volume has {} device(s); making the data-checksum tables of new or grown ones \
                 needs the file system to load (`locus fsck --volume {}` reports what is \
                 wrong), then `locus extend --volume {}` again",
                volume.device_count(),
                dir.display(),
                dir.display()
            )));
        }
    }
    if added.is_empty() && grown.is_empty() && stale == 0 && tables_made == 0 {
        outln!(
            "volume in {}: {} device(s), no extension or grow to finish (--device adds a \
             device, --grow lengthens one)",
            dir.display(),
            volume.device_count()
        );
    }
    Ok(())
}

/// An emulated device for every node with memory that has no device of the volume in `dir`
/// (`--emulate`), sized `size` (empty: the embedded default's size for the node).
fn emulated_for_nodes_without(
    dir: &Path,
    topology: &topology::Topology,
    size: &str,
) -> Result<Vec<volume::DeviceConfig>> {
    let size = if size.is_empty() {
        None
    } else {
        Some(crate::size::parse_size(size).map_err(anyhow::Error::msg)?)
    };
    let view = super::volume::after_stopping_server(dir, || {
        let (_lock, _) = volume::VolumeLock::acquire_existing(dir)?;
        volume::Volume::open_view(dir, topology.clone())
    })
    .with_context(|| format!("reading the devices of the volume at {}", dir.display()))?;
    let served: Vec<u32> = (0..view.device_count())
        .filter_map(|d| view.device_node(d))
        .collect();
    drop(view);
    let wanted = volume::default_config(dir, topology, size)?;
    let added: Vec<volume::DeviceConfig> = wanted
        .devices
        .into_iter()
        .filter(|d| d.node.is_some_and(|n| !served.contains(&n)))
        .collect();
    if added.is_empty() {
        anyhow::bail!(
            "every NUMA node with memory has a device of the volume at {} already (nodes {served:?})",
            dir.display()
        );
    }
    Ok(added)
}
