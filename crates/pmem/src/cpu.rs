//! The CPU's persistence instructions, chosen once at run time by CPUID.
//!
//! Cache-line write-back: `clwb` (keeps the line cached), else `clflushopt`, else `clflush`.
//! Ordering: `sfence`. Bulk copies: non-temporal stores, 32 bytes at a time (`vmovntdq`) on a
//! CPU with AVX2, else 16 (`movntdq`), which bypass the cache and need only the fence. Everything here operates on raw addresses; the safe API is
//! `Region`, which checks bounds first.

#![allow(
    unsafe_code,
    reason = "cache-flush instructions and non-temporal stores"
)]

use std::arch::asm;
use std::arch::x86_64::{
    __m128i, __m256i, _MM_HINT_T0, _mm_crc32_u64, _mm_extract_epi64, _mm_loadu_si128, _mm_prefetch,
    _mm_sfence, _mm_stream_si128, _mm256_castsi256_si128, _mm256_extracti128_si256,
    _mm256_loadu_si256, _mm256_stream_si256,
};
use std::sync::OnceLock;

use crate::checksum::Lanes;

/// Size of a cache line: the unit of flushing and of crash atomicity tracking.
pub const CACHE_LINE: usize = 64;

/// The instruction used to write a cache line back to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushInstruction {
    /// Write back and keep the line (Skylake-SP and later).
    Clwb,
    /// Write back and invalidate, weakly ordered.
    Clflushopt,
    /// Write back and invalidate, ordered with other stores (slowest).
    Clflush,
}

impl FlushInstruction {
    /// The best instruction this CPU has (CPUID leaf 7: EBX bit 24 clwb, bit 23 clflushopt;
    /// clflush is in every x86-64 CPU).
    pub fn detect() -> Self {
        static DETECTED: OnceLock<FlushInstruction> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            // CPUID exists on every x86-64 CPU and only reads identification registers.
            let leaf0 = std::arch::x86_64::__cpuid(0);
            if leaf0.eax < 7 {
                return Self::Clflush;
            }
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            if leaf7.ebx & (1 << 24) != 0 {
                Self::Clwb
            } else if leaf7.ebx & (1 << 23) != 0 {
                Self::Clflushopt
            } else {
                Self::Clflush
            }
        })
    }

    /// Name as the instruction is spelled.
    pub fn name(self) -> &'static str {
        match self {
            Self::Clwb => "clwb",
            Self::Clflushopt => "clflushopt",
            Self::Clflush => "clflush",
        }
    }
}

/// Writes back every cache line that overlaps `[address, address + len)`.
///
/// # Safety
/// The range must lie inside one live mapping of this process.
pub unsafe fn flush_range(instruction: FlushInstruction, address: usize, len: usize) {
    if len == 0 {
        return;
    }
    let first = address & !(CACHE_LINE - 1);
    let end = address + len;
    let mut line = first;
    while line < end {
        // SAFETY: `line` is the start of a cache line that overlaps the caller's range, which
        // lies inside a live mapping, and flushes never change memory contents.
        unsafe {
            match instruction {
                FlushInstruction::Clwb => {
                    asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags));
                }
                FlushInstruction::Clflushopt => {
                    asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags));
                }
                FlushInstruction::Clflush => {
                    asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags));
                }
            }
        }
        line += CACHE_LINE;
    }
}

/// Hints the CPU to bring the cache line holding `addr` into its caches, for a load soon. A
/// hint only: it changes nothing and never faults, whatever the address.
pub fn prefetch<T>(addr: *const T) {
    // SAFETY: a prefetch reads nothing the program observes and never faults, for any
    // address; SSE is baseline on x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast()) };
}

