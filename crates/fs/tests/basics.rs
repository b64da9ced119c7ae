//! The file system's behaviour through its public API, on an emulated device, across
//! unmount/open and across a crash-like drop without unmount.

use std::sync::Arc;
use testkit::*;

use fs::{Fs, FsError, Kind, OpenOptions};

#[test]
fn namespace_operations_and_their_errors() {
    let shm = shm_volume("namespace", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/a", 0o755).unwrap();
    fs.mkdir("/a/b", 0o700).unwrap();
    let f = fs.create("/a/b/file").unwrap();
    f.write_at(b"hello", 0).unwrap();
    drop(f);
    assert!(matches!(fs.mkdir("/a", 0o755), Err(FsError::Exists(_))));
    assert!(matches!(fs.rmdir("/a"), Err(FsError::NotEmpty(_))));
    assert!(matches!(fs.unlink("/a/b"), Err(FsError::IsDir(_))));
    assert!(matches!(fs.rmdir("/a/b/file"), Err(FsError::NotDir(_))));
    assert!(matches!(fs.stat("/nope"), Err(FsError::NotFound(_))));
    assert!(matches!(fs.create("/a/b/file/x"), Err(FsError::NotDir(_))));
    assert!(matches!(
        fs.rename("/a", "/a/b/c"),
        Err(FsError::Invalid(_))
    ));
    let long = "n".repeat(256);
    let err = fs.create(&format!("/{long}")).unwrap_err();
    assert_eq!(err.errno(), libc::ENAMETOOLONG);
    assert_eq!(FsError::NotFound("x".into()).errno(), libc::ENOENT);
    assert!(matches!(
        fs.open_file(
            "/a/b/file",
            OpenOptions {
                create: true,
                exclusive: true,
                ..OpenOptions::create()
            }
        ),
        Err(FsError::Exists(_))
    ));

    // Rename replacing a file is atomic; the old target's blocks go back to the volume.
    let g = fs.create("/g").unwrap();
    g.write_at(&vec![1u8; 1 << 20], 0).unwrap();
    g.close().unwrap();
    fs.rename("/a/b/file", "/g").unwrap();
    let st = fs.stat("/g").unwrap();
    assert_eq!((st.kind, st.size), (Kind::File, 5));
    let names: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a", "g"]);
    assert!(fs.readdir("/a/b").unwrap().is_empty());
    fs.rmdir("/a/b").unwrap();
    fs.rename("/a", "/z").unwrap();
    assert_eq!(fs.stat("/z").unwrap().nlink, 2);
    fs.chmod("/g", 0o600).unwrap();
    fs.unmount().unwrap();

    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let names: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["g", "z"]);
    let g = fs.open_read("/g").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(g.stat().mode, 0o600);
}

/// A directory's link count is 2 and one per subdirectory, through mkdir, rmdir, renames
/// within and across directories (replacing an empty directory, or a file) — and the same
/// after a crash-like drop (recovery replays the journal) and after a clean open (from the
/// snapshot).
#[test]
fn directory_link_counts_follow_the_tree_and_recover() {
    let shm = shm_volume("nlink", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let links = |fs: &Fs, path: &str| fs.stat(path).unwrap().nlink;
    for d in ["/a", "/a/x", "/a/y", "/a/z", "/b", "/b/empty"] {
        fs.mkdir(d, 0o755).unwrap();
    }
    fs.create("/a/file").unwrap();
    assert_eq!(
        (links(&fs, "/"), links(&fs, "/a"), links(&fs, "/b")),
        (4, 5, 3)
    );
    fs.rmdir("/a/z").unwrap();
    fs.rename("/a/y", "/a/w").unwrap(); // within one directory
    fs.rename("/a/x", "/b/empty").unwrap(); // across, replacing an empty directory
    fs.rename("/a/file", "/b/file").unwrap(); // a file moves: no link changes
    fs.mkdir("/b/empty/deeper", 0o755).unwrap();
    let expected = [("/", 4), ("/a", 3), ("/b", 3), ("/b/empty", 3), ("/a/w", 2)];
    let check = |fs: &Fs| {
        for (path, n) in expected {
            assert_eq!(links(fs, path), n, "{path}");
        }
    };
    check(&fs);
    recovered_then_reopened(fs, &shm.dir, check);
}

/// Drops `fs` without unmounting (a crash: recovery replays the journal) and runs `check`
/// on what opens; then unmounts cleanly and runs it on what opens from the snapshot.
fn recovered_then_reopened(fs: Fs, dir: &std::path::Path, check: impl Fn(&Fs)) {
    drop(fs);
    let fs = Fs::open(open_volume(dir), small_options()).unwrap();
    check(&fs);
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(dir), small_options()).unwrap();
    check(&fs);
}

/// A tree deeper than one system call's argument (`PATH_MAX`, 4096 bytes) — what `mkdir` in
/// a deep working directory or through `locus mount` builds — works like any other: made,
/// written, renamed and listed, then found again by recovery after a crash-like drop and
/// by a clean open after that.
#[test]
fn a_tree_deeper_than_path_max_works_and_recovers() {
    let shm = shm_volume("deep", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let mut dir = String::new();
    for level in 0..20 {
        dir = format!("{dir}/{}", format!("{level:02}").repeat(120));
        fs.mkdir(&dir, 0o755).unwrap();
    }
    assert!(dir.len() > 4096, "{} bytes", dir.len());
    let file = format!("{dir}/file");
    let f = fs.create(&file).unwrap();
    f.write_at(b"at the bottom", 0).unwrap();
    drop(f);
    fs.rename(&file, &format!("{dir}/moved")).unwrap();
    fs.symlink("moved", &format!("{dir}/link")).unwrap();
    let mut names: Vec<_> = fs
        .readdir(&dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["link", "moved"]);

    let check = |fs: &Fs| {
        assert_eq!(fs.readlink(&format!("{dir}/link")).unwrap(), "moved");
        let g = fs.open_read(&format!("{dir}/moved")).unwrap();
        let mut buf = [0u8; 32];
        let n = g.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"at the bottom");
        assert_eq!(fs.stat(&dir).unwrap().kind, Kind::Dir);
    };
    recovered_then_reopened(fs, &shm.dir, check);
}

