//! Every trace format: a small sample read to exact requests and blocks, detection, and
//! malformed lines rejected with the line number (or counted with skip_bad).

use cache::{Access, Op};
use sim::{Format, ReadOptions, SimError, Trace, read_trace};

fn read(text: &str, format: Option<Format>) -> Result<Trace, SimError> {
    read_trace(
        text.as_bytes(),
        "sample",
        &ReadOptions {
            format,
            ..ReadOptions::default()
        },
    )
}

fn ops(trace: &Trace) -> Vec<(u32, Op)> {
    trace
        .accesses
        .iter()
        .map(|a: &Access| (a.block, a.op))
        .collect()
}

#[test]
fn libcachesim_csv_with_scsi_opcodes() {
    let text =
        "version,time,op,size,lbn\n1,5,2a,512,8\n1,6,28,8192,0\n1,7,35,0,0\n1,8,0x28,4096,16\n";
    let trace = read(text, None).unwrap();
    assert_eq!(
        (trace.requests, trace.read_requests, trace.write_requests),
        (3, 2, 1)
    );
    // lbn 8 = byte 4096 = block 1; 8 KiB at 0 = blocks 0,1; lbn 16 = block 2.
    assert_eq!(
        ops(&trace),
        vec![(0, Op::Write), (1, Op::Read), (0, Op::Read), (2, Op::Read)]
    );
    assert_eq!(trace.distinct_blocks, 3);
}

#[test]
fn msr_cambridge_csv() {
    let text = "128166372003061629,hm,0,Read,8192,4096,1000\n128166372003061630,hm,1,Write,8192,8192,800\n";
    let trace = read(text, None).unwrap();
    assert_eq!(trace.requests, 2);
    assert_eq!(
        ops(&trace),
        vec![(0, Op::Read), (1, Op::Write), (2, Op::Write)],
        "disk 1 is another space"
    );
}

#[test]
fn fio_iologs_v2_and_v3() {
    let v2 = "fio version 2 iolog\n/dev/nvme0n1 add\n/dev/nvme0n1 open\n/dev/nvme0n1 write 0 4096\n/dev/nvme0n1 read 4096 4096\n/dev/nvme0n1 close\n";
    let trace = read(v2, None).unwrap();
    assert_eq!(ops(&trace), vec![(0, Op::Write), (1, Op::Read)]);
    let v3 = "fio version 3 iolog\n0 f1 add\n10 f1 open\n11 f1 read 0 8192\n12 f2 write 0 4096\n";
    let trace = read(v3, None).unwrap();
    assert_eq!(
        ops(&trace),
        vec![(0, Op::Read), (1, Op::Read), (2, Op::Write)],
        "f2 is another file"
    );
}

#[test]
fn blkparse_text_counts_queue_events_once() {
    let text = "  8,0    3        1     0.000000000   697  Q  WS 16 + 8 [kworker]\n  \
                8,0    3        2     0.000001000   697  G  WS 16 + 8 [kworker]\n  \
                8,0    3        3     0.000002000   697  C  WS 16 + 8 [0]\n  \
                8,0    1        4     0.000003000   700  Q   R 0 + 16 [cat]\n  \
                8,0    1        5     0.000004000   700  Q   D 0 + 16 [fstrim]\n\
                CPU0 (8,0):\n Reads Queued:           1,        8KiB\n";
    let trace = read(text, None).unwrap();
    assert_eq!(trace.requests, 2);
    // Sector 16 is block 2 (id 0); the 16-sector read covers blocks 0 and 1 (ids 1, 2).
    assert_eq!(
        ops(&trace),
        vec![(0, Op::Write), (1, Op::Read), (2, Op::Read)]
    );
}

#[test]
fn disksim_ascii() {
    let text = "0.0 0 8 8 1\n1.5 0 8 16 0\n2.0 1 8 8 1\n";
    let trace = read(text, None).unwrap();
    assert_eq!(
        ops(&trace),
        vec![(0, Op::Read), (0, Op::Write), (1, Op::Write), (2, Op::Read)]
    );
}

