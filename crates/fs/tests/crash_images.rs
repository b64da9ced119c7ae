//! Crash images for every kind of operation: record the operation on a traced volume, crash
//! at every fence it executed (with the possible sets of pending cache lines that reached
//! the media), recover, and require the whole file system — names, contents, and every
//! path's mode and modification time — to be exactly as before or as after the operation. At the last point (the operation returned) it must be as after.

use std::collections::BTreeMap;
use std::sync::Arc;

use fs::{CheckpointMode, Fs, FsOptions, Kind};
use pmem::Tracer;
use testkit::*;

/// What a path holds: its attributes, and its contents (`None` for a directory).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    mode: u32,
    mtime_ns: u64,
    contents: Option<Vec<u8>>,
}

/// Path -> entry, the root directory included.
type State = BTreeMap<String, Entry>;

fn state(fs: &Fs) -> State {
    let mut out = State::new();
    let entry = |path: &str, contents| {
        let stat = fs.lstat(path).unwrap();
        Entry {
            mode: stat.mode,
            mtime_ns: stat.mtime_ns,
            contents,
        }
    };
    out.insert("/".to_owned(), entry("/", None));
    let mut dirs = vec!["/".to_owned()];
    while let Some(dir) = dirs.pop() {
        for child in fs.readdir(&dir).unwrap() {
            let path = format!("{}/{}", dir.trim_end_matches('/'), child.name);
            match child.kind {
                Kind::Dir => {
                    out.insert(path.clone(), entry(&path, None));
                    dirs.push(path);
                }
                Kind::File => {
                    let file = fs.open_read(&path).unwrap();
                    let mut data = vec![0u8; file.len() as usize];
                    assert_eq!(file.read_at(&mut data, 0).unwrap(), data.len());
                    out.insert(path.clone(), entry(&path, Some(data)));
                }
                Kind::Symlink => {
                    let target = fs.readlink(&path).unwrap().into_bytes();
                    out.insert(path.clone(), entry(&path, Some(target)));
                }
                Kind::Fifo | Kind::Socket | Kind::CharDevice | Kind::BlockDevice => {
                    out.insert(path.clone(), entry(&path, None));
                }
            }
        }
    }
    out
}

