//! Adding devices to a volume that holds data (`locus extend`), crash-safe at every point.
//!
//! A volume's membership is in two places: `locus.toml` lists where the devices are, and
//! every superblock says how many there are. Adding devices changes both, in this order:
//! 1. each new device gets its superblock (the next indexes, the new count);
//! 2. `locus.toml` lists them (written atomically);
//! 3. each old device's superblock is rewritten with the new count, through its copy
//!    ([`Superblock::rewrite`]).
//!
//! A crash before 2 leaves the old volume as it was (the new files carry superblocks no list
//! names; adding them again overwrites those). A crash after 2 leaves old devices that say
//! the old count beside new ones that say the new count — a state [`Volume::open_devices`]
//! recognises (nothing else produces it) and [`Volume::open`] finishes by rewriting the
//! stale superblocks. The new devices hold nothing until an open that knows them allocates
//! there, so no step can lose data.
//!
//! Growing a device (`locus extend --grow`: an emulated device, an ordinary file or a file on
//! a DAX file system, lengthened in place) changes its length, its superblock and its size in
//! `locus.toml`, in this order:
//! 1. the device file is lengthened and the new part allocated ([`pmem::Device::grow`]);
//! 2. its superblock is rewritten, through its copy, with the new capacity and data area;
//! 3. `locus.toml` records the new size.
//!
//! A crash after 1 leaves a device longer than its superblock says: [`Volume::open_devices`]
//! uses the recorded capacity (the rest stays unused), `fsck` warns, and
//! [`Volume::finish_growth`] records it. A crash after 2 leaves a smaller size in
//! `locus.toml`, which nothing reads from a device that exists but `finish_growth` corrects.
//! The device's data area only grows at its end, so every address stays where it was.

use std::path::Path;

use topology::Topology;

use crate::config::{CONFIG_FILE, DeviceConfig, VolumeConfig};
use crate::error::{Result, VolumeError};
use crate::lock::VolumeLock;
use crate::superblock::{MIN_DEVICE_BYTES, Superblock};
use crate::volume::{DeviceSource, Volume, check_emulated, check_room, hex, missing_size};

/// What [`Volume::extend`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extended {
    /// The volume.
    pub uuid: [u8; 16],
    /// Devices before.
    pub before: u32,
    /// Devices now.
    pub after: u32,
    /// The devices added, as `locus.toml` now lists them (kind and size filled in), with the
    /// node each is on.
    pub added: Vec<(DeviceConfig, Option<u32>)>,
}

impl Volume {
    /// Adds `added` (created like `format` creates devices: a file needs `size_bytes`, an
    /// emulated device its node) to the volume in `dir`, which no process may have open. An
    /// extension an earlier crash interrupted is finished first (by the open). A device of
    /// this volume is refused (under any path); one that carries another volume's superblock
    /// is refused unless `force` (it is then overwritten). Every device is checked before
    /// any is created, and a failed call removes the files it created.
    pub fn extend(
        dir: &Path,
        topology: Topology,
        added: &[DeviceConfig],
        force: bool,
    ) -> Result<Extended> {
        let config_path = dir.join(CONFIG_FILE);
        let problem = |problem: String| VolumeError::Config {
            path: config_path.clone(),
            problem,
        };
        if added.is_empty() {
            return Err(problem("no devices to add".into()));
        }
        let (mut lock, config) = VolumeLock::acquire_existing(dir)?;
        for device in added {
            if config
                .devices
                .iter()
                .any(|d| same_file(&d.path, &device.path))
            {
                return Err(problem(format!(
                    "device {} is in the volume already",
                    device.path.display()
                )));
            }
        }
        let mut full = config.clone();
        full.devices.extend(added.iter().cloned());
        full.validate(&config_path)?;
        for device in added {
            device.kind()?;
            let parent = device.parent_dir();
            if !device.path.exists() && !parent.is_dir() {
                return Err(problem(format!(
                    "device {}: its directory {} does not exist",
                    device.path.display(),
                    parent.display()
                )));
            }
        }
        check_emulated(dir, &full)?;
        check_room(dir, &full)?;
        lock.lock_devices(&full)?;
        let flush = config.flush_policy().expect("validated");
        let mut volume = Self::open_listed(&config, topology)?;
        volume.finish_extension()?;
        let before = volume.device_count();
        let uuid = volume.uuid();

        // Every new device is checked, then all are created, before any superblock is
        // written; a device that cannot be created takes back the files this call made.
        for device in added {
            check_new_device(device, flush, uuid, before, force).map_err(&problem)?;
        }
        let mut written = config.clone();
        let mut sources = Vec::with_capacity(added.len());
        let mut added_out = Vec::with_capacity(added.len());
        // The files this call made or remade (and whether each existed), given back when a
        // later device fails, as a failed format gives back its own.
        let mut made: Vec<(&Path, bool)> = Vec::new();
        let created = added.iter().try_for_each(|device| {
            let kind = device.kind()?;
            let spec = device.spec(kind, flush);
            let existed = device.path.exists();
            let opened = match device.size_bytes {
                Some(size) if kind != pmem::DeviceKind::DevDax => {
                    let created = pmem::Device::create(&spec, size)?;
                    made.push((&device.path, existed));
                    created
                }
                _ => pmem::Device::open(&spec)?,
            };
            let label = device.path.display().to_string();
            if opened.size_bytes() < MIN_DEVICE_BYTES {
                return Err(problem(format!(
                    "device {label} has {} bytes; a device needs at least {MIN_DEVICE_BYTES}",
                    opened.size_bytes()
                )));
            }
            let node = device.node.or_else(|| opened.numa_node());
            let mut entry = device.clone();
            entry.kind = Some(kind.name().to_owned());
            entry.size_bytes = Some(opened.size_bytes());
            written.devices.push(entry.clone());
            added_out.push((entry, node));
            sources.push(DeviceSource {
                label,
                kind: Some(kind),
                region: opened.region().clone(),
                node,
            });
            Ok(())
        });
        if let Err(e) = created {
            for (path, existed) in made {
                pmem::give_back(path, existed);
            }
            return Err(e);
        }
        // Devices just created, before a superblock makes them the volume's.
        lock.lock_devices(&full)?;
        volume.add_devices(&sources, || written.write(dir))?;
        Ok(Extended {
            uuid,
            before,
            after: before + added.len() as u32,
            added: added_out,
        })
    }

