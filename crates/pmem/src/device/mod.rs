//! Devices: a persistent-memory backing store, mapped whole, with the region that reaches it.
//!
//! One backend per file: `emulated` (a tmpfs file bound to a NUMA node), `dax_file` (a file on
//! an fs-dax mount, `MAP_SYNC`), `devdax` (a device-DAX character device), `file` (an ordinary
//! file, persisted with `msync`).

mod dax_file;
mod devdax;
mod emulated;
mod file;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::cpu::FlushInstruction;
use crate::error::{PmemError, Result};
use crate::mapping::{MapFlags, Mapping};
use crate::region::{Backing, Inner, PersistenceMode, Region};

/// The kind of backing store a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A file on tmpfs whose pages are bound to one NUMA node: locus's emulated persistent
    /// memory. Survives process crashes, not reboots.
    Emulated,
    /// A file on a file system mounted with `-o dax`, mapped with `MAP_SYNC`.
    DaxFile,
    /// A device-DAX character device (`/dev/daxX.Y`).
    DevDax,
    /// An ordinary file on a disk, persisted with `msync`.
    File,
}

impl DeviceKind {
    /// The name used in `locus.toml` and in output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Emulated => "emulated",
            Self::DaxFile => "daxfile",
            Self::DevDax => "devdax",
            Self::File => "file",
        }
    }

    /// Parses a name written by [`DeviceKind::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Emulated, Self::DaxFile, Self::DevDax, Self::File]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Guesses the kind of `path`: a character device is device-DAX, a file on tmpfs is
    /// emulated, a file elsewhere is a DAX file if it can be mapped with `MAP_SYNC`, else an
    /// ordinary file. A path that does not exist yet is judged by its directory.
    pub fn detect(path: &Path) -> Result<Self> {
        if let Ok(metadata) = std::fs::metadata(path) {
            if metadata.file_type().is_char_device() {
                return Ok(Self::DevDax);
            }
            if metadata.file_type().is_block_device() {
                return Err(PmemError::WrongKind {
                    path: path.to_owned(),
                    problem: BLOCK_DEVICE.into(),
                });
            }
        }
        // A file still to be created is on the file system of its nearest existing
        // ancestor (its directory may be the volume directory, made later).
        let probe_path = path
            .ancestors()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .find(|p| p.exists())
            .unwrap_or(Path::new("."))
            .to_owned();
        let magic =
            crate::mapping::filesystem_magic(&probe_path).map_err(|source| PmemError::Io {
                path: probe_path.clone(),
                action: "statfs",
                source,
            })?;
        if magic == libc::TMPFS_MAGIC {
            return Ok(Self::Emulated);
        }
        let dax = if path.is_file() {
            dax_file::supports_map_sync(path)
        } else {
            dax_file::directory_supports_map_sync(&probe_path)
        };
        Ok(if dax { Self::DaxFile } else { Self::File })
    }
}

/// Why a block device (`/dev/pmemN`, an NVMe drive) is refused.
const BLOCK_DEVICE: &str = "a block device, which locus cannot map for direct stores; for a \
    persistent-memory namespace either make it device-DAX (`ndctl create-namespace --force \
    --reconfig=namespaceX.Y --mode=devdax`) and name /dev/daxX.Y, or put a DAX file system on \
    it (`mkfs.ext4 /dev/pmemN && mount -o dax /dev/pmemN /mnt/pmem`) and name a file there";

/// When to execute cache-line flushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Flush, unless the device's NVDIMM region reports a `cpu_cache` persistence domain
    /// (eADR), in which case fences suffice.
    #[default]
    Auto,
    /// Always flush.
    Always,
    /// Never flush (the platform has eADR); fences are still executed.
    Never,
}

/// What to open and how.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// The device path.
    pub path: PathBuf,
    /// Its kind.
    pub kind: DeviceKind,
    /// For emulated devices: the NUMA node the pages are bound to.
    pub node: Option<u32>,
    /// Flush policy.
    pub flush: FlushPolicy,
}

