//! Volumes the way long use leaves them: full, and with free space in scattered small holes.
//! Every write the free blocks can hold succeeds, whatever its size and offset; a full volume
//! answers `ENOSPC` and never stops the file system; unmount and check stay clean.

use testkit::*;

use fs::{ErrorKind, Fs, FsOptions};

fn rng(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 16
}

#[test]
fn random_writes_into_a_sparse_file_larger_than_the_volume_end_in_no_space_not_shutdown() {
    sparse_past_full(
        "aged-sparse-small",
        64 << 20,
        &small_format(),
        small_options(),
    );
}

#[test]
fn random_writes_past_full_with_default_options() {
    sparse_past_full(
        "aged-sparse-default",
        256 << 20,
        &fs::FormatOptions::default(),
        FsOptions::default(),
    );
}

fn sparse_past_full(name: &str, size: u64, format: &fs::FormatOptions, options: FsOptions) {
    let shm = shm_volume(name, size);
    let fs = Fs::format(open_volume(&shm.dir), format, options).unwrap();
    let f = fs.create("/sparse").unwrap();
    let mut state = 7;
    let mut written = Vec::new();
    let mut refused = 0;
    for i in 0..2 * size / 4096 {
        let at = rng(&mut state) % (2 * size) / 4096 * 4096;
        match f.write_at(&pattern(i, at, 4096), at) {
            Ok(()) => written.push((i, at)),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NoSpace, "write {i}: {e}");
                refused += 1;
                if refused == 50 {
                    break;
                }
            }
        }
    }
    assert_eq!(refused, 50, "the volume never filled");
    // Still running: reads work, metadata works, the last value of every block is there.
    fs.mkdir("/after", 0o755).unwrap();
    let mut last = std::collections::HashMap::new();
    for &(i, at) in &written {
        last.insert(at, i);
    }
    let mut back = vec![0u8; 4096];
    for (&at, &i) in last.iter().take(2000) {
        f.read_at(&mut back, at).unwrap();
        assert!(back == pattern(i, at, 4096), "block at {at}");
    }
    drop(f);
    fs.unmount().expect("a full volume unmounts");
    let check = Fs::check(&open_volume(&shm.dir)).expect("a full volume checks clean");
    assert_eq!(check.files, 1);
    let fs = Fs::open(open_volume(&shm.dir), FsOptions::default()).expect("and opens again");
    let f = fs
        .open_file("/sparse", fs::OpenOptions::read_write())
        .unwrap();
    for (&at, &i) in last.iter().take(2000) {
        f.read_at(&mut back, at).unwrap();
        assert!(
            back == pattern(i, at, 4096),
            "block at {at} after reopening"
        );
    }
    drop(f);
    fs.unmount().unwrap();
}