/// Hints the CPU to bring the cache line holding `addr` into its caches for a store soon
/// (`prefetchw`: owned, so the store does not wait for another CPU to give the line up). A
/// hint only: it changes nothing and never faults, whatever the address.
/// Without the instruction (`prfchw`), nothing: a read prefetch would bring the line in shared
/// and the store would still wait to own it.
pub fn prefetch_for_write<T>(addr: *const T) {
    if has_prefetchw() {
        // SAFETY: `prefetchw` is present (checked above); a prefetch reads nothing the
        // program observes, writes nothing and never faults, for any address.
        unsafe {
            std::arch::asm!(
                "prefetchw [{addr}]",
                addr = in(reg) addr,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
}

/// Whether the CPU has `prefetchw` (CPUID 8000_0001h, ECX bit 8; the standard library's
/// feature detection does not name it). Asked once.
fn has_prefetchw() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        #[allow(unused_unsafe)]
        // SAFETY: `cpuid` is baseline on x86-64 and has no memory effects.
        let (top, ecx) = unsafe {
            let top = __cpuid(0x8000_0000).eax;
            (top, __cpuid(0x8000_0001).ecx)
        };
        top >= 0x8000_0001 && ecx & (1 << 8) != 0
    })
}

/// Orders all earlier stores, flushes and non-temporal stores before any later store.
pub fn store_fence() {
    // SAFETY: sfence has no operands and no memory-safety preconditions; SSE is baseline on
    // x86-64.
    unsafe { _mm_sfence() };
}

/// Copies `len` bytes from `src` to `dst` with non-temporal stores where `dst` is aligned
/// (32 bytes with AVX2, else 16), and ordinary stores for the unaligned head and tail.
/// Returns the ranges (offsets from `dst`) written with ordinary stores, which the caller
/// must flush: at most a head and a tail.
///
/// The 32-byte stores, where the CPU has them: a 4 KiB block copied to a random page of a
/// 1 GiB tmpfs mapping, then `sfence` and a locked instruction (as a write does), took
/// 300–319 ns (median 306, five runs of 2 M copies) against 329–372 ns (median 335) with
/// 16-byte stores; 64-byte AVX-512 stores were no faster than 32-byte ones (309–332 ns).
///
/// # Safety
/// `src` must be valid for reads of `len` bytes and `dst` valid for writes of `len` bytes,
/// and the two must not overlap.
pub unsafe fn copy_nontemporal(dst: *mut u8, src: *const u8, len: usize) -> [(usize, usize); 2] {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the caller's contract is this function's.
        unsafe { copy_nontemporal_avx2(dst, src, len) }
    } else {
        // SAFETY: the caller's contract is this function's.
        unsafe { copy_nontemporal_sse2(dst, src, len) }
    }
}

/// Ordinary stores up to the first `align`-byte boundary of `dst` (at most `len` bytes):
/// the head's length.
///
/// # Safety
/// As [`copy_nontemporal`].
unsafe fn copy_head(dst: *mut u8, src: *const u8, len: usize, align: usize) -> usize {
    let misalignment = (dst as usize) % align;
    let head = if misalignment == 0 {
        0
    } else {
        (align - misalignment).min(len)
    };
    // SAFETY: the head lies within the caller's ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    head
}

