//! A file or block device opened with `O_DIRECT`: data moves between the device and our
//! buffers by DMA, never through the page cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Result, UringError, io};

/// Offsets and lengths must be multiples of this (the logical block size every current
/// device accepts; buffers are page-aligned).
pub const SECTOR_BYTES: u64 = 512;

/// An `O_DIRECT` file.
#[derive(Debug)]
pub struct DirectFile {
    path: PathBuf,
    file: File,
    size_bytes: u64,
}

impl DirectFile {
    /// Opens `path`, creating a regular file of `create_bytes` if given and absent or smaller.
    pub fn open(path: &Path, create_bytes: Option<u64>) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create_bytes.is_some())
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(io(format!("opening {} with O_DIRECT", path.display())))?;
        let metadata = file
            .metadata()
            .map_err(io(format!("stat of {}", path.display())))?;
        let mut size_bytes = if metadata.file_type().is_block_device() {
            use std::io::Seek;
            (&file)
                .seek(std::io::SeekFrom::End(0))
                .map_err(io(format!("size of {}", path.display())))?
        } else {
            metadata.len()
        };
        if let Some(wanted) = create_bytes
            && size_bytes < wanted
            && metadata.is_file()
        {
            file.set_len(wanted)
                .map_err(io(format!("sizing {}", path.display())))?;
            size_bytes = wanted;
        }
        Ok(Self {
            path: path.to_owned(),
            file,
            size_bytes,
        })
    }

    /// Makes every completed write durable (`fdatasync`).
    pub fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(io(format!("fdatasync of {}", self.path.display())))
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Checks that a request is aligned for O_DIRECT and inside the device.
    pub fn check(&self, offset: u64, len: usize) -> Result<()> {
        let bad = |problem: String| {
            Err(UringError::BadRequest {
                path: self.path.clone(),
                problem,
            })
        };
        if len == 0
            || !offset.is_multiple_of(SECTOR_BYTES)
            || !(len as u64).is_multiple_of(SECTOR_BYTES)
        {
            return bad(format!(
                "{len} bytes at {offset}: offset and length must be non-zero multiples of {SECTOR_BYTES}"
            ));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => bad(format!(
                "{len} bytes at {offset} run past the end ({} bytes)",
                self.size_bytes
            )),
        }
    }
}
