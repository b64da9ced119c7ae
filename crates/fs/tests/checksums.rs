//! Data checksums (`FormatOptions::data_checksums`): a flipped bit in file data — in a file's
//! block or in the buffer of a logged write — fails the read that touches it with an I/O
//! error naming the file and offset (never the wrong bytes), `Fs::scrub` names every damaged
//! block, and moving damaged logged data into its file keeps it marked damaged.

use fs::{CheckpointMode, ErrorKind, FormatOptions, Fs, FsError, FsOptions, HeldBy};
use pmem::Tracer;
use testkit::*;

fn options() -> FsOptions {
    FsOptions {
        checkpoint: CheckpointMode::OnDemand,
        ..small_options()
    }
}

/// `/a`: 64 KiB moved into its blocks, then 100 bytes at 5000 logged over them; `/b`: 3000
/// bytes at 10 000 logged only. Left as a crash leaves it: the logged writes are still in the
/// logs.
fn image(data_checksums: bool) -> Vec<u8> {
    let tracer = Tracer::new();
    let fs = Fs::format(
        volume_over(vec![traced_dirty_volume_device(&tracer, 8 << 20)]).unwrap(),
        &FormatOptions {
            data_checksums,
            ..small_format()
        },
        options(),
    )
    .unwrap();
    let a = fs.create("/a").unwrap();
    a.write_at(&pattern(1, 0, 64 << 10), 0).unwrap();
    fs.checkpoint().unwrap();
    a.write_at(&pattern(2, 5000, 100), 5000).unwrap();
    fs.create("/b")
        .unwrap()
        .write_at(&pattern(3, 10_000, 3000), 10_000)
        .unwrap();
    fs.abandon();
    tracer.contents()[0].clone()
}

/// Flips one bit of the byte that holds file offset `offset` of what `tag` wrote at
/// `written_at` (found by its bytes; the pattern is unique).
fn flip(image: &mut [u8], tag: u64, written_at: u64, offset: u64) {
    let needle = pattern(tag, offset, 64);
    let at = image
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("the data is on the device");
    assert!(offset >= written_at);
    image[at + 10] ^= 0x10;
}

fn open(image: &[u8]) -> Fs {
    let replay = Tracer::new();
    Fs::open(
        volume_over(vec![replay.region_with(image.to_vec())]).unwrap(),
        options(),
    )
    .unwrap()
}

fn scrub(image: &[u8]) -> Result<fs::ScrubReport, FsError> {
    let replay = Tracer::new();
    Fs::scrub(&volume_over(vec![replay.region_with(image.to_vec())]).unwrap())
}

