//! Threads writing one file: on disjoint ranges they all land; on overlapping ranges every
//! 4 KiB block read back is entirely one writer's data (writes are atomic), both while the
//! checkpoint runs and after a stop that leaves logs to recover.

use std::sync::Arc;

use fs::Fs;
use testkit::*;

const BLOCK: usize = 4096;

fn block_of(writer: u8, round: u32) -> Vec<u8> {
    let mut data = vec![writer; BLOCK];
    data[..4].copy_from_slice(&round.to_le_bytes());
    data
}

/// Every block holds one writer's bytes (writer id in bytes 4.., any round).
fn assert_blocks_whole(data: &[u8], writers: u8) {
    for (i, block) in data.chunks(BLOCK).enumerate() {
        let writer = block[4];
        assert!(writer < writers, "block {i}: unknown writer {writer}");
        assert!(
            block[4..].iter().all(|&b| b == writer),
            "block {i} mixes writers' data"
        );
    }
}

#[test]
fn disjoint_and_overlapping_writers() {
    let shm = shm_volume("concurrency", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let file = Arc::new(fs.create("/shared").unwrap());
    let writers = 4u8;
    let blocks = 64usize;
    // Disjoint: writer w owns blocks w, w + 4, ...
    std::thread::scope(|s| {
        for w in 0..writers {
            let file = Arc::clone(&file);
            s.spawn(move || {
                for round in 0..20u32 {
                    for b in (w as usize..blocks).step_by(writers as usize) {
                        file.write_at(&block_of(w, round), (b * BLOCK) as u64)
                            .unwrap();
                    }
                }
            });
        }
    });
    let mut data = vec![0u8; blocks * BLOCK];
    file.read_at(&mut data, 0).unwrap();
    for (i, block) in data.chunks(BLOCK).enumerate() {
        assert_eq!(
            block,
            &block_of((i % writers as usize) as u8, 19)[..],
            "block {i}"
        );
    }

    // Overlapping: multi-block writes at unaligned and aligned offsets over the same range,
    // with readers checking atomicity while they run.
    std::thread::scope(|s| {
        for w in 0..writers {
            let file = Arc::clone(&file);
            s.spawn(move || {
                for round in 0..60u32 {
                    let start = ((round as usize * 7 + w as usize * 3) % (blocks - 8)) * BLOCK;
                    let mut data = Vec::with_capacity(8 * BLOCK);
                    for _ in 0..8 {
                        data.extend_from_slice(&block_of(w, round));
                    }
                    file.write_at(&data, start as u64).unwrap();
                }
            });
        }
        let file = Arc::clone(&file);
        s.spawn(move || {
            for _ in 0..200 {
                let mut data = vec![0u8; blocks * BLOCK];
                file.read_at(&mut data, 0).unwrap();
                assert_blocks_whole(&data, writers);
            }
        });
    });
    let mut data = vec![0u8; blocks * BLOCK];
    file.read_at(&mut data, 0).unwrap();
    assert_blocks_whole(&data, writers);
    let stats = fs.stats();
    assert_eq!(stats.writes, 20 * 64 + 60 * 4, "{stats:?}");

    // A stop with logs in flight, then recovery: same contents.
    drop(file);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let mut again = vec![0u8; blocks * BLOCK];
    fs.open_read("/shared")
        .unwrap()
        .read_at(&mut again, 0)
        .unwrap();
    assert!(again == data, "recovery changed the file");
}

/// While `Fs::quiesced` runs its closure the checkpoint moves nothing: writes logged inside
/// it stay pending and the media stay byte for byte as they were (what a mount server's
/// `fsck` relies on); once it returns they are checkpointed.
#[test]
fn the_checkpoint_holds_still_while_quiesced() {
    let tracer = pmem::Tracer::new();
    let fs = format_over(vec![traced_dirty_volume_device(&tracer, 16 << 20)]);
    let file = fs.create("/f").unwrap();
    let (pending, same) = fs.quiesced(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..16u32 {
                    file.write_at(&block_of(1, i), u64::from(i % 64) * BLOCK as u64)
                        .unwrap();
                }
            });
        });
        let before = tracer.contents();
        // Longer than the checkpoint's gathering wait many times over.
        std::thread::sleep(std::time::Duration::from_millis(100));
        (fs.stats().records_pending, tracer.contents() == before)
    });
    assert_eq!(pending, 16, "the checkpoint moved records while held");
    assert!(same, "the media changed while the file system was quiesced");
    fs.checkpoint().unwrap();
    assert_eq!(fs.stats().records_pending, 0);
    let mut data = vec![0u8; 64 * BLOCK];
    file.read_at(&mut data, 0).unwrap();
    assert_blocks_whole(&data, 2);
    fs.unmount().unwrap();
}

