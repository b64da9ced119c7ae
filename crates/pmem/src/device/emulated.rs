//! Emulated persistent memory: a file on tmpfs whose pages are bound to one NUMA node.
//!
//! At creation the file is mapped, the mapping is bound to the node with `mbind` (for tmpfs
//! the policy is kept with the file's pages), and only then is the whole file allocated with
//! `fallocate`, so every page is placed on the node and reserved (a full tmpfs cannot later
//! kill the process with SIGBUS). The file survives the process, not a reboot.

use std::fs::File;
use std::path::Path;

use crate::cpu::FlushInstruction;
use crate::error::{PmemError, Result};
use crate::mapping::{self, Mapping};
use crate::region::PersistenceMode;

pub(super) fn create(
    path: &Path,
    size_bytes: u64,
    node: Option<u32>,
) -> Result<(Mapping, PersistenceMode)> {
    check_tmpfs(path)?;
    super::create_file(path, size_bytes, |file| {
        map_bound_and_allocated(file, size_bytes, node, path)
    })
}

/// Lengthens the device file to `size_bytes` and allocates it under the node binding, as
/// [`create`] does (the pages it has keep their place).
pub(super) fn grow(
    path: &Path,
    size_bytes: u64,
    node: Option<u32>,
) -> Result<(Mapping, PersistenceMode)> {
    check_tmpfs(path)?;
    super::grow_file(path, size_bytes, |file| {
        map_bound_and_allocated(file, size_bytes, node, path)
    })
}

/// Maps the first `size_bytes` of `file`, binds the mapping to `node`, then allocates the
/// file's pages (so they are placed under the binding).
fn map_bound_and_allocated(
    file: &File,
    size_bytes: u64,
    node: Option<u32>,
    path: &Path,
) -> Result<(Mapping, PersistenceMode)> {
    let mapping = super::map_shared(super::dup(file, path)?, size_bytes, path)?;
    bind(&mapping, node, path)?;
    mapping::allocate(file, size_bytes, path)?;
    Ok((
        mapping,
        PersistenceMode::Emulated(FlushInstruction::detect()),
    ))
}

pub(super) fn open(path: &Path, node: Option<u32>) -> Result<(Mapping, PersistenceMode)> {
    check_tmpfs(path)?;
    let file = super::open_rw(path, false)?;
    let len = super::file_len(&file, path)?;
    let mapping = super::map_shared(file, len, path)?;
    bind(&mapping, node, path)?;
    Ok((
        mapping,
        PersistenceMode::Emulated(FlushInstruction::detect()),
    ))
}

fn bind(mapping: &Mapping, node: Option<u32>, path: &Path) -> Result<()> {
    if let Some(node) = node {
        topology::bind_range(mapping.base() as usize, mapping.len(), node).map_err(|source| {
            PmemError::Io {
                path: path.to_owned(),
                action: "mbind to the device's node",
                source,
            }
        })?;
    }
    Ok(())
}

fn check_tmpfs(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(PmemError::WrongKind {
            path: path.to_owned(),
            problem: format!(
                "its directory {} does not exist (locus creates the device file, not its \
                 directory)",
                dir.display()
            ),
        });
    }
    let magic = mapping::filesystem_magic(dir).map_err(|source| PmemError::Io {
        path: dir.to_owned(),
        action: "statfs",
        source,
    })?;
    if magic != libc::TMPFS_MAGIC {
        return Err(PmemError::WrongKind {
            path: path.to_owned(),
            problem: "an emulated device must be on tmpfs (e.g. /dev/shm)".into(),
        });
    }
    Ok(())
}
