//! A crash at any point of `format` never leaves devices that open as a valid but wrong
//! volume: every crash image either refuses to open with a named error or opens as exactly
//! the volume that was being formatted.

use pmem::Tracer;
use volume::{Volume, VolumeError};

const DEVICE_BYTES: u64 = 4 << 20;
const UUID: [u8; 16] = [0x5a; 16];

/// Opens every crash image; each must be refused with a named error or open as one whole
/// volume whose uuid is in `acceptable`. Returns how many opened per acceptable uuid, and
/// how many were refused.
fn check_images(
    tracer: &Tracer,
    nodes: &[Option<u32>],
    acceptable: &[[u8; 16]],
) -> (Vec<usize>, usize) {
    let (mut opened, mut refused) = (vec![0; acceptable.len()], 0);
    for point in 0..tracer.crash_points() {
        let seed = 0x10c0 + point as u64;
        for image in tracer.crash_images(point, 512, seed) {
            let replay = Tracer::new();
            let regions = image
                .regions
                .iter()
                .map(|bytes| replay.region_with(bytes.clone()))
                .collect();
            match Volume::open_devices(
                testkit::sources(regions, nodes),
                testkit::one_node(),
                &testkit::quiet_options(),
            ) {
                Ok(volume) => {
                    let which = acceptable.iter().position(|&u| u == volume.uuid());
                    let which = which.unwrap_or_else(|| {
                        panic!("opened as a wrong volume at {}", image.description)
                    });
                    assert_eq!(
                        volume.device_count(),
                        nodes.len() as u32,
                        "{}",
                        image.description
                    );
                    opened[which] += 1;
                }
                Err(
                    VolumeError::NotFormatted { .. }
                    | VolumeError::BadSuperblock { .. }
                    | VolumeError::Mismatch { .. },
                ) => refused += 1,
                Err(other) => panic!("unexpected error {other} at {}", image.description),
            }
        }
    }
    (opened, refused)
}

#[test]
fn crash_while_formatting_fresh_devices() {
    let tracer = Tracer::new();
    let nodes = [Some(0), Some(0)];
    let devices = testkit::traced_devices(&tracer, &[DEVICE_BYTES, DEVICE_BYTES], &nodes);
    Volume::format_devices(&devices, UUID).unwrap();
    let (opened, refused) = check_images(&tracer, &nodes, &[UUID]);
    assert!(
        opened[0] > 0 && refused > 0,
        "both outcomes must occur: {opened:?} opened, {refused} refused"
    );
}

#[test]
fn crash_while_reformatting_over_an_old_volume() {
    let tracer = Tracer::new();
    let nodes = [Some(0), Some(0)];
    let devices = testkit::traced_devices(&tracer, &[DEVICE_BYTES, DEVICE_BYTES], &nodes);
    Volume::format_devices(&devices, [0x11; 16]).unwrap();
    // Start tracing from the old volume as durable contents.
    let old = tracer.contents();
    let tracer = Tracer::new();
    let regions: Vec<_> = old
        .into_iter()
        .map(|bytes| tracer.region_with(bytes))
        .collect();
    Volume::format_devices(&testkit::sources(regions, &nodes), UUID).unwrap();
    // Before the first store the old volume is whole and correct; after the last, the new.
    let (opened, refused) = check_images(&tracer, &nodes, &[[0x11; 16], UUID]);
    assert!(
        opened[0] > 0 && opened[1] > 0 && refused > 0,
        "{opened:?} opened, {refused} refused"
    );
}