/// An open, mapped device.
#[derive(Debug)]
pub struct Device {
    spec: DeviceSpec,
    region: Region,
}

impl Device {
    /// Creates the backing store of `size_bytes` (files are created anew; a device-DAX
    /// device is used as it is and `size_bytes` is ignored) and maps it.
    pub fn create(spec: &DeviceSpec, size_bytes: u64) -> Result<Self> {
        let (mapping, mode) = match spec.kind {
            DeviceKind::Emulated => emulated::create(&spec.path, size_bytes, spec.node)?,
            DeviceKind::DaxFile => dax_file::create(&spec.path, size_bytes, spec.flush)?,
            DeviceKind::DevDax => devdax::open(&spec.path, spec.flush)?,
            DeviceKind::File => file::create(&spec.path, size_bytes)?,
        };
        Ok(Self::from_mapping(spec, mapping, mode))
    }

    /// Grows an existing backing store to `size_bytes` and maps it: the file is lengthened
    /// (what it holds stays where it is) and the new part allocated as `create` allocates a
    /// whole device — for an emulated device on its node. A store already that long is only
    /// mapped; a longer one is refused (a device never shrinks), and so is a device-DAX
    /// device, whose size is its namespace's.
    pub fn grow(spec: &DeviceSpec, size_bytes: u64) -> Result<Self> {
        let (mapping, mode) = match spec.kind {
            DeviceKind::Emulated => emulated::grow(&spec.path, size_bytes, spec.node)?,
            DeviceKind::DaxFile => dax_file::grow(&spec.path, size_bytes, spec.flush)?,
            DeviceKind::File => file::grow(&spec.path, size_bytes)?,
            DeviceKind::DevDax => {
                return Err(PmemError::WrongKind {
                    path: spec.path.clone(),
                    problem: "is a device-DAX device: its size is its namespace's and cannot \
                              be grown from here"
                        .into(),
                });
            }
        };
        Ok(Self::from_mapping(spec, mapping, mode))
    }

    /// Maps an existing backing store.
    pub fn open(spec: &DeviceSpec) -> Result<Self> {
        let (mapping, mode) = match spec.kind {
            DeviceKind::Emulated => emulated::open(&spec.path, spec.node)?,
            DeviceKind::DaxFile => dax_file::open(&spec.path, spec.flush)?,
            DeviceKind::DevDax => devdax::open(&spec.path, spec.flush)?,
            DeviceKind::File => file::open(&spec.path)?,
        };
        Ok(Self::from_mapping(spec, mapping, mode))
    }

    fn from_mapping(spec: &DeviceSpec, mapping: Mapping, mode: PersistenceMode) -> Self {
        let len = mapping.len() as u64;
        let region = Region::new(
            Inner {
                backing: Backing::Mapped(mapping),
                mode,
            },
            len,
        );
        Self {
            spec: spec.clone(),
            region,
        }
    }

