//! The volume: devices joined into one global address space (the cluster manager), a buddy
//! allocator per device (the space manager), and the monitor that picks the device for
//! each allocation from the requesting node's latency order.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pmem::{DeviceKind, PersistenceMode, Region};
use topology::Topology;

use crate::address::{Extent, GlobalAddress};
use crate::buddy::{BuddyAllocator, PAGE_BYTES};
use crate::config::{DeviceConfig, VolumeConfig};
use crate::error::{Result, VolumeError};
use crate::lock::VolumeLock;
use crate::monitor::{Monitor, PeriodicCheck, Thresholds};
use crate::shards::{Change, ShardedAllocator};
use crate::superblock::{DATA_OFFSET_BYTES, MIN_DEVICE_BYTES, Superblock};

/// Largest single allocation (one extent): 64 GiB.
pub const MAX_ALLOC_BYTES: u64 = 64 << 30;

/// A device handed to format or open: where its memory is, and what is known about it.
#[derive(Debug, Clone)]
pub struct DeviceSource {
    /// How the device is named in messages (its path).
    pub label: String,
    /// The kind, when it came from a file (`None` for test regions).
    pub kind: Option<DeviceKind>,
    /// The whole device.
    pub region: Region,
    /// The node the device is on now, if known.
    pub node: Option<u32>,
}

/// How to open a volume.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Monitor thresholds.
    pub thresholds: Thresholds,
    /// How often the monitor's periodic check runs; `None` disables it.
    pub check_interval: Option<Duration>,
    /// Measured latencies to order devices by (else HMAT, else SLIT).
    pub probe: Option<topology::ProbeReport>,
    /// Smallest allocator shard: a device is split into one shard per CPU, but no shard is
    /// smaller than this (it is also the largest extent).
    pub shard_min_bytes: u64,
    /// Map every page of emulated devices at open ([`pmem::Device::prefault`]): for
    /// long-running users (`locus serve`); short commands and preloaded programs skip it.
    pub prefault: bool,
    /// Called first in each thread the volume starts (its monitor's periodic check), so
    /// that a host can mark them as its own (see `fs::FsOptions::on_thread`).
    pub on_thread: Option<fn()>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            thresholds: Thresholds::default(),
            check_interval: Some(Duration::from_secs(1)),
            probe: None,
            shard_min_bytes: 64 << 20,
            prefault: true,
            on_thread: None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct VolumeDevice {
    label: String,
    kind: Option<DeviceKind>,
    mode: PersistenceMode,
    node: Option<u32>,
    pub(crate) superblock: Superblock,
    /// The superblock on the device is not `superblock` yet: an extension was interrupted
    /// before it raised this device's count, or while it rewrote it (read from its copy).
    /// [`Volume::open`] rewrites it.
    pub(crate) stale: bool,
    /// The device's bytes, when more than the superblock's capacity: a `locus extend --grow`
    /// lengthened it and stopped before recording that ([`Volume::unrecorded_growth`]).
    /// `region` covers the recorded capacity only.
    pub(crate) unrecorded: Option<u64>,
    pub(crate) region: Region,
    allocator: ShardedAllocator,
}

/// One device's state, as `locus status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceStats {
    /// Index in the volume.
    pub index: u32,
    /// Path.
    pub path: String,
    /// Kind name ("emulated", "devdax", ...), if from a file.
    pub kind: Option<String>,
    /// Persistence mode, in words.
    pub persistence: String,
    /// Node now.
    pub node: Option<u32>,
    /// Node recorded at format.
    pub node_at_format: Option<u32>,
    /// Device size the volume uses (its superblock's).
    pub capacity_bytes: u64,
    /// The device's length when more than `capacity_bytes`: a grow stopped before recording
    /// it (`locus extend` records it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unrecorded_bytes: Option<u64>,
    /// Allocatable bytes.
    pub data_bytes: u64,
    /// Free allocatable bytes.
    pub free_bytes: u64,
    /// "candidate" or "fat".
    pub state: &'static str,
    /// Allocations served to a thread on the device's own node.
    pub allocations_local: u64,
    /// Allocations served to a thread on another node.
    pub allocations_remote: u64,
    /// Frees.
    pub frees: u64,
    /// Allocator shards (one per CPU, within the minimum shard size).
    pub allocator_shards: usize,
}

/// A formatted, open volume.
#[derive(Debug)]
pub struct Volume {
    dir: Option<PathBuf>,
    uuid: [u8; 16],
    pub(crate) devices: Vec<VolumeDevice>,
    monitor: Arc<Monitor>,
    topology: Topology,
    /// The node of each CPU, by CPU number (0 for a CPU the topology does not name): every
    /// write asks for its caller's node, so this is an index, not a search of the nodes.
    cpu_nodes: Vec<u32>,
    // Dropped first: stop the checker before the monitor goes.
    _check: Option<PeriodicCheck>,
    _lock: Option<VolumeLock>,
}

