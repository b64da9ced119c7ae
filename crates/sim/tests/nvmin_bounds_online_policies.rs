//! On the fixture trace (and the shared production trace when present) and on random zipf traces, over a grid with DRAM: NV-MIN's storage
//! accesses never exceed NBM's or NVLRU's, and the grid normalises to NVLRU.

use proptest::prelude::*;
use sim::{PolicyKind, ReadOptions, ZipfSpec, read_trace, run_grid, write_zipf};

fn check(trace: &sim::Trace, dram: &[u64], nvram: &[u64]) {
    let results = run_grid(trace, &PolicyKind::ALL, dram, nvram, 2, &|_, _| {}).unwrap();
    assert_eq!(results.len(), 4 * dram.len() * nvram.len());
    for result in results.iter().filter(|r| r.policy == PolicyKind::NvLru) {
        if result.storage_accesses() > 0 {
            assert_eq!(result.normalized_to_nvlru, Some(1.0));
        }
    }
    for &d in dram {
        for &n in nvram {
            let at = |policy| {
                results
                    .iter()
                    .find(|r| r.policy == policy && r.dram_bytes == d && r.nvram_bytes == n)
                    .unwrap()
                    .storage_accesses()
            };
            let optimum = at(PolicyKind::NvMin);
            assert!(
                optimum <= at(PolicyKind::Nbm),
                "dram {d} nvram {n}: NV-MIN {optimum} > NBM {}",
                at(PolicyKind::Nbm)
            );
            assert!(
                optimum <= at(PolicyKind::NvLru),
                "dram {d} nvram {n}: NV-MIN {optimum} > NVLRU {}",
                at(PolicyKind::NvLru)
            );
        }
    }
}

fn read_file(path: &std::path::Path) -> sim::Trace {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    read_trace(file, &path.display().to_string(), &ReadOptions::default()).unwrap()
}

#[test]
fn on_the_fixture_trace() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/traces/vm.libcachesim.csv");
    let kib = 1u64 << 10;
    check(
        &read_file(&path),
        &[64 * kib, kib << 10, 4096 * kib],
        &[0, 32 * kib, 256 * kib],
    );
}

/// An extra case when the shared production trace sits beside the repository.
#[test]
fn on_the_shared_cloudphysics_trace_when_present() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/cloudPhysicsIO.csv");
    if !path.exists() {
        eprintln!(
            "{} is not there; this extra case is skipped",
            path.display()
        );
        return;
    }
    let mib = 1u64 << 20;
    check(
        &read_file(&path),
        &[mib, 16 * mib, 64 * mib],
        &[mib, 8 * mib, 32 * mib],
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn on_random_zipf_traces(seed in any::<u64>(), alpha in 0.0f64..1.4, writes in 0.0f64..1.0, blocks in 50u64..2000) {
        let mut csv = Vec::new();
        write_zipf(&ZipfSpec { requests: 5000, blocks, alpha, write_fraction: writes, seed }, &mut csv).unwrap();
        let trace = read_trace(csv.as_slice(), "zipf", &ReadOptions::default()).unwrap();
        prop_assert_eq!(trace.requests, 5000);
        check(&trace, &[4096, 64 * 4096, 512 * 4096], &[0, 16 * 4096, 256 * 4096]);
    }
}
