//! An ordinary file on a disk. Without DAX, stores land in the page cache, so durability
//! needs `msync`: slow, but correct on any file system.

use std::fs::File;
use std::path::Path;

use crate::error::Result;
use crate::mapping::{self, Mapping};
use crate::region::PersistenceMode;

pub(super) fn create(path: &Path, size_bytes: u64) -> Result<(Mapping, PersistenceMode)> {
    super::create_file(path, size_bytes, |file| {
        allocated_and_mapped(file, size_bytes, path)
    })
}

/// Lengthens the file to `size_bytes` and reserves its blocks, as [`create`] does.
pub(super) fn grow(path: &Path, size_bytes: u64) -> Result<(Mapping, PersistenceMode)> {
    super::grow_file(path, size_bytes, |file| {
        allocated_and_mapped(file, size_bytes, path)
    })
}

/// Reserves the first `size_bytes` of `file` and maps them.
fn allocated_and_mapped(
    file: &File,
    size_bytes: u64,
    path: &Path,
) -> Result<(Mapping, PersistenceMode)> {
    mapping::allocate(file, size_bytes, path)?;
    let mapping = super::map_shared(super::dup(file, path)?, size_bytes, path)?;
    Ok((mapping, PersistenceMode::Msync))
}

pub(super) fn open(path: &Path) -> Result<(Mapping, PersistenceMode)> {
    let file = super::open_rw(path, false)?;
    let len = super::file_len(&file, path)?;
    let mapping = super::map_shared(file, len, path)?;
    Ok((mapping, PersistenceMode::Msync))
}
