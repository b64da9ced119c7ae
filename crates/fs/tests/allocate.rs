//! `File::allocate` (`fallocate` without `PUNCH_HOLE`): the holes of the range get zeroed
//! blocks that the volume's free space pays for at once, writes land on them, the size
//! grows unless kept, and all of it replays after a crash and loads after an unmount. An
//! allocation the volume has no room for is refused and changes nothing; one it had room
//! for keeps its promise: writes into the range succeed on an otherwise full volume.

use std::sync::Arc;
use testkit::*;

use fs::{Fs, FsError, OpenOptions};

const B: u64 = 4096;

fn contents(f: &fs::File) -> Vec<u8> {
    let mut back = vec![0u8; f.len() as usize];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), back.len());
    back
}

/// Holes get zeroed blocks (the file's allocated bytes and the volume's free bytes show
/// them at once); blocks with data — checkpointed, or logged and still waiting for the
/// checkpoint, whole or partial — keep it; the size grows to the range's end, or stays with
/// `keep_size` (the blocks past the end allocated all the same). With and without data
/// checksums, live, after a crash and after an unmount.
#[test]
fn allocated_holes_get_zeroed_blocks_and_data_stays() {
    for checksums in [false, true] {
        let shm = shm_volume(&format!("allocate-{checksums}"), 64 << 20);
        let volume = open_volume(&shm.dir);
        let lazy = fs::FsOptions {
            checkpoint: fs::CheckpointMode::OnDemand,
            ..small_options()
        };
        let format = fs::FormatOptions {
            data_checksums: checksums,
            ..small_format()
        };
        let fs = Fs::format(Arc::clone(&volume), &format, lazy).unwrap();
        let f = fs.create("/f").unwrap();
        let mut model = vec![0u8; 16 * B as usize];
        // Block 2 in the file's blocks; blocks 5 (partly) and 6 only logged.
        f.write_at(&[0x22; B as usize], 2 * B).unwrap();
        fs.checkpoint().unwrap();
        f.write_at(&[0x55; 100], 5 * B + 10).unwrap();
        f.write_at(&[0x66; B as usize], 6 * B).unwrap();
        model[2 * B as usize..3 * B as usize].fill(0x22);
        model[(5 * B + 10) as usize..(5 * B + 110) as usize].fill(0x55);
        model[6 * B as usize..7 * B as usize].fill(0x66);
        let before = f.stat();
        assert_eq!(
            before.allocated,
            3 * B,
            "block 2 in the file's blocks, blocks 5 and 6 logged"
        );
        let free_before = volume.free_bytes();
        std::thread::sleep(std::time::Duration::from_millis(2));

        // 100 bytes into block 0 to 10 bytes into block 15: all 16 blocks.
        f.allocate(100, 15 * B - 90, false).unwrap();
        assert_eq!(f.len(), 15 * B + 10, "the size covers the range");
        model.truncate(f.len() as usize);
        let stat = f.stat();
        assert_eq!(stat.allocated, 16 * B, "every block of the range");
        assert!(stat.mtime_ns > before.mtime_ns && stat.ctime_ns > before.ctime_ns);
        // Blocks 5 and 6 hold only logged writes, so they are holes too: 15 zeroed blocks.
        // When a checkpoint pass runs meanwhile, block 6's logged whole block goes into the
        // file as its page and the zeroed block it replaces goes back (one run in about 25).
        assert!(
            free_before - volume.free_bytes() >= 14 * B,
            "15 blocks taken from the volume (one back when block 6's logged page replaced \
             its zeroed block): {free_before} free before, {} after",
            volume.free_bytes()
        );
        assert!(contents(&f) == model, "data kept, the rest zeros");

        // Past the end, the size kept.
        f.allocate(20 * B, 4 * B, true).unwrap();
        assert_eq!(f.len(), 15 * B + 10);
        assert_eq!(f.stat().allocated, 20 * B);
        // Again over what is allocated: nothing more taken.
        let free = volume.free_bytes();
        f.allocate(0, 24 * B, true).unwrap();
        assert_eq!(f.stat().allocated, 24 * B);
        assert_eq!(free - volume.free_bytes(), 4 * B, "blocks 16..20 only");
        drop(f);
        drop(volume);

        check_across_crash_and_unmount(fs, &shm.dir, |fs, when| {
            let f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
            assert_eq!(f.len(), 15 * B + 10, "{when}");
            assert!(contents(&f) == model, "{when}: contents differ");
            assert_eq!(f.stat().allocated, 24 * B, "{when}");
            fs.checkpoint().unwrap();
            assert!(
                contents(&f) == model,
                "{when}, checkpointed: contents differ"
            );
        });
        let check = Fs::check(&open_volume(&shm.dir)).unwrap();
        assert_eq!(check.file_bytes, 15 * B + 10);
        // Growing into the blocks allocated past the end shows their zeros.
        let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
        let f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
        f.write_at(&[0x77; 10], 23 * B).unwrap();
        model.resize(23 * B as usize + 10, 0);
        model[23 * B as usize..23 * B as usize + 10].fill(0x77);
        assert!(contents(&f) == model, "grown contents differ");
        assert_eq!(f.stat().allocated, 24 * B);
        drop(f);
        fs.unmount().unwrap();
    }
}

