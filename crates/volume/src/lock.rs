//! One process opens a volume at a time: an exclusive `flock` on `locus.lock` in the volume
//! directory, holding the owner's pid so a second opener can say who has it. The kernel
//! drops the lock when the process dies, so a crash never leaves the volume locked.

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
        let lock = Self::acquire(dir)?;
        let config = VolumeConfig::read(dir)?.ok_or_else(none)?;
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
        match file.try_lock() {
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
        Ok(Self { _file: file })
    }
}
