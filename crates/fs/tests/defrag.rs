//! Idle-time defragmentation (`crates/fs/src/defrag.rs`): windows that random 4 KiB
//! overwrites scattered come back as one extent once writers pause, with the same bytes and
//! times; windows with holes are left alone; writers arriving mid-pass lose nothing.

use std::time::{Duration, Instant};

use fs::{CheckpointMode, File, FormatOptions, Fs, FsOptions};
use testkit::{ShmVolume, open_volume, shm_volume, small_format, small_options};

const WINDOW: u64 = 2 << 20;

fn options() -> FsOptions {
    FsOptions {
        checkpoint: CheckpointMode::Background,
        defrag: true,
        ..small_options()
    }
}

/// Pieces of memory holding `[offset, offset + len)`, looked at block by block: a block
/// starts a new piece unless it follows the previous one in memory. (One block per look, so
/// that looking is not itself a scattered read, which earns a window its rewrite.)
fn pieces(file: &File, offset: u64, len: u64) -> usize {
    let mut count = 0;
    let mut follows: Option<usize> = None;
    for block in (offset..offset + len).step_by(4096) {
        let at = file
            .read_with(block, 4096, |slices| {
                assert_eq!(slices.len(), 1, "a block in more than one piece");
                slices[0].as_ptr() as usize
            })
            .unwrap()
            .1;
        if follows != Some(at) {
            count += 1;
        }
        follows = Some(at + 4096);
    }
    count
}

/// Reads `[offset, offset + len)` in `chunk`-byte reads.
fn read_in(file: &File, offset: u64, len: u64, chunk: usize) {
    let mut buf = vec![0u8; chunk];
    for at in (offset..offset + len).step_by(chunk) {
        assert_eq!(file.read_at(&mut buf, at).unwrap(), chunk);
    }
}

fn read_all(file: &File) -> Vec<u8> {
    let mut out = vec![0u8; file.len() as usize];
    let mut at = 0;
    while at < out.len() {
        let n = file.read_at(&mut out[at..], at as u64).unwrap();
        assert!(n > 0);
        at += n;
    }
    out
}

/// Small xorshift: the same overwrites every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// `count` random 4 KiB overwrites of `[0, len)`, applied to `model` too.
fn scatter(file: &File, model: &mut [u8], len: u64, count: usize, seed: u64) {
    let mut state = seed | 1;
    for i in 0..count {
        let block = next(&mut state) % (len / 4096);
        let data = vec![(i % 251) as u8 + 1; 4096];
        file.write_at(&data, block * 4096).unwrap();
        model[(block * 4096) as usize..(block * 4096 + 4096) as usize].copy_from_slice(&data);
    }
}

/// A fresh file system on a `volume`-byte shm volume whose `/f` holds `model`.
fn file_holding(
    name: &str,
    volume: u64,
    format: &FormatOptions,
    options: FsOptions,
    model: &[u8],
) -> (ShmVolume, Fs, File) {
    let shm = shm_volume(name, volume);
    let fs = Fs::format(open_volume(&shm.dir), format, options).unwrap();
    let f = fs.create("/f").unwrap();
    f.write_at(model, 0).unwrap();
    (shm, fs, f)
}

