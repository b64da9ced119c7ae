//! Data: `read`/`write` and their positional and vector forms, `lseek`, the sync calls,
//! `ftruncate`/`truncate`, `fallocate`, `posix_fadvise`, `copy_file_range`, `sendfile`,
//! `splice` and `mmap`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;

use fs::{MAX_FILE_SIZE, MAX_IO};
use libc::{iovec, off_t, size_t, ssize_t};

use super::{fs_errno, mapped_copy, route, shared, size, unit};
use crate::state::{self, Desc, Node};
use crate::{errno, real};

fn readable(desc: &Desc) -> Result<&fs::File, c_int> {
    let file = desc.file()?;
    let status = desc.status.load(Relaxed);
    if status & libc::O_ACCMODE == libc::O_WRONLY || status & libc::O_PATH != 0 {
        return Err(libc::EBADF);
    }
    Ok(file)
}

fn writable(desc: &Desc) -> Result<&fs::File, c_int> {
    let file = desc.file()?;
    let status = desc.status.load(Relaxed);
    if status & libc::O_ACCMODE == libc::O_RDONLY || status & libc::O_PATH != 0 {
        return Err(libc::EBADF);
    }
    Ok(file)
}

/// A read-side error for a directory fd is `EISDIR`; anything else as the file says.
fn reader(fd: c_int) -> Result<std::sync::Arc<Desc>, c_int> {
    let desc = state::desc(fd)?;
    readable(&desc)?;
    Ok(desc)
}

fn writer(fd: c_int) -> Result<std::sync::Arc<Desc>, c_int> {
    let desc = state::desc(fd)?;
    match writable(&desc) {
        Ok(_) => {}
        Err(libc::EISDIR) => return Err(libc::EBADF),
        Err(e) => return Err(e),
    }
    Ok(desc)
}

/// Reads at `offset` into `buf`; short only at the end of the file. A file whose shared
/// mappings map its copy in memory is read from the copy (it holds their stores).
fn read_at(file: &fs::File, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
    match mapped_copy::of(file) {
        Some(copy) => copy.read(buf, offset),
        None => mapped_copy::read_file(file, buf, offset),
    }
}

/// Writes `data` at `offset`: one atomic, durable write (up to 1 GiB; longer writes are
/// cut to that, which `write(2)` allows).
fn write_at(file: &fs::File, data: &[u8], offset: u64) -> Result<usize, c_int> {
    let data = &data[..data.len().min(MAX_IO as usize)];
    // Past the largest file, the file system answers EFBIG itself.
    mapped_copy::change(
        file,
        || file.write_at(data, offset).map_err(|e| fs_errno(&e)),
        |copy| copy.write(file, data, offset),
    )?;
    if shared::is_mapped(file) {
        shared::after_change(file.ino(), file.len())?;
    }
    Ok(data.len())
}

/// Sets a locus file's size, keeping its shared mappings true to it: pages past a new
/// smaller end stop mapping blocks first, pages inside a new larger end map them after.
pub(crate) fn resize(file: &fs::File, size: u64) -> Result<(), c_int> {
    if shared::is_mapped(file) && size < file.len() {
        shared::before_shrink(file.ino(), size)?;
    }
    mapped_copy::change(
        file,
        || file.set_len(size).map_err(|e| fs_errno(&e)),
        |copy| copy.set_len(size),
    )?;
    if shared::is_mapped(file) {
        shared::after_change(file.ino(), size)?;
    }
    Ok(())
}

/// Appends `data` at the end of `file`: the end is read and written under the process's
/// append lock, so two appends never take the same end. Returns the bytes written and where.
fn append(file: &fs::File, data: &[u8]) -> Result<(usize, u64), c_int> {
    let _append = state::ordered(state::rank::APPEND, || state::APPEND.lock());
    let end = file.len();
    Ok((write_at(file, data, end)?, end))
}

/// Whether writes through `desc` append (`O_APPEND`).
fn appends(desc: &Desc) -> bool {
    desc.status.load(Relaxed) & libc::O_APPEND != 0
}