#[test]
fn writes_longer_than_a_buffer_at_unaligned_offsets_complete() {
    let shm = shm_volume("aged-unaligned", 128 << 20);
    let options = small_options();
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), options.clone()).unwrap();
    let f = fs.create("/f").unwrap();
    let buffer = options.prelim_buffer_bytes;
    for (tag, at, len) in [
        (1, 1, buffer),
        (2, 4095, buffer - 100),
        (3, (1 << 20) + 17, buffer - 17),
        (4, 3 << 20, 8 << 20),
        (5, (12 << 20) + 1, 8 << 20),
    ] {
        let data = pattern(tag, at, len as usize);
        f.write_at(&data, at).unwrap();
        let mut back = vec![0u8; len as usize];
        assert_eq!(f.read_at(&mut back, at).unwrap(), len as usize);
        assert!(back == data, "write {tag} reads back");
    }
    drop(f);
    fs.unmount().unwrap();
}
/// Fills the volume with one file in 1 MiB writes, then frees the first `piece` bytes of every
/// `2 × piece` of it: free memory left in holes of `piece` bytes only. Returns the bytes freed.
fn fragment(fs: &Fs, piece: u64) -> u64 {
    let f = fs.create("/holes").unwrap();
    let mut size = 0u64;
    loop {
        match f.write_at(&vec![0x11; 1 << 20], size) {
            Ok(()) => size += 1 << 20,
            Err(e) if e.kind() == ErrorKind::NoSpace => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    fs.checkpoint().unwrap();
    for at in (0..size).step_by(2 * piece as usize) {
        f.punch_hole(at, piece).unwrap();
    }
    fs.checkpoint().unwrap();
    size / 2
}

#[test]
fn large_writes_fit_in_scattered_free_blocks() {
    let shm = shm_volume("aged-fragmented", 48 << 20);
    // A write in pieces is one group of log records, at most half an area: 2048 records
    // hold 8 MiB even in single free blocks.
    let format = fs::FormatOptions {
        log_records: 4096,
        ..small_format()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, small_options()).unwrap();
    let freed = fragment(&fs, 4096);
    assert!(freed >= 12 << 20, "only {freed} bytes freed");
    let f = fs.create("/new").unwrap();
    let mut at = 0;
    for (tag, len, skew) in [
        (1u64, 1u64 << 20, 1u64),
        (2, 3 << 20, 4095),
        (3, 64 << 10, 0),
    ] {
        let data = pattern(tag, at + skew, len as usize);
        f.write_at(&data, at + skew)
            .unwrap_or_else(|e| panic!("{len} bytes at {}: {e}", at + skew));
        let mut back = vec![0u8; len as usize];
        f.read_at(&mut back, at + skew).unwrap();
        assert!(back == data, "write {tag} reads back");
        at += len + (1 << 20);
    }
    // Overwriting an existing range of 1 MiB: its old blocks are freed only after the
    // checkpoint moved the new ones, so the new data needs free blocks of its own.
    let over = pattern(9, 0, 1 << 20);
    f.write_at(&over, 0).unwrap();
    drop(f);
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files, 2);
    let fs = Fs::open(open_volume(&shm.dir), FsOptions::default()).unwrap();
    let f = fs.open_file("/new", fs::OpenOptions::read_write()).unwrap();
    let mut back = vec![0u8; 1 << 20];
    f.read_at(&mut back, 0).unwrap();
    assert!(back == over, "the overwrite survives reopening");
}

/// A thread that starts writing on a volume whose free memory is all in 64 KiB pieces (what
/// random overwrites leave once the checkpoint has freed the blocks they replaced): its slot's
/// log area and journal (1 MiB each in this format) are made smaller rather than failing the
/// write with `NoSpace` while half the volume is free. The small log wraps many times under
/// the thread's writes, and a crash with records live in it recovers them.
#[test]
fn a_new_thread_writes_when_free_memory_is_in_small_pieces() {
    let shm = shm_volume("aged-new-slot", 48 << 20);
    let format = fs::FormatOptions {
        log_records: 16 << 10,
        journal_bytes: 1 << 20,
        ..small_format()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, small_options()).unwrap();
    let freed = fragment(&fs, 64 << 10);
    assert!(freed >= 12 << 20, "only {freed} bytes freed");
    let writes = 2048u64;
    let expected: Vec<Vec<u8>> = (0..writes).map(|i| pattern(i, i * 4096, 4096)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let g = fs.create("/new").unwrap();
            for (i, data) in expected.iter().enumerate() {
                g.write_at(data, (i as u64 % 64) * 4096)
                    .unwrap_or_else(|e| panic!("write {i} from a new thread: {e}"));
            }
        })
        .join()
        .unwrap();
    });
    // The last write at each of the 64 offsets.
    let last = |k: u64| &expected[(writes - 64 + k) as usize];
    let g = fs.open_file("/new", fs::OpenOptions::read_write()).unwrap();
    for k in 0..64 {
        let mut back = vec![0u8; 4096];
        g.read_at(&mut back, k * 4096).unwrap();
        assert!(back == *last(k), "block {k} reads back");
    }
    drop(g);
    // A crash with the new thread's records still in its log.
    std::thread::scope(|s| {
        s.spawn(|| {
            let g = fs.open_file("/new", fs::OpenOptions::read_write()).unwrap();
            g.write_at(&[0xab; 4096], 8192).unwrap();
        })
        .join()
        .unwrap();
    });
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), FsOptions::default()).unwrap();
    let g = fs.open_file("/new", fs::OpenOptions::read_write()).unwrap();
    let mut back = vec![0u8; 4096];
    g.read_at(&mut back, 8192).unwrap();
    assert_eq!(back, vec![0xab; 4096], "the write logged before the crash");
    g.read_at(&mut back, 4096).unwrap();
    assert!(back == *last(1), "an earlier write");
    drop(g);
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files, 2);
}