impl Volume {
    /// Writes a superblock to every device, making them one new volume. Devices are
    /// numbered in the order given.
    pub fn format_devices(devices: &[DeviceSource], uuid: [u8; 16]) -> Result<()> {
        if devices.is_empty() {
            return Err(VolumeError::Mismatch {
                problem: "a volume needs at least one device".into(),
            });
        }
        if devices.len() > crate::address::MAX_DEVICES as usize {
            return Err(VolumeError::Mismatch {
                problem: format!("{} devices; at most 256", devices.len()),
            });
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        for device in devices {
            if device.region.len() < MIN_DEVICE_BYTES {
                return Err(VolumeError::BadRequest {
                    len_bytes: device.region.len(),
                    problem: format!(
                        "device {} is smaller than {MIN_DEVICE_BYTES} bytes",
                        device.label
                    ),
                });
            }
        }
        for (index, device) in devices.iter().enumerate() {
            let superblock = Superblock::new(
                uuid,
                index as u32,
                devices.len() as u32,
                device.node,
                device.region.len(),
                now,
            );
            superblock.write(&device.region)?;
        }
        Ok(())
    }

    /// Opens the volume made of `devices` (in any order): checks every superblock, that they
    /// are one volume and all present, and builds allocators with every page free. Call
    /// [`Volume::mark_owned`] with the owner's extents before allocating.
    pub fn open_devices(
        devices: Vec<DeviceSource>,
        topology: Topology,
        options: &OpenOptions,
    ) -> Result<Self> {
        if devices.is_empty() {
            return Err(VolumeError::Mismatch {
                problem: "no devices".into(),
            });
        }
        let mut opened: Vec<VolumeDevice> = Vec::with_capacity(devices.len());
        for source in devices {
            let (superblock, from_copy) =
                Superblock::read_with_copy(&source.region, &source.label)?;
            if let (Some(now), Some(then)) = (source.node, superblock.node())
                && now != then
            {
                tracing::warn!(
                    device = %source.label,
                    node_at_format = then,
                    node_now = now,
                    "device moved to another NUMA node since format; allocation follows where it is now"
                );
            }
            let pages = superblock.data_bytes / PAGE_BYTES;
            let len = source.region.len();
            let (region, unrecorded) = if len > superblock.capacity_bytes {
                tracing::warn!(
                    device = %source.label,
                    recorded = superblock.capacity_bytes,
                    bytes = len,
                    "device is larger than its superblock records (a grow stopped before \
                     recording it; `locus extend` finishes it): the rest stays unused"
                );
                (
                    source.region.slice(0, superblock.capacity_bytes)?,
                    Some(len),
                )
            } else {
                (source.region, None)
            };
            opened.push(VolumeDevice {
                mode: region.mode(),
                node: source.node.or(superblock.node()),
                allocator: ShardedAllocator::new(
                    pages,
                    shard_count(options, topology.cpu_count(), pages),
                ),
                label: source.label,
                kind: source.kind,
                region,
                superblock,
                stale: from_copy,
                unrecorded,
            });
        }
        let uuid = opened[0].superblock.volume_uuid;
        for device in &opened {
            if device.superblock.volume_uuid != uuid {
                return Err(VolumeError::Mismatch {
                    problem: format!(
                        "{} belongs to volume {}, but {} belongs to volume {}",
                        device.label,
                        hex(&device.superblock.volume_uuid),
                        opened[0].label,
                        hex(&uuid)
                    ),
                });
            }
        }
        let count = extended_count(&opened)?;
        for device in &mut opened {
            if device.superblock.device_count != count {
                device.superblock.device_count = count;
                device.stale = true;
            }
        }
        opened.sort_by_key(|d| d.superblock.device_index);
        for (expected, device) in opened.iter().enumerate() {
            let index = device.superblock.device_index as usize;
            if index != expected {
                let problem = if index < expected {
                    format!(
                        "{} and {} are both device {index}",
                        opened[expected - 1].label,
                        device.label
                    )
                } else {
                    format!("device {expected} of volume {} is missing", hex(&uuid))
                };
                return Err(VolumeError::Mismatch { problem });
            }
        }
        if opened.len() != count as usize {
            return Err(VolumeError::Mismatch {
                problem: format!(
                    "volume {} has {count} devices but {} were given; device {} is missing",
                    hex(&uuid),
                    opened.len(),
                    opened.len()
                ),
            });
        }

        let orders = device_orders(&topology, &opened, options.probe.as_ref())?;
        let capacities: Vec<u64> = opened.iter().map(|d| d.superblock.data_bytes).collect();
        let monitor = Arc::new(Monitor::new(
            options.thresholds,
            capacities.clone(),
            &capacities,
            orders,
        ));
        let check = options.check_interval.map(|interval| {
            PeriodicCheck::start(Arc::clone(&monitor), interval, options.on_thread)
        });
        Ok(Self {
            dir: None,
            uuid,
            devices: opened,
            monitor,
            cpu_nodes: cpu_nodes(&topology),
            topology,
            _check: check,
            _lock: None,
        })
    }

    /// Formats the devices described by `config` into a new volume in `dir` and writes
    /// `dir/locus.toml`. Refuses, unless `force`, when `dir` already lists devices that carry a
    /// locus superblock (a config written by hand before the first format is fine).
    pub fn format(dir: &Path, config: &VolumeConfig, force: bool) -> Result<[u8; 16]> {
        // Before the lock (which creates the directory): a refusal leaves nothing behind.
        for device in &config.devices {
            device.kind()?;
            // A device file is created in an existing directory (the volume directory is
            // made below).
            let parent = device.parent_dir();
            if !device.path.exists() && !parent.is_dir() && parent != dir {
                return Err(VolumeError::Config {
                    path: dir.join(crate::config::CONFIG_FILE),
                    problem: format!(
                        "device {}: its directory {} does not exist (locus creates device \
                         files, and the volume directory, but no other directory)",
                        device.path.display(),
                        parent.display()
                    ),
                });
            }
        }
        check_emulated(dir, config)?;
        check_room(dir, config)?;
        let mut lock = VolumeLock::acquire(dir)?;
        // Devices that exist already may belong to a volume open elsewhere.
        lock.lock_devices(config)?;
        if !force && Self::holds_volume(dir)? {
            return Err(VolumeError::AlreadyFormatted {
                dir: dir.to_owned(),
            });
        }
        config.validate(&dir.join(crate::config::CONFIG_FILE))?;
        let mut written = config.clone();
        // Device files this call made (and whether each existed before): given back when the
        // format fails after making them, so a refused format does not keep their room.
        let mut made: Vec<(PathBuf, bool)> = Vec::new();
        let formatted = Self::make_and_format(dir, config, &mut written, &mut made, &mut lock);
        if formatted.is_err() {
            for (path, existed) in &made {
                pmem::give_back(path, *existed);
            }
        }
        formatted
    }

    /// [`Volume::format`] once the devices are checked and locked: makes each device (noting
    /// in `made` the files it made), writes the superblocks and `locus.toml`.
    fn make_and_format(
        dir: &Path,
        config: &VolumeConfig,
        written: &mut VolumeConfig,
        made: &mut Vec<(PathBuf, bool)>,
        lock: &mut VolumeLock,
    ) -> Result<[u8; 16]> {
        let flush = config.flush_policy().expect("validated");
        let mut sources = Vec::new();
        for (device, entry) in config.devices.iter().zip(&mut written.devices) {
            let kind = device.kind()?;
            entry.kind = Some(kind.name().to_owned());
            let spec = device.spec(kind, flush);
            let opened = if kind == DeviceKind::DevDax {
                pmem::Device::open(&spec)?
            } else {
                let Some(size) = device.size_bytes else {
                    return Err(VolumeError::Config {
                        path: dir.join(crate::config::CONFIG_FILE),
                        problem: missing_size(&device.path),
                    });
                };
                let existed = device.path.exists();
                let created = pmem::Device::create(&spec, size)?;
                made.push((device.path.clone(), existed));
                created
            };
            entry.size_bytes = Some(opened.size_bytes());
            let node = device.node.or_else(|| opened.numa_node());
            sources.push(DeviceSource {
                label: device.path.display().to_string(),
                kind: Some(kind),
                region: opened.region().clone(),
                node,
            });
        }
        // The devices just created, before a superblock makes them a volume.
        lock.lock_devices(config)?;
        let uuid: [u8; 16] = rand::random();
        Self::format_devices(&sources, uuid)?;
        written.write(dir)?;
        Ok(uuid)
    }

    /// Whether `dir/locus.toml` lists a device that carries a locus superblock.
    fn holds_volume(dir: &Path) -> Result<bool> {
        let Some(existing) = VolumeConfig::read(dir)? else {
            return Ok(false);
        };
        let flush = existing.flush_policy().expect("validated");
        // Only devices whose kind was recorded at format can hold a superblock of ours.
        for device in existing.devices.iter().filter(|d| d.kind.is_some()) {
            if let Ok(source) = device.open_source(flush, false)
                && Superblock::read(&source.region, &source.label).is_ok()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Opens the volume in `dir`, locking it against other processes.
    pub fn open(dir: &Path, topology: Topology, options: &OpenOptions) -> Result<Self> {
        let (lock, config) = VolumeLock::acquire_existing(dir)?;
        let flush = config.flush_policy().expect("validated");
        let sources = config
            .devices
            .iter()
            .map(|device| device.open_source(flush, options.prefault))
            .collect::<Result<Vec<_>>>()?;
        let mut volume = Self::open_devices(sources, topology, options)?;
        volume.dir = Some(dir.to_owned());
        volume._lock = Some(lock);
        volume.finish_extension()?;
        Ok(volume)
    }

    /// Opens the devices of the volume in `dir` a second time, without its lock, for the
    /// process that holds it open to read the media as another opener would see them (a
    /// mount server checking its own volume while its file system holds still). Nothing may
    /// be written through it; its allocator starts all free like [`Volume::open`]'s, and no
    /// monitor thread runs.
    pub fn open_view(dir: &Path, topology: Topology) -> Result<Self> {
        let config = VolumeConfig::read(dir)?.ok_or_else(|| VolumeError::NoVolume {
            dir: dir.to_owned(),
        })?;
        let mut volume = Self::open_listed(&config, topology)?;
        volume.dir = Some(dir.to_owned());
        Ok(volume)
    }

    /// The devices `config` lists, opened for a short job: no page mapped ahead, no monitor
    /// thread, nothing written (a stale superblock stays stale).
    pub(crate) fn open_listed(config: &VolumeConfig, topology: Topology) -> Result<Self> {
        let flush = config.flush_policy().expect("validated");
        let sources = config
            .devices
            .iter()
            .map(|device| device.open_source(flush, false))
            .collect::<Result<Vec<_>>>()?;
        let options = OpenOptions {
            check_interval: None,
            prefault: false,
            ..OpenOptions::default()
        };
        Self::open_devices(sources, topology, &options)
    }

    /// The volume's identity.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// The volume directory, when opened from one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// The topology the volume orders devices by.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The monitor (for status and tests).
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    /// Marks extents the owner already holds as allocated (the owner reports them all at
    /// open, before allocating). An extent outside the data space or owned twice is an error
    /// and nothing of it is marked.
    pub fn mark_owned(&self, extents: impl IntoIterator<Item = Extent>) -> Result<()> {
        for extent in extents {
            self.change_pages(
                &extent,
                BuddyAllocator::reserve,
                BuddyAllocator::free,
                false,
            )?;
        }
        Ok(())
    }

    /// Gives the monitor every device's exact free space and re-decides candidates, fat
    /// devices and targets now (rather than at the next periodic check): after a large
    /// `mark_owned`, before reporting targets.
    pub fn refresh_targets(&self) {
        for (index, device) in self.devices.iter().enumerate() {
            self.monitor
                .update(index as u32, device.allocator.free_pages() * PAGE_BYTES);
        }
        self.monitor.check_all();
    }

    /// The device an allocation for a thread on `node` should use now (Algorithm 1's
    /// Decide_Target_MBS): O(1).
    pub fn decide_target(&self, node: u32) -> Option<u32> {
        self.monitor.decide_target(node)
    }

    /// Allocates `len_bytes` (rounded up to 4 KiB) for a thread on `node`: from the nearest
    /// candidate device, falling through the candidates in latency order when one cannot
    /// hold it, then the fat devices; `NoSpace` when none can.
    pub fn alloc(&self, len_bytes: u64, node: u32) -> Result<Extent> {
        let pages = check_len(len_bytes)?;
        let order = self
            .monitor
            .order(node)
            .ok_or(VolumeError::UnknownNode { node })?;
        if let Some(target) = self.monitor.decide_target(node)
            && let Some(extent) = self.try_alloc(target, pages, node)
        {
            return Ok(extent);
        }
        for fat_pass in [false, true] {
            for &device in order {
                if self.monitor.is_fat(device) == fat_pass
                    && let Some(extent) = self.try_alloc(device, pages, node)
                {
                    return Ok(extent);
                }
            }
        }
        Err(VolumeError::NoSpace { len_bytes })
    }

    /// Allocates for the calling thread, on the node of the CPU it runs on.
    pub fn alloc_local(&self, len_bytes: u64) -> Result<Extent> {
        self.alloc(len_bytes, self.current_node())
    }

    /// Allocates `len_bytes` from device `device` only.
    pub fn alloc_on(&self, device: u32, len_bytes: u64) -> Result<Extent> {
        let pages = check_len(len_bytes)?;
        if device >= self.device_count() {
            return Err(VolumeError::BadRequest {
                len_bytes,
                problem: format!("no device {device}"),
            });
        }
        let node = self.devices[device as usize].node.unwrap_or(u32::MAX);
        self.try_alloc(device, pages, node)
            .ok_or(VolumeError::NoSpace { len_bytes })
    }

    /// Returns an extent to its device.
    pub fn free(&self, extent: Extent) -> Result<()> {
        self.change_pages(&extent, BuddyAllocator::free, BuddyAllocator::reserve, true)
    }

    /// Applies `change` (reserve or free) to an extent's pages, undoing it with `undo` if part
    /// is refused, and tells the monitor when the device's published free space moved.
    fn change_pages(
        &self,
        extent: &Extent,
        change: Change,
        undo: Change,
        freeing: bool,
    ) -> Result<()> {
        let (device, first_page, pages) = self.locate(extent)?;
        let published = device
            .allocator
            .change(first_page, pages, change, undo, freeing)
            .map_err(|problem| VolumeError::BadExtent {
                start: extent.start,
                len_bytes: extent.len_bytes,
                problem,
            })?;
        if let Some(free_pages) = published {
            self.monitor
                .update(extent.device(), free_pages * PAGE_BYTES);
        }
        Ok(())
    }

    /// The persistent memory of an extent.
    pub fn region(&self, extent: &Extent) -> Result<Region> {
        let device = self.device(extent.device(), extent)?;
        Ok(device
            .region
            .slice(extent.start.offset(), extent.len_bytes)?)
    }

    /// A whole device, addressed by the offsets of its global addresses: the file system
    /// reads and writes extents through it without building a region per access.
    pub fn device_region(&self, device: u32) -> Result<Region> {
        self.devices
            .get(device as usize)
            .map(|d| d.region.clone())
            .ok_or_else(|| VolumeError::BadRequest {
                len_bytes: 0,
                problem: format!("no device {device}"),
            })
    }

    /// Orders every earlier store and flush to any device before any later store (one CPU
    /// fence; for traced devices, one per tracer): what "durable at the next fence" waits for.
    pub fn fence(&self) {
        pmem::fence_all(self.devices.iter().map(|d| &d.region));
    }

    /// The node a device sits on, if known.
    pub fn device_node(&self, device: u32) -> Option<u32> {
        self.devices.get(device as usize).and_then(|d| d.node)
    }

    /// The node of the CPU the calling thread runs on.
    pub fn current_node(&self) -> u32 {
        let cpu = topology::current_cpu().unwrap_or(0);
        self.cpu_nodes.get(cpu as usize).copied().unwrap_or(0)
    }

    /// The owner area of a device: bytes 4 KiB..2 MiB, outside the allocator, where the
    /// owner (the file system) keeps the anchors it must find without pointers.
    pub fn owner_area(&self, device: u32) -> Result<Region> {
        let device = self
            .devices
            .get(device as usize)
            .ok_or_else(|| VolumeError::BadRequest {
                len_bytes: 0,
                problem: format!("no device {device}"),
            })?;
        Ok(device
            .region
            .slice(PAGE_BYTES, DATA_OFFSET_BYTES - PAGE_BYTES)?)
    }

    /// Free bytes over every device, as last published by the allocators: a relaxed read,
    /// within 1/256 of each device's capacity of the truth (see [`Volume::free_bytes`]).
    pub fn free_bytes_published(&self) -> u64 {
        (0..self.device_count())
            .map(|d| self.monitor.free_bytes(d))
            .sum()
    }

    /// Free bytes over every device, exactly (takes every allocator shard's lock).
    pub fn free_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.allocator.free_pages() * PAGE_BYTES)
            .sum()
    }

    /// Bytes the devices hold for allocation in all (their data areas).
    pub fn data_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.superblock.data_bytes).sum()
    }

    /// Every device's state.
    pub fn stats(&self) -> Vec<DeviceStats> {
        self.devices
            .iter()
            .enumerate()
            .map(|(index, device)| (index, device, device.allocator.counters()))
            .map(|(index, device, counters)| DeviceStats {
                index: index as u32,
                path: device.label.clone(),
                kind: device.kind.map(|k| k.name().to_owned()),
                persistence: device.mode.to_string(),
                node: device.node,
                node_at_format: device.superblock.node(),
                capacity_bytes: device.superblock.capacity_bytes,
                unrecorded_bytes: device.unrecorded,
                data_bytes: device.superblock.data_bytes,
                free_bytes: device.allocator.free_pages() * PAGE_BYTES,
                state: if self.monitor.is_fat(index as u32) {
                    "fat"
                } else {
                    "candidate"
                },
                allocations_local: counters.local,
                allocations_remote: counters.remote,
                frees: counters.frees,
                allocator_shards: device.allocator.shard_count(),
            })
            .collect()
    }

    /// The devices in the order node `node` uses them.
    pub fn device_order(&self, node: u32) -> Option<Vec<u32>> {
        self.monitor.order(node).map(<[u32]>::to_vec)
    }

    fn try_alloc(&self, device_index: u32, pages: u64, node: u32) -> Option<Extent> {
        let device = &self.devices[device_index as usize];
        let hint = topology::current_cpu().unwrap_or(0) as usize;
        let local = device.node == Some(node);
        let (first_page, published) = device.allocator.alloc(pages, hint, local)?;
        if let Some(free_pages) = published {
            self.monitor.update(device_index, free_pages * PAGE_BYTES);
        }
        Some(Extent {
            start: GlobalAddress::new(device_index, DATA_OFFSET_BYTES + first_page * PAGE_BYTES),
            len_bytes: pages * PAGE_BYTES,
        })
    }

    fn device(&self, index: u32, extent: &Extent) -> Result<&VolumeDevice> {
        self.devices
            .get(index as usize)
            .ok_or_else(|| VolumeError::BadExtent {
                start: extent.start,
                len_bytes: extent.len_bytes,
                problem: format!("the volume has no device {index}"),
            })
    }

    /// The device, first page and page count of an extent, checked against the data space.
    fn locate(&self, extent: &Extent) -> Result<(&VolumeDevice, u64, u64)> {
        let device = self.device(extent.device(), extent)?;
        let bad = |problem: String| VolumeError::BadExtent {
            start: extent.start,
            len_bytes: extent.len_bytes,
            problem,
        };
        let offset = extent.start.offset();
        if offset < DATA_OFFSET_BYTES
            || !offset.is_multiple_of(PAGE_BYTES)
            || !extent.len_bytes.is_multiple_of(PAGE_BYTES)
        {
            return Err(bad("not page-aligned allocatable space".into()));
        }
        let first_page = (offset - DATA_OFFSET_BYTES) / PAGE_BYTES;
        let pages = extent.len_bytes / PAGE_BYTES;
        if pages == 0 || first_page + pages > device.superblock.data_bytes / PAGE_BYTES {
            return Err(bad(format!(
                "outside the device's {} data bytes",
                device.superblock.data_bytes
            )));
        }
        Ok((device, first_page, pages))
    }
}