/// A file's allocated size counts the blocks its logged writes will add, before the
/// checkpoint places them: random whole and partial writes, overwrites, into holes and past
/// the end, a truncation and a punched hole, and the size is the same before and after each
/// checkpoint (which only moves data) — and matches the blocks that hold data.
#[test]
fn the_allocated_size_counts_logged_writes() {
    let shm = shm_volume("allocate-logged", 64 << 20);
    let lazy = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        ..small_options()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), lazy).unwrap();
    let f = fs.create("/f").unwrap();
    let f2 = fs.create("/g").unwrap();
    let mut seed = 0x5eed_u64;
    let mut next = |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    // A fresh file written and not yet checkpointed has its blocks.
    f2.write_at(&[1; 3 * B as usize + 1], 0).unwrap();
    assert_eq!(f2.stat().allocated, 4 * B, "four blocks touched");
    // Cutting a file inside a hole keeps the hole; inside a block with data, the block.
    f2.set_len(10 * B).unwrap();
    f2.set_len(5 * B + 10).unwrap();
    assert_eq!(f2.stat().allocated, 4 * B, "a truncation into a hole");
    f2.set_len(2 * B + 5).unwrap();
    assert_eq!(
        f2.stat().allocated,
        3 * B,
        "a truncation into a logged block"
    );
    let mut touched = std::collections::BTreeSet::new();
    for round in 0..6 {
        for _ in 0..40 {
            // Up to 1,000 blocks into a 4 MiB stretch of 1,024 blocks, so the writes cross
            // the overlay's 2 MiB shard edge.
            let (offset, len) = if next(2) == 0 {
                (next(1000) * B, (1 + next(3)) * B)
            } else {
                (next(1000 * B), 1 + next(3 * B))
            };
            f.write_at(&vec![round as u8 + 1; len as usize], offset)
                .unwrap();
            touched.extend(offset / B..(offset + len).div_ceil(B));
        }
        if round == 3 {
            f.set_len(600 * B + 10).unwrap();
            touched.retain(|&b| b < 601);
        }
        if round == 4 {
            f.punch_hole(100 * B, 50 * B).unwrap();
            touched.retain(|&b| !(100..150).contains(&b));
        }
        let logged = f.stat().allocated;
        assert_eq!(
            logged,
            touched.len() as u64 * B,
            "round {round}: the blocks written, before the checkpoint"
        );
        fs.checkpoint().unwrap();
        assert_eq!(
            f.stat().allocated,
            logged,
            "round {round}: the checkpoint places the blocks it counted"
        );
    }
    assert_eq!(f2.stat().allocated, 3 * B);
    let mut back = vec![0u8; 2 * B as usize + 5];
    assert_eq!(f2.read_at(&mut back, 0).unwrap(), back.len());
    assert!(back.iter().all(|&b| b == 1), "the kept bytes");
    drop((f, f2));
    fs.unmount().unwrap();
}

