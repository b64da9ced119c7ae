//! Fuzzing the trace readers: arbitrary lines in every format never panic; a failure is a
//! parse error naming a line that exists, and with skip_bad every line is either used or
//! counted.

use proptest::prelude::*;
use sim::{Format, ReadOptions, SimError, read_trace};

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,60}",
        "[0-9a-fA-Fx,]{0,40}",
        "[0-9 .,+RWDSQGC\\[\\]]{0,60}",
        Just("version,time,op,size,lbn".to_owned()),
        Just("fio version 2 iolog".to_owned()),
        Just("  8,0 0 1 0.0 1 Q R 18446744073709551615 + 18446744073709551615 [x]".to_owned()),
        Just("  8,0 0 1 0.0 1 Q W 8 + 18446744073709551615 [x]".to_owned()),
        Just("1,1,2a,18446744073709551615,18446744073709551615".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_lines_never_panic(lines in prop::collection::vec(line(), 0..20), pick in 0usize..7, skip_bad in any::<bool>()) {
        let format = if pick == 6 { None } else { Some(Format::ALL[pick].1) };
        let text = lines.join("\n");
        let options = ReadOptions { format, skip_bad, ..ReadOptions::default() };
        match read_trace(text.as_bytes(), "fuzz", &options) {
            Ok(trace) => prop_assert!(trace.requests + trace.skipped_lines <= lines.len() as u64),
            Err(SimError::Parse { line, .. }) => prop_assert!(line >= 1 && line as usize <= lines.len().max(1)),
            Err(SimError::UnknownFormat { .. }) => prop_assert!(format.is_none()),
            // No line is a request: none at all, or every one skipped as malformed.
            Err(SimError::NoRequests { lines: n, skipped, .. }) => {
                prop_assert!(n as usize <= lines.len().max(1));
                prop_assert!(skip_bad || skipped == 0);
            }
            Err(other) => prop_assert!(false, "unexpected error: {other}"),
        }
    }
}