/// A writer that finds the background checkpoint more than 4096 records behind gives way
/// to it (a `sched_yield`) on one write in sixteen of its own; near the checkpoint, or with
/// the checkpoint on demand, it never does — and giving way loses nothing.
#[test]
fn writers_far_ahead_of_the_background_checkpoint_give_way_to_it() {
    // Writes made while the checkpoint is held: past the mark by 2047.
    const HELD: u32 = 6144;
    let format = fs::FormatOptions {
        log_records: 8192,
        ..small_format()
    };
    let writes_held = |fs: &Fs, f: &fs::File, from: u32| {
        fs.quiesced(|| {
            for i in 0..HELD {
                f.write_at(&block_of(1, from + i), u64::from(i % 512) * BLOCK as u64)
                    .unwrap();
            }
        });
    };

    let shm = shm_volume("give-way", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &format, fs::FsOptions::default()).unwrap();
    let f = fs.create("/f").unwrap();
    for i in 0..512u32 {
        f.write_at(&block_of(0, i), u64::from(i) * BLOCK as u64)
            .unwrap();
    }
    fs.checkpoint().unwrap();
    assert_eq!(
        fs.stats().writer_give_ways,
        0,
        "512 writes never got far ahead"
    );
    // With the checkpoint held, the backlog passes 4096 at the 4097th write; of the 2047
    // writes from there, those whose count (512 before them) is a multiple of 16 give way.
    writes_held(&fs, &f, 0);
    let stats = fs.stats();
    assert!(
        (124..=130).contains(&stats.writer_give_ways),
        "{} give-ways in 2047 writes far ahead",
        stats.writer_give_ways
    );
    assert_eq!(
        stats.backpressure_waits, 0,
        "room for all of them: {stats:?}"
    );
    fs.checkpoint().unwrap();
    let mut data = vec![0; 512 * BLOCK];
    f.read_at(&mut data, 0).unwrap();
    for (i, block) in data.chunks(BLOCK).enumerate() {
        assert_eq!(block, block_of(1, HELD - 512 + i as u32), "block {i}");
    }
    drop(f);
    fs.unmount().unwrap();

    let shm = shm_volume("give-way-on-demand", 256 << 20);
    let on_demand = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        ..fs::FsOptions::default()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, on_demand).unwrap();
    let f = fs.create("/f").unwrap();
    writes_held(&fs, &f, 0);
    assert_eq!(
        fs.stats().writer_give_ways,
        0,
        "no checkpoint to give way to"
    );
    drop(f);
    fs.unmount().unwrap();
}

/// One step of a thread in [`more_threads_than_slots_take_turns_on_the_shared_ones`].
type Step<'a> = dyn Fn(&mut Option<fs::File>) -> fs::Result<()> + 'a;