/// `writes` 64 KiB writes to `g` at random 64 KiB-aligned offsets in its first 4 MiB, each
/// a different pattern (`seed` picks the offsets); returns what the 4 MiB should hold.
fn random_64k_writes(g: &fs::File, writes: u64, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut model = vec![0u8; 4 << 20];
    for i in 0..writes {
        let at = rng(&mut state) % 64 * (64 << 10);
        let data = pattern(i, at, 64 << 10);
        g.write_at(&data, at).unwrap();
        model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    }
    model
}

/// `g` reads back as `model`; after unmount the volume in `dir` checks clean with two files.
fn reads_back_and_checks_clean(fs: Fs, g: fs::File, model: &[u8], dir: &std::path::Path) {
    let mut back = vec![0u8; model.len()];
    let n = g.read_at(&mut back, 0).unwrap();
    assert!(back[..n] == model[..n], "the writes read back");
    drop(g);
    fs.unmount().unwrap();
    assert_eq!(Fs::check(&open_volume(dir)).unwrap().files, 2);
}

/// When free memory is in 64 KiB pieces, preliminary buffers come out smaller than asked; the
/// pool then holds more of them, up to the bytes its buffers were to hold, instead of making
/// the writer wait for the checkpoint every time its few small buffers are full. With the
/// checkpoint running only on demand, every wait is a writer out of buffers.
#[test]
fn small_buffers_on_a_fragmented_volume_keep_the_pools_bytes_in_flight() {
    let shm = shm_volume("aged-small-buffers", 48 << 20);
    let options = FsOptions {
        prelim_buffers: 2,
        prelim_buffer_bytes: 512 << 10,
        checkpoint_batch: 4096,
        checkpoint: fs::CheckpointMode::OnDemand,
        defrag: true,
        ..FsOptions::default()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), options).unwrap();
    fragment(&fs, 64 << 10);
    let g = fs.create("/new").unwrap();
    let before = fs.stats().backpressure_waits;
    let writes = 64u64;
    let model = random_64k_writes(&g, writes, 5);
    let waits = fs.stats().backpressure_waits - before;
    // 1 MiB of buffers is 16 writes of 64 KiB; two buffers of 64 KiB would be 2.
    assert!(
        waits <= writes / 8,
        "{waits} waits for the checkpoint in {writes} writes"
    );
    reads_back_and_checks_clean(fs, g, &model, &shm.dir);
}

/// A write larger than every free piece of a volume that has plenty of memory free in
/// smaller ones goes into pieces at once: waiting for the checkpoint would not make a larger
/// piece appear (it frees blocks where they are). Each such write used to wait for a
/// checkpoint pass first — thousands of waits a second in `locus bench fs` once random
/// 4 KiB overwrites had left free memory in pieces under 64 KiB.
#[test]
fn writes_larger_than_every_free_piece_do_not_wait_for_the_checkpoint() {
    let shm = shm_volume("aged-no-wait", 48 << 20);
    let options = FsOptions {
        prelim_buffers: 4,
        prelim_buffer_bytes: 1 << 20,
        checkpoint_batch: 4096,
        checkpoint: fs::CheckpointMode::OnDemand,
        defrag: true,
        ..FsOptions::default()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), options).unwrap();
    let freed = fragment(&fs, 32 << 10);
    assert!(freed >= 12 << 20, "only {freed} bytes freed");
    let g = fs.create("/new").unwrap();
    let before = fs.stats();
    let model = random_64k_writes(&g, 64, 11);
    let after = fs.stats();
    assert_eq!(
        after.waits_for_space - before.waits_for_space,
        0,
        "writes waited for the checkpoint with {} bytes free",
        fs.volume().free_bytes()
    );
    reads_back_and_checks_clean(fs, g, &model, &shm.dir);
}
