//! The file system's C API: `include/locus_fs.h` implemented over the `fs` crate.
//!
//! Handles are boxed Rust values behind opaque pointers; every function checks its pointers
//! for NULL, returns a negative errno (or NULL with `errno` set), and leaves a description
//! of the failure for `locus_last_error`. No Rust panic crosses into C: each entry point
//! catches one and reports it as `-EIO`.
//!
//! Invariants: this crate holds the only `unsafe` of the C boundary, and it is limited to
//! turning caller pointers into references and slices for the length the caller gave; every
//! block says what the caller promised (the header's contract) that makes it sound.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use fs::{
    Buffer, CheckpointMode, DirEntry, File, Fs, FsError, FsOptions, Kind, OpenOptions, Stat,
    XattrSet,
};

/// The interface version this library implements (`LOCUS_FS_API_VERSION`). Version 2 added
/// owners and the access and change times to `struct locus_stat` (a larger struct: a
/// program built for version 1 must be built again), and `locus_fallocate`, `locus_chown`
/// and the extended-attribute calls. Version 3 added `O_TMPFILE` to `locus_open`, and
/// `locus_link` and `locus_flink`.
pub const API_VERSION: u32 = 3;

/// `LOCUS_NO_OWNER`: the owner of a file made before the volume kept owners, and in
/// `locus_chown` "leave it as it is".
pub const NO_OWNER: u32 = u32::MAX;

/// `LOCUS_KIND_FILE`.
pub const KIND_FILE: u32 = 1;
/// `LOCUS_KIND_DIR`.
pub const KIND_DIR: u32 = 2;
/// `LOCUS_KIND_SYMLINK` (seen in directory listings; path calls report a link they meet
/// as `ELOOP`: the C API does not follow links).
pub const KIND_SYMLINK: u32 = 3;
/// `LOCUS_KIND_SPECIAL`: a FIFO, a socket's name or a device node.
pub const KIND_SPECIAL: u32 = 4;

/// An open file system (`locus_fs`).
#[derive(Debug)]
pub struct LocusFs(Fs);

/// An open file (`locus_file`).
#[derive(Debug)]
pub struct LocusFile(File);

/// A persistent buffer (`locus_buffer`).
#[derive(Debug)]
pub struct LocusBuffer(Buffer);

/// A directory listing being read (`locus_dir`).
#[derive(Debug)]
pub struct LocusDir {
    entries: std::vec::IntoIter<DirEntry>,
}

/// `struct locus_stat`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LocusStat {
    pub ino: u64,
    pub kind: u32,
    pub mode: u32,
    pub size: u64,
    pub allocated: u64,
    pub mtime_ns: u64,
    pub nlink: u64,
    pub atime_ns: u64,
    pub ctime_ns: u64,
    pub uid: u32,
    pub gid: u32,
}

/// `struct locus_dirent`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LocusDirent {
    pub ino: u64,
    pub kind: u32,
    pub name: [c_char; 256],
}

/// `struct locus_fs_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LocusFsStats {
    pub caller_bytes: u64,
    pub media_bytes: u64,
    pub write_amplification: f64,
    pub writes: u64,
    pub records_pending: u64,
    pub checkpoint_lag: u64,
    pub checkpoint_batches: u64,
    pub checkpointed_records: u64,
    pub remapped_blocks: u64,
    pub copied_bytes: u64,
    pub snapshots: u64,
    pub backpressure_waits: u64,
    pub inodes: u64,
}

/// `struct locus_fs_options`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LocusFsOptions {
    pub prelim_buffers: u32,
    pub prelim_buffer_bytes: u64,
    pub on_demand_checkpoint: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure on its way to C: an errno and what to tell `locus_last_error`.
struct Failure {
    errno: c_int,
    message: String,
}

impl From<FsError> for Failure {
    fn from(e: FsError) -> Self {
        Self {
            errno: e.errno(),
            message: e.to_string(),
        }
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        errno: libc::EINVAL,
        message: message.into(),
    }
}

/// A NULL where a handle belongs.
fn null_handle(what: &str) -> Failure {
    Failure {
        errno: libc::EBADF,
        message: format!("{what} is NULL"),
    }
}

fn remember(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `body`, turning a failure or a panic into `-errno` (and the thread's last error).
fn call(body: impl FnOnce() -> Result<i64, Failure>) -> i64 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(failure)) => {
            remember(&failure.message);
            -i64::from(failure.errno)
        }
        Err(_) => {
            remember("internal error: locus panicked (a bug; see the process's log)");
            -i64::from(libc::EIO)
        }
    }
}

