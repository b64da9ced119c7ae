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

fn pieces(first: u64, count: u64) -> Vec<fs::LogPiece> {
    (0..count)
        .map(|i| fs::LogPiece {
            offset: (first + i) * 4096,
            length: 4096,
            buffer: 0x9000 + first + i,
            data_sum: None,
        })
        .collect()
}

/// A write in pieces is one group of records: every crash image holds all of it or none,
/// and after a crash cut one short, the next append cannot be mistaken for its rest.
#[test]
fn every_crash_image_of_a_grouped_write_holds_all_of_it_or_none() {
    let (tracer, mut log) = area(16);
    assert_eq!(
        log.append(7, 0, 4096, 0x100, 100, 1).unwrap().parts,
        0,
        "a write of one record is not a group"
    );
    let before = tracer.fence_count();
    let group = log.append_group(7, &pieces(1, 3), 101, 2).unwrap();
    assert_eq!(
        group.iter().map(|r| (r.part, r.parts)).collect::<Vec<_>>(),
        [(0, 3), (1, 3), (2, 3)]
    );
    let after = tracer.fence_count();
    let mut images = 0;
    for point in before..tracer.crash_points() {
        for image in tracer.crash_images(point, 64, point as u64) {
            images += 1;
            let replay = Tracer::new();
            let region = replay.region_with(image.regions[0].clone());
            let (mut again, records) = LogArea::recover(region.clone(), 0)
                .unwrap_or_else(|e| panic!("{e} at {}", image.description));
            let sequences: Vec<u64> = records.iter().map(|r| r.sequence).collect();
            if point >= after {
                assert_eq!(
                    sequences,
                    [1, 2, 3, 4],
                    "acknowledged at {}",
                    image.description
                );
            } else {
                assert!(
                    sequences == [1] || sequences == [1, 2, 3, 4],
                    "part of a group survived: {sequences:?} at {}",
                    image.description
                );
            }
            if sequences == [1] {
                // A one-record write where the group was: the group's leftovers are gone.
                let one = again.append(7, 0, 4096, 0x200, 200, 3).unwrap();
                assert_eq!(one.sequence, 2);
                let (_, records) = LogArea::recover(region, 0)
                    .unwrap_or_else(|e| panic!("after a new append: {e} at {}", image.description));
                assert_eq!(
                    records
                        .iter()
                        .map(|r| (r.sequence, r.buffer))
                        .collect::<Vec<_>>(),
                    [(1, 0x100), (2, 0x200)],
                    "at {}",
                    image.description
                );
            }
        }
    }
    assert!(images > 10, "only {images} images");
}

/// Records out of step inside a group are damage, named.
#[test]
fn a_broken_group_is_named() {
    let (tracer, mut log) = area(8);
    log.append_group(1, &pieces(0, 3), 10, 1).unwrap();
    let mut image = tracer.contents()[0].clone();
    // Record 2 (slot 2) says it is part 3 of 3 instead of 2 of 3, with a valid CRC.
    let slot = 64 * 2;
    image[slot + 56..slot + 58].copy_from_slice(&2u16.to_le_bytes());
    let crc = crc32c::crc32c(&image[slot..slot + 60]);
    image[slot + 60..slot + 64].copy_from_slice(&crc.to_le_bytes());
    let error = LogArea::recover(Tracer::new().region_with(image), 0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("record 1 is part 1 of 3 of its write, record 2 part 3 of 3"),
        "{error}"
    );
}

/// Gives the area header in `image` the version word `version` and the CRC it would have
/// with version `crc_of` (the two differ: a raise a crash cut between its words).
fn with_version(image: &mut [u8], version: u32, crc_of: u32) {
    image[8..12].copy_from_slice(&crc_of.to_le_bytes());
    let crc = crc32c::crc32c(&image[8..24]);
    image[60..64].copy_from_slice(&crc.to_le_bytes());
    image[8..12].copy_from_slice(&version.to_le_bytes());
}