/// [`copy_nontemporal`] with 16-byte stores.
///
/// # Safety
/// As [`copy_nontemporal`].
unsafe fn copy_nontemporal_sse2(dst: *mut u8, src: *const u8, len: usize) -> [(usize, usize); 2] {
    // SAFETY: the caller's contract.
    let head = unsafe { copy_head(dst, src, len, 16) };
    let mut done = head;
    while len - done >= 64 {
        // SAFETY: `dst + done` is 16-byte aligned (head made it so) and the 64 bytes from
        // `done` lie within both ranges; the loads are unaligned-tolerant.
        unsafe {
            let s = src.add(done).cast::<__m128i>();
            let d = dst.add(done).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        done += 64;
    }
    // SAFETY: `dst + done` is 16-byte aligned; the caller's contract.
    let tail = unsafe { copy_rest(dst, src, len, done) };
    [(0, head), (tail, len - tail)]
}

/// The copy's end from `done` (`dst + done` 16-byte aligned): 16-byte non-temporal stores
/// while 16 bytes are left, then ordinary ones. Returns where the ordinary stores began.
///
/// # Safety
/// As [`copy_nontemporal`], with `done <= len` and `dst + done` 16-byte aligned.
unsafe fn copy_rest(dst: *mut u8, src: *const u8, len: usize, mut done: usize) -> usize {
    while len - done >= 16 {
        // SAFETY: `dst + done` is 16-byte aligned and the 16 bytes from `done` lie within
        // both ranges; the load is unaligned-tolerant.
        unsafe {
            let value = _mm_loadu_si128(src.add(done).cast::<__m128i>());
            _mm_stream_si128(dst.add(done).cast::<__m128i>(), value);
        }
        done += 16;
    }
    // SAFETY: the tail lies within the caller's ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
    done
}

/// [`copy_nontemporal`] with 32-byte stores.
///
/// # Safety
/// As [`copy_nontemporal`], on a CPU with AVX2.
#[target_feature(enable = "avx2")]
unsafe fn copy_nontemporal_avx2(dst: *mut u8, src: *const u8, len: usize) -> [(usize, usize); 2] {
    // SAFETY: the caller's contract.
    let head = unsafe { copy_head(dst, src, len, 32) };
    let mut done = head;
    while len - done >= 64 {
        // SAFETY: `dst + done` is 32-byte aligned (head made it so) and the 64 bytes from
        // `done` lie within both ranges; the loads are unaligned-tolerant.
        unsafe {
            let s = src.add(done).cast::<__m256i>();
            let d = dst.add(done).cast::<__m256i>();
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
        }
        done += 64;
    }
    if len - done >= 32 {
        // SAFETY: as above, for one aligned 32-byte chunk.
        unsafe {
            let value = _mm256_loadu_si256(src.add(done).cast::<__m256i>());
            _mm256_stream_si256(dst.add(done).cast::<__m256i>(), value);
        }
        done += 32;
    }
    // SAFETY: `dst + done` is 32-byte aligned, so 16-byte aligned; the caller's contract.
    let tail = unsafe { copy_rest(dst, src, len, done) };
    [(0, head), (tail, len - tail)]
}

/// [`copy_nontemporal`] that also returns the data checksum ([`crate::data_checksum`]) of
/// the bytes it stored — computed from the very registers it stored them from, so that it is
/// the checksum of what the destination holds even if another thread changes the source
/// meanwhile. `None`, having copied nothing, on a CPU without AVX2 and SSE4.2 or when `dst`
/// is not 8-byte aligned (the words the checksum reads would straddle the copy's aligned
/// stores); the caller then copies without.
///
/// The `crc32` chains run beside the stores: a 4 KiB copy, its 64-byte record and one fence
/// measured 372 ns with them and 396 ns without, against 587 ns for the same copy and
/// record with a fence between them (C loop on this machine's virtual CPU, tmpfs mapping).
///
/// # Safety
/// As [`copy_nontemporal`].
pub unsafe fn copy_nontemporal_summed(
    dst: *mut u8,
    src: *const u8,
    len: usize,
) -> Option<([(usize, usize); 2], u32)> {
    if !(dst as usize).is_multiple_of(8)
        || !std::arch::is_x86_feature_detected!("avx2")
        || !std::arch::is_x86_feature_detected!("sse4.2")
    {
        return None;
    }
    // SAFETY: the CPU has both extensions, `dst` is 8-byte aligned; the caller's contract.
    Some(unsafe { copy_nontemporal_summed_avx2(dst, src, len) })
}

/// Copies the bytes `[from, to)` word by word through a register with ordinary stores,
/// feeding each word (the last padded with zeros, if `to` ends one early) to `lanes` by its
/// index from the copy's start.
///
/// # Safety
/// As [`copy_nontemporal`], with `from <= to <= len` and `from` a multiple of 8.
unsafe fn copy_words(dst: *mut u8, src: *const u8, mut from: usize, to: usize, lanes: &mut Lanes) {
    while to - from >= 8 {
        // SAFETY: 8 bytes from `from` lie within both ranges; unaligned accesses.
        let word = unsafe {
            let word = src.add(from).cast::<u64>().read_unaligned();
            dst.add(from).cast::<u64>().write_unaligned(word);
            word
        };
        lanes.feed(from / 8, u64::from_le(word));
        from += 8;
    }
    if from < to {
        let mut padded = [0u8; 8];
        // SAFETY: the `to - from < 8` bytes lie within both ranges and `padded`.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(from), padded.as_mut_ptr(), to - from);
            std::ptr::copy_nonoverlapping(padded.as_ptr(), dst.add(from), to - from);
        }
        lanes.feed(from / 8, u64::from_le_bytes(padded));
    }
}

