//! The checkpoint thread's priority: it runs `checkpoint_boost` nice steps below the thread
//! that opened the file system when the process may lower nice values, at the opener's own
//! otherwise, and exactly at the opener's with no boost asked for. One test in this binary,
//! so the only checkpoint thread in the process is the one under test.

use testkit::*;

use fs::{Fs, FsOptions};

/// The nice values of this process's checkpoint threads (`/proc/self/task/*/stat`, field 19).
fn checkpoint_nices() -> Vec<i32> {
    let mut nices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (head, rest) = stat.rsplit_once(')').unwrap();
        if !head.ends_with("(locus-checkpoin") {
            continue;
        }
        // After the name: state is field 3, so nice (field 19) is the 17th.
        let nice = rest.split_whitespace().nth(16).unwrap().parse().unwrap();
        nices.push(nice);
    }
    nices
}

/// What a thread at nice `from` gets when it asks for `steps` lower (what this process is
/// allowed decides it).
fn allowed(from: i32, steps: u32) -> i32 {
    std::thread::spawn(move || {
        raise_nice_to(from);
        topology::boost_current_thread(steps).unwrap_or(from)
    })
    .join()
    .unwrap()
}

fn raise_nice_to(nice: i32) {
    assert!(
        nice >= topology::current_thread_nice().unwrap(),
        "the test only raises nice values (always allowed)"
    );
    topology::set_current_thread_nice(nice).unwrap();
    assert_eq!(topology::current_thread_nice().unwrap(), nice);
}

/// Opens a file system from a thread at nice `opener` with `boost` and returns the nice value
/// its checkpoint thread runs at once it has made a pass.
fn checkpoint_nice(name: &str, opener: i32, boost: u32) -> i32 {
    let shm = shm_volume(name, 64 << 20);
    std::thread::spawn(move || {
        raise_nice_to(opener);
        let options = FsOptions {
            checkpoint_boost: boost,
            ..small_options()
        };
        let fs = Fs::format(open_volume(&shm.dir), &small_format(), options).unwrap();
        fs.create("/f").unwrap().write_at(&[7; 4096], 0).unwrap();
        // A pass done: the thread set its priority before its first.
        fs.checkpoint().unwrap();
        let nices = checkpoint_nices();
        assert_eq!(nices.len(), 1, "one file system open: {nices:?}");
        let stats = fs.stats();
        assert_eq!(stats.checkpoint_nice, Some(nices[0]), "what the stats say");
        assert_eq!(
            i64::from(stats.checkpoint_priority_raised),
            i64::from(opener) - i64::from(nices[0]),
            "steps above the opener"
        );
        fs.unmount().unwrap();
        nices[0]
    })
    .join()
    .unwrap()
}

#[test]
fn the_checkpoint_runs_its_boost_below_its_opener_when_allowed_and_at_its_opener_without() {
    assert_eq!(checkpoint_nice("ckpt-boost", 5, 10), allowed(5, 10));
    assert_eq!(checkpoint_nice("ckpt-floor", 5, 40), allowed(5, 40));
    assert_eq!(checkpoint_nice("ckpt-none", 5, 0), 5);
}