/// An area of version 2 (no groups) opens, is raised to the current version by its first
/// group, and a raise a crash cut between the version and the CRC reads as version 2 (as
/// does one by the version that raised to 3).
#[test]
fn a_version_2_area_is_raised_by_its_first_group() {
    let (tracer, mut log) = area(8);
    log.append(10, 0, 4096, 0x100, 50, 1_000).unwrap();
    drop(log);
    let mut v2 = tracer.contents()[0].clone();
    with_version(&mut v2, 2, 2);
    let replay = Tracer::new();
    let region = replay.region_with(v2.clone());
    let (mut old, records) = LogArea::recover(region.clone(), 0).unwrap();
    assert_eq!(records.len(), 1);
    old.append_group(10, &pieces(1, 2), 51, 2_000).unwrap();
    let raised = replay.contents()[0].clone();
    assert_eq!(u32::from_le_bytes(raised[8..12].try_into().unwrap()), 4);
    let (_, records) = LogArea::recover(region, 0).unwrap();
    assert_eq!(records.len(), 3);
    // Torn raises: the new version with the old CRC, the old version with the new CRC.
    for (version, crc_of) in [(4, 2), (2, 4), (3, 2), (2, 3)] {
        let mut torn = v2.clone();
        with_version(&mut torn, version, crc_of);
        let (_, records) = LogArea::recover(Tracer::new().region_with(torn), 0)
            .unwrap_or_else(|e| panic!("version {version} with the CRC of {crc_of}: {e}"));
        assert_eq!(records.len(), 1);
    }
}

/// Recovery reads the slots a window at a time and skips retired ones before their
/// checksums: an area of several windows, wrapped, gives back exactly the records past the
/// watermark, in order, each from its own slot — and a damaged slot among them is still
/// named.
#[test]
fn an_area_of_many_windows_recovers_the_records_past_the_watermark() {
    let (tracer, mut log) = area(2500);
    // 2500 appended, 2000 retired; 1900 more wrap into slots 0..1900 of the next round.
    for i in 0..2500 {
        log.append(7, i * 4096, 4096, 0x1000 + i, i + 1, 1).unwrap();
    }
    log.retire_through(2000);
    for i in 2500..4400 {
        log.append(7, i * 4096, 4096, 0x1000 + i, i + 1, 1).unwrap();
    }
    let (mut again, records) = reopen(&tracer, 2000).unwrap();
    let sequences: Vec<u64> = records.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, (2001..=4400).collect::<Vec<_>>());
    assert!(records.iter().all(|r| r.buffer == 0x1000 + r.sequence - 1));
    assert_eq!(again.append(7, 0, 1, 1, 9_999, 1).unwrap().sequence, 4401);

    // A live record written into the slot of another sequence is damage, wherever it is.
    let mut image = tracer.contents()[0].clone();
    let slot = |index: u64| (64 * (index + 1)) as usize;
    let (from, to) = (slot(2100), slot(1500));
    let moved = image[from..from + 64].to_vec();
    image[to..to + 64].copy_from_slice(&moved);
    let error = LogArea::recover(Tracer::new().region_with(image), 2000)
        .unwrap_err()
        .to_string();
    assert!(error.contains("sits in slot 1500"), "{error}");
}

/// A clean unmount seals an area whose records are all retired: recovery from the same
/// watermark then reads only the slot the seal is in — a record planted elsewhere, which a
/// scan would take for damage, goes unseen — and finds nothing live. Recovery from another
/// watermark (metadata older than the seal) scans as before, and a reader that does not
/// know seals takes one for a torn slot.
#[test]
fn a_sealed_area_is_recovered_without_reading_its_slots() {
    let (tracer, mut log) = area(8);
    assert!(log.seal().unwrap(), "an area never written seals");
    for i in 0..3 {
        log.append(1, i * 4096, 4096, 0x100 + i, i + 1, 1).unwrap();
    }
    assert!(!log.seal().unwrap(), "records not retired: no seal");
    log.retire_through(3);
    assert!(log.seal().unwrap());
    let sealed = tracer.contents()[0].clone();
    let (mut again, records) = reopen(&tracer, 3).unwrap();
    assert!(records.is_empty());
    assert_eq!((again.next_sequence(), again.retired()), (4, 3));
    assert!(again.seal().unwrap(), "sealed already: nothing to write");

    // Record 5 of another area planted in slot 6 (it belongs in slot 4): a scan names it.
    let mut planted = sealed.clone();
    let mut other = area(8);
    for i in 0..5 {
        other.1.append(5, i, 1, i, i + 1, 1).unwrap();
    }
    let donor = other.0.contents()[0].clone();
    planted[64 * 7..64 * 8].copy_from_slice(&donor[64 * 5..64 * 6]);
    let (_, records) = LogArea::recover(Tracer::new().region_with(planted.clone()), 3).unwrap();
    assert!(records.is_empty(), "the sealed area's slots are not read");
    let scanned = LogArea::recover(Tracer::new().region_with(planted), 2).unwrap_err();
    assert!(scanned.to_string().contains("sits in slot"), "{scanned}");

    // Metadata older than the seal: the slots are read, the seal is skipped as torn.
    let (_, records) = LogArea::recover(Tracer::new().region_with(sealed.clone()), 1).unwrap();
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        [2, 3]
    );
}

