//! Kernel NUMA system calls: thread affinity, memory binding and page placement, and the
//! calling thread's CPU time and scheduling priority.
//!
//! This is the only module of the crate with `unsafe`. It wraps `sched_setaffinity`,
//! `sched_getaffinity`, `mmap`/`munmap`, `mbind`, `madvise`, `move_pages` and
//! `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, `getpriority`/`setpriority` in safe
//! functions whose arguments cannot violate the calls' contracts. Anonymous private mappings
//! are DRAM owned by this process, not persistent memory, so they do not belong to `pmem`.

#![allow(unsafe_code, reason = "the crate's one gateway to NUMA system calls")]

use std::io;
use std::ptr::NonNull;

use crate::CpuId;
use crate::NodeId;

const WORD_BITS: usize = u64::BITS as usize;

/// `MPOL_MF_STRICT` from `<linux/mempolicy.h>`: fail `mbind` if existing pages break the
/// policy. The libc crate does not export it; the value is part of the stable kernel ABI.
const MPOL_MF_STRICT: libc::c_int = 1;

/// Bound on CPU ids for affinity masks: a mask is allocated from it, and Linux's largest
/// NR_CPUS is 8192.
const MAX_CPUS: usize = 8192;

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[CpuId]) -> io::Result<()> {
    let mut mask = vec![0u64; MAX_CPUS / WORD_BITS];
    for &cpu in cpus {
        let cpu = cpu as usize;
        if cpu >= MAX_CPUS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "CPU id beyond 8191",
            ));
        }
        mask[cpu / WORD_BITS] |= 1 << (cpu % WORD_BITS);
    }
    // SAFETY: the pointer and byte length describe `mask`, which lives across the call; the
    // kernel only reads it. pid 0 means the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setaffinity,
            0,
            size_of_val(mask.as_slice()),
            mask.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn current_affinity() -> io::Result<Vec<CpuId>> {
    let mut mask = vec![0u64; MAX_CPUS / WORD_BITS];
    // SAFETY: the kernel writes at most the given byte length into `mask`, which is that long
    // and lives across the call. pid 0 means the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            0,
            size_of_val(mask.as_slice()),
            mask.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cpus = Vec::new();
    for (word_index, &word) in mask.iter().enumerate() {
        for bit in 0..WORD_BITS {
            if word & (1 << bit) != 0 {
                cpus.push(u32::try_from(word_index * WORD_BITS + bit).expect("below MAX_CPUS"));
            }
        }
    }
    Ok(cpus)
}

/// CPU time the calling thread has used (user and system), to the nanosecond.
pub fn thread_cpu_time() -> io::Result<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::time::Duration::new(
        ts.tv_sec as u64,
        ts.tv_nsec as u32,
    ))
}

/// The calling thread's nice value (Linux keeps one per thread).
pub fn current_thread_nice() -> io::Result<i32> {
    // getpriority returns -1 both for nice -1 and for an error: errno tells them apart.
    // SAFETY: errno is this thread's; getpriority reads no memory of ours.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if nice == -1 && io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(io::Error::last_os_error());
    }
    Ok(nice)
}

/// Runs `f` with every signal blocked in the calling thread, then restores its mask. Threads
/// `f` starts inherit the full mask: a library that starts threads inside a program (the
/// preload library, the C API) does so, so that a signal sent to the process always reaches
/// one of the program's threads — a signal the program blocks to take with `sigwait` or a
/// signalfd is then never taken by a thread of ours, with its default action.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, filled by sigfillset before pthread_sigmask reads it;
    // `old` is written by the first call and read by the second; the mask changes for this
    // thread only, and is restored before returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        let blocked = libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut old) == 0;
        let result = f();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
        }
        result
    }
}