#[test]
fn writes_reads_truncate_and_recovery_without_unmount() {
    let shm = shm_volume("data", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    let mut model = vec![0u8; 3 << 20];
    let writes: &[(u64, usize)] = &[
        (0, 4096),
        (4096 * 3, 8192),
        (100, 1000),
        (5000, 20_000),
        (1 << 20, 2 << 20),
        (12_345, 1),
        ((1 << 20) + 4096, 4096),
    ];
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let data = pattern(i as u64, offset, len);
        f.write_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    let mut z = fs.buffer(8192).unwrap();
    let data = pattern(99, 8192, 8192);
    z.write(0, &data).unwrap();
    f.write_buffer(z, 8192).unwrap();
    model[8192..16384].copy_from_slice(&data);
    let check = |f: &fs::File, model: &[u8]| {
        let mut back = vec![0u8; model.len() + 100];
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(n, model.len());
        assert!(back[..n] == *model, "contents differ");
    };
    check(&f, &model);
    fs.checkpoint().unwrap();
    let stats = fs.stats();
    assert_eq!(stats.records_pending, 0);
    assert!(stats.remapped_blocks > 0, "{stats:?}");
    check(&f, &model);

    f.set_len(10_000).unwrap();
    model.truncate(10_000);
    check(&f, &model);
    f.set_len(20_000).unwrap();
    model.resize(20_000, 0);
    check(&f, &model);
    let tail = pattern(7, 15_000, 3000);
    f.write_at(&tail, 15_000).unwrap();
    model[15_000..18_000].copy_from_slice(&tail);
    // Past the largest file: EFBIG, as the kernel's file systems answer, and nothing changes.
    let past = fs::MAX_FILE_SIZE;
    for err in [
        f.write_at(b"x", past).unwrap_err(),
        f.write_at(b"xy", past - 1).unwrap_err(),
        f.set_len(past + 1).unwrap_err(),
        f.punch_hole(past - 4096, 8192).unwrap_err(),
    ] {
        assert_eq!(err.errno(), libc::EFBIG, "{err}");
    }
    f.write_at(b"x", past - 1).unwrap();
    f.set_len(model.len() as u64).unwrap();
    check(&f, &model);

    // No unmount: stop as a crash would, with writes logged and not all checkpointed.
    let pending = fs.stats().records_pending;
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let f = fs.open_read("/f").unwrap();
    check(&f, &model);
    eprintln!("recovered with {pending} records pending at the crash");
    fs.checkpoint().unwrap();
    check(&f, &model);
}

/// With free memory left only in 4 KiB pieces, a snapshot cannot get one extent: it goes
/// into pieces named by an index, and the file system recovers from it with every file and
/// every later change in place.
#[test]
fn a_snapshot_goes_into_pieces_when_no_extent_can_hold_it() {
    let shm = shm_volume("snapshot-pieces", 64 << 20);
    let volume = open_volume(&shm.dir);
    let fs = Fs::format(Arc::clone(&volume), &small_format(), small_options()).unwrap();
    let name = |i: usize| format!("/a-file-with-a-name-long-enough-to-fill-pages-{i:04}");
    for i in 0..400 {
        let f = fs.create(&name(i)).unwrap();
        f.write_at(&[i as u8; 100], 0).unwrap();
    }
    fs.checkpoint().unwrap();
    // Take every free page, then give back every other one by address: no two free pages
    // are neighbours.
    let mut taken = Vec::new();
    while let Ok(page) = volume.alloc_local(4096) {
        taken.push(page);
    }
    assert!(taken.len() > 1000, "{} pages free", taken.len());
    for page in taken
        .iter()
        .filter(|p| (p.start.raw() / 4096).is_multiple_of(2))
    {
        volume.free(*page).unwrap();
    }
    // Metadata changes until the journal fills and a snapshot is written; then stop as a
    // crash would, so that recovery reads that snapshot.
    let before = fs.stats().snapshots;
    let mut changes = 0;
    while fs.stats().snapshots == before {
        assert!(changes < 100_000, "no snapshot after {changes} changes");
        fs.chmod(&name(changes % 400), 0o600 + (changes % 2) as u32)
            .unwrap();
        changes += 1;
    }
    fs.chmod(&name(7), 0o640).unwrap();
    fs.abandon();
    drop(volume);

    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert!(
        check.snapshot_pieces > 1,
        "the snapshot should be in pieces: {check:?}"
    );
    assert_eq!(check.files, 400);
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    for i in [0, 1, 199, 399] {
        let f = fs.open_read(&name(i)).unwrap();
        let mut buf = [0u8; 100];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 100);
        assert_eq!(buf, [i as u8; 100], "file {i}");
    }
    assert_eq!(fs.stat(&name(7)).unwrap().mode & 0o777, 0o640);
    assert_eq!(fs.readdir("/").unwrap().len(), 400);
    fs.unmount().unwrap();
}

/// Whole blocks of every write are remapped into the file without a copy, whatever their
/// length; only partial blocks are copied. The block a single-block overwrite replaces is
/// recycled: later single-block writes go into such pages instead of allocating.
#[test]
fn whole_blocks_are_remapped_and_only_partial_blocks_copied() {
    let shm = shm_volume("copy-or-remap", 128 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    let mut model = vec![0u8; 4 << 20];
    for (i, b) in model.iter_mut().enumerate() {
        *b = (i / 4096) as u8;
    }
    f.write_at(&model[..1 << 20], 0).unwrap();
    fs.checkpoint().unwrap();
    let start = fs.stats();
    // 4 KiB, 16 KiB, 60 KiB and 64 KiB overwrites at block boundaries, 8 KiB into a hole
    // past the end.
    let writes = [
        (0usize, 4096usize),
        (8192, 16384),
        (900 << 10, 4096),
        (4096 * 200, 60 << 10),
        (128 << 10, 64 << 10),
        (2 << 20, 8192),
    ];
    for (k, &(at, len)) in writes.iter().enumerate() {
        let data = vec![0xa0 + k as u8; len];
        f.write_at(&data, at as u64).unwrap();
        model[at..at + len].copy_from_slice(&data);
    }
    fs.checkpoint().unwrap();
    let after = fs.stats();
    let blocks: u64 = writes.iter().map(|&(_, len)| len as u64 / 4096).sum();
    assert_eq!(after.remapped_blocks - start.remapped_blocks, blocks);
    assert_eq!(
        after.copied_bytes, start.copied_bytes,
        "whole blocks were copied"
    );
    // Partial blocks: copied in place, and only they.
    f.write_at(&[0xee; 100], 5000).unwrap();
    f.write_at(&[0xef; 6000], 3 * 4096 + 10).unwrap();
    model[5000..5100].fill(0xee);
    model[3 * 4096 + 10..3 * 4096 + 6010].fill(0xef);
    fs.checkpoint().unwrap();
    let partial = fs.stats();
    assert_eq!(partial.copied_bytes - after.copied_bytes, 6100);
    assert_eq!(partial.remapped_blocks, after.remapped_blocks);
    // Single-block overwrites, a checkpoint between each: from the second on, each goes
    // into a block an earlier one replaced.
    for i in 0..20u64 {
        let at = (30 + 7 * i) * 4096;
        let data = vec![i as u8 + 1; 4096];
        f.write_at(&data, at).unwrap();
        model[at as usize..at as usize + 4096].copy_from_slice(&data);
        fs.checkpoint().unwrap();
    }
    let recycled = fs.stats().recycled_blocks - partial.recycled_blocks;
    assert!(
        recycled >= 19,
        "only {recycled} of 20 overwrites reused a replaced block"
    );
    let len = f.len() as usize;
    let mut back = vec![0u8; len];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), len);
    let mut expected = model[..len].to_vec();
    expected[1 << 20..2 << 20].fill(0);
    assert_eq!(back, expected);
    drop(f);
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.file_bytes, len as u64);
}

