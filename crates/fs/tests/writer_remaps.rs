//! Single-block overwrites that their writers remap into the file's block table themselves
//! (chunks the checkpoint shared with the writers): what they leave is what the writes
//! asked for — read back live, after holes, truncations and removals that overtake records
//! the checkpoint has not recorded yet, after a crash with such records in the logs, and in
//! the memory the volume counts as owned (`Fs::check`: no page freed twice, or lost).

use std::collections::BTreeMap;

use fs::{CheckpointMode, Fs, FsOptions, OpenOptions};
use rand::{Rng, SeedableRng};
use testkit::*;

const FILE: u64 = 4 << 20;

fn options(checkpoint: CheckpointMode) -> FsOptions {
    FsOptions {
        checkpoint,
        ..small_options()
    }
}

/// A file of `FILE` bytes laid out whole, checkpointed, then overwritten block by block
/// until the writers remap their own blocks.
fn laid_out(fs: &Fs, path: &str, model: &mut Vec<u8>) -> fs::File {
    let f = fs.create(path).unwrap();
    *model = pattern(1, 0, FILE as usize);
    f.write_at(model, 0).unwrap();
    fs.checkpoint().unwrap();
    f
}

/// A file system formatted in a fresh volume named `name`, its checkpoint on demand, with
/// `/f` [`laid_out`] (and `model` its bytes).
fn fresh(name: &str, model: &mut Vec<u8>) -> (ShmVolume, Fs, fs::File) {
    let shm = shm_volume(name, 256 << 20);
    let fs = Fs::format(
        open_volume(&shm.dir),
        &small_format(),
        options(CheckpointMode::OnDemand),
    )
    .unwrap();
    let f = laid_out(&fs, "/f", model);
    (shm, fs, f)
}

fn overwrite(f: &fs::File, model: &mut Vec<u8>, block: u64, tag: u64) {
    let at = block * 4096;
    let data = pattern(tag, at, 4096);
    f.write_at(&data, at).unwrap();
    if model.len() < at as usize + 4096 {
        model.resize(at as usize + 4096, 0);
    }
    model[at as usize..at as usize + 4096].copy_from_slice(&data);
}

/// Random single-block overwrites until the writers remap their own (the first ones go
/// through the checkpoint, which then shares the file's chunks), then 300 more left pending.
fn overwrites_left_pending(fs: &Fs, f: &fs::File, model: &mut Vec<u8>, rng: &mut impl Rng) {
    for k in 0..200 {
        overwrite(f, model, rng.random_range(0..FILE / 4096), k);
        if k % 50 == 49 {
            fs.checkpoint().unwrap();
        }
    }
    for k in 0..300 {
        overwrite(f, model, rng.random_range(0..FILE / 4096), 1000 + k);
    }
}

fn check(f: &fs::File, model: &[u8], when: &str) {
    let mut got = vec![0u8; model.len()];
    let n = f.read_at(&mut got, 0).unwrap();
    assert_eq!(n, model.len(), "{when}: length");
    if let Some(i) = (0..model.len()).find(|&i| got[i] != model[i]) {
        panic!(
            "{when}: byte {i} (block {}) is {:#x}, the model has {:#x}",
            i / 4096,
            got[i],
            model[i]
        );
    }
}

fn checked_volume(dir: &std::path::Path, when: &str) {
    let volume = open_volume(dir);
    let check = Fs::check(&volume).unwrap_or_else(|e| panic!("{when}: check: {e}"));
    eprintln!("{when}: {check:?}");
}

