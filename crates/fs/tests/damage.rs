//! Damaged media is named, never silently rolled back: a damaged journal record with whole
//! records of its epoch after it is reported by open and check alike, while a torn last
//! record (what a crash leaves) is dropped as before.

use fs::{Fs, FsError};
use pmem::Tracer;
use testkit::*;

/// A volume image with ten files created after the last snapshot (their records are in a
/// thread's journal) and left as a crash would leave it.
fn ten_creates() -> Vec<u8> {
    let tracer = Tracer::new();
    let fs = format_over(vec![traced_dirty_volume_device(&tracer, 8 << 20)]);
    for i in 0..10 {
        fs.create(&format!("/damage-file-{i:02}")).unwrap();
    }
    fs.abandon();
    tracer.contents()[0].clone()
}

fn flip_in(image: &mut [u8], needle: &[u8]) {
    let at = image
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the name is on the device");
    image[at] ^= 1;
}

fn check(image: Vec<u8>) -> Result<fs::FsCheck, FsError> {
    let replay = Tracer::new();
    Fs::check(&volume_over(vec![replay.region_with(image)]).unwrap())
}

#[test]
fn the_journal_as_written_replays_every_record() {
    let check = check(ten_creates()).unwrap();
    assert_eq!((check.files, check.journal_records), (10, 10));
}

#[test]
fn a_damaged_journal_record_before_whole_ones_is_named_not_dropped_with_them() {
    let mut image = ten_creates();
    flip_in(&mut image, b"damage-file-00");
    let error = check(image.clone()).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("journal of slot 1") && text.contains("is damaged"),
        "{text}"
    );
    assert!(text.contains("0 record(s) before it replay"), "{text}");
    let replay = Tracer::new();
    let open = Fs::open(
        volume_over(vec![replay.region_with(image)]).unwrap(),
        small_options(),
    );
    assert!(
        matches!(&open, Err(FsError::Corrupt { .. })),
        "open must refuse too: {:?}",
        open.map(|_| ())
    );
}

#[test]
fn a_damaged_last_journal_record_is_a_torn_append() {
    let mut image = ten_creates();
    flip_in(&mut image, b"damage-file-09");
    let check = check(image).unwrap();
    assert_eq!((check.files, check.journal_records), (9, 9));
}

/// A volume image after files were created and the file system unmounted cleanly (the final
/// snapshot is the last thing written), with the offsets of its two root copies, the copy in
/// use first.
fn unmounted() -> (Vec<u8>, [usize; 2]) {
    let tracer = Tracer::new();
    let fs = format_over(vec![traced_dirty_volume_device(&tracer, 8 << 20)]);
    fs.mkdir("/d", 0o755).unwrap();
    for i in 0..3 {
        fs.create(&format!("/d/f{i}"))
            .unwrap()
            .write_at(b"kept", 0)
            .unwrap();
    }
    fs.unmount().unwrap();
    let image = tracer.contents()[0].clone();
    let copies: Vec<usize> = image
        .windows(8)
        .enumerate()
        .filter(|(_, w)| *w == b"LOCUSFS1")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(copies.len(), 2, "two root copies");
    let generation = |at: usize| u64::from_le_bytes(image[at + 16..at + 24].try_into().unwrap());
    let (a, b) = (copies[0], copies[1]);
    let order = if generation(a) > generation(b) {
        [a, b]
    } else {
        [b, a]
    };
    (image, order)
}

#[test]
fn a_damaged_root_in_use_is_named_not_rolled_back() {
    let (clean, [current, _]) = unmounted();
    assert_eq!(check(clean.clone()).unwrap().files, 3);
    let mut image = clean;
    image[current + 200] ^= 1;
    let error = check(image.clone()).unwrap_err().to_string();
    assert!(
        error.contains("root copy") && error.contains("would roll the file system back"),
        "{error}"
    );
    let replay = Tracer::new();
    assert!(
        Fs::open(
            volume_over(vec![replay.region_with(image)]).unwrap(),
            small_options()
        )
        .is_err(),
        "open must refuse too"
    );
}

#[test]
fn a_damaged_older_root_copy_is_reported_and_harmless() {
    let (mut image, [_, older]) = unmounted();
    image[older + 200] ^= 1;
    let check = check(image.clone()).unwrap();
    assert_eq!(check.files, 3);
    let damage = check
        .damaged_root_copy
        .expect("the damaged copy is reported");
    assert!(damage.contains("crc32c"), "{damage}");
    // The next root update rewrites it.
    let replay = Tracer::new();
    let region = replay.region_with(image);
    let fs = Fs::open(volume_over(vec![region.clone()]).unwrap(), small_options()).unwrap();
    fs.unmount().unwrap();
    let again = Fs::check(&volume_over(vec![region]).unwrap()).unwrap();
    assert_eq!((again.files, again.damaged_root_copy), (3, None));
}

