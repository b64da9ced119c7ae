//! Shared mappings through the file system's API: the runs `map_shared` returns are the
//! file's own blocks (stores through them are the file's bytes, reads and writes see each
//! other's), they never move while mapped (a large write is copied, not remapped; a punched
//! hole is zeros), holes are filled when mapped, synced stores survive a crash, and a volume
//! with data checksums refuses.

#![allow(unsafe_code, reason = "the test stores through the mapped memory")]

use testkit::*;

use fs::{Fs, FsError, MappedRun};

/// The mapped bytes of `runs`, in file order.
fn mapped(runs: &[MappedRun]) -> Vec<u8> {
    let mut out = Vec::new();
    for run in runs {
        // SAFETY: the run is a live mapping of the volume's device in this process.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(run.addr as *const u8, run.len as usize)
        });
    }
    out
}

/// Stores `data` at file offset `at` through the mapping.
fn store(runs: &[MappedRun], at: u64, data: &[u8]) {
    let run = runs
        .iter()
        .find(|r| r.offset <= at && at + data.len() as u64 <= r.offset + r.len)
        .expect("a run covers the store");
    // SAFETY: within the run, a live shared mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            (run.addr + (at - run.offset) as usize) as *mut u8,
            data.len(),
        );
    }
}

fn read(f: &fs::File, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    assert_eq!(f.read_at(&mut buf, at).unwrap(), len);
    buf
}

#[test]
fn a_mapping_is_the_file_and_survives_a_crash() {
    let shm = shm_volume("mapped", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    f.write_at(&[1u8; 10_000], 0).unwrap(); // logged, maybe not yet checkpointed
    f.set_len(128 << 10).unwrap();
    let runs = f.map_shared(0, 256 << 10).unwrap();
    assert!(f.is_mapped());
    let total: u64 = runs.iter().map(|r| r.len).sum();
    assert_eq!(total, 128 << 10, "the blocks within the size: {runs:?}");
    let bytes = mapped(&runs);
    assert!(bytes[..10_000].iter().all(|&b| b == 1));
    assert!(bytes[10_000..].iter().all(|&b| b == 0));

    // A store through the mapping is the file's; a write is the mapping's.
    store(&runs, 100, b"stored");
    assert_eq!(read(&f, 100, 6), b"stored");
    f.write_at(b"written", 5000).unwrap();
    assert_eq!(&mapped(&runs)[5000..5007], b"written");
    // A write of many whole blocks (remapped when nothing maps the file) lands in place.
    f.write_at(&[7u8; 128 << 10], 0).unwrap();
    assert!(mapped(&runs).iter().all(|&b| b == 7));
    assert_eq!(
        f.map_shared(0, 128 << 10).unwrap(),
        runs,
        "the blocks did not move"
    );
    f.unmap_shared();
    // A punched hole is zeros in the same blocks.
    f.punch_hole(4096, 4096).unwrap();
    assert!(mapped(&runs)[4096..8192].iter().all(|&b| b == 0));
    assert!(read(&f, 4096, 4096).iter().all(|&b| b == 0));
    // Shrinking into a block zeroes its tail in place (the caller unmaps what is past the
    // end first; the blocks before it stay).
    f.set_len(10_000).unwrap();
    assert!(mapped(&runs)[10_000..12_288].iter().all(|&b| b == 0));
    assert_eq!(f.map_shared(0, 128 << 10).unwrap()[0].addr, runs[0].addr);
    f.unmap_shared();

    // Synced stores are on the media: a crash keeps them.
    store(&runs, 8192, b"durable");
    f.sync_mapped(8192, 7).unwrap();
    f.unmap_shared();
    assert!(!f.is_mapped());
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let f = fs.open_read("/f").unwrap();
    assert_eq!(read(&f, 8192, 7), b"durable");
    assert_eq!(read(&f, 100, 6), [7u8; 6]);
    assert_eq!(f.len(), 10_000);
    drop(f);
    fs.unmount().unwrap();
}

#[test]
fn holes_are_filled_when_mapped_and_arguments_are_checked() {
    let shm = shm_volume("mapped-holes", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/sparse").unwrap();
    f.set_len(1 << 20).unwrap();
    f.write_at(b"x", 300_000).unwrap();
    assert!(f.stat().allocated < 1 << 20);
    let runs = f.map_shared(0, 1 << 20).unwrap();
    assert_eq!(
        f.stat().allocated,
        1 << 20,
        "every block within the size has memory"
    );
    let bytes = mapped(&runs);
    assert_eq!(bytes.len(), 1 << 20);
    assert_eq!(bytes[300_000], b'x');
    assert_eq!(bytes.iter().filter(|&&b| b != 0).count(), 1);
    // Past the end: nothing to map.
    assert!(f.map_shared(2 << 20, 4096).unwrap().is_empty());
    f.unmap_shared();
    assert!(matches!(f.map_shared(100, 4096), Err(FsError::Invalid(_))));
    assert!(matches!(f.map_shared(0, 0), Err(FsError::Invalid(_))));
    f.unmap_shared();
    assert!(!f.is_mapped());
    // The filled holes are journaled: after a crash the file still has its blocks.
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let f = fs.open_read("/sparse").unwrap();
    assert_eq!(f.stat().allocated, 1 << 20);
    assert_eq!(read(&f, 300_000, 1), b"x");
    drop(f);
    fs.unmount().unwrap();

    let shm = shm_volume("mapped-checksums", 256 << 20);
    let format = fs::FormatOptions {
        data_checksums: true,
        ..small_format()
    };
    let fs = Fs::format(open_volume(&shm.dir), &format, small_options()).unwrap();
    let f = fs.create("/c").unwrap();
    f.write_at(b"data", 0).unwrap();
    let err = f.map_shared(0, 4096).unwrap_err();
    assert!(matches!(err, FsError::NotSupported(_)), "{err}");
    assert_eq!(err.errno(), libc::EOPNOTSUPP);
    assert!(!f.is_mapped());
    drop(f);
    fs.unmount().unwrap();
}
