//! File offsets that processes share.
//!
//! An open file description outlives the process image that opened it: a `fork` gives the
//! child the parent's descriptions, an `exec` keeps them, and whoever reads or writes
//! through one moves the one offset they all share. `./build.sh > log 2>&1` relies on it —
//! each command the script runs writes after the one before, and the script's own `echo`
//! after them all. The library's descriptions live in one process image, so a locus fd that
//! crosses a `fork` or an `exec` is reopened on the other side; its offset travels in a
//! *cell* of a small table in a memory file mapped shared: a forked child keeps the mapping,
//! an exec'd image maps it again by the fd the handover names (`LOCUS_PRELOAD_HANDOFF`).
//!
//! Only one process uses the volume at a time, and a process stores the offsets of the
//! descriptions it used into their cells before it lets go of the volume — at `fork`,
//! `posix_spawn`, `exec` and exit — and a reopened description reads its cell, so the next
//! process to use one starts where the last one stopped. A table is made at the first such
//! crossing and shared by every process descended from it; cells are never reused (a full
//! table leaves later descriptions with the offset they had when handed over, as before
//! there were cells).

use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{errno, real, state};

/// Cells in a table: 512 KiB of memory, of which only the pages of cells handed out are
/// ever touched; cell 0 counts the cells handed out.
const CELLS: usize = 1 << 16;
const TABLE_BYTES: usize = CELLS * 8;

struct Table {
    /// The memory file, one of the library's own fds.
    fd: c_int,
    /// Its shared mapping: [`CELLS`] cells.
    cells: &'static [AtomicU64],
}

/// Set once (made here, or received at load); read without a lock, as every change of a
/// shared offset stores into it.
static TABLE: OnceLock<Table> = OnceLock::new();
/// Held while a table is made.
static MAKING: Mutex<()> = Mutex::new(());

/// Maps `TABLE_BYTES` of the memory file `fd`, shared.
fn map(fd: c_int) -> Result<&'static [AtomicU64], c_int> {
    // SAFETY: a fresh shared mapping of a file this library owns; nothing else is replaced.
    let at = unsafe {
        real::mmap64(
            std::ptr::null_mut(),
            TABLE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(errno::get());
    }
    // SAFETY: `TABLE_BYTES` of page-aligned memory, mapped for the rest of the process and
    // only ever accessed atomically (by every process that maps it).
    Ok(unsafe { std::slice::from_raw_parts(at.cast::<AtomicU64>(), CELLS) })
}

/// The table, made now if there is none.
fn table() -> Option<&'static Table> {
    if let Some(table) = TABLE.get() {
        return Some(table);
    }
    let _making = MAKING.lock();
    if let Some(table) = TABLE.get() {
        return Some(table);
    }
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"locus-offsets".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let fd = state::move_internal(fd);
    // SAFETY: our memory file; `real::` so that the call is not taken for a locus fd's.
    let sized = unsafe { real::ftruncate64(fd, TABLE_BYTES as libc::off_t) } == 0;
    match map(fd).ok().filter(|_| sized) {
        Some(cells) => Some(TABLE.get_or_init(|| Table { fd, cells })),
        None => {
            state::forget_internal(fd);
            // SAFETY: ours, unused.
            unsafe { real::close(fd) };
            None
        }
    }
}

/// A new cell holding `pos`; `None` when the table is full or cannot be made.
pub(crate) fn allocate(pos: u64) -> Option<u32> {
    let table = table()?;
    let index = table.cells[0].fetch_add(1, Ordering::AcqRel) + 1;
    let cell = u32::try_from(index)
        .ok()
        .filter(|&c| (c as usize) < CELLS)?;
    table.cells[cell as usize].store(pos, Ordering::Release);
    Some(cell)
}

/// Cell `cell` of the table, if there is a table and such a cell.
fn cell(cell: u32) -> Option<&'static AtomicU64> {
    (cell != 0)
        .then(|| TABLE.get()?.cells.get(cell as usize))
        .flatten()
}

/// Stores `pos` into `cell`.
pub(crate) fn store(at: u32, pos: u64) {
    if let Some(c) = cell(at) {
        c.store(pos, Ordering::Release);
    }
}

/// The offset in `cell`; `None` for a cell this process has no table for.
pub(crate) fn load(at: u32) -> Option<u64> {
    cell(at).map(|c| c.load(Ordering::Acquire))
}

/// The table's fd, for an `exec` to keep open and name in the handover.
pub(crate) fn handover_fd() -> Option<c_int> {
    TABLE.get().map(|t| t.fd)
}

/// Maps the table an earlier image handed over as `fd` (at library load). Refused, leaving
/// the process without a table, when `fd` is not a memory file of a table's size.
pub(crate) fn receive(fd: c_int) -> Result<(), String> {
    // SAFETY: a plain C struct, all zeros valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `real::` so that a locus fd's `fstat` is not asked.
    if unsafe { real::fstat64(fd, &mut st) } != 0 {
        return Err(format!("fd {fd}: {}", std::io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size != TABLE_BYTES as i64 {
        return Err(format!(
            "fd {fd} is not a table of offsets ({} bytes, mode {:o})",
            st.st_size, st.st_mode
        ));
    }
    let cells = map(fd)
        .map_err(|e| format!("mapping fd {fd}: {}", std::io::Error::from_raw_os_error(e)))?;
    let fd = state::move_internal(fd);
    // SAFETY: ours now; it crosses the next exec only when handed over again.
    unsafe { real::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_ulong) };
    if TABLE.set(Table { fd, cells }).is_err() {
        return Err("a table of offsets is already mapped".into());
    }
    Ok(())
}