/// A 128 MiB volume whose file `/f` holds 64 MiB, laid out in 1 MiB writes and
/// checkpointed, with thousands of records between checkpoints (the checkpoint runs only
/// when a writer runs short, so the blocks overwrites replace are freed in bulk).
fn volume_mostly_one_file(name: &str) -> (ShmVolume, Fs, fs::File) {
    let shm = shm_volume(name, 128 << 20);
    let format = fs::FormatOptions {
        log_records: 8192,
        ..small_format()
    };
    let options = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        prelim_buffers: 4,
        prelim_buffer_bytes: 4 << 20,
        checkpoint_batch: 4096,
        defrag: true,
        ..fs::FsOptions::default()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, options).unwrap();
    let f = fs.create("/f").unwrap();
    let chunk = vec![0x11u8; 1 << 20];
    for at in (0..PERFORATED_FILE).step_by(1 << 20) {
        f.write_at(&chunk, at).unwrap();
    }
    fs.checkpoint().unwrap();
    (shm, fs, f)
}

const PERFORATED_FILE: u64 = 64 << 20;

/// The largest power-of-two extent, 4 KiB to 32 MiB, the volume can allocate now.
fn largest_free_extent(fs: &Fs) -> u64 {
    let mut len = 32u64 << 20;
    while len >= 4096 {
        if let Ok(extent) = fs.volume().alloc_local(len) {
            fs.volume().free(extent).unwrap();
            return len;
        }
        len /= 2;
    }
    0
}

/// `writes` 4 KiB writes of `byte` at block-aligned places of `/f` drawn from `seed`.
fn random_overwrites(f: &fs::File, seed: u64, byte: u8, writes: usize) {
    let page = vec![byte; 4096];
    let mut state = seed;
    for _ in 0..writes {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        f.write_at(&page, (state >> 24) % (PERFORATED_FILE / 4096) * 4096)
            .unwrap();
    }
}

/// Random 4 KiB overwrites of a file that fills most of the volume, with the checkpoint
/// running only when writers run short (so that the blocks they replace are freed in bulk):
/// the volume's free memory must stay in large pieces — a new thread's log area and journal,
/// a snapshot, a buffer need contiguous memory — instead of being cut into the 4 KiB holes
/// remapped overwrites leave. The checkpoint remaps a small overwrite only while the
/// recycled lists can take what it frees, and copies it in place otherwise.
#[test]
fn random_overwrites_do_not_cut_free_memory_into_pages() {
    let (_shm, fs, f) = volume_mostly_one_file("perforation");
    let before = largest_free_extent(&fs);
    random_overwrites(&f, 99, 0x22, 30_000);
    fs.checkpoint().unwrap();
    let after = largest_free_extent(&fs);
    let stats = fs.stats();
    assert!(
        after >= before.min(4 << 20),
        "the largest free extent fell from {before} to {after} bytes: {stats:?}"
    );
    assert!(
        stats.remapped_blocks > 0 && stats.recycled_blocks > 0 && stats.writer_remapped_blocks > 0,
        "{stats:?}"
    );
    // Remaps stayed within the lists' room: what they replaced went back to the volume in
    // pages only where a writer remapped a block while the checkpoint counted the room
    // (one a slot and batch at most). Writers that remapped blocks into pool pages on a
    // flag set when a batch found room put thousands of pages back this way each time the
    // checkpoint ran behind them, as an on-demand one here does.
    assert!(
        stats.unrecycled_blocks <= stats.checkpoint_batches,
        "{} replaced blocks went back to the volume in pages: {stats:?}",
        stats.unrecycled_blocks
    );
    // The pages kept for small writes are free memory: `statfs` counts them, so the
    // overwrites did not make the volume look fuller than the volume's allocator says.
    let allocator_free: u64 = fs.volume().stats().iter().map(|d| d.free_bytes).sum();
    let reported = fs.space().free_bytes;
    assert!(
        reported > allocator_free && (reported - allocator_free).is_multiple_of(4096),
        "statfs free {reported} vs the allocator's {allocator_free}"
    );
    drop(f);
    fs.unmount().unwrap();
}

/// Two threads of random 4 KiB overwrites of a file that fills most of the volume, far ahead
/// of a checkpoint that runs only when one of them runs short: each slot remaps blocks into
/// pool pages only within its share of the recycled lists' room, so what the two replace
/// goes to the lists and not back to the volume as pages, and the volume's free memory stays
/// in large pieces.
#[test]
fn two_writers_remap_only_into_room_the_lists_have() {
    let (shm, fs, f) = volume_mostly_one_file("perforation-2");
    let fs = Arc::new(fs);
    let before = largest_free_extent(&fs);
    std::thread::scope(|scope| {
        for t in 0..2u64 {
            let fs = Arc::clone(&fs);
            scope.spawn(move || {
                let f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
                random_overwrites(&f, 7 + t, 0x22 + t as u8, 25_000);
            });
        }
    });
    fs.checkpoint().unwrap();
    let after = largest_free_extent(&fs);
    let stats = fs.stats();
    assert!(
        stats.writer_remapped_blocks > 0 && stats.recycled_blocks > 0,
        "{stats:?}"
    );
    assert!(
        stats.unrecycled_blocks <= 2 * stats.checkpoint_batches,
        "{} replaced blocks went back to the volume in pages: {stats:?}",
        stats.unrecycled_blocks
    );
    assert!(
        after >= before.min(4 << 20),
        "the largest free extent fell from {before} to {after} bytes: {stats:?}"
    );
    drop(f);
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    // Every page the remaps moved is owned once, or free.
    Fs::check(&open_volume(&shm.dir)).unwrap();
}

