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
    let region = traced_volume_device(&tracer, 8 << 20);
    let fs = Fs::format(
        volume_over(vec![region]).unwrap(),
        &small_format(),
        small_options(),
    )
    .unwrap();
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
