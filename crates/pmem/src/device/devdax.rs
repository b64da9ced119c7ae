//! A device-DAX character device (`/dev/daxX.Y`): persistent memory mapped directly, with no
//! file system. Its size comes from sysfs (`stat` of a character device says 0), and the
//! kernel aligns the mapping to the device's alignment itself.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::FlushPolicy;
use crate::error::{PmemError, Result};
use crate::mapping::Mapping;
use crate::region::PersistenceMode;

pub(super) fn open(path: &Path, flush: FlushPolicy) -> Result<(Mapping, PersistenceMode)> {
    let file = super::open_rw(path, false)?;
    let metadata = file.metadata().map_err(|source| PmemError::Io {
        path: path.to_owned(),
        action: "stat",
        source,
    })?;
    let rdev = metadata.rdev();
    let sysfs = format!("/sys/dev/char/{}:{}", libc::major(rdev), libc::minor(rdev));
    let size_text =
        std::fs::read_to_string(format!("{sysfs}/size")).map_err(|source| PmemError::Io {
            path: path.to_owned(),
            action: "read its size from /sys/dev/char (is it a device-DAX device?)",
            source,
        })?;
    let size: u64 = size_text.trim().parse().map_err(|_| PmemError::WrongKind {
        path: path.to_owned(),
        problem: format!("{sysfs}/size holds `{}`, not a size", size_text.trim()),
    })?;
    if size == 0 {
        return Err(PmemError::WrongKind {
            path: path.to_owned(),
            problem: "has size 0".into(),
        });
    }
    let mapping = super::map_shared(file, size, path)?;
    let domain = super::persistence_domain(Path::new(&sysfs));
    Ok((mapping, super::dax_mode(flush, domain.as_deref())))
}