/// A page a writer took from the recycled lists and whose record a newer write made void
/// (the block written twice before a checkpoint) goes back to the lists with its set, not to
/// the volume: the next writes find as many recycled pages as the overwrites freed.
#[test]
fn a_void_records_recycled_page_is_recycled_again() {
    let shm = shm_volume("void-recycle", 128 << 20);
    let options = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        checkpoint_batch: 4096,
        defrag: false,
        ..small_options()
    };
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), options).unwrap();
    let f = fs.create("/f").unwrap();
    f.write_at(&vec![0x11u8; 1 << 20], 0).unwrap();
    fs.checkpoint().unwrap();
    let page = vec![0x22u8; 4096];
    // Every other block: the blocks an overwrite replaces are never neighbours, so each goes
    // to the lists alone (a run of 16 replaced blocks would go back to the volume).
    let block = |i: u64| i * 2 * 4096;
    // 64 overwrites from the pool: the blocks they replace fill the lists.
    for i in 0..64 {
        f.write_at(&page, block(i)).unwrap();
    }
    fs.checkpoint().unwrap();
    let taken = |fs: &Fs| fs.stats().recycled_blocks;
    assert_eq!(taken(&fs), 0, "the lists were empty before");
    // A set's worth of writes from the lists, one block written twice: its first record is
    // void, and its page no file takes.
    let odd = |i: u64| block(i) + 4096;
    f.write_at(&page, odd(0)).unwrap();
    for i in 0..63 {
        f.write_at(&page, odd(i)).unwrap();
    }
    fs.checkpoint().unwrap();
    assert_eq!(taken(&fs), 64, "{:?}", fs.stats());
    // 64 pages came back: the 63 blocks replaced and the void record's page.
    for i in 64..128 {
        f.write_at(&page, odd(i)).unwrap();
    }
    fs.checkpoint().unwrap();
    assert_eq!(taken(&fs), 128, "every write found a recycled page");
    let mut back = vec![0u8; 4096];
    for at in [block(0), odd(0), odd(62), odd(64), odd(127)] {
        f.read_at(&mut back, at).unwrap();
        assert_eq!(back, page, "at {at}");
    }
    drop(f);
    fs.unmount().unwrap();
}

/// Random 4 KiB overwrites committed from caller-filled buffers (`Fs::buffer` +
/// `File::write_buffer`, how the NBD server writes), far more of them than the recycled lists
/// hold: each buffer takes a page an earlier overwrite replaced, so the lists never fill up
/// and the checkpoint keeps remapping — no overwrite is copied in place, and write
/// amplification stays that of the records alone.
#[test]
fn overwrites_from_lent_buffers_reuse_replaced_pages() {
    let shm = shm_volume("lent-recycle", 128 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    let size = 16u64 << 20;
    let mut model = vec![0x11u8; size as usize];
    f.write_at(&model, 0).unwrap();
    fs.checkpoint().unwrap();
    let start = fs.stats();
    let writes = 6000u64;
    let mut state = 7u64;
    for i in 0..writes {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = (state >> 24) % (size / 4096) * 4096;
        let mut buffer = fs.buffer(4096).unwrap();
        let data = [(i % 251) as u8 + 1; 4096];
        buffer.write(0, &data).unwrap();
        f.write_buffer(buffer, at).unwrap();
        model[at as usize..at as usize + 4096].copy_from_slice(&data);
        if i % 64 == 63 {
            fs.checkpoint().unwrap();
        }
    }
    fs.checkpoint().unwrap();
    let stats = fs.stats();
    assert_eq!(
        stats.copied_bytes, start.copied_bytes,
        "overwrites were copied in place: {stats:?}"
    );
    // Less the overwrites a newer one in the same batch made void.
    let remapped = stats.remapped_blocks - start.remapped_blocks;
    assert!(
        remapped > writes * 9 / 10,
        "{remapped} of {writes} remapped"
    );
    // Every buffer after the first checkpoint's worth took a replaced page, but for those
    // after an overwrite that a newer one made void (its page went back to the volume, and
    // it replaced nothing).
    let recycled = stats.recycled_blocks - start.recycled_blocks;
    assert!(
        recycled > writes * 9 / 10,
        "only {recycled} of {writes} buffers reused a replaced page"
    );
    let wa = (stats.media_bytes - start.media_bytes) as f64
        / (stats.caller_bytes - start.caller_bytes) as f64;
    assert!(wa < 1.1, "write amplification {wa:.3}: {stats:?}");
    let mut back = vec![0u8; size as usize];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), size as usize);
    assert!(back == model, "the file differs from what was written");
    drop(f);
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.file_bytes, size);
}

