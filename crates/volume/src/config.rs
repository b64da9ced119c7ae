//! `locus.toml`: the devices of a volume, in the volume directory.
//!
//! Users may write it before `locus format` (devices to format) and `locus format` writes it
//! (atomically: a temporary file renamed over the old one, then the directory synced). The
//! devices' identity lives in their superblocks; this file only says where to find them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, VolumeError};

/// The name of the config file in a volume directory.
pub const CONFIG_FILE: &str = "locus.toml";
/// Where the embedded default volume lives when no other directory is named.
pub const DEFAULT_DIR: &str = "/dev/shm/locus";
/// Largest config file read (a volume has at most 256 devices).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    /// Cache-flush policy: "auto" (flush unless the platform reports eADR), "always",
    /// "never" (eADR).
    #[serde(default = "default_flush")]
    pub flush: String,
    /// The devices.
    #[serde(rename = "device", default)]
    pub devices: Vec<DeviceConfig>,
}

fn default_flush() -> String {
    "auto".into()
}

/// One `[[device]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// Device path.
    pub path: PathBuf,
    /// "emulated", "daxfile", "devdax" or "file"; detected from the path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// For emulated devices: the NUMA node the pages are bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
    /// Size to create (emulated, daxfile, file); ignored for device-DAX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

impl DeviceConfig {
    /// The device's kind: as written in the config, else detected from the path.
    pub fn kind(&self) -> Result<pmem::DeviceKind> {
        match self.kind.as_deref() {
            Some(name) => pmem::DeviceKind::from_name(name).ok_or_else(|| VolumeError::Config {
                path: self.path.clone(),
                problem: format!("unknown kind \"{name}\""),
            }),
            None => Ok(pmem::DeviceKind::detect(&self.path)?),
        }
    }

    /// The directory a device file is created in (`.` for a bare name).
    pub fn parent_dir(&self) -> &Path {
        self.path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }

    /// What to hand pmem to map the device.
    pub fn spec(&self, kind: pmem::DeviceKind, flush: pmem::FlushPolicy) -> pmem::DeviceSpec {
        pmem::DeviceSpec {
            path: self.path.clone(),
            kind,
            node: self.node,
            flush,
        }
    }

    /// Maps the existing device, as a source for opening or checking the volume; with
    /// `prefault`, every page is mapped now ([`pmem::Device::prefault`]).
    pub fn open_source(
        &self,
        flush: pmem::FlushPolicy,
        prefault: bool,
    ) -> Result<crate::volume::DeviceSource> {
        let kind = self.kind()?;
        let opened = pmem::Device::open(&self.spec(kind, flush))?;
        if prefault {
            opened.prefault();
        }
        Ok(crate::volume::DeviceSource {
            label: self.path.display().to_string(),
            kind: Some(kind),
            region: opened.region().clone(),
            node: self.node.or_else(|| opened.numa_node()),
        })
    }
}