/// Random single-block overwrites interleaved with partial writes, holes and truncations,
/// read back against a model after every step, then across a crash with records pending
/// (the checkpoint runs only when asked), an unmount, and the volume's check of what is
/// owned.
#[test]
fn writers_remaps_agree_with_the_model_across_cuts_and_crashes() {
    let mut model = Vec::new();
    let (shm, mut fs, mut f) = fresh("writer-remaps", &mut model);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let blocks = FILE / 4096;
    let mut tag = 100;
    // Blocks the writers remapped, over the file system's openings.
    let mut by_writers = 0;
    for step in 0..3000u64 {
        tag += 1;
        let block = rng.random_range(0..blocks);
        match rng.random_range(0..100) {
            0..80 => {
                if (block + 1) * 4096 <= model.len() as u64 {
                    overwrite(&f, &mut model, block, tag);
                }
            }
            80..88 => {
                // A partial write inside a block (the overlay's), maybe over a remapped one.
                let at = block * 4096 + rng.random_range(0..4000);
                let len = rng.random_range(1..96);
                let data = pattern(tag, at, len);
                f.write_at(&data, at).unwrap();
                let end = at as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&data);
            }
            88..92 => {
                let len = rng.random_range(1..5) * 4096 - rng.random_range(0..100);
                let at = block * 4096 + rng.random_range(0..100);
                f.punch_hole(at, len).unwrap();
                let end = (at + len).min(model.len() as u64) as usize;
                if (at as usize) < end {
                    model[at as usize..end].fill(0);
                }
            }
            92..94 => {
                // Cut back (mid-block at times), then grown again by the overwrites.
                let size = (FILE - rng.random_range(0..64) * 4096) - rng.random_range(0..2) * 77;
                f.set_len(size).unwrap();
                model.resize(size as usize, 0);
                f.set_len(FILE).unwrap();
                model.resize(FILE as usize, 0);
            }
            94..98 => fs.checkpoint().unwrap(),
            _ => {
                // A crash with what the checkpoint has not recorded still in the logs.
                drop(f);
                by_writers += fs.stats().writer_remapped_blocks;
                fs.abandon();
                fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::OnDemand)).unwrap();
                f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
                check(&f, &model, &format!("after the crash at step {step}"));
            }
        }
        if step % 64 == 0 {
            check(&f, &model, &format!("step {step}"));
        }
    }
    check(&f, &model, "at the end");
    fs.checkpoint().unwrap();
    by_writers += fs.stats().writer_remapped_blocks;
    eprintln!("blocks the writers remapped: {by_writers}");
    assert!(
        by_writers > 500,
        "the writers remapped {by_writers} blocks themselves"
    );
    check(&f, &model, "checkpointed");
    drop(f);
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "unmounted");
    let fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::Background)).unwrap();
    let f = fs.open_read("/f").unwrap();
    check(&f, &model, "reopened");
    drop(f);
    fs.unmount().unwrap();
}

/// Files removed while their writers' remaps wait for the checkpoint: the pages those
/// replaced still go back to the volume, and the pages the files had go back once — the
/// volume's free memory after the removals is what it was before the files.
#[test]
fn a_file_removed_with_remaps_pending_gives_back_every_page_once() {
    let shm = shm_volume("writer-remaps-removed", 256 << 20);
    // The baseline: a file made and removed (the thread's slot and the metadata made),
    // after a reopen.
    let fs = Fs::format(
        open_volume(&shm.dir),
        &small_format(),
        options(CheckpointMode::OnDemand),
    )
    .unwrap();
    laid_out(&fs, "/warm-up", &mut Vec::new());
    fs.unlink("/warm-up").unwrap();
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::OnDemand)).unwrap();
    let free_before = fs.space().free_bytes;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for round in 0..6 {
        let path = format!("/r{round}");
        let mut model = Vec::new();
        let f = laid_out(&fs, &path, &mut model);
        overwrites_left_pending(&fs, &f, &mut model, &mut rng);
        check(&f, &model, &path);
        if round % 2 == 0 {
            // Removed while open: destroyed at the close, its records still pending.
            fs.unlink(&path).unwrap();
            drop(f);
        } else {
            drop(f);
            fs.unlink(&path).unwrap();
        }
    }
    fs.checkpoint().unwrap();
    let stats = fs.stats();
    assert!(
        stats.writer_remapped_blocks > 0,
        "no remap by a writer: {stats:?}"
    );
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "after the removals");
    let fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::Background)).unwrap();
    assert_eq!(
        fs.space().free_bytes,
        free_before,
        "free memory after the removed files"
    );
    fs.unmount().unwrap();
}