/// Writes at the description's offset (or, with `O_APPEND`, at the end) and advances it.
fn write_here(desc: &Desc, data: &[u8]) -> Result<usize, c_int> {
    let file = writable(desc)?;
    if appends(desc) {
        let (n, end) = append(file, data)?;
        *state::ordered(state::rank::POSITION, || desc.pos.lock()) = end + n as u64;
        return Ok(n);
    }
    let mut pos = state::ordered(state::rank::POSITION, || desc.pos.lock());
    let n = write_at(file, data, *pos)?;
    *pos += n as u64;
    Ok(n)
}

fn read_here(desc: &Desc, buf: &mut [u8]) -> Result<usize, c_int> {
    let file = readable(desc)?;
    let mut pos = state::ordered(state::rank::POSITION, || desc.pos.lock());
    let n = read_at(file, buf, *pos)?;
    *pos += n as u64;
    Ok(n)
}

fn offset(off: off_t) -> Result<u64, c_int> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

/// # Safety
/// `buf` is valid for `count` bytes of writing (or `count` is 0).
unsafe fn out<'a>(buf: *mut c_void, count: size_t) -> &'a mut [u8] {
    if count == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), count) }
}

/// # Safety
/// `buf` is valid for `count` bytes of reading (or `count` is 0).
unsafe fn input<'a>(buf: *const c_void, count: size_t) -> &'a [u8] {
    if count == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), count) }
}

/// `read(2)`.
///
/// # Safety
/// C's: `buf` holds `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::read(fd, buf, count) };
    }
    // SAFETY: C's contract.
    let buf = unsafe { out(buf, count) };
    size(state::run(|| read_here(&*reader(fd)?, buf)))
}

/// `write(2)`.
///
/// # Safety
/// C's: `buf` holds `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::write(fd, buf, count) };
    }
    // SAFETY: C's contract.
    let data = unsafe { input(buf, count) };
    size(state::run(|| write_here(&*writer(fd)?, data)))
}

/// `pread64(2)`.
///
/// # Safety
/// C's: `buf` holds `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    off: off_t,
) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::pread64(fd, buf, count, off) };
    }
    // SAFETY: C's contract.
    let buf = unsafe { out(buf, count) };
    size(state::run(|| {
        let desc = reader(fd)?;
        read_at(readable(&desc)?, buf, offset(off)?)
    }))
}

/// `pread(2)`.
///
/// # Safety
/// As [`pread64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: size_t, off: off_t) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { pread64(fd, buf, count, off) }
}

/// `pwrite64(2)`. On an `O_APPEND` description it appends, as Linux does.
///
/// # Safety
/// C's: `buf` holds `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    off: off_t,
) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::pwrite64(fd, buf, count, off) };
    }
    // SAFETY: C's contract.
    let data = unsafe { input(buf, count) };
    size(state::run(|| {
        let desc = writer(fd)?;
        let off = offset(off)?;
        pwrite_desc(&desc, data, off)
    }))
}

/// A positional write; `O_APPEND` descriptions append, as Linux does.
fn pwrite_desc(desc: &Desc, data: &[u8], off: u64) -> Result<usize, c_int> {
    let file = writable(desc)?;
    if appends(desc) {
        return append(file, data).map(|(n, _)| n);
    }
    write_at(file, data, off)
}

/// `pwrite(2)`.
///
/// # Safety
/// As [`pwrite64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    off: off_t,
) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { pwrite64(fd, buf, count, off) }
}

/// The caller's I/O vectors.
///
/// # Safety
/// `iov` holds `n` valid vectors (when `n` is in range).
unsafe fn vectors<'a>(iov: *const iovec, n: c_int) -> Result<&'a [iovec], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// Reads into the vectors in order from `off` (`None`: the description's offset).
fn readv_desc(desc: &Desc, iov: &[iovec], off: Option<u64>) -> Result<usize, c_int> {
    let file = readable(desc)?;
    let mut pos_guard = match off {
        None => Some(state::ordered(state::rank::POSITION, || desc.pos.lock())),
        Some(_) => None,
    };
    let start = off.unwrap_or_else(|| **pos_guard.as_ref().expect("locked"));
    let mut done = 0usize;
    for v in iov {
        // SAFETY: each vector describes caller memory of `iov_len` bytes.
        let buf = unsafe { out(v.iov_base, v.iov_len) };
        let n = read_at(file, buf, start + done as u64)?;
        done += n;
        if n < buf.len() {
            break;
        }
    }
    if let Some(pos) = pos_guard.as_mut() {
        **pos = start + done as u64;
    }
    Ok(done)
}

