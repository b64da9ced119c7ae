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
