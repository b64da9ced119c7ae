//! What a file costs in DRAM. The file system keeps every inode in memory (attributes, names,
//! block table, overlay), so a volume of many small files — a source tree, a mail directory,
//! a package cache — must not cost pages per file. Each file under 2 MiB once held a 4 KiB
//! block table, and every inode 2 KiB of range-lock tables and half a KiB of overlay shards:
//! 3.6 KiB per empty file and 8.3 KiB per 4 KiB file through `locus mount`.
//!
//! One test in this binary, so that no other test's memory moves the figure.

use fs::{Fs, OpenOptions};
use testkit::*;

/// The process's anonymous resident memory in bytes (`RssAnon`). The volume is a tmpfs
/// file, whose pages are shared memory, so this is the file system's DRAM.
fn anon_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib * 1024
}

#[test]
fn a_small_file_costs_a_fraction_of_a_page_of_dram() {
    const FILES: u64 = 10_000;
    let shm = shm_volume("dram", 512 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/empty", 0o755).unwrap();
    fs.mkdir("/written", 0o755).unwrap();
    let data = pattern(1, 0, 4096);
    // Warm up what every file system holds once (threads, buffers, queues).
    for i in 0..100 {
        let f = fs.create(&format!("/written/warm{i}")).unwrap();
        f.write_at(&data, 0).unwrap();
    }
    fs.checkpoint().unwrap();

    let before = anon_bytes();
    for i in 0..FILES {
        fs.create(&format!("/empty/f{i}")).unwrap();
    }
    let empty = anon_bytes().saturating_sub(before) / FILES;

    let before = anon_bytes();
    for i in 0..FILES {
        let f = fs.create(&format!("/written/f{i}")).unwrap();
        f.write_at(&data, 0).unwrap();
    }
    fs.checkpoint().unwrap();
    let written = anon_bytes().saturating_sub(before) / FILES;
    eprintln!("DRAM per file: {empty} bytes empty, {written} bytes with 4 KiB written");

    // Well above what it costs (about 0.75 and 1.6 KiB), well below what it cost.
    assert!(empty < 1536, "an empty file costs {empty} bytes of DRAM");
    assert!(written < 3072, "a 4 KiB file costs {written} bytes of DRAM");
    let f = fs
        .open_file("/written/f7", OpenOptions::read_write())
        .unwrap();
    let mut back = vec![0u8; 4096];
    f.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data);
    fs.unmount().unwrap();
}
