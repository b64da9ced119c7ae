//! Every decoder of bytes from the network, on arbitrary bytes: no panics, and every failure
//! says what to do (disconnect, error reply to the option, or error reply to the request).

use nbd::{ClientFlags, Limits, NbdOption, OptionHeader, Request};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn options(code in prop_oneof![0u32..14, any::<u32>()], data in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = NbdOption::decode(code, &data);
    }

    #[test]
    fn headers_and_flags(bytes in prop::array::uniform16(any::<u8>()), flags in prop::array::uniform4(any::<u8>())) {
        let _ = OptionHeader::decode(&bytes);
        let _ = ClientFlags::decode(flags);
    }

    #[test]
    fn requests(head in prop::array::uniform16(any::<u8>()), tail in prop::array::uniform12(any::<u8>()), size in any::<u64>(), tflags in any::<u16>()) {
        let mut bytes = [0u8; 28];
        bytes[..16].copy_from_slice(&head);
        bytes[16..].copy_from_slice(&tail);
        bytes[..4].copy_from_slice(&0x2560_9513u32.to_be_bytes());
        let request = Request::decode(&bytes).unwrap();
        let limits = Limits { size_bytes: size, transmission_flags: tflags | 1, structured_replies: true, meta_contexts: true, max_payload_bytes: 32 << 20, min_block_bytes: 512 };
        if request.check(&limits).is_ok() && request.length > 0 {
            prop_assert!(request.offset.checked_add(u64::from(request.length)).is_some_and(|end| end <= size));
        }
    }
}