thread_local! {
    /// Whether this thread's tests format with data checksums.
    static CHECKSUMS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn format() -> fs::FormatOptions {
    fs::FormatOptions {
        data_checksums: CHECKSUMS.with(std::cell::Cell::get),
        ..small_format()
    }
}

/// Opens a crash image. With data checksums, a scrub of the image first finds no damaged
/// block: a crash never leaves a block whose checksum disagrees with it (and `state`'s reads
/// check every block again).
fn recover(image: Vec<u8>) -> Result<Fs, fs::FsError> {
    if CHECKSUMS.with(std::cell::Cell::get) {
        let replay = Tracer::new();
        let report = Fs::scrub(&volume_over(vec![replay.region_with(image.clone())]).unwrap())?;
        assert!(
            report.damaged.is_empty(),
            "a crash image has damaged blocks: {:?}",
            report.damaged
        );
    }
    let replay = Tracer::new();
    Fs::open(
        volume_over(vec![replay.region_with(image)]).unwrap(),
        options(),
    )
}

fn options() -> FsOptions {
    FsOptions {
        checkpoint: CheckpointMode::OnDemand,
        ..small_options()
    }
}

const DEVICE: u64 = 8 << 20;
const IMAGES_PER_POINT: usize = 6;

/// Sets up with `setup`, then records `op` and checks every crash image of it.
fn check_op(name: &str, setup: impl Fn(&Fs), op: impl Fn(&Fs)) {
    let tracer = Tracer::new();
    let region = traced_dirty_volume_device(&tracer, DEVICE);
    let fs = Fs::format(
        volume_over(vec![region.clone()]).unwrap(),
        &format(),
        options(),
    )
    .unwrap();
    setup(&fs);
    let before = state(&fs);
    let first = tracer.fence_count();
    op(&fs);
    let last = tracer.fence_count();
    let after = state(&fs);
    assert_ne!(before, after, "{name}: the operation changed nothing");
    assert!(last > first, "{name}: no fence");
    let images = check_crash_images(
        name,
        &tracer,
        (first, last),
        IMAGES_PER_POINT,
        &before,
        &after,
        |point, image| {
            let recovered = recover(image.regions[0].clone()).unwrap_or_else(|e| {
                panic!(
                    "{name}: point {point} ({}): recovery failed: {e}",
                    image.description
                )
            });
            let got = state(&recovered);
            recovered.abandon();
            got
        },
        |got| {
            let diff: Vec<_> = got
                .keys()
                .chain(after.keys())
                .filter(|k| got.get(*k) != after.get(*k) && got.get(*k) != before.get(*k))
                .collect();
            format!("differs at {diff:?}")
        },
    );
    eprintln!(
        "{name}: {} fences, {images} images, all before or after",
        last - first
    );
    fs.abandon();
}

fn write(fs: &Fs, path: &str, offset: u64, len: usize, tag: u64) {
    fs.create(path)
        .unwrap()
        .write_at(&pattern(tag, offset, len), offset)
        .unwrap();
}

#[test]
fn write_into_a_new_file() {
    check_op(
        "write",
        |fs| drop(fs.create("/f").unwrap()),
        |fs| write(fs, "/f", 0, 10_000, 1),
    );
}

#[test]
fn overwrite_logged_and_checkpointed_data() {
    check_op(
        "overwrite",
        |fs| {
            write(fs, "/f", 0, 64 << 10, 1);
            fs.checkpoint().unwrap();
            write(fs, "/f", 4096, 8192, 2);
        },
        |fs| write(fs, "/f", 1000, 12_000, 3),
    );
}

/// A write whose piece is too large to checksum beside its copy (over 12 KiB): its data is
/// fenced before its record, which carries no checksum — an image that kept the record and
/// lost a line of the data must not exist.
#[test]
fn a_write_too_large_to_checksum() {
    check_op(
        "large write",
        |fs| {
            write(fs, "/f", 0, 64 << 10, 1);
            fs.checkpoint().unwrap();
        },
        |fs| write(fs, "/f", 4096, 40_000, 2),
    );
}

#[test]
fn append() {
    check_op(
        "append",
        |fs| write(fs, "/f", 0, 5000, 1),
        |fs| write(fs, "/f", 5000, 3000, 2),
    );
}

#[test]
fn zero_copy_buffer_commit() {
    check_op(
        "write_buffer",
        |fs| write(fs, "/f", 0, 5000, 1),
        |fs| {
            let mut b = fs.buffer(8192).unwrap();
            b.write(0, &pattern(4, 4096, 8192)).unwrap();
            fs.create("/f").unwrap().write_buffer(b, 4096).unwrap();
        },
    );
}

#[test]
fn create_and_mkdir() {
    check_op(
        "create",
        |fs| fs.mkdir("/d", 0o755).unwrap(),
        |fs| drop(fs.create("/d/new").unwrap()),
    );
    check_op("mkdir", |_| {}, |fs| fs.mkdir("/d", 0o755).unwrap());
}

#[test]
fn unlink_and_rmdir() {
    check_op(
        "unlink",
        |fs| {
            write(fs, "/f", 0, 20_000, 1);
            fs.checkpoint().unwrap();
            write(fs, "/f", 0, 100, 2);
        },
        |fs| fs.unlink("/f").unwrap(),
    );
    check_op(
        "rmdir",
        |fs| fs.mkdir("/d", 0o755).unwrap(),
        |fs| fs.rmdir("/d").unwrap(),
    );
}

#[test]
fn rename_replacing_a_target() {
    check_op(
        "rename",
        |fs| {
            fs.mkdir("/d", 0o755).unwrap();
            write(fs, "/a", 0, 9000, 1);
            write(fs, "/d/b", 0, 7000, 2);
            fs.checkpoint().unwrap();
        },
        |fs| fs.rename("/a", "/d/b").unwrap(),
    );
}

#[test]
fn truncate_shrink_and_grow() {
    check_op(
        "truncate shrink",
        |fs| {
            write(fs, "/f", 0, 40_000, 1);
            fs.checkpoint().unwrap();
            write(fs, "/f", 30_000, 5000, 2);
        },
        |fs| fs.truncate("/f", 10_001).unwrap(),
    );
    check_op(
        "truncate grow",
        |fs| write(fs, "/f", 0, 5000, 1),
        |fs| fs.truncate("/f", 50_000).unwrap(),
    );
}

#[test]
fn punch_a_block_aligned_hole() {
    // Aligned: one journal record, so the hole is all there or not at all (unaligned edges
    // are ordinary writes before it).
    check_op(
        "punch hole",
        |fs| {
            write(fs, "/f", 0, 40_000, 1);
            fs.checkpoint().unwrap();
            write(fs, "/f", 8192, 12_000, 2);
        },
        |fs| {
            fs.open_file("/f", fs::OpenOptions::read_write())
                .unwrap()
                .punch_hole(4096, 16_384)
                .unwrap();
        },
    );
}

#[test]
fn allocate_blocks_and_grow() {
    // Zeroed blocks into the holes around checkpointed and logged data, and the size grown
    // in the same record: all of it or nothing, the logged data kept either way.
    check_op(
        "allocate",
        |fs| {
            write(fs, "/f", 0, 6000, 1);
            fs.checkpoint().unwrap();
            write(fs, "/f", 12_000, 5000, 2);
        },
        |fs| {
            fs.open_file("/f", fs::OpenOptions::read_write())
                .unwrap()
                .allocate(2000, 40_000, false)
                .unwrap();
        },
    );
}

#[test]
fn checkpoint_moves_everything_and_changes_nothing_visible() {
    // The checkpoint does not change the visible state, so here every image must equal it,
    // and the logs must have been used: check both by hand.
    let tracer = Tracer::new();
    let region = traced_dirty_volume_device(&tracer, DEVICE);
    let fs = Fs::format(volume_over(vec![region]).unwrap(), &format(), options()).unwrap();
    write(&fs, "/f", 0, 64 << 10, 1);
    write(&fs, "/f", 100, 5000, 2);
    write(&fs, "/g", 8192, 3000, 3);
    fs.truncate("/g", 9000).unwrap();
    write(&fs, "/g", 0, 4096, 4);
    let expect = state(&fs);
    assert!(fs.stats().records_pending >= 4);
    let first = tracer.fence_count();
    fs.checkpoint().unwrap();
    let last = tracer.fence_count();
    assert!(last > first);
    assert_eq!(fs.stats().records_pending, 0);
    let mut images = 0;
    for point in first..=last {
        for image in tracer.crash_images(point, IMAGES_PER_POINT, point as u64) {
            images += 1;
            let recovered = recover(image.regions[0].clone())
                .unwrap_or_else(|e| panic!("checkpoint: point {point}: {e}"));
            assert!(
                state(&recovered) == expect,
                "checkpoint: point {point} ({}) lost data",
                image.description
            );
            recovered.abandon();
        }
    }
    eprintln!("checkpoint: {} fences, {images} images", last - first);
    fs.abandon();
}

/// Every crash image between fences `first` and `last` of `tracer` recovers to `expect`.
fn every_image_is(name: &str, tracer: &Tracer, first: usize, last: usize, expect: &State) {
    assert!(last > first, "{name}: no fence");
    let mut images = 0;
    for point in first..=last {
        for image in tracer.crash_images(point, IMAGES_PER_POINT, point as u64) {
            images += 1;
            let recovered = recover(image.regions[0].clone())
                .unwrap_or_else(|e| panic!("{name}: point {point} ({}): {e}", image.description));
            assert!(
                state(&recovered) == *expect,
                "{name}: point {point} ({}) changed the file system",
                image.description
            );
            recovered.abandon();
        }
    }
    eprintln!("{name}: {} fences, {images} images", last - first);
}

/// A write stores its data and its record behind one fence, the record carrying the data's
/// checksum. A crash before that fence can keep the record and lose some of the data (the
/// tracer's "everything but the line first stored to"): open drops that write — it never
/// returned — and says so in its replay summary; the file is as before the write.
#[test]
fn a_write_whose_data_a_crash_cut_short_is_dropped_and_counted() {
    let tracer = Tracer::new();
    let region = traced_dirty_volume_device(&tracer, DEVICE);
    let fs = Fs::format(volume_over(vec![region]).unwrap(), &format(), options()).unwrap();
    write(&fs, "/f", 0, 4096, 1);
    fs.checkpoint().unwrap();
    let before = state(&fs);
    let file = fs.open_file("/f", fs::OpenOptions::read_write()).unwrap();
    let first = tracer.fence_count();
    file.write_at(&pattern(2, 0, 8192), 0).unwrap();
    let last = tracer.fence_count();
    let after = state(&fs);
    assert_eq!(
        last - first,
        1,
        "a write's data and its record take one fence"
    );
    let (mut torn, mut whole) = (0, 0);
    for image in tracer.crash_images(first, 16, 1) {
        let recovered = recover(image.regions[0].clone()).unwrap();
        let got = state(&recovered);
        let dropped = recovered.replayed().torn_writes;
        if got == after {
            assert_eq!(dropped, 0, "{}", image.description);
            whole += 1;
        } else {
            assert!(
                got == before,
                "neither before nor after: {}",
                image.description
            );
            torn += dropped;
        }
        recovered.abandon();
    }
    assert!(whole > 0, "no image kept the write");
    assert!(torn > 0, "no image kept the record without all of its data");
    drop(file);
    fs.abandon();
}

/// A write's data and its record are made durable by one fence, the record carrying the
/// data's checksum: recovery drops the newest write of a log whose data fails it (a crash
/// cut it short). A writer remaps a single-block overwrite into the file's block table
/// itself, and the next batch copies another thread's later write into that very page: at a
/// crash before the batch commits, the first write is still its log's newest, its page
/// changed in place. The checkpoint confirms every write of a batch in its log before it
/// stores in place, so recovery takes that page as whole — not as torn, which would drop an
/// acknowledged write.
#[test]
fn a_checkpoint_copying_into_the_page_of_another_logs_newest_write() {
    let tracer = Tracer::new();
    let region = traced_dirty_volume_device(&tracer, DEVICE);
    let fs = Fs::format(volume_over(vec![region]).unwrap(), &format(), options()).unwrap();
    write(&fs, "/f", 0, 64 << 10, 1);
    fs.checkpoint().unwrap();
    // Each writer on a thread of its own, alive while the other writes: two slots, two logs.
    let step = std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Overwrites the checkpoint remaps, sharing the file's chunk with the writers
            // and allowing this slot remaps of its own; then one this writer remaps.
            for block in 1..5 {
                write(&fs, "/f", block * 4096, 4096, 10 + block);
            }
            step.wait();
            step.wait();
            write(&fs, "/f", 2 * 4096, 4096, 20);
            step.wait();
            step.wait();
        });
        s.spawn(|| {
            step.wait();
            step.wait();
            step.wait();
            write(&fs, "/f", 2 * 4096 + 10, 100, 21);
            step.wait();
        });
        step.wait();
        fs.checkpoint().unwrap();
        step.wait();
        step.wait();
        step.wait();
    });
    assert!(fs.stats().slots >= 3, "the two writers shared a slot");
    let expect = state(&fs);
    let first = tracer.fence_count();
    fs.checkpoint().unwrap();
    let last = tracer.fence_count();
    let stats = fs.stats();
    assert_eq!(
        stats.writer_remapped_blocks, 1,
        "the writer did not remap its block"
    );
    assert_eq!(
        stats.copied_bytes, 100,
        "the later write was not copied into its page"
    );
    every_image_is(
        "copy into a newest write's page",
        &tracer,
        first,
        last,
        &expect,
    );
    fs.abandon();
}

