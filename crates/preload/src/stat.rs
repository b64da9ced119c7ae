//! What `stat`, `statx` and `statfs` report for locus files. Owners are the file system's
//! (files made before it kept owners show the calling user). Access, modification and
//! change times are the file system's own, to the nanosecond.

use std::ffi::c_int;

use fs::{Fs, Kind, Stat};

/// `f_type` of `statfs`: "LOCU".
pub const LOCUS_MAGIC: i64 = 0x4c4f_4355;
/// The block size reported.
pub const BLOCK: i64 = 4096;

/// The device number of the volume: major 0 (anonymous devices), a minor from its uuid.
pub fn device(fs: &Fs) -> (u32, u32) {
    let uuid = fs.volume().uuid();
    let minor = u32::from_le_bytes([uuid[0], uuid[1], uuid[2], 0]) | 0x10_0000;
    (0, minor & 0xfff_ffff)
}

fn type_bits(kind: Kind) -> u32 {
    match kind {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDevice => libc::S_IFCHR,
        Kind::BlockDevice => libc::S_IFBLK,
    }
}

/// Seconds and nanoseconds of a time in ns since the epoch.
fn split(ns: u64) -> (i64, i64) {
    ((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as i64)
}

fn statx_time(ns: u64) -> libc::statx_timestamp {
    // SAFETY: plain data; all-zero is valid.
    let mut time: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    let (sec, nsec) = split(ns);
    time.tv_sec = sec;
    time.tv_nsec = nsec as u32;
    time
}

/// The calling process's effective user and group.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid take no arguments and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// `fs` creating as the calling process's effective user and group now (which a process
/// can change after it opened the volume, as `su` and servers do), with its umask (which
/// the file system applies unless a directory's default ACL decides).
pub fn as_caller(fs: &Fs) -> Fs {
    let (uid, gid) = effective_ids();
    fs.as_owner(fs::Owner { uid, gid })
        .with_umask(crate::calls::umask())
}

/// The owner `stat` shows: the file's, or the calling user where none is recorded.
pub fn shown_owner(st: &Stat) -> (u32, u32) {
    let (euid, egid) = effective_ids();
    (st.uid.unwrap_or(euid), st.gid.unwrap_or(egid))
}

/// Whether the calling process has group `gid` (effective or supplementary), as the
/// kernel's `in_group_p`; `real`: its real group instead of the effective one.
pub fn in_group(gid: u32, real: bool) -> bool {
    // SAFETY: getgid/getegid cannot fail.
    let primary = unsafe {
        if real {
            libc::getgid()
        } else {
            libc::getegid()
        }
    };
    if gid == primary {
        return true;
    }
    // SAFETY: with size 0, getgroups only counts; the buffer then has room for that many.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0; count.max(0) as usize];
    // SAFETY: `groups` holds `count` entries.
    let got = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    groups.contains(&gid)
}

/// Fills a `struct stat`.
pub fn fill_stat(st: &Stat, dev: (u32, u32), out: &mut libc::stat) {
    // SAFETY: `libc::stat` is plain data; all-zero is a valid value.
    *out = unsafe { std::mem::zeroed() };
    out.st_dev = libc::makedev(dev.0, dev.1);
    out.st_ino = st.ino;
    out.st_mode = type_bits(st.kind) | (st.mode & 0o7777);
    out.st_nlink = st.nlink;
    out.st_rdev = st.rdev;
    (out.st_uid, out.st_gid) = shown_owner(st);
    out.st_size = st.size as i64;
    out.st_blksize = BLOCK;
    out.st_blocks = st.allocated.div_ceil(512) as i64;
    (out.st_atime, out.st_atime_nsec) = split(st.atime_ns);
    (out.st_mtime, out.st_mtime_nsec) = split(st.mtime_ns);
    (out.st_ctime, out.st_ctime_nsec) = split(st.ctime_ns);
}

/// Fills a `struct statx` (every basic field but the birth time).
pub fn fill_statx(st: &Stat, dev: (u32, u32), out: &mut libc::statx) {
    // SAFETY: `libc::statx` is plain data; all-zero is a valid value.
    *out = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS;
    out.stx_blksize = BLOCK as u32;
    out.stx_nlink = st.nlink as u32;
    (out.stx_uid, out.stx_gid) = shown_owner(st);
    out.stx_mode = (type_bits(st.kind) | (st.mode & 0o7777)) as u16;
    out.stx_ino = st.ino;
    (out.stx_rdev_major, out.stx_rdev_minor) = (libc::major(st.rdev), libc::minor(st.rdev));
    out.stx_size = st.size;
    out.stx_blocks = st.allocated.div_ceil(512);
    out.stx_atime = statx_time(st.atime_ns);
    out.stx_mtime = statx_time(st.mtime_ns);
    out.stx_ctime = statx_time(st.ctime_ns);
    (out.stx_dev_major, out.stx_dev_minor) = dev;
}

/// What `statfs` reports of the volume, in blocks of [`BLOCK`].
struct Blocks {
    total: u64,
    free: u64,
    /// Free blocks new data can still take ([`fs::Space::available_bytes`]).
    available: u64,
    files: u64,
}

fn space(fs: &Fs) -> Blocks {
    let space = fs.space();
    let block = BLOCK as u64;
    Blocks {
        total: space.total_bytes / block,
        free: space.free_bytes / block,
        available: space.available_bytes / block,
        files: space.files,
    }
}

/// Fills a `struct statfs`.
pub fn fill_statfs(fs: &Fs, out: &mut libc::statfs) {
    let space = space(fs);
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_type = LOCUS_MAGIC;
    out.f_bsize = BLOCK;
    out.f_frsize = BLOCK;
    out.f_blocks = space.total;
    out.f_bfree = space.free;
    out.f_bavail = space.available;
    out.f_files = space.files + space.free;
    out.f_ffree = space.free;
    out.f_namelen = fs::MAX_NAME as i64;
}

/// Fills a `struct statvfs`.
pub fn fill_statvfs(fs: &Fs, out: &mut libc::statvfs) {
    let space = space(fs);
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_bsize = BLOCK as u64;
    out.f_frsize = BLOCK as u64;
    out.f_blocks = space.total;
    out.f_bfree = space.free;
    out.f_bavail = space.available;
    out.f_files = space.files + space.free;
    out.f_ffree = space.free;
    out.f_favail = space.free;
    out.f_namemax = fs::MAX_NAME as u64;
}

/// The `d_type` of a directory entry.
pub fn dirent_type(kind: Kind) -> u8 {
    match kind {
        Kind::File => libc::DT_REG,
        Kind::Dir => libc::DT_DIR,
        Kind::Symlink => libc::DT_LNK,
        Kind::Fifo => libc::DT_FIFO,
        Kind::Socket => libc::DT_SOCK,
        Kind::CharDevice => libc::DT_CHR,
        Kind::BlockDevice => libc::DT_BLK,
    }
}

/// Whether the calling user may access a file of `st` as `mode` (`R_OK`, `W_OK`, `X_OK`),
/// by the kernel's rules: the owner's bits for its owner (a file with no owner recorded is
/// the caller's), the group's for a member of its group, the others' for anyone else; root
/// passes read and write always and execute when any execute bit is set (or for
/// directories). `effective` false: as the real user and group (`access(2)`).
pub fn may_access(st: &Stat, mode: c_int, effective: bool) -> bool {
    // SAFETY: these id calls cannot fail.
    let uid = unsafe {
        if effective {
            libc::geteuid()
        } else {
            libc::getuid()
        }
    };
    let want = |bit: c_int| mode & bit != 0;
    if uid == 0 {
        return !want(libc::X_OK) || st.kind == Kind::Dir || st.mode & 0o111 != 0;
    }
    let class = if st.uid.is_none_or(|owner| owner == uid) {
        6
    } else if st.gid.is_none_or(|gid| in_group(gid, !effective)) {
        3
    } else {
        0
    };
    let bits = (st.mode >> class) & 0o7;
    (!want(libc::R_OK) || bits & 0o4 != 0)
        && (!want(libc::W_OK) || bits & 0o2 != 0)
        && (!want(libc::X_OK) || bits & 0o1 != 0)
}