/// The vectors' bytes in one slice: borrowed for a single vector, copied for several.
fn gather(iov: &[iovec]) -> std::borrow::Cow<'_, [u8]> {
    match iov {
        // SAFETY: the vector describes caller memory of `iov_len` bytes.
        [one] => unsafe { input(one.iov_base, one.iov_len) }.into(),
        many => {
            let total: usize = many.iter().map(|v| v.iov_len).sum();
            let mut all = Vec::with_capacity(total);
            for v in many {
                // SAFETY: each vector describes caller memory of `iov_len` bytes.
                all.extend_from_slice(unsafe { input(v.iov_base, v.iov_len) });
            }
            all.into()
        }
    }
}

/// Writes the vectors as one atomic write (one log record) at `off` (`None`: the
/// description's offset).
fn writev_desc(desc: &Desc, iov: &[iovec], off: Option<u64>) -> Result<usize, c_int> {
    writable(desc)?;
    let data = gather(iov);
    match off {
        None => write_here(desc, &data),
        Some(off) => pwrite_desc(desc, &data, off),
    }
}

/// `readv(2)`.
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::readv(fd, iov, n) };
    }
    size(state::run(|| {
        // SAFETY: C's contract.
        readv_desc(&*reader(fd)?, unsafe { vectors(iov, n)? }, None)
    }))
}

/// `writev(2)`.
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::writev(fd, iov, n) };
    }
    size(state::run(|| {
        // SAFETY: C's contract.
        writev_desc(&*writer(fd)?, unsafe { vectors(iov, n)? }, None)
    }))
}

fn preadv_locus(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    size(state::run(|| {
        let off = if off == -1 { None } else { Some(offset(off)?) };
        // SAFETY: C's contract, forwarded by the exported callers.
        readv_desc(&*reader(fd)?, unsafe { vectors(iov, n)? }, off)
    }))
}

fn pwritev_locus(fd: c_int, iov: *const iovec, n: c_int, off: off_t, flags: c_int) -> ssize_t {
    size(state::run(|| {
        let off = if off == -1 || flags & libc::RWF_APPEND != 0 {
            None
        } else {
            Some(offset(off)?)
        };
        let desc = writer(fd)?;
        // SAFETY: C's contract, forwarded by the exported callers.
        let iov = unsafe { vectors(iov, n)? };
        if flags & libc::RWF_APPEND != 0 {
            return append(writable(&desc)?, &gather(iov)).map(|(n, _)| n);
        }
        writev_desc(&desc, iov, off)
    }))
}

const RWF_KNOWN: c_int =
    libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_NOWAIT | libc::RWF_APPEND;

/// `preadv64(2)`.
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::preadv64(fd, iov, n, off) };
    }
    if off < 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    preadv_locus(fd, iov, n, off)
}

/// `preadv(2)`.
///
/// # Safety
/// As [`preadv64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { preadv64(fd, iov, n, off) }
}

/// `pwritev64(2)`.
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::pwritev64(fd, iov, n, off) };
    }
    if off < 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    pwritev_locus(fd, iov, n, off, 0)
}

/// `pwritev(2)`.
///
/// # Safety
/// As [`pwritev64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { pwritev64(fd, iov, n, off) }
}

/// `preadv64v2(2)`: offset -1 reads at the file offset; every `RWF_*` flag is honoured by
/// construction (reads never wait for I/O).
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::preadv64v2(fd, iov, n, off, flags) };
    }
    if flags & !RWF_KNOWN != 0 || off < -1 {
        errno::set(if off < -1 {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        });
        return -1;
    }
    preadv_locus(fd, iov, n, off)
}

