//! `nftw` and `ftw` for locus trees. glibc's walkers open and stat through internal calls no
//! library can intercept (a /locus tree would be `ENOENT`), so for a locus start path the
//! walk is done here with the intercepted `lstat`/`stat`/`opendir`/`readdir`/`chdir`, with
//! glibc's rules: entries in directory order without `.` and `..`; `FTW_DEPTH`,
//! `FTW_CHDIR`, `FTW_ACTIONRETVAL`; `FTW_MOUNT` changes nothing (a volume is one file
//! system); with `FTW_PHYS` symbolic links are reported as `FTW_SL`, without it they are
//! followed (a directory is entered once per walk, which also ends cycles) and a dangling
//! one is `FTW_SLN`. `nopenfd` bounds nothing here: a locus directory stream holds its
//! entries, not a descriptor, while the walk is below it.

use std::ffi::{CStr, CString, c_char, c_int};

use super::resolve_as;
use crate::{errno, real};

/// `struct FTW`.
#[repr(C)]
pub struct Ftw {
    base: c_int,
    level: c_int,
}

pub(crate) type NftwFn =
    unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int, *mut Ftw) -> c_int;
pub(crate) type FtwFn = unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int) -> c_int;

const FTW_F: c_int = 0;
const FTW_D: c_int = 1;
const FTW_DNR: c_int = 2;
const FTW_NS: c_int = 3;
const FTW_SL: c_int = 4;
const FTW_DP: c_int = 5;
const FTW_SLN: c_int = 6;

const FTW_PHYS: c_int = 1;
const FTW_CHDIR: c_int = 4;
const FTW_DEPTH: c_int = 8;
const FTW_ACTIONRETVAL: c_int = 16;

const FTW_STOP: c_int = 1;
const FTW_SKIP_SUBTREE: c_int = 2;
const FTW_SKIP_SIBLINGS: c_int = 3;

/// How a visit ends the walk or part of it.
enum Flow {
    Continue,
    SkipSiblings,
    /// The callback's nonzero answer (or `FTW_STOP`), or -1 for an error of the walk.
    Stop(c_int),
}

struct Walk {
    callback: Callback,
    flags: c_int,
    /// (device, inode) of every directory entered, when links are followed (glibc enters
    /// a directory once per walk then, which also ends cycles).
    visited: std::collections::HashSet<(u64, u64)>,
    /// Put before a reported path for the system calls: the starting directory when a
    /// relative walk changes directories (`FTW_CHDIR`), else nothing.
    prefix: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Callback {
    Nftw(NftwFn),
    Ftw(FtwFn),
}

impl Walk {
    fn report(
        &self,
        path: &CStr,
        st: &libc::stat64,
        kind: c_int,
        base: usize,
        level: usize,
    ) -> Flow {
        match self.raw_report(path, st, kind, base, level) {
            Ok(_) => Flow::Continue,
            Err(flow) => flow,
        }
    }

    /// Whether the callback asked to skip the subtree of the directory it was just shown.
    fn skips_subtree(&self, answer: c_int) -> bool {
        self.flags & FTW_ACTIONRETVAL != 0 && answer == FTW_SKIP_SUBTREE
    }

    /// `path` for system calls.
    fn sys(&self, path: &CStr) -> CString {
        if self.prefix.is_empty() {
            return path.to_owned();
        }
        let mut full = self.prefix.clone();
        full.extend_from_slice(path.to_bytes());
        CString::new(full).expect("no NUL in paths")
    }

