//! `locus cache replay`: block traces replayed over NBD against a cache export; the backing
//! store's reads and write-backs the server did equal what `locus sim` computes for the same
//! trace, policy and sizes — for each policy, on traces with a hot set, scans and multi-block
//! requests. The traces are made here (MSR Cambridge format), seeded.

use std::path::Path;
use std::process::Command;

fn locus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_locus"))
}

/// A seeded trace of `requests` MSR lines: 70% in a hot set of `hot` blocks, 40% writes,
/// requests of 1 to 3 blocks, and a sequential scan in the middle.
fn trace(path: &Path, seed: u64, requests: u64, hot: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut lines = String::new();
    for i in 0..requests {
        let block = if (requests / 2..requests / 2 + 100).contains(&i) {
            10_000 + i
        } else if next(10) < 7 {
            next(hot)
        } else {
            next(2000)
        };
        let blocks = [1, 1, 1, 2, 3][next(5) as usize];
        let op = if next(10) < 4 { "Write" } else { "Read" };
        lines.push_str(&format!(
            "{},hm,0,{op},{},{},100\n",
            128_166_372_000_000_000u64 + i * 1000,
            block * 4096,
            blocks * 4096
        ));
    }
    std::fs::write(path, lines).unwrap();
}

#[test]
fn replayed_over_nbd_the_device_counts_what_the_simulator_computes() {
    let dir = tempfile::tempdir().unwrap();
    for (seed, hot, dram, nvram) in [
        (1, 24, "32K", "24K"),
        (2, 64, "64K", "128K"),
        (3, 8, "0", "16K"),
    ] {
        let path = dir.path().join(format!("t{seed}.msr"));
        trace(&path, seed, 1500, hot);
        for policy in ["nbm", "nvlru", "lru"] {
            let out = locus()
                .args(["cache", "replay", "--json", "--trace"])
                .arg(&path)
                .args(["--dram", dram, "--nvram", nvram, "--policy", policy])
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "seed {seed} {policy}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(report["equal"], true, "{report}");
            for key in ["backing_reads", "write_backs"] {
                assert_eq!(report[key]["device"], report[key]["sim"], "{key}: {report}");
            }
            assert!(
                report["write_backs"]["device"].as_u64().unwrap() > 50,
                "the trace overflows NVRAM: {report}"
            );
            // The simulator, run as users run it, agrees too.
            let sim = locus()
                .args(["sim", "--json", "--trace"])
                .arg(&path)
                .args(["--dram", dram, "--nvram", nvram])
                .output()
                .unwrap();
            assert!(sim.status.success());
            let sim = String::from_utf8_lossy(&sim.stdout);
            let row = sim
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .flat_map(|v| match v {
                    serde_json::Value::Array(rows) => rows,
                    other => vec![other],
                })
                .find(|r| r["policy"] == policy)
                .unwrap_or_else(|| panic!("no {policy} row in {sim}"));
            assert_eq!(
                row["storage_reads"], report["backing_reads"]["device"],
                "{row} {report}"
            );
            assert_eq!(
                row["writebacks"], report["write_backs"]["device"],
                "{row} {report}"
            );
        }
    }
}

#[test]
fn bad_replay_arguments_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.msr");
    trace(&path, 9, 10, 4);
    for (args, says) in [
        (
            vec!["--nvram", "1000", "--dram", "4K"],
            "not a multiple of the 4096-byte block",
        ),
        (vec!["--nvram", "0", "--dram", "4K"], "at least one block"),
    ] {
        let out = locus()
            .args(["cache", "replay", "--trace"])
            .arg(&path)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let empty = dir.path().join("empty.msr");
    std::fs::write(&empty, "").unwrap();
    let out = locus()
        .args([
            "cache", "replay", "--nvram", "4K", "--dram", "4K", "--trace",
        ])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
}