    /// Makes `added` the next devices of this volume (steps 1–3 of the module docs), with
    /// `list` writing the list of devices that names them between the new superblocks and
    /// the old ones' rewrite. Open the volume again afterwards: this handle still has the old
    /// devices only.
    pub fn add_devices(
        self,
        added: &[DeviceSource],
        list: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let before = self.device_count();
        let after = before as usize + added.len();
        if after > crate::address::MAX_DEVICES as usize {
            return Err(VolumeError::Mismatch {
                problem: format!(
                    "{before} devices and {} more; a volume has at most {}",
                    added.len(),
                    crate::address::MAX_DEVICES
                ),
            });
        }
        let after = after as u32;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        for (i, device) in added.iter().enumerate() {
            Superblock::new(
                self.uuid(),
                before + i as u32,
                after,
                device.node,
                device.region.len(),
                now,
            )
            .write(&device.region)?;
        }
        list()?;
        for device in &self.devices {
            let mut superblock = device.superblock.clone();
            superblock.device_count = after;
            superblock.rewrite(&device.region)?;
        }
        Ok(())
    }

    /// Rewrites the superblocks an interrupted extension left stale (see the module docs):
    /// every device then says the count the volume opened with. Returns how many it rewrote.
    pub fn finish_extension(&mut self) -> Result<usize> {
        let mut rewritten = 0;
        for device in self.devices.iter_mut().filter(|d| d.stale) {
            device.superblock.rewrite(&device.region)?;
            device.stale = false;
            rewritten += 1;
        }
        if rewritten > 0 {
            tracing::info!(
                devices = self.devices.len(),
                rewritten,
                "finished an interrupted extension of the volume: every superblock now counts \
                 every device"
            );
        }
        Ok(rewritten)
    }

    /// Devices whose superblock an interrupted extension left stale (rewritten by
    /// [`Volume::finish_extension`], which [`Volume::open`] calls).
    pub fn stale_superblocks(&self) -> usize {
        self.devices.iter().filter(|d| d.stale).count()
    }
}

/// How large `locus extend --grow` makes a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowTo {
    /// This many bytes in all.
    Bytes(u64),
    /// This many bytes more than the volume uses of it now.
    By(u64),
}

/// A device [`Volume::grow`] grew, or whose growth [`Volume::finish_growth`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grown {
    /// Its index in the volume.
    pub index: u32,
    /// Its path.
    pub path: std::path::PathBuf,
    /// Bytes the volume used of it before.
    pub before: u64,
    /// Bytes it uses now.
    pub after: u64,
}