/// Sets the calling thread's nice value. Raising it (a smaller share of the CPU) is always
/// allowed; lowering it needs what [`boost_current_thread`] says.
pub fn set_current_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority reads no memory of ours; `who` 0 is the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Lowers the calling thread's nice value by up to `steps` (a larger share of the CPU when
/// it competes with others, and the first turn when it wakes), never below -20, and returns
/// the value it now has. Without `CAP_SYS_NICE` the floor is what `RLIMIT_NICE` allows
/// (`20 - limit`); when that floor is not below the current value, nothing changes and the
/// refusal is the error.
pub fn boost_current_thread(steps: u32) -> io::Result<i32> {
    let now = current_thread_nice()?;
    let wanted = now
        .saturating_sub(i32::try_from(steps).unwrap_or(i32::MAX))
        .max(-20);
    if wanted == now {
        return Ok(now);
    }
    let set = |nice: i32| set_current_thread_nice(nice).map(|()| nice);
    match set(wanted) {
        Err(refused) if refused.raw_os_error() == Some(libc::EACCES) => {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
            if unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut limit) } != 0 {
                return Err(refused);
            }
            let floor = 20 - i32::try_from(limit.rlim_cur.min(40)).unwrap_or(0);
            if floor < now {
                set(floor.max(wanted))
            } else {
                Err(refused)
            }
        }
        other => other,
    }
}

/// The CPU the calling thread is running on right now.
pub fn current_cpu() -> io::Result<CpuId> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).map_err(|_| io::Error::last_os_error())
}