/// `preadv2(2)`.
///
/// # Safety
/// As [`preadv64v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { preadv64v2(fd, iov, n, off, flags) }
}

/// `pwritev64v2(2)`: every write is durable on return, so `RWF_DSYNC`/`RWF_SYNC` hold;
/// `RWF_APPEND` appends.
///
/// # Safety
/// C's: `iov` holds `n` vectors of valid memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::pwritev64v2(fd, iov, n, off, flags) };
    }
    if flags & !RWF_KNOWN != 0 || off < -1 {
        errno::set(if off < -1 {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        });
        return -1;
    }
    pwritev_locus(fd, iov, n, off, flags)
}

/// `pwritev2(2)`.
///
/// # Safety
/// As [`pwritev64v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { pwritev64v2(fd, iov, n, off, flags) }
}

fn seek(fd: c_int, off: off_t, whence: c_int) -> Result<off_t, c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    let mut pos = state::ordered(state::rank::POSITION, || desc.pos.lock());
    let file = match &desc.node {
        Node::Dir(entries) => {
            // A directory's offset counts entries; seeking to 0 rereads it.
            let target = match whence {
                libc::SEEK_SET => off,
                libc::SEEK_CUR => *pos as i64 + off,
                _ => return Err(libc::EINVAL),
            };
            if target < 0 {
                return Err(libc::EINVAL);
            }
            if target == 0 {
                *entries.lock() = None;
            }
            *pos = target as u64;
            return Ok(target);
        }
        Node::File(file) => file,
    };
    let len = file.len() as i64;
    let target = match whence {
        libc::SEEK_SET => off,
        libc::SEEK_CUR => (*pos as i64).checked_add(off).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_END => len.checked_add(off).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_DATA | libc::SEEK_HOLE => {
            if off < 0 {
                return Err(libc::EINVAL);
            }
            if off >= len {
                return Err(libc::ENXIO);
            }
            if let Some(copy) = mapped_copy::of(file) {
                // Stores through the mappings may have filled holes: the file says so once
                // they are written to it.
                copy.write_back(file, off as u64, len as u64)?;
            }
            let ranges = file
                .data_ranges(off as u64, (len - off) as u64)
                .map_err(|e| fs_errno(&e))?;
            let off_u = off as u64;
            if whence == libc::SEEK_DATA {
                ranges
                    .iter()
                    .find(|r| r.end > off_u)
                    .map(|r| r.start.max(off_u) as i64)
                    .ok_or(libc::ENXIO)?
            } else {
                match ranges.first() {
                    Some(r) if r.start <= off_u => {
                        // Inside data: the hole starts where the run of touching ranges ends.
                        let mut end = r.end;
                        for next in &ranges[1..] {
                            if next.start > end {
                                break;
                            }
                            end = end.max(next.end);
                        }
                        end as i64
                    }
                    _ => off,
                }
            }
        }
        _ => return Err(libc::EINVAL),
    };
    if target < 0 {
        return Err(libc::EINVAL);
    }
    *pos = target as u64;
    Ok(target)
}

/// `lseek64(2)`, with `SEEK_DATA` and `SEEK_HOLE`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::lseek64(fd, off, whence) };
    }
    state::run(|| seek(fd, off, whence)).unwrap_or_else(|e| {
        errno::set(e);
        -1
    })
}

/// `lseek(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: forwarded contract.
    unsafe { lseek64(fd, off, whence) }
}

/// Every write is durable when it returns: syncing is a barrier that reports a stopped
/// file system.
fn sync(fd: c_int) -> Result<(), c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    match &desc.node {
        Node::File(file) => file.sync_all().map_err(|e| fs_errno(&e)),
        Node::Dir(_) => Ok(()),
    }
}

macro_rules! sync_call {
    ($name:ident, $doc:literal, ($($arg:ident: $ty:ty),*), $real:expr) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// None beyond C's.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int $(, $arg: $ty)*) -> c_int {
            if !state::is_locus(fd) {
                // SAFETY: passed through.
                return unsafe { $real(fd $(, $arg)*) };
            }
            unit(state::run(|| sync(fd)))
        }
    };
}