impl Volume {
    /// Grows devices of the volume in `dir`, which no process may have open: each of `wanted`
    /// names a device (its index, its path, or `all` for every device) and its size, in the
    /// order of the module docs, one device after the other. Every device is checked before
    /// any grows; refused, changing nothing: a device-DAX device (its size is its
    /// namespace's), a device named twice, a size that is not more than the volume uses now
    /// (a device never shrinks), a device file already longer than the size (a growth that
    /// stopped: [`Volume::finish_growth`] records it), and emulated devices whose nodes have
    /// not the memory for all of them. A device that fails to grow (no room to allocate it)
    /// is left as it was and the error returned; the ones before it stay grown. A volume with
    /// data checksums then needs the tables grown (`fs::Fs::add_device_tables`) before its
    /// file system opens.
    pub fn grow(dir: &Path, topology: Topology, wanted: &[(String, GrowTo)]) -> Result<Vec<Grown>> {
        let config_path = dir.join(CONFIG_FILE);
        let problem = |problem: String| VolumeError::Config {
            path: config_path.clone(),
            problem,
        };
        let (_lock, config, volume) = Self::open_to_change(dir, topology)?;
        let mut targets: Vec<(usize, GrowTo)> = Vec::new();
        for (device, to) in wanted {
            let indexes = if device == "all" {
                (0..config.devices.len()).collect()
            } else {
                vec![device_index(&config, device).map_err(&problem)?]
            };
            for index in indexes {
                if targets.iter().any(|&(i, _)| i == index) {
                    return Err(problem(format!("device {index} is named twice")));
                }
                targets.push((index, *to));
            }
        }
        if targets.is_empty() {
            return Err(problem("no device to grow".into()));
        }
        let flush = config.flush_policy().expect("validated");
        let mut grown_config = config.clone();
        let mut plan = Vec::with_capacity(targets.len());
        for &(index, to) in &targets {
            let entry = &config.devices[index];
            let shown = entry.path.display();
            let kind = entry.kind()?;
            if kind == pmem::DeviceKind::DevDax {
                return Err(problem(format!(
                    "device {index} ({shown}) is a device-DAX device: its size is its \
                     namespace's (add another device with `locus extend --device` instead)"
                )));
            }
            let opened = &volume.devices[index];
            let superblock = opened.superblock.clone();
            let actual = opened.unrecorded.unwrap_or(superblock.capacity_bytes);
            let before = superblock.capacity_bytes;
            let after = match to {
                GrowTo::Bytes(bytes) => bytes,
                GrowTo::By(bytes) => before
                    .checked_add(bytes)
                    .ok_or_else(|| problem(format!("{before} + {bytes} bytes overflows")))?,
            };
            if after <= before {
                return Err(problem(format!(
                    "device {index} ({shown}) has {before} bytes; growing it to {after} would \
                     not add any (locus never shrinks a device)"
                )));
            }
            if after > crate::address::MAX_OFFSET + 1 {
                return Err(problem(format!(
                    "device {index} ({shown}): {after} bytes is past the {} a device may have",
                    crate::address::MAX_OFFSET + 1
                )));
            }
            if actual > after {
                return Err(problem(format!(
                    "device {index} ({shown}) has {actual} bytes already, more than {after}: a \
                     grow stopped before recording its size (`locus extend --volume {}` \
                     records it)",
                    dir.display()
                )));
            }
            grown_config.devices[index].size_bytes = Some(after);
            plan.push((index, kind, superblock, after));
        }
        check_emulated(dir, &grown_config)?;
        check_room(dir, &grown_config)?;
        drop(volume);

        let mut grown = Vec::with_capacity(plan.len());
        // The list as far as the devices grown so far: a later one that fails leaves it true.
        let mut written = config.clone();
        for (index, kind, superblock, after) in plan {
            let entry = &config.devices[index];
            let device = pmem::Device::grow(&entry.spec(kind, flush), after)?;
            superblock.grown(after).rewrite(device.region())?;
            written.devices[index].size_bytes = Some(after);
            written.write(dir)?;
            grown.push(Grown {
                index: index as u32,
                path: entry.path.clone(),
                before: superblock.capacity_bytes,
                after,
            });
        }
        Ok(grown)
    }

    /// The volume in `dir` held for a change of its devices: its lock (device files locked
    /// too), its list, and its devices opened for a short job, an interrupted extension
    /// finished.
    fn open_to_change(dir: &Path, topology: Topology) -> Result<(VolumeLock, VolumeConfig, Self)> {
        let (mut lock, config) = VolumeLock::acquire_existing(dir)?;
        lock.lock_devices(&config)?;
        let mut volume = Self::open_listed(&config, topology)?;
        volume.finish_extension()?;
        Ok((lock, config, volume))
    }