fn read(fs: &Fs, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
    let mut buf = vec![0u8; len];
    let n = fs.open_read(path).unwrap().read_at(&mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

/// What `/a` holds.
fn expected_a() -> Vec<u8> {
    let mut a = pattern(1, 0, 64 << 10);
    a[5000..5100].copy_from_slice(&pattern(2, 5000, 100));
    a
}

#[test]
fn undamaged_data_reads_back_and_scrubs_clean() {
    let image = image(true);
    let report = scrub(&image).unwrap();
    assert_eq!(report.files, 2);
    // /a: 16 file blocks and the logged write's block; /b: one block or two.
    assert!(report.blocks >= 18, "{report:?}");
    assert!(report.damaged.is_empty(), "{report:?}");
    let fs = open(&image);
    assert_eq!(read(&fs, "/a", 0, 64 << 10).unwrap(), expected_a());
    assert_eq!(
        read(&fs, "/b", 10_000, 3000).unwrap(),
        pattern(3, 10_000, 3000)
    );
    // Moved into the files (the partial blocks rebuilt in fresh pages), still the same.
    fs.checkpoint().unwrap();
    assert_eq!(read(&fs, "/a", 0, 64 << 10).unwrap(), expected_a());
    fs.unmount().unwrap();
}

#[test]
fn a_flipped_bit_in_a_file_block_fails_the_reads_that_touch_it_and_scrub_names_it() {
    let mut image = image(true);
    flip(&mut image, 1, 0, 8192 + 100);
    // The metadata is sound: only the data is damaged.
    let replay = Tracer::new();
    Fs::check(&volume_over(vec![replay.region_with(image.clone())]).unwrap()).unwrap();

    let report = scrub(&image).unwrap();
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    let bad = &report.damaged[0];
    assert_eq!(
        (bad.path.as_str(), bad.offset, bad.len, bad.held_by),
        ("/a", 8192, 4096, HeldBy::FileBlock)
    );

    let fs = open(&image);
    // Every read touching the block fails, whatever part of it it wants.
    for (offset, len) in [(8192, 4096), (9000, 10), (4096, 8192), (0, 64 << 10)] {
        let error = read(&fs, "/a", offset, len).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Io, "{error}");
        match &error {
            FsError::DataChecksum { offset: at, .. } => {
                assert_eq!(*at, offset.max(8192), "read {offset}+{len}: {error}");
            }
            other => panic!("read {offset}+{len}: {other}"),
        }
        assert!(error.to_string().contains("damaged"), "{error}");
    }
    // The blocks around it read as written.
    let a = expected_a();
    assert_eq!(read(&fs, "/a", 0, 8192).unwrap(), a[..8192]);
    assert_eq!(read(&fs, "/a", 12_288, 4096).unwrap(), a[12_288..16_384]);
    fs.abandon();
}

#[test]
fn a_flipped_bit_in_a_logged_write_stays_an_error_after_the_checkpoint_moves_it() {
    let mut image = image(true);
    flip(&mut image, 3, 10_000, 11_000);
    let report = scrub(&image).unwrap();
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    assert_eq!(
        (report.damaged[0].path.as_str(), report.damaged[0].held_by),
        ("/b", HeldBy::LoggedWrite)
    );
    let fs = open(&image);
    let error = read(&fs, "/b", 10_000, 3000).unwrap_err();
    assert!(matches!(error, FsError::DataChecksum { .. }), "{error}");
    // The checkpoint rebuilds the partial blocks in fresh pages: from damaged bytes, the
    // new block is marked damaged, not given a checksum of the wrong bytes.
    fs.checkpoint().unwrap();
    assert_eq!(fs.stats().records_pending, 0);
    let error = read(&fs, "/b", 10_000, 3000).unwrap_err();
    assert!(matches!(error, FsError::DataChecksum { .. }), "{error}");
    fs.abandon();
}

#[test]
fn without_checksums_the_same_flip_reads_back_wrong_and_scrub_says_why_it_cannot_check() {
    let mut image = image(false);
    flip(&mut image, 1, 0, 8192 + 100);
    let fs = open(&image);
    let got = read(&fs, "/a", 8192, 4096).unwrap();
    assert_ne!(got, expected_a()[8192..12_288], "the flip is in /a's data");
    fs.abandon();
    let error = scrub(&image).unwrap_err().to_string();
    assert!(error.contains("no data checksums"), "{error}");
}

#[test]
fn a_damaged_checksum_directory_is_named() {
    let mut image = image(true);
    let at = image
        .windows(8)
        .position(|w| w == b"LOCUSCKD")
        .expect("the directory is on the device");
    image[at + 20] ^= 1;
    let replay = Tracer::new();
    let error = Fs::check(&volume_over(vec![replay.region_with(image)]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("data-checksum directory") && error.contains("crc32c mismatch"),
        "{error}"
    );
}

/// A running file system (background checkpoint) on a fresh 64 MiB volume in /dev/shm.
fn running(name: &str, data_checksums: bool) -> (ShmVolume, Fs) {
    let shm = shm_volume(name, 64 << 20);
    let fs = Fs::format(
        open_volume(&shm.dir),
        &FormatOptions {
            data_checksums,
            ..small_format()
        },
        small_options(),
    )
    .unwrap();
    (shm, fs)
}

/// A live scrub (`Fs::scrub_live`) runs beside writers: random whole and partial overwrites
/// of one file, files made, written, truncated and removed (one while open, so its blocks
/// are freed at its last close), the background checkpoint and defragmentation moving and
/// freeing blocks all the while. Every scrub among them is clean — what it reads holds
/// still — and once a bit is flipped in a block of a file nobody writes, the next scrub
/// names that block, and only it, while the writers go on.
#[test]
fn a_live_scrub_beside_writers_names_real_damage_and_nothing_else() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};

    let (shm, fs) = running("live-scrub", true);
    // 1 MiB nobody writes again, moved into its blocks; its block 100 holds a marker found
    // nowhere else (a pattern's bytes can recur).
    const MARKER: &[u8] = b"the one block of /still that a bit will be flipped in";
    let mut still = pattern(7, 0, 1 << 20);
    still[100 * 4096 + 64..][..MARKER.len()].copy_from_slice(MARKER);
    fs.create("/still").unwrap().write_at(&still, 0).unwrap();
    fs.checkpoint().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(3));
    let overwriter = {
        let (fs, stop, started) = (fs.clone(), Arc::clone(&stop), Arc::clone(&started));
        std::thread::spawn(move || {
            let hot = fs.create("/hot").unwrap();
            hot.write_at(&pattern(8, 0, 4 << 20), 0).unwrap();
            started.wait();
            let mut x = 1u64;
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let offset = (x >> 33) % (4 << 20);
                // Whole blocks (remapped by the checkpoint) and partial ones (rebuilt).
                let (at, len) = if x & 1 == 0 {
                    (offset - offset % 4096, 4096)
                } else {
                    (offset, 1 + (x >> 20) % 6000)
                };
                let len = len.min((4 << 20) - at) as usize;
                hot.write_at(&pattern(9, at, len), at).unwrap();
                writes += 1;
            }
            writes
        })
    };
    let churner = {
        let (fs, stop, started) = (fs.clone(), Arc::clone(&stop), Arc::clone(&started));
        std::thread::spawn(move || {
            started.wait();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/churn{}", round % 4);
                let file = fs.create(&path).unwrap();
                file.write_at(&pattern(round, 0, 300 << 10), 0).unwrap();
                file.write_at(&pattern(round + 1, 5000, 9000), 5000)
                    .unwrap();
                file.set_len(100 << 10).unwrap();
                if round.is_multiple_of(3) {
                    // Removed while open: its blocks go at this handle's close.
                    fs.unlink(&path).unwrap();
                    file.write_at(&pattern(round, 0, 64 << 10), 0).unwrap();
                }
                drop(file);
                round += 1;
            }
            round
        })
    };
    started.wait();
    let progress = fs::ScrubProgress::default();
    let begun = std::time::Instant::now();
    let mut scrubs = 0;
    while scrubs < 12 || begun.elapsed() < std::time::Duration::from_secs(1) {
        scrubs += 1;
        let report = fs.scrub_live(&progress).unwrap();
        assert!(report.damaged.is_empty(), "a clean volume: {report:?}");
        assert!(
            report.blocks >= 256,
            "/still alone has 256 blocks: {report:?}"
        );
        assert_eq!(progress.files_done(), progress.files_total());
    }

    assert_eq!(read(&fs, "/still", 0, 1 << 20).unwrap(), still);
    // One bit of /still's block 100, flipped in the device file under the running file
    // system (the file is the memory it maps).
    damage_marked_block(&shm.dir, MARKER);
    let report = fs.scrub_live(&progress).unwrap();
    stop.store(true, Ordering::Relaxed);
    let writes = overwriter.join().unwrap();
    let rounds = churner.join().unwrap();
    assert!(
        writes > 0 && rounds > 0,
        "the writers ran: {writes} writes, {rounds} rounds"
    );
    let found: Vec<_> = report
        .damaged
        .iter()
        .map(|d| (d.path.as_str(), d.offset, d.len, d.held_by))
        .collect();
    assert_eq!(
        found,
        [("/still", 100 * 4096, 4096, HeldBy::FileBlock)],
        "{report:?}"
    );
    let error = read(&fs, "/still", 100 * 4096, 10).unwrap_err();
    assert!(matches!(error, FsError::DataChecksum { .. }), "{error}");
    fs.unmount().unwrap();
}

