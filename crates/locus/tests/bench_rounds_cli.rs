//! `locus bench fs` and `locus bench preload` as their users run them: one JSON object per
//! case and engine, and with `--rounds` each engine's median run with the range of the
//! rounds.

use std::process::Command;

use serde_json::Value;

mod common;

fn bench_fs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["bench", "fs", "--size", "16M", "--seconds", "0.05"])
        .args(args)
        .output()
        .unwrap()
}

fn cases(output: &std::process::Output) -> Vec<Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn pair(value: &Value) -> [f64; 2] {
    let v = value
        .as_array()
        .unwrap_or_else(|| panic!("not a pair: {value}"));
    assert_eq!(v.len(), 2, "{value}");
    [v[0].as_f64().unwrap(), v[1].as_f64().unwrap()]
}

/// Every case is the median of 3 rounds, within its rounds' IOPS range; only locus has a
/// ratio range.
fn each_is_a_median_of_three(cases: &[Value]) {
    for case in cases {
        assert_eq!(case["rounds"], 3, "{case}");
        let iops = case["iops"].as_f64().unwrap();
        let [lo, hi] = pair(&case["iops_range"]);
        assert!(0.0 < lo && lo <= iops && iops <= hi, "{case}");
        if case["engine"] == "locus" {
            let [lo, hi] = pair(&case["ratio_range"]);
            assert!(0.0 < lo && lo <= hi, "{case}");
        } else {
            assert!(case["ratio_range"].is_null(), "{case}");
        }
    }
}

#[test]
fn rounds_report_each_engines_median_run_and_the_rounds_range() {
    let output = bench_fs(&[
        "--json",
        "--bs",
        "4K,64K",
        "--threads",
        "1",
        "--ops",
        "randwrite,randread",
        "--rounds",
        "3",
    ]);
    let cases = cases(&output);
    assert_eq!(
        cases.len(),
        8,
        "2 ops x 2 sizes x 2 engines, one object each"
    );
    each_is_a_median_of_three(&cases);
}

#[test]
fn one_round_has_no_range_and_zero_rounds_are_refused() {
    let cases = cases(&bench_fs(&[
        "--json",
        "--bs",
        "4K",
        "--threads",
        "1",
        "--ops",
        "randwrite",
    ]));
    assert_eq!(cases.len(), 2);
    for case in &cases {
        assert_eq!(case["rounds"], 1, "{case}");
        assert!(case["iops_range"].is_null(), "{case}");
        assert!(case["ratio_range"].is_null(), "{case}");
        assert!(case["iops"].as_f64().unwrap() > 0.0, "{case}");
    }
    let refused = bench_fs(&["--rounds", "0"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--rounds"), "{stderr}");
}

#[test]
fn preload_rounds_report_each_columns_median_run_and_the_rounds_range() {
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args([
            "bench",
            "preload",
            "--json",
            "--size",
            "8M",
            "--seconds",
            "0.2",
        ])
        .args(["--bs", "4K", "--numjobs", "1", "--rounds", "3", "--library"])
        .arg(common::preload_library())
        .output()
        .unwrap();
    let cases = cases(&output);
    let engines: Vec<&str> = cases
        .iter()
        .map(|c| c["engine"].as_str().unwrap())
        .collect();
    assert_eq!(
        engines,
        ["tmpfs", "locus", "tmpfs+preload"],
        "one object per column"
    );
    each_is_a_median_of_three(&cases);
}

/// Random offsets within each thread's own stretch: every case runs, even with more threads
/// than the file has blocks (no stretch of their own: they spread over the whole file), and
/// a choice the bench does not know is refused by name.
#[test]
fn random_offsets_over_each_threads_stretch() {
    let cases = cases(&bench_fs(&[
        "--json",
        "--bs",
        "4M",
        "--threads",
        "1,8",
        "--ops",
        "randwrite,randread",
        "--random-over",
        "thread",
    ]));
    assert_eq!(cases.len(), 8, "2 ops x 2 thread counts x 2 engines");
    for case in &cases {
        assert!(case["iops"].as_f64().unwrap() > 0.0, "{case}");
        // The 16 MiB file holds four 4 MiB blocks: one thread has them as its own stretch, eight
        // have none and spread over the whole file, and the JSON says which it was.
        let expected = if case["threads"] == 1 {
            "thread"
        } else {
            "file"
        };
        assert_eq!(case["random_over"], expected, "{case}");
    }
    let refused = bench_fs(&["--random-over", "half"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("\"half\"") && stderr.contains("expected file"),
        "{stderr}"
    );
}
