//! Every field of a damaged superblock is rejected with an error naming that field, and
//! devices that do not form one whole volume are refused with a clear reason.

use pmem::Tracer;
use volume::superblock::{SUPERBLOCK_BYTES, Superblock};
use volume::{Volume, VolumeError};

const DEVICE_BYTES: u64 = 8 << 20;

fn formatted() -> [u8; SUPERBLOCK_BYTES] {
    Superblock::new([7; 16], 1, 3, Some(0), DEVICE_BYTES, 42).encode()
}

/// Puts `value` at `at` and fixes the CRC, so only the field's own check can catch it.
fn with_field(at: usize, value: &[u8]) -> [u8; SUPERBLOCK_BYTES] {
    let mut bytes = formatted();
    bytes[at..at + value.len()].copy_from_slice(value);
    let crc = crc32c::crc32c(&bytes[8..124]);
    bytes[124..128].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn field_error(bytes: &[u8; SUPERBLOCK_BYTES]) -> &'static str {
    match Superblock::decode(bytes, "/dev/test", DEVICE_BYTES) {
        Err(VolumeError::BadSuperblock { field, .. }) => field,
        other => panic!("expected a named field error, got {other:?}"),
    }
}

#[test]
fn a_good_superblock_round_trips() {
    let decoded = Superblock::decode(&formatted(), "/dev/test", DEVICE_BYTES).unwrap();
    assert_eq!(
        decoded,
        Superblock::new([7; 16], 1, 3, Some(0), DEVICE_BYTES, 42)
    );
}

#[test]
fn each_field_is_checked_by_name() {
    let cases: [(&str, usize, Vec<u8>); 9] = [
        ("version", 8, 2u32.to_le_bytes().to_vec()),
        ("header_bytes", 12, 64u32.to_le_bytes().to_vec()),
        ("volume_uuid", 16, vec![0; 16]),
        ("device_index", 32, 3u32.to_le_bytes().to_vec()),
        ("device_count", 36, 0u32.to_le_bytes().to_vec()),
        ("block_bytes", 44, 512u32.to_le_bytes().to_vec()),
        (
            "capacity_bytes",
            48,
            (DEVICE_BYTES * 2).to_le_bytes().to_vec(),
        ),
        ("data_offset_bytes", 56, 4096u64.to_le_bytes().to_vec()),
        ("data_bytes", 64, (DEVICE_BYTES).to_le_bytes().to_vec()),
    ];
    for (field, at, value) in cases {
        assert_eq!(
            field_error(&with_field(at, &value)),
            field,
            "corrupting {field}"
        );
    }
    assert_eq!(field_error(&with_field(100, &[1])), "reserved");
    assert_eq!(
        field_error(&with_field(64, &4097u64.to_le_bytes())),
        "data_bytes"
    );
}

#[test]
fn a_flipped_bit_anywhere_is_a_checksum_error_and_no_magic_is_unformatted() {
    for byte in 8..124 {
        let mut bytes = formatted();
        bytes[byte] ^= 0x10;
        let error = Superblock::decode(&bytes, "/dev/test", DEVICE_BYTES).unwrap_err();
        let field = match error {
            VolumeError::BadSuperblock { field, .. } => field,
            other => panic!("byte {byte}: {other:?}"),
        };
        // The version is checked before the CRC so a future format says so plainly.
        assert!(
            field == "crc32c" || (field == "version" && byte < 12),
            "byte {byte}: {field}"
        );
    }
    let mut bytes = formatted();
    bytes[0] = b'X';
    assert!(matches!(
        Superblock::decode(&bytes, "/dev/test", DEVICE_BYTES),
        Err(VolumeError::NotFormatted { .. })
    ));
}

#[test]
fn devices_from_two_volumes_or_a_missing_device_do_not_open() {
    let tracer = Tracer::new();
    let a = testkit::traced_devices(&tracer, &[DEVICE_BYTES, DEVICE_BYTES], &[Some(0), Some(0)]);
    let b = testkit::traced_devices(&tracer, &[DEVICE_BYTES, DEVICE_BYTES], &[Some(0), Some(0)]);
    Volume::format_devices(&a, [1; 16]).unwrap();
    Volume::format_devices(&b, [2; 16]).unwrap();

    let mixed = vec![a[0].clone(), b[1].clone()];
    let error =
        Volume::open_devices(mixed, testkit::one_node(), &testkit::quiet_options()).unwrap_err();
    assert!(error.to_string().contains("belongs to volume"), "{error}");

    let missing = vec![a[1].clone()];
    let error =
        Volume::open_devices(missing, testkit::one_node(), &testkit::quiet_options()).unwrap_err();
    assert!(
        error.to_string().contains("device 0") && error.to_string().contains("missing"),
        "{error}"
    );

    let twice = vec![a[0].clone(), a[0].clone()];
    let error =
        Volume::open_devices(twice, testkit::one_node(), &testkit::quiet_options()).unwrap_err();
    assert!(error.to_string().contains("both device 0"), "{error}");

    let unformatted = testkit::traced_devices(&tracer, &[DEVICE_BYTES], &[Some(0)]);
    let error = Volume::open_devices(unformatted, testkit::one_node(), &testkit::quiet_options())
        .unwrap_err();
    assert!(matches!(error, VolumeError::NotFormatted { .. }), "{error}");

    let reordered = vec![a[1].clone(), a[0].clone()];
    let volume =
        Volume::open_devices(reordered, testkit::one_node(), &testkit::quiet_options()).unwrap();
    assert_eq!(
        volume.stats()[0].path,
        "dev0",
        "devices are numbered by their superblocks"
    );
}