/// One allocator shard per CPU, none smaller than `shard_min_bytes`.
fn shard_count(options: &OpenOptions, cpus: usize, pages: u64) -> usize {
    let by_size = (pages * PAGE_BYTES / options.shard_min_bytes.max(PAGE_BYTES)).max(1);
    cpus.max(1).min(by_size as usize)
}

/// The volume's device count from its devices' superblocks. They agree, except after an
/// extension from `before` to `count` devices that was interrupted after `locus.toml` listed
/// the new devices ([`Volume::add_devices`]): then the devices it added (indexes `before`
/// and up, which a superblock saying `before` cannot have) say `count`, and each of the
/// others `before` or `count`. A third count is a mismatch.
fn extended_count(devices: &[VolumeDevice]) -> Result<u32> {
    let says = |d: &VolumeDevice| d.superblock.device_count;
    let counts: std::collections::BTreeSet<u32> = devices.iter().map(says).collect();
    if let Some(count) = crate::extend::agreed_count(&counts) {
        return Ok(count);
    }
    let (before, count) = (counts.first(), counts.last());
    let odd = devices
        .iter()
        .find(|d| Some(&says(d)) != before && Some(&says(d)) != count);
    if let Some(odd) = odd {
        let other = devices
            .iter()
            .find(|d| says(d) != says(odd))
            .expect("counts differ");
        return Err(VolumeError::Mismatch {
            problem: format!(
                "{} says the volume has {} devices, {} says {}",
                odd.label,
                says(odd),
                other.label,
                says(other)
            ),
        });
    }
    Err(VolumeError::Mismatch {
        problem: "no devices".into(),
    })
}

