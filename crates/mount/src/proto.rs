//! The FUSE kernel protocol as locus speaks it: request headers and argument structs read
//! from the kernel's bytes, reply structs written into a reply buffer. Layouts are those of
//! `<linux/fuse.h>` (protocol 7.31 and later, native byte order); every read is checked, so a
//! short or malformed request is an error naming what was missing, never a panic.

/// Protocol major version.
pub const MAJOR: u32 = 7;
/// The oldest minor version locus serves (`FUSE_MAX_PAGES`, `FUSE_RENAME2` and the 64-byte
/// `fuse_init_out` are all there).
pub const MIN_MINOR: u32 = 31;
/// The newest minor version locus knows; a newer kernel is answered with this one.
pub const MAX_MINOR: u32 = 44;

/// Opcodes (`enum fuse_opcode`).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const READDIRPLUS: u32 = 44;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const TMPFILE: u32 = 51;
}

/// `INIT` flags (`flags` is the low 32 bits, `flags2` the high).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel keeps written pages in its page cache and sends them later, merged
    /// (`locus mount --writeback-cache`); it then owns files' sizes and times.
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    /// Directory listings may carry each entry's attributes (`READDIRPLUS`)...
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    /// ...when the kernel sees they would be looked up anyway (the first chunk of a
    /// listing, or a listing followed by lookups of its names: `ls -l`, `find`, `du`).
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    /// The kernel tells the server when a write, truncation or `O_TRUNC` open comes from a
    /// process without `CAP_FSETID` (whose change must clear set-user-ID and set-group-ID),
    /// instead of the server not knowing.
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// The kernel applies no umask to creates; the server does (with `POSIX_ACL`).
    pub const DONT_MASK: u64 = 1 << 6;
    /// The kernel caches and enforces POSIX ACLs, which the server stores as extended
    /// attributes, keeps in step with the mode and passes on from default ACLs.
    pub const POSIX_ACL: u64 = 1 << 20;
    /// `fuse_setxattr_in` carries `setxattr_flags` (asked for with `POSIX_ACL`, for
    /// [`super::SETXATTR_ACL_KILL_SGID`]).
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_write_in.write_flags`: the writer lacks `CAP_FSETID` (with
/// [`init::HANDLE_KILLPRIV_V2`]).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_open_in.open_flags` and `fuse_create_in.open_flags`: an `O_TRUNC` open by a process
/// without `CAP_FSETID`.
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// A SETXATTR of the access ACL whose caller is neither in the file's group nor holds
/// `CAP_FSETID`: the set-group-ID bit goes with it.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// `open_flags` of an open reply.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// The kernel keeps the file's cached pages at open (they cannot be stale: every change
/// reaches the file system through this mount).
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// Direct writes to one file may run in parallel (the file system has its own range locks).
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    /// A truncation by a process without `CAP_FSETID`.
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is meaningful.
pub const GETATTR_FH: u32 = 1 << 0;

/// Bytes of `fuse_in_header`.
pub const IN_HEADER: usize = 40;
/// Bytes of `fuse_out_header`.
pub const OUT_HEADER: usize = 16;
/// Bytes of `fuse_attr`.
const ATTR: usize = 88;
/// Bytes of `fuse_entry_out`.
pub const ENTRY_OUT: usize = 40 + ATTR;

/// Bytes of each opcode's own argument struct (the part io_uring delivers in `op_in`; the
/// rest of the request — names, written data — follows it on `/dev/fuse` and is the payload
/// on io_uring).
pub fn arg_bytes(opcode: u32, setxattr_ext: bool) -> usize {
    match opcode {
        op::GETATTR
        | op::FSYNC
        | op::FSYNCDIR
        | op::MKNOD
        | op::CREATE
        | op::TMPFILE
        | op::RENAME2 => 16,
        op::SETATTR => 88,
        op::MKDIR | op::RENAME | op::LINK | op::OPEN | op::OPENDIR | op::FORGET => 8,
        op::READ | op::WRITE | op::READDIR | op::READDIRPLUS => 40,
        op::RELEASE | op::RELEASEDIR | op::FLUSH | op::LSEEK => 24,
        op::FALLOCATE => 32,
        op::COPY_FILE_RANGE => 56,
        op::INTERRUPT => 8,
        // `fuse_setxattr_in`, longer with `FUSE_SETXATTR_EXT`; `fuse_getxattr_in`.
        op::SETXATTR if setxattr_ext => 16,
        op::SETXATTR | op::GETXATTR | op::LISTXATTR => 8,
        op::BATCH_FORGET => 8,
        op::INIT => 16,
        _ => 0,
    }
}

/// A request that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(bytes: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader::new(bytes, "fuse_in_header");
        Ok(InHeader {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
        })
    }
}

/// Reads native-endian fields in order from a request's bytes.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Malformed(format!(
                "{} is {} bytes, too short for the field at byte {} ({n} bytes)",
                self.what,
                self.bytes.len(),
                self.at
            )));
        };
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_ne_bytes(b))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_ne_bytes(b))
    }

    pub fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        self.take(n).map(|_| ())
    }
}