    /// Visits `path` (component starting at `base`) at `level`.
    fn visit(&mut self, path: &CString, base: usize, level: usize) -> Flow {
        let sys = self.sys(path);
        // SAFETY: zeroed plain data, filled by (l)stat.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        let phys = self.flags & FTW_PHYS != 0;
        // SAFETY: a NUL-terminated path and a stat buffer (the intercepted calls).
        let mut kind = if unsafe { libc::lstat64(sys.as_ptr(), &mut st) } != 0 {
            if level == 0 {
                return Flow::Stop(-1); // a start that is not there fails the walk
            }
            FTW_NS
        } else if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            if phys {
                FTW_SL
            } else {
                // SAFETY: zeroed plain data.
                let mut target: libc::stat64 = unsafe { std::mem::zeroed() };
                // SAFETY: as above; a dangling link keeps its own lstat.
                if unsafe { libc::stat64(sys.as_ptr(), &mut target) } == 0 {
                    st = target;
                    kind_of(&st)
                } else {
                    FTW_SLN
                }
            }
        } else {
            kind_of(&st)
        };
        if kind == FTW_D && !phys && !self.visited.insert((st.st_dev, st.st_ino)) {
            // Entered before (through a followed link): skipped without a report, as glibc.
            return Flow::Continue;
        }
        if kind != FTW_D {
            return self.report(path, &st, kind, base, level);
        }
        // SAFETY: a NUL-terminated path (the intercepted opendir).
        let dir = unsafe { libc::opendir(sys.as_ptr()) };
        if dir.is_null() {
            kind = FTW_DNR;
            return self.report(path, &st, kind, base, level);
        }
        let depth_first = self.flags & FTW_DEPTH != 0;
        if !depth_first {
            let answer = self.raw_report(path, &st, FTW_D, base, level);
            match answer {
                Err(flow) => {
                    // SAFETY: the stream opened above.
                    unsafe { libc::closedir(dir) };
                    return flow;
                }
                Ok(a) if self.skips_subtree(a) => {
                    // SAFETY: as above.
                    unsafe { libc::closedir(dir) };
                    return Flow::Continue;
                }
                Ok(_) => {}
            }
        }
        let mut names = Vec::new();
        loop {
            // SAFETY: our open stream.
            let entry = unsafe { libc::readdir64(dir) };
            if entry.is_null() {
                break;
            }
            // SAFETY: readdir's entry holds a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        // SAFETY: as above.
        unsafe { libc::closedir(dir) };
        let chdir = self.flags & FTW_CHDIR != 0;
        // SAFETY: a NUL-terminated path (the intercepted chdir).
        if chdir && unsafe { libc::chdir(sys.as_ptr()) } != 0 {
            return Flow::Stop(-1);
        }
        let mut flow = Flow::Continue;
        for name in names {
            let mut child = path.as_bytes().to_vec();
            if child.last() != Some(&b'/') {
                child.push(b'/');
            }
            let child_base = child.len();
            child.extend_from_slice(&name);
            let child = CString::new(child).expect("names hold no NUL");
            match self.visit(&child, child_base, level + 1) {
                Flow::Continue => {}
                Flow::SkipSiblings => break,
                stop @ Flow::Stop(_) => {
                    flow = stop;
                    break;
                }
            }
        }
        if chdir && !change_to_parent(&sys) {
            return Flow::Stop(-1);
        }
        if let Flow::Stop(_) = flow {
            return flow;
        }
        if depth_first {
            return self.report(path, &st, FTW_DP, base, level);
        }
        Flow::Continue
    }

    /// Like [`Walk::report`], but returns the callback's answer when the walk goes on.
    fn raw_report(
        &self,
        path: &CStr,
        st: &libc::stat64,
        kind: c_int,
        base: usize,
        level: usize,
    ) -> Result<c_int, Flow> {
        let mut ftw = Ftw {
            base: base as c_int,
            level: level as c_int,
        };
        // SAFETY: the caller's callback with a NUL-terminated path and a stat buffer.
        let answer = unsafe {
            match self.callback {
                Callback::Nftw(f) => f(path.as_ptr(), st, kind, &mut ftw),
                Callback::Ftw(f) => f(path.as_ptr(), st, kind),
            }
        };
        if self.flags & FTW_ACTIONRETVAL == 0 {
            return if answer == 0 {
                Ok(0)
            } else {
                Err(Flow::Stop(answer))
            };
        }
        match answer {
            FTW_STOP => Err(Flow::Stop(FTW_STOP)),
            FTW_SKIP_SIBLINGS => Err(Flow::SkipSiblings),
            other => Ok(other),
        }
    }
}

/// Changes to the directory holding `path` (as the walk stands there to report it).
fn change_to_parent(path: &CStr) -> bool {
    let bytes = path.to_bytes();
    let trimmed = &bytes[..bytes.len() - bytes.iter().rev().take_while(|&&b| b == b'/').count()];
    let parent = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(0) => b"/".to_vec(),
        Some(i) => trimmed[..i].to_vec(),
        None => b".".to_vec(),
    };
    let parent = CString::new(parent).expect("no NUL in paths");
    // SAFETY: a NUL-terminated path (the intercepted chdir).
    unsafe { libc::chdir(parent.as_ptr()) == 0 }
}

