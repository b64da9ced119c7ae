//! The file system's behaviour through its public API, on an emulated device, across
//! unmount/open and across a crash-like drop without unmount.

mod common;

use common::*;
use fs::{Fs, FsError, Kind, OpenOptions};

#[test]
fn namespace_operations_and_their_errors() {
    let shm = shm_volume("namespace", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/a", 0o755).unwrap();
    fs.mkdir("/a/b", 0o700).unwrap();
    let f = fs.create("/a/b/file").unwrap();
    f.write_at(b"hello", 0).unwrap();
    drop(f);
    assert!(matches!(fs.mkdir("/a", 0o755), Err(FsError::Exists(_))));
    assert!(matches!(fs.rmdir("/a"), Err(FsError::NotEmpty(_))));
    assert!(matches!(fs.unlink("/a/b"), Err(FsError::IsDir(_))));
    assert!(matches!(fs.rmdir("/a/b/file"), Err(FsError::NotDir(_))));
    assert!(matches!(fs.stat("/nope"), Err(FsError::NotFound(_))));
    assert!(matches!(fs.create("/a/b/file/x"), Err(FsError::NotDir(_))));
    assert!(matches!(
        fs.rename("/a", "/a/b/c"),
        Err(FsError::Invalid(_))
    ));
    let long = "n".repeat(256);
    let err = fs.create(&format!("/{long}")).unwrap_err();
    assert_eq!(err.errno(), libc::ENAMETOOLONG);
    assert_eq!(FsError::NotFound("x".into()).errno(), libc::ENOENT);
    assert!(matches!(
        fs.open_file(
            "/a/b/file",
            OpenOptions {
                create: true,
                exclusive: true,
                ..OpenOptions::create()
            }
        ),
        Err(FsError::Exists(_))
    ));

    // Rename replacing a file is atomic; the old target's blocks go back to the volume.
    let g = fs.create("/g").unwrap();
    g.write_at(&vec![1u8; 1 << 20], 0).unwrap();
    g.close().unwrap();
    fs.rename("/a/b/file", "/g").unwrap();
    let st = fs.stat("/g").unwrap();
    assert_eq!((st.kind, st.size), (Kind::File, 5));
    let names: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a", "g"]);
    assert!(fs.readdir("/a/b").unwrap().is_empty());
    fs.rmdir("/a/b").unwrap();
    fs.rename("/a", "/z").unwrap();
    assert_eq!(fs.stat("/z").unwrap().nlink, 2);
    fs.chmod("/g", 0o600).unwrap();
    fs.unmount().unwrap();

    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let names: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["g", "z"]);
    let g = fs.open_read("/g").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(g.stat().mode, 0o600);
}

#[test]
fn writes_reads_truncate_and_recovery_without_unmount() {
    let shm = shm_volume("data", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    let mut model = vec![0u8; 3 << 20];
    let writes: &[(u64, usize)] = &[
        (0, 4096),
        (4096 * 3, 8192),
        (100, 1000),
        (5000, 20_000),
        (1 << 20, 2 << 20),
        (12_345, 1),
        ((1 << 20) + 4096, 4096),
    ];
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let data = pattern(i as u64, offset, len);
        f.write_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    let mut z = fs.buffer(8192).unwrap();
    let data = pattern(99, 8192, 8192);
    z.write(0, &data).unwrap();
    f.write_buffer(z, 8192).unwrap();
    model[8192..16384].copy_from_slice(&data);
    let check = |f: &fs::File, model: &[u8]| {
        let mut back = vec![0u8; model.len() + 100];
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(n, model.len());
        assert!(back[..n] == *model, "contents differ");
    };
    check(&f, &model);
    fs.checkpoint().unwrap();
    let stats = fs.stats();
    assert_eq!(stats.records_pending, 0);
    assert!(stats.remapped_blocks > 0, "{stats:?}");
    check(&f, &model);

    f.set_len(10_000).unwrap();
    model.truncate(10_000);
    check(&f, &model);
    f.set_len(20_000).unwrap();
    model.resize(20_000, 0);
    check(&f, &model);
    let tail = pattern(7, 15_000, 3000);
    f.write_at(&tail, 15_000).unwrap();
    model[15_000..18_000].copy_from_slice(&tail);

    // No unmount: stop as a crash would, with writes logged and not all checkpointed.
    let pending = fs.stats().records_pending;
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let f = fs.open_read("/f").unwrap();
    check(&f, &model);
    eprintln!("recovered with {pending} records pending at the crash");
    fs.checkpoint().unwrap();
    check(&f, &model);
}