/// A file system with logged writes and journaled operations not yet checkpointed.
fn busy(tracer: &Tracer) -> Fs {
    let region = traced_dirty_volume_device(tracer, DEVICE);
    let fs = Fs::format(volume_over(vec![region]).unwrap(), &format(), options()).unwrap();
    fs.mkdir("/d", 0o750).unwrap();
    write(&fs, "/d/f", 0, 64 << 10, 1);
    write(&fs, "/d/f", 100, 5000, 2);
    write(&fs, "/g", 8192, 3000, 3);
    fs.rename("/g", "/d/g").unwrap();
    fs.chmod("/d/f", 0o600).unwrap();
    fs
}

/// Unmount: the last checkpoint, the final snapshot (written, the root switched to it, every
/// journal reset to its epoch, the old snapshot freed). A crash anywhere in it changes
/// nothing visible.
#[test]
fn unmount_snapshot_and_root_switch() {
    let tracer = Tracer::new();
    let fs = busy(&tracer);
    let expect = state(&fs);
    let generation = |tracer: &Tracer| {
        let replay = Tracer::new();
        Fs::check(&volume_over(vec![replay.region_with(tracer.contents()[0].clone())]).unwrap())
            .unwrap()
            .generation
    };
    let before = generation(&tracer);
    let first = tracer.fence_count();
    fs.unmount().unwrap();
    let last = tracer.fence_count();
    assert!(generation(&tracer) > before, "unmount switched no root");
    every_image_is("unmount", &tracer, first, last, &expect);
}