fn kind_of(st: &libc::stat64) -> c_int {
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        FTW_D
    } else {
        FTW_F
    }
}

/// Walks the locus tree at `start`; `None` when `start` is not a locus path.
fn walk(start: *const c_char, callback: Callback, flags: c_int) -> Option<c_int> {
    // SAFETY: the caller's NUL-terminated path (or null).
    match unsafe { resolve_as(libc::AT_FDCWD, start, false) } {
        Ok(super::Resolved::Locus { .. }) => {}
        Ok(_) => return None,
        Err(e) => {
            errno::set(e);
            return Some(-1);
        }
    }
    // SAFETY: checked non-null and NUL-terminated by the resolution above.
    let path = unsafe { CStr::from_ptr(start) }.to_owned();
    if path.as_bytes().is_empty() {
        errno::set(libc::ENOENT);
        return Some(-1);
    }
    let bytes = path.as_bytes();
    let trimmed = bytes.len() - bytes.iter().rev().take_while(|&&b| b == b'/').count();
    let base = bytes[..trimmed]
        .iter()
        .rposition(|&b| b == b'/')
        .map_or(0, |i| i + 1);
    // FTW_CHDIR returns to where the walk started.
    let mut cwd = [0 as c_char; libc::PATH_MAX as usize];
    let chdir = flags & FTW_CHDIR != 0;
    // SAFETY: a buffer of PATH_MAX bytes (the intercepted getcwd).
    if chdir && unsafe { libc::getcwd(cwd.as_mut_ptr(), cwd.len()) }.is_null() {
        return Some(-1);
    }
    let mut walk = Walk {
        callback,
        flags,
        visited: std::collections::HashSet::new(),
        prefix: Vec::new(),
    };
    if chdir {
        if !bytes.starts_with(b"/") {
            // SAFETY: getcwd filled a NUL-terminated path.
            walk.prefix = unsafe { CStr::from_ptr(cwd.as_ptr()) }.to_bytes().to_vec();
            walk.prefix.push(b'/');
        }
        if !change_to_parent(&walk.sys(&path)) {
            return Some(-1);
        }
    }
    let result = match walk.visit(&path, base, 0) {
        Flow::Continue | Flow::SkipSiblings => 0,
        Flow::Stop(answer) => answer,
    };
    if chdir {
        let e = errno::get();
        // SAFETY: the NUL-terminated directory read above.
        unsafe { libc::chdir(cwd.as_ptr()) };
        errno::set(e);
    }
    Some(result)
}

/// `nftw64(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nftw64(
    path: *const c_char,
    callback: Option<NftwFn>,
    nopenfd: c_int,
    flags: c_int,
) -> c_int {
    let Some(f) = callback else {
        // SAFETY: passed through (libc's answer to a null callback).
        return unsafe { real::nftw64(path, callback, nopenfd, flags) };
    };
    // SAFETY: passed through.
    walk(path, Callback::Nftw(f), flags)
        .unwrap_or_else(|| unsafe { real::nftw64(path, callback, nopenfd, flags) })
}

/// `nftw(3)` (`struct stat` is `struct stat64` on 64-bit Linux).
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nftw(
    path: *const c_char,
    callback: Option<NftwFn>,
    nopenfd: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { nftw64(path, callback, nopenfd, flags) }
}

/// `ftw64(3)`: `nftw` without flags, the callback without `struct FTW`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftw64(
    path: *const c_char,
    callback: Option<FtwFn>,
    nopenfd: c_int,
) -> c_int {
    let Some(f) = callback else {
        // SAFETY: passed through.
        return unsafe { real::ftw64(path, callback, nopenfd) };
    };
    // SAFETY: passed through.
    walk(path, Callback::Ftw(f), 0)
        .unwrap_or_else(|| unsafe { real::ftw64(path, callback, nopenfd) })
}

/// `ftw(3)`.
///
/// # Safety
/// C's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftw(
    path: *const c_char,
    callback: Option<FtwFn>,
    nopenfd: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { ftw64(path, callback, nopenfd) }
}