/// Like [`call`] for functions returning a handle: NULL and `errno` on failure.
fn call_ptr<T>(body: impl FnOnce() -> Result<Box<T>, Failure>) -> *mut T {
    let mut handle = std::ptr::null_mut();
    let status = call(|| {
        handle = Box::into_raw(body()?);
        Ok(0)
    });
    if status < 0 {
        set_errno(-status as c_int);
    }
    handle
}

fn status(value: i64) -> c_int {
    value as c_int
}

fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid for the thread.
    unsafe { *libc::__errno_location() = value };
}

/// The string a caller passed, which the header requires to be NUL-terminated UTF-8.
///
/// # Safety
/// `text` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn str_arg<'a>(text: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if text.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(text) };
    bytes
        .to_str()
        .map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

/// The handle behind a caller's pointer.
///
/// # Safety
/// `handle` is NULL or a live handle of this type from this library, not being freed.
unsafe fn handle<'a, T>(handle: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: by the caller's contract a non-NULL pointer is a live `Box<T>` of ours.
    unsafe { handle.as_ref() }.ok_or_else(|| null_handle(what))
}

/// Takes back a handle the caller hands over for good (close, unmount, commit, free).
///
/// # Safety
/// `handle` is NULL or a live handle of this type from this library, not used afterwards.
unsafe fn take<T>(handle: *mut T, what: &str) -> Result<Box<T>, Failure> {
    if handle.is_null() {
        return Err(null_handle(what));
    }
    // SAFETY: by the caller's contract a live `Box<T>` of ours, never used again.
    Ok(unsafe { Box::from_raw(handle) })
}

fn fs_options(options: *const LocusFsOptions) -> Result<FsOptions, Failure> {
    let mut result = FsOptions::default();
    // SAFETY: the header says `options` is NULL or points to a `struct locus_fs_options`.
    let Some(given) = (unsafe { options.as_ref() }) else {
        return Ok(result);
    };
    if given.prelim_buffers != 0 {
        if given.prelim_buffers > 16 {
            return Err(invalid(format!(
                "prelim_buffers is {}: at most 16",
                given.prelim_buffers
            )));
        }
        result.prelim_buffers = given.prelim_buffers as usize;
    }
    if given.prelim_buffer_bytes != 0 {
        result.prelim_buffer_bytes = given.prelim_buffer_bytes;
    }
    if given.on_demand_checkpoint != 0 {
        result.checkpoint = CheckpointMode::OnDemand;
    }
    Ok(result)
}

/// Opens the volume in `dir` (or the default one) on this machine's topology.
fn open_volume(dir: *const c_char) -> Result<Arc<volume::Volume>, Failure> {
    let dir = if dir.is_null() {
        std::env::var_os("LOCUS_VOLUME")
            .map_or_else(|| PathBuf::from("/dev/shm/locus"), PathBuf::from)
    } else {
        // SAFETY: non-NULL and NUL-terminated by the header's contract.
        PathBuf::from(unsafe { str_arg(dir, "volume_dir") }?)
    };
    let sysfs = std::env::var_os("LOCUS_SYSFS")
        .map_or_else(|| PathBuf::from(topology::LIVE_SYSFS), PathBuf::from);
    let topology = topology::Topology::read_from(&sysfs).map_err(|e| Failure {
        errno: libc::EIO,
        message: format!("reading the machine's layout from {}: {e}", sysfs.display()),
    })?;
    let volume = volume::Volume::open(&dir, topology, &volume::OpenOptions::default())
        .map_err(|e| Failure::from(FsError::from(e)))?;
    Ok(Arc::new(volume))
}

fn stat_out(stat: &Stat) -> LocusStat {
    LocusStat {
        ino: stat.ino,
        kind: kind_code(stat.kind),
        mode: stat.mode,
        size: stat.size,
        allocated: stat.allocated,
        mtime_ns: stat.mtime_ns,
        nlink: stat.nlink,
        atime_ns: stat.atime_ns,
        ctime_ns: stat.ctime_ns,
        uid: stat.uid.unwrap_or(NO_OWNER),
        gid: stat.gid.unwrap_or(NO_OWNER),
    }
}