/// The NUL-terminated names at the start of `bytes` (a name, or a name and a link target,
/// or two names of a rename), as UTF-8.
pub fn names<const N: usize>(bytes: &[u8]) -> Result<[&str; N], Malformed> {
    let mut out = [""; N];
    let mut rest = bytes;
    for (i, slot) in out.iter_mut().enumerate() {
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| Malformed(format!("name {} of {N} is not NUL-terminated", i + 1)))?;
        *slot = std::str::from_utf8(&rest[..end])
            .map_err(|_| Malformed(format!("name {} of {N} is not UTF-8", i + 1)))?;
        rest = &rest[end + 1..];
    }
    Ok(out)
}

/// Writes native-endian fields in order into a reply buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

/// A reply that does not fit the buffer the kernel gave (a bug, or a kernel asking for less
/// than a struct).
pub const OVERFLOW: i32 = libc::ERANGE;

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, at: 0 }
    }

    pub fn len(&self) -> usize {
        self.at
    }

    pub fn is_empty(&self) -> bool {
        self.at == 0
    }

    pub fn room(&self) -> usize {
        self.buf.len() - self.at
    }

    pub fn bytes(&mut self, b: &[u8]) -> Result<(), i32> {
        let end = self.at + b.len();
        self.buf
            .get_mut(self.at..end)
            .ok_or(OVERFLOW)?
            .copy_from_slice(b);
        self.at = end;
        Ok(())
    }

    pub fn u16(&mut self, v: u16) -> Result<(), i32> {
        self.bytes(&v.to_ne_bytes())
    }

    pub fn u32(&mut self, v: u32) -> Result<(), i32> {
        self.bytes(&v.to_ne_bytes())
    }

    pub fn u64(&mut self, v: u64) -> Result<(), i32> {
        self.bytes(&v.to_ne_bytes())
    }

    pub fn zeros(&mut self, n: usize) -> Result<(), i32> {
        let end = self.at + n;
        self.buf.get_mut(self.at..end).ok_or(OVERFLOW)?.fill(0);
        self.at = end;
        Ok(())
    }

    /// Pads with zeros to a multiple of 8 bytes (directory entries).
    pub fn align8(&mut self) -> Result<(), i32> {
        let pad = self.at.next_multiple_of(8) - self.at;
        self.zeros(pad)
    }
}

/// File attributes as the kernel wants them (`fuse_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    /// Type and permission bits (`S_IFREG | 0o644`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub blksize: u32,
    /// A device node's number, as `makedev` makes it (0 for other kinds).
    pub rdev: u64,
}

/// A device number in the kernel's 32-bit encoding (`new_encode_dev`): what `fuse_attr`
/// carries and what `MKNOD` sends.
pub fn encode_dev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The device number a `MKNOD` request's 32-bit `rdev` names.
pub fn decode_dev(dev: u32) -> u64 {
    let major = (dev & 0xfff00) >> 8;
    let minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

const NS: u64 = 1_000_000_000;

impl Attr {
    pub fn write(&self, w: &mut Writer<'_>) -> Result<(), i32> {
        w.u64(self.ino)?;
        w.u64(self.size)?;
        w.u64(self.blocks)?;
        w.u64(self.atime_ns / NS)?;
        w.u64(self.mtime_ns / NS)?;
        w.u64(self.ctime_ns / NS)?;
        w.u32((self.atime_ns % NS) as u32)?;
        w.u32((self.mtime_ns % NS) as u32)?;
        w.u32((self.ctime_ns % NS) as u32)?;
        w.u32(self.mode)?;
        w.u32(self.nlink)?;
        w.u32(self.uid)?;
        w.u32(self.gid)?;
        w.u32(encode_dev(self.rdev))?;
        w.u32(self.blksize)?;
        w.u32(0) // flags
    }
}

/// How long the kernel may keep `attr`: `ttl`, except for a set-user-ID or set-group-ID
/// file, whose attributes are never kept — a write by a process without `CAP_FSETID` clears
/// those bits here (`WRITE_KILL_SUIDGID`), and the write's reply cannot tell the kernel, so
/// a kept mode would show the privileges for up to `ttl` after they were dropped.
fn attr_ttl(attr: &Attr, ttl: std::time::Duration) -> std::time::Duration {
    if attr.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        std::time::Duration::ZERO
    } else {
        ttl
    }
}

/// `fuse_entry_out`: the inode, how long the name and attributes may be cached, the attributes.
pub fn entry(w: &mut Writer<'_>, attr: &Attr, ttl: std::time::Duration) -> Result<(), i32> {
    let attr_ttl = attr_ttl(attr, ttl);
    w.u64(attr.ino)?;
    w.u64(0)?; // generation: inode numbers are not reused while the kernel knows them
    w.u64(ttl.as_secs())?;
    w.u64(attr_ttl.as_secs())?;
    w.u32(ttl.subsec_nanos())?;
    w.u32(attr_ttl.subsec_nanos())?;
    attr.write(w)
}