    /// The whole device as a region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// What was opened.
    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }

    /// Maps every page of an emulated device now, writable (`MADV_POPULATE_READ` on tmpfs:
    /// `mapping::populate_advice`), then made huge pages (`MADV_COLLAPSE`, once per device
    /// file: `Mapping::collapse`): no page faults on the data path later, and placement
    /// queries see every page — worth it for a long-running server, not for a short command
    /// (a 4 GiB device takes ~0.3 s and maps 4 GiB into the process; its first collapse
    /// about 1.5 s per GiB more). Other kinds are left to fault on first use. Older kernels
    /// lack the calls; the pages then fault in on first use as well, 4 KiB at a time.
    pub fn prefault(&self) {
        if self.spec.kind != DeviceKind::Emulated {
            return;
        }
        if let Err(error) = self.region.populate() {
            tracing::debug!(path = %self.spec.path.display(), %error, "could not pre-fault the emulated device");
        }
    }

    /// How stores become durable on this device.
    pub fn mode(&self) -> PersistenceMode {
        self.region.mode()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.region.len()
    }

    /// The NUMA node the device is on: the node an emulated device is bound to, the
    /// `numa_node` sysfs reports for a device-DAX device or the block device under a DAX
    /// file, `None` for ordinary files or when unknown.
    pub fn numa_node(&self) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        match self.spec.kind {
            DeviceKind::Emulated => self.spec.node,
            DeviceKind::File => None,
            DeviceKind::DevDax => {
                let rdev = std::fs::metadata(&self.spec.path).ok()?.rdev();
                sysfs_numa_node(&format!(
                    "/sys/dev/char/{}:{}",
                    libc::major(rdev),
                    libc::minor(rdev)
                ))
            }
            DeviceKind::DaxFile => {
                let dev = std::fs::metadata(&self.spec.path).ok()?.dev();
                sysfs_numa_node(&format!(
                    "/sys/dev/block/{}:{}",
                    libc::major(dev),
                    libc::minor(dev)
                ))
            }
        }
    }

    /// The NUMA node of the pages at `samples` evenly spaced offsets, as the kernel reports
    /// them (`move_pages` query; negative for a page not yet faulted in).
    pub fn sample_page_nodes(&self, samples: usize) -> Result<Vec<i32>> {
        let stride = (self.size_bytes() / samples.max(1) as u64).max(1);
        let addresses: Vec<usize> = (0..samples as u64)
            .filter_map(|i| {
                self.region
                    .address_of((i * stride).min(self.size_bytes().saturating_sub(1)))
            })
            .collect();
        topology::page_nodes(&addresses).map_err(|source| PmemError::Io {
            path: self.spec.path.clone(),
            action: "move_pages query",
            source,
        })
    }
}

pub(crate) fn open_rw(path: &Path, create_new: bool) -> Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if create_new {
        options.create(true).truncate(true);
    }
    options.open(path).map_err(|source| PmemError::Io {
        path: path.to_owned(),
        action: if create_new { "create" } else { "open" },
        source,
    })
}

pub(crate) fn file_len(file: &File, path: &Path) -> Result<u64> {
    let len = file
        .metadata()
        .map_err(|source| PmemError::Io {
            path: path.to_owned(),
            action: "stat",
            source,
        })?
        .len();
    if len == 0 {
        return Err(PmemError::WrongKind {
            path: path.to_owned(),
            problem: "is empty".into(),
        });
    }
    Ok(len)
}

/// Grows the existing device file at `path` to `size_bytes` and hands it to `finish` (which
/// maps and allocates it): lengthened when shorter, refused when longer (a device never
/// shrinks). When `finish` fails — no room to allocate the new part, say — a file this call
/// lengthened is cut back to its old length, so a failed grow leaves no unallocated tail that
/// a later open could take for a grow to record.
pub(crate) fn grow_file<T>(
    path: &Path,
    size_bytes: u64,
    finish: impl FnOnce(&File) -> Result<T>,
) -> Result<T> {
    let file = open_rw(path, false)?;
    let len = file_len(&file, path)?;
    if len > size_bytes {
        return Err(PmemError::WrongKind {
            path: path.to_owned(),
            problem: format!("has {len} bytes, more than {size_bytes}: a device never shrinks"),
        });
    }
    if len < size_bytes {
        set_len(&file, size_bytes, path)?;
    }
    finish(&file).inspect_err(|_| {
        if len < size_bytes
            && let Err(error) = set_len(&file, len, path)
        {
            tracing::warn!(path = %path.display(), %error, "could not cut a failed grow back");
        }
    })
}

