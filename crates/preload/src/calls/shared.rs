//! Shared mappings of locus files (`mmap` with `MAP_SHARED`), DAX-style: the pages of the
//! mapping are the file's own blocks — the volume's device memory, already mapped in this
//! process — placed at the caller's address with `mremap` (an `old_size` of 0 duplicates a
//! shared mapping). Stores through the mapping are stores to the file; `read`/`write` and
//! the mapping see each other's bytes (the file system copies a mapped file's writes into
//! its blocks before the write returns); `msync` and `munmap` write the cache lines back.
//!
//! Pages past the end of the file map an empty file, so touching them is `SIGBUS`, as POSIX
//! says. The library keeps every mapping in a table so that sizes can change under them:
//! before a file shrinks, its mappings' pages past the new end are switched to the empty
//! file (the blocks are freed right after); after it grows, the pages now inside it are
//! mapped to its (hole-filled) blocks. One mapping holds its file open (an unlinked file
//! lives on while mapped) and counts as a mapping in the file system, which keeps the
//! blocks from moving.
//!
//! Where a file's blocks cannot be mapped — a volume with data checksums, whose blocks
//! must change only with their checksums — the mappings map a copy of the file in memory
//! instead ([`MappedCopy`]): the same calls, `read`/`write` coherent with the mappings in the
//! same way, and the stores written to the file (as checksummed writes) at `msync`, `munmap`,
//! exit and `fork`.
//!
//! Limits: `mremap` of such a mapping is `EINVAL` (map again instead); at `fork` the
//! mappings become private copies in both processes (the parent lets go of the volume, see
//! docs/preload.md).

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{off_t, size_t};
use parking_lot::Mutex;

use super::fs_errno;
use super::mapped_copy::{self, MappedCopy};
use crate::state::{self, Desc};
use crate::{errno, real};

/// One shared mapping (or what a partial `munmap` left of one).
struct Shared {
    start: usize,
    len: usize,
    /// File offset of `start`.
    offset: u64,
    prot: c_int,
    /// Bytes from `start` that map the file's blocks (or its copy); the rest maps the empty
    /// file.
    valid: usize,
    token: Arc<Token>,
    /// The file's copy in memory, when the mapping maps it instead of the file's blocks.
    copy: Option<Arc<MappedCopy>>,
}

impl Shared {
    fn end(&self) -> usize {
        self.start + self.len
    }
    /// The piece before `at` (inside the mapping) and the piece from it.
    fn split(self, at: usize) -> (Shared, Shared) {
        let cut = at - self.start;
        let before = Shared {
            len: cut,
            valid: self.valid.min(cut),
            token: Arc::clone(&self.token),
            copy: self.copy.clone(),
            ..self
        };
        let after = Shared {
            start: at,
            len: self.len - cut,
            offset: self.offset + cut as u64,
            valid: self.valid.saturating_sub(cut),
            ..self
        };
        (before, after)
    }
    fn file(&self) -> &fs::File {
        self.token
            .desc
            .file()
            .expect("a mapped description is a file")
    }
    /// Makes the stores to `[from, from + len)` of the file through this mapping durable.
    fn sync(&self, from: u64, len: u64) -> Result<(), c_int> {
        match &self.copy {
            None => self.file().sync_mapped(from, len).map_err(|e| fs_errno(&e)),
            Some(copy) => copy.write_back(self.file(), from, from.saturating_add(len)),
        }
    }
}

/// Holds the file open, and counted as mapped in the file system (for a mapping of its
/// blocks), until the last piece of its mapping is gone.
struct Token {
    desc: Arc<Desc>,
    /// Whether `File::map_shared` counted the mapping.
    counted: bool,
}

impl Drop for Token {
    fn drop(&mut self) {
        if self.counted
            && let Ok(file) = self.desc.file()
        {
            file.unmap_shared();
        }
    }
}

static TABLE: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

fn table() -> fs::lock_order::Ordered<parking_lot::MutexGuard<'static, Vec<Shared>>> {
    state::ordered(state::rank::MAPS, || TABLE.lock())
}
/// Entries in [`TABLE`]: lets `munmap`, `msync` and `mremap` of other memory skip the lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn page() -> usize {
    // SAFETY: sysconf cannot fail for the page size.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The empty file pages past a file's end map (`SIGBUS` on access); made once.
fn past_end_fd() -> Result<c_int, c_int> {
    static FD: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    if let Some(&fd) = FD.get() {
        return Ok(fd);
    }
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"locus-past-end-of-file".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno::get());
    }
    let fd = state::move_internal(fd);
    Ok(*FD.get_or_init(|| fd))
}

