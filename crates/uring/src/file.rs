//! A file or block device opened with `O_DIRECT`: data moves between the device and our
//! buffers by DMA, never through the page cache.

#![allow(
    unsafe_code,
    reason = "fallocate and the BLKZEROOUT ioctl on the file's descriptor"
)]

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

    /// Makes `[offset, offset + len)` read as zeros, durably: a hole punched in a file
    /// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`, which also gives the space back), zeros written by
    /// the device for a block device (`BLKZEROOUT`), then `fdatasync`. Both must be whole
    /// sectors inside the device.
    pub fn zero_range(&self, offset: u64, len: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let block_device = self
            .file
            .metadata()
            .map_err(io(format!("stat of {}", self.path.display())))?
            .file_type()
            .is_block_device();
        let done = if block_device {
            // _IO(0x12, 127): BLKZEROOUT, a u64[2] of start and length.
            const BLKZEROOUT: libc::c_ulong = 0x127f;
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads two u64s from `range`, which lives across the call.
            unsafe { libc::ioctl(fd, BLKZEROOUT, range.as_ptr()) }
        } else {
            let (Ok(start), Ok(length)) =
                (libc::off_t::try_from(offset), libc::off_t::try_from(len))
            else {
                return Err(UringError::BadRequest {
                    path: self.path.clone(),
                    problem: format!("{len} bytes at {offset} do not fit off_t"),
                });
            };
            // SAFETY: fallocate takes integers only.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    start,
                    length,
                )
            }
        };
        if done != 0 {
            return Err(UringError::Io {
                what: format!(
                    "zeroing {len} bytes at {offset} of {} ({})",
                    self.path.display(),
                    if block_device {
                        "BLKZEROOUT"
                    } else {
                        "fallocate"
                    }
                ),
                source: std::io::Error::last_os_error(),
            });
        }
        self.sync_data()
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.checked_add(len);
        if !offset.is_multiple_of(SECTOR_BYTES)
            || !len.is_multiple_of(SECTOR_BYTES)
            || end.is_none_or(|e| e > self.size_bytes)
        {
            return Err(UringError::BadRequest {
                path: self.path.clone(),
                problem: format!(
                    "{len} bytes at {offset}: not whole sectors inside the {}-byte device",
                    self.size_bytes
                ),
            });
        }
        Ok(())
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
