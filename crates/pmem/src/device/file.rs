//! An ordinary file on a disk. Without DAX, stores land in the page cache, so durability
//! needs `msync`: slow, but correct on any file system.

use std::path::Path;

use crate::error::Result;
use crate::mapping::{self, MapFlags, Mapping};
use crate::region::PersistenceMode;

pub(super) fn create(path: &Path, size_bytes: u64) -> Result<(Mapping, PersistenceMode)> {
    let file = super::open_rw(path, true)?;
    super::set_len(&file, size_bytes, path)?;
    mapping::allocate(&file, size_bytes, path)?;
    let mapping = Mapping::new(
        file,
        super::usize_len(size_bytes, path)?,
        MapFlags::Shared,
        path,
    )?;
    Ok((mapping, PersistenceMode::Msync))
}

/// Lengthens the file to `size_bytes` and reserves its blocks, as [`create`] does.
pub(super) fn grow(path: &Path, size_bytes: u64) -> Result<(Mapping, PersistenceMode)> {
    super::grow_file(path, size_bytes, |file| {
        mapping::allocate(file, size_bytes, path)?;
        let mapping = Mapping::new(
            file.try_clone()
                .map_err(|source| crate::error::PmemError::Io {
                    path: path.to_owned(),
                    action: "dup",
                    source,
                })?,
            super::usize_len(size_bytes, path)?,
            MapFlags::Shared,
            path,
        )?;
        Ok((mapping, PersistenceMode::Msync))
    })
}

pub(super) fn open(path: &Path) -> Result<(Mapping, PersistenceMode)> {
    let file = super::open_rw(path, false)?;
    let len = super::file_len(&file, path)?;
    let mapping = Mapping::new(file, super::usize_len(len, path)?, MapFlags::Shared, path)?;
    Ok((mapping, PersistenceMode::Msync))
}