/// Maps `[at, at + len)` to the empty file (`SIGBUS` on access).
fn map_past_end(at: usize, len: usize, prot: c_int) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    map_fd_at(at, len, prot, past_end_fd()?, 0)
}

/// Maps `len` bytes of the memory file `fd` from `offset`, shared, over `[at, at + len)` of a
/// mapping this module owns.
fn map_fd_at(at: usize, len: usize, prot: c_int, fd: c_int, offset: u64) -> Result<(), c_int> {
    // SAFETY: replaces pages of a mapping this module owns.
    let got = unsafe {
        real::mmap64(
            at as *mut c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            offset as off_t,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(errno::get());
    }
    Ok(())
}

/// Places the file's blocks `runs` (from `file.map_shared`) at `base`, which maps file
/// offset `offset`; returns how many bytes from `base` they cover (they are contiguous in
/// the file, from `offset`).
fn place(runs: &[fs::MappedRun], base: usize, offset: u64, prot: c_int) -> Result<usize, c_int> {
    let mut covered = 0usize;
    for run in runs {
        if run.offset != offset + covered as u64 {
            return Err(libc::EIO); // the file system returns contiguous runs
        }
        let at = base + covered;
        // SAFETY: duplicates `run.len` bytes of the device's shared mapping (kept alive by
        // the mount) over pages of a mapping this module owns.
        let got = unsafe {
            real::mremap(
                run.addr as *mut c_void,
                0,
                run.len as usize,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                at as *mut c_void,
            )
        };
        if got == libc::MAP_FAILED {
            return Err(errno::get());
        }
        if prot != libc::PROT_READ | libc::PROT_WRITE {
            // SAFETY: the pages just placed.
            if unsafe { real::mprotect(at as *mut c_void, run.len as usize, prot) } != 0 {
                return Err(errno::get());
            }
        }
        covered += run.len as usize;
    }
    Ok(covered)
}

/// Maps `len` bytes of `copy` from file offset `offset` at `at`.
fn place_copy(
    copy: &MappedCopy,
    at: usize,
    len: usize,
    offset: u64,
    prot: c_int,
) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    map_fd_at(at, len, prot, copy.fd(), offset)
}

/// Maps the pages of `damaged` (page numbers of the file) that fall in the `valid` bytes of
/// a mapping at `base` of file offset `offset` to the empty file: a page the file's copy
/// could not be filled with is `SIGBUS`, the rest of the mapping maps the copy.
fn map_damaged(
    base: usize,
    offset: u64,
    valid: usize,
    damaged: &[u64],
    prot: c_int,
) -> Result<(), c_int> {
    for at in pages_within(damaged, offset, valid) {
        map_past_end(base + at, page(), prot)?;
    }
    Ok(())
}

/// Where in a mapping of `valid` bytes from file offset `offset` the file's pages `pages`
/// are (bytes from its start).
fn pages_within(pages: &[u64], offset: u64, valid: usize) -> impl Iterator<Item = usize> + '_ {
    let page = page() as u64;
    pages
        .iter()
        .map(move |&p| p * page)
        .filter(move |&at| at >= offset && at < offset + valid as u64)
        .map(move |at| (at - offset) as usize)
}

/// Bytes of a mapping of `len` bytes from file offset `offset` that are inside a file of
/// `size` bytes (whole pages, up to the page holding its last byte).
fn inside(offset: u64, len: usize, size: u64) -> usize {
    (size.next_multiple_of(page() as u64).saturating_sub(offset) as usize).min(len)
}