/// A `fuse_entry_out` naming no inode: the name does not exist, and the kernel may answer
/// so itself for `ttl` (a negative dentry) instead of asking again.
pub fn no_entry(w: &mut Writer<'_>, ttl: std::time::Duration) -> Result<(), i32> {
    w.u64(0)?; // no inode
    w.u64(0)?;
    w.u64(ttl.as_secs())?;
    w.u64(0)?; // no attributes to cache
    w.u32(ttl.subsec_nanos())?;
    w.u32(0)?;
    Attr::default().write(w)
}

/// `fuse_attr_out`.
pub fn attr_out(w: &mut Writer<'_>, attr: &Attr, ttl: std::time::Duration) -> Result<(), i32> {
    let ttl = attr_ttl(attr, ttl);
    w.u64(ttl.as_secs())?;
    w.u32(ttl.subsec_nanos())?;
    w.u32(0)?;
    attr.write(w)
}

/// `fuse_open_out`.
pub fn open_out(w: &mut Writer<'_>, fh: u64, open_flags: u32) -> Result<(), i32> {
    w.u64(fh)?;
    w.u32(open_flags)?;
    w.u32(0)
}

/// A directory entry: its inode, the offset of the entry after it, its `DT_*` type, its name.
pub type Dirent<'a> = (u64, u64, u32, &'a str);

/// One `fuse_dirent` (8-byte aligned); `false` (nothing written) when it does not fit.
pub fn dirent(w: &mut Writer<'_>, (ino, off, kind, name): Dirent<'_>) -> bool {
    let size = (24 + name.len()).next_multiple_of(8);
    if size > w.room() {
        return false;
    }
    let written = (|| {
        w.u64(ino)?;
        w.u64(off)?;
        w.u32(name.len() as u32)?;
        w.u32(kind)?;
        w.bytes(name.as_bytes())?;
        w.align8()
    })();
    written.is_ok()
}

/// One `fuse_direntplus` (a `fuse_entry_out`, then the `fuse_dirent`): with `attr`, the
/// kernel takes a lookup of the entry as from `LOOKUP`; without, a zeroed entry it leaves
/// alone. `false` (nothing written) when it does not fit.
pub fn direntplus(
    w: &mut Writer<'_>,
    attr: Option<&Attr>,
    listed: Dirent<'_>,
    ttl: std::time::Duration,
) -> bool {
    if ENTRY_OUT + (24 + listed.3.len()).next_multiple_of(8) > w.room() {
        return false;
    }
    let entry = match attr {
        Some(attr) => entry(w, attr, ttl),
        None => no_entry(w, std::time::Duration::ZERO),
    };
    entry.is_ok() && dirent(w, listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_cross_the_kernel_encoding_both_ways() {
        for (major, minor) in [(0, 0), (1, 3), (8, 17), (259, 70_000), (4095, 0xf_ffff)] {
            let dev = libc::makedev(major, minor);
            let encoded = encode_dev(dev);
            assert_eq!(decode_dev(encoded), dev, "{major}:{minor}");
        }
        // The kernel's own layout: minor's low byte, major, then the minor's high bits.
        assert_eq!(encode_dev(libc::makedev(8, 17)), 0x811);
        assert_eq!(encode_dev(libc::makedev(1, 0x1_2345)), 0x1230_0145);
    }

    #[test]
    fn a_short_header_is_an_error_naming_the_struct_and_byte() {
        let e = InHeader::parse(&[0u8; 20]).unwrap_err();
        assert!(e.0.contains("fuse_in_header is 20 bytes"), "{e}");
        assert!(e.0.contains("at byte 16"), "{e}");
    }

    #[test]
    fn names_are_split_at_nul_and_must_be_terminated_and_utf8() {
        assert_eq!(names::<2>(b"old\0new\0").unwrap(), ["old", "new"]);
        assert!(
            names::<2>(b"old\0new")
                .unwrap_err()
                .0
                .contains("name 2 of 2")
        );
        assert!(names::<1>(b"\xff\0").unwrap_err().0.contains("not UTF-8"));
    }

    #[test]
    fn dirents_are_padded_to_8_and_refused_when_they_do_not_fit() {
        let mut buf = [0xAAu8; 40];
        let mut w = Writer::new(&mut buf);
        assert!(dirent(&mut w, (7, 1, 8, "abc")));
        assert_eq!(w.len(), 32, "24 + 3 rounded up to 8");
        assert!(
            !dirent(&mut w, (8, 2, 8, "x")),
            "32 more bytes do not fit in 8"
        );
        assert_eq!(w.len(), 32);
        assert_eq!(&buf[24..32], b"abc\0\0\0\0\0");
    }

    #[test]
    fn attributes_split_times_into_seconds_and_nanoseconds() {
        let attr = Attr {
            ino: 5,
            mtime_ns: 3 * NS + 7,
            mode: libc::S_IFREG | 0o644,
            ..Attr::default()
        };
        let mut buf = [0u8; ATTR];
        attr.write(&mut Writer::new(&mut buf)).unwrap();
        assert_eq!(u64::from_ne_bytes(buf[32..40].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(buf[52..56].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(buf[60..64].try_into().unwrap()),
            libc::S_IFREG | 0o644
        );
    }
}
