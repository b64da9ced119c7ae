//! Adding a device to a volume (`Volume::add_devices`, behind `locus extend`): a crash at any
//! point leaves the old volume whole (before the list names the new device) or a volume
//! that opens with every device and, once opened, counts every device in every superblock
//! (after) — never a refusal, never a wrong volume. Growing one (`locus extend --grow`): a
//! crash while its superblock records the new size leaves the device used at its old size
//! or at its new one.

use std::cell::Cell;

use pmem::Tracer;
use volume::superblock::Superblock;
use volume::{Volume, VolumeError};

const DEVICE_BYTES: u64 = 4 << 20;
const UUID: [u8; 16] = [0x5a; 16];

fn open(regions: Vec<pmem::Region>) -> volume::Result<Volume> {
    let nodes = vec![Some(0); regions.len()];
    Volume::open_devices(
        testkit::sources(regions, &nodes),
        testkit::one_node(),
        &testkit::quiet_options(),
    )
}

/// A two-device volume, durable in a fresh tracer, and a zeroed third device in it.
fn two_and_a_new_one() -> (Tracer, Vec<pmem::Region>) {
    let tracer = Tracer::new();
    let nodes = [Some(0), Some(0)];
    let devices = testkit::traced_devices(&tracer, &[DEVICE_BYTES, DEVICE_BYTES], &nodes);
    Volume::format_devices(&devices, UUID).unwrap();
    let old = tracer.contents();
    let tracer = Tracer::new();
    let mut regions: Vec<_> = old
        .into_iter()
        .map(|bytes| tracer.region_with(bytes))
        .collect();
    regions.push(tracer.region(DEVICE_BYTES));
    (tracer, regions)
}

#[test]
fn crash_while_adding_a_device() {
    let (tracer, regions) = two_and_a_new_one();
    let volume = open(regions[..2].to_vec()).unwrap();
    let listed = Cell::new(None);
    volume
        .add_devices(
            &testkit::sources(vec![regions[2].clone()], &[Some(0)]),
            || {
                listed.set(Some(tracer.fence_count()));
                Ok(())
            },
        )
        .unwrap();
    let listed = listed.get().expect("the list was written");
    let (mut old, mut finished) = (0, 0);
    for point in 0..tracer.crash_points() {
        for image in tracer.crash_images(point, 256, 0xe0 + point as u64) {
            let replay = Tracer::new();
            let regions: Vec<_> = image
                .regions
                .iter()
                .map(|bytes| replay.region_with(bytes.clone()))
                .collect();
            let at = &image.description;
            if point < listed {
                // The list still names two devices, which nothing has touched.
                let volume = open(regions[..2].to_vec())
                    .unwrap_or_else(|e| panic!("old volume refused at {at}: {e}"));
                assert_eq!((volume.uuid(), volume.device_count()), (UUID, 2), "{at}");
                assert_eq!(volume.stale_superblocks(), 0, "{at}");
                old += 1;
                continue;
            }
            let mut volume = open(regions.clone())
                .unwrap_or_else(|e| panic!("extended volume refused at {at}: {e}"));
            assert_eq!((volume.uuid(), volume.device_count()), (UUID, 3), "{at}");
            volume.finish_extension().unwrap();
            drop(volume);
            let contents = replay.contents();
            for (i, bytes) in contents.iter().enumerate() {
                let region = Tracer::new().region_with(bytes.clone());
                let (superblock, from_copy) =
                    Superblock::read_with_copy(&region, &format!("device {i}")).unwrap();
                assert_eq!(
                    (superblock.device_index, superblock.device_count, from_copy),
                    (i as u32, 3, false),
                    "device {i} after finishing, at {at}"
                );
            }
            let again = open(
                contents
                    .into_iter()
                    .map(|b| Tracer::new().region_with(b))
                    .collect(),
            )
            .unwrap();
            assert_eq!(again.stale_superblocks(), 0, "{at}");
            finished += 1;
        }
    }
    assert!(old > 0 && finished > 0, "{old} old, {finished} finished");
}

