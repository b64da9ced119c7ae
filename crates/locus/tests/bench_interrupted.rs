//! A bench stopped by Ctrl-C or SIGTERM leaves no scratch volume in /dev/shm and no program
//! it started still running.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn installed(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found || std::env::var("CI").is_err(),
        "{program} is needed under CI"
    );
    found
}

/// Entries of /dev/shm that belong to the bench with this pid.
fn scratch_of(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("locus-bench-") && name.contains(&pid.to_string())
        })
        .collect()
}

/// Live (not zombie) processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((ppid, state)) = parent_and_state(child)
            && ppid == pid
            && state != 'Z'
        {
            out.push(child);
        }
    }
    out
}

fn parent_and_state(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

fn alive(pid: u32) -> bool {
    parent_and_state(pid).is_some_and(|(_, state)| state != 'Z')
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn an_interrupted_fs_bench_removes_its_scratch_volume() {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["bench", "fs", "--size", "64M", "--seconds", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = bench.id();
    wait_until("the scratch volume", Duration::from_secs(60), || {
        scratch_of(pid)
            .iter()
            .any(|p| p.join("volume").join("locus.toml").exists())
    });
    signal(&bench, "INT");
    let status = bench.wait().unwrap();
    assert_eq!(status.code(), Some(130), "128 + SIGINT");
    assert_eq!(scratch_of(pid), Vec::<PathBuf>::new());
}

#[test]
fn an_interrupted_nbd_bench_stops_its_servers_and_removes_their_volumes() {
    if !["fio", "nbdkit", "qemu-nbd"].iter().all(|p| installed(p)) {
        eprintln!("fio, nbdkit or qemu-nbd is not installed; skipped");
        return;
    }
    let mut bench = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args([
            "bench",
            "nbd",
            "--seconds",
            "30",
            "--size",
            "16M",
            "--bs",
            "4K",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = bench.id();
    // Three servers, and fio filling or measuring one of them.
    let mut started = Vec::new();
    wait_until("the servers and fio", Duration::from_secs(120), || {
        started = children_of(pid);
        started.len() >= 4
    });
    assert!(!scratch_of(pid).is_empty());
    signal(&bench, "TERM");
    let status = bench.wait().unwrap();
    assert_eq!(status.code(), Some(143), "128 + SIGTERM");
    wait_until("the children to go", Duration::from_secs(10), || {
        started.iter().all(|&child| !alive(child))
    });
    assert_eq!(scratch_of(pid), Vec::<PathBuf>::new());
}