#[test]
fn malformed_lines_name_their_line_or_are_skipped_on_request() {
    let text = "version,time,op,size,lbn\n1,5,2a,512,8\n1,6,zz,512,8\n1,7,28,512\n";
    match read(text, None).unwrap_err() {
        SimError::Parse {
            line,
            problem,
            source_name,
        } => {
            assert_eq!((source_name.as_str(), line), ("sample", 3));
            assert!(problem.contains("`zz`"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    let trace = read_trace(
        text.as_bytes(),
        "sample",
        &ReadOptions {
            skip_bad: true,
            ..ReadOptions::default()
        },
    )
    .unwrap();
    assert_eq!((trace.requests, trace.skipped_lines), (1, 2));

    let error = read("0.0 0 8 8 7\n", None).unwrap_err();
    assert!(
        error.to_string().starts_with("sample:1: type `7`"),
        "{error}"
    );
    let error = read("fio version 2 iolog\nf1 write 0\n", None).unwrap_err();
    assert!(error.to_string().contains("sample:2"), "{error}");
    let error = read("1,2,3\n", None).unwrap_err();
    assert!(matches!(error, SimError::UnknownFormat { .. }), "{error}");
    let error = read(
        "version,time,op,size,lbn\n1,5,2a,99999999999999999999,8\n",
        None,
    )
    .unwrap_err();
    assert!(error.to_string().contains("size"), "{error}");
    let error = read("  8,0 0 1 0.0 1 Q W 8 + 18446744073709551615 [x]\n", None).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("sample:1: sector count overflows"),
        "{error}"
    );
    let error = read("version,time,op,size,lbn\n1,5,2a,1099511627776,8\n", None).unwrap_err();
    assert!(error.to_string().contains("more than"), "{error}");
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/traces")
        .join(name)
}

fn read_file(path: &std::path::Path) -> Trace {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    read_trace(file, &path.display().to_string(), &ReadOptions::default()).unwrap()
}

/// The fixtures hold one workload in every format; the counts are the generator's own
/// (fixtures/traces/README.md), computed apart from these readers.
#[test]
fn every_format_of_the_fixture_workload_reads_to_the_same_accesses() {
    let reference = read_file(&fixture("vm.libcachesim.csv"));
    assert_eq!(
        (
            reference.requests,
            reference.read_requests,
            reference.write_requests
        ),
        (3000, 1592, 1408)
    );
    assert_eq!(
        (reference.accesses.len(), reference.distinct_blocks),
        (6032, 2271)
    );
    for (name, format) in [
        ("vm.libcachesim.csv", Format::LibCacheSim),
        ("vm.msr.csv", Format::Msr),
        ("vm.fio2.log", Format::FioV2),
        ("vm.fio3.log", Format::FioV3),
        ("vm.blkparse.txt", Format::Blkparse),
        ("vm.disksim.trace", Format::DiskSim),
    ] {
        let path = fixture(name);
        let first = std::fs::read_to_string(&path).unwrap();
        let first = first.lines().next().unwrap();
        assert_eq!(sim::trace::detect(first, name).unwrap(), format, "{name}");
        let trace = read_file(&path);
        assert_eq!(trace.skipped_lines, 0, "{name}");
        assert_eq!(
            (trace.requests, trace.read_requests, trace.write_requests),
            (3000, 1592, 1408),
            "{name}"
        );
        assert!(ops(&trace) == ops(&reference), "{name}: other accesses");
    }
}

/// An extra case when the shared production trace sits beside the repository.
#[test]
fn the_shared_cloudphysics_trace_when_present() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/cloudPhysicsIO.csv");
    if !path.exists() {
        eprintln!(
            "{} is not there; this extra case is skipped",
            path.display()
        );
        return;
    }
    let trace = read_file(&path);
    assert_eq!(
        (trace.requests, trace.read_requests, trace.write_requests),
        (113_872, 46_974, 66_898)
    );
    assert_eq!(trace.skipped_lines, 0);
    assert!(
        trace.accesses.len() as u64 > trace.requests,
        "large requests span several blocks"
    );
}

#[test]
fn block_size_must_be_a_power_of_two() {
    let options = ReadOptions {
        block_bytes: 3000,
        ..ReadOptions::default()
    };
    assert!(read_trace("".as_bytes(), "x", &options).is_err());
}