fn check_len(len_bytes: u64) -> Result<u64> {
    if len_bytes == 0 || len_bytes > MAX_ALLOC_BYTES {
        return Err(VolumeError::BadRequest {
            len_bytes,
            problem: format!("must be between 1 and {MAX_ALLOC_BYTES} bytes"),
        });
    }
    Ok(len_bytes.div_ceil(PAGE_BYTES))
}

/// For every node id, the devices in the order that node should use them: the topology's
/// candidate order of memory nodes, each node's devices by index, then devices whose node is
/// unknown.
fn device_orders(
    topology: &Topology,
    devices: &[VolumeDevice],
    probe: Option<&topology::ProbeReport>,
) -> Result<Vec<Vec<u32>>> {
    let max_node = topology.nodes.iter().map(|n| n.id).max().unwrap_or(0) as usize;
    let mut orders = vec![Vec::new(); max_node + 1];
    for node in &topology.nodes {
        let node_order = topology.candidate_order(node.id, probe)?.node_ids();
        let mut order: Vec<u32> = Vec::with_capacity(devices.len());
        for candidate in node_order {
            order.extend(
                devices
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| d.node == Some(candidate))
                    .map(|(i, _)| i as u32),
            );
        }
        for (index, _) in devices.iter().enumerate() {
            if !order.contains(&(index as u32)) {
                order.push(index as u32);
            }
        }
        orders[node.id as usize] = order;
    }
    Ok(orders)
}