/// The first append after a sealed recovery zeroes the seal, durably, before its records:
/// at every crash point the area recovers every acknowledged record, and never a seal
/// beside a record that followed it — which would hide what the next append leaves beside
/// that record.
#[test]
fn every_crash_image_after_a_seal_recovers_what_was_appended() {
    let (tracer, mut log) = area(8);
    log.append(1, 0, 4096, 0x100, 1, 1).unwrap();
    log.retire_through(1);
    log.seal().unwrap();
    let (mut again, _) = reopen(&tracer, 1).unwrap();
    let replay = Tracer::new();
    let region = replay.region_with(tracer.contents()[0].clone());
    drop(again);
    again = LogArea::recover(region, 1).unwrap().0;
    let before = replay.fence_count();
    again.append_group(7, &pieces(1, 2), 2, 2).unwrap();
    let after = replay.fence_count();
    again.append(7, 0, 4096, 0x300, 4, 3).unwrap();
    let last = replay.fence_count();
    let mut images = 0;
    for point in before..replay.crash_points() {
        for image in replay.crash_images(point, 64, point as u64) {
            images += 1;
            let region = Tracer::new().region_with(image.regions[0].clone());
            let (mut next, records) = LogArea::recover(region.clone(), 1)
                .unwrap_or_else(|e| panic!("{e} at {}", image.description));
            if records.is_empty() {
                // The group was cut short: a write of one record now, then a crash, recovers
                // that record alone (no leftover of the group beside it).
                next.append(7, 0, 4096, 0x400, 5, 4).unwrap();
                let (_, after_new) = LogArea::recover(region, 1)
                    .unwrap_or_else(|e| panic!("after a new append: {e} at {}", image.description));
                assert_eq!(
                    after_new
                        .iter()
                        .map(|r| (r.sequence, r.buffer))
                        .collect::<Vec<_>>(),
                    [(2, 0x400)],
                    "at {}",
                    image.description
                );
            }
            let sequences: Vec<u64> = records.iter().map(|r| r.sequence).collect();
            let must: &[u64] = if point >= last {
                &[2, 3, 4]
            } else if point >= after {
                &[2, 3]
            } else {
                &[]
            };
            assert!(
                sequences == must
                    || (point < after && sequences == [2, 3])
                    || (point >= after && point < last && sequences == [2, 3, 4]),
                "recovered {sequences:?} at {}",
                image.description
            );
        }
    }
    assert!(images > 5, "only {images} images");
}

fn summed(offset: u64, sum: u32) -> fs::LogPiece {
    fs::LogPiece {
        offset,
        length: 4096,
        buffer: 0x9000 + offset,
        data_sum: Some(sum),
    }
}