/// A block a writer remapped, then cut out of the file (a hole punched, a truncation below
/// it) before the checkpoint recorded the write: after the checkpoint and a crash, replay
/// must leave the cut in place — the write's mapping, recorded after the cut, would map the
/// freed page back.
#[test]
fn a_cut_after_a_writers_remap_stays_cut_across_a_crash() {
    let mut model = Vec::new();
    let (shm, mut fs, mut f) = fresh("writer-remaps-cut", &mut model);
    // The chunks get shared with the writers: an overwrite in each, checkpointed.
    for chunk in 0..FILE / (2 << 20) {
        overwrite(&f, &mut model, chunk * 512 + 3, 2);
    }
    fs.checkpoint().unwrap();
    for (round, block) in [10u64, 700, 300, 1000].into_iter().enumerate() {
        let before = fs.stats().writer_remapped_blocks;
        overwrite(&f, &mut model, block, 10 + round as u64);
        if round % 2 == 0 {
            f.punch_hole(block * 4096, 4096).unwrap();
            model[block as usize * 4096..(block as usize + 1) * 4096].fill(0);
        } else {
            let size = block * 4096 + 100;
            f.set_len(size).unwrap();
            model.truncate(size as usize);
        }
        // Something the writer remaps after the cut, so that the page the cut freed may be
        // used again.
        overwrite(&f, &mut model, 5, 20 + round as u64);
        fs.checkpoint().unwrap();
        assert!(
            fs.stats().writer_remapped_blocks > before,
            "round {round}: the writer did not remap block {block}"
        );
        check(&f, &model, &format!("round {round}, live"));
        drop(f);
        fs.abandon();
        fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::OnDemand)).unwrap();
        f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
        check(&f, &model, &format!("round {round}, after a crash"));
        // Shared again after the reopen.
        overwrite(&f, &mut model, 7, 30 + round as u64);
        overwrite(&f, &mut model, 515, 30 + round as u64);
        overwrite(&f, &mut model, 1030, 30 + round as u64);
        fs.checkpoint().unwrap();
    }
    drop(f);
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "after the cuts");
}

/// A sparse file past 512 MiB: chunks 256 apart (one overlay shard) each keep their shared
/// table, so overwrites alternating between them are all remapped by their writers, and the
/// file reads back right across a crash.
#[test]
fn chunks_of_one_shard_in_a_large_file_all_take_writer_remaps() {
    const MIB2: u64 = 2 << 20;
    let shm = shm_volume("writer-remaps-large", 256 << 20);
    let mut fs = Fs::format(
        open_volume(&shm.dir),
        &small_format(),
        options(CheckpointMode::OnDemand),
    )
    .unwrap();
    let f = fs.create("/big").unwrap();
    // Two scattered blocks in each of chunks 3, 259 and 515 (one shard), so each is a table.
    let chunks = [3u64, 259, 515];
    let blocks: Vec<u64> = chunks
        .iter()
        .flat_map(|c| [c * MIB2 / 4096, c * MIB2 / 4096 + 9])
        .collect();
    // Each block's last write.
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut tag = 1;
    let mut write = |f: &fs::File, block: u64, model: &mut BTreeMap<u64, u64>| {
        tag += 1;
        f.write_at(&pattern(tag, block * 4096, 4096), block * 4096)
            .unwrap();
        model.insert(block, tag);
    };
    for &b in &blocks {
        write(&f, b, &mut model);
    }
    fs.checkpoint().unwrap();
    // One overwrite in each chunk, checkpointed: the checkpoint remaps them and shares the
    // three chunks' tables, one after another, with the one shard.
    for &b in &blocks {
        write(&f, b, &mut model);
    }
    fs.checkpoint().unwrap();
    let before = fs.stats().writer_remapped_blocks;
    let rounds = 20;
    for _ in 0..rounds {
        for &b in &blocks {
            write(&f, b, &mut model);
        }
    }
    // Counted as the checkpoint records them.
    fs.checkpoint().unwrap();
    let by_writers = fs.stats().writer_remapped_blocks - before;
    assert_eq!(
        by_writers,
        rounds * blocks.len() as u64,
        "overwrites the writers remapped, of {} in chunks {chunks:?}",
        rounds * blocks.len() as u64
    );
    let read_back = |f: &fs::File, model: &BTreeMap<u64, u64>, when: &str| {
        for (&block, &tag) in model {
            let mut got = vec![0u8; 4096];
            assert_eq!(f.read_at(&mut got, block * 4096).unwrap(), 4096);
            assert!(
                got == pattern(tag, block * 4096, 4096),
                "{when}: block {block} is not write {tag}"
            );
        }
        assert_eq!(f.len(), (blocks.last().unwrap() + 1) * 4096, "{when}: size");
    };
    read_back(&f, &model, "live");
    // A crash with a last round's records not checkpointed.
    for &b in &blocks {
        write(&f, b, &mut model);
    }
    read_back(&f, &model, "before the crash");
    drop(f);
    fs.abandon();
    fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::OnDemand)).unwrap();
    let f = fs.open_file("/big", OpenOptions::read_write()).unwrap();
    read_back(&f, &model, "after the crash");
    drop(f);
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "unmounted");
}

