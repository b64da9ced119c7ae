//! An fsx-style exerciser run through `liblocus_preload.so`: seeded random writes, reads,
//! writes and reads through fresh shared mappings, stores through a long-lived shared
//! mapping, truncates up and down, punched holes, `fallocate` growth, `fsync` and reopens
//! of one file, each checked against an in-memory model right after it (the whole file by
//! `pread`, its size by `fstat`, and the long-lived mapping's view of it). The same seeds
//! also run on tmpfs without the library, which checks the exerciser itself.
//!
//! `harness = false`: run by `cargo test`, this binary is the driver; started with
//! `LOCUS_FSX_SEED` set it is the exerciser, run by the driver once per seed and place.
//! `LOCUS_FSX_SEEDS` (`N` or `A-B`) and `LOCUS_FSX_OPS` choose longer runs by hand, e.g.
//! `LOCUS_FSX_SEEDS=1-20 LOCUS_FSX_OPS=100000 cargo test --release -p preload --test fsx`.

#![allow(
    unsafe_code,
    reason = "the exerciser calls libc and stores through shared mappings"
)]

use std::ffi::CString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;

const MOUNT: &str = "/locus";
/// The largest size the file reaches.
const MAX_SIZE: usize = 256 << 10;
/// The longest single read or write.
const MAX_LEN: usize = 64 << 10;
/// The long-lived mapping covers this much of the file from offset 0.
const VIEW_LEN: usize = 192 << 10;
const PAGE: usize = 4096;
const NAME: &str = "fsx_through_the_preload_library";

fn main() -> ExitCode {
    if let Ok(seed) = std::env::var("LOCUS_FSX_SEED") {
        let seed = seed.parse().expect("LOCUS_FSX_SEED is a number");
        let ops = std::env::var("LOCUS_FSX_OPS")
            .map(|n| n.parse().expect("LOCUS_FSX_OPS is a number"))
            .unwrap_or(DEFAULT_OPS);
        let path = std::env::var("LOCUS_FSX_FILE").expect("LOCUS_FSX_FILE");
        let dump = std::env::var("LOCUS_FSX_DUMP").expect("LOCUS_FSX_DUMP");
        return match Exerciser::new(seed, &path).and_then(|mut x| x.run(ops, &dump)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(report) => {
                eprintln!("fsx seed {seed} on {path}: {report}");
                ExitCode::FAILURE
            }
        };
    }
    // The test harness's conventions: `--list` and a name filter.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| NAME.contains(f.as_str())) {
        println!("running 0 tests (filtered out)");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    drive();
    println!("test {NAME} ... ok");
    ExitCode::SUCCESS
}

const DEFAULT_OPS: u64 = 10_000;

fn seeds() -> Vec<u64> {
    match std::env::var("LOCUS_FSX_SEEDS") {
        Err(_) => vec![1, 2, 3],
        Ok(spec) => match spec.split_once('-') {
            Some((a, b)) => (a.parse().expect("seed")..=b.parse().expect("seed")).collect(),
            None => vec![spec.parse().expect("seed")],
        },
    }
}