/// Devices kept in files (emulated, DAX files, ordinary files), before any of them is
/// allocated: the bytes each file still lacks of its size, added up per file system, fit in
/// what that file system has free (blocks a device file already holds count as free:
/// formatting reuses them). A file system too small would otherwise be filled by the
/// allocation of one device and left full, or a later device of the same volume refused
/// after the earlier ones took their room.
pub(crate) fn check_room(dir: &Path, config: &VolumeConfig) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // Per file system (device number): the bytes lacking, the free bytes, a place to name.
    let mut per_fs: std::collections::BTreeMap<u64, (u64, u64, PathBuf)> = Default::default();
    for device in &config.devices {
        if matches!(device.kind(), Ok(DeviceKind::DevDax) | Err(_)) {
            continue;
        }
        let Some(size) = device.size_bytes else {
            continue; // named by the size check that follows (missing or existing device)
        };
        let held = std::fs::metadata(&device.path).map_or(0, |m| m.blocks() * 512);
        // The directory may not exist yet (the volume directory is made by the format): its
        // nearest existing ancestor is on the file system it will be on.
        let Some(existing) = device.parent_dir().ancestors().find(|p| p.is_dir()) else {
            continue;
        };
        let (Ok(meta), Ok(free)) = (std::fs::metadata(existing), pmem::available_bytes(existing))
        else {
            continue;
        };
        let entry = per_fs
            .entry(meta.dev())
            .or_insert_with(|| (0, free, existing.to_owned()));
        entry.0 += size.saturating_sub(held);
        if entry.0 > entry.1 {
            return Err(VolumeError::Config {
                path: dir.join(crate::config::CONFIG_FILE),
                problem: format!(
                    "device {}: the device files on the file system at {} need {} bytes more \
                     than they hold, and it has {} free; give a smaller size (the size= of the \
                     device or of the grow), or free room there",
                    device.path.display(),
                    entry.2.display(),
                    entry.0,
                    entry.1
                ),
            });
        }
    }
    Ok(())
}