/// `mmap(MAP_SHARED)` of the locus fd `fd`.
pub(crate) fn map(
    fd: c_int,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<*mut c_void, c_int> {
    let desc = state::desc(fd)?;
    let Ok(file) = desc.file() else {
        return Err(libc::ENODEV);
    };
    let status = desc.status.load(Ordering::Relaxed);
    let access = status & libc::O_ACCMODE;
    if access == libc::O_WRONLY
        || status & libc::O_PATH != 0
        || (prot & libc::PROT_WRITE != 0 && access != libc::O_RDWR)
    {
        return Err(libc::EACCES);
    }
    let page = page();
    if len == 0 || off < 0 || !(off as usize).is_multiple_of(page) {
        return Err(libc::EINVAL);
    }
    let len = len.checked_next_multiple_of(page).ok_or(libc::ENOMEM)?;
    let runs = match file.map_shared(off as u64, len as u64) {
        Ok(runs) => runs,
        // The blocks cannot be mapped: the file's copy is.
        Err(e) if e.kind() == fs::ErrorKind::NotSupported => {
            return map_copy(desc, addr, len, prot, flags, off as u64);
        }
        Err(e) => return Err(fs_errno(&e)),
    };
    let token = Arc::new(Token {
        desc: Arc::clone(&desc),
        counted: true,
    });
    let base = reserve(addr, len, flags)?;
    let placed = place(&runs, base, off as u64, prot)
        .and_then(|valid| map_past_end(base + valid, len - valid, prot).map(|()| valid));
    let valid = match placed {
        Ok(valid) => valid,
        Err(e) => {
            // SAFETY: the range reserved above.
            unsafe { real::munmap(base as *mut c_void, len) };
            return Err(e);
        }
    };
    table().push(Shared {
        start: base,
        len,
        offset: off as u64,
        prot,
        valid,
        token,
        copy: None,
    });
    COUNT.fetch_add(1, Ordering::Release);
    Ok(base as *mut c_void)
}

/// A shared mapping of the file's copy in memory (made if the file has none yet).
fn map_copy(
    desc: Arc<Desc>,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: u64,
) -> Result<*mut c_void, c_int> {
    let file = desc.file().map_err(|_| libc::ENODEV)?;
    // Held while the copy is found or made, so that a file gets one.
    let mut table = table();
    // Counted before the file's size is read: a write that grows the file after that
    // finds the mapping (`is_mapped`), and waits for the table to map the new pages.
    COUNT.fetch_add(1, Ordering::SeqCst);
    let placed = (|| {
        let copy = match mapped_copy::of(file) {
            Some(copy) => copy,
            None => MappedCopy::make(file)?,
        };
        let base = reserve(addr, len, flags)?;
        let (size, damaged) = copy.layout(file);
        let valid = inside(offset, len, size);
        let placed = place_copy(&copy, base, valid, offset, prot)
            .and_then(|()| map_past_end(base + valid, len - valid, prot))
            .and_then(|()| map_damaged(base, offset, valid, &damaged, prot));
        if let Err(e) = placed {
            // SAFETY: the range reserved above.
            unsafe { real::munmap(base as *mut c_void, len) };
            return Err(e);
        }
        Ok((copy, base, valid))
    })();
    let (copy, base, valid) = placed.inspect_err(|_| {
        COUNT.fetch_sub(1, Ordering::SeqCst);
    })?;
    table.push(Shared {
        start: base,
        len,
        offset,
        prot,
        valid,
        token: Arc::new(Token {
            desc,
            counted: false,
        }),
        copy: Some(copy),
    });
    Ok(base as *mut c_void)
}

/// Reserves `len` bytes of address space where the caller's placement flags say (nothing
/// mapped yet: replaced piece by piece).
fn reserve(addr: *mut c_void, len: usize, flags: c_int) -> Result<usize, c_int> {
    // The address range: the caller's placement flags, nothing else.
    let placement = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE);
    // SAFETY: a fresh anonymous reservation, replaced piece by piece below.
    let base = unsafe {
        real::mmap64(
            addr,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | placement,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(errno::get());
    }
    Ok(base as usize)
}

/// Whether `[addr, addr + len)` overlaps a shared mapping of a locus file.
fn overlaps(addr: usize, len: usize) -> bool {
    COUNT.load(Ordering::Acquire) > 0
        && TABLE
            .lock()
            .iter()
            .any(|s| s.start < addr.saturating_add(len) && addr < s.end())
}

/// Writes back the stores to the part of each mapping in `[addr, addr + len)`.
fn sync_range(table: &[Shared], addr: usize, len: usize) -> Result<(), c_int> {
    let end = addr.saturating_add(len);
    for s in table.iter().filter(|s| s.start < end && addr < s.end()) {
        let from = addr.max(s.start);
        let to = end.min(s.start + s.valid);
        if from < to {
            s.sync(s.offset + (from - s.start) as u64, (to - from) as u64)?;
        }
    }
    Ok(())
}

/// `msync` of a range holding locus mappings: their stores written back, then libc's.
pub(crate) fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> Option<c_int> {
    if !overlaps(addr as usize, len) {
        return None;
    }
    let synced = state::run(|| {
        let _calls = state::calls_held();
        sync_range(&table(), addr as usize, len)
    });
    Some(match synced {
        // SAFETY: passed through (the pages are the caller's).
        Ok(()) => unsafe { real::msync(addr, len, flags) },
        Err(e) => {
            errno::set(e);
            -1
        }
    })
}

/// `munmap` of a range holding locus mappings: their stores written back, the table cut
/// to what is left, then libc's `munmap`.
pub(crate) fn munmap(addr: *mut c_void, len: size_t) -> Option<c_int> {
    // As the kernel does: the length covers whole pages; an unaligned address is the
    // kernel's EINVAL (passed through, the table untouched).
    let from = addr as usize;
    let len = len.checked_next_multiple_of(page())?;
    let to = from.saturating_add(len);
    if !from.is_multiple_of(page()) || !overlaps(from, len) {
        return None;
    }
    let mut dropped = Vec::new();
    let result = state::run(|| {
        let _calls = state::calls_held();
        let mut table = table();
        sync_range(&table, from, len)?;
        let (gone, kept) = cut(std::mem::take(&mut *table), from, to);
        dropped = gone;
        COUNT.store(kept.len(), Ordering::Release);
        *table = kept;
        Ok(())
    });
    // SAFETY: passed through (the pages are the caller's).
    let rc = unsafe { real::munmap(addr, len) };
    // Tokens drop (closing files, ending mappings) only after the pages are gone.
    state::run(|| {
        drop(dropped);
        Ok(())
    })
    .ok();
    Some(match result {
        Ok(()) => rc,
        Err(e) => {
            errno::set(e);
            -1
        }
    })
}

/// Cuts the mappings of `table` at `from` and `to`: the pieces inside `[from, to)`, then
/// the pieces outside it (each piece still holding its mapping's token and copy).
fn cut(table: Vec<Shared>, from: usize, to: usize) -> (Vec<Shared>, Vec<Shared>) {
    let mut inside = Vec::new();
    let mut outside = Vec::with_capacity(table.len() + 1);
    for mut s in table {
        if s.end() <= from || to <= s.start {
            outside.push(s);
            continue;
        }
        if s.start < from {
            let (before, rest) = s.split(from);
            outside.push(before);
            s = rest;
        }
        if to < s.end() {
            let (within, after) = s.split(to);
            outside.push(after);
            s = within;
        }
        inside.push(s);
    }
    (inside, outside)
}

/// `mprotect` (and `pkey_mprotect`, through `apply`) of a range holding locus mappings:
/// `EACCES` if write access is asked of a mapping whose descriptor was not opened for
/// writing — the kernel's rule, which it cannot apply itself, since the pages are the
/// volume's, mapped read-write — before anything changes; otherwise the mappings' pieces in
/// the range take the new protection, which the library then keeps when it maps pages again
/// (the file growing or shrinking under them).
pub(crate) fn mprotect(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    apply: impl FnOnce() -> c_int,
) -> Option<c_int> {
    let from = addr as usize;
    let len = len.checked_next_multiple_of(page())?;
    if !from.is_multiple_of(page()) || !overlaps(from, len) {
        return None; // the kernel's answer, EINVAL for an unaligned address
    }
    let to = from.saturating_add(len);
    let result = state::run(|| {
        let mut table = table();
        let refused = table.iter().any(|s| {
            s.start < to
                && from < s.end()
                && prot & libc::PROT_WRITE != 0
                && s.token.desc.status.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_RDWR
        });
        if refused {
            return Err(libc::EACCES);
        }
        if apply() != 0 {
            return Err(errno::get());
        }
        let (mut changed, mut kept) = cut(std::mem::take(&mut *table), from, to);
        for s in &mut changed {
            s.prot = prot;
        }
        kept.append(&mut changed);
        COUNT.store(kept.len(), Ordering::Release);
        *table = kept;
        Ok(())
    });
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            errno::set(e);
            -1
        }
    })
}

