//! Owners through the public API: what each kind is made with (the handle's owner, a
//! set-group-ID directory's group), what `set_owner` changes (and the set-ID bits it clears),
//! and that all of it is kept across a crash (the journal) and an unmount (the snapshot).

use testkit::*;

use fs::{Fs, FsError, Kind, Owner};

const ALICE: Owner = Owner {
    uid: 1000,
    gid: 100,
};
const BOB: Owner = Owner {
    uid: 1001,
    gid: 101,
};

fn owner(fs: &Fs, path: &str) -> (Option<u32>, Option<u32>, u32) {
    let st = fs.lstat(path).unwrap();
    (st.uid, st.gid, st.mode)
}

#[test]
fn owners_are_made_changed_inherited_and_kept() {
    let shm = shm_volume("owners", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let me = Owner::of_process();
    assert_eq!(fs.owner(), me, "a handle creates as its process");
    let root = fs.stat("/").unwrap();
    assert_eq!((root.uid, root.gid), (Some(me.uid), Some(me.gid)));

    let alice = fs.as_owner(ALICE);
    alice.mkdir("/a", 0o750).unwrap();
    alice.create("/a/f").unwrap().write_at(b"alice", 0).unwrap();
    alice.symlink("f", "/a/l").unwrap();
    alice.mknod("/a/p", Kind::Fifo, 0o600, 0).unwrap();
    fs.create("/mine").unwrap();
    for path in ["/a", "/a/f", "/a/l", "/a/p"] {
        let (uid, gid, _) = owner(&fs, path);
        assert_eq!((uid, gid), (Some(1000), Some(100)), "{path}");
    }
    assert_eq!(owner(&fs, "/mine").0, Some(me.uid));

    // A set-group-ID directory gives its group, and its bit to directories made in it.
    alice.mkdir("/shared", 0o775).unwrap();
    alice.chmod("/shared", 0o2775).unwrap();
    let bob = fs.as_owner(BOB);
    bob.mkdir("/shared/d", 0o755).unwrap();
    bob.create("/shared/f").unwrap();
    bob.mkdir("/shared/d/deeper", 0o700).unwrap();
    assert_eq!(owner(&fs, "/shared/d"), (Some(1001), Some(100), 0o2755));
    assert_eq!(owner(&fs, "/shared/f"), (Some(1001), Some(100), 0o644));
    assert_eq!(
        owner(&fs, "/shared/d/deeper"),
        (Some(1001), Some(100), 0o2700)
    );

    // A change of owner clears set-user-ID, and set-group-ID with group execution, of
    // anything but a directory — even when no id changes; one id can change alone.
    fs.chmod("/a/f", 0o6755).unwrap();
    fs.set_owner("/a/f", Some(1001), None, true).unwrap();
    assert_eq!(owner(&fs, "/a/f"), (Some(1001), Some(100), 0o755));
    fs.chmod("/a/f", 0o6745).unwrap();
    fs.set_owner("/a/f", None, None, true).unwrap();
    assert_eq!(owner(&fs, "/a/f"), (Some(1001), Some(100), 0o2745));
    fs.chmod("/a", 0o6750).unwrap();
    fs.set_owner("/a", None, Some(7), true).unwrap();
    assert_eq!(owner(&fs, "/a"), (Some(1000), Some(7), 0o6750));
    // A link's own owner (lchown), or what it leads to.
    fs.set_owner("/a/l", Some(5), Some(5), false).unwrap();
    assert_eq!(owner(&fs, "/a/l").0, Some(5));
    assert_eq!(owner(&fs, "/a/f").0, Some(1001));
    match fs.set_owner("/a/l", Some(6), None, true) {
        Err(FsError::Symlink { link, .. }) => assert_eq!(&*link, "/a/l"),
        other => panic!("a link is the caller's to follow: {other:?}"),
    }
    assert!(matches!(
        fs.set_owner("/nothing", Some(1), None, true),
        Err(FsError::NotFound(_))
    ));
    // Through a handle, after the last name is gone (fchown).
    let open = fs.open_read("/mine").unwrap();
    fs.unlink("/mine").unwrap();
    open.set_owner(Some(3), Some(4)).unwrap();
    let st = open.stat();
    assert_eq!((st.uid, st.gid), (Some(3), Some(4)));
    drop(open);
    let ctime = fs.stat("/a/p").unwrap().ctime_ns;
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.set_owner("/a/p", Some(9), Some(9), true).unwrap();
    assert!(
        fs.stat("/a/p").unwrap().ctime_ns > ctime,
        "chown changes ctime"
    );

    let expect = |fs: &Fs, when: &str| {
        let seen: Vec<_> = [
            "/a",
            "/a/f",
            "/a/l",
            "/a/p",
            "/shared",
            "/shared/d",
            "/shared/f",
            "/shared/d/deeper",
        ]
        .iter()
        .map(|p| owner(fs, p))
        .collect();
        assert_eq!(
            seen,
            [
                (Some(1000), Some(7), 0o6750),
                (Some(1001), Some(100), 0o2745),
                (Some(5), Some(5), 0o777),
                (Some(9), Some(9), 0o600),
                (Some(1000), Some(100), 0o2775),
                (Some(1001), Some(100), 0o2755),
                (Some(1001), Some(100), 0o644),
                (Some(1001), Some(100), 0o2700),
            ],
            "{when}"
        );
    };
    drop((alice, bob));
    check_across_crash_and_unmount(fs, &shm.dir, expect);
}
