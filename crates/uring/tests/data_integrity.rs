//! Every strategy, every tier: random requests from 512 B to 16 MiB written with O_DIRECT to
//! a file on the real disk at queue depth 8, then read back and compared by CRC.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use uring::{DirectFile, Engine, Op, PoolConfig, Strategy, Tier};

const SLOT_BYTES: u64 = 16 << 20;
const SLOTS: u64 = 48;

fn run(strategy: Strategy, seed: u64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = DirectFile::open(&dir.path().join("disk.img"), Some(SLOT_BYTES * SLOTS)).unwrap();
    let config = PoolConfig {
        max_medium_bytes: 32 << 20,
        ..PoolConfig::default()
    };
    let mut engine = Engine::new(file, strategy, config, 8).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut expected = Vec::new();
    let mut tiers = std::collections::BTreeSet::new();
    for slot in 0..SLOTS {
        // Sizes spread over every tier: small, medium, exactly m, large.
        let len = match slot % 6 {
            0 => 512 * rng.random_range(1..=8),
            1 => 4096 * rng.random_range(2..=64),
            2 => 512 * rng.random_range(600..=8192),
            3 => 4 << 20,
            4 => 512 * rng.random_range(8193..=32768),
            _ => 512 * rng.random_range(1..=32768),
        } as usize;
        let offset =
            slot * SLOT_BYTES + 512 * rng.random_range(0..=((SLOT_BYTES - len as u64) / 512));
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let mut buf = engine.buffer(len, Op::Write).unwrap();
        tiers.insert(format!("{:?}", buf.tier()));
        buf.fill_from(&data);
        engine.submit(Op::Write, buf, offset, len, slot).unwrap();
        for done in engine.reap(0).unwrap() {
            assert_eq!(done.result.unwrap(), done.buf.len());
            engine.release(done.buf);
        }
        expected.push((offset, len, crc32c::crc32c(&data)));
    }
    for done in engine.reap(usize::MAX).unwrap() {
        done.result.unwrap();
        engine.release(done.buf);
    }
    for (slot, &(offset, len, _)) in expected.iter().enumerate() {
        let buf = engine.buffer(len, Op::Read).unwrap();
        engine
            .submit(Op::Read, buf, offset, len, slot as u64)
            .unwrap();
    }
    let mut checked = 0;
    while checked < expected.len() {
        for done in engine.reap(1).unwrap() {
            let (offset, len, crc) = expected[done.tag as usize];
            assert_eq!(done.offset, offset);
            assert_eq!(
                done.result.as_ref().copied().unwrap(),
                len,
                "{}: short read",
                strategy.name()
            );
            let mut data = vec![0u8; len];
            done.buf.copy_to(&mut data);
            assert_eq!(
                crc32c::crc32c(&data),
                crc,
                "{}: request {} at {offset} ({len} bytes) corrupted",
                strategy.name(),
                done.tag
            );
            engine.release(done.buf);
            checked += 1;
        }
    }
    if strategy == Strategy::Pool {
        for tier in [Tier::Small, Tier::Medium, Tier::Large] {
            assert!(
                tiers.contains(&format!("{tier:?}")),
                "the pool never used the {tier:?} tier: {tiers:?}"
            );
        }
        assert_eq!(engine.pool_stats().registration_failures, 0);
    }
}

#[test]
fn pool() {
    run(Strategy::Pool, 1);
}

#[test]
fn per_request_registration() {
    run(Strategy::PerRequest, 2);
}

#[test]
fn unregistered() {
    run(Strategy::Unregistered, 3);
}

#[test]
fn bounce_buffer() {
    run(Strategy::Bounce, 4);
}

#[test]
fn bad_requests_are_refused_before_submission() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = DirectFile::open(&dir.path().join("disk.img"), Some(1 << 20)).unwrap();
    let mut engine = Engine::new(file, Strategy::Pool, PoolConfig::default(), 4).unwrap();
    let buf = engine.buffer(4096, Op::Read).unwrap();
    let error = engine.submit(Op::Read, buf, 100, 4096, 0).unwrap_err();
    assert!(error.to_string().contains("multiples of 512"), "{error}");
    let buf = engine.buffer(4096, Op::Read).unwrap();
    let error = engine.submit(Op::Read, buf, 1 << 20, 4096, 0).unwrap_err();
    assert!(error.to_string().contains("past the end"), "{error}");
    // The refused requests' small read block came back: the next small read gets it again.
    assert_eq!(engine.buffer(4096, Op::Read).unwrap().tier(), Tier::Small);
    assert!(engine.buffer(0, Op::Read).is_err());
    assert!(
        Engine::new(
            DirectFile::open(&dir.path().join("x"), Some(4096)).unwrap(),
            Strategy::Pool,
            PoolConfig::default(),
            0
        )
        .is_err()
    );
}

#[test]
fn pool_memory_is_on_the_node_of_the_creating_thread() {
    let topology = topology::Topology::read_live().unwrap();
    let node = topology.nodes.iter().find(|n| !n.cpus.is_empty()).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            topology::pin_current_thread(&node.cpus).unwrap();
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let file = DirectFile::open(&dir.path().join("disk.img"), Some(8 << 20)).unwrap();
            let mut engine = Engine::new(file, Strategy::Pool, PoolConfig::default(), 4).unwrap();
            let buf = engine.buffer(1 << 20, Op::Read).unwrap();
            let pages: Vec<usize> = buf.segments().iter().map(|s| s.address as usize).collect();
            assert_eq!(
                topology::page_nodes(&pages).unwrap(),
                vec![node.id as i32; pages.len()]
            );
            engine.release(buf);
        });
    });
}