/// Each writing thread fills a preliminary buffer of its own; the room left in one is not
/// `NoSpace` for another. A thread that wrote 64 KiB holds a buffer with room to spare; a
/// second thread then fills the volume. Its `NoSpace` comes only after that room too is
/// given back, so afterwards the first thread finds nothing either, and `statfs`'s
/// available figure said so. (Before, the first thread went on writing into its buffer for
/// another 1.9 MiB after the second was told the volume was full, and `statfs` counted
/// neither that room nor the reserve right.)
#[test]
fn room_one_thread_holds_is_not_no_space_for_another() {
    use std::sync::mpsc;
    let shm = shm_volume("full-threads", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let chunk = vec![0x5a; 64 << 10];
    let first = fs.create("/first").unwrap();
    let second = fs.create("/second").unwrap();
    // The first thread lives through the test (a thread keeps its slot, and the slot's
    // buffers, while it runs): it writes at each offset it is sent, answering with the
    // result.
    let (ask, asked) = mpsc::channel::<u64>();
    let (answer, answered) = mpsc::channel::<fs::Result<()>>();
    std::thread::scope(|s| {
        s.spawn(|| {
            for offset in asked {
                answer.send(first.write_at(&chunk, offset)).unwrap();
            }
        });
        ask.send(0).unwrap();
        answered.recv().unwrap().unwrap();
        fs.checkpoint().unwrap();
        let space = fs.space();
        assert!(
            space.available_bytes < space.free_bytes,
            "the checkpoint's reserve is not available: {space:?}"
        );

        let mut written = 0u64;
        let err = loop {
            match second.write_at(&chunk, written) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(written < 64 << 20, "wrote more than the volume holds");
        };
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        fs.checkpoint().unwrap();
        let space = fs.space();
        assert!(
            space.available_bytes < chunk.len() as u64,
            "{} bytes available after NoSpace: {space:?}",
            space.available_bytes
        );
        ask.send(chunk.len() as u64).unwrap();
        let e = answered
            .recv()
            .unwrap()
            .expect_err("the volume is full for every thread");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");

        // What the second thread wrote is available again once its file is gone.
        drop(second);
        fs.unlink("/second").unwrap();
        fs.checkpoint().unwrap();
        assert!(
            fs.space().available_bytes >= written,
            "{written} bytes written and freed, {:?} now",
            fs.space()
        );
        drop(ask);
    });
    drop(first);
    fs.unmount().unwrap();
}

/// Overwrites on a nearly full volume wait for the checkpoint to free what they replace
/// instead of failing; a write that cannot fit gets `NoSpace` (ENOSPC), and the file system
/// goes on working and opens clean afterwards.
#[test]
fn a_full_volume_answers_no_space_and_keeps_working() {
    let shm = shm_volume("full", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/big").unwrap();
    let chunk = vec![0x5a; 1 << 20];
    let mut written = 0u64;
    let err = loop {
        match f.write_at(&chunk, written) {
            Ok(()) => written += 1 << 20,
            Err(e) => break e,
        }
        assert!(written < 64 << 20, "wrote more than the volume holds");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(written >= 40 << 20, "only {written} bytes fit");
    // Then in 4 KiB writes, to the last page writers may have.
    let page = vec![0x5a; 4096];
    let err = loop {
        match f.write_at(&page, written) {
            Ok(()) => written += 4096,
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    // The writers left the checkpoint its reserve: a snapshot still fits.
    let before = fs.stats().snapshots;
    let mut changes = 0u32;
    while fs.stats().snapshots == before {
        assert!(changes < 100_000, "no snapshot after {changes} changes");
        fs.chmod("/big", 0o600 + changes % 2).unwrap();
        changes += 1;
    }
    // The snapshot made the reserve what the metadata now needs (it counts what grew since
    // the last one): fill what that gave back.
    while f.write_at(&page, written).is_ok() {
        written += 4096;
    }
    // An overwrite needs room for its log buffer until the checkpoint has moved it; with
    // none left beyond the reserve it is refused too. Give 64 KiB back.
    let e = f.write_at(&page, 0).expect_err("no room left for a buffer");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    written -= 64 << 10;
    f.set_len(written).unwrap();
    // Keep overwriting the file in 4 KiB pieces, through 64 KiB of headroom: every write
    // must fit once the checkpoint has moved the earlier ones (copied in place) and freed
    // their buffers, so writers wait for it when memory runs short.
    let mut state = 12345u64;
    let mut model = vec![0x5a_u8; written as usize];
    for i in 0..5000u64 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 4096;
        let at = (state >> 20) % (written - len) / 4096 * 4096;
        let data = vec![(i % 251) as u8; len as usize];
        // Half through a buffer of its own (as `locus serve` writes), half through the pool.
        let done = if i % 2 == 0 {
            fs.buffer(len).and_then(|mut buffer| {
                buffer.write(0, &data)?;
                f.write_buffer(buffer, at)
            })
        } else {
            f.write_at(&data, at)
        };
        done.unwrap_or_else(|e| panic!("overwrite {i} at {at}: {e}"));
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
    }
    let mut back = vec![0u8; written as usize];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), written as usize);
    assert!(back == model, "the file differs from what was written");
    drop(f);
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.file_bytes, written);
}

/// A writer out of room has a snapshot taken before it answers `NoSpace` when the metadata
/// grew since the last one: the reserve counts that growth at its bound (each remapped
/// overwrite may split a run), twice, until a snapshot measures it, and the room it held
/// back is the writers' again. One snapshot per attempt: a volume that stays full answers
/// `NoSpace` without taking more.
#[test]
fn a_writer_out_of_room_has_the_metadata_growth_measured_first() {
    let shm = shm_volume("full-snapshot", 64 << 20);
    // Journals large enough that no snapshot comes from them filling up.
    let format = fs::FormatOptions {
        journal_bytes: 1 << 20,
        log_records: 2048,
        ..small_format()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, small_options()).unwrap();
    let f = fs.create("/scattered").unwrap();
    f.write_at(&vec![1u8; 4 << 20], 0).unwrap();
    fs.checkpoint().unwrap();
    // Scattered 4 KiB overwrites: every one remapped, every one counted as a split run.
    for i in 0..1024u64 {
        f.write_at(&[2u8; 4096], (i * 613) % 1024 * 4096).unwrap();
    }
    fs.checkpoint().unwrap();
    let snapshots = fs.stats().snapshots;
    let fill = fs.create("/fill").unwrap();
    let mut written = 0u64;
    for len in [1 << 20, 4096] {
        let chunk = vec![7u8; len];
        while fill.write_at(&chunk, written).is_ok() {
            written += len as u64;
        }
    }
    assert!(
        fs.stats().snapshots > snapshots,
        "no snapshot before NoSpace: {:?}",
        fs.stats()
    );
    // Full now, and nothing grew: the next attempts fail without a snapshot each.
    let taken = fs.stats().snapshots;
    for _ in 0..3 {
        let e = fill.write_at(&[7u8; 4096], written).expect_err("full");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    }
    assert!(fs.stats().snapshots <= taken + 1, "{:?}", fs.stats());
    drop((f, fill));
    fs.unmount().unwrap();
}

/// A shrinking truncate into the middle of a block works on a full volume: the page that
/// keeps the block's first bytes is lent by the checkpoint's reserve, and the block it
/// replaces goes back with the same record. (SQLite cuts its 32 KiB shared-memory index to
/// 3 bytes as it opens a database: without this, no database opened on a full volume, and
/// none could be opened to delete from it.)
#[test]
fn a_shrinking_truncate_works_on_a_full_volume() {
    let shm = shm_volume("full-truncate", 16 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let index = fs.create("/index").unwrap();
    let bytes: Vec<u8> = (0..32 << 10).map(|i| (i % 251) as u8).collect();
    index.write_at(&bytes, 0).unwrap();
    fs.checkpoint().unwrap();
    let fill = fs.create("/fill").unwrap();
    let mut written = 0u64;
    for len in [1 << 20, 4096, 1] {
        let chunk = vec![7u8; len];
        while fill.write_at(&chunk, written).is_ok() {
            written += len as u64;
        }
    }
    let e = fill
        .write_at(&[7], written)
        .expect_err("the volume is full");
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(fs.space().available_bytes < 4096, "{:?}", fs.space());

    index
        .set_len(3)
        .expect("a shrinking truncate on a full volume");
    let check = |fs: &Fs| {
        let index = fs.open_file("/index", OpenOptions::read_write()).unwrap();
        assert_eq!(index.stat().size, 32 << 10);
        let mut back = vec![1u8; 32 << 10];
        assert_eq!(index.read_at(&mut back, 0).unwrap(), 32 << 10);
        assert_eq!(back[..3], bytes[..3]);
        assert!(
            back[3..].iter().all(|&b| b == 0),
            "bytes past the cut came back"
        );
    };
    // Grown back into the room the cut freed: zeros past the 3 bytes kept.
    index.set_len(32 << 10).unwrap();
    check(&fs);
    drop((index, fill));
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    check(&fs);
    fs.unmount().unwrap();
}

/// A punched hole: the whole blocks inside go back to the volume and read as zeros, the
/// partial blocks at its edges are zeroed, the size stays. Writes logged before it into the
/// hole are dropped, writes after it kept — also when recovery replays them after a crash.
#[test]
fn punching_a_hole_frees_whole_blocks_and_orders_with_logged_writes() {
    let shm = shm_volume("punch", 64 << 20);
    let volume = open_volume(&shm.dir);
    let lazy = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        ..small_options()
    };
    let fs = Fs::format(Arc::clone(&volume), &small_format(), lazy.clone()).unwrap();
    let f = fs.create("/f").unwrap();
    let mut model: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251 + 1) as u8).collect();
    f.write_at(&model, 0).unwrap();
    fs.checkpoint().unwrap();

    // Logged, not checkpointed: block 5 before the hole (dropped), block 7 after (kept).
    f.write_at(&[0xee; 4096], 5 * 4096).unwrap();
    let (offset, len) = (3 * 4096 + 100, 10 * 4096);
    let free_before = volume.free_bytes();
    f.punch_hole(offset, len).unwrap();
    model[offset as usize..(offset + len) as usize].fill(0);
    f.write_at(&[0x77; 4096], 7 * 4096).unwrap();
    model[7 * 4096..8 * 4096].fill(0x77);
    // Blocks 4..13 were unmapped and their memory freed at once.
    assert!(
        volume.free_bytes() >= free_before + 9 * 4096,
        "{} bytes free before, {} after",
        free_before,
        volume.free_bytes()
    );
    let ranges = f.data_ranges(0, 1 << 20).unwrap();
    assert!(
        !ranges
            .iter()
            .any(|r| r.start < 7 * 4096 && r.end > 4 * 4096),
        "blocks 4..7 are a hole: {ranges:?}"
    );
    let check = |f: &fs::File, model: &[u8]| {
        let mut back = vec![0u8; 1 << 20];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), 1 << 20);
        assert!(back == model, "contents differ from the model");
        assert_eq!(f.len(), 1 << 20);
    };
    check(&f, &model);
    drop(f);
    fs.abandon();
    drop(volume);

    // Recovery replays the logged writes and the hole in their order.
    let fs = Fs::open(open_volume(&shm.dir), lazy).unwrap();
    let f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
    check(&f, &model);
    fs.checkpoint().unwrap();
    check(&f, &model);
    // Past the end nothing happens; inside one block it is zeros only.
    f.punch_hole(2 << 20, 4096).unwrap();
    assert_eq!(f.len(), 1 << 20);
    f.punch_hole(100 << 10, 10).unwrap();
    model[100 << 10..(100 << 10) + 10].fill(0);
    check(&f, &model);
    drop(f);
    // A hole larger than one I/O may be (no data moves): a sparse 3 GiB file.
    let g = fs.create("/sparse").unwrap();
    g.set_len(3 << 30).unwrap();
    g.write_at(&[9; 4096], (3 << 30) - 8192).unwrap();
    g.punch_hole(4096, (3 << 30) - 4096).unwrap();
    let mut back = [1u8; 4096];
    g.read_at(&mut back, (3 << 30) - 8192).unwrap();
    assert_eq!(back, [0; 4096]);
    assert!(g.data_ranges(0, 3 << 30).unwrap().is_empty());
    drop(g);
    fs.unmount().unwrap();
}