/// After a clean unmount every journal is sealed (recovery reads it no further than its
/// epoch marker); the first operation after the next mount unseals the journal it appends
/// to before its record. A crash anywhere in it leaves the file system as before or as
/// after it.
#[test]
fn the_first_operations_after_a_clean_unmount() {
    let tracer = Tracer::new();
    busy(&tracer).unmount().unwrap();
    let again = Tracer::new();
    let region = again.region_with(tracer.contents()[0].clone());
    let fs = Fs::open(volume_over(vec![region]).unwrap(), options()).unwrap();
    let before = state(&fs);
    let first = again.fence_count();
    fs.mkdir("/d/e", 0o700).unwrap();
    let last = again.fence_count();
    let after = state(&fs);
    let images = check_crash_images(
        "after a clean unmount",
        &again,
        (first, last),
        IMAGES_PER_POINT,
        &before,
        &after,
        |point, image| {
            let recovered = recover(image.regions[0].clone())
                .unwrap_or_else(|e| panic!("point {point} ({}): {e}", image.description));
            let got = state(&recovered);
            recovered.abandon();
            got
        },
        |got| format!("{:?}", got.keys().collect::<Vec<_>>()),
    );
    eprintln!(
        "after a clean unmount: {} fences, {images} images",
        last - first
    );
    fs.abandon();
}