/// Runs every seed on tmpfs, on locus, and on locus with data checksums (where shared
/// mappings map a copy of the file in memory); each locus file is also compared, after the
/// process is gone, with the model's final bytes by reading the volume through `fs`, and
/// the volume with checksums is scrubbed.
fn drive() {
    let volumes = [false, true].map(|checksums| {
        let vol = tempfile::Builder::new()
            .prefix("locus-fsx")
            .tempdir_in("/dev/shm")
            .expect("tempdir on /dev/shm");
        let topology = topology::Topology::read_live().expect("topology");
        let config =
            volume::default_config(vol.path(), &topology, Some(256 << 20)).expect("volume config");
        volume::Volume::format(vol.path(), &config, false).expect("format volume");
        fs::format_volume_with(vol.path(), topology, checksums, None).expect("format fs");
        (vol, checksums)
    });
    let tmp = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");

    let mut finals = Vec::new();
    for seed in seeds() {
        let mut places = vec![(tmp.path().to_str().unwrap().to_owned(), None)];
        places.extend(volumes.iter().map(|v| (MOUNT.to_owned(), Some(v))));
        for (place, volume) in places {
            let file = format!("{place}/fsx-{seed}");
            let name = match volume {
                None => "tmpfs",
                Some((_, false)) => "locus",
                Some((_, true)) => "locus with data checksums",
            };
            let dump = tmp.path().join(format!("model-{seed}-{name}"));
            let mut cmd = Command::new(std::env::current_exe().expect("this binary"));
            cmd.env("LOCUS_FSX_SEED", seed.to_string())
                .env("LOCUS_FSX_FILE", &file)
                .env("LOCUS_FSX_DUMP", &dump);
            if let Some((vol, _)) = volume {
                cmd.env("LD_PRELOAD", library())
                    .env("LOCUS_VOLUME", vol.path())
                    .env("LOCUS_MOUNT", MOUNT);
            }
            let status = cmd.status().expect("start the exerciser");
            assert!(
                status.success(),
                "fsx seed {seed} on {name} failed ({status})"
            );
            if let Some((vol, _)) = volume {
                finals.push((vol.path(), seed, dump));
            }
        }
    }
    for (vol, checksums) in &volumes {
        let topology = topology::Topology::read_live().expect("topology");
        let volume = Arc::new(
            volume::Volume::open(vol.path(), topology, &Default::default()).expect("open"),
        );
        let fs = fs::Fs::open(Arc::clone(&volume), fs::FsOptions::default()).expect("mount");
        for (_, seed, dump) in finals.iter().filter(|f| f.0 == vol.path()) {
            let model = std::fs::read(dump).expect("the model's final bytes");
            let file = fs
                .open_read(&format!("/fsx-{seed}"))
                .expect("the exercised file");
            let mut data = vec![0u8; file.len() as usize];
            let mut done = 0;
            while done < data.len() {
                let n = file.read_at(&mut data[done..], done as u64).expect("read");
                assert!(n > 0, "short file");
                done += n;
            }
            assert!(
                data == model,
                "seed {seed}: the volume's file differs from the model (checksums {checksums})"
            );
        }
        drop(fs);
        if *checksums {
            let report = fs::Fs::scrub(&volume).expect("scrub");
            assert!(report.damaged.is_empty() && report.blocks > 0, "{report:?}");
        }
    }
}

/// The freshly built library: cargo builds the cdylib beside this test's binary.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps directory");
    [
        deps.join("liblocus_preload.so"),
        deps.parent().unwrap().join("liblocus_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("liblocus_preload.so not found next to {}", exe.display()))
}

/// splitmix64: small, seeded, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A length in `1..=max`, small ones as likely as large ones by magnitude.
    fn len(&mut self, max: usize) -> usize {
        let bits = 1 + self.below(max.ilog2() as usize + 1);
        1 + self.below((1usize << bits).min(max))
    }
}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

struct Exerciser {
    rng: Rng,
    path: CString,
    fd: i32,
    model: Vec<u8>,
    /// A shared mapping of `[0, VIEW_LEN)` kept across operations.
    view: *mut u8,
    /// Recent operations, for the report.
    log: Vec<String>,
    stamp: u8,
}