fn kind_code(kind: Kind) -> u32 {
    match kind {
        Kind::File => KIND_FILE,
        Kind::Dir => KIND_DIR,
        Kind::Symlink => KIND_SYMLINK,
        Kind::Fifo | Kind::Socket | Kind::CharDevice | Kind::BlockDevice => KIND_SPECIAL,
    }
}

/// Writes `value` through a caller's out-pointer.
fn out<T>(target: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if target.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and by the header's contract it points to a writable `T`.
    unsafe { target.write(value) };
    Ok(())
}

/// A caller's buffer as a slice.
///
/// # Safety
/// `data` is valid for `len` bytes (reads) when non-NULL.
unsafe fn bytes<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(invalid("data is NULL"));
    }
    // SAFETY: the caller gave `len` readable bytes at `data`.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// A caller's buffer as a mutable slice.
///
/// # Safety
/// `data` is valid for `len` bytes (writes) when non-NULL, and nothing else uses it.
unsafe fn bytes_mut<'a>(data: *mut c_void, len: usize) -> Result<&'a mut [u8], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    if data.is_null() {
        return Err(invalid("data is NULL"));
    }
    // SAFETY: the caller gave `len` writable bytes at `data`, for this call only.
    Ok(unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) })
}

/// Open flags the C API accepts and ignores: every write is durable on return, nothing is
/// cached, there are no symbolic links.
const IGNORED_FLAGS: c_int = libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_DIRECT
    | libc::O_CLOEXEC
    | libc::O_LARGEFILE
    | libc::O_NOATIME
    | libc::O_NOFOLLOW;

fn open_options(flags: c_int, mode: u32) -> Result<OpenOptions, Failure> {
    // (`O_TMPFILE` holds `O_DIRECTORY`, which alone stays refused.)
    let tmpfile = if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        libc::O_TMPFILE
    } else {
        0
    };
    let known =
        libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | tmpfile | IGNORED_FLAGS;
    if flags & libc::O_APPEND != 0 {
        return Err(invalid(
            "O_APPEND is not supported: writes are positional (append at locus_fstat's size)",
        ));
    }
    if flags & !known != 0 {
        return Err(invalid(format!(
            "open flags {:#o} are not supported",
            flags & !known
        )));
    }
    let (read, write) = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => (true, false),
        libc::O_WRONLY => (false, true),
        libc::O_RDWR => (true, true),
        _ => {
            return Err(invalid(
                "the access mode is not O_RDONLY, O_WRONLY or O_RDWR",
            ));
        }
    };
    let (create, exclusive, truncate) = (
        flags & libc::O_CREAT != 0,
        flags & libc::O_EXCL != 0,
        flags & libc::O_TRUNC != 0,
    );
    if truncate && !write {
        return Err(invalid("O_TRUNC needs O_WRONLY or O_RDWR"));
    }
    Ok(OpenOptions {
        read,
        write,
        create,
        exclusive,
        truncate,
        mode: mode & 0o7777,
    })
}

/// The interface version the library implements.
#[unsafe(no_mangle)]
pub extern "C" fn locus_fs_api_version() -> u32 {
    API_VERSION
}

/// The calling thread's description of its last failure.
#[unsafe(no_mangle)]
pub extern "C" fn locus_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Opens the file system on a volume, recovering from any crash.
///
/// # Safety
/// `volume_dir` is NULL or a NUL-terminated string; `options` is NULL or points to a
/// `struct locus_fs_options`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fs_open(
    volume_dir: *const c_char,
    options: *const LocusFsOptions,
) -> *mut LocusFs {
    call_ptr(|| {
        let options = fs_options(options)?;
        // The file system's threads start here: with the caller's signals blocked, so that
        // none of them takes a signal meant for the program.
        topology::with_signals_blocked(|| {
            let volume = open_volume(volume_dir)?;
            Ok(Box::new(LocusFs(Fs::open(volume, options)?)))
        })
    })
}

/// Creates an empty file system on a volume and opens it.
///
/// # Safety
/// As for [`locus_fs_open`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fs_format(
    volume_dir: *const c_char,
    options: *const LocusFsOptions,
) -> *mut LocusFs {
    call_ptr(|| {
        let options = fs_options(options)?;
        // As in `locus_fs_open`: the file system's threads start with the signals blocked.
        topology::with_signals_blocked(|| {
            let volume = open_volume(volume_dir)?;
            let capacity = volume.stats().iter().map(|d| d.capacity_bytes).sum();
            Ok(Box::new(LocusFs(Fs::format(
                volume,
                &fs::FormatOptions::scaled_to(capacity),
                options,
            )?)))
        })
    })
}