/// [`copy_nontemporal_summed`] once its conditions hold.
///
/// # Safety
/// As [`copy_nontemporal`], on a CPU with AVX2 and SSE4.2, `dst` 8-byte aligned.
#[target_feature(enable = "avx2,sse4.2")]
unsafe fn copy_nontemporal_summed_avx2(
    dst: *mut u8,
    src: *const u8,
    len: usize,
) -> ([(usize, usize); 2], u32) {
    // The four 8-byte words of a 32-byte vector into four chains.
    macro_rules! feed4 {
        ($chains:expr, $v:expr) => {{
            let low = _mm256_castsi256_si128($v);
            let high = _mm256_extracti128_si256::<1>($v);
            $chains[0] = _mm_crc32_u64($chains[0], _mm_extract_epi64::<0>(low) as u64);
            $chains[1] = _mm_crc32_u64($chains[1], _mm_extract_epi64::<1>(low) as u64);
            $chains[2] = _mm_crc32_u64($chains[2], _mm_extract_epi64::<0>(high) as u64);
            $chains[3] = _mm_crc32_u64($chains[3], _mm_extract_epi64::<1>(high) as u64);
        }};
    }
    let mut lanes = Lanes::new();
    // The head, to `dst`'s first 32-byte boundary: whole words (`dst` is 8-byte aligned),
    // unless the copy ends first.
    let misalignment = (dst as usize) % 32;
    let head = if misalignment == 0 {
        0
    } else {
        (32 - misalignment).min(len)
    };
    // SAFETY: the caller's contract; `head <= len`.
    unsafe { copy_words(dst, src, 0, head, &mut lanes) };
    let mut done = head;
    // Each 32-byte vector from here holds words `done / 8 ..`: its word `j` is in lane
    // `(done / 8 + j) % 4`, the same for every vector.
    let rotation = (done / 8) % 4;
    let mut chains = lanes.rotated(rotation);
    while len - done >= 64 {
        // SAFETY: `dst + done` is 32-byte aligned and the 64 bytes from `done` lie within
        // both ranges; the loads are unaligned-tolerant.
        unsafe {
            let s = src.add(done).cast::<__m256i>();
            let d = dst.add(done).cast::<__m256i>();
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
            feed4!(chains, a);
            feed4!(chains, b);
        }
        done += 64;
    }
    if len - done >= 32 {
        // SAFETY: as above, for one aligned 32-byte chunk.
        unsafe {
            let value = _mm256_loadu_si256(src.add(done).cast::<__m256i>());
            _mm256_stream_si256(dst.add(done).cast::<__m256i>(), value);
            feed4!(chains, value);
        }
        done += 32;
    }
    lanes.unrotate(rotation, chains);
    while len - done >= 16 {
        // SAFETY: `dst + done` is 16-byte aligned and the 16 bytes from `done` lie within
        // both ranges; the load is unaligned-tolerant.
        unsafe {
            let value = _mm_loadu_si128(src.add(done).cast::<__m128i>());
            _mm_stream_si128(dst.add(done).cast::<__m128i>(), value);
            lanes.feed(done / 8, _mm_extract_epi64::<0>(value) as u64);
            lanes.feed(done / 8 + 1, _mm_extract_epi64::<1>(value) as u64);
        }
        done += 16;
    }
    let tail = done;
    // SAFETY: the caller's contract; `done` is a multiple of 8 (the head was whole words).
    unsafe { copy_words(dst, src, done, len, &mut lanes) };
    ([(0, head), (tail, len - tail)], lanes.finish(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefetches are hints: an address no page backs (null, the top of the address space)
    /// neither faults nor changes anything, and a line asked for writing keeps its
    /// bytes (a load or store in their place would fault on the first address).
    #[test]
    fn prefetches_never_fault_and_change_nothing() {
        let value = std::sync::atomic::AtomicU64::new(0x5eed);
        for addr in [
            std::ptr::null::<u64>(),
            usize::MAX as *const u64,
            value.as_ptr(),
        ] {
            prefetch(addr);
            prefetch_for_write(addr);
        }
        assert_eq!(value.load(std::sync::atomic::Ordering::Relaxed), 0x5eed);
    }

    #[test]
    fn a_summed_copy_stores_the_bytes_and_their_checksum() {
        let source: Vec<u8> = (0..5100u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut target = vec![0u8; 5200];
        let base = target.as_mut_ptr() as usize;
        let aligned = base.next_multiple_of(64) - base;
        let mut copied = 0;
        for len in (0..300).chain([4095, 4096, 4097, 4999]) {
            // Every 8-byte-aligned start within a 32-byte vector, and sources off alignment.
            for skew in [0, 8, 16, 24, 40] {
                let at = aligned + skew;
                let from = (len + skew) % 3;
                target.fill(0xEE);
                // SAFETY: both ranges lie within their vectors and do not overlap.
                let done = unsafe {
                    copy_nontemporal_summed(
                        target.as_mut_ptr().add(at),
                        source.as_ptr().add(from),
                        len,
                    )
                };
                let Some((edges, sum)) = done else {
                    // A CPU without AVX2 or SSE4.2: nothing copied.
                    assert!(target.iter().all(|&b| b == 0xEE));
                    continue;
                };
                store_fence();
                let expected = &source[from..from + len];
                assert_eq!(
                    &target[at..at + len],
                    expected,
                    "{len} bytes at skew {skew}"
                );
                assert!(target[..at].iter().all(|&b| b == 0xEE), "nothing before");
                assert!(
                    target[at + len..].iter().all(|&b| b == 0xEE),
                    "nothing after"
                );
                assert_eq!(
                    sum,
                    crate::data_checksum(expected),
                    "{len} bytes at skew {skew}"
                );
                assert!(edges.iter().all(|&(start, n)| start + n <= len));
                copied += 1;
            }
        }
        // A misaligned destination is refused untouched.
        // SAFETY: as above.
        let refused = unsafe {
            copy_nontemporal_summed(target.as_mut_ptr().add(aligned + 4), source.as_ptr(), 64)
        };
        assert!(refused.is_none());
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("sse4.2")
        {
            assert!(copied > 1000);
        }
    }

    #[test]
    fn detects_an_instruction_this_cpu_runs() {
        let instruction = FlushInstruction::detect();
        let data = vec![1u8; 4096];
        // SAFETY: the range is inside `data`.
        unsafe { flush_range(instruction, data.as_ptr() as usize + 3, 200) };
        store_fence();
        assert_eq!(data[3], 1);
    }

    /// Each way of copying (the one this CPU uses, and both it can run) puts exactly the
    /// source's bytes at every alignment and length, and names ordinary-store ranges
    /// within the copy, none longer than the alignment it works to.
    #[test]
    fn nontemporal_copy_is_exact_at_every_alignment_and_length() {
        type Copy = unsafe fn(*mut u8, *const u8, usize) -> [(usize, usize); 2];
        let mut ways: Vec<(&str, Copy, usize)> = vec![
            ("chosen", copy_nontemporal, 32),
            ("sse2", copy_nontemporal_sse2, 16),
        ];
        if std::arch::is_x86_feature_detected!("avx2") {
            ways.push((
                "avx2",
                |d, s, l| {
                    // SAFETY: the CPU has AVX2 (checked above); the caller's contract is
                    // the function's.
                    unsafe { copy_nontemporal_avx2(d, s, l) }
                },
                32,
            ));
        }
        for (way, copy, align) in ways {
            check_copies(way, copy, align);
        }
    }

    fn check_copies(
        way: &str,
        copy: unsafe fn(*mut u8, *const u8, usize) -> [(usize, usize); 2],
        align: usize,
    ) {
        let source: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        // An aligned target, so that offsets cover every alignment of the 32-byte stores.
        #[repr(align(64))]
        struct Target([u8; 1100]);
        for offset in 0..40 {
            for len in [
                0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 95, 96, 200, 1000,
            ] {
                let mut target = Box::new(Target([0u8; 1100]));
                let target = &mut target.0;
                // SAFETY: offset + len <= 1040 < 1100 and source has 1024 bytes.
                let ordinary =
                    unsafe { copy(target.as_mut_ptr().add(offset), source.as_ptr(), len) };
                store_fence();
                assert_eq!(
                    &target[offset..offset + len],
                    &source[..len],
                    "{way}: {offset}/{len}"
                );
                assert!(target[..offset].iter().all(|&b| b == 0), "{way}");
                assert!(target[offset + len..].iter().all(|&b| b == 0), "{way}");
                assert!(
                    ordinary
                        .iter()
                        .all(|&(start, n)| start + n <= len && n < align),
                    "{way}: {offset}/{len}: {ordinary:?}"
                );
            }
        }
    }
}
