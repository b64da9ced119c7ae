//! Directories: `opendir`/`fdopendir`/`readdir`/`closedir` and friends, and `getdents64`.
//! A locus directory stream is our own structure behind the `DIR *`; its entries are read
//! when it is opened (and on `rewinddir`), with `.` and `..` first as on every Linux file
//! system.

use std::ffi::{c_char, c_int, c_long, c_void};

use fs::{Kind, ROOT_INO};
use libc::{DIR, dirent64, size_t, ssize_t};

use super::fd::open_locus;
use super::{fs_errno, route, size};
use crate::stat::dirent_type;
use crate::state::{self, Node};
use crate::{errno, real};

/// One entry as `readdir` reports it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    name: Vec<u8>,
    ino: u64,
    kind: u8,
}

/// The entries of the locus directory `path`, `.` and `..` first.
fn list(path: &str) -> Result<Vec<Entry>, c_int> {
    state::with_fs(|fs| {
        let here = fs.stat(path).map_err(|e| fs_errno(&e))?;
        if here.kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        let parent = match path.rsplit_once('/') {
            Some(("", _)) | None => ROOT_INO,
            Some((parent, _)) => fs.stat(parent).map_or(ROOT_INO, |s| s.ino),
        };
        let mut entries = vec![
            Entry {
                name: b".".to_vec(),
                ino: here.ino,
                kind: libc::DT_DIR,
            },
            Entry {
                name: b"..".to_vec(),
                ino: if path == "/" { ROOT_INO } else { parent },
                kind: libc::DT_DIR,
            },
        ];
        let listed = fs.readdir(path).map_err(|e| fs_errno(&e))?;
        entries.extend(listed.into_iter().map(|e| Entry {
            name: e.name.into_bytes(),
            ino: e.ino,
            kind: dirent_type(e.kind),
        }));
        Ok(entries)
    })
}

/// A locus `DIR`.
#[derive(Debug)]
struct Stream {
    fd: c_int,
    path: String,
    entries: Vec<Entry>,
    next: usize,
    current: dirent64,
}

fn stream_of(dir: *mut DIR) -> Option<&'static mut Stream> {
    if state::is_stream(dir as usize) {
        // SAFETY: the pointer is one of ours (a leaked Box<Stream>) and not yet closed; the
        // program uses a stream from one thread at a time (POSIX).
        Some(unsafe { &mut *dir.cast::<Stream>() })
    } else {
        None
    }
}

fn new_stream(fd: c_int) -> Result<*mut DIR, c_int> {
    let desc = state::desc(fd)?;
    desc.usable()?;
    if !matches!(desc.node, Node::Dir(_)) {
        return Err(libc::ENOTDIR);
    }
    let entries = list(&desc.path)?;
    let stream = Box::new(Stream {
        fd,
        path: desc.path.clone(),
        entries,
        next: 0,
        // SAFETY: plain data.
        current: unsafe { std::mem::zeroed() },
    });
    let ptr = Box::into_raw(stream);
    state::add_stream(ptr as usize);
    Ok(ptr.cast())
}

/// `opendir(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    route!(libc::AT_FDCWD, path,
        // SAFETY: passed through.
        kernel(_dirfd, path) => unsafe { real::opendir(path) },
        locus(inner, slash) => state::run(|| open_stream(&inner, slash)).unwrap_or_else(|e| {
            errno::set(e);
            std::ptr::null_mut()
        }),
    )
}

/// A stream over the locus directory `path`.
fn open_stream(path: &str, trailing_slash: bool) -> Result<*mut DIR, c_int> {
    let fd = open_locus(
        path,
        trailing_slash,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )?;
    new_stream(fd).inspect_err(|_| {
        // SAFETY: the fd we just opened.
        unsafe { super::fd::close(fd) };
    })
}

/// `scandir`'s filter.
type Select = Option<unsafe extern "C" fn(*const dirent64) -> c_int>;
/// `scandir`'s order, as `qsort` calls it (pointers to the array's entry pointers).
type Order = Option<unsafe extern "C" fn(*const c_void, *const c_void) -> c_int>;