/// Emulated devices, before any page of them is allocated: each names its node, and the
/// devices of each node fit in that node's free memory (pages a device file already holds
/// count as free: formatting reuses them). Without this a device larger than its node's
/// memory gets the process killed by the OOM killer, halfway through allocating it. That
/// the files fit their tmpfs is [`check_room`]'s.
pub(crate) fn check_emulated(dir: &Path, config: &VolumeConfig) -> Result<()> {
    let problem = |problem: String| VolumeError::Config {
        path: dir.join(crate::config::CONFIG_FILE),
        problem,
    };
    let emulated: Vec<&DeviceConfig> = config
        .devices
        .iter()
        .filter(|d| matches!(d.kind(), Ok(DeviceKind::Emulated)))
        .collect();
    if emulated.is_empty() {
        return Ok(());
    }
    let topology = Topology::read_live().map_err(|e| {
        problem(format!(
            "reading each node's free memory for emulated devices: {e}"
        ))
    })?;
    let hidden = unattributed_free(&topology.nodes, machine_free_bytes());
    let mut per_node: std::collections::BTreeMap<u32, u64> = Default::default();
    for device in &emulated {
        let shown = device.path.display();
        let Some(size) = device.size_bytes else {
            continue; // named by the size check that follows (missing or existing device)
        };
        let Some(node) = device.node else {
            return Err(problem(format!(
                "device {shown} is emulated: give the node its pages are bound to \
                 (`--device {shown},node=N`; `locus topology` lists the nodes)"
            )));
        };
        let held = std::fs::metadata(&device.path).map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        });
        *per_node.entry(node).or_default() += size.saturating_sub(held);
        let Some((index, found)) = topology
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.id == node)
        else {
            return Err(problem(format!(
                "device {shown}: node {node} is not an online NUMA node of this machine"
            )));
        };
        let wanted = per_node[&node];
        // Free memory and what the kernel drops on demand (page cache, reclaimable slab):
        // a machine that has been reading files has little of its memory free.
        let free = found.memory_free_bytes + hidden[index];
        let available = free + found.memory_reclaimable_bytes;
        if wanted > available {
            return Err(problem(format!(
                "device {shown}: emulated devices on node {node} need {wanted} more bytes of \
                 memory and the node has {available} ({free} free, {} in caches the kernel \
                 can drop); give a smaller size (the size= of the device or of the grow)",
                found.memory_reclaimable_bytes
            )));
        }
    }
    Ok(())
}