/// More threads change the file system at once than it has slots (16 in the small format,
/// two of them shared): every operation of every thread succeeds — the threads past the
/// ownable slots take turns on the shared ones — and what they did survives a crash and an
/// unmount. Each thread creates a directory and a file, writes aligned and unaligned
/// blocks, punches a hole (writes and a record in one operation's turn), allocates,
/// truncates and renames, all threads alive at once (a barrier between the steps).
#[test]
fn more_threads_than_slots_take_turns_on_the_shared_ones() {
    const THREADS: u64 = 40;
    let shm = shm_volume("more-threads", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let slot_limit = u64::from(small_format().slot_limit);
    assert!(THREADS > slot_limit);
    let barrier = std::sync::Barrier::new(THREADS as usize);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (fs, barrier, errors) = (&fs, &barrier, &errors);
            s.spawn(move || {
                // A thread that fails goes on meeting the others at the barriers, so that
                // the test ends with the errors instead of waiting for it.
                let dir = format!("/t{t}");
                let mut file = None;
                let steps: [&Step<'_>; 4] = [
                    &|file| {
                        fs.mkdir(&dir, 0o755)?;
                        *file = Some(fs.create(&format!("{dir}/new"))?);
                        Ok(())
                    },
                    &|file| {
                        let file = file.as_ref().expect("created");
                        for i in 0..32u64 {
                            let at = i * BLOCK as u64;
                            file.write_at(&pattern(t, at, BLOCK), at)?;
                        }
                        Ok(())
                    },
                    &|file| {
                        let file = file.as_ref().expect("created");
                        let at = 40 * BLOCK as u64 + 100;
                        file.write_at(&pattern(t, at, 3 * BLOCK), at)?;
                        file.punch_hole(4 * BLOCK as u64 + 1, 3 * BLOCK as u64)?;
                        file.allocate(64 * BLOCK as u64, 4 * BLOCK as u64, true)
                    },
                    &|file| {
                        let file = file.as_ref().expect("created");
                        file.set_len(44 * BLOCK as u64)?;
                        file.sync_all()?;
                        fs.rename(&format!("{dir}/new"), &format!("{dir}/file"))
                    },
                ];
                let mut failed = false;
                for (n, step) in steps.iter().enumerate() {
                    if !failed && let Err(e) = step(&mut file) {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("thread {t}, step {n}: {e}"));
                        failed = true;
                    }
                    barrier.wait();
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.is_empty(),
        "{} threads failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    let stats = fs.stats();
    assert!(
        stats.slots <= slot_limit,
        "{} slots made for {THREADS} threads (limit {slot_limit})",
        stats.slots
    );
    // The threads past the ownable slots did every operation on a turn (no lease ends while
    // all are alive): at least their 32 block writes each.
    let turn_takers = THREADS - fs::ownable_slots(slot_limit);
    assert!(
        stats.slot_turns >= turn_takers * 32 && stats.slot_turn_waits <= stats.slot_turns,
        "{} operations on turns ({} waited) for {turn_takers} threads taking turns",
        stats.slot_turns,
        stats.slot_turn_waits
    );
    // What every thread's file holds: its blocks, the hole, the unaligned write, zeros up
    // to the size it was raised to.
    let expected = |t: u64| {
        let mut data = vec![0u8; 44 * BLOCK];
        for i in 0..32u64 {
            let at = i * BLOCK as u64;
            data[at as usize..][..BLOCK].copy_from_slice(&pattern(t, at, BLOCK));
        }
        let at = 40 * BLOCK + 100;
        data[at..at + 3 * BLOCK].copy_from_slice(&pattern(t, at as u64, 3 * BLOCK));
        data[4 * BLOCK + 1..7 * BLOCK + 1].fill(0);
        data
    };
    check_across_crash_and_unmount(fs, &shm.dir, |fs, when| {
        for t in 0..THREADS {
            let file = fs.open_read(&format!("/t{t}/file")).unwrap();
            let mut data = vec![0u8; 44 * BLOCK];
            file.read_at(&mut data, 0).unwrap();
            let want = expected(t);
            let first = data.iter().zip(&want).position(|(a, b)| a != b);
            assert!(
                first.is_none(),
                "thread {t}'s file {when}: differs from byte {first:?}"
            );
            assert_eq!(file.len(), 44 * BLOCK as u64, "thread {t}'s size {when}");
        }
    });
}

/// Block `block`'s content after writer `writer`'s write number `seq` to it.
fn stamped(block: usize, writer: usize, seq: u32) -> Vec<u8> {
    let mut data = vec![writer as u8; BLOCK];
    data[..4].copy_from_slice(&seq.to_le_bytes());
    data[4..8].copy_from_slice(&(block as u32).to_le_bytes());
    data
}

/// Two writers overwrite random blocks of their halves of a small file many times over, with
/// small checkpoint batches, so that many sets of recycled pages hold a page whose record a
/// newer write made void before the checkpoint moved it: every block reads back as its
/// writer's last write, live and after a reopen, and the volume checks clean (a page given
/// back while a file still held it would be handed to another write, and then claimed twice).
#[test]
fn random_small_overwrites_keep_every_block_and_claim_no_page_twice() {
    let shm = shm_volume("overwrites", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let file = Arc::new(fs.create("/hot").unwrap());
    let (blocks, writers, writes) = (128usize, 2usize, 20_000u32);
    let last: Vec<Vec<(usize, u32)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let file = Arc::clone(&file);
                s.spawn(move || {
                    // Writer w owns the blocks b with b % writers == w.
                    let mut last = vec![(w, 0u32); blocks / writers];
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                    for seq in 1..=writes {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let k = (rng % last.len() as u64) as usize;
                        let block = k * writers + w;
                        file.write_at(&stamped(block, w, seq), (block * BLOCK) as u64)
                            .unwrap();
                        last[k] = (block, seq);
                    }
                    last
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let check = |file: &fs::File, when: &str| {
        for (w, owned) in last.iter().enumerate() {
            for &(block, seq) in owned.iter().filter(|&&(_, seq)| seq > 0) {
                let mut data = vec![0u8; BLOCK];
                file.read_at(&mut data, (block * BLOCK) as u64).unwrap();
                assert!(
                    data == stamped(block, w, seq),
                    "{when}: block {block} is not writer {w}'s write {seq} (holds write {} \
                     of block {} by writer {})",
                    u32::from_le_bytes(data[..4].try_into().unwrap()),
                    u32::from_le_bytes(data[4..8].try_into().unwrap()),
                    data[8],
                );
            }
        }
    };
    check(&file, "live");
    fs.checkpoint().unwrap();
    check(&file, "checkpointed");
    let stats = fs.stats();
    assert_eq!(
        stats.writes,
        u64::from(writes) * writers as u64,
        "{stats:?}"
    );
    assert!(
        stats.remapped_blocks < stats.writes,
        "no record was made void before the checkpoint moved it: {stats:?}"
    );
    drop(file);
    fs.unmount().unwrap();
    Fs::check(&open_volume(&shm.dir)).expect("no page claimed twice");
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    check(&fs.open_read("/hot").unwrap(), "reopened");
}