#[test]
fn a_rewrite_torn_anywhere_reads_one_whole_superblock() {
    let tracer = Tracer::new();
    let region = tracer.region(DEVICE_BYTES);
    let old = Superblock::new(UUID, 0, 1, Some(0), DEVICE_BYTES, 1);
    old.write(&region).unwrap();
    let tracer2 = Tracer::new();
    let region = tracer2.region_with(tracer.contents().remove(0));
    let new = Superblock {
        device_count: 2,
        ..old.clone()
    };
    new.rewrite(&region).unwrap();
    let mut seen = [false; 2];
    for point in 0..tracer2.crash_points() {
        for image in tracer2.crash_images(point, 256, point as u64) {
            let region = Tracer::new().region_with(image.regions[0].clone());
            let (read, _) = Superblock::read_with_copy(&region, "device")
                .unwrap_or_else(|e| panic!("{e} at {}", image.description));
            assert!(read == old || read == new, "{}", image.description);
            seen[usize::from(read == new)] = true;
        }
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn three_different_counts_are_refused_not_guessed() {
    let tracer = Tracer::new();
    let regions: Vec<_> = (0..3).map(|_| tracer.region(DEVICE_BYTES)).collect();
    for (i, count) in [2u32, 3, 4].into_iter().enumerate() {
        Superblock::new(UUID, i as u32, count, Some(0), DEVICE_BYTES, 1)
            .write(&regions[i])
            .unwrap();
    }
    match open(regions) {
        Err(VolumeError::Mismatch { problem }) => {
            assert!(problem.contains("says the volume has"), "{problem}");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// A device lengthened (`locus extend --grow`'s first step) and its superblock rewritten with
/// the new size: every crash image opens, using the device at its old size (the growth then
/// unrecorded, the rest of the device outside the volume) or at its new size.
#[test]
fn crash_while_recording_a_grown_device() {
    let tracer = Tracer::new();
    let region = tracer.region(DEVICE_BYTES);
    Volume::format_devices(&testkit::sources(vec![region], &[Some(0)]), UUID).unwrap();
    let mut bytes = tracer.contents().remove(0);
    bytes.resize(2 * DEVICE_BYTES as usize, 0xa5);
    let tracer = Tracer::new();
    let region = tracer.region_with(bytes);
    let old = open(vec![region.clone()]).expect("a lengthened device opens");
    assert_eq!(
        old.unrecorded_growth(),
        vec![(0, DEVICE_BYTES, 2 * DEVICE_BYTES)]
    );
    assert_eq!(old.device_region(0).unwrap().len(), DEVICE_BYTES);
    let old_free = old.free_bytes();
    drop(old);
    let (superblock, _) = Superblock::read_with_copy(&region, "device").unwrap();
    superblock.grown(2 * DEVICE_BYTES).rewrite(&region).unwrap();
    let mut seen = [false; 2];
    for point in 0..tracer.crash_points() {
        for image in tracer.crash_images(point, 256, 0x90 + point as u64) {
            let at = &image.description;
            let volume = open(vec![Tracer::new().region_with(image.regions[0].clone())])
                .unwrap_or_else(|e| panic!("refused at {at}: {e}"));
            let recorded = volume.unrecorded_growth().is_empty();
            let len = volume.device_region(0).unwrap().len();
            if recorded {
                assert_eq!(len, 2 * DEVICE_BYTES, "{at}");
                assert_eq!(volume.free_bytes(), old_free + DEVICE_BYTES, "{at}");
            } else {
                assert_eq!(len, DEVICE_BYTES, "{at}");
                assert_eq!(volume.free_bytes(), old_free, "{at}");
            }
            seen[usize::from(recorded)] = true;
        }
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn a_device_shorter_than_its_superblock_says_is_refused() {
    let tracer = Tracer::new();
    let region = tracer.region(DEVICE_BYTES);
    Volume::format_devices(&testkit::sources(vec![region], &[Some(0)]), UUID).unwrap();
    let mut bytes = tracer.contents().remove(0);
    bytes.truncate(DEVICE_BYTES as usize / 2);
    match open(vec![Tracer::new().region_with(bytes)]) {
        Err(VolumeError::BadSuperblock { field, problem, .. }) => {
            assert_eq!(field, "capacity_bytes");
            assert!(problem.contains("shrunk or wrong device"), "{problem}");
        }
        other => panic!(
            "expected a refusal, got {:?}",
            other.map(|v| v.device_count())
        ),
    }
}