/// A private anonymous mapping of whole pages, unmapped on drop.
///
/// Used for memory whose node placement matters (the probe's pointer chain). Its pages are
/// only faulted in on first touch, so a memory policy set right after creation decides where
/// every page lands.
#[derive(Debug)]
pub struct AnonMapping {
    base: NonNull<u64>,
    len_bytes: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&self`
// (shared reads) or `&mut self` (exclusive writes), so the usual borrow rules make sharing
// across threads sound.
unsafe impl Send for AnonMapping {}
// SAFETY: see `Send`; `&AnonMapping` only allows reads.
unsafe impl Sync for AnonMapping {}

impl AnonMapping {
    /// Maps `len_bytes` (rounded up to whole pages) of untouched anonymous memory.
    pub fn new(len_bytes: usize) -> io::Result<Self> {
        let page = page_size();
        let len_bytes = len_bytes
            .checked_next_multiple_of(page)
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad mapping length"))?;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing cannot
        // alias any existing Rust object.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast::<u64>()).expect("mmap never returns null on success");
        Ok(Self { base, len_bytes })
    }

    /// Length in bytes (whole pages).
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Binds every page of the mapping to `node` (`MPOL_BIND`, strict). Must be called before
    /// the memory is touched for the binding to decide where pages are first placed.
    pub fn bind_to_node(&self, node: NodeId) -> io::Result<()> {
        bind_range(self.base.as_ptr() as usize, self.len_bytes, node)
    }

    /// Asks for transparent huge pages, so the probe measures memory rather than page walks
    /// as far as the kernel allows. Advisory: failure is ignored by callers.
    pub fn advise_huge_pages(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our mapping; MADV_HUGEPAGE changes no contents.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().cast(),
                self.len_bytes,
                libc::MADV_HUGEPAGE,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The mapping as words.
    pub fn words(&self) -> &[u64] {
        // SAFETY: the mapping is `len_bytes` long, page-aligned (so u64-aligned), readable,
        // zero-filled on first touch, and only mutated through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len_bytes / 8) }
    }

    /// The mapping as mutable words.
    pub fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: as for `words`, and `&mut self` guarantees no other reference exists.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len_bytes / 8) }
    }

    /// The node of every `stride_pages`-th page, at most `max_samples` pages, as reported by
    /// `move_pages` in query mode: a node id, or a negative errno for a page not present.
    pub fn sample_page_nodes(
        &self,
        stride_pages: usize,
        max_samples: usize,
    ) -> io::Result<Vec<i32>> {
        let stride_bytes = page_size() * stride_pages.max(1);
        let base = self.base.as_ptr() as usize;
        let pages: Vec<usize> = (0..self.len_bytes)
            .step_by(stride_bytes)
            .take(max_samples)
            .map(|o| base + o)
            .collect();
        page_nodes(&pages)
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference into it can
        // outlive `self`.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes) };
        debug_assert_eq!(rc, 0, "munmap of our own mapping failed");
    }
}

/// Size of a transparent huge page: a PMD mapping on x86-64 and arm64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// Maps `len_bytes` readable and writable from a [`HUGE_PAGE`] boundary: the first
/// `len_bytes` of `file` when one is given, anonymous memory otherwise; `flags` say how
/// (`MAP_SHARED`, `MAP_SHARED_VALIDATE | MAP_SYNC`, `MAP_PRIVATE | MAP_ANONYMOUS`, …).
/// The kernel maps a huge page only where a mapping holds a whole aligned one, and left to
/// choose, it puts a mapping wherever a gap is: this reserves address space a huge page
/// longer than asked (no memory behind it), maps over its first boundary, and gives the
/// rest back.
///
/// Returns the mapping's first byte. The mapping is the caller's, to `munmap` with
/// `len_bytes`; on an error nothing stays mapped.
pub fn map_on_huge_boundary(
    len_bytes: usize,
    flags: libc::c_int,
    file: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let reserved_len = len_bytes
        .checked_add(HUGE_PAGE)
        .filter(|_| len_bytes > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad mapping length"))?;
    // SAFETY: a fresh inaccessible anonymous mapping aliases nothing.
    let reserved = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserved_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if reserved == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let reserved_at = reserved as usize;
    let aligned = reserved_at.next_multiple_of(HUGE_PAGE);
    // SAFETY: `[aligned, aligned + len_bytes)` lies inside the reservation just made, which
    // nothing else uses; MAP_FIXED replaces that part of it.
    let address = unsafe {
        libc::mmap(
            aligned as *mut libc::c_void,
            len_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED,
            file.map_or(-1, |f| f.as_raw_fd()),
            0,
        )
    };
    if address == libc::MAP_FAILED {
        let error = io::Error::last_os_error();
        // SAFETY: the whole reservation is ours and nothing in it is in use.
        unsafe { libc::munmap(reserved, reserved_len) };
        return Err(error);
    }
    let head = aligned - reserved_at;
    let tail = reserved_at + reserved_len - (aligned + len_bytes);
    // SAFETY: the reservation's parts before and after the new mapping are ours and unused;
    // unmapping them leaves the mapping as it is.
    unsafe {
        if head > 0 {
            libc::munmap(reserved, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len_bytes) as *mut libc::c_void, tail);
        }
    }
    Ok(NonNull::new(address.cast()).expect("mmap never returns null on success"))
}

/// Binds the pages of `[address, address + len_bytes)` in this process to `node`
/// (`MPOL_BIND`, `MPOL_MF_STRICT`). For a shared file mapping on tmpfs the policy is stored
/// with the file's pages, so pages faulted in later land on `node` too.
///
/// A memory policy only steers placement; it cannot make any access unsound, so this is
/// safe for any range. The kernel answers EFAULT for a range that is not mapped.
pub fn bind_range(address: usize, len_bytes: usize, node: NodeId) -> io::Result<()> {
    let node = node as usize;
    let words = node / WORD_BITS + 1;
    let mut mask = vec![0u64; words];
    mask[node / WORD_BITS] |= 1 << (node % WORD_BITS);
    // The kernel reads `maxnode - 1` bits (a historical off-by-one that libnuma also
    // compensates for), so pass one more than the bits in the mask.
    let max_node = words * WORD_BITS + 1;
    // SAFETY: mbind reads only `mask` (alive across the call, `words` words long) and changes
    // the placement policy of the range, never its contents.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            address,
            len_bytes,
            libc::MPOL_BIND,
            mask.as_ptr(),
            max_node,
            MPOL_MF_STRICT,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The node each page containing one of `addresses` is on, as `move_pages` reports it in
/// query mode: a node id, or a negative errno (`-ENOENT` for a page not yet faulted in,
/// `-EFAULT` for an address not mapped). Queries never move or touch memory.
pub fn page_nodes(addresses: &[usize]) -> io::Result<Vec<i32>> {
    let pages: Vec<*mut libc::c_void> = addresses.iter().map(|&a| a as *mut libc::c_void).collect();
    let mut status = vec![0i32; pages.len()];
    // SAFETY: `pages` and `status` both have `pages.len()` entries and live across the call;
    // a null `nodes` pointer makes this a query, so the kernel only writes `status`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len(),
            pages.as_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(status)
}

/// The base page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anonymous memory and a file both come out on a huge-page boundary, usable over their
    /// whole length, and a file's mapping shows its bytes; an empty length is refused.
    #[test]
    fn mappings_start_on_a_huge_page_boundary() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let len = 2 * HUGE_PAGE + 4096;
        let anon = map_on_huge_boundary(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None)
            .expect("anonymous mapping");
        assert_eq!(anon.as_ptr() as usize % HUGE_PAGE, 0);
        // SAFETY: inside the mapping just made, which nothing else uses.
        unsafe {
            anon.as_ptr().write_volatile(1);
            anon.as_ptr().add(len - 1).write_volatile(2);
            assert_eq!(anon.as_ptr().add(len - 1).read_volatile(), 2);
            libc::munmap(anon.as_ptr().cast(), len);
        }
        let mut file = tempfile::tempfile_in("/dev/shm").expect("a tmpfs file");
        file.set_len(len as u64).unwrap();
        file.write_all(b"locus").unwrap();
        let mapped =
            map_on_huge_boundary(len, libc::MAP_SHARED, Some(file.as_fd())).expect("file mapping");
        assert_eq!(mapped.as_ptr() as usize % HUGE_PAGE, 0);
        // SAFETY: the first five bytes of the mapping just made, which nothing writes.
        let head = unsafe { std::slice::from_raw_parts(mapped.as_ptr(), 5) }.to_vec();
        assert_eq!(head, b"locus");
        // SAFETY: exactly the mapping just made.
        unsafe { libc::munmap(mapped.as_ptr().cast(), len) };
        assert!(map_on_huge_boundary(0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None).is_err());
    }

    #[test]
    fn a_boost_lowers_only_the_calling_threads_nice_and_stops_at_minus_20() {
        let main_before = current_thread_nice().unwrap();
        std::thread::spawn(|| {
            // Raising one's own nice value is always allowed; lowering it back needs
            // CAP_SYS_NICE or a high enough RLIMIT_NICE.
            set_current_thread_nice(10).unwrap();
            match boost_current_thread(3) {
                Ok(nice) => {
                    // 7, or what RLIMIT_NICE allows when that is less of a boost.
                    assert!((7..10).contains(&nice), "{nice}");
                    assert_eq!(current_thread_nice().unwrap(), nice);
                    let floor = boost_current_thread(100).unwrap_or(nice);
                    assert!((-20..=nice).contains(&floor), "{floor}");
                    assert_eq!(current_thread_nice().unwrap(), floor);
                }
                Err(e) => {
                    assert!(
                        matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)),
                        "{e}"
                    );
                    assert_eq!(
                        current_thread_nice().unwrap(),
                        10,
                        "a refusal changes nothing"
                    );
                }
            }
            assert_eq!(
                boost_current_thread(0).unwrap(),
                current_thread_nice().unwrap()
            );
        })
        .join()
        .unwrap();
        assert_eq!(
            current_thread_nice().unwrap(),
            main_before,
            "another thread's nice value"
        );
    }

    #[test]
    fn mapping_is_zeroed_and_writable() {
        let mut map = AnonMapping::new(3 * page_size() + 1).unwrap();
        assert_eq!(map.len_bytes(), 4 * page_size());
        assert!(map.words().iter().all(|&w| w == 0));
        let last = map.words().len() - 1;
        map.words_mut()[last] = 7;
        assert_eq!(map.words()[last], 7);
    }

    #[test]
    fn bound_pages_report_their_node() {
        let mut map = AnonMapping::new(16 * page_size()).unwrap();
        map.bind_to_node(0).unwrap();
        map.words_mut().fill(1);
        let nodes = map.sample_page_nodes(1, 64).unwrap();
        assert_eq!(nodes, vec![0; 16]);
    }

    #[test]
    fn untouched_pages_are_not_present() {
        let map = AnonMapping::new(4 * page_size()).unwrap();
        let nodes = map.sample_page_nodes(1, 64).unwrap();
        assert!(nodes.iter().all(|&n| n < 0), "{nodes:?}");
    }

    #[test]
    fn pinning_moves_the_thread() {
        let allowed = current_affinity().unwrap();
        let target = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(&[target]).unwrap();
            assert_eq!(current_affinity().unwrap(), vec![target]);
            assert_eq!(current_cpu().unwrap(), target);
        })
        .join()
        .unwrap();
    }
}