/// `mremap` of a locus mapping: refused (`EINVAL`); `None` for any other memory.
pub(crate) fn mremap(addr: *mut c_void, len: size_t) -> Option<c_int> {
    overlaps(addr as usize, len.max(1)).then_some(libc::EINVAL)
}

/// Before file `ino` shrinks to `size`: its mappings' pages past the new end map the empty
/// file (the file system frees the blocks right after).
pub(crate) fn before_shrink(ino: u64, size: u64) -> Result<(), c_int> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let page = page() as u64;
    let mut table = table();
    for s in table.iter_mut().filter(|s| s.token.desc.ino == ino) {
        // Bytes from `start` still inside the file: whole pages up to the page holding the
        // last byte (that page keeps its block; the file system zeroes its tail).
        let inside = size.next_multiple_of(page).saturating_sub(s.offset) as usize;
        if inside < s.valid {
            map_past_end(s.start + inside, s.valid - inside, s.prot)?;
            s.valid = inside;
        }
    }
    Ok(())
}

/// After a change of file `ino` (now `size` bytes): its mappings' pages now inside the file
/// map its blocks, and pages of its copy that were damaged until the change replaced them
/// map the copy.
pub(crate) fn after_change(ino: u64, size: u64) -> Result<(), c_int> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let mut table = table();
    let healed = table
        .iter()
        .find(|s| s.token.desc.ino == ino)
        .and_then(|s| s.copy.as_ref())
        .map(|copy| copy.take_healed())
        .unwrap_or_default();
    for s in table.iter_mut().filter(|s| s.token.desc.ino == ino) {
        if let Some(copy) = &s.copy {
            for at in pages_within(&healed, s.offset, s.valid) {
                place_copy(copy, s.start + at, page(), s.offset + at as u64, s.prot)?;
            }
        }
        let mapped_to = s.offset + s.valid as u64;
        if s.valid == s.len || mapped_to >= size {
            continue;
        }
        if let Some(copy) = &s.copy {
            // The copy has grown with the file already (`mapped_copy::change`).
            let now = inside(s.offset, s.len, size);
            place_copy(copy, s.start + s.valid, now - s.valid, mapped_to, s.prot)?;
            s.valid = now;
            continue;
        }
        let file = s.token.desc.file().map_err(|_| libc::EIO)?;
        let runs = file
            .map_shared(mapped_to, (s.len - s.valid) as u64)
            .map_err(|e| fs_errno(&e))?;
        let placed = place(&runs, s.start + s.valid, mapped_to, s.prot);
        // This mapping already counts once (its token).
        file.unmap_shared();
        s.valid += placed?;
    }
    Ok(())
}