/// A write that grew the file keeps the size it reached when a hole is punched over it
/// before the checkpoint moved it (the checkpoint has none of its bytes left to move, but
/// must still record the size), across unmount and across a crash.
#[test]
fn a_hole_over_a_growing_write_keeps_the_size() {
    for crash in [false, true] {
        let shm = shm_volume(&format!("punch-size-{crash}"), 64 << 20);
        let lazy = fs::FsOptions {
            checkpoint: fs::CheckpointMode::OnDemand,
            ..small_options()
        };
        let fs = Fs::format(open_volume(&shm.dir), &small_format(), lazy.clone()).unwrap();
        let f = fs.create("/f").unwrap();
        f.write_at(&[1; 8192], 0).unwrap();
        fs.checkpoint().unwrap();
        // Grows the file to 40 KiB; then the hole takes every byte of it.
        f.write_at(&[2; 32768], 8192).unwrap();
        f.punch_hole(8192, 32768).unwrap();
        assert_eq!(f.len(), 40960);
        fs.checkpoint().unwrap();
        drop(f);
        if crash {
            fs.abandon();
        } else {
            fs.unmount().unwrap();
        }
        let fs = Fs::open(open_volume(&shm.dir), lazy).unwrap();
        let f = fs.open_read("/f").unwrap();
        assert_eq!(f.len(), 40960, "crash {crash}");
        let mut back = vec![9u8; 40960];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), 40960);
        assert!(back[..8192].iter().all(|&b| b == 1) && back[8192..].iter().all(|&b| b == 0));
        drop(f);
        fs.unmount().unwrap();
    }
}

/// `Fs::offline` reads a stopped file system's files as recovery would leave them —
/// checkpointed blocks, logged writes over them, holes as zeros — without opening it.
#[test]
fn a_stopped_file_system_reads_offline_as_recovery_would() {
    let shm = shm_volume("offline", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    let f = fs.create("/d/f").unwrap();
    let mut model = vec![0u8; 2 << 20];
    let mut seed = 7u64;
    for i in 0..300u64 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let offset = (seed >> 20) % (2 << 20);
        let len = ((seed >> 8) % 70_000).min((2 << 20) - offset) as usize;
        let data = pattern(i, offset, len);
        f.write_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        if i == 150 {
            fs.checkpoint().unwrap();
            f.punch_hole(300_000, 500_000).unwrap();
            model[300_000..800_000].fill(0);
        }
    }
    let g = fs.create("/d/g").unwrap();
    g.write_at(b"small", 10).unwrap();
    drop((f, g));
    fs.create("/top").unwrap();
    // A crash, with whatever the checkpoint had not moved yet still in the logs.
    fs.abandon();

    let volume = open_volume(&shm.dir);
    let offline = Fs::offline(&volume).unwrap();
    assert_eq!(offline.files_in("/d"), vec!["/d/f", "/d/g"]);
    assert_eq!(offline.files_in("/"), vec!["/top"]);
    assert_eq!(offline.size("/d/f").unwrap(), model.len() as u64);
    let mut back = vec![0xeeu8; model.len() + 4096];
    assert_eq!(offline.read_at("/d/f", 0, &mut back).unwrap(), model.len());
    assert!(back[..model.len()] == model[..], "offline contents differ");
    let mut piece = vec![0u8; 10_000];
    assert_eq!(
        offline.read_at("/d/f", 123_457, &mut piece).unwrap(),
        10_000
    );
    assert!(piece[..] == model[123_457..133_457]);
    let mut small = [0u8; 32];
    assert_eq!(offline.read_at("/d/g", 0, &mut small).unwrap(), 15);
    assert_eq!(&small[..15], b"\0\0\0\0\0\0\0\0\0\0small");
    assert_eq!(offline.read_at("/d/g", 15, &mut small).unwrap(), 0);
    assert!(matches!(
        offline.read_at("/nope", 0, &mut small),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        offline.read_at("/d", 0, &mut small),
        Err(FsError::IsDir(_))
    ));
    drop(offline);
    // Nothing changed: the file system opens and reads the same.
    let fs = Fs::open(volume, small_options()).unwrap();
    let f = fs.open_read("/d/f").unwrap();
    let mut again = vec![0u8; model.len()];
    f.read_at(&mut again, 0).unwrap();
    assert!(again == model);
}