fn wait_for(fs: &Fs, windows: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = fs.stats().defragmented_windows;
        if done >= windows || Instant::now() > deadline {
            return done;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two windows of `/f` holding `fill`, scattered by 2560 overwrites (4 MiB + 10 MiB written:
/// a budget of 0.7 MiB, less than a window), checkpointed, and half a second to be put off.
fn two_windows_put_off(name: &str, fill: u8) -> (ShmVolume, Fs, File, Vec<u8>) {
    let len = 2 * WINDOW;
    let mut model = vec![fill; len as usize];
    let (shm, fs, f) = file_holding(name, 64 << 20, &small_format(), options(), &model);
    scatter(&f, &mut model, len, 2560, 5);
    fs.checkpoint().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    (shm, fs, f, model)
}

#[test]
fn scattered_windows_come_back_whole_with_the_same_bytes_and_times() {
    whole_windows(false);
}

/// With data checksums the copies get their blocks' checksums, and every read verifies.
#[test]
fn with_data_checksums_too() {
    whole_windows(true);
}

fn whole_windows(data_checksums: bool) {
    let format = FormatOptions {
        data_checksums,
        ..small_format()
    };
    let len = 4 * WINDOW;
    let mut model: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let (shm, fs, f) = file_holding("defrag-whole", 96 << 20, &format, options(), &model);
    // 160 MiB of overwrites: the rewrites' budget (1/20 of what callers wrote) covers the
    // four windows.
    scatter(&f, &mut model, len, 40_000, 7);
    // A hole in the third window: it must stay one (the rewrite copies the data around it).
    f.punch_hole(2 * WINDOW + 8192, 16384).unwrap();
    model[(2 * WINDOW + 8192) as usize..(2 * WINDOW + 8192 + 16384) as usize].fill(0);
    fs.checkpoint().unwrap();
    for w in 0..4 {
        assert!(
            pieces(&f, w * WINDOW, WINDOW) >= 64,
            "window {w} is not scattered: the test does not test anything"
        );
    }
    let before = f.stat();
    let media_before = fs.stats().media_bytes;

    let done = wait_for(&fs, 4);
    assert_eq!(done, 4, "windows rewritten");
    // The rewrite of the window with the hole is two records short of a window each, so the
    // checkpoint notes that window again; it is looked at and left (two pieces).
    fs.checkpoint().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs.stats().idle && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(fs.stats().idle, "{:?}", fs.stats());
    assert_eq!(fs.stats().defragmented_windows, 4);
    for w in [0, 1, 3] {
        assert_eq!(pieces(&f, w * WINDOW, WINDOW), 1, "window {w}");
    }
    // The window with the hole: the data after it in one piece. (The two blocks before it
    // may be copied into the file's own blocks by the checkpoint, as it does with small runs
    // when it has no room to keep the blocks they replace.)
    let hole = (2 * WINDOW + 8192, 2 * WINDOW + 8192 + 16384);
    assert_eq!(pieces(&f, hole.1, 3 * WINDOW - hole.1), 1, "after the hole");
    let holes = f.data_ranges(2 * WINDOW, WINDOW).unwrap();
    assert!(
        holes.iter().all(|r| r.end <= hole.0 || r.start >= hole.1),
        "the hole was filled: {holes:?}"
    );
    assert_eq!(read_all(&f), model);
    let after = f.stat();
    assert_eq!(
        (after.mtime_ns, after.ctime_ns),
        (before.mtime_ns, before.ctime_ns)
    );
    assert_eq!(after.size, before.size);
    // Four windows' data bytes, counted as media writes (plus their records and the
    // batches).
    let media = fs.stats().media_bytes - media_before;
    assert!(
        media >= 4 * WINDOW - 16384,
        "{media} media bytes for four windows"
    );

    // Reopened (snapshot and logs as left by the unmount), the file is the same.
    drop(f);
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), options()).unwrap();
    let f = fs.open_read("/f").unwrap();
    assert_eq!(read_all(&f), model);
    assert_eq!(pieces(&f, 0, WINDOW), 1);
    let again = f.stat();
    assert_eq!(
        (again.mtime_ns, again.ctime_ns),
        (before.mtime_ns, before.ctime_ns)
    );
}

#[test]
fn writers_that_come_and_go_during_passes_lose_nothing() {
    let len = 6 * WINDOW;
    let mut model: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
    let (shm, fs, f) = file_holding(
        "defrag-writers",
        96 << 20,
        &small_format(),
        options(),
        &model,
    );
    // Bursts of overwrites with pauses just past the idle time: passes start, and the next
    // burst meets them mid-way.
    for round in 0..12u64 {
        scatter(&f, &mut model, len, 2500, 11 + round);
        std::thread::sleep(Duration::from_millis(100 + (round % 4) * 40));
    }
    assert_eq!(read_all(&f), model);
    let done = wait_for(&fs, 1);
    assert!(done >= 1, "nothing was defragmented");
    assert_eq!(read_all(&f), model);
    drop(f);
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), options()).unwrap();
    assert_eq!(read_all(&fs.open_read("/f").unwrap()), model);
}

#[test]
fn off_or_on_demand_it_does_nothing() {
    for options in [
        FsOptions {
            defrag: false,
            ..options()
        },
        FsOptions {
            checkpoint: CheckpointMode::OnDemand,
            ..options()
        },
    ] {
        let mut model = vec![1u8; (2 * WINDOW) as usize];
        let (_shm, fs, f) = file_holding("defrag-off", 64 << 20, &small_format(), options, &model);
        scatter(&f, &mut model, 2 * WINDOW, 2000, 3);
        fs.checkpoint().unwrap();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(fs.stats().defragmented_windows, 0);
        assert!(pieces(&f, 0, WINDOW) >= 64);
        assert_eq!(read_all(&f), model);
        // Nothing is noted for a defragmenter that is not there, by the checkpoint or by
        // scattered reads, so the file system counts as idle (what `bench fs` waits for
        // after each case: 10 s a case, before).
        read_in(&f, 0, 2 * WINDOW, 4096);
        let stats = fs.stats();
        assert_eq!(stats.defrag_windows_noted, 0, "{stats:?}");
        assert!(stats.idle, "{stats:?}");
    }
}