/// Whether the process has any shared mapping of a locus file.
pub(crate) fn any() -> bool {
    COUNT.load(Ordering::Acquire) > 0
}

/// Whether `desc`'s file has shared mappings (cheap: one load when none exist anywhere).
pub(crate) fn is_mapped(file: &fs::File) -> bool {
    COUNT.load(Ordering::Acquire) > 0 && (file.is_mapped() || mapped_copy::of(file).is_some())
}

/// At `fork`: every shared mapping becomes a private copy of its bytes (after its stores are
/// written back), and lets go of its file — the parent unmounts the volume next, and another
/// process may reuse the blocks.
pub(crate) fn detach_all() {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut table = table();
    let all: Vec<Shared> = table.drain(..).collect();
    COUNT.store(0, Ordering::Release);
    drop(table);
    for s in &all {
        let _ = s.sync(s.offset, s.valid as u64);
        privatize(s);
    }
    drop(all);
}

/// Replaces a mapping's file pages by an anonymous private copy of them.
fn privatize(s: &Shared) {
    if s.valid == 0 {
        return;
    }
    // SAFETY: a fresh anonymous buffer, copied from readable pages of the mapping (made
    // readable for the copy), then moved over them.
    unsafe {
        let copy = real::mmap64(
            std::ptr::null_mut(),
            s.valid,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if copy == libc::MAP_FAILED {
            return;
        }
        real::mprotect(s.start as *mut c_void, s.valid, libc::PROT_READ);
        // The pages of a copy that could not be filled are `SIGBUS`: not copied, and made
        // so again after the move.
        let page = page();
        let damaged = match &s.copy {
            Some(c) => c.damaged_pages(
                s.offset / page as u64,
                (s.offset + s.valid as u64).div_ceil(page as u64),
            ),
            None => Vec::new(),
        };
        let skipped: Vec<usize> = pages_within(&damaged, s.offset, s.valid).collect();
        let mut at = 0;
        for &end in skipped.iter().chain(std::iter::once(&s.valid)) {
            std::ptr::copy_nonoverlapping(
                (s.start + at) as *const u8,
                copy.cast::<u8>().add(at),
                end - at,
            );
            at = (end + page).min(s.valid);
        }
        real::mprotect(copy, s.valid, s.prot);
        real::mremap(
            copy,
            s.valid,
            s.valid,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            s.start as *mut c_void,
        );
        for at in skipped {
            let _ = map_past_end(s.start + at, page, s.prot);
        }
    }
}

/// At exit and before `exec`: every mapping's stores written back.
pub(crate) fn sync_all() {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let table = table();
    for s in table.iter() {
        let _ = s.sync(s.offset, s.valid as u64);
    }
}
