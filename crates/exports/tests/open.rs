//! Opening file exports on a real (emulated) volume, without a server: what is created, what
//! is refused and how it is named, and what a fresh export reads.

use std::sync::Arc;

use exports::{ExportSpec, FsExport, OpenError};
use nbd::server::Export;

fn spec(name: &str, path: &str, size: Option<u64>, read_only: bool) -> ExportSpec {
    ExportSpec {
        name: name.into(),
        path: path.into(),
        size,
        read_only,
    }
}

fn file_system() -> (tempfile::TempDir, fs::Fs) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let topology = topology::Topology::read_live().unwrap();
    let config = volume::default_config(dir.path(), &topology, Some(64 << 20)).unwrap();
    volume::Volume::format(dir.path(), &config, false).unwrap();
    fs::format_volume(dir.path(), topology.clone()).unwrap();
    let volume = volume::Volume::open(dir.path(), topology, &Default::default()).unwrap();
    let fs = fs::Fs::open(Arc::new(volume), fs::FsOptions::default()).unwrap();
    (dir, fs)
}

#[test]
fn an_export_is_created_with_its_directories_and_reads_as_zeros() {
    let (_dir, fs) = file_system();
    let export =
        FsExport::open(&fs, &spec("vm", "/images/a/vm.img", Some(8 << 20), false)).unwrap();
    assert_eq!((export.size(), export.read_only()), (8 << 20, false));
    assert_eq!(export.description(), "locus file /images/a/vm.img (8 MiB)");
    assert!(fs.stat("/images/a").is_ok(), "parent directories created");
    let mut bytes = vec![0xAA; 4096];
    export.read(1 << 20, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0));
    // Opened again: the file is there; a larger size grows it, the same size is fine.
    let again =
        FsExport::open(&fs, &spec("vm", "/images/a/vm.img", Some(16 << 20), false)).unwrap();
    assert_eq!(again.size(), 16 << 20);
    let read_only = FsExport::open(&fs, &spec("ro", "/images/a/vm.img", None, true)).unwrap();
    assert!(read_only.read_only());
    assert!(read_only.description().ends_with("(16 MiB, read-only)"));
}

#[test]
fn what_cannot_be_served_is_refused_by_name() {
    let (_dir, fs) = file_system();
    fs.mkdir("/dir", 0o755).unwrap();
    FsExport::open(&fs, &spec("x", "/x.img", Some(1 << 20), false)).unwrap();
    for (asked, says) in [
        (spec("d", "/dir", None, false), "/dir is a directory"),
        (
            spec("m", "/missing.img", None, true),
            "a read-only export serves an existing file",
        ),
        (
            spec("m", "/missing.img", None, false),
            "give size=SIZE to create it",
        ),
        (spec("s", "/x.img", Some(4096), false), "does not shrink"),
        (
            spec("g", "/x.img", Some(2 << 20), true),
            "does not shrink (or, read-only, grow)",
        ),
    ] {
        let error = FsExport::open(&fs, &asked).unwrap_err();
        assert!(matches!(error, OpenError::Refused { .. }), "{error:?}");
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("export {:?}: ", asked.name)),
            "{text}"
        );
        assert!(text.contains(says), "{text}");
    }
}