sync_call!(fsync, "`fsync(2)`.", (), real::fsync);
sync_call!(fdatasync, "`fdatasync(2)`.", (), real::fdatasync);
sync_call!(syncfs, "`syncfs(2)`.", (), real::syncfs);
sync_call!(
    sync_file_range,
    "`sync_file_range(2)`.",
    (off: off_t, nbytes: off_t, flags: c_uint),
    real::sync_file_range
);

fn set_len(fd: c_int, len: off_t) -> Result<(), c_int> {
    let desc = state::desc(fd)?;
    let file = match writable(&desc) {
        Ok(file) => file,
        Err(libc::EBADF | libc::EISDIR) => return Err(libc::EINVAL),
        Err(e) => return Err(e),
    };
    let len = offset(len)?;
    if len > MAX_FILE_SIZE {
        return Err(libc::EFBIG);
    }
    resize(file, len)
}

/// `ftruncate64(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::ftruncate64(fd, len) };
    }
    unit(state::run(|| set_len(fd, len)))
}

/// `ftruncate(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { ftruncate64(fd, len) }
}

/// `truncate64(2)`.
///
/// # Safety
/// C's: `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::truncate64(path, len) },
        locus(inner, _slash) => unit(state::run(|| {
            let len = offset(len)?;
            if len > MAX_FILE_SIZE {
                return Err(libc::EFBIG);
            }
            state::with_fs(|fs| {
                let file = fs
                    .open_file(&inner, fs::OpenOptions::read_write())
                    .map_err(|e| fs_errno(&e))?;
                resize(&file, len)
            })
        })),
    )
}

/// `truncate(2)`.
///
/// # Safety
/// As [`truncate64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { truncate64(path, len) }
}

/// `fallocate` for a locus file: the modes as `File::fallocate` reads them (allocation,
/// with or without keeping the size; a punched hole; a zeroed range; others
/// `EOPNOTSUPP`); a mapped file's mappings are told of the change.
fn allocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> Result<(), c_int> {
    let desc = state::desc(fd)?;
    let file = match writable(&desc) {
        Err(libc::EISDIR) => return Err(libc::ENODEV),
        other => other?,
    };
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    (off as u64).checked_add(len as u64).ok_or(libc::EFBIG)?;
    mapped_copy::change(
        file,
        || {
            file.fallocate(mode, off as u64, len as u64)
                .map_err(|e| fs_errno(&e))
        },
        |copy| {
            copy.set_len(file.len())?;
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                copy.zero(file, off as u64, len as u64)?;
            }
            Ok(())
        },
    )?;
    // Also when the size stayed: a punched hole may have replaced a damaged block.
    if shared::is_mapped(file) {
        shared::after_change(file.ino(), file.len())?;
    }
    Ok(())
}

/// `fallocate64(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fallocate64(fd, mode, off, len) };
    }
    unit(state::run(|| allocate(fd, mode, off, len)))
}

/// `fallocate(2)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fallocate64(fd, mode, off, len) }
}

/// `posix_fallocate64(3)` (returns the error number instead of setting `errno`).
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::posix_fallocate64(fd, off, len) };
    }
    match state::run(|| allocate(fd, 0, off, len)) {
        Ok(()) => 0,
        Err(libc::EOPNOTSUPP) => libc::EINVAL,
        Err(e) => e,
    }
}

/// `posix_fallocate(3)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { posix_fallocate64(fd, off, len) }
}

/// `posix_fadvise64(3)`: advice is accepted and has nothing to change (there is no page
/// cache to prefetch into or drop).
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::posix_fadvise64(fd, off, len, advice) };
    }
    match state::run(|| {
        state::desc(fd)?.file()?;
        if !(0..=5).contains(&advice) || len < 0 {
            return Err(libc::EINVAL);
        }
        Ok(())
    }) {
        Ok(()) => 0,
        Err(libc::EISDIR) => libc::ESPIPE,
        Err(e) => e,
    }
}

/// `posix_fadvise(3)`.
///
/// # Safety
/// None beyond C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { posix_fadvise64(fd, off, len, advice) }
}