/// Unmounts and frees `fs`.
///
/// # Safety
/// `fs` is NULL or a live handle from this library, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fs_unmount(fs: *mut LocusFs) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract: `fs` is not used afterwards.
        unsafe { take(fs, "fs") }?.0.unmount()?;
        Ok(0)
    }))
}

/// Waits until everything logged so far is checkpointed.
///
/// # Safety
/// `fs` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fs_checkpoint(fs: *mut LocusFs) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        unsafe { handle(fs, "fs") }?.0.checkpoint()?;
        Ok(0)
    }))
}

/// Fills `*stats`.
///
/// # Safety
/// `fs` is NULL or a live handle; `stats` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fs_stats(fs: *mut LocusFs, stats: *mut LocusFsStats) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        let s = unsafe { handle(fs, "fs") }?.0.stats();
        out(
            stats,
            LocusFsStats {
                caller_bytes: s.caller_bytes,
                media_bytes: s.media_bytes,
                write_amplification: s.write_amplification,
                writes: s.writes,
                records_pending: s.records_pending,
                checkpoint_lag: s.checkpoint_lag,
                checkpoint_batches: s.checkpoint_batches,
                checkpointed_records: s.checkpointed_records,
                remapped_blocks: s.remapped_blocks,
                copied_bytes: s.copied_bytes,
                snapshots: s.snapshots,
                backpressure_waits: s.backpressure_waits,
                inodes: s.inodes,
            },
            "stats",
        )?;
        Ok(0)
    }))
}

/// Opens a file.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_open(
    fs: *mut LocusFs,
    path: *const c_char,
    flags: c_int,
    mode: u32,
) -> *mut LocusFile {
    call_ptr(|| {
        // SAFETY: the header's contract for handles and strings.
        let (fs, path) = unsafe { (handle(fs, "fs")?, str_arg(path, "path")?) };
        let options = open_options(flags, mode)?;
        if flags & libc::O_TMPFILE == libc::O_TMPFILE {
            if options.create || options.truncate || !options.write {
                return Err(invalid(
                    "O_TMPFILE takes O_WRONLY or O_RDWR, and neither O_CREAT nor O_TRUNC",
                ));
            }
            let file =
                fs.0.create_unnamed(path, options.mode, options.read, options.exclusive)?;
            return Ok(Box::new(LocusFile(file)));
        }
        Ok(Box::new(LocusFile(fs.0.open_file(path, options)?)))
    })
}

/// Closes and frees a file.
///
/// # Safety
/// `file` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_close(file: *mut LocusFile) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract: `file` is not used afterwards.
        unsafe { take(file, "file") }?.0.close()?;
        Ok(0)
    }))
}

/// Writes `len` bytes at `offset`.
///
/// # Safety
/// `file` is NULL or a live handle; `data` valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_pwrite(
    file: *mut LocusFile,
    data: *const c_void,
    len: usize,
    offset: u64,
) -> isize {
    call(|| {
        // SAFETY: the header's contract for handles and buffers.
        let (file, data) = unsafe { (handle(file, "file")?, bytes(data, len)?) };
        file.0.write_at(data, offset)?;
        Ok(len as i64)
    }) as isize
}

/// Reads up to `len` bytes at `offset`.
///
/// # Safety
/// `file` is NULL or a live handle; `data` writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_pread(
    file: *mut LocusFile,
    data: *mut c_void,
    len: usize,
    offset: u64,
) -> isize {
    call(|| {
        // SAFETY: the header's contract for handles and buffers.
        let (file, data) = unsafe { (handle(file, "file")?, bytes_mut(data, len)?) };
        Ok(file.0.read_at(data, offset)? as i64)
    }) as isize
}

/// Sets a file's size.
///
/// # Safety
/// `file` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_ftruncate(file: *mut LocusFile, size: u64) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        unsafe { handle(file, "file") }?.0.set_len(size)?;
        Ok(0)
    }))
}