/// An allocation beyond the volume's free memory is `ENOSPC` and changes nothing; one
/// within it holds: with the rest of the volume filled by another file until `ENOSPC`,
/// every block of the allocated file can still be written, again and again, and reads
/// back. Beyond the largest file it is `EFBIG`; an empty range `EINVAL`.
#[test]
fn an_allocation_is_refused_beyond_free_space_and_kept_within_it() {
    let shm = shm_volume("allocate-full", 64 << 20);
    let volume = open_volume(&shm.dir);
    let fs = Fs::format(Arc::clone(&volume), &small_format(), small_options()).unwrap();
    let f = fs.create("/reserved").unwrap();
    f.write_at(b"start", 0).unwrap();
    fs.checkpoint().unwrap();
    let (size, allocated, free) = (f.len(), f.stat().allocated, volume.free_bytes());
    let err = f.allocate(0, 1 << 30, false).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert_eq!((f.len(), f.stat().allocated), (size, allocated));
    assert!(volume.free_bytes() >= free, "nothing taken");
    let err = f.allocate(fs::MAX_FILE_SIZE - B, 2 * B, true).unwrap_err();
    assert_eq!(err.errno(), libc::EFBIG, "{err}");
    assert!(matches!(f.allocate(0, 0, false), Err(FsError::Invalid(_))));

    let reserved = 8 << 20;
    f.allocate(0, reserved, false).unwrap();
    assert_eq!(f.stat().allocated, reserved);
    // Fill what is left.
    let filler = fs.create("/filler").unwrap();
    let chunk = vec![0xf0u8; 256 << 10];
    let mut at = 0;
    loop {
        match filler.write_at(&chunk, at) {
            Ok(()) => at += chunk.len() as u64,
            Err(e) if e.errno() == libc::ENOSPC => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    assert!(at > 16 << 20, "the filler got {at} bytes");
    // The reservation holds: three passes over it, whole blocks and partial ones.
    for pass in 0..3u8 {
        for block in 0..reserved / B {
            let byte = pass.wrapping_mul(31).wrapping_add(block as u8);
            let data = if block % 3 == 0 {
                vec![byte; 100]
            } else {
                vec![byte; B as usize]
            };
            f.write_at(&data, block * B)
                .unwrap_or_else(|e| panic!("pass {pass}, block {block} of the reservation: {e}"));
        }
    }
    fs.checkpoint().unwrap();
    let back = contents(&f);
    for block in 0..reserved / B {
        let byte = 2u8.wrapping_mul(31).wrapping_add(block as u8);
        let at = (block * B) as usize;
        let len = if block % 3 == 0 { 100 } else { B as usize };
        assert!(
            back[at..at + len].iter().all(|&b| b == byte),
            "block {block} holds the last pass"
        );
    }
    drop(f);
    drop(filler);
    fs.unmount().unwrap();
}

/// `zero_range` (`FALLOC_FL_ZERO_RANGE`): the range reads as zeros — checkpointed data and
/// logged writes inside it included, partial blocks at its edges too — with every block it
/// touches allocated; the size grows unless kept; a range the volume has no room for is
/// `ENOSPC` with the data untouched. Live, after a crash and after an unmount.
#[test]
fn a_zeroed_range_reads_as_zeros_with_its_blocks_allocated() {
    let shm = shm_volume("zero-range", 64 << 20);
    let lazy = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        ..small_options()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), lazy).unwrap();
    let f = fs.create("/f").unwrap();
    let mut model: Vec<u8> = (0..40_000u32).map(|i| (i % 251 + 1) as u8).collect();
    f.write_at(&model, 0).unwrap();
    fs.checkpoint().unwrap();
    f.write_at(&[0xee; 3000], 12_000).unwrap();
    model[12_000..15_000].fill(0xee);
    assert_eq!(f.stat().allocated, 10 * B);

    let err = f.zero_range(0, 1 << 30, false).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(contents(&f) == model, "a refused range changes nothing");

    f.zero_range(5000, 20_000, true).unwrap();
    model[5000..25_000].fill(0);
    assert_eq!(f.len(), 40_000);
    assert!(contents(&f) == model);
    assert_eq!(
        f.stat().allocated,
        10 * B,
        "the blocks punched are allocated again"
    );
    f.zero_range(38_000, 10_000, false).unwrap();
    model[38_000..].fill(0);
    model.resize(48_000, 0);
    assert!(contents(&f) == model);
    assert_eq!(f.stat().allocated, 12 * B);
    assert_eq!(
        f.zero_range(fs::MAX_FILE_SIZE - B, 2 * B, true)
            .unwrap_err()
            .errno(),
        libc::EFBIG
    );
    drop(f);
    check_across_crash_and_unmount(fs, &shm.dir, |fs, when| {
        let f = fs.open_read("/f").unwrap();
        assert!(contents(&f) == model, "{when}: contents differ");
        assert_eq!(f.stat().allocated, 12 * B, "{when}");
    });
}