/// The rewrites stay within 1/20 of what callers wrote: a few thousand scattered blocks do
/// not buy a 2 MiB rewrite; more writes later buy one, and the window the budget does not
/// reach waits, put off (not noted, so the file system counts as idle).
#[test]
fn the_rewrites_stay_within_their_budget() {
    let len = 2 * WINDOW;
    let (_shm, fs, f, mut model) = two_windows_put_off("defrag-budget", 3);
    let stats = fs.stats();
    assert_eq!(stats.defragmented_windows, 0);
    assert_eq!(
        (stats.defrag_windows_noted, stats.defrag_windows_deferred),
        (0, 2),
        "both windows put off, none dropped"
    );
    assert!(
        stats.idle,
        "windows put off leave the file system idle: {stats:?}"
    );
    assert!(pieces(&f, 0, WINDOW) >= 64 && pieces(&f, WINDOW, WINDOW) >= 64);
    // 28 MiB more (a budget of 2.1 MiB): one window is rewritten, the other waits.
    scatter(&f, &mut model, len, 7168, 6);
    assert_eq!(wait_for(&fs, 1), 1);
    std::thread::sleep(Duration::from_millis(500));
    let stats = fs.stats();
    assert_eq!(stats.defragmented_windows, 1);
    assert_eq!(
        (stats.defrag_windows_noted, stats.defrag_windows_deferred),
        (0, 1)
    );
    fs.checkpoint().unwrap();
    let whole = [pieces(&f, 0, WINDOW), pieces(&f, WINDOW, WINDOW)];
    assert!(
        whole.contains(&1) && whole.iter().any(|&p| p >= 64),
        "{whole:?}"
    );
    assert_eq!(read_all(&f), model);
}

/// Reads earn what the writes' budget does not cover: a window read about its own size in
/// scattered reads is rewritten though the budget is spent (half of it is not enough); one
/// read whole in 4 KiB reads (one piece each, nothing to gain) is not.
#[test]
fn scattered_reads_earn_a_rewrite_outside_the_budget() {
    let (_shm, fs, f, model) = two_windows_put_off("defrag-reads", 5);
    let stats = fs.stats();
    assert_eq!(
        (
            stats.defragmented_windows,
            stats.defrag_windows_noted,
            stats.defrag_windows_deferred
        ),
        (0, 0, 2)
    );
    // Window 0 read as a FUSE mount asks for it, in reads of 1 MiB less 16 bytes (the
    // window's last 32 bytes come in a read of one piece). The first read, half the window,
    // is not enough; all of window 1 in 4 KiB reads is not scattered.
    let fuse_reads = (1 << 20) - 16;
    let mut buf = vec![0u8; fuse_reads];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), fuse_reads);
    read_in(&f, WINDOW, WINDOW, 4096);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fs.stats().defragmented_windows, 0);
    // The rest of the pass: window 0 has earned its rewrite (32 bytes short of its size).
    assert_eq!(f.read_at(&mut buf, fuse_reads as u64).unwrap(), fuse_reads);
    assert_eq!(
        f.read_at(&mut buf[..32], 2 * fuse_reads as u64).unwrap(),
        32
    );
    assert_eq!(wait_for(&fs, 1), 1);
    std::thread::sleep(Duration::from_millis(300));
    let stats = fs.stats();
    assert_eq!(
        (stats.defragmented_windows, stats.defragmented_for_reads),
        (1, 1),
        "exactly the window read scattered, paid by its reads"
    );
    assert_eq!(
        (stats.defrag_windows_noted, stats.defrag_windows_deferred),
        (0, 1)
    );
    fs.checkpoint().unwrap();
    assert_eq!(pieces(&f, 0, WINDOW), 1);
    assert!(pieces(&f, WINDOW, WINDOW) >= 64);
    assert_eq!(read_all(&f), model);
}

/// A window whose reads earned its rewrite while logged data still lay over it (the
/// checkpoint had not moved it yet) waits for the checkpoint and is rewritten then, still
/// paid for by its reads, instead of being forgotten.
#[test]
fn an_earned_window_waits_for_logged_data_to_be_checkpointed() {
    let (_shm, fs, f, mut model) = two_windows_put_off("defrag-reads-logged", 9);
    assert_eq!(fs.stats().defrag_windows_deferred, 2);
    fs.quiesced(|| {
        // Logged, and held there: the checkpoint waits for `quiesced` to return.
        let block = vec![0xA5u8; 4096];
        f.write_at(&block, 8192).unwrap();
        model[8192..8192 + 4096].copy_from_slice(&block);
        read_in(&f, 0, WINDOW, 64 << 10);
        // Idle for the defragmenter, which finds the window's logged data.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(fs.stats().defragmented_windows, 0);
    });
    // Dropped instead, the window would come back only as one for the writes' budget, which
    // does not cover it.
    assert_eq!(wait_for(&fs, 1), 1, "the earned window was dropped");
    assert_eq!(fs.stats().defragmented_for_reads, 1);
    fs.checkpoint().unwrap();
    assert_eq!(pieces(&f, 0, WINDOW), 1);
    assert_eq!(read_all(&f), model);
}