    /// Records the size of every device of the volume in `dir` that is longer than its
    /// superblock says (a [`Volume::grow`] that stopped after lengthening it), allocating
    /// its whole length first (as the grow would have), and corrects
    /// `locus.toml` where its size of a device is not the recorded one. Returns the devices
    /// whose superblock it rewrote.
    pub fn finish_growth(dir: &Path, topology: Topology) -> Result<Vec<Grown>> {
        let (_lock, mut config, volume) = Self::open_to_change(dir, topology)?;
        let flush = config.flush_policy().expect("validated");
        let mut grown = Vec::new();
        let mut corrected = false;
        for (entry, opened) in config.devices.iter_mut().zip(&volume.devices) {
            let kind = entry.kind()?;
            if let Some(bytes) = opened.unrecorded {
                // Allocated before it is recorded: a file lengthened by hand (or by a grow
                // whose allocation never ran) must not leave pages a write could fault on.
                let whole = if kind == pmem::DeviceKind::DevDax {
                    entry.open_source(flush, false)?.region
                } else {
                    pmem::Device::grow(&entry.spec(kind, flush), bytes)?
                        .region()
                        .clone()
                };
                opened.superblock.grown(bytes).rewrite(&whole)?;
                grown.push(Grown {
                    index: opened.superblock.device_index,
                    path: entry.path.clone(),
                    before: opened.superblock.capacity_bytes,
                    after: bytes,
                });
            }
            let recorded = opened
                .unrecorded
                .unwrap_or(opened.superblock.capacity_bytes);
            if kind != pmem::DeviceKind::DevDax && entry.size_bytes != Some(recorded) {
                entry.size_bytes = Some(recorded);
                corrected = true;
            }
        }
        if corrected {
            config.write(dir)?;
        }
        if !grown.is_empty() {
            tracing::info!(
                devices = grown.len(),
                "recorded the size of devices a grow had lengthened"
            );
        }
        Ok(grown)
    }

    /// Devices longer than their superblock records (`locus extend --grow` stopped before
    /// recording): (index, bytes recorded, bytes the device has).
    pub fn unrecorded_growth(&self) -> Vec<(u32, u64, u64)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                d.unrecorded
                    .map(|bytes| (i as u32, d.superblock.capacity_bytes, bytes))
            })
            .collect()
    }
}

/// The index of `device` in `config`: a number is an index, anything else a path (the same
/// file under another path counts). The error names the volume's devices.
fn device_index(config: &VolumeConfig, device: &str) -> std::result::Result<usize, String> {
    let found = match device.parse::<usize>() {
        Ok(index) => (index < config.devices.len()).then_some(index),
        Err(_) => config
            .devices
            .iter()
            .position(|d| same_file(&d.path, Path::new(device))),
    };
    found.ok_or_else(|| {
        let listed: Vec<String> = config
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{i} {}", d.path.display()))
            .collect();
        format!(
            "the volume has no device {device} (its devices: {})",
            listed.join(", ")
        )
    })
}

/// Checks a device about to be added, creating nothing: its kind, a size where it is made
/// (at least the smallest device), and what it holds — read before it is created, which
/// empties a file: a device of this volume (never added twice) or, unless `force`, of
/// another volume is refused; this volume's superblock at an index past its `before`
/// devices is what an extension that stopped before `locus.toml` named the device left.
/// The error is the problem in words.
fn check_new_device(
    device: &DeviceConfig,
    flush: pmem::FlushPolicy,
    uuid: [u8; 16],
    before: u32,
    force: bool,
) -> std::result::Result<(), String> {
    let kind = device.kind().map_err(|e| e.to_string())?;
    let label = device.path.display().to_string();
    if kind != pmem::DeviceKind::DevDax {
        match device.size_bytes {
            None => return Err(missing_size(&device.path)),
            Some(size) if size < MIN_DEVICE_BYTES => {
                return Err(format!(
                    "device {label}: size {size} bytes; a device needs at least \
                     {MIN_DEVICE_BYTES}"
                ));
            }
            Some(_) => {}
        }
    }
    let held = device
        .path
        .exists()
        .then(|| pmem::Device::open(&device.spec(kind, flush)).ok())
        .flatten()
        .and_then(|d| Superblock::read_with_copy(d.region(), &label).ok())
        .map(|(superblock, _)| superblock);
    let Some(held) = held else {
        return Ok(());
    };
    let ours = held.volume_uuid == uuid;
    if ours && held.device_index < before {
        return Err(format!(
            "device {label} is device {} of this volume already (under another path)",
            held.device_index
        ));
    }
    if !ours && !force {
        return Err(format!(
            "device {label} holds device {} of volume {}; adding it destroys that volume's \
             data (--force to add it anyway)",
            held.device_index,
            hex(&held.volume_uuid)
        ));
    }
    Ok(())
}

/// The device count the superblocks of a volume's devices give together (`counts`, each
/// count they say): their one count, or — two counts, an extension interrupted after
/// `locus.toml` listed the new devices (a device at or past the smaller cannot say it) — the
/// larger. `None` for no count or three and more: the devices are not one volume.
pub(crate) fn agreed_count(counts: &std::collections::BTreeSet<u32>) -> Option<u32> {
    (1..=2)
        .contains(&counts.len())
        .then(|| *counts.last().expect("a count"))
}

/// Whether `a` and `b` name the same file (the same path, or the same inode when both exist).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if a == b {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