/// Creates the device file at `path` anew (an existing file is cut to nothing), `size_bytes`
/// long, and hands it to `finish` (which allocates and maps it). When `finish` fails — no room
/// to allocate the file, say — the file is given back: removed when this call created it,
/// emptied when it existed, so the blocks a failed allocation took do not stay taken (ext4 and
/// tmpfs keep what a failed `fallocate` allocated).
pub(crate) fn create_file<T>(
    path: &Path,
    size_bytes: u64,
    finish: impl FnOnce(&File) -> Result<T>,
) -> Result<T> {
    let existed = path.exists();
    let file = open_rw(path, true)?;
    set_len(&file, size_bytes, path)
        .and_then(|()| finish(&file))
        .inspect_err(|_| give_back(path, existed))
}

/// Gives back a device file whose making failed (here, or in a format that made it and then
/// failed on another device): removed when it did not exist before, emptied when it did
/// (making it cut it to nothing already), so the blocks it took do not stay taken.
pub fn give_back(path: &Path, existed: bool) {
    let given_back = if existed {
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(0))
    } else {
        std::fs::remove_file(path)
    };
    if let Err(error) = given_back {
        tracing::warn!(path = %path.display(), %error, "could not give back a device file whose making failed");
    }
}

/// A shared mapping of the first `len` bytes of `file` (which the mapping keeps).
pub(crate) fn map_shared(file: File, len: u64, path: &Path) -> Result<Mapping> {
    Mapping::new(file, usize_len(len, path)?, MapFlags::Shared, path)
}

/// A second descriptor of `file` (a mapping keeps its own).
pub(crate) fn dup(file: &File, path: &Path) -> Result<File> {
    file.try_clone().map_err(|source| PmemError::Io {
        path: path.to_owned(),
        action: "dup",
        source,
    })
}

pub(crate) fn set_len(file: &File, len: u64, path: &Path) -> Result<()> {
    file.set_len(len).map_err(|source| PmemError::Io {
        path: path.to_owned(),
        action: "set length",
        source,
    })
}

pub(crate) fn usize_len(len: u64, path: &Path) -> Result<usize> {
    usize::try_from(len).map_err(|_| PmemError::WrongKind {
        path: path.to_owned(),
        problem: format!("size {len} exceeds the address space"),
    })
}

/// The persistence mode of a DAX device under `policy`, given the `persistence_domain` of its
/// NVDIMM region if known.
pub(crate) fn dax_mode(policy: FlushPolicy, persistence_domain: Option<&str>) -> PersistenceMode {
    let eadr = match policy {
        FlushPolicy::Never => true,
        FlushPolicy::Always => false,
        FlushPolicy::Auto => persistence_domain == Some("cpu_cache"),
    };
    if eadr {
        PersistenceMode::Eadr
    } else {
        PersistenceMode::CacheFlush(FlushInstruction::detect())
    }
}

/// The first `numa_node` attribute from a sysfs device directory upwards (-1 means none).
fn sysfs_numa_node(sysfs_device: &str) -> Option<u32> {
    let device = std::fs::canonicalize(sysfs_device).ok()?;
    let text = device
        .ancestors()
        .take(12)
        .find_map(|dir| std::fs::read_to_string(dir.join("numa_node")).ok())?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// Walks up from a sysfs device directory to the first `persistence_domain` attribute (on
/// the NVDIMM region) and returns its value.
pub(crate) fn persistence_domain(sysfs_device: &Path) -> Option<String> {
    let device = std::fs::canonicalize(sysfs_device).ok()?;
    device
        .ancestors()
        .take(12)
        .find_map(|dir| std::fs::read_to_string(dir.join("persistence_domain")).ok())
        .map(|text| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block device (whichever this machine has) is refused with what to do instead.
    #[test]
    fn a_block_device_is_refused_with_what_to_use_instead() {
        let block = std::fs::read_dir("/dev").ok().and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        });
        let Some(block) = block else {
            eprintln!("no block device under /dev: nothing to check");
            return;
        };
        let error = DeviceKind::detect(&block).unwrap_err().to_string();
        assert!(
            error.contains("a block device") && error.contains("devdax") && error.contains("dax"),
            "{error}"
        );
    }
}