/// What `Fs::space` shows available can be allocated (but for what the allocation's own
/// metadata adds to the checkpoint's reserve), even when part of it is room left in the
/// buffer another, still running, thread is filling: the allocation gives that room back
/// first, as a write does (without it, allocating what `df` showed was `NoSpace`).
#[test]
fn what_space_shows_available_can_be_allocated() {
    use std::sync::mpsc;
    let shm = shm_volume("allocate-available", 64 << 20);
    // Buffers of 2 MiB, so that the other thread's holds more than the allocation's slack.
    let options = fs::FsOptions {
        prelim_buffer_bytes: 2 << 20,
        ..small_options()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), options).unwrap();
    let first = fs.create("/first").unwrap();
    let reserved = fs.create("/reserved").unwrap();
    let (done, finished) = mpsc::channel::<()>();
    let (wrote, written) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        // A thread that writes 64 KiB and then keeps its slot (and its buffer) until told.
        let first = &first;
        s.spawn(move || {
            first.write_at(&vec![7u8; 64 << 10], 0).unwrap();
            wrote.send(()).unwrap();
            // Until told, or until the test fails (`done` dropped as it unwinds).
            let _ = finished.recv();
        });
        let done = done;
        written.recv().unwrap();
        fs.checkpoint().unwrap();
        // Less 256 KiB: the allocation's own metadata (the runs it maps, its journal
        // record) makes the checkpoint's reserve grow as it goes. The room in the other
        // thread's buffer is about 1.9 MiB of what is available.
        let available = fs.space().available_bytes / B * B;
        let wanted = available - (256 << 10);
        reserved
            .allocate(0, wanted, false)
            .expect("an allocation of what Fs::space shows available");
        assert_eq!(reserved.stat().size, wanted);
        done.send(()).unwrap();
    });
    assert_eq!(contents(&first), vec![7u8; 64 << 10]);
    drop((first, reserved));
    fs.unmount().unwrap();
}

/// The pages small overwrites replaced, which the file system keeps for the next small
/// writes, are available to an allocation too: `Fs::space` counts them free, so an
/// allocation of what it shows must get them back from the file system's lists (without
/// it, `fallocate` of what `df` showed was `NoSpace` by up to a 32nd of the volume).
#[test]
fn pages_kept_for_small_writes_can_be_allocated() {
    let shm = shm_volume("allocate-recycled", 64 << 20);
    let volume = open_volume(&shm.dir);
    // The checkpoint runs when asked, so that the overwrites' pages are replaced in one
    // pass and no later write takes them back.
    let options = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        prelim_buffers: 4,
        prelim_buffer_bytes: 2 << 20,
        ..small_options()
    };
    let format = fs::FormatOptions {
        log_records: 2048,
        ..small_format()
    };
    let fs = Fs::format(Arc::clone(&volume), &format, options).unwrap();
    // 8 MiB written at once, then its first half overwritten 4 KiB at a time in a
    // scattered order: the checkpoint remaps each overwrite and keeps the page it replaced
    // (up to 1024 on a volume this small).
    let f = fs.create("/f").unwrap();
    f.write_at(&vec![1u8; 8 << 20], 0).unwrap();
    fs.checkpoint().unwrap();
    // On a thread of their own, which gives back the room left in its buffer as it ends:
    // what the file system then holds beyond the devices' free memory is kept pages.
    let blocks = (4 << 20) / B;
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..blocks {
                let block = (i * 977) % blocks;
                f.write_at(&[2u8; B as usize], block * B).unwrap();
            }
        });
    });
    fs.checkpoint().unwrap();
    let device_free: u64 = volume.stats().iter().map(|d| d.free_bytes).sum();
    let space = fs.space();
    assert!(
        space.free_bytes >= device_free + (2 << 20),
        "the overwrites leave pages in the file system's hands: {} free counted, {} free on \
         the devices",
        space.free_bytes,
        device_free,
    );
    let wanted = (space.available_bytes / B * B) - (256 << 10);
    assert!(
        wanted > device_free,
        "the allocation needs the kept pages: {wanted} bytes wanted, {device_free} free on \
         the devices"
    );
    let reserved = fs.create("/reserved").unwrap();
    reserved
        .allocate(0, wanted, false)
        .expect("an allocation of what Fs::space shows available");
    assert_eq!(reserved.stat().size, wanted);
    let data = contents(&f);
    assert!(
        data[..4 << 20].iter().all(|&b| b == 2) && data[4 << 20..].iter().all(|&b| b == 1),
        "the file's bytes changed"
    );
    drop((f, reserved));
    fs.unmount().unwrap();
}

