//! kill -9: a child process writes checksummed, sequence-numbered blocks to a file on an
//! emulated device and prints each acknowledgement; the parent kills it at random moments,
//! reopens (recovery), and checks that every acknowledged block is there and no block is
//! torn. `LOCUS_KILL_ROUNDS` sets the number of kills (default 50).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use fs::{Fs, OpenOptions};
use rand::{Rng, SeedableRng};
use testkit::*;

const SLOTS: u64 = 512;
const ENV: &str = "LOCUS_KILL_CHILD_DIR";

/// A block: [sequence u64][slot u64][crc32c of the rest u32][payload].
fn block(sequence: u64, slot: u64, size: usize) -> Vec<u8> {
    let mut data = pattern(sequence, slot, size);
    data[..8].copy_from_slice(&sequence.to_le_bytes());
    data[8..16].copy_from_slice(&slot.to_le_bytes());
    let crc = crc32c::crc32c(&data[20..]);
    data[16..20].copy_from_slice(&crc.to_le_bytes());
    data
}

/// `None` for a never-written (zero) block; panics on a torn one.
fn decode(data: &[u8], slot: u64) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return None;
    }
    let sequence = u64::from_le_bytes(data[..8].try_into().unwrap());
    let crc = u32::from_le_bytes(data[16..20].try_into().unwrap());
    assert_eq!(
        crc,
        crc32c::crc32c(&data[20..]),
        "slot {slot}: torn block (sequence {sequence})"
    );
    assert_eq!(
        u64::from_le_bytes(data[8..16].try_into().unwrap()),
        slot,
        "slot {slot}: block of another slot"
    );
    assert_eq!(
        data,
        &block(sequence, slot, data.len())[..],
        "slot {slot}: payload differs"
    );
    Some(sequence)
}

fn size_of(slot: u64) -> usize {
    // Mixed sizes: sub-block, one block, several blocks.
    [1024, 4096, 3 * 4096 + 512, 16384][(slot % 4) as usize]
}

const STRIDE: u64 = 20 << 10;

/// The child: writes forever, printing `ack <sequence> <slot>` after each write returns.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(ENV) else {
        return;
    };
    let start: u64 = std::env::var("LOCUS_KILL_START").unwrap().parse().unwrap();
    let fs = Fs::open(open_volume(dir.as_ref()), small_options()).unwrap();
    let file = fs.open_file("/blocks", OpenOptions::create()).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(start);
    let stdout = std::io::stdout();
    for sequence in start.. {
        let slot = rng.random_range(0..SLOTS);
        file.write_at(&block(sequence, slot, size_of(slot)), slot * STRIDE)
            .unwrap();
        use std::io::Write;
        writeln!(stdout.lock(), "ack {sequence} {slot}").unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    if std::env::var(ENV).is_ok() {
        return;
    }
    let rounds: usize = std::env::var("LOCUS_KILL_ROUNDS").map_or(50, |v| v.parse().unwrap());
    let shm = shm_volume("kill9", 256 << 20);
    drop(Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x6b696c6c);
    // Newest acknowledged sequence per slot.
    let mut acked: Vec<Option<u64>> = vec![None; SLOTS as usize];
    let mut next = 1u64;
    let mut total_acks = 0;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_writer",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(ENV, &shm.dir)
            .env("LOCUS_KILL_START", next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let wait = Duration::from_millis(rng.random_range(5..60));
        let (writing, started) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("ack ") {
                    let _ = writing.send(());
                }
                lines.push(line);
            }
            lines
        });
        // Let it get going (recovery, mapping the device, the first ack: startup time varies
        // with the machine), then kill at a random moment of its writing.
        let _ = started.recv_timeout(Duration::from_secs(20));
        std::thread::sleep(wait);
        child.kill().unwrap();
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        let mut acks = 0;
        for line in &lines {
            let mut parts = line.split(' ');
            if parts.next() != Some("ack") {
                continue;
            }
            let sequence: u64 = parts.next().unwrap().parse().unwrap();
            let slot: u64 = parts.next().unwrap().parse().unwrap();
            acked[slot as usize] = Some(sequence);
            next = next.max(sequence + 1);
            acks += 1;
        }
        // The write in flight at the kill may have landed: its sequence is `next`.
        next += 1;
        total_acks += acks;

        let fs = Fs::open(open_volume(&shm.dir), small_options())
            .unwrap_or_else(|e| panic!("round {round}: recovery failed: {e}"));
        let Ok(file) = fs.open_read("/blocks") else {
            assert!(
                acked.iter().all(Option::is_none),
                "round {round}: the file is gone"
            );
            continue;
        };
        for slot in 0..SLOTS {
            let mut data = vec![0u8; size_of(slot)];
            let n = file.read_at(&mut data, slot * STRIDE).unwrap();
            data.truncate(n);
            data.resize(size_of(slot), 0);
            let found = decode(&data, slot);
            match (acked[slot as usize], found) {
                (None, None) => {}
                (Some(a), Some(f)) => {
                    // The newest acknowledged, or the one in flight at the kill (newer).
                    assert!(
                        f >= a,
                        "round {round}: slot {slot} holds {f}, {a} was acknowledged"
                    );
                    acked[slot as usize] = Some(f);
                }
                (None, Some(f)) => acked[slot as usize] = Some(f),
                (Some(a), None) => panic!("round {round}: slot {slot} lost acknowledged write {a}"),
            }
        }
        drop(file);
        fs.abandon();
    }
    eprintln!("{rounds} kills, {total_acks} acknowledged writes checked");
    assert!(
        total_acks > rounds,
        "the child barely wrote: {total_acks} acks in {rounds} rounds"
    );
}