/// A record may carry its data's checksum (version 4): it reads back; the first such record
/// raises an area of version 3, and a raise a crash cut between the version and the CRC
/// reads as version 3; in an area of version 3 a record with the checksum flag set is not a
/// record (no version 3 writer made one).
#[test]
fn a_records_data_checksum_reads_back_and_raises_a_version_3_area() {
    let (tracer, mut log) = area(8);
    log.append(10, 0, 4096, 0x100, 50, 1_000).unwrap();
    drop(log);
    let mut v3 = tracer.contents()[0].clone();
    with_version(&mut v3, 3, 3);
    let replay = Tracer::new();
    let region = replay.region_with(v3.clone());
    let (mut old, records) = LogArea::recover(region.clone(), 0).unwrap();
    assert_eq!(records[0].data_sum, None);
    let record = old
        .append_group(10, &[summed(4096, 0xDEAD_BEEF)], 51, 2_000)
        .unwrap()[0];
    assert_eq!((record.length, record.data_sum), (4096, Some(0xDEAD_BEEF)));
    let raised = replay.contents()[0].clone();
    assert_eq!(u32::from_le_bytes(raised[8..12].try_into().unwrap()), 4);
    let (_, records) = LogArea::recover(region, 0).unwrap();
    assert_eq!(
        records
            .iter()
            .map(|r| (r.length, r.data_sum))
            .collect::<Vec<_>>(),
        [(4096, None), (4096, Some(0xDEAD_BEEF))]
    );
    for (version, crc_of) in [(4, 3), (3, 4)] {
        let mut torn = v3.clone();
        with_version(&mut torn, version, crc_of);
        let (_, records) = LogArea::recover(Tracer::new().region_with(torn), 0)
            .unwrap_or_else(|e| panic!("version {version} with the CRC of {crc_of}: {e}"));
        assert_eq!(records.len(), 1);
    }
    // The raised area's second record, in an area that says version 3: skipped as torn.
    let mut mixed = raised.clone();
    with_version(&mut mixed, 3, 3);
    let (_, records) = LogArea::recover(Tracer::new().region_with(mixed), 0).unwrap();
    assert_eq!(
        records.len(),
        1,
        "a version-3 area held a record with a checksum"
    );
}

/// Recovery is asked to check the data of an area's newest write only when that write
/// carries data checksums and the area's confirmation word does not name its last record;
/// a damaged word is said to be; a write dropped as torn gives its sequence to the next.
#[test]
fn the_newest_write_is_checked_unless_confirmed() {
    let (tracer, mut log) = area(16);
    log.append_group(7, &[summed(0, 1)], 1, 1).unwrap();
    log.append_group(7, &[summed(4096, 2), summed(8192, 3)], 2, 1)
        .unwrap();
    let confirmer = log.confirmer();
    let reopen = |tracer: &Tracer| {
        LogArea::recover(Tracer::new().region_with(tracer.contents()[0].clone()), 0).unwrap()
    };
    let (again, live) = reopen(&tracer);
    assert_eq!(live.len(), 3);
    assert_eq!(
        again.unconfirmed_newest(&live),
        Some((1, false)),
        "never confirmed"
    );
    confirmer.store(1).unwrap();
    let (again, live) = reopen(&tracer);
    assert_eq!(
        again.unconfirmed_newest(&live),
        Some((1, false)),
        "an older write confirmed"
    );
    confirmer.store(3).unwrap();
    let (again, live) = reopen(&tracer);
    assert_eq!(
        again.unconfirmed_newest(&live),
        None,
        "the newest write confirmed"
    );
    // A write without checksums (its data fenced first) is never checked.
    log.append(7, 12_288, 4096, 0x500, 4, 1).unwrap();
    let (again, live) = reopen(&tracer);
    assert_eq!(again.unconfirmed_newest(&live), None);
    // A flipped bit in the word: unreadable, and said so.
    log.append_group(7, &[summed(16_384, 5)], 5, 1).unwrap();
    let mut image = tracer.contents()[0].clone();
    image[33] ^= 0x04;
    let region = Tracer::new().region_with(image);
    let (mut damaged, mut live) = LogArea::recover(region.clone(), 0).unwrap();
    assert_eq!(damaged.unconfirmed_newest(&live), Some((4, true)));
    assert_eq!(
        LogArea::unconfirmed_newest_in(&region, &live).unwrap(),
        Some((4, true))
    );
    // Dropped as a crash's: the next append takes its sequence, and a recovery after it
    // finds the new record where the dropped one was.
    damaged.drop_newest_write(&mut live, 4);
    assert_eq!(live.len(), 4);
    let next = damaged.append(7, 20_480, 4096, 0x600, 6, 1).unwrap();
    assert_eq!(next.sequence, 5);
    let (_, live) = LogArea::recover(region, 0).unwrap();
    assert_eq!(
        live.iter()
            .map(|r| (r.sequence, r.buffer))
            .collect::<Vec<_>>(),
        [
            (1, 0x9000),
            (2, 0xA000),
            (3, 0xB000),
            (4, 0x500),
            (5, 0x600)
        ]
    );
}