/// A crash during recovery (and the unmount after it): recovery replays the logs and
/// journals, the checkpoint moves the live records, a snapshot is written. Crashing anywhere
/// in that and recovering again gives the same file system.
#[test]
fn a_crash_during_recovery() {
    let tracer = Tracer::new();
    let fs = busy(&tracer);
    let expect = state(&fs);
    fs.abandon();
    let crashed = tracer.contents()[0].clone();
    let again = Tracer::new();
    let region = again.region_with(crashed);
    let first = again.fence_count();
    let recovered = Fs::open(volume_over(vec![region]).unwrap(), options()).unwrap();
    assert!(state(&recovered) == expect);
    recovered.checkpoint().unwrap();
    recovered.unmount().unwrap();
    let last = again.fence_count();
    every_image_is("recovery", &again, first, last, &expect);
}

/// The data operations again on a file system with data checksums: every crash image
/// recovers to before or after, its scrub finds nothing damaged, and every read of every
/// file verifies (a block whose checksum a crash left behind its data would fail them).
#[test]
fn with_data_checksums_no_crash_leaves_a_block_failing_its_checksum() {
    CHECKSUMS.with(|c| c.set(true));
    write_into_a_new_file();
    overwrite_logged_and_checkpointed_data();
    append();
    zero_copy_buffer_commit();
    truncate_shrink_and_grow();
    punch_a_block_aligned_hole();
    allocate_blocks_and_grow();
    checkpoint_moves_everything_and_changes_nothing_visible();
    unmount_snapshot_and_root_switch();
    defragmenting_a_window_with_a_hole();
}