/// Salvages `image` and returns the report and the image as salvage left it.
fn salvage(image: Vec<u8>) -> (Result<fs::SalvageReport, FsError>, Vec<u8>) {
    let replay = Tracer::new();
    let report = Fs::salvage(&volume_over(vec![replay.region_with(image)]).unwrap());
    (report, replay.contents()[0].clone())
}

#[test]
fn repair_cuts_a_damaged_journal_back_to_just_before_the_damage() {
    let mut image = ten_creates();
    flip_in(&mut image, b"damage-file-04");
    assert!(check(image.clone()).is_err());
    let (report, repaired) = salvage(image);
    let report = report.unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    assert!(report.damage[0].contains("journal of slot 1"), "{report:?}");
    // The five whole records after the damaged one are dropped; nothing else was written.
    assert_eq!(report.dropped_journal_records, 5, "{report:?}");
    assert_eq!(report.dropped_writes, 0);
    assert!(
        report.files_at_risk.is_empty(),
        "creates free nothing: {report:?}"
    );
    // It checks clean and opens with the four files created before the damage.
    let after = check(repaired.clone()).unwrap();
    assert_eq!((after.files, after.journal_records), (4, 4));
    let replay = Tracer::new();
    let fs = Fs::open(
        volume_over(vec![replay.region_with(repaired)]).unwrap(),
        small_options(),
    )
    .unwrap();
    let mut names: Vec<String> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        (0..4)
            .map(|i| format!("damage-file-{i:02}"))
            .collect::<Vec<_>>()
    );
    fs.unmount().unwrap();
}

/// Files created by this thread (slot 1's journal) around three writes another thread logs
/// (slot 2's log area), left as a crash leaves them.
fn creates_around_writes() -> Vec<u8> {
    let tracer = Tracer::new();
    let fs = Fs::format(
        volume_over(vec![traced_dirty_volume_device(&tracer, 8 << 20)]).unwrap(),
        &small_format(),
        fs::FsOptions {
            checkpoint: fs::CheckpointMode::OnDemand,
            ..small_options()
        },
    )
    .unwrap();
    fs.create("/w").unwrap();
    for i in 0..5 {
        fs.create(&format!("/damage-file-{i:02}")).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let w = fs.open_file("/w", fs::OpenOptions::read_write()).unwrap();
            for k in 0..3u64 {
                w.write_at(&pattern(k, k * 4096, 4096), k * 4096).unwrap();
            }
        });
    });
    for i in 5..10 {
        fs.create(&format!("/damage-file-{i:02}")).unwrap();
    }
    fs.abandon();
    tracer.contents()[0].clone()
}

#[test]
fn repair_drops_what_followed_the_damage_in_every_journal_and_log() {
    // Damage after the writes: they are kept.
    let mut image = creates_around_writes();
    flip_in(&mut image, b"damage-file-07");
    let (report, repaired) = salvage(image);
    let report = report.unwrap();
    assert_eq!(
        (report.dropped_journal_records, report.dropped_writes),
        (2, 0)
    );
    let after = check(repaired).unwrap();
    assert_eq!((after.files, after.log_records), (8, 3), "{after:?}");

    // Damage before them: the writes another thread logged later are dropped too — the
    // file system is kept as it was at one point of its history.
    let mut image = creates_around_writes();
    flip_in(&mut image, b"damage-file-02");
    let (report, repaired) = salvage(image);
    let report = report.unwrap();
    assert_eq!(report.dropped_writes, 3, "{report:?}");
    assert_eq!(report.dropped_write_bytes, 3 * 4096);
    assert_eq!(report.files_losing_writes, vec!["/w".to_owned()]);
    let after = check(repaired.clone()).unwrap();
    assert_eq!((after.files, after.log_records), (3, 0), "{after:?}");
    let replay = Tracer::new();
    let fs = Fs::open(
        volume_over(vec![replay.region_with(repaired)]).unwrap(),
        small_options(),
    )
    .unwrap();
    assert_eq!(fs.stat("/w").unwrap().size, 0);
    fs.unmount().unwrap();
}

#[test]
fn repair_refuses_damage_it_cannot_cut_around() {
    let (clean, [current, _]) = unmounted();
    let mut image = clean;
    image[current + 200] ^= 1;
    let (report, after) = salvage(image.clone());
    let error = report.unwrap_err().to_string();
    assert!(error.contains("root copy"), "{error}");
    assert_eq!(after, image, "a refused repair writes nothing");
}
