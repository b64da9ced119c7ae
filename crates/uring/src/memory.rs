//! Page-aligned memory for I/O buffers: anonymous mappings placed on a NUMA node, and the
//! raw copies in and out of them.

#![allow(
    unsafe_code,
    reason = "anonymous mappings handed to the kernel for DMA"
)]

use std::ptr::NonNull;

use topology::HUGE_PAGE;

use crate::error::{Result, UringError};

/// Alignment O_DIRECT needs from buffers (and that every mapping has).
pub const ALIGN: usize = 4096;

/// A private anonymous mapping, optionally bound to a NUMA node, unmapped on drop.
#[derive(Debug)]
pub struct Memory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is owned by this value and only reached through `IoBuf` segments, whose
// owner has exclusive use of them; moving or sharing the handle between threads is sound.
unsafe impl Send for Memory {}
// SAFETY: see `Send`; `&Memory` hands out only addresses.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `len` bytes (rounded up to pages), bound to `node` if given, faulted in now so
    /// the pages exist (on that node) before the kernel pins them.
    ///
    /// Mappings of 2 MiB or more are 2 MiB-aligned and asked for transparent huge pages: io_uring
    /// coalesces a registered buffer on huge pages into a few large segments, which makes
    /// large transfers cheaper to set up.
    pub fn new(len: usize, node: Option<u32>) -> Result<Self> {
        let len = len.div_ceil(ALIGN).max(1) * ALIGN;
        let mapped = if len >= HUGE_PAGE {
            topology::map_on_huge_boundary(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None)
                .inspect(|base| {
                    // SAFETY: the range is exactly the mapping just made; madvise changes no
                    // contents.
                    unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
                })
        } else {
            // SAFETY: a fresh anonymous mapping aliases nothing.
            let address = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if address == libc::MAP_FAILED {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(NonNull::new(address.cast()).expect("mmap never returns null on success"))
            }
        };
        let base = mapped.map_err(|source| UringError::Io {
            what: format!("mmap of {len} bytes of I/O buffers"),
            source,
        })?;
        let start = base.as_ptr() as usize;
        let memory = Self { base, len };
        if let Some(node) = node
            && let Err(error) = topology::bind_range(start, len, node)
        {
            tracing::debug!(%error, node, "could not bind I/O buffers to their node");
        }
        // Touch every page so it is allocated (under the binding) before registration.
        for offset in (0..len).step_by(ALIGN) {
            // SAFETY: `offset < len`, inside our writable mapping.
            unsafe { memory.base.as_ptr().add(offset).write_volatile(0) };
        }
        Ok(memory)
    }

    /// First byte.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never: lengths are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly our mapping; buffers into it are gone (the pool and the
        // ring only drop memory after their segments came back).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Copies `data` to `address`.
///
/// # Safety
/// `address .. address + data.len()` must be writable memory that nothing else uses now.
pub(crate) unsafe fn copy_in(address: *mut u8, data: &[u8]) {
    // SAFETY: the caller guarantees the destination; `data` is a Rust slice elsewhere.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), address, data.len()) };
}

/// Copies from `address` into `out`.
///
/// # Safety
/// `address .. address + out.len()` must be readable memory that nothing writes now.
pub(crate) unsafe fn copy_out(address: *const u8, out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(address, out.as_mut_ptr(), out.len()) };
}