/// A snapshot written while records of the writers' own remaps wait for the checkpoint
/// encodes the files' block tables with those blocks in them, under the retired marks of
/// before: after a crash then, the recovered map and the live records named the same pages,
/// and the volume would not open ("claim the same memory"). It opens, reads what was
/// written, and the volume's check finds every page owned once.
#[test]
fn a_snapshot_taken_with_writers_remaps_pending_survives_a_crash() {
    let mut model = Vec::new();
    let (shm, fs, f) = fresh("writer-remaps-snapshot", &mut model);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    overwrites_left_pending(&fs, &f, &mut model, &mut rng);
    let pending = fs.stats().records_pending;
    // Metadata operations until their journal asks for a snapshot, which the checkpoint (on
    // demand: no batch) writes with those records still pending.
    let snapshots = fs.stats().snapshots;
    let mut made = 0;
    while fs.stats().snapshots == snapshots {
        fs.mkdir(&format!("/d{made}"), 0o755).unwrap();
        made += 1;
        assert!(made < 1_000_000, "no snapshot after {made} directories");
    }
    assert!(
        fs.stats().records_pending >= pending && pending > 100,
        "{pending} records pending before the snapshot, {} after",
        fs.stats().records_pending
    );
    check(&f, &model, "before the crash");
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), options(CheckpointMode::OnDemand))
        .unwrap_or_else(|e| panic!("recovery after a snapshot with remaps pending: {e}"));
    let f = fs.open_file("/f", OpenOptions::read_write()).unwrap();
    check(&f, &model, "after the crash");
    // The recovered records move into the file, and the file stays what was written.
    fs.checkpoint().unwrap();
    check(&f, &model, "checkpointed after the crash");
    drop(f);
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "unmounted");
}