/// `fallocate(2)`'s modes on an open file: 0 and `FALLOC_FL_KEEP_SIZE` allocate,
/// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` punches a hole, `FALLOC_FL_ZERO_RANGE`
/// (with or without `KEEP_SIZE`) zeroes with the blocks allocated; others `-EOPNOTSUPP`.
///
/// # Safety
/// `file` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fallocate(
    file: *mut LocusFile,
    mode: c_int,
    offset: u64,
    len: u64,
) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        unsafe { handle(file, "file") }?
            .0
            .fallocate(mode, offset, len)?;
        Ok(0)
    }))
}

/// A durability barrier.
///
/// # Safety
/// `file` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fsync(file: *mut LocusFile) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        unsafe { handle(file, "file") }?.0.sync_all()?;
        Ok(0)
    }))
}

/// Fills `*stat` for an open file.
///
/// # Safety
/// `file` is NULL or a live handle; `stat` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_fstat(file: *mut LocusFile, stat: *mut LocusStat) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles.
        let file = unsafe { handle(file, "file") }?;
        out(stat, stat_out(&file.0.stat()), "stat")?;
        Ok(0)
    }))
}

/// Runs a path operation: `fs` and `path` checked, then `op`.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a NUL-terminated string.
unsafe fn path_op(
    fs: *mut LocusFs,
    path: *const c_char,
    op: impl FnOnce(&Fs, &str) -> Result<(), Failure>,
) -> c_int {
    status(call(|| {
        // SAFETY: the caller passes on the header's contract.
        let (fs, path) = unsafe { (handle(fs, "fs")?, str_arg(path, "path")?) };
        op(&fs.0, path)?;
        Ok(0)
    }))
}

/// [`path_op`] of a call that takes two paths (`from`, then `to`).
///
/// # Safety
/// As [`path_op`], `to` like `from`.
unsafe fn two_path_op(
    fs: *mut LocusFs,
    from: *const c_char,
    to: *const c_char,
    op: impl FnOnce(&Fs, &str, &str) -> Result<(), Failure>,
) -> c_int {
    // SAFETY: passed on; `to` by the same contract as `from`.
    unsafe {
        path_op(fs, from, |fs, from| {
            let to = str_arg(to, "to")?;
            op(fs, from, to)
        })
    }
}

/// Fills `*stat` for a path.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string; `stat` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_stat(
    fs: *mut LocusFs,
    path: *const c_char,
    stat: *mut LocusStat,
) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe {
        path_op(fs, path, |fs, path| {
            out(stat, stat_out(&fs.stat(path)?), "stat")
        })
    }
}

/// Creates a directory.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_mkdir(fs: *mut LocusFs, path: *const c_char, mode: u32) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { path_op(fs, path, |fs, path| Ok(fs.mkdir(path, mode & 0o7777)?)) }
}

/// Removes an empty directory.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_rmdir(fs: *mut LocusFs, path: *const c_char) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { path_op(fs, path, |fs, path| Ok(fs.rmdir(path)?)) }
}

/// Removes a file's name.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_unlink(fs: *mut LocusFs, path: *const c_char) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { path_op(fs, path, |fs, path| Ok(fs.unlink(path)?)) }
}

/// Gives the file or symbolic link at `from` the further name `to` (a hard link).
///
/// # Safety
/// `fs` is NULL or a live handle; `from` and `to` NULL or strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_link(
    fs: *mut LocusFs,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { two_path_op(fs, from, to, |fs, from, to| Ok(fs.link(from, to)?)) }
}

/// Names the open file `to` too — or first, a file opened with `O_TMPFILE`.
///
/// # Safety
/// `file` is NULL or a live handle; `to` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_flink(file: *mut LocusFile, to: *const c_char) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles and strings.
        let (file, to) = unsafe { (handle(file, "file")?, str_arg(to, "to")?) };
        file.0.link(to)?;
        Ok(0)
    }))
}

/// Renames atomically.
///
/// # Safety
/// `fs` is NULL or a live handle; `from` and `to` NULL or strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_rename(
    fs: *mut LocusFs,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { two_path_op(fs, from, to, |fs, from, to| Ok(fs.rename(from, to)?)) }
}

/// Sets the size of the file at `path`.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_truncate(fs: *mut LocusFs, path: *const c_char, size: u64) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { path_op(fs, path, |fs, path| Ok(fs.truncate(path, size)?)) }
}

/// Sets permission bits.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_chmod(fs: *mut LocusFs, path: *const c_char, mode: u32) -> c_int {
    // SAFETY: passed on from our caller.
    unsafe { path_op(fs, path, |fs, path| Ok(fs.chmod(path, mode & 0o7777)?)) }
}