/// The entries of the locus directory `path` that `select` keeps, each in its own
/// `malloc`ed `dirent64` (the caller frees them and the array with `free`), sorted by
/// `order`. glibc's `scandir` opens the directory through an internal call this library
/// cannot see, hence this one.
fn scan(
    path: &str,
    trailing_slash: bool,
    list: *mut *mut *mut dirent64,
    select: Select,
    order: Order,
) -> Result<c_int, c_int> {
    let dir = state::run(|| open_stream(path, trailing_slash))?;
    let mut kept: Vec<*mut dirent64> = Vec::new();
    let free_all = |kept: &[*mut dirent64]| {
        for &entry in kept {
            // SAFETY: each came from malloc below.
            unsafe { libc::free(entry.cast()) };
        }
    };
    loop {
        // SAFETY: our open stream; the filter is the caller's, called as scandir does.
        let entry = unsafe { readdir64(dir) };
        if entry.is_null() {
            break;
        }
        // SAFETY: as above.
        if select.is_some_and(|keep| unsafe { keep(entry) } == 0) {
            continue;
        }
        // SAFETY: a fresh allocation of one dirent64, filled from the stream's entry.
        let copy = unsafe { libc::malloc(size_of::<dirent64>()) }.cast::<dirent64>();
        if copy.is_null() {
            free_all(&kept);
            // SAFETY: our stream.
            unsafe { closedir(dir) };
            return Err(libc::ENOMEM);
        }
        // SAFETY: both are whole dirent64 values.
        unsafe { copy.write(entry.read()) };
        kept.push(copy);
    }
    // SAFETY: our stream.
    unsafe { closedir(dir) };
    let count = c_int::try_from(kept.len()).map_err(|_| libc::EOVERFLOW)?;
    // SAFETY: an array of `count` pointers (at least one byte, so never null for 0).
    let array = unsafe { libc::malloc(size_of::<*mut dirent64>() * kept.len().max(1)) }
        .cast::<*mut dirent64>();
    if array.is_null() {
        free_all(&kept);
        return Err(libc::ENOMEM);
    }
    // SAFETY: `array` holds `kept.len()` pointers; qsort with the caller's order over them.
    unsafe {
        std::ptr::copy_nonoverlapping(kept.as_ptr(), array, kept.len());
        if let Some(order) = order {
            libc::qsort(
                array.cast(),
                kept.len(),
                size_of::<*mut dirent64>(),
                Some(order),
            );
        }
        *list = array;
    }
    Ok(count)
}

/// `scandirat(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn scandirat(
    dirfd: c_int,
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    select: Select,
    order: Order,
) -> c_int {
    route!(dirfd, path,
        // SAFETY: passed through.
        kernel(dirfd, path) => unsafe { real::scandirat(dirfd, path, list, select, order) },
        locus(inner, slash) => {
            if list.is_null() {
                errno::set(libc::EFAULT);
                return -1;
            }
            scan(&inner, slash, list, select, order).unwrap_or_else(|e| {
                errno::set(e);
                -1
            })
        },
    )
}

/// `scandirat64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn scandirat64(
    dirfd: c_int,
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    select: Select,
    order: Order,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { scandirat(dirfd, path, list, select, order) }
}

/// `scandir(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn scandir(
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    select: Select,
    order: Order,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { scandirat(libc::AT_FDCWD, path, list, select, order) }
}

/// `scandir64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn scandir64(
    path: *const c_char,
    list: *mut *mut *mut dirent64,
    select: Select,
    order: Order,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { scandirat(libc::AT_FDCWD, path, list, select, order) }
}

/// `fdopendir(3)`: the stream takes over the fd.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::fdopendir(fd) };
    }
    state::run(|| new_stream(fd)).unwrap_or_else(|e| {
        errno::set(e);
        std::ptr::null_mut()
    })
}

/// `closedir(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closedir(dir: *mut DIR) -> c_int {
    if !state::remove_stream(dir as usize) {
        // SAFETY: passed through.
        return unsafe { real::closedir(dir) };
    }
    // SAFETY: ours (checked), removed from the set so never used again.
    let stream = unsafe { Box::from_raw(dir.cast::<Stream>()) };
    // SAFETY: the stream's own fd.
    unsafe { super::fd::close(stream.fd) }
}

fn next_entry(stream: &mut Stream) -> Option<*mut dirent64> {
    let entry = stream.entries.get(stream.next)?;
    stream.next += 1;
    let d = &mut stream.current;
    d.d_ino = entry.ino;
    d.d_off = stream.next as i64;
    d.d_reclen = size_of::<dirent64>() as u16;
    d.d_type = entry.kind;
    let name = &entry.name[..entry.name.len().min(d.d_name.len() - 1)];
    for (dst, &src) in d.d_name.iter_mut().zip(name) {
        *dst = src as c_char;
    }
    d.d_name[name.len()] = 0;
    Some(d)
}