/// Waits (at most 10 s) until the checkpoint and idle-time defragmentation are done.
fn settle(fs: &Fs) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    fs.checkpoint().unwrap();
    while !fs.stats().idle && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(fs.stats().idle, "{:?}", fs.stats());
}

/// Removing what was written gives every block back: free memory (as `statfs` counts it)
/// returns to its level before, less exactly the log areas and journals of the thread slots
/// the writing threads made — which stay the file system's for the next threads, and which
/// the counters, and after an unmount the offline check, report.
#[test]
fn removed_files_give_back_all_but_new_thread_slots() {
    let shm = shm_volume("give-back", 64 << 20);
    let volume = open_volume(&shm.dir);
    let fs = Fs::format(Arc::clone(&volume), &small_format(), small_options()).unwrap();
    settle(&fs);
    let free = |fs: &Fs| fs.space().free_bytes;
    let (free_before, slots_before) = (free(&fs), fs.stats());
    // Three threads at once, each a file of 1 MiB: 4 KiB at scattered offsets, then
    // 64 KiB pieces over it, then a partial block.
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let f = fs.create(&format!("/f{t}")).unwrap();
                    for i in 0..256u64 {
                        let block = (i * 97) % 256;
                        f.write_at(&pattern(t, block * B, B as usize), block * B)
                            .unwrap();
                    }
                    for i in 0..16u64 {
                        f.write_at(&pattern(t + 10, i << 16, 64 << 10), i << 16)
                            .unwrap();
                    }
                    f.write_at(b"tail", 5 * B + 7).unwrap();
                })
            })
            .collect();
        // Joined one by one, not at the scope's end: a join returns once the thread has
        // ended, thread-locals and all — its slot released.
        for writer in writers {
            writer.join().unwrap();
        }
    });
    settle(&fs);
    let stats = fs.stats();
    assert!(
        stats.slots > slots_before.slots,
        "the writers' threads made slots: {stats:?}"
    );
    assert!(free(&fs) + (3 << 20) <= free_before, "the files hold 3 MiB");
    for t in 0..3 {
        fs.unlink(&format!("/f{t}")).unwrap();
    }
    settle(&fs);
    let made = stats.slot_bytes - slots_before.slot_bytes;
    assert_eq!(
        free(&fs) + made,
        free_before,
        "free memory after the removal, plus the new slots' areas, against before"
    );
    let (slots, slot_bytes) = (stats.slots, stats.slot_bytes);
    fs.unmount().unwrap();
    drop(volume);

    let volume = open_volume(&shm.dir);
    let offline = Fs::offline(&volume).unwrap();
    let check = offline.check().unwrap();
    assert_eq!((check.slots, check.slot_bytes), (slots, slot_bytes));
    drop(offline);
    drop(volume);
    let volume = open_volume(&shm.dir);
    let fs = Fs::open(volume, small_options()).unwrap();
    settle(&fs);
    assert_eq!(
        (fs.stats().slots, fs.stats().slot_bytes),
        (slots, slot_bytes)
    );
    assert_eq!(
        free(&fs) + made,
        free_before,
        "after the unmount: free memory plus the new slots' areas, against before"
    );
}

/// What each thread's write from its destructor returned.
type EndResults = Arc<std::sync::Mutex<Vec<Result<(), String>>>>;

/// Writes block `2 * thread + 1` of `file` (its pattern) when the thread's thread-locals are
/// destroyed, with the result pushed to `results`.
struct AtEnd {
    file: Arc<fs::File>,
    thread: u64,
    results: EndResults,
}

impl Drop for AtEnd {
    fn drop(&mut self) {
        let at = (2 * self.thread + 1) * B;
        let written = self
            .file
            .write_at(&pattern(self.thread, at, B as usize), at)
            .map_err(|e| e.to_string());
        self.results.lock().unwrap().push(written);
    }
}