/// Random overwrites of 2 to 15 whole blocks: their blocks are remapped, not copied into
/// the file's, however long they go on — the pages the blocks they replace go back as are
/// what the next such writes are placed in. (When only single-block writes took those
/// pages, the lists filled and the checkpoint copied every such write: write amplification
/// 1.93–1.96.)
#[test]
fn short_multi_block_overwrites_are_remapped_not_copied() {
    let mut model = Vec::new();
    let (_shm, fs, f) = fresh("multi-block-overwrites", &mut model);
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let before = fs.stats();
    let mut written = 0;
    for k in 0..6000u64 {
        let blocks = rng.random_range(2..16);
        let first = rng.random_range(0..FILE / 4096 - blocks);
        let at = first * 4096;
        let data = pattern(10_000 + k, at, (blocks * 4096) as usize);
        f.write_at(&data, at).unwrap();
        model[at as usize..(at + blocks * 4096) as usize].copy_from_slice(&data);
        written += blocks * 4096;
        if k % 100 == 99 {
            fs.checkpoint().unwrap();
        }
    }
    fs.checkpoint().unwrap();
    check(&f, &model, "after the overwrites");
    let after = fs.stats();
    let copied = after.copied_bytes - before.copied_bytes;
    eprintln!(
        "{written} bytes written, {copied} copied by the checkpoint, {} blocks recycled",
        after.recycled_blocks - before.recycled_blocks
    );
    assert!(
        copied * 20 < written,
        "the checkpoint copied {copied} of {written} bytes written"
    );
    drop(f);
    fs.unmount().unwrap();
}

/// Overwrites of a few whole blocks at the places of earlier ones of the same size take the
/// runs those freed whole (one record a write), and the checkpoint remaps every write placed
/// in recycled pages however full the lists are: such a write hands its pages to the file
/// as the blocks it replaces come back, so it needs none of their room. A first round of
/// writes placed in buffers fills the lists halfway; a second round twice as long takes all
/// of them and then buffers again, and its one batch frees more than the lists have room
/// for. When room was asked of every write, that batch copied a third of the second round.
#[test]
fn overwrites_in_recycled_runs_need_no_room_in_the_lists() {
    const BLOCKS: u64 = 15;
    const SLOT: u64 = BLOCKS * 4096;
    // A 128 MiB volume: the recycled lists hold their fewest pages, 1024.
    let shm = shm_volume("recycled-runs", 128 << 20);
    let fs = Fs::format(
        open_volume(&shm.dir),
        &small_format(),
        FsOptions {
            prelim_buffers: 8,
            prelim_buffer_bytes: 2 << 20,
            checkpoint_batch: 4096,
            ..options(CheckpointMode::OnDemand)
        },
    )
    .unwrap();
    let f = fs.create("/f").unwrap();
    let mut model = pattern(1, 0, 16 << 20);
    f.write_at(&model, 0).unwrap();
    fs.checkpoint().unwrap();
    // Slots apart, so that no two blocks a round replaces are neighbours (neighbours are
    // freed as one run, too long for the lists).
    let slots = |slots: &mut dyn Iterator<Item = u64>, tag: u64, model: &mut Vec<u8>| {
        for slot in slots {
            let at = slot * SLOT;
            let data = pattern(tag + slot, at, SLOT as usize);
            f.write_at(&data, at).unwrap();
            model[at as usize..(at + SLOT) as usize].copy_from_slice(&data);
        }
        fs.checkpoint().unwrap();
    };
    // 34 writes of 15 blocks: 510 pages, half what the lists hold.
    slots(&mut (0..34).map(|i| 2 * i), 100, &mut model);
    let before = fs.stats();
    // 68 more: the first 34 in the lists' runs, the rest in buffers; their batch frees
    // 1020 pages.
    slots(&mut (0..68).map(|i| 2 * i + 1), 1000, &mut model);
    let after = fs.stats();
    check(&f, &model, "after the overwrites");
    let recycled = after.recycled_blocks - before.recycled_blocks;
    let records = after.checkpointed_records - before.checkpointed_records;
    let copied = after.copied_bytes - before.copied_bytes;
    eprintln!(
        "{recycled} blocks placed in recycled pages, {records} records, {copied} bytes copied"
    );
    assert_eq!(recycled, 34 * BLOCKS, "the lists' runs, every one");
    assert_eq!(records, 68, "each write in one run, one record");
    assert_eq!(copied, 0, "the checkpoint copied");
    drop(f);
    fs.unmount().unwrap();
    checked_volume(&shm.dir, "after the unmount");
}
