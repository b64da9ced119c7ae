//! Data checksums (`FormatOptions::data_checksums`): a flipped bit in file data — in a file's
//! block or in the buffer of a logged write — fails the read that touches it with an I/O
//! error naming the file and offset (never the wrong bytes), `Fs::scrub` names every damaged
//! block, and moving damaged logged data into its file keeps it marked damaged.

use fs::{CheckpointMode, ErrorKind, FormatOptions, Fs, FsError, FsOptions};
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
        ("/a", 8192, 4096, "file block")
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
        ("/b", "logged write")
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
