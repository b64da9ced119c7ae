//! Symbolic links and time stamps through the public API: what a walk reports, what is kept
//! across an unmount (the snapshot) and across a crash (the journal), and the one ordering
//! that is easy to get wrong — a checkpoint batch logged after a time was set must not
//! bring back the time of a write from before it.

use testkit::*;

use fs::{CheckpointMode, Fs, FsError, FsOptions, Kind};

const SEC: u64 = 1_000_000_000;

fn on_demand() -> FsOptions {
    FsOptions {
        checkpoint: CheckpointMode::OnDemand,
        ..small_options()
    }
}

#[test]
fn links_are_stored_reported_and_never_followed_by_the_file_system() {
    let shm = shm_volume("links", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    fs.create("/d/f").unwrap().write_at(b"data", 0).unwrap();
    fs.symlink("d/f", "/rel").unwrap();
    fs.symlink("/elsewhere/x", "/abs").unwrap();
    fs.symlink("d", "/dirlink").unwrap();

    assert_eq!(fs.readlink("/rel").unwrap(), "d/f");
    let st = fs.lstat("/rel").unwrap();
    assert_eq!((st.kind, st.size, st.mode), (Kind::Symlink, 3, 0o777));
    // Following is the caller's: the link is reported with what it points to.
    match fs.stat("/rel") {
        Err(FsError::Symlink { link, target }) => assert_eq!((&*link, &*target), ("/rel", "d/f")),
        other => panic!("{other:?}"),
    }
    match fs.open_read("/dirlink/f") {
        Err(FsError::Symlink { link, target }) => {
            assert_eq!((&*link, &*target), ("/dirlink", "d"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fs.first_link("/dirlink/f", false),
        Some(("/dirlink".into(), "d".into()))
    );
    assert_eq!(fs.first_link("/rel", false), None);
    assert_eq!(
        fs.first_link("/rel", true),
        Some(("/rel".into(), "d/f".into()))
    );
    assert_eq!(fs.first_link("/d/f", true), None);
    assert_eq!(
        FsError::Symlink {
            link: "/l".into(),
            target: "t".into()
        }
        .errno(),
        libc::ELOOP
    );

    // Names a link can and cannot take part in.
    assert!(matches!(fs.symlink("x", "/rel"), Err(FsError::Exists(_))));
    assert!(matches!(fs.mkdir("/abs", 0o755), Err(FsError::Exists(_))));
    assert!(matches!(fs.rmdir("/dirlink"), Err(FsError::NotDir(_))));
    assert!(matches!(fs.readlink("/d/f"), Err(FsError::Invalid(_))));
    assert!(matches!(fs.symlink("", "/empty"), Err(FsError::Invalid(_))));
    let exclusive = fs::OpenOptions {
        exclusive: true,
        ..fs::OpenOptions::create()
    };
    assert!(matches!(
        fs.open_file("/abs", exclusive),
        Err(FsError::Exists(_))
    ));
    let kinds: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert!(
        kinds.contains(&("dirlink".into(), Kind::Symlink)),
        "{kinds:?}"
    );
    fs.rename("/abs", "/d/moved").unwrap();
    assert_eq!(fs.readlink("/d/moved").unwrap(), "/elsewhere/x");
    fs.unlink("/rel").unwrap();
    assert!(matches!(fs.lstat("/rel"), Err(FsError::NotFound(_))));
    assert_eq!(fs.readlink("/d/moved").unwrap(), "/elsewhere/x");

    // Kept by the snapshot (unmount) and by the journal (a crash).
    let long = "t/".repeat(2000);
    fs.symlink(&long, "/long").unwrap();
    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(fs.readlink("/d/moved").unwrap(), "/elsewhere/x");
    assert_eq!(fs.readlink("/long").unwrap(), long);
    fs.symlink("after/snapshot", "/journaled").unwrap();
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(fs.readlink("/journaled").unwrap(), "after/snapshot");
    assert_eq!(fs.lstat("/journaled").unwrap().size, 14);
    assert_eq!(
        fs.first_link("/dirlink/f", false),
        Some(("/dirlink".into(), "d".into()))
    );
    fs.unmount().unwrap();
}

#[test]
fn times_are_set_to_the_nanosecond_and_kept_across_unmount_and_crash() {
    let shm = shm_volume("times", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/f").unwrap();
    f.write_at(b"x", 0).unwrap();
    let before = fs.stat("/f").unwrap();
    assert!(before.ctime_ns >= before.mtime_ns && before.mtime_ns > 0);

    // tar's order: write, then set both times into the past.
    let (atime, mtime) = (1_500_000_000 * SEC + 123, 1_400_000_000 * SEC + 456_789);
    fs.set_times("/f", Some(atime), Some(mtime), true).unwrap();
    let st = fs.stat("/f").unwrap();
    assert_eq!((st.atime_ns, st.mtime_ns), (atime, mtime));
    assert!(st.ctime_ns >= before.ctime_ns, "the change time moves on");
    // One of the two, the other left.
    f.set_times(None, Some(mtime + 1)).unwrap();
    let st = fs.stat("/f").unwrap();
    assert_eq!((st.atime_ns, st.mtime_ns), (atime, mtime + 1));
    // A write modifies: the time is now again.
    f.write_at(b"y", 1).unwrap();
    assert!(fs.stat("/f").unwrap().mtime_ns > before.mtime_ns);
    f.set_times(None, Some(mtime)).unwrap();
    // A read of a file whose access time is older than its change moves the access time.
    let mut b = [0u8; 2];
    f.read_at(&mut b, 0).unwrap();
    let read = fs.stat("/f").unwrap();
    assert!(read.atime_ns >= read.ctime_ns, "{read:?}");
    f.read_at(&mut b, 0).unwrap();
    assert_eq!(
        fs.stat("/f").unwrap().atime_ns,
        read.atime_ns,
        "a second read leaves it"
    );
    f.set_times(Some(atime), None).unwrap();
    // A directory's and a link's own times.
    fs.mkdir("/d", 0o755).unwrap();
    fs.set_times("/d", None, Some(7 * SEC), true).unwrap();
    fs.symlink("f", "/l").unwrap();
    fs.set_times("/l", Some(3 * SEC), Some(5 * SEC), false)
        .unwrap();
    assert!(matches!(
        fs.set_times("/l", None, Some(1), true),
        Err(FsError::Symlink { .. })
    ));
    drop(f);
    let times = |fs: &Fs, path: &str| {
        let st = fs.lstat(path).unwrap();
        (st.atime_ns, st.mtime_ns, st.ctime_ns)
    };
    let kept = [times(&fs, "/f"), times(&fs, "/d"), times(&fs, "/l")];
    assert_eq!((kept[0].0, kept[0].1), (atime, mtime));
    assert_eq!(
        (kept[1].1, kept[2].0, kept[2].1),
        (7 * SEC, 3 * SEC, 5 * SEC)
    );

    fs.unmount().unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!([times(&fs, "/f"), times(&fs, "/d"), times(&fs, "/l")], kept);
    fs.set_times("/d", Some(11 * SEC), Some(13 * SEC), true)
        .unwrap();
    let d = times(&fs, "/d");
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(times(&fs, "/d"), d, "replayed from the journal");
    fs.unmount().unwrap();
}

/// The write is logged, its time set into the past, and only then does a checkpoint batch
/// carry the write's (later) time into the journal; after a crash, replay must keep the set
/// time. Then a write after the set: its time wins, as it did before the crash.
#[test]
fn a_batch_after_a_set_time_does_not_bring_back_the_write_time() {
    let shm = shm_volume("times-batch", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), on_demand()).unwrap();
    let f = fs.create("/f").unwrap();
    fs.checkpoint().unwrap();
    f.write_at(&[1u8; 8192], 0).unwrap();
    let old = 1_000_000_000 * SEC;
    f.set_times(Some(old), Some(old)).unwrap();
    fs.checkpoint().unwrap(); // the batch is logged after the set
    let g = fs.create("/g").unwrap();
    g.write_at(b"before", 0).unwrap();
    g.set_times(None, Some(old)).unwrap();
    g.write_at(b"after", 0).unwrap();
    let g_time = fs.stat("/g").unwrap().mtime_ns;
    assert!(g_time > old);
    // Closing checkpoints: g's batch comes after its set time too, with a later write.
    drop((f, g));
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), on_demand()).unwrap();
    assert_eq!(fs.stat("/f").unwrap().mtime_ns, old);
    assert_eq!(fs.stat("/g").unwrap().mtime_ns, g_time);
    fs.unmount().unwrap();
}

/// Changes of a file through a handle after its name is gone (truncate, times; its `fstat`
/// says no links are left) are journaled for an inode whose removal replays first: recovery
/// skips them, as it skips writes to it, instead of calling the journal damaged.
#[test]
fn changes_to_an_unlinked_open_file_replay_after_a_crash() {
    let shm = shm_volume("unlinked-changes", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let f = fs.create("/tmp").unwrap();
    f.write_at(&[5u8; 20_000], 0).unwrap();
    assert_eq!(f.stat().nlink, 1);
    fs.unlink("/tmp").unwrap();
    assert_eq!(f.stat().nlink, 0, "no name is left");
    f.set_len(100).unwrap();
    f.set_times(Some(SEC), Some(SEC)).unwrap();
    f.punch_hole(0, 4096).unwrap();
    fs.create("/kept").unwrap().write_at(b"k", 0).unwrap();
    drop(f);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let names: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["kept"]);
    fs.unmount().unwrap();
}

/// A write after its file's times were looked at always moves them on, and no write's time
/// is older than a time handed out before it, on this file or another (what a coarse or
/// multigrain clock for write times would have to keep).
#[test]
fn a_write_after_a_stat_always_moves_the_mtime_on() {
    let tracer = pmem::Tracer::new();
    let fs = format_over(vec![traced_dirty_volume_device(&tracer, 8 << 20)]);
    let (f, g) = (fs.create("/f").unwrap(), fs.create("/g").unwrap());
    let mut last = fs.stat("/f").unwrap().mtime_ns;
    for i in 0..2000u32 {
        f.write_at(&i.to_le_bytes(), 0).unwrap();
        let now = fs.stat("/f").unwrap().mtime_ns;
        assert!(now > last, "write {i}: mtime {now} after {last}");
        last = now;
        // A file written after that time was handed out is not older.
        g.write_at(&i.to_le_bytes(), 0).unwrap();
        let g_time = g.stat().mtime_ns;
        assert!(
            g_time >= now,
            "write {i}: /g {g_time} older than /f's {now}"
        );
    }
    fs.unmount().unwrap();
}

/// Dropping privileges clears set-user-ID, and set-group-ID only with group execution on;
/// it journals only a change, and what it cleared stays cleared after a crash.
#[test]
fn dropped_privileges_clear_set_id_bits_and_replay_after_a_crash() {
    let shm = shm_volume("privileges", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), on_demand()).unwrap();
    let mut files = Vec::new();
    for (name, mode) in [
        ("/a", 0o6775),
        ("/b", 0o6745),
        ("/c", 0o2755),
        ("/d", 0o755),
    ] {
        let f = fs.create(name).unwrap();
        fs.chmod(name, mode).unwrap();
        files.push((name, f));
    }
    // Bytes stored to the media: a journal record adds some, a call that changes nothing none.
    let stored = || fs.stats().media_bytes;
    for ((name, f), (changed, mode)) in
        files
            .iter()
            .zip([(true, 0o775), (true, 0o2745), (true, 0o755), (false, 0o755)])
    {
        let before = stored();
        assert_eq!(f.drop_privileges().unwrap(), changed, "{name}");
        assert_eq!(f.stat().mode, mode, "{name}");
        assert_eq!(stored() > before, changed, "{name}");
        assert!(
            !f.drop_privileges().unwrap(),
            "{name}: nothing left to drop"
        );
    }
    fs.chmod("/d", 0o4700).unwrap();
    assert!(fs.drop_privileges("/d").unwrap());
    // A link is not followed (the kernel asks on `lchown` too); it has nothing to drop.
    fs.symlink("a", "/link").unwrap();
    assert!(!fs.drop_privileges("/link").unwrap());
    drop(files);
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let modes: Vec<u32> = ["/a", "/b", "/c", "/d"]
        .iter()
        .map(|p| fs.stat(p).unwrap().mode)
        .collect();
    assert_eq!(modes, [0o775, 0o2745, 0o755, 0o700]);
    fs.unmount().unwrap();
}

/// Hard links: one file under several names (`nlink` counts them, writes through one are
/// read through another), kept by the journal (a crash) and by the snapshot (an unmount);
/// the file's blocks go with its last name, not before; a rename between two names of one
/// file changes nothing; a directory gets no second name.
#[test]
fn hard_links_share_one_file_until_its_last_name_goes() {
    let shm = shm_volume("hard-links", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    let data = pattern(7, 0, 300_000);
    fs.create("/a").unwrap().write_at(&data, 0).unwrap();
    fs.link("/a", "/d/b").unwrap();
    let (a, b) = (fs.stat("/a").unwrap(), fs.stat("/d/b").unwrap());
    assert_eq!((a.ino, a.nlink, b.nlink), (b.ino, 2, 2));
    let write = fs::OpenOptions {
        write: true,
        ..fs::OpenOptions::default()
    };
    fs.open_file("/d/b", write)
        .unwrap()
        .write_at(b"through b", 0)
        .unwrap();
    assert_eq!(read_all(&fs, "/a")[..9], *b"through b");

    // What a link cannot do.
    assert!(matches!(
        fs.link("/d", "/d2"),
        Err(FsError::NotPermitted(_))
    ));
    assert_eq!(FsError::NotPermitted(String::new()).errno(), libc::EPERM);
    assert!(matches!(fs.link("/a", "/d/b"), Err(FsError::Exists(_))));
    assert!(matches!(
        fs.link("/nothing", "/c"),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        fs.link("/a", "/nodir/c"),
        Err(FsError::NotFound(_))
    ));
    // A symbolic link gets a second name itself (it is not followed).
    fs.symlink("a", "/sym").unwrap();
    fs.link("/sym", "/sym2").unwrap();
    assert_eq!(fs.readlink("/sym2").unwrap(), "a");
    assert_eq!(fs.lstat("/sym").unwrap().nlink, 2);

    // A rename from one name of the file onto another changes nothing.
    fs.rename("/a", "/d/b").unwrap();
    assert_eq!(fs.stat("/a").unwrap().nlink, 2);
    assert_eq!(fs.stat("/d/b").unwrap().nlink, 2);

    // Across a crash: the journal's Link, Remove and Rename records replay the counts.
    fs.link("/a", "/c").unwrap();
    fs.unlink("/a").unwrap();
    fs.create("/other").unwrap().write_at(b"other", 0).unwrap();
    fs.rename("/other", "/c").unwrap(); // replaces one name of the file
    assert_eq!(fs.stat("/d/b").unwrap().nlink, 1);
    fs.abandon();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files, 2, "{check:?}"); // the linked file and /c
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert!(matches!(fs.stat("/a"), Err(FsError::NotFound(_))));
    assert_eq!(read_all(&fs, "/c"), b"other");
    let b = fs.stat("/d/b").unwrap();
    assert_eq!((b.ino, b.nlink, b.size), (a.ino, 1, data.len() as u64));
    let mut expected = data.clone();
    expected[..9].copy_from_slice(b"through b");
    assert!(read_all(&fs, "/d/b") == expected);
    assert_eq!(fs.lstat("/sym2").unwrap().nlink, 2);

    // Across an unmount: the snapshot names the file twice, and the count is taken from it.
    fs.link("/d/b", "/e").unwrap();
    fs.unmount().unwrap();
    let before = Fs::check(&open_volume(&shm.dir)).unwrap();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(fs.stat("/e").unwrap().nlink, 2);
    assert!(read_all(&fs, "/e") == expected);

    // The blocks stay with a name left, and go with the last.
    fs.unlink("/d/b").unwrap();
    assert!(read_all(&fs, "/e") == expected);
    fs.unmount().unwrap();
    let one_name = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(one_name.mapped_bytes, before.mapped_bytes);
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    fs.unlink("/e").unwrap();
    fs.unmount().unwrap();
    let none = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert!(
        none.mapped_bytes + 300_000 <= one_name.mapped_bytes,
        "{none:?} after {one_name:?}"
    );
    assert_eq!(none.files, 1, "{none:?}");
}

fn read_all(fs: &Fs, path: &str) -> Vec<u8> {
    let f = fs.open_read(path).unwrap();
    let mut buf = vec![0u8; f.stat().size as usize];
    f.read_at(&mut buf, 0).unwrap();
    buf
}

/// FIFOs, sockets' names and device nodes: names with a kind, permission bits and (devices)
/// a device number, kept across a crash (the journal's `Create`) and an unmount (the
/// snapshot); they can be renamed, linked and removed, and the file system refuses to open
/// them (the kernel serves them through a mount).
#[test]
fn special_files_are_names_with_a_kind_and_a_device_number() {
    let shm = shm_volume("special-files", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    let dev = libc::makedev(259, 70_000);
    fs.mknod("/fifo", Kind::Fifo, 0o640, 0).unwrap();
    fs.mknod("/sock", Kind::Socket, 0o755, 0).unwrap();
    fs.mknod("/chr", Kind::CharDevice, 0o600, libc::makedev(1, 3))
        .unwrap();
    fs.mknod("/blk", Kind::BlockDevice, 0o660, dev).unwrap();
    let expect = |fs: &Fs, when: &str| {
        let got: Vec<_> = ["/fifo", "/sock", "/chr", "/blk"]
            .iter()
            .map(|p| {
                let st = fs.lstat(p).unwrap();
                (st.kind, st.mode, st.rdev, st.size, st.nlink)
            })
            .collect();
        assert_eq!(
            got,
            [
                (Kind::Fifo, 0o640, 0, 0, 1),
                (Kind::Socket, 0o755, 0, 0, 1),
                (Kind::CharDevice, 0o600, libc::makedev(1, 3), 0, 1),
                (Kind::BlockDevice, 0o660, dev, 0, 1),
            ],
            "{when}"
        );
    };
    expect(&fs, "made");

    // What cannot be made or done.
    assert!(matches!(
        fs.mknod("/f", Kind::File, 0o644, 0),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.mknod("/f", Kind::Fifo, 0o644, 7),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.mknod("/fifo", Kind::Socket, 0o644, 0),
        Err(FsError::Exists(_))
    ));
    let refused = fs.open_read("/fifo").unwrap_err();
    assert!(matches!(refused, FsError::NotSupported(_)), "{refused}");
    assert_eq!(refused.errno(), libc::EOPNOTSUPP);
    assert!(fs.truncate("/blk", 0).is_err());
    assert!(matches!(fs.rmdir("/fifo"), Err(FsError::NotDir(_))));

    // Named like files: listed with their kind, renamed, linked, removed.
    let kinds: Vec<_> = fs
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert!(kinds.contains(&("sock".into(), Kind::Socket)), "{kinds:?}");
    fs.mknod("/gone", Kind::Fifo, 0o600, 0).unwrap();
    fs.link("/fifo", "/fifo2").unwrap();
    assert_eq!(fs.lstat("/fifo").unwrap().nlink, 2);
    fs.unlink("/fifo2").unwrap();
    fs.rename("/gone", "/moved").unwrap();
    fs.unlink("/moved").unwrap();
    fs.chmod("/sock", 0o755).unwrap();

    // Across a crash (journal), then an unmount (snapshot).
    fs.abandon();
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    expect(&fs, "after a crash");
    assert!(matches!(fs.lstat("/moved"), Err(FsError::NotFound(_))));
    fs.unmount().unwrap();
    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files, 0, "{check:?}");
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    expect(&fs, "after an unmount");
    fs.unmount().unwrap();
}

/// A link of a file racing the removal of its last name, over and over: each pair is
/// journaled in the order it changed the count (the link fails when the removal came
/// first), so after a crash every surviving name replays and the counts check.
#[test]
fn links_racing_removals_replay_as_they_ran() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::{Barrier, Mutex};
    let shm = shm_volume("link-race", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/a", 0o755).unwrap();
    fs.mkdir("/b", 0o755).unwrap();
    let rounds = 3000;
    let (start, done) = (Barrier::new(3), Barrier::new(3));
    // A failure (a panic inside the file system included) is recorded, and the threads
    // keep meeting at the barriers without calling it again, so none is left waiting.
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let attempt = |what: &str, op: &mut dyn FnMut() -> Result<(), String>| {
        if failed.lock().unwrap().is_some() {
            return;
        }
        let outcome = catch_unwind(AssertUnwindSafe(&mut *op))
            .unwrap_or_else(|_| Err("the file system panicked".to_owned()));
        if let Err(e) = outcome {
            failed.lock().unwrap().get_or_insert(format!("{what}: {e}"));
        }
    };
    let linked = Mutex::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..rounds {
                start.wait();
                attempt(&format!("unlink {round}"), &mut || {
                    fs.unlink("/a/f").map_err(|e| e.to_string())
                });
                done.wait();
            }
        });
        s.spawn(|| {
            for round in 0..rounds {
                start.wait();
                attempt(&format!("link {round}"), &mut || {
                    match fs.link("/a/f", &format!("/b/{round}")) {
                        Ok(()) => *linked.lock().unwrap() += 1,
                        Err(FsError::NotFound(_)) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                    Ok(())
                });
                done.wait();
            }
        });
        for round in 0..rounds {
            attempt(&format!("create {round}"), &mut || {
                let f = fs.create("/a/f").map_err(|e| e.to_string())?;
                f.write_at(b"x", 0).map_err(|e| e.to_string())
            });
            start.wait();
            done.wait();
        }
    });
    if let Some(failure) = failed.into_inner().unwrap() {
        panic!("{failure}");
    }
    let linked = linked.into_inner().unwrap();
    fs.abandon();
    Fs::check(&open_volume(&shm.dir)).expect("the counts replay");
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    let names = fs.readdir("/b").unwrap();
    assert_eq!(names.len(), linked);
    for entry in names {
        let st = fs.stat(&format!("/b/{}", entry.name)).unwrap();
        assert_eq!((st.nlink, st.size), (1, 1));
    }
    fs.unmount().unwrap();
}

