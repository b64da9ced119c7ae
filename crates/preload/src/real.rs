//! The next definition of each intercepted symbol (libc's), found once with
//! `dlsym(RTLD_NEXT, name)` and cached. Calling these never re-enters the preload library.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{DIR, FILE, dirent64, iovec, mode_t, off_t, size_t, ssize_t, stat, statfs, statvfs};

/// Looks `name` (NUL-terminated) up after this library; null when libc lacks it.
fn resolve(cache: &AtomicPtr<c_void>, name: &'static [u8]) -> *mut c_void {
    let cached = cache.load(Ordering::Relaxed);
    if !cached.is_null() {
        return cached;
    }
    // SAFETY: `name` is a NUL-terminated literal (every caller passes `concat!(.., "\0")`);
    // dlsym with RTLD_NEXT only reads it.
    let found = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    cache.store(found, Ordering::Relaxed);
    found
}

macro_rules! real {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {$(
        /// libc's definition of the symbol of the same name.
        ///
        /// # Safety
        /// The caller upholds the C function's own contract for the arguments.
        pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
            static CACHE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let f = resolve(&CACHE, concat!(stringify!($name), "\0").as_bytes());
            if f.is_null() {
                // libc has no such function: behave as a kernel without the call.
                crate::errno::set(libc::ENOSYS);
                return <$ret as crate::real::Failed>::FAILED;
            }
            // SAFETY: `f` is libc's definition of this very symbol, whose C prototype the
            // signature above spells out.
            unsafe {
                let f: unsafe extern "C" fn($($ty),*) -> $ret = std::mem::transmute(f);
                f($($arg),*)
            }
        }
    )*};
}