/// Sets the owner (`LOCUS_NO_OWNER`: that id unchanged) of what `path` names, a symbolic
/// link itself included.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_chown(
    fs: *mut LocusFs,
    path: *const c_char,
    uid: u32,
    gid: u32,
) -> c_int {
    let id = |id: u32| (id != NO_OWNER).then_some(id);
    // SAFETY: passed on from our caller.
    unsafe {
        path_op(fs, path, |fs, path| {
            Ok(fs.set_owner(path, id(uid), id(gid), false)?)
        })
    }
}

/// Sets extended attribute `name` of what `path` names to `size` bytes at `value`; `flags`
/// 0, `XATTR_CREATE` or `XATTR_REPLACE`.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` and `name` NULL or strings; `value` valid for
/// `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_setxattr(
    fs: *mut LocusFs,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    // SAFETY: passed on from our caller; `name` and `value` by the same contract.
    unsafe {
        path_op(fs, path, |fs, path| {
            let (name, value) = (str_arg(name, "name")?, bytes(value, size)?);
            let how = match flags {
                0 => XattrSet::Any,
                libc::XATTR_CREATE => XattrSet::Create,
                libc::XATTR_REPLACE => XattrSet::Replace,
                _ => return Err(invalid(format!("xattr flags {flags:#x}"))),
            };
            Ok(fs.set_xattr(path, name, value, how, false)?)
        })
    }
}

/// Copies a value or a list into a caller's buffer as `getxattr(2)` does: with `size` 0
/// only its length; `ERANGE` when it does not fit.
fn give_out(bytes: &[u8], out: *mut c_void, size: usize) -> Result<i64, Failure> {
    if size == 0 {
        return Ok(bytes.len() as i64);
    }
    if bytes.len() > size {
        return Err(Failure {
            errno: libc::ERANGE,
            message: format!("{} bytes do not fit the buffer of {size}", bytes.len()),
        });
    }
    // SAFETY: the caller gave `size` writable bytes at `out` (header's contract).
    unsafe { bytes_mut(out, size) }?[..bytes.len()].copy_from_slice(bytes);
    Ok(bytes.len() as i64)
}

/// Reads extended attribute `name` into `value` (`size` 0: only its length).
///
/// # Safety
/// `fs` is NULL or a live handle; `path` and `name` NULL or strings; `value` writable for
/// `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_getxattr(
    fs: *mut LocusFs,
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: usize,
) -> isize {
    call(|| {
        // SAFETY: the header's contract for handles and strings.
        let (fs, path, name) = unsafe {
            (
                handle(fs, "fs")?,
                str_arg(path, "path")?,
                str_arg(name, "name")?,
            )
        };
        give_out(&fs.0.get_xattr(path, name, false)?, value, size)
    }) as isize
}

/// Lists the extended attributes' names, each NUL-terminated (`size` 0: only the length).
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string; `list` writable for `size`
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_listxattr(
    fs: *mut LocusFs,
    path: *const c_char,
    list: *mut c_char,
    size: usize,
) -> isize {
    call(|| {
        // SAFETY: the header's contract for handles and strings.
        let (fs, path) = unsafe { (handle(fs, "fs")?, str_arg(path, "path")?) };
        let mut names = Vec::new();
        for name in fs.0.list_xattrs(path, false)? {
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        give_out(&names, list.cast(), size)
    }) as isize
}

/// Removes extended attribute `name` (`-ENODATA` when there is none).
///
/// # Safety
/// `fs` is NULL or a live handle; `path` and `name` NULL or strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_removexattr(
    fs: *mut LocusFs,
    path: *const c_char,
    name: *const c_char,
) -> c_int {
    // SAFETY: passed on from our caller; `name` by the same contract.
    unsafe {
        path_op(fs, path, |fs, path| {
            Ok(fs.remove_xattr(path, str_arg(name, "name")?, false)?)
        })
    }
}

/// Lists a directory.
///
/// # Safety
/// `fs` is NULL or a live handle; `path` NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_opendir(fs: *mut LocusFs, path: *const c_char) -> *mut LocusDir {
    call_ptr(|| {
        // SAFETY: the header's contract for handles and strings.
        let (fs, path) = unsafe { (handle(fs, "fs")?, str_arg(path, "path")?) };
        Ok(Box::new(LocusDir {
            entries: fs.0.readdir(path)?.into_iter(),
        }))
    })
}

