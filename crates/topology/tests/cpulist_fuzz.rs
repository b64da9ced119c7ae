//! Fuzzing the kernel list parser (cpulist, online nodes): arbitrary text never panics, and
//! whatever parses formats back to a list that parses to the same ids.

use proptest::prelude::*;
use topology::cpulist;

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "[0-9,\\- \\n]{0,40}|[ -~]{0,40}") {
        if let Ok(ids) = cpulist::parse(&text) {
            prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
            prop_assert_eq!(cpulist::parse(&cpulist::format(&ids)).unwrap(), ids);
        }
    }
}
