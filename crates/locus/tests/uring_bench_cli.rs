//! `locus bench uring` prints one JSON object per (op, size, engine) with the documented
//! fields, its own strategies and fio's io_uring engine side by side.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_uring_json_covers_every_engine() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = dir.path().join("bench.img");
    let fio = Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        fio || std::env::var("CI").as_deref() != Ok("true"),
        ".ci/run must install fio"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args([
            "bench",
            "uring",
            "--json",
            "--seconds",
            "0.2",
            "--size",
            "64M",
            "--bs",
            "4K,1M",
        ])
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cases: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let per_point = if fio { 6 } else { 4 };
    assert_eq!(cases.len(), 2 * 2 * per_point, "2 sizes x 2 ops x engines");
    for case in &cases {
        for key in [
            "suite",
            "engine",
            "op",
            "bs_bytes",
            "iops",
            "bytes_per_sec",
            "latency_p99_ns",
        ] {
            assert!(!case[key].is_null(), "{key} missing in {case}");
        }
        assert!(case["iops"].as_f64().unwrap() > 0.0, "{case}");
        let expected = case["iops"].as_f64().unwrap() * case["bs_bytes"].as_f64().unwrap();
        let found = case["bytes_per_sec"].as_f64().unwrap();
        assert!(
            (found - expected).abs() <= expected * 1e-3,
            "bytes/s disagrees with IOPS x size: {case}"
        );
    }
    let engines: std::collections::BTreeSet<&str> = cases
        .iter()
        .map(|c| c["engine"].as_str().unwrap())
        .collect();
    for engine in ["pool", "per-request", "unregistered", "bounce"] {
        assert!(engines.contains(engine), "{engines:?}");
    }
    if fio {
        assert!(
            engines.contains("fio-fixed") && engines.contains("fio-unfixed"),
            "{engines:?}"
        );
    }
}