/// A live scrub that finds damage names the damaged file by its path, walking the
/// directories while another thread makes and removes files in them. (The walk held the
/// inode table while it waited for a directory's entries, which a removal holds while it
/// takes the table: the two hung, each waiting for the other.)
#[test]
fn a_live_scrub_that_finds_damage_beside_removals_names_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (shm, fs) = running("live-scrub-removals", true);
    const MARKER: &[u8] = b"the block of /d/still whose bit is flipped while files come and go";
    let mut still = pattern(3, 0, 64 << 10);
    still[4 * 4096 + 64..][..MARKER.len()].copy_from_slice(MARKER);
    fs.mkdir("/d", 0o755).unwrap();
    fs.create("/d/still").unwrap().write_at(&still, 0).unwrap();
    fs.checkpoint().unwrap();
    damage_marked_block(&shm.dir, MARKER);
    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let (fs, stop) = (fs.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/d/churn{}", round % 8);
                fs.create(&path).unwrap().write_at(b"x", 0).unwrap();
                fs.unlink(&path).unwrap();
                round += 1;
            }
            round
        })
    };
    let progress = fs::ScrubProgress::default();
    let begun = std::time::Instant::now();
    let mut scrubs = 0;
    while scrubs < 50 || begun.elapsed() < std::time::Duration::from_secs(2) {
        scrubs += 1;
        let report = fs.scrub_live(&progress).unwrap();
        let found: Vec<_> = report
            .damaged
            .iter()
            .map(|d| (d.path.as_str(), d.offset))
            .collect();
        assert_eq!(
            found,
            [("/d/still", 4 * 4096)],
            "scrub {scrubs}: {report:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert!(churner.join().unwrap() > 0);
    fs.unmount().unwrap();
}

/// A scrub that is asked to stop ends with an error saying so; a runner joins a scrub that
/// runs instead of starting a second, and reports how the last one ended.
#[test]
fn a_scrub_runner_runs_one_scrub_at_a_time_and_says_how_it_ended() {
    let (_shm, fs) = running("scrub-runner", true);
    for i in 0..8 {
        fs.create(&format!("/f{i}"))
            .unwrap()
            .write_at(&pattern(i, 0, 1 << 20), 0)
            .unwrap();
    }
    let stopped = fs::ScrubProgress::default();
    stopped.stop();
    let error = fs.scrub_live(&stopped).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Shutdown, "{error}");
    assert!(error.to_string().contains("stopped"), "{error}");

    let runner = fs::ScrubRunner::new();
    assert_eq!(runner.status().id, 0, "no scrub yet");
    let first = runner.start(&fs).unwrap();
    assert!(first.id >= 1, "{first:?}");
    let status = loop {
        let status = runner.status();
        if !status.running {
            break status;
        }
        // A start while it runs joins it.
        assert_eq!(runner.start(&fs).unwrap().id, first.id);
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(status.id, first.id);
    let report = status.report.expect("it ended with a report");
    assert_eq!((report.files, report.blocks), (8, 8 * 256), "{report:?}");
    assert!(report.damaged.is_empty());
    assert_eq!((status.files_done, status.files_total), (8, 8));
    let second = runner.start(&fs).unwrap().id;
    assert!(second > first.id, "the next start starts another");
    // A runner made later (as a program through the preload library makes one at each
    // mount) has started none, and numbers its scrubs after every earlier one.
    let later = fs::ScrubRunner::new();
    assert_eq!(later.status().id, 0);
    // Stopped (most likely while it reads): it ends, with its report or saying it stopped.
    runner.stop();
    let status = runner.status();
    assert!(!status.running && status.id == second, "{status:?}");
    assert!(later.start(&fs).unwrap().id > second);
    drop(later);
    match (&status.report, &status.error) {
        (Some(report), None) => assert_eq!(report.blocks, 8 * 256),
        (None, Some(error)) => assert!(error.contains("stopped"), "{error}"),
        other => panic!("{other:?}"),
    }
    drop(runner);
    fs.unmount().unwrap();
}

/// A file system without data checksums has nothing for a live scrub to check, and says so.
#[test]
fn a_live_scrub_without_checksums_says_why_it_cannot_check() {
    let (_shm, fs) = running("live-scrub-none", false);
    let error = fs
        .scrub_live(&fs::ScrubProgress::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("no data checksums"), "{error}");
    fs.unmount().unwrap();
}
