//! On random traces and capacities: every action of every policy is legal, the tiers never
//! exceed their capacity, and — whenever there is DRAM — NV-MIN's storage accesses are at
//! most every online split policy's. With no DRAM, NV-MIN is not an optimum (see
//! `hand_computed_traces::nvmin_is_not_optimal_without_dram`), so there only legality is
//! checked.

mod common;

use cache::{Access, Capacity, Lru, Nbm, NvLru, NvMin, Op, nvmin};
use common::run_checked;
use proptest::prelude::*;

fn accesses() -> impl Strategy<Value = Vec<Access>> {
    let blocks = 1u32..24;
    blocks.prop_flat_map(|blocks| {
        prop::collection::vec(
            (0..blocks, prop::bool::weighted(0.4)).prop_map(|(block, write)| Access {
                block,
                op: if write { Op::Write } else { Op::Read },
            }),
            0..400,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn nvmin_is_never_beaten_and_every_action_is_legal(
        accesses in accesses(),
        dram_blocks in 1usize..8,
        nvram_blocks in 0usize..8,
    ) {
        let capacity = Capacity { dram_blocks, nvram_blocks };
        let futures = nvmin::futures(&accesses).unwrap();
        let optimum = run_checked(&mut NvMin::new(capacity, &futures), &accesses, capacity, false);
        let nbm = run_checked(&mut Nbm::new(capacity), &accesses, capacity, false);
        let nvlru = run_checked(&mut NvLru::new(capacity), &accesses, capacity, false);
        run_checked(&mut Lru::new(capacity), &accesses, capacity, true);
        prop_assert!(
            optimum.storage_accesses() <= nbm.storage_accesses(),
            "NV-MIN {} > NBM {}", optimum.storage_accesses(), nbm.storage_accesses()
        );
        prop_assert!(
            optimum.storage_accesses() <= nvlru.storage_accesses(),
            "NV-MIN {} > NVLRU {}", optimum.storage_accesses(), nvlru.storage_accesses()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn without_dram_every_action_is_still_legal(accesses in accesses(), nvram_blocks in 0usize..8) {
        let capacity = Capacity { dram_blocks: 0, nvram_blocks };
        let futures = nvmin::futures(&accesses).unwrap();
        run_checked(&mut NvMin::new(capacity, &futures), &accesses, capacity, false);
        run_checked(&mut Nbm::new(capacity), &accesses, capacity, false);
        run_checked(&mut NvLru::new(capacity), &accesses, capacity, false);
        run_checked(&mut Lru::new(capacity), &accesses, capacity, true);
    }
}
