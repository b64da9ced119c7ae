//! Fuzzing the superblock decoder: arbitrary bytes, and arbitrary bytes that pass the magic,
//! version and CRC checks, never panic; every rejection names a field or says "not formatted".

use proptest::prelude::*;
use volume::VolumeError;
use volume::superblock::{MAGIC, SUPERBLOCK_BYTES, Superblock, VERSION};

fn decode(bytes: &[u8; SUPERBLOCK_BYTES], device_bytes: u64) -> Result<Superblock, VolumeError> {
    Superblock::decode(bytes, "/dev/fuzz", device_bytes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::array::uniform32(any::<u8>()), rest in prop::collection::vec(any::<u8>(), 96), device in any::<u64>()) {
        let mut block = [0u8; SUPERBLOCK_BYTES];
        block[..32].copy_from_slice(&bytes);
        block[32..].copy_from_slice(&rest);
        match decode(&block, device) {
            Ok(_) => {}
            Err(VolumeError::NotFormatted { .. } | VolumeError::BadSuperblock { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error kind: {other}"),
        }
    }

    #[test]
    fn checksummed_garbage_is_rejected_by_field_or_decoded_consistently(body in prop::collection::vec(any::<u8>(), 112), device in 0u64..(1 << 40)) {
        let mut block = [0u8; SUPERBLOCK_BYTES];
        block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        block[8..12].copy_from_slice(&VERSION.to_le_bytes());
        block[12..124].copy_from_slice(&body);
        let crc = crc32c::crc32c(&block[8..124]);
        block[124..].copy_from_slice(&crc.to_le_bytes());
        match decode(&block, device) {
            Ok(superblock) => {
                // Whatever passes must be self-consistent and re-encode to the same bytes.
                prop_assert!(superblock.device_index < superblock.device_count);
                prop_assert!(superblock.capacity_bytes <= device);
                prop_assert_eq!(superblock.encode(), block);
            }
            Err(VolumeError::BadSuperblock { field, .. }) => prop_assert!(!field.is_empty()),
            Err(other) => prop_assert!(false, "unexpected error kind: {other}"),
        }
    }
}