/// A file opened by inode number is the file that number was given to, whatever its names
/// became — across renames, with no name left while open, and across a remount (numbers are
/// never reused) — and a number whose file is gone opens nothing.
#[test]
fn files_open_by_number_whatever_their_names() {
    let shm = shm_volume("by-number", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    let f = fs.create("/d/log").unwrap();
    f.write_at(b"first", 0).unwrap();
    let ino = f.ino();
    drop(f);
    fs.rename("/d/log", "/log.1").unwrap();
    fs.create("/d/log").unwrap().write_at(b"new", 0).unwrap();
    let rw = OpenOptions::read_write();
    let again = fs.open_ino(ino, rw).unwrap();
    let mut buf = [0u8; 8];
    let n = again.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"first");
    again.write_at(b"!", 5).unwrap();
    assert_eq!(fs.stat("/log.1").unwrap().size, 6);

    // Held open, its last name removed: still reachable by number until closed.
    fs.unlink("/log.1").unwrap();
    let third = fs.open_ino(ino, OpenOptions::default()).unwrap();
    drop(again);
    let n = third.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"first!");
    drop(third);
    assert!(matches!(fs.open_ino(ino, rw), Err(FsError::NotFound(_))));

    // Not a regular file, or never given out.
    let dir = fs.stat("/d").unwrap().ino;
    assert!(matches!(fs.open_ino(dir, rw), Err(FsError::IsDir(_))));
    assert!(matches!(
        fs.open_ino(1 << 40, rw),
        Err(FsError::NotFound(_))
    ));

    // A new file after a remount gets a number never seen before.
    let kept = fs.stat("/d/log").unwrap().ino;
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let n = fs.open_ino(kept, rw).unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"new");
    assert!(fs.create("/fresh").unwrap().ino() > ino.max(kept));
    assert!(matches!(fs.open_ino(ino, rw), Err(FsError::NotFound(_))));
}

/// A directory's path is found from its number however it was renamed since, and a number
/// that is not a live directory's finds none.
#[test]
fn a_directory_path_is_found_by_its_number() {
    let shm = shm_volume("dir-by-number", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    for dir in ["/a", "/a/b", "/a/b/c", "/a/x"] {
        fs.mkdir(dir, 0o755).unwrap();
    }
    let c = fs.stat("/a/b/c").unwrap().ino;
    assert_eq!(fs.dir_path(c).unwrap(), "/a/b/c");
    fs.rename("/a", "/z").unwrap();
    fs.rename("/z/b", "/z/x/y").unwrap();
    assert_eq!(fs.dir_path(c).unwrap(), "/z/x/y/c");
    assert_eq!(fs.dir_path(fs::ROOT_INO).unwrap(), "/");
    fs.create("/z/f").unwrap();
    let f = fs.stat("/z/f").unwrap().ino;
    assert!(matches!(fs.dir_path(f), Err(FsError::NotDir(_))));
    fs.rmdir("/z/x/y/c").unwrap();
    assert!(matches!(fs.dir_path(c), Err(FsError::NotFound(_))));
}

/// Every name under `dir` with its `lstat`, depth first in name order (reads no contents, so
/// no access time moves).
fn tree(fs: &Fs, dir: &str) -> Vec<(String, fs::Stat)> {
    let mut out = Vec::new();
    let mut entries = fs.readdir(dir).unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for entry in entries {
        let path = format!("{}/{}", dir.trim_end_matches('/'), entry.name);
        out.push((path.clone(), fs.lstat(&path).unwrap()));
        if entry.kind == Kind::Dir {
            out.extend(tree(fs, &path));
        }
    }
    out
}

/// Asserts two [`tree`]s are the same, naming the first entries that differ.
fn same_tree(got: &[(String, fs::Stat)], want: &[(String, fs::Stat)], what: &str) {
    let differ: Vec<_> = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g != w)
        .take(3)
        .collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{what}: the tree differs: {differ:?} ({} names, {} expected)",
        got.len(),
        want.len()
    );
}

