//! Extended attributes through the public API: set (with `XATTR_CREATE`/`XATTR_REPLACE`),
//! get, list, remove, the limits and namespaces, a link's own attributes, and that all of it
//! is kept across a crash (the journal, including many sets that fill it) and an unmount
//! (the snapshot). POSIX ACLs: the mode following them and they a `chmod`, inheritance,
//! garbage refused, all kept across a crash and an unmount.

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
    for name in ["system.posix_acl_other", "security.capability", "other.x"] {
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

/// An ACL in the kernel's layout: (tag, permissions, id) entries after the version.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

const ANY: u32 = u32::MAX;

#[test]
fn posix_acls_follow_the_mode_are_inherited_and_kept() {
    let shm = shm_volume("acls", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let mode = |fs: &Fs, path: &str| fs.stat(path).unwrap().mode & 0o7777;
    let access = |fs: &Fs, path: &str| fs.get_xattr(path, fs::ACL_ACCESS, true).ok();
    // user::rw- user:1000:rwx group::r-- mask::rwx other::---
    let named = acl(&[
        (1, 6, ANY),
        (2, 7, 1000),
        (4, 4, ANY),
        (0x10, 7, ANY),
        (0x20, 0, ANY),
    ]);
    fs.create("/f").unwrap();
    fs.chmod("/f", 0o4644).unwrap();
    fs.set_xattr("/f", fs::ACL_ACCESS, &named, XattrSet::Any, true)
        .unwrap();
    assert_eq!(mode(&fs, "/f"), 0o4670, "the mode takes the ACL's digits");
    fs.chmod("/f", 0o640).unwrap();
    let chmodded = acl(&[
        (1, 6, ANY),
        (2, 7, 1000),
        (4, 4, ANY),
        (0x10, 4, ANY),
        (0x20, 0, ANY),
    ]);
    assert_eq!(
        access(&fs, "/f"),
        Some(chmodded.clone()),
        "chmod sets the mask"
    );
    // An ACL that says no more than a mode is the mode alone.
    fs.create("/plain").unwrap();
    let plain = acl(&[(1, 7, ANY), (4, 5, ANY), (0x20, 1, ANY)]);
    fs.set_xattr("/plain", fs::ACL_ACCESS, &plain, XattrSet::Any, true)
        .unwrap();
    assert_eq!((mode(&fs, "/plain"), access(&fs, "/plain")), (0o751, None));
    assert_eq!(
        fs.list_xattrs("/plain", true).unwrap(),
        Vec::<String>::new()
    );
    // Removing an ACL a file does not have is no error; garbage is, naming the problem.
    fs.remove_xattr("/plain", fs::ACL_ACCESS, true).unwrap();
    let refused = |path: &str, name: &str, value: &[u8]| {
        fs.set_xattr(path, name, value, XattrSet::Any, true)
            .unwrap_err()
            .to_string()
    };
    assert!(refused("/f", fs::ACL_ACCESS, &named[..9]).contains("8-byte entries"));
    let unmasked = acl(&[(1, 6, ANY), (2, 7, 1000), (4, 4, ANY), (0x20, 0, ANY)]);
    assert!(refused("/f", fs::ACL_ACCESS, &unmasked).contains("no mask"));
    assert!(refused("/f", fs::ACL_DEFAULT, &named).contains("only a directory"));
    assert_eq!(
        access(&fs, "/f"),
        Some(chmodded.clone()),
        "refusals change nothing"
    );

    // A directory's default ACL: what is made in it inherits it, limited by the mode it
    // is made with, and a umask plays no part; outside, the umask does.
    fs.mkdir("/d", 0o755).unwrap();
    fs.set_xattr("/d", fs::ACL_DEFAULT, &named, XattrSet::Any, true)
        .unwrap();
    let masking = fs.with_umask(0o077);
    let rw_all = fs::OpenOptions {
        mode: 0o666,
        ..fs::OpenOptions::create()
    };
    masking.open_file("/d/a", rw_all).unwrap();
    masking.mkdir("/d/sub", 0o777).unwrap();
    masking.open_file("/outside", rw_all).unwrap();
    assert_eq!(mode(&fs, "/d/a"), 0o660);
    let inherited = acl(&[
        (1, 6, ANY),
        (2, 7, 1000),
        (4, 4, ANY),
        (0x10, 6, ANY),
        (0x20, 0, ANY),
    ]);
    assert_eq!(access(&fs, "/d/a"), Some(inherited.clone()));
    assert_eq!(mode(&fs, "/d/sub"), 0o670);
    assert_eq!(
        fs.get_xattr("/d/sub", fs::ACL_DEFAULT, true).unwrap(),
        named,
        "a directory takes the default ACL on"
    );
    assert_eq!(
        (mode(&fs, "/outside"), access(&fs, "/outside")),
        (0o600, None)
    );
    drop(masking);

    let expect = |fs: &Fs, when: &str| {
        assert_eq!(mode(fs, "/f"), 0o640, "{when}");
        assert_eq!(access(fs, "/f"), Some(chmodded.clone()), "{when}");
        assert_eq!(
            (mode(fs, "/plain"), access(fs, "/plain")),
            (0o751, None),
            "{when}"
        );
        assert_eq!(access(fs, "/d/a"), Some(inherited.clone()), "{when}");
        assert_eq!(mode(fs, "/d/a"), 0o660, "{when}");
        assert_eq!(
            fs.get_xattr("/d/sub", fs::ACL_DEFAULT, true).unwrap(),
            named,
            "{when}"
        );
    };
    check_across_crash_and_unmount(fs, &shm.dir, expect);
}
