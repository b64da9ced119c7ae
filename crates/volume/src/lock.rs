//! One process opens a volume at a time: an exclusive `flock` on `locus.lock` in the volume
//! directory, holding the owner's pid so a second opener can say who has it, and one on
//! every device the volume names — so that two directories naming the same device (a copied
//! `locus.toml`) cannot both open it; the holder of a device is found in the kernel's lock
//! table (`/proc/locks`). The kernel drops the locks when the process dies, so a crash never
//! leaves the volume locked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::config::VolumeConfig;
use crate::error::{Result, VolumeError};

/// The name of the lock file in a volume directory.
pub const LOCK_FILE: &str = "locus.lock";

/// Held while the volume is open.
#[derive(Debug)]
pub struct VolumeLock {
    _file: File,
    /// Every device of the volume, locked.
    devices: Vec<(std::path::PathBuf, File)>,
}

impl VolumeLock {
    /// Takes the lock of the volume in `dir` and reads its config (after the lock, so it is
    /// the config of the volume we hold). Where there is no volume it is `NoVolume`, and
    /// nothing is created: no directory, no lock file.
    pub fn acquire_existing(dir: &Path) -> Result<(Self, VolumeConfig)> {
        let none = || VolumeError::NoVolume {
            dir: dir.to_owned(),
        };
        if VolumeConfig::read(dir)?.is_none() {
            return Err(none());
        }
        let mut lock = Self::acquire(dir)?;
        let config = VolumeConfig::read(dir)?.ok_or_else(none)?;
        lock.lock_devices(&config)?;
        Ok((lock, config))
    }

    /// Takes the lock of the volume in `dir` (creating the directory if needed).
    pub fn acquire(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| VolumeError::Io {
            path: dir.to_owned(),
            action: "create the volume directory",
            source,
        })?;
        let path = dir.join(LOCK_FILE);
        let io = |action, source| VolumeError::Io {
            path: path.clone(),
            action,
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", e))?;
        match lock_tolerating_forks(&file) {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(VolumeError::InUse {
                    dir: dir.to_owned(),
                    pid: if pid.is_empty() {
                        "unknown".into()
                    } else {
                        pid.to_owned()
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
        }
        file.set_len(0).map_err(|e| io("truncate", e))?;
        file.rewind().map_err(|e| io("rewind", e))?;
        writeln!(file, "{}", std::process::id()).map_err(|e| io("write pid", e))?;
        Ok(Self {
            _file: file,
            devices: Vec::new(),
        })
    }

    /// Locks every device of `config` that exists and is not locked yet (format calls it
    /// before and after creating devices). `DeviceInUse`, naming the holder, when another
    /// process has one.
    pub fn lock_devices(&mut self, config: &VolumeConfig) -> Result<()> {
        for device in &config.devices {
            let path = &device.path;
            if self.devices.iter().any(|(p, _)| p == path) || !path.exists() {
                continue;
            }
            let file = File::open(path).map_err(|source| VolumeError::Io {
                path: path.clone(),
                action: "open to lock",
                source,
            })?;
            match file.try_lock() {
                Ok(()) => self.devices.push((path.clone(), file)),
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(VolumeError::DeviceInUse {
                        device: path.clone(),
                        pid: holder(&file).unwrap_or_else(|| "unknown".into()),
                    });
                }
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(VolumeError::Io {
                        path: path.clone(),
                        action: "lock",
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

/// `try_lock` of the volume's lock file, tried again for up to a second while the pid in it
/// is this process's: a `flock` belongs to the open file description, which a child of
/// another thread holds from its `fork` until its `exec` closes it — so a volume this
/// process just closed can look held by itself for that long. A volume another handle of
/// this process really holds is still refused, a second later.
fn lock_tolerating_forks(file: &File) -> std::result::Result<(), std::fs::TryLockError> {
    const TRIES: u32 = 100;
    let mut tries = 0;
    loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock) if tries < TRIES && held_by_self(file) => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The lock file names this process as its holder.
fn held_by_self(mut file: &File) -> bool {
    let mut pid = String::new();
    let read = file.rewind().and_then(|()| file.read_to_string(&mut pid));
    let _ = file.rewind();
    read.is_ok() && pid.trim() == std::process::id().to_string()
}

/// The pid holding an exclusive `flock` on `file`, from `/proc/locks` (lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 00:1a:1234 0 EOF`, the device in hex, the inode decimal).
fn holder(file: &File) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    // glibc's encoding of a device number.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let wanted = (major, minor, meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Blocked waiters are listed as `1: -> FLOCK ...`; skip them.
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid = fields.get(4)?;
        let mut id = fields.get(5)?.split(':');
        let found = (
            u64::from_str_radix(id.next()?, 16).ok()?,
            u64::from_str_radix(id.next()?, 16).ok()?,
            id.next()?.parse::<u64>().ok()?,
        );
        (found == wanted).then(|| (*pid).to_owned())
    })
}