/// `readdir64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir64(dir: *mut DIR) -> *mut dirent64 {
    match stream_of(dir) {
        // End of the directory: null with errno unchanged.
        Some(stream) => next_entry(stream).unwrap_or(std::ptr::null_mut()),
        // SAFETY: passed through.
        None => unsafe { real::readdir64(dir) },
    }
}

/// `readdir(3)` (`struct dirent` is `struct dirent64` on 64-bit Linux).
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir(dir: *mut DIR) -> *mut dirent64 {
    // SAFETY: forwarded contract.
    unsafe { readdir64(dir) }
}

/// `readdir64_r(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut DIR,
    entry: *mut dirent64,
    result: *mut *mut dirent64,
) -> c_int {
    let Some(stream) = stream_of(dir) else {
        // SAFETY: passed through.
        return unsafe { real::readdir64_r(dir, entry, result) };
    };
    // SAFETY: the caller's entry buffer and result pointer.
    unsafe {
        match next_entry(stream) {
            Some(d) => {
                *entry = *d;
                *result = entry;
            }
            None => *result = std::ptr::null_mut(),
        }
    }
    0
}

/// `readdir_r(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir_r(
    dir: *mut DIR,
    entry: *mut dirent64,
    result: *mut *mut dirent64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { readdir64_r(dir, entry, result) }
}

/// `rewinddir(3)`: reads the directory again.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rewinddir(dir: *mut DIR) {
    let Some(stream) = stream_of(dir) else {
        // SAFETY: passed through.
        return unsafe { real::rewinddir(dir) };
    };
    if let Ok(entries) = state::run(|| list(&stream.path)) {
        stream.entries = entries;
    }
    stream.next = 0;
}

/// `telldir(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn telldir(dir: *mut DIR) -> c_long {
    match stream_of(dir) {
        Some(stream) => stream.next as c_long,
        // SAFETY: passed through.
        None => unsafe { real::telldir(dir) },
    }
}

/// `seekdir(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn seekdir(dir: *mut DIR, pos: c_long) {
    match stream_of(dir) {
        Some(stream) => stream.next = pos.max(0) as usize,
        // SAFETY: passed through.
        None => unsafe { real::seekdir(dir, pos) },
    }
}

/// `dirfd(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dirfd(dir: *mut DIR) -> c_int {
    match stream_of(dir) {
        Some(stream) => stream.fd,
        // SAFETY: passed through.
        None => unsafe { real::dirfd(dir) },
    }
}

/// `getdents64(2)` on a locus directory fd: entries from the fd's offset (an entry index).
///
/// # Safety
/// C's: `buf` holds `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if !state::is_locus(fd) {
        // SAFETY: passed through.
        return unsafe { real::getdents64(fd, buf, count) };
    }
    size(state::run(|| {
        let desc = state::desc(fd)?;
        desc.usable()?;
        let Node::Dir(cache) = &desc.node else {
            return Err(libc::ENOTDIR);
        };
        // Listing takes the mount, which ranks above the offset: the listing is made with
        // neither the offset nor the cache held, then installed (again if another thread
        // rewound the fd in between).
        let mut listed = None;
        let (mut pos, cache) = loop {
            let pos = state::ordered(state::rank::POSITION, || desc.pos.lock());
            let mut cache = cache.lock();
            if cache.is_some() && *pos != 0 {
                break (pos, cache);
            }
            if let Some(fresh) = listed.take() {
                *cache = Some(fresh);
                break (pos, cache);
            }
            drop(cache);
            drop(pos);
            listed = Some(list(&desc.path)?);
        };
        let entries = cache.as_ref().expect("listed");
        // SAFETY: the caller's buffer of `count` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) };
        let mut used = 0usize;
        const HEADER: usize = 19; // d_ino (8) + d_off (8) + d_reclen (2) + d_type (1)
        while let Some(entry) = entries.get(*pos as usize) {
            let reclen = (HEADER + entry.name.len() + 1).next_multiple_of(8);
            if used + reclen > count {
                if used == 0 {
                    return Err(libc::EINVAL);
                }
                break;
            }
            let record = &mut out[used..used + reclen];
            record.fill(0);
            record[0..8].copy_from_slice(&entry.ino.to_ne_bytes());
            record[8..16].copy_from_slice(&(*pos as i64 + 1).to_ne_bytes());
            record[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
            record[18] = entry.kind;
            record[HEADER..HEADER + entry.name.len()].copy_from_slice(&entry.name);
            used += reclen;
            *pos += 1;
        }
        Ok(used)
    }))
}
