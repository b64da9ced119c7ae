//! Aging: a database-like workload (random page overwrites, appends, truncations, creates and
//! deletes) drives a small volume past 90% full, round after round. After each round, writes
//! of 4 KiB to 8 MiB at unaligned offsets succeed whenever the free blocks beyond the
//! checkpoint's reserve hold them, and every file reads back as a model says. At the end the
//! file system unmounts, checks clean and reopens with the same contents. Seeded: a failure
//! reproduces.

use std::collections::BTreeMap;

use fs::{ErrorKind, Fs, FsOptions, OpenOptions};
use testkit::*;

const BLOCK: u64 = 4096;
const PAGE: u64 = 4096;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 17
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The files and what they hold.
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    next: u64,
}

fn write(fs: &Fs, model: &mut Model, name: &str, data: &[u8], at: u64) -> Result<(), ErrorKind> {
    let f = fs
        .open_file(name, OpenOptions::read_write())
        .expect("model file exists");
    match f.write_at(data, at) {
        Ok(()) => {
            let content = model.files.get_mut(name).expect("modelled");
            let end = (at as usize) + data.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[at as usize..end].copy_from_slice(data);
            Ok(())
        }
        Err(e) => Err(e.kind()),
    }
}

fn fill_ratio(fs: &Fs) -> f64 {
    let volume = fs.volume();
    1.0 - volume.free_bytes() as f64 / volume.data_bytes() as f64
}

/// One step of the workload; ENOSPC is an answer, anything else a failure.
fn step(fs: &Fs, model: &mut Model, rng: &mut Rng) {
    let choice = rng.below(100);
    let names: Vec<String> = model.files.keys().cloned().collect();
    let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
    let result = if names.len() < 4 || choice < 3 {
        let name = format!("/t{}", model.next);
        model.next += 1;
        fs.create(&name).expect("create");
        model.files.insert(name, Vec::new());
        Ok(())
    } else if choice < 55 {
        // A page overwrite inside a table.
        let name = pick(rng);
        let len = model.files[&name].len() as u64;
        let at = rng.below(len.max(PAGE) / PAGE) * PAGE;
        let data = pattern(rng.next(), at, PAGE as usize);
        write(fs, model, &name, &data, at)
    } else if choice < 88 {
        // An append (a log, a growing table), of up to 256 KiB.
        let name = pick(rng);
        let len = model.files[&name].len() as u64;
        let size = 1 + rng.below(256 << 10);
        let data = pattern(rng.next(), len, size as usize);
        write(fs, model, &name, &data, len)
    } else if choice < 98 {
        // A truncation: up to 128 KiB off the end (a log trimmed, a table vacuumed).
        let name = pick(rng);
        let len = model.files[&name].len() as u64;
        let to = len.saturating_sub(rng.below(128 << 10));
        let f = fs.open_file(&name, OpenOptions::read_write()).unwrap();
        match f.set_len(to) {
            Ok(()) => {
                model.files.get_mut(&name).unwrap().resize(to as usize, 0);
                Ok(())
            }
            Err(e) => Err(e.kind()),
        }
    } else {
        let name = pick(rng);
        fs.unlink(&name).expect("unlink");
        model.files.remove(&name);
        Ok(())
    };
    match result {
        Ok(()) | Err(ErrorKind::NoSpace) => {}
        Err(other) => panic!("workload step: {other:?}"),
    }
}

fn verify(fs: &Fs, model: &Model, when: &str) {
    for (name, content) in &model.files {
        let f = fs.open_file(name, OpenOptions::read_write()).unwrap();
        assert_eq!(f.len(), content.len() as u64, "{name} size {when}");
        let mut back = vec![0u8; content.len()];
        f.read_at(&mut back, 0).unwrap();
        assert!(back == *content, "{name} contents {when}");
    }
}

#[test]
fn a_volume_aged_past_90_percent_full_keeps_taking_every_write_that_fits() {
    age("aging", false);
}

/// The same with data checksums: the checkpoint then rebuilds every partial block in a fresh
/// page, which the writers' reserve must leave it; every read verifies every block, and the
/// aged volume scrubs clean.
#[test]
fn with_data_checksums_an_aged_volume_keeps_its_reserve_and_scrubs_clean() {
    age("aging-crc", true);
}

fn age(name: &str, data_checksums: bool) {
    let shm = shm_volume(name, 64 << 20);
    // Writes in pieces are a group of log records, at most half an area.
    let format = fs::FormatOptions {
        log_records: 4096,
        data_checksums,
        ..small_format()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, small_options()).unwrap();
    let mut model = Model::default();
    let mut rng = Rng(0x5eed);
    for round in 0..3 {
        let mut steps = 0;
        while fill_ratio(&fs) < 0.92 {
            step(&fs, &mut model, &mut rng);
            steps += 1;
            assert!(
                steps < 50_000,
                "round {round}: {:.1}% full after {steps} steps",
                100.0 * fill_ratio(&fs)
            );
        }
        fs.checkpoint().unwrap();
        verify(&fs, &model, &format!("after round {round}"));
        // Delete random tables until there is room for the largest probe: free memory is
        // now wherever those tables' blocks were.
        while fill_ratio(&fs) > 0.8 {
            let names: Vec<String> = model.files.keys().cloned().collect();
            let name = names[rng.below(names.len() as u64) as usize].clone();
            fs.unlink(&name).unwrap();
            model.files.remove(&name);
            fs.checkpoint().unwrap();
        }
        // Large writes at unaligned offsets, into a fresh file: each must succeed when the
        // free blocks beyond the reserve hold its blocks.
        let probe = format!("/probe{round}");
        fs.create(&probe).unwrap();
        model.files.insert(probe.clone(), Vec::new());
        let mut at = 1u64;
        for size in [4u64 << 10, 64 << 10, 1 << 20, 8 << 20] {
            fs.checkpoint().unwrap();
            let stats = fs.stats();
            let free = fs.volume().free_bytes();
            let blocks = ((at % BLOCK) + size).div_ceil(BLOCK) * BLOCK;
            let fits = free >= stats.reserved_bytes + blocks;
            let data = pattern(rng.next(), at, size as usize);
            let outcome = write(&fs, &mut model, &probe, &data, at);
            eprintln!(
                "round {round}: {:.1}% full, {} KiB free, {} KiB reserved, {} KiB at {at}: {outcome:?}",
                100.0 * fill_ratio(&fs),
                free >> 10,
                stats.reserved_bytes >> 10,
                size >> 10
            );
            match outcome {
                Ok(()) => {}
                Err(ErrorKind::NoSpace) if !fits => {}
                Err(e) => panic!(
                    "round {round}: {size} bytes at {at} refused ({e:?}) with {free} bytes free, \
                     {} reserved",
                    stats.reserved_bytes
                ),
            }
            at += size + 4097;
        }
        verify(&fs, &model, &format!("after the probes of round {round}"));
    }
    fs.unmount().expect("an aged volume unmounts");
    let check = Fs::check(&open_volume(&shm.dir)).expect("and checks clean");
    assert_eq!(check.files, model.files.len() as u64);
    if data_checksums {
        let report = Fs::scrub(&open_volume(&shm.dir)).unwrap();
        assert!(report.damaged.is_empty(), "{:?}", report.damaged);
        assert!(report.blocks > 1000, "{report:?}");
    }
    let fs = Fs::open(open_volume(&shm.dir), FsOptions::default()).expect("and opens");
    verify(&fs, &model, "after reopening");
    fs.unmount().unwrap();
}