/// Idle-time defragmentation's rewrite of a window scattered by 4 KiB overwrites, with a hole
/// in it (so its group has one record per data range, with a gap between them): a crash
/// anywhere in it, or in the checkpoint that moves it, changes nothing visible.
#[test]
fn defragmenting_a_window_with_a_hole() {
    let tracer = Tracer::new();
    // Room for the rewrite's free 2 MiB extent beside the file and the logs.
    let region = traced_dirty_volume_device(&tracer, 2 * DEVICE);
    let fs = Fs::format(volume_over(vec![region]).unwrap(), &format(), options()).unwrap();
    let window = 2u64 << 20;
    let f = fs.create("/f").unwrap();
    f.write_at(&pattern(1, 0, window as usize), 0).unwrap();
    let mut state_word = 0x9E37_79B9_u64;
    for i in 0..600u64 {
        state_word ^= state_word << 13;
        state_word ^= state_word >> 7;
        state_word ^= state_word << 17;
        let block = state_word % (window / 4096);
        f.write_at(&pattern(100 + i, block * 4096, 4096), block * 4096)
            .unwrap();
    }
    f.punch_hole(64 << 10, 32 << 10).unwrap();
    drop(f);
    fs.checkpoint().unwrap();
    let expect = state(&fs);
    let first = tracer.fence_count();
    assert_eq!(
        fs.defragment_now("/f").unwrap(),
        1,
        "the window was not rewritten"
    );
    fs.checkpoint().unwrap();
    let last = tracer.fence_count();
    assert!(state(&fs) == expect, "the rewrite changed the file");
    every_image_is(
        "defragmenting a window with a hole",
        &tracer,
        first,
        last,
        &expect,
    );
    fs.abandon();
}

/// Turning data checksums on (`Fs::set_data_checksums`, `locus tune --data-checksums on`) on
/// a closed file system with logged writes a crash left, then off: a crash anywhere in either
/// leaves the files exactly as they were, and a crash image that has checksums scrubs clean
/// (every block of data got its entry before the root named the tables); after each, the
/// file system has the setting asked for.
#[test]
fn turning_data_checksums_on_and_off() {
    let tracer = Tracer::new();
    let fs = busy(&tracer);
    let expect = state(&fs);
    fs.abandon();
    let mut image = tracer.contents()[0].clone();
    for on in [true, false] {
        let name = if on { "checksums on" } else { "checksums off" };
        let again = Tracer::new();
        let volume = volume_over(vec![again.region_with(image)]).unwrap();
        let first = again.fence_count();
        let change = Fs::set_data_checksums(&volume, on).unwrap();
        let last = again.fence_count();
        assert_eq!((change.before, change.after), (!on, on));
        drop(volume);
        assert!(last > first, "{name}: no fence");
        let mut images = 0;
        for point in first..=last {
            for crash in again.crash_images(point, IMAGES_PER_POINT, point as u64) {
                images += 1;
                let bytes = crash.regions[0].clone();
                let view = volume_over(vec![Tracer::new().region_with(bytes.clone())]).unwrap();
                let has = Fs::has_data_checksums(&view).unwrap();
                if point == last {
                    assert_eq!(has, on, "{name}: the change returned but is not there");
                }
                if has {
                    let report = Fs::scrub(&view).unwrap_or_else(|e| {
                        panic!("{name}: point {point} ({}): {e}", crash.description)
                    });
                    assert!(
                        report.damaged.is_empty() && report.blocks > 0,
                        "{name}: point {point} ({}): {} blocks, damaged {:?}",
                        crash.description,
                        report.blocks,
                        report.damaged
                    );
                }
                drop(view);
                let recovered = recover(bytes).unwrap_or_else(|e| {
                    panic!("{name}: point {point} ({}): {e}", crash.description)
                });
                assert!(
                    state(&recovered) == expect,
                    "{name}: point {point} ({}) changed the file system",
                    crash.description
                );
                recovered.abandon();
            }
        }
        eprintln!("{name}: {} fences, {images} images", last - first);
        image = again.contents()[0].clone();
    }
}

/// A device added to a volume with data checksums (`locus extend`) gets its table: a crash
/// anywhere in `Fs::add_device_tables` leaves a file system that either refuses to open
/// until the tables are made (naming the command that makes them) or opens with every file
/// as it was and scrubs clean; once it returned, it opens.
#[test]
fn checksum_tables_for_an_added_device() {
    let tracer = Tracer::new();
    let fs = busy(&tracer);
    let expect = state(&fs);
    fs.abandon();
    let image = tracer.contents()[0].clone();
    let setup = Tracer::new();
    Fs::set_data_checksums(&volume_over(vec![setup.region_with(image)]).unwrap(), true).unwrap();
    let image = setup.contents()[0].clone();

    let again = Tracer::new();
    let regions = vec![
        again.region_with(image),
        traced_dirty_volume_device(&again, DEVICE),
    ];
    let old = volume::Volume::open_devices(
        node0_sources(regions[..1].to_vec()),
        one_node(),
        &quiet_options(),
    )
    .unwrap();
    old.add_devices(&node0_sources(regions[1..].to_vec()), || Ok(()))
        .unwrap();
    let volume = volume_over(regions).unwrap();
    assert_eq!(volume.device_count(), 2);
    tables_made_crash_safely(&again, volume, &expect, "are not made yet");
}