/// The next directory entry: 1, or 0 at the end.
///
/// # Safety
/// `dir` is NULL or a live handle; `entry` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_readdir(dir: *mut LocusDir, entry: *mut LocusDirent) -> c_int {
    status(call(|| {
        if dir.is_null() {
            return Err(null_handle("dir"));
        }
        if entry.is_null() {
            return Err(invalid("entry is NULL"));
        }
        // SAFETY: a live `Box<LocusDir>` of ours; one thread reads a listing at a time.
        let dir = unsafe { &mut *dir };
        let Some(next) = dir.entries.next() else {
            return Ok(0);
        };
        let mut name = [0 as c_char; 256];
        for (to, &from) in name.iter_mut().zip(next.name.as_bytes().iter().take(255)) {
            *to = from as c_char;
        }
        out(
            entry,
            LocusDirent {
                ino: next.ino,
                kind: kind_code(next.kind),
                name,
            },
            "entry",
        )?;
        Ok(1)
    }))
}

/// Frees a listing.
///
/// # Safety
/// `dir` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_closedir(dir: *mut LocusDir) {
    // SAFETY: the header's contract: `dir` is not used afterwards.
    drop(unsafe { take(dir, "dir") });
}

/// A persistent buffer on the calling thread's node.
///
/// # Safety
/// `fs` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_buffer_new(fs: *mut LocusFs, len: usize) -> *mut LocusBuffer {
    call_ptr(|| {
        // SAFETY: the header's contract for handles.
        let fs = unsafe { handle(fs, "fs") }?;
        Ok(Box::new(LocusBuffer(fs.0.buffer(len as u64)?)))
    })
}

/// A buffer's length (0 for NULL).
///
/// # Safety
/// `buffer` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_buffer_len(buffer: *const LocusBuffer) -> usize {
    // SAFETY: the header's contract for handles.
    unsafe { buffer.as_ref() }.map_or(0, |b| b.0.len() as usize)
}

/// Copies into a buffer.
///
/// # Safety
/// `buffer` is NULL or a live handle used by this thread only; `data` valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_buffer_write(
    buffer: *mut LocusBuffer,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    status(call(|| {
        if buffer.is_null() {
            return Err(null_handle("buffer"));
        }
        // SAFETY: a live `Box<LocusBuffer>` of ours, used by one thread at a time; `data`
        // by the header's contract.
        let (buffer, data) = unsafe { (&mut *buffer, bytes(data, len)?) };
        check_within(buffer, offset, len)?;
        buffer.0.write(offset, data)?;
        Ok(0)
    }))
}

/// Copies out of a buffer.
///
/// # Safety
/// `buffer` is NULL or a live handle; `data` writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_buffer_read(
    buffer: *const LocusBuffer,
    offset: u64,
    data: *mut c_void,
    len: usize,
) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract for handles and buffers.
        let (buffer, data) = unsafe { (handle(buffer, "buffer")?, bytes_mut(data, len)?) };
        check_within(buffer, offset, len)?;
        buffer.0.read(offset, data)?;
        Ok(0)
    }))
}

fn check_within(buffer: &LocusBuffer, offset: u64, len: usize) -> Result<(), Failure> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= buffer.0.len() => Ok(()),
        _ => Err(invalid(format!(
            "{len} bytes at {offset} do not fit in a {}-byte buffer",
            buffer.0.len()
        ))),
    }
}

/// Commits a buffer as the bytes at `offset`; the buffer is consumed.
///
/// # Safety
/// `file` is NULL or a live handle; `buffer` NULL or a live buffer, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_write_buffer(
    file: *mut LocusFile,
    buffer: *mut LocusBuffer,
    offset: u64,
) -> c_int {
    status(call(|| {
        // SAFETY: the header's contract: `buffer` is consumed.
        let buffer = unsafe { take(buffer, "buffer") }?;
        // SAFETY: the header's contract for handles.
        let file = unsafe { handle(file, "file") }?;
        file.0.write_buffer(buffer.0, offset)?;
        Ok(0)
    }))
}

/// Frees an uncommitted buffer.
///
/// # Safety
/// `buffer` is NULL or a live buffer, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn locus_buffer_free(buffer: *mut LocusBuffer) {
    // SAFETY: the header's contract: `buffer` is not used afterwards.
    drop(unsafe { take(buffer, "buffer") });
}