/// A clean unmount after a small change to a file system of many files keeps the change in
/// the journals (sealed where they end) instead of writing a snapshot of every file: the
/// root is not rewritten, and the next open replays the kept records to the same tree —
/// names, sizes, modes, times, link counts, contents — without reporting a crash; access
/// times that reads moved are kept the same way. Past an eighth of the snapshot in the
/// journals, an unmount writes a snapshot again; so does every unmount of a file system
/// whose snapshot is small, and one asked to fold.
#[test]
fn a_small_change_to_many_files_is_kept_in_the_journals_at_unmount() {
    let shm = shm_volume("keep-journals", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    for d in 0..20 {
        fs.mkdir(&format!("/d{d}"), 0o755).unwrap();
        for f in 0..100u64 {
            let file = fs.create(&format!("/d{d}/f{f}")).unwrap();
            file.write_at(&pattern(d * 100 + f, 0, 100), 0).unwrap();
        }
    }
    fs.unmount().unwrap();
    let check = || Fs::check(&open_volume(&shm.dir)).unwrap();
    // (The journals may keep the last of those records: the checkpoint snapshotted as
    // they filled, and what came after may be under the share.)
    let snapshotted = check();

    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert!(!fs.replayed().any());
    assert_eq!(fs.replayed().kept_records, snapshotted.journal_records);
    fs.create("/d3/new")
        .unwrap()
        .write_at(b"kept in the journal", 7)
        .unwrap();
    fs.rename("/d4/f1", "/d5/moved").unwrap();
    fs.chmod("/d6/f2", 0o600).unwrap();
    fs.unlink("/d7/f3").unwrap();
    fs.link("/d8/f4", "/d8/second").unwrap();
    fs.create("/d9/f5").unwrap().write_at(b"over", 50).unwrap();
    // Moved into the files first: a block still in a log is not counted as allocated.
    fs.checkpoint().unwrap();
    let before = tree(&fs, "/");
    fs.unmount().unwrap();
    let kept = check();
    assert_eq!(
        kept.generation, snapshotted.generation,
        "an unmount that kept the journals writes no root"
    );
    assert!(kept.journal_records >= 6, "{kept:?}");
    assert!(kept.journal_bytes <= kept.snapshot_bytes / 8, "{kept:?}");

    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let replayed = fs.replayed();
    assert!(
        !replayed.any(),
        "a clean unmount is not a crash: {replayed:?}"
    );
    assert_eq!(replayed.kept_records, kept.journal_records);
    same_tree(&tree(&fs, "/"), &before, "after the replay");
    let read = |path: &str| {
        let f = fs.open_read(path).unwrap();
        let mut buf = vec![0u8; f.stat().size as usize];
        f.read_at(&mut buf, 0).unwrap();
        buf
    };
    assert_eq!(&read("/d3/new")[7..], b"kept in the journal");
    assert_eq!(read("/d5/moved"), pattern(401, 0, 100));
    let mut over = pattern(905, 0, 100);
    over[50..54].copy_from_slice(b"over");
    assert_eq!(read("/d9/f5"), over);
    assert_eq!(read("/d8/second"), read("/d8/f4"));
    // Those reads moved access times (each file was written after it was last read): the
    // unmount keeps them in the journal too, one record per file, and they come back.
    let read_tree = tree(&fs, "/");
    assert!(read_tree != before, "the reads moved access times");
    fs.unmount().unwrap();
    let after_reads = check();
    assert_eq!(after_reads.generation, kept.generation, "{after_reads:?}");
    assert!(
        after_reads.journal_records >= kept.journal_records + 4,
        "{after_reads:?}"
    );
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert!(!fs.replayed().any());
    same_tree(
        &tree(&fs, "/"),
        &read_tree,
        "access times kept in the journal",
    );
    fs.unmount().unwrap();

    // Changes past an eighth of the snapshot (each directory 72 to 96 bytes of journal, and
    // fewer than the writer's journal holds before the checkpoint would snapshot): the
    // unmount writes one.
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let dirs = after_reads.snapshot_bytes / 8 / 72 + 1;
    assert!(dirs * 96 < 48 << 10, "{dirs} directories fill the journal");
    for i in 0..dirs {
        fs.mkdir(&format!("/many{i}"), 0o755).unwrap();
    }
    fs.unmount().unwrap();
    let folded = check();
    assert!(folded.generation > after_reads.generation, "{folded:?}");
    assert_eq!(folded.journal_records, 0);

    // Asked to fold: a snapshot whatever the size.
    let fold = fs::FsOptions {
        fold_at_unmount: true,
        ..small_options()
    };
    let fs = Fs::open(open_volume(&shm.dir), fold).unwrap();
    fs.mkdir("/one-more", 0o755).unwrap();
    fs.unmount().unwrap();
    let asked = check();
    assert!(asked.generation > folded.generation);
    assert_eq!(asked.journal_records, 0);

    // A small file system: its snapshot is cheaper than replaying what changed.
    let small = shm_volume("keep-journals-small", 64 << 20);
    let fs = Fs::format(open_volume(&small.dir), &small_format(), small_options()).unwrap();
    fs.unmount().unwrap();
    let empty = Fs::check(&open_volume(&small.dir)).unwrap();
    let fs = Fs::open(open_volume(&small.dir), small_options()).unwrap();
    fs.create("/f").unwrap().write_at(b"x", 0).unwrap();
    fs.unmount().unwrap();
    let one = Fs::check(&open_volume(&small.dir)).unwrap();
    assert!(one.generation > empty.generation);
    assert_eq!(one.journal_records, 0);
}

/// A writer's journal grows with the file system (to a quarter of the last snapshot), so
/// that making many files does not cost a snapshot of all of them every few thousand
/// operations: 12,000 files made from one thread on a file system formatted with 64 KiB
/// journals. The slots' areas grow, snapshots stay far fewer than fixed journals would
/// need, and the files are all there after a crash (the grown journals replayed) and after
/// an unmount; then more are made in the grown journal and kept across a second crash.
#[test]
fn writers_journals_grow_with_the_file_system() {
    let shm = shm_volume("journals-grow", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    // The thread's slot is made by its first operation.
    fs.mkdir("/d0", 0o755).unwrap();
    let before = fs.stats();
    let files = 12_000;
    for d in 0..12 {
        if d > 0 {
            fs.mkdir(&format!("/d{d}"), 0o755).unwrap();
        }
        for i in 0..files / 12 {
            fs.create(&format!("/d{d}/a-file-named-{i:05}")).unwrap();
        }
    }
    // Metadata reaches the snapshot through the checkpoint: once it has caught up, the last
    // snapshot's size set the journals' (a snapshot each time one passed its mark).
    fs.checkpoint().unwrap();
    let after = fs.stats();
    assert!(
        after.slot_bytes >= before.slot_bytes + (256 << 10),
        "the writer's journal grew: slot areas {} bytes before, {} after",
        before.slot_bytes,
        after.slot_bytes
    );
    // With the 64 KiB journal a snapshot came every 48 KiB of records: 22 for these files.
    let snapshots = after.snapshots - before.snapshots;
    assert!(snapshots <= 15, "{snapshots} snapshots for {files} creates");
    let count = |fs: &Fs| {
        (0..12)
            .map(|d| fs.readdir(&format!("/d{d}")).unwrap().len())
            .sum::<usize>()
    };
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(count(&fs), files, "after a crash");
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(count(&fs), files, "after an unmount");
    for i in 0..2_000 {
        fs.create(&format!("/d0/more-{i:05}")).unwrap();
    }
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(count(&fs), files + 2_000, "after a second crash");
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files as usize, files + 2_000, "{check:?}");
}

/// Each snapshot counts how long it held metadata operations off: the last pause, the
/// longest and their sum, which an operator reads to see the stalls a file system of many
/// files has (none before the first snapshot).
#[test]
fn snapshots_count_how_long_they_held_metadata_operations_off() {
    let shm = shm_volume("snapshot-pauses", 64 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let fresh = fs.stats();
    assert_eq!(
        (
            fresh.snapshot_pause_last_ns,
            fresh.snapshot_pause_max_ns,
            fresh.snapshot_pause_total_ns
        ),
        (0, 0, 0),
        "{fresh:?}"
    );
    for i in 0..200 {
        fs.create(&format!("/f{i}")).unwrap();
    }
    let mut pauses = Vec::new();
    for _ in 0..2 {
        let before = fs.stats().snapshots;
        let mut changes = 0;
        while fs.stats().snapshots == before {
            assert!(changes < 100_000, "no snapshot after {changes} changes");
            fs.chmod(
                &format!("/f{}", changes % 200),
                0o600 + (changes % 2) as u32,
            )
            .unwrap();
            changes += 1;
        }
        let stats = fs.stats();
        assert!(stats.snapshot_pause_last_ns > 0, "{stats:?}");
        pauses.push(stats.snapshot_pause_last_ns);
    }
    let stats = fs.stats();
    assert!(stats.snapshot_bytes > 0, "{stats:?}");
    assert!(
        stats.snapshot_pause_max_ns >= *pauses.iter().max().unwrap(),
        "{stats:?} after pauses {pauses:?}"
    );
    assert!(
        stats.snapshot_pause_total_ns >= pauses.iter().sum::<u64>()
            && stats.snapshot_pause_total_ns >= stats.snapshot_pause_max_ns,
        "{stats:?} after pauses {pauses:?}"
    );
    fs.unmount().unwrap();
}