/// The node of each CPU of `topology`, indexed by CPU number.
fn cpu_nodes(topology: &Topology) -> Vec<u32> {
    let map = topology.cpu_to_node();
    let len = map.keys().next_back().map_or(0, |&cpu| cpu as usize + 1);
    let mut nodes = vec![0; len];
    for (cpu, node) in map {
        nodes[cpu as usize] = node;
    }
    nodes
}

/// `MemFree` of the whole machine (/proc/meminfo), in bytes; `None` where it cannot be read.
fn machine_free_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("MemFree:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// Free memory the machine counts (`machine_free`) beyond what its nodes' `meminfo` files add
/// up to, shared among `nodes` in proportion to their memory (one entry per node, in order).
/// Some kernels hand a node's memory to the page allocator in steps, as allocations ask for
/// it, and a node's `meminfo` shows only what was handed over while the machine's counts
/// all of it: on a 24 GiB, one-node VM (Linux 6.18) node 0 read 8 GB total and 3.7 GB free
/// while the machine had 20 GB free, and 16 GB total once an 8 GB tmpfs file had been
/// written. Where the two agree, as they normally do, this is 0 for every node.
fn unattributed_free(nodes: &[topology::Node], machine_free: Option<u64>) -> Vec<u64> {
    let attributed: u64 = nodes.iter().map(|n| n.memory_free_bytes).sum();
    let hidden = machine_free.map_or(0, |free| free.saturating_sub(attributed));
    let total: u64 = nodes.iter().map(|n| n.memory_bytes).sum();
    nodes
        .iter()
        .map(|n| match total {
            0 => 0,
            _ => (u128::from(hidden) * u128::from(n.memory_bytes) / u128::from(total)) as u64,
        })
        .collect()
}

/// Why a device with no size cannot be formatted, in the words of the user's mistake.
pub(crate) fn missing_size(path: &Path) -> String {
    let shown = path.display();
    if std::fs::symlink_metadata(path).is_ok() {
        return format!(
            "device {shown}: an existing file is formatted at the size it is given \
             (`--device {shown},size=SIZE`, or `size_bytes` in locus.toml)"
        );
    }
    if path.starts_with("/dev") && !path.starts_with("/dev/shm") {
        format!(
            "device {shown} does not exist (device-DAX devices appear as /dev/daxX.Y once their \
             namespace is in devdax mode; `locus topology` lists the ones this machine has)"
        )
    } else {
        format!(
            "device {shown} does not exist; to create it as a file, give its size: \
             `--device {shown},size=SIZE`"
        )
    }
}

/// Lower-case hex of a uuid.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The embedded default: one emulated device per node with memory, under `dir`, each bound
/// to its node and sized `size_bytes` or min(a quarter of the node's free memory, 4 GiB),
/// never more than the tmpfs under `dir` can hold.
pub fn default_config(
    dir: &Path,
    topology: &Topology,
    size_bytes: Option<u64>,
) -> Result<VolumeConfig> {
    const MAX_DEFAULT_BYTES: u64 = 4 << 30;
    const ALIGN: u64 = 2 << 20;
    std::fs::create_dir_all(dir).map_err(|source| VolumeError::Io {
        path: dir.to_owned(),
        action: "create the volume directory",
        source,
    })?;
    let nodes: Vec<&topology::Node> = topology
        .nodes
        .iter()
        .filter(|n| n.memory_bytes > 0)
        .collect();
    let available = filesystem_available(dir)?;
    let share = available / (nodes.len() as u64 + 1);
    let mut devices = Vec::new();
    for node in nodes {
        let size = match size_bytes {
            Some(size) => size,
            None => {
                (node.memory_free_bytes / 4)
                    .min(MAX_DEFAULT_BYTES)
                    .min(share)
                    / ALIGN
                    * ALIGN
            }
        };
        if size < MIN_DEVICE_BYTES {
            return Err(VolumeError::BadRequest {
                len_bytes: size,
                problem: format!(
                    "node {} leaves only {size} bytes for its emulated device; at least {MIN_DEVICE_BYTES} are needed",
                    node.id
                ),
            });
        }
        devices.push(DeviceConfig {
            path: dir.join(format!("node{}.pmem", node.id)),
            kind: Some(DeviceKind::Emulated.name().to_owned()),
            node: Some(node.id),
            size_bytes: Some(size),
        });
    }
    Ok(VolumeConfig {
        flush: "auto".into(),
        devices,
    })
}

fn filesystem_available(dir: &Path) -> Result<u64> {
    pmem::available_bytes(dir).map_err(|source| VolumeError::Io {
        path: dir.to_owned(),
        action: "statfs of the volume directory",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::unattributed_free;

    fn node(id: u32, total: u64, free: u64) -> topology::Node {
        topology::Node {
            id,
            cpus: vec![id],
            memory_bytes: total,
            memory_free_bytes: free,
            memory_reclaimable_bytes: 0,
            distances: vec![10],
            cpu_less: false,
            hmat_read_latency_ns: None,
            hmat: None,
        }
    }

    const G: u64 = 1 << 30;

    #[test]
    fn free_memory_the_nodes_do_not_show_goes_to_them_by_size() {
        // Counters that agree (or a machine total that cannot be read): nothing added.
        let nodes = [node(0, 8 * G, 3 * G), node(1, 8 * G, 2 * G)];
        assert_eq!(unattributed_free(&nodes, Some(5 * G)), [0, 0]);
        assert_eq!(unattributed_free(&nodes, Some(4 * G)), [0, 0]);
        assert_eq!(unattributed_free(&nodes, None), [0, 0]);
        // The one-node VM: 20 GiB free on the machine, 3.5 GiB in the node's file.
        let one = [node(0, 8 * G, 7 * G / 2)];
        assert_eq!(unattributed_free(&one, Some(20 * G)), [33 * G / 2]);
        // Two nodes of 4 and 12 GiB share 8 GiB unseen in that ratio.
        let two = [node(0, 4 * G, G), node(1, 12 * G, G)];
        assert_eq!(unattributed_free(&two, Some(10 * G)), [2 * G, 6 * G]);
    }
}
