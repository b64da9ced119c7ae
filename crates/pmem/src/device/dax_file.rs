//! A file on a file system mounted with `-o dax`, mapped with `MAP_SHARED_VALIDATE | MAP_SYNC`
//! so that flushing from user space is enough to persist data (the kernel makes the file's
//! block mapping durable before a write fault returns).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::FlushPolicy;
use crate::error::{PmemError, Result};
use crate::mapping::{self, MapFlags, Mapping};
use crate::region::PersistenceMode;

pub(super) fn create(
    path: &Path,
    size_bytes: u64,
    flush: FlushPolicy,
) -> Result<(Mapping, PersistenceMode)> {
    super::create_file(path, size_bytes, |file| {
        mapping::allocate(file, size_bytes, path)?;
        map(super::dup(file, path)?, size_bytes, path, flush)
    })
}

/// Lengthens the file to `size_bytes` and reserves its blocks, as [`create`] does.
pub(super) fn grow(
    path: &Path,
    size_bytes: u64,
    flush: FlushPolicy,
) -> Result<(Mapping, PersistenceMode)> {
    super::grow_file(path, size_bytes, |file| {
        mapping::allocate(file, size_bytes, path)?;
        map(super::dup(file, path)?, size_bytes, path, flush)
    })
}

pub(super) fn open(path: &Path, flush: FlushPolicy) -> Result<(Mapping, PersistenceMode)> {
    let file = super::open_rw(path, false)?;
    let len = super::file_len(&file, path)?;
    map(file, len, path, flush)
}

fn map(
    file: std::fs::File,
    len: u64,
    path: &Path,
    flush: FlushPolicy,
) -> Result<(Mapping, PersistenceMode)> {
    let device = file.metadata().map(|m| m.dev()).ok();
    let mapping = Mapping::new(
        file,
        super::usize_len(len, path)?,
        MapFlags::SharedSync,
        path,
    )
    .map_err(|error| match error {
        PmemError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) =>
        {
            PmemError::WrongKind {
                path: path.to_owned(),
                problem: "cannot be mapped with MAP_SYNC: not on a file system mounted with -o dax"
                    .into(),
            }
        }
        other => other,
    })?;
    let domain = device.and_then(|dev| {
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        super::persistence_domain(Path::new(&format!("/sys/dev/block/{major}:{minor}")))
    });
    Ok((mapping, super::dax_mode(flush, domain.as_deref())))
}

/// Whether `path` can be mapped with `MAP_SYNC` (it lives on a DAX file system).
pub(super) fn supports_map_sync(path: &Path) -> bool {
    let Ok(file) = super::open_rw(path, false) else {
        return false;
    };
    let Ok(len) = super::file_len(&file, path) else {
        return false;
    };
    let page = topology::page_size() as u64;
    Mapping::new(file, len.min(page) as usize, MapFlags::SharedSync, path).is_ok()
}

/// Whether files created in `dir` can be mapped with `MAP_SYNC`: tries it on a one-page
/// temporary file, removed afterwards.
pub(super) fn directory_supports_map_sync(dir: &Path) -> bool {
    let probe = dir.join(format!(".locus-dax-probe-{}", std::process::id()));
    let supported = super::open_rw(&probe, true)
        .and_then(|file| super::set_len(&file, topology::page_size() as u64, &probe))
        .map(|()| supports_map_sync(&probe))
        .unwrap_or(false);
    let _ = std::fs::remove_file(&probe);
    supported
}