thread_local! {
    static AT_END: std::cell::RefCell<Option<AtEnd>> = const { std::cell::RefCell::new(None) };
}

/// Makes the calling thread write its block at its end ([`AtEnd`]). Call it before the
/// thread's first write claims a slot: thread-locals are destroyed in the reverse order of
/// their first use, so this one's destructor runs after the file system's lease is gone.
fn write_at_end(file: &Arc<fs::File>, thread: u64, results: EndResults) {
    AT_END.with(|at_end| {
        *at_end.borrow_mut() = Some(AtEnd {
            file: Arc::clone(file),
            thread,
            results,
        });
    });
}

/// Runs `threads` threads one after another, each writing its block `2 * thread` and, from
/// a destructor after its thread-locals are gone, its block `2 * thread + 1`
/// ([`write_at_end`]).
fn write_and_write_at_end(file: &Arc<fs::File>, results: &EndResults, threads: u64) {
    for thread in 0..threads {
        let (file, results) = (Arc::clone(file), Arc::clone(results));
        std::thread::spawn(move || {
            write_at_end(&file, thread, results);
            let at = 2 * thread * B;
            file.write_at(&pattern(thread, at, B as usize), at).unwrap();
        })
        .join()
        .unwrap();
    }
}

/// Asserts that `threads` threads (numbered from 0) each wrote its block `2 * thread` while
/// it ran and its block `2 * thread + 1` from its destructor ([`write_at_end`]), and that
/// every one of those writes succeeded.
fn assert_written_at_end(file: &fs::File, results: &EndResults, threads: u64) {
    let results = std::mem::take(&mut *results.lock().unwrap());
    assert_eq!(results.len() as u64, threads, "every destructor ran");
    for (thread, written) in results.iter().enumerate() {
        assert_eq!(written, &Ok(()), "thread {thread}'s write at its end");
    }
    let back = contents(file);
    for thread in 0..threads {
        for at in [2 * thread * B, (2 * thread + 1) * B] {
            assert_eq!(
                &back[at as usize..(at + B) as usize],
                &pattern(thread, at, B as usize)[..],
                "thread {thread}'s block at {at}"
            );
        }
    }
}

/// A thread that writes after its thread-locals are destroyed (a stdio stream flushed by a
/// destructor at its end) is given a slot of its own for that; once it has ended the slot
/// is free again, so that a program whose every thread does so never runs out of them:
/// here three times as many threads, one after another, as the format has slots, each
/// writing once while it runs and once from a destructor that runs after the file system's
/// own — every write lands.
#[test]
fn threads_that_write_at_their_end_give_their_slots_back() {
    let shm = shm_volume("write-at-end", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let file = Arc::new(fs.create("/at-end").unwrap());
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads = 3 * u64::from(small_format().slot_limit);
    write_and_write_at_end(&file, &results, threads);
    assert_written_at_end(&file, &results, threads);
}

/// A thread that writes from a destructor after its thread-locals are gone, while every slot
/// a thread may own is held by a live thread: the write takes a turn on a shared slot and
/// lands (before the shared slots it failed, "all 13 thread slots ... in use"). Thirteen
/// threads hold the small format's ownable slots until the end; eight more write once
/// while they run (taking turns) and once from such a destructor.
#[test]
fn a_thread_writing_at_its_end_takes_a_turn_when_no_slot_is_free() {
    let shm = shm_volume("turn-at-end", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let file = Arc::new(fs.create("/at-end").unwrap());
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let slot_limit = u64::from(small_format().slot_limit);
    let owners = slot_limit - 1 - (slot_limit / 8).max(1);
    let writers = 8;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_rx = Arc::new(std::sync::Mutex::new(done_rx));
    let owned = std::sync::Barrier::new(owners as usize + 1);
    std::thread::scope(|s| {
        for thread in 0..owners {
            let (file, owned, done_rx) = (&file, &owned, Arc::clone(&done_rx));
            s.spawn(move || {
                let at = 2 * (writers + thread) * B;
                file.write_at(&pattern(writers + thread, at, B as usize), at)
                    .unwrap();
                owned.wait();
                // Hold the slot until the writers have ended.
                let _ = done_rx.lock().unwrap().recv();
            });
        }
        owned.wait();
        write_and_write_at_end(&file, &results, writers);
        drop(done_tx);
    });
    assert_written_at_end(&file, &results, writers);
}
