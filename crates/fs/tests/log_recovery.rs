//! Log areas: append, retire, wrap, recover; crash images at every fence recover every
//! acknowledged record and nothing torn; damage is reported, not guessed around. The retired
//! watermark comes from the file system's metadata (a checkpoint batch records it), so
//! recovery is handed it.

use fs::{FsError, LogArea};
use pmem::Tracer;

fn area(records: u64) -> (Tracer, LogArea) {
    let tracer = Tracer::new();
    let region = tracer.region(LogArea::bytes_for(records));
    let area = LogArea::format(region, 3).unwrap();
    (tracer, area)
}

fn reopen(tracer: &Tracer, retired: u64) -> Result<(LogArea, Vec<fs::LogRecord>), FsError> {
    let replay = Tracer::new();
    LogArea::recover(replay.region_with(tracer.contents()[0].clone()), retired)
}

#[test]
fn records_come_back_in_order_and_sequences_continue() {
    let (tracer, mut log) = area(8);
    for i in 0..5 {
        log.append(10, i * 4096, 4096, 0x100 + i, 50 + i, 1_000 + i)
            .unwrap();
    }
    let (mut again, records) = reopen(&tracer, 0).unwrap();
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(records[2].offset, 2 * 4096);
    assert_eq!(records[4].buffer, 0x104);
    assert_eq!(records[4].order, 54);
    assert_eq!(records[4].mtime, 1_004);
    assert_eq!(again.id(), 3);
    assert_eq!(again.append(10, 0, 1, 1, 60, 7).unwrap().sequence, 6);
}

#[test]
fn a_full_log_pushes_back_until_the_checkpoint_retires() {
    let (tracer, mut log) = area(4);
    for i in 0..4 {
        log.append(1, i, 1, i, i + 1, 1).unwrap();
    }
    assert!(matches!(
        log.append(1, 9, 1, 9, 9, 1),
        Err(FsError::LogFull { pending: 4, .. })
    ));
    log.retire_through(2);
    assert_eq!(
        log.append(1, 4, 1, 4, 5, 1).unwrap().sequence,
        5,
        "reuses slot 0"
    );
    assert_eq!(log.append(1, 5, 1, 5, 6, 1).unwrap().sequence, 6);
    let (_, records) = reopen(&tracer, 2).unwrap();
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        vec![3, 4, 5, 6]
    );
}

#[test]
fn every_crash_image_recovers_every_acknowledged_record_and_nothing_else() {
    let (tracer, mut log) = area(4);
    let formatted = tracer.fence_count();
    // (fence count when the operation returned, records acknowledged, retired watermark)
    let mut acknowledged = vec![(formatted, 0u64, 0u64)];
    for i in 0..7u64 {
        if i == 3 {
            log.retire_through(2);
            let &(_, acked, _) = acknowledged.last().unwrap();
            acknowledged.push((tracer.fence_count(), acked, 2));
        }
        if i == 5 {
            log.retire_through(4);
            let &(_, acked, _) = acknowledged.last().unwrap();
            acknowledged.push((tracer.fence_count(), acked, 4));
        }
        log.append(7, i * 4096, 4096, 0x1000 + i, 100 + i, 1)
            .unwrap();
        let &(_, _, retired) = acknowledged.last().unwrap();
        acknowledged.push((tracer.fence_count(), i + 1, retired));
    }
    let mut images = 0;
    for point in formatted..tracer.crash_points() {
        // What had returned before this crash point (everything whose last fence came first).
        let (_, acked, retired) = *acknowledged
            .iter()
            .rev()
            .find(|(fence, _, _)| *fence <= point)
            .unwrap();
        for image in tracer.crash_images(point, 256, point as u64) {
            images += 1;
            let replay = Tracer::new();
            let (recovered, records) =
                LogArea::recover(replay.region_with(image.regions[0].clone()), retired)
                    .unwrap_or_else(|e| panic!("{e} at {}", image.description));
            let sequences: Vec<u64> = records.iter().map(|r| r.sequence).collect();
            let watermark = recovered.retired();
            assert_eq!(watermark, retired);
            // Exactly the acknowledged records above the watermark, plus perhaps the one in flight.
            let must: Vec<u64> = (watermark + 1..=acked).collect();
            let may: Vec<u64> = (watermark + 1..=acked + 1).collect();
            assert!(
                sequences == must || sequences == may,
                "recovered {sequences:?}, acknowledged through {acked} above {watermark}, at {}",
                image.description
            );
            for record in &records {
                assert_eq!(
                    record.buffer,
                    0x1000 + record.sequence - 1,
                    "torn record accepted at {}",
                    image.description
                );
                assert_eq!(record.offset, (record.sequence - 1) * 4096);
                assert_eq!(record.order, 100 + record.sequence - 1);
            }
        }
    }
    assert!(images > 20, "only {images} images");
}

#[test]
fn damage_is_named() {
    let (tracer, mut log) = area(8);
    for i in 0..4 {
        log.append(1, i, 1, i, i + 1, 1).unwrap();
    }
    let image = tracer.contents()[0].clone();

    // A damaged record in the middle leaves a gap: reported, not skipped.
    let mut middle = image.clone();
    middle[64 * 2 + 10] ^= 1;
    let error = LogArea::recover(Tracer::new().region_with(middle), 0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("record 2 is missing before record 3"),
        "{error}"
    );

    // The last record damaged is indistinguishable from a torn append: dropped.
    let mut last = image.clone();
    last[64 * 4 + 3] ^= 1;
    let (_, records) = LogArea::recover(Tracer::new().region_with(last), 0).unwrap();
    assert_eq!(records.len(), 3);

    for (offset, field) in [(0usize, "magic"), (8, "version"), (16, "crc32c")] {
        let mut header = image.clone();
        header[offset] ^= 0x40;
        match LogArea::recover(Tracer::new().region_with(header), 0).unwrap_err() {
            FsError::BadLogHeader { field: found, .. } => assert_eq!(found, field),
            other => panic!("{other}"),
        }
    }
}

/// An area formatted before records carried their time (version 1) still opens, its
/// records read with time 0, and new records in it keep time 0, so that they stay what a
/// version-1 reader accepts.
#[test]
fn an_area_of_version_1_keeps_records_without_times() {
    let (tracer, mut log) = area(8);
    log.append(10, 0, 4096, 0x100, 50, 1_000).unwrap();
    drop(log);
    let mut image = tracer.contents()[0].clone();
    image[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&image[8..24]);
    image[60..64].copy_from_slice(&crc.to_le_bytes());
    // The record written above has a time; a version-1 area never held such a record, so
    // clear it the way version 1 wrote it (bytes 48..56 zero, CRC over the first 60).
    let slot = 64;
    image[slot + 48..slot + 56].fill(0);
    let crc = crc32c::crc32c(&image[slot..slot + 60]);
    image[slot + 60..slot + 64].copy_from_slice(&crc.to_le_bytes());
    let replay = Tracer::new();
    let region = replay.region_with(image);
    let (mut old, records) = LogArea::recover(region.clone(), 0).unwrap();
    assert_eq!((records.len(), records[0].mtime), (1, 0));
    assert_eq!(
        old.append(10, 4096, 4096, 0x200, 51, 2_000).unwrap().mtime,
        0
    );
    let (_, records) = LogArea::recover(region, 0).unwrap();
    assert_eq!(records.iter().map(|r| r.mtime).collect::<Vec<_>>(), [0, 0]);
}