/// Whether a command that finds no volume in `dir` may create the embedded default there:
/// only at [`DEFAULT_DIR`], or in an empty directory someone made for it. A mistyped path
/// must get "no volume there", not 1 GiB of emulated device and a lock file.
pub fn may_create_default_in(dir: &Path) -> bool {
    dir == Path::new(DEFAULT_DIR)
        || std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

impl VolumeConfig {
    /// Reads `dir/locus.toml`; `Ok(None)` when there is none.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(CONFIG_FILE);
        let text = match std::fs::File::open(&path) {
            Ok(file) => {
                use std::io::Read;
                let mut text = String::new();
                file.take(MAX_CONFIG_BYTES + 1)
                    .read_to_string(&mut text)
                    .map_err(|source| VolumeError::Io {
                        path: path.clone(),
                        action: "read",
                        source,
                    })?;
                if text.len() as u64 > MAX_CONFIG_BYTES {
                    return Err(VolumeError::Config {
                        path,
                        problem: "larger than 1 MiB".into(),
                    });
                }
                text
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None);
            }
            Err(source) => {
                return Err(VolumeError::Io {
                    path,
                    action: "open",
                    source,
                });
            }
        };
        let mut config: Self = toml::from_str(&text).map_err(|error| VolumeError::Config {
            path: path.clone(),
            problem: error.to_string(),
        })?;
        config.resolve_relative_paths(dir);
        config.validate(&path)?;
        Ok(Some(config))
    }

    /// A relative device path in `locus.toml` names a file in the volume directory `dir`,
    /// whatever directory the command runs in (locus writes absolute paths; a relative one
    /// is written by hand). A file written by an older locus may hold a path relative to the
    /// directory `format` ran in: when only that one exists, it is kept, with a warning.
    fn resolve_relative_paths(&mut self, dir: &Path) {
        for device in &mut self.devices {
            if device.path.is_absolute() {
                continue;
            }
            let in_dir = dir.join(&device.path);
            if !in_dir.exists() && device.path.exists() {
                // Said once per path and process: a command reads the file several times.
                static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
                let mut warned = WARNED
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if warned.contains(&device.path) {
                    continue;
                }
                warned.push(device.path.clone());
                tracing::warn!(
                    path = %device.path.display(),
                    volume = %dir.display(),
                    "a relative device path in locus.toml names a file in the current \
                     directory, not in the volume directory; write it absolute there"
                );
                continue;
            }
            device.path = in_dir;
        }
    }

    /// Checks values serde cannot: known kinds and flush policy, a device limit, unique paths.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let problem = |problem: String| VolumeError::Config {
            path: path.to_owned(),
            problem,
        };
        if self.flush_policy().is_none() {
            return Err(problem(format!(
                "flush = \"{}\": expected auto, always or never",
                self.flush
            )));
        }
        if self.devices.len() > crate::address::MAX_DEVICES as usize {
            return Err(problem(format!(
                "{} devices; a volume has at most 256",
                self.devices.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for device in &self.devices {
            if let Some(kind) = &device.kind
                && pmem::DeviceKind::from_name(kind).is_none()
            {
                return Err(problem(format!(
                    "device {}: kind \"{kind}\" is not emulated, daxfile, devdax or file",
                    device.path.display()
                )));
            }
            if !seen.insert(&device.path) {
                return Err(problem(format!(
                    "device {} is listed twice",
                    device.path.display()
                )));
            }
        }
        Ok(())
    }

    /// The flush policy named by `flush`.
    pub fn flush_policy(&self) -> Option<pmem::FlushPolicy> {
        match self.flush.as_str() {
            "auto" => Some(pmem::FlushPolicy::Auto),
            "always" => Some(pmem::FlushPolicy::Always),
            "never" => Some(pmem::FlushPolicy::Never),
            _ => None,
        }
    }

    /// Writes `dir/locus.toml` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(CONFIG_FILE);
        let temporary = dir.join(format!(".{CONFIG_FILE}.tmp"));
        let body = toml::to_string_pretty(self).map_err(|error| VolumeError::Config {
            path: path.clone(),
            problem: error.to_string(),
        })?;
        let text = format!(
            "# The devices of this locus volume, written by `locus format`.\n\
             # Their identity is in their superblocks; this file says where they are.\n{body}"
        );
        let io = |action, source| VolumeError::Io {
            path: path.clone(),
            action,
            source,
        };
        std::fs::write(&temporary, text).map_err(|e| io("write temporary config", e))?;
        std::fs::File::open(&temporary)
            .and_then(|f| f.sync_all())
            .map_err(|e| io("sync", e))?;
        std::fs::rename(&temporary, &path).map_err(|e| io("rename into place", e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync directory", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<VolumeConfig> {
        let config: VolumeConfig = toml::from_str(text).map_err(|error| VolumeError::Config {
            path: "locus.toml".into(),
            problem: error.to_string(),
        })?;
        config.validate(Path::new("locus.toml"))?;
        Ok(config)
    }

    #[test]
    fn reads_devices_and_defaults() {
        let config = parse("[[device]]\npath = \"/dev/dax0.0\"\n[[device]]\npath = \"/dev/shm/x\"\nkind = \"emulated\"\nnode = 1\nsize_bytes = 4096\n").unwrap();
        assert_eq!(config.flush, "auto");
        assert_eq!(config.devices.len(), 2);
        assert_eq!(config.devices[1].node, Some(1));
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        let unknown = parse("[[device]]\npath = \"/x\"\ncolour = \"red\"\n").unwrap_err();
        assert!(unknown.to_string().contains("colour"), "{unknown}");
        let kind = parse("[[device]]\npath = \"/x\"\nkind = \"tape\"\n").unwrap_err();
        assert!(kind.to_string().contains("tape"), "{kind}");
        let flush = parse("flush = \"sometimes\"\n").unwrap_err();
        assert!(flush.to_string().contains("sometimes"), "{flush}");
        let twice = parse("[[device]]\npath = \"/x\"\n[[device]]\npath = \"/x\"\n").unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
    }
}