/// A device of a volume with data checksums that `locus extend --grow` lengthened gets a
/// larger table: a crash anywhere in `Fs::add_device_tables` leaves a file system that
/// refuses to open until the table is grown (naming the command) or opens with every file as
/// it was and scrubs clean; once it returned, it opens, and the grown part is the volume's.
#[test]
fn checksum_table_of_a_grown_device() {
    let tracer = Tracer::new();
    let fs = busy(&tracer);
    let expect = state(&fs);
    fs.abandon();
    let setup = Tracer::new();
    let device = setup.region_with(tracer.contents()[0].clone());
    Fs::set_data_checksums(&volume_over(vec![device]).unwrap(), true).unwrap();
    // The device lengthened by DEVICE bytes of old contents (what a grown file held before
    // is not the volume's concern), its superblock then recording the new size.
    let mut bytes = setup.contents()[0].clone();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    bytes.extend((0..DEVICE).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 56) as u8 | 1
    }));
    let again = Tracer::new();
    let region = again.region_with(bytes);
    let (superblock, _) = volume::superblock::Superblock::read_with_copy(&region, "d0").unwrap();
    assert_eq!(superblock.capacity_bytes, DEVICE);
    let unrecorded = volume_over(vec![region.clone()]).unwrap();
    assert_eq!(
        unrecorded.unrecorded_growth(),
        vec![(0, DEVICE, 2 * DEVICE)]
    );
    assert_eq!(unrecorded.device_region(0).unwrap().len(), DEVICE);
    let fs = Fs::open(unrecorded, options()).expect("a device grown but not recorded opens");
    assert!(state(&fs) == expect);
    fs.abandon();
    superblock.grown(2 * DEVICE).rewrite(&region).unwrap();

    let volume = volume_over(vec![region]).unwrap();
    assert!(volume.unrecorded_growth().is_empty());
    assert_eq!(volume.device_region(0).unwrap().len(), 2 * DEVICE);
    tables_made_crash_safely(&again, volume, &expect, "its table is not grown yet");
}

/// `volume` (over `tracer`'s regions) refuses its file system, saying `refusal`, until
/// `Fs::add_device_tables` makes one table; every crash image of that refuses the same way
/// (before its last fence) or opens with the files of `expect` and scrubs clean, and both
/// happen.
fn tables_made_crash_safely(
    tracer: &Tracer,
    volume: Arc<volume::Volume>,
    expect: &State,
    refusal: &str,
) {
    let refused = Fs::open(Arc::clone(&volume), options()).unwrap_err();
    assert!(refused.to_string().contains(refusal), "{refused}");
    let first = tracer.fence_count();
    assert_eq!(Fs::add_device_tables(&volume).unwrap().0, 1);
    let last = tracer.fence_count();
    drop(volume);
    assert!(last > first, "no fence");
    let (mut refusals, mut opened) = (0, 0);
    for point in first..=last {
        for crash in tracer.crash_images(point, IMAGES_PER_POINT, point as u64) {
            let at = format!("point {point} ({})", crash.description);
            let view = || {
                let replay = Tracer::new();
                volume_over(
                    crash
                        .regions
                        .iter()
                        .map(|bytes| replay.region_with(bytes.clone()))
                        .collect(),
                )
                .unwrap()
            };
            let recovered = match Fs::open(view(), options()) {
                Err(e) if point < last && e.to_string().contains(refusal) => {
                    refusals += 1;
                    continue;
                }
                Err(e) => panic!("{at}: {e}"),
                Ok(fs) => fs,
            };
            assert!(state(&recovered) == *expect, "{at}: the files changed");
            recovered.abandon();
            let report = Fs::scrub(&view()).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert!(
                report.damaged.is_empty() && report.blocks > 0,
                "{at}: {:?}",
                report.damaged
            );
            opened += 1;
        }
    }
    assert!(
        refusals > 0 && opened > 0,
        "{refusals} refused, {opened} opened"
    );
}
