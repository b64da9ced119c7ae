//! `locus format`: make devices into a new volume.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use topology::Topology;
use volume::{DeviceConfig, Volume, VolumeConfig};

use crate::output::outln;
use crate::size::{format_bytes, parse_size};

/// Create a volume in the --volume directory from persistent-memory devices, with an empty
/// file system on it (unless --no-fs).
///
/// Devices come from --device, or --emulate, or a locus.toml already in the directory; with
/// none of them, the embedded default is created: one emulated device per NUMA node, a file
/// under the volume directory whose pages are bound to that node, sized min(a quarter of the
/// node's free memory, 4 GiB). Device kinds are detected from the path: a character device
/// is device-DAX, a file on tmpfs is emulated, a file on a DAX mount is a DAX file, anything
/// else an ordinary file persisted with msync.
#[derive(Debug, Args)]
pub struct FormatArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// A device: PATH[,node=N][,size=SIZE][,kind=emulated|daxfile|devdax|file]. Repeat for
    /// several; they are numbered in the order given. Files are created with SIZE; an
    /// emulated device needs node=N.
    #[arg(long = "device", value_name = "SPEC")]
    devices: Vec<String>,

    /// Emulate one device per NUMA node under the volume directory, each of SIZE if given.
    #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "", conflicts_with = "devices")]
    emulate: Option<String>,

    /// Format even if the directory already holds a volume (its data is lost).
    #[arg(long)]
    force: bool,

    /// Leave the volume bare: no file system on it (`locus serve` and the file-system API
    /// need one; create it later with `locus format --force`).
    #[arg(long)]
    no_fs: bool,

    /// Keep a crc32c of every 4 KiB block of file data and verify it on every read: a
    /// damaged block is an I/O error naming the file and offset, never wrong bytes, and
    /// `locus scrub` finds every one. Costs a table of 0.1% of each device, a checksum per
    /// block written and read, and partial-block writes are rebuilt in fresh blocks (see
    /// docs/data-checksums.md for the measured cost). `locus tune --data-checksums on|off`
    /// changes it later, keeping the files.
    #[arg(long, conflicts_with = "no_fs")]
    data_checksums: bool,

    /// Thread slots of the file system, 2 to 120 [default: 64]. A thread that changes the
    /// file system owns a slot (a log area and a journal, about 2 MiB with the default
    /// sizes) while it lives; slot 0 is the checkpoint's and the top eighth are shared:
    /// threads past the owned ones take turns on those, one operation at a time, so no
    /// thread is refused, but those threads wait for each other. A slot's areas are made
    /// only when a thread first needs them, so a larger limit costs nothing until used:
    /// where `locus mount` (a serving thread per CPU) or a program runs more than 55
    /// threads at once, raise it (e.g. CPUs × 8/7 + 2, at most 120). `locus tune
    /// --thread-slots` changes it later, keeping the files.
    #[arg(long, value_name = "N", conflicts_with = "no_fs",
          value_parser = clap::value_parser!(u32).range(2..=i64::from(fs::MAX_SLOTS)))]
    thread_slots: Option<u32>,

    /// Cache-flush policy: auto (flush unless the platform reports eADR), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    flush: String,
}

pub fn run(dir: &Path, sysfs: &Path, args: &FormatArgs) -> Result<()> {
    let config = if !args.devices.is_empty() {
        let devices = args
            .devices
            .iter()
            .map(|spec| parse_device(spec))
            .collect::<Result<Vec<_>>>()?;
        VolumeConfig {
            flush: args.flush.clone(),
            devices,
        }
    } else if let Some(size) = &args.emulate {
        let topology = Topology::read_from(sysfs)?;
        let size = if size.is_empty() {
            None
        } else {
            Some(parse_size(size).map_err(anyhow::Error::msg)?)
        };
        VolumeConfig {
            flush: args.flush.clone(),
            ..volume::default_config(dir, &topology, size)?
        }
    } else if let Some(existing) = VolumeConfig::read(dir)? {
        existing
    } else {
        let topology = Topology::read_from(sysfs)?;
        VolumeConfig {
            flush: args.flush.clone(),
            ..volume::default_config(dir, &topology, None)?
        }
    };
    if config.devices.is_empty() {
        bail!("no devices to format");
    }
    let total: u64 = config.devices.iter().filter_map(|d| d.size_bytes).sum();
    let spinner = crate::progress::spinner(
        if total > 0 {
            format!(
                "formatting {} device(s), {}",
                config.devices.len(),
                format_bytes(total)
            )
        } else {
            format!("formatting {} device(s)", config.devices.len())
        },
        true,
    );
    let uuid =
        super::volume::after_stopping_server(dir, || Volume::format(dir, &config, args.force))
            .with_context(|| format!("formatting a volume in {}", dir.display()))?;
    if !args.no_fs {
        spinner.set_message("creating the file system");
        super::volume::format_fs(
            dir,
            super::volume::read_topology(sysfs)?,
            args.data_checksums,
            args.thread_slots,
        )?;
    }
    spinner.finish_and_clear();
    let written = VolumeConfig::read(dir)?.context("locus.toml vanished after format")?;
    outln!(
        "formatted volume {} in {} with {} device(s):",
        volume::hex(&uuid),
        dir.display(),
        written.devices.len()
    );
    for (index, device) in written.devices.iter().enumerate() {
        outln!(
            "  {index}: {} ({}, {}{})",
            device.path.display(),
            device.kind.as_deref().unwrap_or("?"),
            device.size_bytes.map_or_else(|| "?".into(), format_bytes),
            device
                .node
                .map_or_else(String::new, |n| format!(", node {n}")),
        );
    }
    if args.no_fs {
        outln!("no file system (--no-fs)");
    } else {
        let mut with = String::new();
        if args.data_checksums {
            with += ", with data checksums";
        }
        if let Some(slots) = args.thread_slots {
            with += &format!(", {slots} thread slots");
        }
        outln!("with an empty file system{with}");
    }
    Ok(())
}

pub(super) fn parse_device(spec: &str) -> Result<DeviceConfig> {
    let mut parts = spec.split(',');
    // Absolute in locus.toml: a relative path would name another file from another directory.
    let path = std::path::absolute(PathBuf::from(
        parts
            .next()
            .filter(|p| !p.is_empty())
            .context("--device needs a path")?,
    ))
    .with_context(|| format!("--device {spec}: making the path absolute"))?;
    let mut device = DeviceConfig {
        path,
        kind: None,
        node: None,
        size_bytes: None,
    };
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .with_context(|| format!("--device {spec}: `{part}` is not key=value"))?;
        match key {
            "node" => {
                device.node = Some(
                    value
                        .parse()
                        .with_context(|| format!("--device {spec}: node `{value}`"))?,
                );
            }
            "size" => device.size_bytes = Some(parse_size(value).map_err(anyhow::Error::msg)?),
            "kind" => device.kind = Some(value.to_owned()),
            other => bail!("--device {spec}: unknown key `{other}` (node, size, kind)"),
        }
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs() {
        let device = parse_device("/dev/shm/a.pmem,node=1,size=64M").unwrap();
        assert_eq!(device.node, Some(1));
        assert_eq!(device.size_bytes, Some(64 << 20));
        assert!(
            parse_device("/x,colour=red")
                .unwrap_err()
                .to_string()
                .contains("unknown key")
        );
        assert!(parse_device("/x,node").is_err());
        assert!(parse_device(",node=1").is_err());
    }
}