/// `exchange` swaps two names atomically: files, a file and a directory across directories
/// (the directories' link counts and the moved directory's `..` follow), the refusals (a
/// name missing, a directory into itself), two names of one file (nothing changes) — and
/// the same tree after a crash and after an unmount.
#[test]
fn names_are_exchanged_atomically_and_replay() {
    let shm = shm_volume("exchange", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d1", 0o755).unwrap();
    fs.mkdir("/d1/sub", 0o755).unwrap();
    fs.mkdir("/d1/sub/deep", 0o755).unwrap();
    fs.mkdir("/d2", 0o755).unwrap();
    fs.create("/d1/f").unwrap().write_at(b"one", 0).unwrap();
    fs.create("/d2/g").unwrap().write_at(b"two", 0).unwrap();
    let read = |fs: &Fs, path: &str| {
        let file = fs.open_read(path).unwrap();
        let mut buf = vec![0; file.len() as usize];
        file.read_at(&mut buf, 0).unwrap();
        String::from_utf8(buf).unwrap()
    };

    fs.exchange("/d1/f", "/d2/g").unwrap();
    assert_eq!(
        (read(&fs, "/d1/f"), read(&fs, "/d2/g")),
        ("two".into(), "one".into())
    );
    // A directory and a file trade directories.
    let before = fs.stat("/d1").unwrap().ctime_ns;
    fs.exchange("/d1/sub", "/d2/g").unwrap();
    assert_eq!(fs.stat("/d2/g").unwrap().kind, Kind::Dir);
    assert_eq!(read(&fs, "/d1/sub"), "one");
    assert!(
        fs.stat("/d2/g/deep").is_ok(),
        "the directory moved with its entries"
    );
    assert_eq!(
        (fs.stat("/d1").unwrap().nlink, fs.stat("/d2").unwrap().nlink),
        (2, 3)
    );
    assert!(fs.stat("/d1").unwrap().ctime_ns > before);
    // Refusals leave everything as it was.
    assert!(matches!(
        fs.exchange("/d1/f", "/d1/missing"),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        fs.exchange("/d2", "/d2/g/deep"),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.exchange("/d2/g/deep", "/d2"),
        Err(FsError::Invalid(_))
    ));
    fs.link("/d1/f", "/d1/f2").unwrap();
    fs.exchange("/d1/f", "/d1/f2").unwrap();
    assert_eq!(fs.stat("/d1/f").unwrap().nlink, 2);
    // A directory trades places with its parent's sibling: `..` moves.
    fs.exchange("/d2/g", "/d1").unwrap();
    assert_eq!(fs.stat("/d1/deep").unwrap().kind, Kind::Dir);
    assert_eq!(read(&fs, "/d2/g/f"), "two");

    let expect = |fs: &Fs, when: &str| {
        let tree: Vec<_> = ["/d1", "/d1/deep", "/d2", "/d2/g", "/d2/g/sub", "/d2/g/f"]
            .iter()
            .map(|p| (p.to_string(), fs.stat(p).map(|s| (s.kind, s.nlink)).ok()))
            .collect();
        let dir = |n| Some((Kind::Dir, n));
        let file = |n| Some((Kind::File, n));
        assert_eq!(
            tree,
            [
                ("/d1".to_string(), dir(3)),
                ("/d1/deep".to_string(), dir(2)),
                ("/d2".to_string(), dir(3)),
                ("/d2/g".to_string(), dir(2)),
                ("/d2/g/sub".to_string(), file(1)),
                ("/d2/g/f".to_string(), file(2)),
            ],
            "{when}"
        );
        assert_eq!(read(fs, "/d2/g/sub"), "one", "{when}");
    };
    check_across_crash_and_unmount(fs, &shm.dir, expect);
}

/// Runs metadata changes until the checkpoint has taken a snapshot (the journal filled).
fn until_snapshot(fs: &Fs) {
    let before = fs.stats().snapshots;
    let mut i = 0;
    while fs.stats().snapshots == before {
        fs.set_times("/", Some(SEC + i), Some(SEC + i), true)
            .unwrap();
        i += 1;
        assert!(i < 1_000_000, "no snapshot came");
    }
}

/// `O_TMPFILE`: a file made without a name is reached only through its handle, takes its
/// mode and group as a file made in its directory would, gets a name with `File::link` —
/// then stays like any file, across a crash and an unmount — and is gone at its last close
/// or with the process that held it (a crash), whether the journal or a snapshot last saw it.
#[test]
fn unnamed_files_stay_only_once_named() {
    let shm = shm_volume("unnamed", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o2775).unwrap(); // set-group-ID: files made there take its group
    fs.set_owner("/d", None, Some(4321), true).unwrap();
    let fs = {
        let base = fs;
        base.with_umask(0o027)
    };

    // Reached only through its handle.
    let a = fs.create_unnamed("/d", 0o666, true, false).unwrap();
    let st = a.stat();
    assert_eq!((st.nlink, st.mode & 0o7777, st.gid), (0, 0o640, Some(4321)));
    assert!(fs.readdir("/d").unwrap().is_empty());
    let data = pattern(11, 0, 300_000);
    a.write_at(&data, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(a.read_at(&mut back, 0).unwrap(), data.len());
    assert!(back == data);
    assert!(matches!(
        fs.create_unnamed("/d/nothing", 0o600, true, false),
        Err(FsError::NotFound(_))
    ));
    fs.create("/d/plain").unwrap();
    assert!(matches!(
        fs.create_unnamed("/d/plain", 0o600, true, false),
        Err(FsError::NotDir(_))
    ));

    // Named: a file like any other, which a further link names twice.
    assert!(matches!(a.link("/d/plain"), Err(FsError::Exists(_))));
    a.link("/d/a").unwrap();
    assert_eq!(fs.stat("/d/a").unwrap().ino, st.ino);
    assert_eq!(fs.stat("/d/a").unwrap().nlink, 1);
    a.link("/a2").unwrap();
    assert_eq!(a.stat().nlink, 2);
    drop(a);
    assert!(read_all(&fs, "/d/a") == data);

    // Unnamed at the last close: gone, its blocks with it.
    let b = fs.create_unnamed("/d", 0o600, false, true).unwrap();
    b.write_at(&pattern(12, 0, 1 << 20), 0).unwrap();
    // Made exclusive (`O_TMPFILE | O_EXCL`): never named.
    assert!(matches!(b.link("/d/b"), Err(FsError::NotFound(_))));
    drop(b);
    // A file whose names were removed cannot be named again through its handle.
    let c = fs.create("/d/c").unwrap();
    fs.unlink("/d/c").unwrap();
    assert!(matches!(c.link("/d/c2"), Err(FsError::NotFound(_))));
    drop(c);

    // Open across a snapshot: one is named after it, one never; the crash ends both
    // processes' hold.
    let kept = fs.create_unnamed("/", 0o600, true, false).unwrap();
    let lost = fs.create_unnamed("/", 0o600, true, false).unwrap();
    kept.write_at(b"written before the snapshot", 0).unwrap();
    lost.write_at(&pattern(13, 0, 2 << 20), 0).unwrap();
    fs.checkpoint().unwrap();
    until_snapshot(&fs);
    kept.write_at(b"WRITTEN", 0).unwrap();
    kept.link("/kept").unwrap();
    // And one the journal alone saw, never named.
    let journaled = fs.create_unnamed("/d", 0o600, true, false).unwrap();
    journaled.write_at(&pattern(14, 0, 1 << 20), 0).unwrap();
    fs.abandon();
    // Closed after the crash point: nothing of these closes reaches the media.
    drop((lost, journaled, kept));

    let check = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(check.files, 3, "{check:?}"); // /d/a (also /a2), /d/plain, /kept
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(read_all(&fs, "/kept"), b"WRITTEN before the snapshot");
    assert!(read_all(&fs, "/d/a") == data);
    assert_eq!(fs.stat("/a2").unwrap().nlink, 2);
    let names = |dir: &str| -> Vec<String> {
        let mut n: Vec<_> = fs
            .readdir(dir)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        n.sort();
        n
    };
    assert_eq!(names("/"), ["a2", "d", "kept"]);
    assert_eq!(names("/d"), ["a", "plain"]);
    fs.unlink("/kept").unwrap();
    fs.unlink("/a2").unwrap();
    fs.unlink("/d/a").unwrap();
    fs.unmount().unwrap();
    // Every block of the unnamed files came back.
    let after = Fs::check(&open_volume(&shm.dir)).unwrap();
    assert_eq!(after.mapped_bytes, 0, "{after:?}");
}

/// An unmount writes a snapshot only when there is something to keep: after a session that
/// only looked (stat, readdir, reads that leave the access times) the sealed snapshot the
/// file system was opened from stays current, and the root is not rewritten. A read that
/// moves an access time — kept in DRAM, never journaled — still gets its snapshot.
#[test]
fn an_unmount_after_only_looking_writes_nothing() {
    let shm = shm_volume("look", 256 << 20);
    let fs = Fs::format(open_volume(&shm.dir), &small_format(), small_options()).unwrap();
    fs.mkdir("/d", 0o755).unwrap();
    fs.create("/d/f").unwrap().write_at(b"data", 0).unwrap();
    fs.unmount().unwrap();
    let generation = || Fs::check(&open_volume(&shm.dir)).unwrap().generation;
    let written = generation();
    let read = |fs: &Fs| {
        let mut b = [0u8; 4];
        fs.open_read("/d/f").unwrap().read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"data");
    };

    // The first read since the write moves the access time: a snapshot keeps it.
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    read(&fs);
    let atime = fs.stat("/d/f").unwrap().atime_ns;
    fs.unmount().unwrap();
    let after_read = generation();
    assert!(after_read > written, "{after_read} after {written}");

    // Now the access time is newer than the change: reading, listing and stat write nothing.
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(fs.stat("/d/f").unwrap().atime_ns, atime);
    read(&fs);
    assert_eq!(fs.readdir("/d").unwrap().len(), 1);
    fs.unmount().unwrap();
    assert_eq!(generation(), after_read);

    // A change after such a session is kept as ever, and its unmount writes a snapshot.
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    fs.create("/d/g").unwrap().write_at(b"more", 0).unwrap();
    fs.unmount().unwrap();
    assert!(generation() > after_read);
    let fs = Fs::open(open_volume(&shm.dir), small_options()).unwrap();
    assert_eq!(fs.stat("/d/g").unwrap().size, 4);
    assert_eq!(fs.stat("/d/f").unwrap().atime_ns, atime);
    fs.unmount().unwrap();
}