impl Exerciser {
    fn new(seed: u64, path: &str) -> Result<Self, String> {
        let path = CString::new(path).unwrap();
        // SAFETY: a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
                0o644,
            )
        };
        if fd < 0 {
            return Err(os_error("open"));
        }
        let mut x = Exerciser {
            rng: Rng(seed),
            path,
            fd,
            model: Vec::new(),
            view: std::ptr::null_mut(),
            log: Vec::new(),
            stamp: 0,
        };
        x.view = x.map(0, VIEW_LEN)?;
        Ok(x)
    }

    fn map(&self, offset: usize, len: usize) -> Result<*mut u8, String> {
        // SAFETY: a fresh mapping of our fd; the kernel (or the library) picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error(&format!("mmap {offset:#x}+{len:#x}")));
        }
        Ok(p.cast())
    }

    fn unmap(p: *mut u8, len: usize) -> Result<(), String> {
        // SAFETY: a mapping this exerciser made, of `len` bytes.
        if unsafe { libc::munmap(p.cast(), len) } != 0 {
            return Err(os_error("munmap"));
        }
        Ok(())
    }

    /// Fresh bytes for a write: each operation's stamp, varied by offset.
    fn bytes(&mut self, off: usize, len: usize) -> Vec<u8> {
        self.stamp = self.stamp.wrapping_add(1).max(1);
        (off..off + len)
            .map(|i| self.stamp ^ (i as u8) ^ ((i >> 8) as u8))
            .collect()
    }

    fn resize(&mut self, size: usize) {
        self.model.resize(size, 0);
    }

    fn run(&mut self, ops: u64, dump: &str) -> Result<(), String> {
        for n in 0..ops {
            let (what, problem) = match self.step() {
                Ok(what) => {
                    let checked = self.check();
                    (what, checked.err())
                }
                Err(failed) => ("the operation failed".to_owned(), Some(failed)),
            };
            self.log.push(format!("{n}: {what}"));
            if self.log.len() > 12 {
                self.log.remove(0);
            }
            if let Some(problem) = problem {
                return Err(format!(
                    "after op {n} ({what}): {problem}\nlast operations:\n  {}",
                    self.log.join("\n  ")
                ));
            }
        }
        Self::unmap(self.view, VIEW_LEN)?;
        // SAFETY: our fd.
        unsafe { libc::close(self.fd) };
        std::fs::write(dump, &self.model).map_err(|e| format!("writing {dump}: {e}"))
    }

    /// One random operation; returns what it did.
    fn step(&mut self) -> Result<String, String> {
        let size = self.model.len();
        let off = self.rng.below(MAX_SIZE);
        let len = self.rng.len(MAX_LEN).min(MAX_SIZE - off);
        let fd = self.fd;
        Ok(match self.rng.below(100) {
            0..=24 => {
                let data = self.bytes(off, len);
                // SAFETY: a buffer of `len` bytes.
                let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), len, off as i64) };
                if n != len as isize {
                    return Err(os_error(&format!("pwrite {off:#x}+{len:#x} gave {n}")));
                }
                if off + len > size {
                    self.resize(off + len);
                }
                self.model[off..off + len].copy_from_slice(&data);
                format!("write {off:#x}+{len:#x}")
            }
            25..=39 => {
                let mut buf = vec![0u8; len];
                // SAFETY: a buffer of `len` bytes.
                let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), len, off as i64) };
                let want = size.saturating_sub(off).min(len);
                if n != want as isize {
                    return Err(os_error(&format!(
                        "pread {off:#x}+{len:#x} gave {n}, not {want}"
                    )));
                }
                if want > 0 && buf[..want] != self.model[off..off + want] {
                    return Err(format!(
                        "pread {off:#x}+{len:#x}: bytes differ from the model"
                    ));
                }
                format!("read {off:#x}+{len:#x}")
            }
            40..=54 => {
                // As fsx does: grow the file first if the store reaches past its end.
                if off + len > size {
                    // SAFETY: our fd.
                    if unsafe { libc::ftruncate(fd, (off + len) as i64) } != 0 {
                        return Err(os_error("ftruncate before a mapped write"));
                    }
                    self.resize(off + len);
                }
                let start = off / PAGE * PAGE;
                let span = off + len - start;
                let p = self.map(start, span)?;
                let data = self.bytes(off, len);
                // SAFETY: `[off - start, off - start + len)` lies within the fresh mapping.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(off - start), len) };
                let sync = self.rng.below(2) == 0;
                // SAFETY: the mapping just made.
                if sync && unsafe { libc::msync(p.cast(), span, libc::MS_SYNC) } != 0 {
                    return Err(os_error("msync"));
                }
                Self::unmap(p, span)?;
                self.model[off..off + len].copy_from_slice(&data);
                format!(
                    "mapwrite {off:#x}+{len:#x}{}",
                    if sync { " msync" } else { "" }
                )
            }
            55..=64 => {
                if off >= size {
                    return Ok("mapread skipped (past the end)".into());
                }
                let len = len.min(size - off);
                let start = off / PAGE * PAGE;
                let span = off + len - start;
                let p = self.map(start, span)?;
                // SAFETY: within the fresh mapping and within the file.
                let seen = unsafe { std::slice::from_raw_parts(p.add(off - start), len) }.to_vec();
                Self::unmap(p, span)?;
                if seen != self.model[off..off + len] {
                    return Err(format!(
                        "mapread {off:#x}+{len:#x}: bytes differ from the model"
                    ));
                }
                format!("mapread {off:#x}+{len:#x}")
            }
            65..=72 => {
                // A store through the long-lived mapping, inside the file.
                let inside = size.min(VIEW_LEN);
                if inside == 0 {
                    return Ok("viewstore skipped (empty file)".into());
                }
                let off = off % inside;
                let len = len.min(inside - off);
                let data = self.bytes(off, len);
                // SAFETY: within the view and within the file.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.view.add(off), len) };
                self.model[off..off + len].copy_from_slice(&data);
                format!("viewstore {off:#x}+{len:#x}")
            }
            73..=82 => {
                // Shrinks as often as growths, to every kind of boundary.
                let new = match self.rng.below(4) {
                    0 => self.rng.below(MAX_SIZE + 1) / PAGE * PAGE,
                    1 => size / 2,
                    _ => self.rng.below(MAX_SIZE + 1),
                };
                // SAFETY: our fd.
                if unsafe { libc::ftruncate(fd, new as i64) } != 0 {
                    return Err(os_error(&format!("ftruncate {new:#x}")));
                }
                self.resize(new);
                format!("truncate {size:#x} -> {new:#x}")
            }
            83..=89 => {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                // SAFETY: our fd.
                if unsafe { libc::fallocate(fd, mode, off as i64, len as i64) } != 0 {
                    return Err(os_error(&format!("punch {off:#x}+{len:#x}")));
                }
                let end = (off + len).min(size);
                if off < end {
                    self.model[off..end].fill(0);
                }
                format!("punch {off:#x}+{len:#x}")
            }
            90..=93 => {
                // SAFETY: our fd.
                if unsafe { libc::fallocate(fd, 0, off as i64, len as i64) } != 0 {
                    return Err(os_error(&format!("fallocate {off:#x}+{len:#x}")));
                }
                if off + len > size {
                    self.resize(off + len);
                }
                format!("fallocate {off:#x}+{len:#x}")
            }
            94..=96 => {
                // SAFETY: our fd.
                if unsafe { libc::fsync(fd) } != 0 {
                    return Err(os_error("fsync"));
                }
                "fsync".into()
            }
            97 => {
                Self::unmap(self.view, VIEW_LEN)?;
                self.view = self.map(0, VIEW_LEN)?;
                "remap the view".into()
            }
            _ => {
                // SAFETY: our fd.
                unsafe { libc::close(fd) };
                // SAFETY: a NUL-terminated path.
                self.fd = unsafe { libc::open(self.path.as_ptr(), libc::O_RDWR) };
                if self.fd < 0 {
                    return Err(os_error("reopen"));
                }
                "close and reopen (the view stays)".into()
            }
        })
    }

    /// The file equals the model: its size, its bytes by `pread`, and the view's bytes
    /// inside the file (plus zeros to the end of the page holding the last byte).
    fn check(&self) -> Result<(), String> {
        // SAFETY: a zeroed stat buffer for fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our fd and a stat buffer.
        if unsafe { libc::fstat(self.fd, &mut st) } != 0 {
            return Err(os_error("fstat"));
        }
        let size = self.model.len();
        if st.st_size as usize != size {
            return Err(format!("size {:#x}, the model's {size:#x}", st.st_size));
        }
        let mut data = vec![0u8; size + 1];
        // SAFETY: a buffer of `size + 1` bytes.
        let n = unsafe { libc::pread(self.fd, data.as_mut_ptr().cast(), size + 1, 0) };
        if n != size as isize {
            return Err(os_error(&format!(
                "pread of the whole file gave {n}, not {size:#x}"
            )));
        }
        if let Some(at) = first_difference(&data[..size], &self.model) {
            return Err(format!("pread: byte {at:#x} differs from the model"));
        }
        let inside = size.min(VIEW_LEN);
        // SAFETY: the view's pages up to `inside` are within the file.
        let seen = unsafe { std::slice::from_raw_parts(self.view, inside) };
        if let Some(at) = first_difference(seen, &self.model[..inside]) {
            return Err(format!(
                "the long-lived mapping: byte {at:#x} differs from the model"
            ));
        }
        let page_end = size.next_multiple_of(PAGE).min(VIEW_LEN);
        if inside < page_end {
            // SAFETY: the rest of the page holding the last byte is mapped (POSIX: zeros).
            let tail =
                unsafe { std::slice::from_raw_parts(self.view.add(inside), page_end - inside) };
            if let Some(at) = tail.iter().position(|&b| b != 0) {
                return Err(format!(
                    "the long-lived mapping: byte {:#x} past the end is not 0",
                    inside + at
                ));
            }
        }
        Ok(())
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(Some(a.len().min(b.len())))
}
