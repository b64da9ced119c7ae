//! `locus sim` and `locus bench sim` as a user runs them.

use std::process::{Command, Output};

use serde_json::Value;

fn locus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(args)
        .output()
        .expect("run locus")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The repository's fixture trace (fixtures/traces/README.md): 3000 requests.
const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../fixtures/traces/vm.libcachesim.csv"
);

/// The shared production trace, an extra case when it sits beside the repository.
const SHARED_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/cloudPhysicsIO.csv"
);

fn json_points(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn json_has_one_object_per_grid_point_normalised_to_nvlru() {
    let points = json_points(&locus(&[
        "sim", "--trace", TRACE, "--dram", "4M", "--nvram", "32K,256K", "--json",
    ]));
    assert_eq!(points.len(), 4 * 2);
    for point in &points {
        for key in [
            "policy",
            "dram_bytes",
            "nvram_bytes",
            "requests",
            "storage_reads",
            "writebacks",
            "storage_accesses",
        ] {
            assert!(!point[key].is_null(), "{key} missing in {point}");
        }
        assert_eq!(point["requests"], 3000);
        assert_eq!(
            point["storage_accesses"].as_u64().unwrap(),
            point["storage_reads"].as_u64().unwrap() + point["writebacks"].as_u64().unwrap()
        );
        if point["policy"] == "nvlru" {
            assert_eq!(point["normalized_to_nvlru"], 1.0);
        } else {
            let nvlru = points
                .iter()
                .find(|p| p["policy"] == "nvlru" && p["nvram_bytes"] == point["nvram_bytes"])
                .unwrap();
            let ratio = point["storage_accesses"].as_f64().unwrap()
                / nvlru["storage_accesses"].as_f64().unwrap();
            let reported = point["normalized_to_nvlru"].as_f64().unwrap();
            assert!((ratio - reported).abs() < 1e-9, "{point} vs {nvlru}");
        }
        // Storage reads are read misses: never more than the trace's 6032 block accesses.
        assert!(point["storage_reads"].as_u64().unwrap() <= 6032, "{point}");
    }
}

/// The paper's finding on a real trace: with DRAM to spare, NBM saves more than a tenth of
/// NVLRU's storage accesses. Runs when the shared production trace is there.
#[test]
fn nbm_beats_nvlru_on_the_shared_trace_when_present() {
    if !std::path::Path::new(SHARED_TRACE).exists() {
        eprintln!("{SHARED_TRACE} is not there; this extra case is skipped");
        return;
    }
    let points = json_points(&locus(&[
        "sim",
        "--trace",
        SHARED_TRACE,
        "--dram",
        "1G",
        "--nvram",
        "16M",
        "--policy",
        "nbm,nvlru",
        "--json",
    ]));
    assert!(points.iter().all(|p| p["requests"] == 113_872));
    let nbm = points.iter().find(|p| p["policy"] == "nbm").unwrap();
    assert!(
        nbm["normalized_to_nvlru"].as_f64().unwrap() < 0.9,
        "NBM beats NVLRU with 1 GiB DRAM: {nbm}"
    );
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["fig3.svg", "fig3.png"] {
        let path = dir.path().join(name);
        let output = locus(&[
            "sim",
            "--trace",
            TRACE,
            "--dram",
            "256K,4M",
            "--nvram",
            "32K,256K",
            "--plot",
            path.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let bytes = std::fs::read(&path).unwrap();
        if name.ends_with(".svg") {
            assert!(text(&bytes).contains("<svg") && text(&bytes).contains("NVRAM size"));
        } else {
            assert_eq!(&bytes[1..4], b"PNG");
        }
    }
    let output = locus(&["sim", "--trace", TRACE, "--plot", "/tmp/x.gif"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains(".svg or .png"));
}

#[test]
fn generated_traces_read_back_and_bad_traces_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zipf.csv");
    let output = locus(&[
        "sim",
        "--gen",
        "zipf",
        "--requests",
        "2000",
        "--blocks",
        "300",
        "--output",
        path.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = locus(&[
        "sim",
        "--trace",
        path.to_str().unwrap(),
        "--dram",
        "64K",
        "--nvram",
        "64K",
        "--policy",
        "nbm,nvlru",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("2000 requests"),
        "{}",
        text(&output.stderr)
    );

    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "version,time,op,size,lbn\n1,2,28,4096,0\n1,3,28,four,0\n",
    )
    .unwrap();
    let output = locus(&["sim", "--trace", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("bad.csv:3: size `four`"),
        "{}",
        text(&output.stderr)
    );
    let output = locus(&[
        "sim",
        "--trace",
        bad.to_str().unwrap(),
        "--skip-bad",
        "--dram",
        "64K",
        "--nvram",
        "64K",
    ]);
    assert!(output.status.success());
    assert!(
        text(&output.stderr).contains("1 malformed lines skipped"),
        "{}",
        text(&output.stderr)
    );

    let output = locus(&["sim", "--trace", TRACE, "--policy", "arc"]);
    assert!(text(&output.stderr).contains("unknown policy `arc`"));
}

/// Inputs that used to simulate nothing and exit 0: a trace read in the wrong format, a
/// header with no requests, bytes that are not text, a cache size that is not whole blocks.
/// Each is now an error that names the line or the option.
#[test]
fn traces_with_no_requests_and_partial_blocks_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("ops.csv");
    std::fs::write(&csv, "version,time,op,size,lbn\n1,2,28,4096,0\n").unwrap();
    let wrong = locus(&[
        "sim",
        "--trace",
        csv.to_str().unwrap(),
        "--format",
        "blkparse",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    let err = text(&wrong.stderr);
    assert!(
        err.contains("ops.csv:1: no line of the trace is a blkparse request")
            && err.contains("another format"),
        "{err}"
    );

    let header = dir.path().join("header.csv");
    std::fs::write(&header, "version,time,op,size,lbn\n").unwrap();
    let output = locus(&["sim", "--trace", header.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr)
            .contains("header.csv:1: no line of the trace is a libcachesim request"),
        "{}",
        text(&output.stderr)
    );

    let binary = dir.path().join("binary.csv");
    std::fs::write(
        &binary,
        b"version,time,op,size,lbn\n1,2,28,4096,0\n\xff\xfe\x00\n",
    )
    .unwrap();
    let output = locus(&["sim", "--trace", binary.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let err = text(&output.stderr);
    assert!(err.contains("binary.csv:3: not UTF-8 text"), "{err}");
    assert_eq!(err.matches("UTF-8").count(), 1, "named once: {err}");

    let output = locus(&["sim", "--trace", csv.to_str().unwrap(), "--dram", "1K"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("--dram 1.00 KiB is not a whole number of 4.00 KiB blocks"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn bench_sim_reports_every_policy() {
    let output = locus(&[
        "bench",
        "sim",
        "--json",
        "--requests",
        "20000",
        "--blocks",
        "5000",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let cases: Vec<Value> = text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ops: Vec<&str> = cases.iter().map(|c| c["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["parse", "nbm", "nvlru", "nvmin", "lru"]);
    assert!(
        cases
            .iter()
            .all(|c| c["requests_per_sec"].as_f64().unwrap() > 0.0)
    );
}