/// Copies up to `len` bytes between two fds (either may be locus) through a bounce buffer,
/// at explicit offsets where given; the bytes moved.
///
/// # Safety
/// Offset pointers are null or valid.
unsafe fn copy(
    fd_in: c_int,
    off_in: *mut off_t,
    fd_out: c_int,
    off_out: *mut off_t,
    len: usize,
) -> Result<usize, c_int> {
    const CHUNK: usize = 1 << 20;
    let mut buf = vec![0u8; len.min(CHUNK)];
    let mut done = 0usize;
    while done < len {
        let want = (len - done).min(buf.len());
        // SAFETY: our buffer; offsets as the caller gave (null or valid).
        let got = unsafe {
            if off_in.is_null() {
                read(fd_in, buf.as_mut_ptr().cast(), want)
            } else {
                pread64(fd_in, buf.as_mut_ptr().cast(), want, *off_in)
            }
        };
        if got < 0 {
            return if done > 0 {
                Ok(done)
            } else {
                Err(errno::get())
            };
        }
        if got == 0 {
            break;
        }
        let got = got as usize;
        let mut written = 0usize;
        while written < got {
            // SAFETY: as above.
            let n = unsafe {
                let chunk = buf[written..got].as_ptr().cast();
                if off_out.is_null() {
                    write(fd_out, chunk, got - written)
                } else {
                    pwrite64(fd_out, chunk, got - written, *off_out + written as off_t)
                }
            };
            if n <= 0 {
                return if done + written > 0 {
                    Ok(done + written)
                } else {
                    Err(errno::get())
                };
            }
            written += n as usize;
        }
        // SAFETY: valid when non-null (the caller's contract).
        unsafe {
            if !off_in.is_null() {
                *off_in += got as off_t;
            }
            if !off_out.is_null() {
                *off_out += got as off_t;
            }
        }
        done += got;
    }
    Ok(done)
}

/// `copy_file_range(2)`: between locus files, or a locus file and a kernel file, the bytes
/// are copied (no reflinks across these).
///
/// # Safety
/// C's: offset pointers are null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off_t,
    fd_out: c_int,
    off_out: *mut off_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if !state::is_locus(fd_in) && !state::is_locus(fd_out) {
        // SAFETY: passed through.
        return unsafe { real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags) };
    }
    if flags != 0 {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: C's contract.
    size(unsafe { copy(fd_in, off_in, fd_out, off_out, len) })
}

/// `sendfile64(2)`: from or to a locus file, a copy through a buffer.
///
/// # Safety
/// C's: `offset` is null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    if !state::is_locus(out_fd) && !state::is_locus(in_fd) {
        // SAFETY: passed through.
        return unsafe { real::sendfile64(out_fd, in_fd, offset, count) };
    }
    // SAFETY: C's contract.
    size(unsafe { copy(in_fd, offset, out_fd, std::ptr::null_mut(), count) })
}

/// `sendfile(2)`.
///
/// # Safety
/// As [`sendfile64`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe { sendfile64(out_fd, in_fd, offset, count) }
}

/// `splice(2)` moves pages through a pipe; locus files have no page cache to splice
/// (`EINVAL`, as for a file system without splice support).
///
/// # Safety
/// C's: offset pointers are null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut off_t,
    fd_out: c_int,
    off_out: *mut off_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if !state::is_locus(fd_in) && !state::is_locus(fd_out) {
        // SAFETY: passed through.
        return unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) };
    }
    errno::set(libc::EINVAL);
    -1
}

