//! Page-aligned memory for I/O buffers: anonymous mappings placed on a NUMA node, and the
//! raw copies in and out of them.

#![allow(
    unsafe_code,
    reason = "anonymous mappings handed to the kernel for DMA"
)]

use std::ptr::NonNull;

use crate::error::{Result, UringError};

/// Alignment O_DIRECT needs from buffers (and that every mapping has).
pub const ALIGN: usize = 4096;

/// Transparent huge page size on x86-64.
const HUGE_PAGE: usize = 2 << 20;

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
        let huge = len >= HUGE_PAGE;
        let reserve = if huge { len + HUGE_PAGE } else { len };
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(UringError::Io {
                what: format!("mmap of {len} bytes of I/O buffers"),
                source: std::io::Error::last_os_error(),
            });
        }
        let mut start = address as usize;
        if huge {
            let aligned = start.next_multiple_of(HUGE_PAGE);
            let head = aligned - start;
            let tail = reserve - head - len;
            // SAFETY: the trimmed head and tail lie inside the reservation just made and
            // nothing refers to them; madvise changes no contents.
            unsafe {
                if head > 0 {
                    libc::munmap(address, head);
                }
                if tail > 0 {
                    libc::munmap((aligned + len) as *mut libc::c_void, tail);
                }
                libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
            start = aligned;
        }
        let memory = Self {
            base: NonNull::new(start as *mut u8).expect("mmap succeeded"),
            len,
        };
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