/// libc's `syscall` with all six argument words (glibc's reads six whatever the call; a
/// word the caller did not pass is never used by the kernel).
///
/// # Safety
/// The caller upholds the contract of the call `n` names.
pub(crate) unsafe fn syscall(n: libc::c_long, w: [libc::c_long; 6]) -> libc::c_long {
    static CACHE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let f = resolve(&CACHE, b"syscall\0");
    if f.is_null() {
        crate::errno::set(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `f` is libc's `syscall`, variadic after the number.
    unsafe {
        let f: unsafe extern "C" fn(libc::c_long, ...) -> libc::c_long = std::mem::transmute(f);
        f(n, w[0], w[1], w[2], w[3], w[4], w[5])
    }
}

/// The value a C call returns on failure.
pub(crate) trait Failed {
    const FAILED: Self;
}
impl Failed for c_int {
    const FAILED: Self = -1;
}
impl Failed for ssize_t {
    const FAILED: Self = -1;
}
impl<T> Failed for *mut T {
    const FAILED: Self = std::ptr::null_mut();
}

real! {
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    fn pread64(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t;
    fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const iovec, n: c_int, offset: off_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const iovec, n: c_int, offset: off_t) -> ssize_t;
    fn preadv64v2(fd: c_int, iov: *const iovec, n: c_int, offset: off_t, flags: c_int) -> ssize_t;
    fn pwritev64v2(fd: c_int, iov: *const iovec, n: c_int, offset: off_t, flags: c_int) -> ssize_t;
    fn lseek64(fd: c_int, offset: off_t, whence: c_int) -> off_t;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn syncfs(fd: c_int) -> c_int;
    fn sync_file_range(fd: c_int, offset: off_t, nbytes: off_t, flags: c_uint) -> c_int;
    fn ftruncate64(fd: c_int, len: off_t) -> c_int;
    fn truncate64(path: *const c_char, len: off_t) -> c_int;
    fn fallocate64(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int;
    fn posix_fallocate64(fd: c_int, offset: off_t, len: off_t) -> c_int;
    fn posix_fadvise64(fd: c_int, offset: off_t, len: off_t, advice: c_int) -> c_int;
    fn fstat64(fd: c_int, buf: *mut stat) -> c_int;
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut stat, flags: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int;
    fn statfs64(path: *const c_char, buf: *mut statfs) -> c_int;
    fn fstatfs64(fd: c_int, buf: *mut statfs) -> c_int;
    fn statvfs64(path: *const c_char, buf: *mut statvfs) -> c_int;
    fn fstatvfs64(fd: c_int, buf: *mut statvfs) -> c_int;
    fn access(path: *const c_char, mode: c_int) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    fn euidaccess(path: *const c_char, mode: c_int) -> c_int;
    fn unlink(path: *const c_char) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn renameat2(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: c_uint) -> c_int;
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int;
    fn rmdir(path: *const c_char) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char;
    fn get_current_dir_name() -> *mut c_char;
    fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn system(command: *const c_char) -> c_int;
    fn popen(command: *const c_char, mode: *const c_char) -> *mut FILE;
    fn posix_spawn(
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    fn posix_spawnp(
        pid: *mut libc::pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) -> c_int;
    fn chmod(path: *const c_char, mode: mode_t) -> c_int;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int;
    fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int;
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int;
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int;
    fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int;
    fn futimes(fd: c_int, times: *const libc::timeval) -> c_int;
    fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int;
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t;
    fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int;
    fn linkat(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: c_int) -> c_int;
    fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    fn listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    fn llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t;
    fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t;
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, newfd: c_int) -> c_int;
    fn dup3(fd: c_int, newfd: c_int, flags: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int;
    fn ioctl(fd: c_int, request: libc::c_ulong, arg: libc::c_ulong) -> c_int;
    fn flock(fd: c_int, operation: c_int) -> c_int;
    fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int;
    fn munmap(addr: *mut c_void, len: size_t) -> c_int;
    fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int;
    fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int;
    fn pkey_mprotect(addr: *mut c_void, len: size_t, prot: c_int, pkey: c_int) -> c_int;
    fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int, new: *mut c_void) -> *mut c_void;
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void;
    fn copy_file_range(fd_in: c_int, off_in: *mut off_t, fd_out: c_int, off_out: *mut off_t, len: size_t, flags: c_uint) -> ssize_t;
    fn sendfile64(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t;
    fn splice(fd_in: c_int, off_in: *mut off_t, fd_out: c_int, off_out: *mut off_t, len: size_t, flags: c_uint) -> ssize_t;
    fn getdents64(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    fn opendir(path: *const c_char) -> *mut DIR;
    fn nftw64(path: *const c_char, callback: Option<crate::calls::walk::NftwFn>, nopenfd: c_int, flags: c_int) -> c_int;
    fn ftw64(path: *const c_char, callback: Option<crate::calls::walk::FtwFn>, nopenfd: c_int) -> c_int;
    fn scandirat(dirfd: c_int, path: *const c_char, list: *mut *mut *mut dirent64, select: Option<unsafe extern "C" fn(*const dirent64) -> c_int>, order: Option<unsafe extern "C" fn(*const c_void, *const c_void) -> c_int>) -> c_int;
    fn fdopendir(fd: c_int) -> *mut DIR;
    fn closedir(dir: *mut DIR) -> c_int;
    fn readdir64(dir: *mut DIR) -> *mut dirent64;
    fn readdir64_r(dir: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int;
    fn rewinddir(dir: *mut DIR) -> ();
    fn telldir(dir: *mut DIR) -> libc::c_long;
    fn seekdir(dir: *mut DIR, pos: libc::c_long) -> ();
    fn dirfd(dir: *mut DIR) -> c_int;
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE;
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
    fn fileno(stream: *mut FILE) -> c_int;
    fn mkostemps64(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int;
    fn mkdtemp(template: *mut c_char) -> *mut c_char;
    fn fileno_unlocked(stream: *mut FILE) -> c_int;
}

impl Failed for () {
    const FAILED: Self = ();
}
impl Failed for libc::c_long {
    const FAILED: Self = -1;
}
