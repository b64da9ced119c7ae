//! Extended attributes through the public API: set (with `XATTR_CREATE`/`XATTR_REPLACE`),
//! get, list, remove, the limits and namespaces, a link's own attributes, and that all of it
//! is kept across a crash (the journal, including many sets that fill it) and an unmount
//! (the snapshot).

use testkit::*;

use fs::{Fs, FsError, Kind, MAX_XATTR_BYTES, MAX_XATTR_VALUE, XattrSet};

#[test]
fn attributes_are_set_listed_removed_and_kept() {
    let shm = shm_volume("xattrs", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    fs.create("/d/f").unwrap().write_at(b"data", 0).unwrap();
    fs.symlink("f", "/d/l").unwrap();
    fs.mknod("/d/p", Kind::Fifo, 0o600, 0).unwrap();

    let ctime = fs.stat("/d/f").unwrap().ctime_ns;
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.set_xattr("/d/f", "user.mime", b"text/plain", XattrSet::Any, true)
        .unwrap();
    assert!(
        fs.stat("/d/f").unwrap().ctime_ns > ctime,
        "a set changes ctime"
    );
    fs.set_xattr("/d/f", "user.bin", &[0, 255, 0], XattrSet::Create, true)
        .unwrap();
    fs.set_xattr("/d/f", "user.empty", b"", XattrSet::Any, true)
        .unwrap();
    fs.set_xattr("/d", "trusted.overlay.opaque", b"y", XattrSet::Any, true)
        .unwrap();
    fs.set_xattr("/d/l", "security.label", b"link", XattrSet::Any, false)
        .unwrap();
    fs.set_xattr("/d/p", "user.on-a-fifo", b"1", XattrSet::Any, true)
        .unwrap();
    assert_eq!(
        fs.list_xattrs("/d/f", true).unwrap(),
        ["user.bin", "user.empty", "user.mime"]
    );
    assert_eq!(fs.get_xattr("/d/f", "user.bin", true).unwrap(), [0, 255, 0]);
    assert!(fs.get_xattr("/d/f", "user.empty", true).unwrap().is_empty());
    assert!(fs.list_xattrs("/d/f", false).unwrap().len() == 3);
    // A link's own attributes are not its target's; following is the caller's.
    assert_eq!(fs.list_xattrs("/d/l", false).unwrap(), ["security.label"]);
    assert!(matches!(
        fs.get_xattr("/d/l", "security.label", true),
        Err(FsError::Symlink { .. })
    ));

    // Flags, names, sizes.
    let err = |r: fs::Result<()>| r.unwrap_err().errno();
    assert_eq!(
        err(fs.set_xattr("/d/f", "user.mime", b"x", XattrSet::Create, true)),
        libc::EEXIST
    );
    assert_eq!(
        err(fs.set_xattr("/d/f", "user.nothing", b"x", XattrSet::Replace, true)),
        libc::ENODATA
    );
    fs.set_xattr("/d/f", "user.mime", b"text/x-rust", XattrSet::Replace, true)
        .unwrap();
    assert_eq!(
        fs.get_xattr("/d/f", "user.nothing", true)
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    assert_eq!(
        err(fs.remove_xattr("/d/f", "user.nothing", true)),
        libc::ENODATA
    );
    for name in ["system.posix_acl_access", "security.capability", "other.x"] {
        assert_eq!(
            err(fs.set_xattr("/d/f", name, b"x", XattrSet::Any, true)),
            libc::EOPNOTSUPP,
            "{name}"
        );
    }
    assert_eq!(
        err(fs.set_xattr(
            "/d/f",
            "user.big",
            &vec![1; MAX_XATTR_VALUE + 1],
            XattrSet::Any,
            true
        )),
        libc::E2BIG
    );
    assert_eq!(
        err(fs.set_xattr("/nothing", "user.a", b"", XattrSet::Any, true)),
        libc::ENOENT
    );
    // 256 KiB of names and values per inode.
    fs.create("/full").unwrap();
    let value = vec![7u8; 16 << 10];
    let mut stored = 0;
    loop {
        let name = format!("user.v{stored}");
        match fs.set_xattr("/full", &name, &value, XattrSet::Any, true) {
            Ok(()) => stored += 1,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    assert_eq!(
        stored,
        MAX_XATTR_BYTES / (16 << 10) - 1,
        "the last did not fit"
    );
    // A record that could never fit this volume's 64 KiB journals is refused, not waited on.
    fs.create("/huge").unwrap();
    assert_eq!(
        err(fs.set_xattr(
            "/huge",
            "user.huge",
            &vec![1; MAX_XATTR_VALUE],
            XattrSet::Any,
            true
        )),
        libc::E2BIG
    );
    // Many sets: the journal fills and snapshots empty it on the way.
    for i in 0..2_000u32 {
        fs.set_xattr(
            "/d/f",
            "user.counter",
            &i.to_le_bytes(),
            XattrSet::Any,
            true,
        )
        .unwrap();
    }
    fs.remove_xattr("/d/f", "user.empty", true).unwrap();
    // Through a handle, after the last name is gone.
    let open = fs.open_read("/huge").unwrap();
    fs.unlink("/huge").unwrap();
    open.set_xattr("user.orphan", b"o", XattrSet::Any).unwrap();
    assert_eq!(open.list_xattrs(), ["user.orphan"]);
    open.remove_xattr("user.orphan").unwrap();
    drop(open);

    let expect = |fs: &Fs, when: &str| {
        let all = |path: &str, follow: bool| -> Vec<(String, Vec<u8>)> {
            fs.list_xattrs(path, follow)
                .unwrap()
                .into_iter()
                .map(|n| {
                    let v = fs.get_xattr(path, &n, follow).unwrap();
                    (n, v)
                })
                .collect()
        };
        let v = |n: &str, v: &[u8]| (n.to_owned(), v.to_vec());
        assert_eq!(
            all("/d/f", true),
            [
                v("user.bin", &[0, 255, 0]),
                v("user.counter", &1999u32.to_le_bytes()),
                v("user.mime", b"text/x-rust"),
            ],
            "{when}"
        );
        assert_eq!(
            all("/d", true),
            [v("trusted.overlay.opaque", b"y")],
            "{when}"
        );
        assert_eq!(all("/d/l", false), [v("security.label", b"link")], "{when}");
        assert_eq!(all("/d/p", true), [v("user.on-a-fifo", b"1")], "{when}");
        assert_eq!(all("/full", true).len(), stored, "{when}");
    };
    check_across_crash_and_unmount(fs, &shm.dir, expect);
}