/// `mmap` of a locus file: `MAP_PRIVATE` gets a private copy of the file's bytes (later
/// writes to the file are not seen — POSIX leaves that unspecified — and stores to the
/// mapping never reach the file, as with any private mapping); `MAP_SHARED` maps the file's
/// own blocks ([`shared`]).
fn map_private(
    fd: c_int,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<*mut c_void, c_int> {
    let desc = state::desc(fd)?;
    let file = match readable(&desc) {
        Err(libc::EISDIR) => return Err(libc::ENODEV),
        Err(libc::EBADF) => return Err(libc::EACCES),
        other => other?,
    };
    if flags & libc::MAP_SHARED_VALIDATE != libc::MAP_PRIVATE {
        return shared::map(fd, addr, len, prot, flags, off);
    }
    // SAFETY: sysconf cannot fail for the page size.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as off_t;
    if len == 0 || off < 0 || off % page != 0 {
        return Err(libc::EINVAL);
    }
    let anon = (flags & !libc::MAP_DENYWRITE & !libc::MAP_EXECUTABLE) | libc::MAP_ANONYMOUS;
    // SAFETY: an anonymous mapping at the caller's hint/flags; we fill it before returning.
    let map = unsafe { real::mmap64(addr, len, prot | libc::PROT_WRITE, anon, -1, 0) };
    if map == libc::MAP_FAILED {
        return Err(errno::get());
    }
    // SAFETY: `map` is ours, `len` bytes, writable.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    let filled = read_at(file, bytes, off as u64).and_then(|_| {
        // SAFETY: our mapping; dropping the temporary write permission.
        if prot & libc::PROT_WRITE == 0 && unsafe { real::mprotect(map, len, prot) } != 0 {
            return Err(errno::get());
        }
        Ok(())
    });
    if let Err(e) = filled {
        // SAFETY: our mapping.
        unsafe { real::munmap(map, len) };
        return Err(e);
    }
    Ok(map)
}

/// `mmap64(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS != 0 || !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    }
    state::run(|| map_private(fd, addr, len, prot, flags, off)).unwrap_or_else(|e| {
        errno::set(e);
        libc::MAP_FAILED
    })
}

/// `mmap(2)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: forwarded contract.
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

/// `munmap(2)`: a locus shared mapping's stores are written back first. The library's own
/// calls (the file system dropping one of its mappings, possibly while a write-back holds
/// the table of shared mappings) go straight to libc: they never unmap a program's mapping.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if state::inside() {
        // SAFETY: passed through.
        return unsafe { real::munmap(addr, len) };
    }
    match shared::munmap(addr, len) {
        Some(rc) => rc,
        // SAFETY: passed through.
        None => unsafe { real::munmap(addr, len) },
    }
}

/// `msync(2)`: a locus shared mapping's stores are written back.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    if state::inside() {
        // SAFETY: passed through (the library's own mappings: see `munmap`).
        return unsafe { real::msync(addr, len, flags) };
    }
    match shared::msync(addr, len, flags) {
        Some(rc) => rc,
        // SAFETY: passed through.
        None => unsafe { real::msync(addr, len, flags) },
    }
}

/// `mprotect(2)`: write access to a locus shared mapping needs a descriptor opened for
/// writing, as the kernel has it for its own files ([`shared::mprotect`]).
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    // SAFETY: passed through (after the library's check, for a locus mapping).
    let libc_call = || unsafe { real::mprotect(addr, len, prot) };
    protect(addr, len, prot, libc_call)
}

/// `pkey_mprotect(2)`: as [`mprotect`], the key passed through.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pkey_mprotect(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    pkey: c_int,
) -> c_int {
    // SAFETY: passed through (after the library's check, for a locus mapping).
    let libc_call = || unsafe { real::pkey_mprotect(addr, len, prot, pkey) };
    protect(addr, len, prot, libc_call)
}

/// `libc_call` (libc's `mprotect` or `pkey_mprotect` of the same range), for a locus
/// mapping through [`shared::mprotect`].
fn protect(addr: *mut c_void, len: size_t, prot: c_int, libc_call: impl Fn() -> c_int) -> c_int {
    if state::inside() {
        return libc_call();
    }
    shared::mprotect(addr, len, prot, &libc_call).unwrap_or_else(libc_call)
}

/// `mremap(2)` (variadic in C: the new address is read only with `MREMAP_FIXED`, and the
/// calling conventions pass it in the same register either way): `EINVAL` for a locus
/// shared mapping.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new: *mut c_void,
) -> *mut c_void {
    if !state::inside()
        && let Some(e) = shared::mremap(old, old_len)
    {
        errno::set(e);
        return libc::MAP_FAILED;
    }
    // SAFETY: passed through.
    unsafe { real::mremap(old, old_len, new_len, flags, new) }
}
