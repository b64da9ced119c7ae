//! `locus serve` tested with real NBD clients: libnbd's nbdinfo, nbdcopy and nbdsh, qemu-img
//! and fio's nbd engine — no locus code on the client side — plus raw sockets for the abuse
//! no well-behaved client would send.
//!
//! Each test serves its own volume (in /dev/shm) on its own Unix socket. Without the tools
//! (Debian: libnbd-bin, python3-libnbd, qemu-utils, fio) the tests say so and pass, except
//! under CI=true, where `.ci/run` installs them and a missing one is a failure.

mod common;

use common::{client, free_port, random_file, require, run, run_unchecked, text};

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs a Python `script` in nbdsh — connected first to `uri` when given — with `env` set.
fn nbdsh(uri: Option<&str>, script: &str, env: &[(&str, &str)]) -> Output {
    let mut command = client("nbdsh");
    if let Some(uri) = uri {
        command.args(["-u", uri]);
    }
    command.args(["-c", script]);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run nbdsh")
}

/// `locus fsck [extra]` on the volume in `dir`, which must check clean; its stdout.
fn fsck(dir: &Path, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["fsck", "--volume", dir.to_str().unwrap()])
        .args(extra)
        .output()
        .expect("run locus fsck");
    assert!(output.status.success(), "{}", text(&output.stdout));
    text(&output.stdout)
}

/// A volume in shared memory with an empty file system.
fn volume() -> tempfile::TempDir {
    volume_of("512M")
}

/// A volume of `size` in shared memory with an empty file system.
fn volume_of(size: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm");
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["format", "--volume", dir.path().to_str().unwrap()])
        .arg(format!("--emulate={size}"))
        .output()
        .expect("run locus format");
    assert!(output.status.success(), "{}", text(&output.stderr));
    dir
}

/// A running `locus serve` on a Unix socket in the volume directory.
struct Serve {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl Serve {
    fn start(volume: &Path, args: &[&str]) -> Serve {
        let socket = volume.join("nbd.sock");
        let log = volume.join(format!("serve-{}.log", std::process::id()));
        let child = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", volume.to_str().unwrap(), "--unix"])
            .arg(&socket)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start locus serve");
        let mut serve = Serve {
            child: Some(child),
            socket,
            log,
        };
        common::wait_until_serving(
            serve.child.as_mut().unwrap(),
            &serve.log,
            Duration::from_secs(60),
        );
        serve
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        run("kill", &[signal, &pid]);
    }

    /// SIGTERM, then the exit status and everything it logged.
    fn stop(mut self) -> (ExitStatus, String) {
        self.signal("-TERM");
        let status = self.wait();
        (status, self.log())
    }

    fn kill9(mut self) {
        self.signal("-KILL");
        self.wait();
    }

    fn wait(&mut self) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "locus serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn real_clients_see_the_exports_and_move_data_intact() {
    if !require(&["nbdinfo", "nbdcopy", "qemu-img", "fio"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(
        dir.path(),
        &[
            "--export",
            "disk=fs:/vm/disk.img,size=64M",
            "--export",
            "small=fs:/small.img,size=1M",
        ],
    );

    // nbdinfo --json: both exports, their sizes and honest flags.
    let info = run("nbdinfo", &["--json", "--list", &server.uri("")]);
    let json: serde_json::Value = serde_json::from_slice(&info.stdout).expect("nbdinfo JSON");
    let exports = json["exports"].as_array().expect("exports");
    assert_eq!(exports.len(), 2, "{json}");
    let disk = exports
        .iter()
        .find(|e| e["export-name"] == "disk")
        .expect("disk export");
    assert_eq!(disk["export-size"], 64 << 20);
    for flag in [
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_zero",
        "can_fast_zero",
        "can_trim",
        "can_cache",
        "can_df",
    ] {
        assert_eq!(disk[flag], true, "{flag}: {disk}");
    }
    assert_eq!(disk["is_read_only"], false);
    assert_eq!(disk["block_size_minimum"], 1);
    assert_eq!(disk["block_size_preferred"], 4096);
    assert_eq!(disk["block_size_maximum"], 32 << 20);
    assert!(
        disk["contexts"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "base:allocation")),
        "{disk}"
    );
    assert!(
        disk["description"]
            .as_str()
            .unwrap()
            .contains("/vm/disk.img")
    );
    let small = exports
        .iter()
        .find(|e| e["export-name"] == "small")
        .unwrap();
    assert_eq!(small["export-size"], 1 << 20);
    // The empty name is the first export.
    let default = run("nbdinfo", &["--size", &server.uri("")]);
    assert_eq!(text(&default.stdout).trim(), (64u64 << 20).to_string());

    // qemu-img: a random image in, compared, and out again.
    let image = dir.path().join("random.img");
    let data = random_file(&image, 48 << 20, 7);
    let disk_uri = server.uri("disk");
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            image.to_str().unwrap(),
            &disk_uri,
        ],
    );
    let compare = Command::new("qemu-img")
        .args([
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            image.to_str().unwrap(),
            &disk_uri,
        ])
        .output()
        .unwrap();
    // 0: identical; 1: differ. The export is longer; its tail must read as zeros.
    assert!(
        compare.status.success(),
        "qemu-img compare: {}",
        text(&compare.stdout)
    );
    let out = dir.path().join("qemu-out.img");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &disk_uri,
            out.to_str().unwrap(),
        ],
    );
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len(), 64 << 20);
    assert!(
        back[..data.len()] == data[..],
        "qemu-img read back other bytes"
    );
    assert!(back[data.len()..].iter().all(|&b| b == 0));

    // The map shows the written part as data and the rest as a hole.
    let map = run("nbdinfo", &["--map", "--json", &disk_uri]);
    let map: serde_json::Value = serde_json::from_slice(&map.stdout).expect("map JSON");
    let last = map.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["offset"], 48 << 20, "{map}");
    assert_eq!(
        last["type"], 3,
        "the unwritten tail is a hole that reads as zeros: {map}"
    );

    // nbdcopy both ways over four connections each.
    let other = dir.path().join("other.img");
    let other_data = random_file(&other, 64 << 20, 99);
    run(
        "nbdcopy",
        &[
            "--connections=4",
            "--threads=4",
            other.to_str().unwrap(),
            &disk_uri,
        ],
    );
    let copied = dir.path().join("copied.img");
    run(
        "nbdcopy",
        &[
            "--connections=4",
            "--threads=4",
            &disk_uri,
            copied.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&copied).unwrap() == other_data,
        "nbdcopy round trip differs"
    );

    // fio's nbd engine, verifying every block it wrote with crc32c.
    for rw in ["randwrite", "write"] {
        let fio = run(
            "fio",
            &[
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={disk_uri}"),
                &format!("--rw={rw}"),
                "--bsrange=512-64k",
                "--iodepth=16",
                "--size=32M",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--verify_state_save=0",
            ],
        );
        let report = text(&fio.stdout);
        assert!(report.contains("err= 0"), "{report}");
    }

    let (status, log) = server.stop();
    assert!(status.success(), "exit {status}: {log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(log.contains("total channel 0"), "{log}");
    assert!(
        !dir.path().join("nbd.sock").exists(),
        "the socket was left behind"
    );
    let report = fsck(dir.path(), &[]);
    assert!(report.contains("0 logged writes"), "{report}");
}

#[test]
fn queued_submission_and_several_channels_serve_correctly() {
    if !require(&["nbdcopy", "fio"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(
        dir.path(),
        &[
            "--submit",
            "queued",
            "--workers",
            "3",
            "--channels",
            "3",
            "--stats-interval",
            "0.2",
            "--default-size",
            "128M",
        ],
    );
    let uri = server.uri("");
    let fio = run(
        "fio",
        &[
            "--name=queued",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--size=64M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ],
    );
    assert!(
        text(&fio.stdout).contains("err= 0"),
        "{}",
        text(&fio.stdout)
    );
    let image = dir.path().join("random.img");
    let data = random_file(&image, 128 << 20, 3);
    run(
        "nbdcopy",
        &[
            "--connections=6",
            "--threads=6",
            image.to_str().unwrap(),
            &uri,
        ],
    );
    let out = dir.path().join("out.img");
    run(
        "nbdcopy",
        &[
            "--connections=6",
            "--threads=6",
            &uri,
            out.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "queued round trip differs"
    );
    std::thread::sleep(Duration::from_millis(300));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("interval channel 2"), "{log}");
    // Loopback connections are dealt round-robin: every channel got some.
    for channel in 0..3 {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("total channel {channel}:")))
            .unwrap_or_else(|| panic!("no totals for channel {channel}: {log}"));
        assert!(!line.contains(": 0 connections"), "{line}");
    }
    println!("{log}");
}

/// A client with one request in flight is served by a thread that polls for its next
/// request: fio at queue depth 1 over TCP gets waits caught by polling (the totals count
/// them); with `--poll-us 0` every wait sleeps. (How many are caught depends on the
/// machine's load and the build: CI's debug build on two shared cores caught 1098 of 4000.)
/// The `--stats-json` line a stopped server printed for its whole run.
fn total_report(log: &str) -> serde_json::Value {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["report"] == "total")
        .unwrap_or_else(|| panic!("no total report: {log}"))
}

#[test]
fn a_queue_depth_one_client_is_caught_by_polling_unless_it_is_off() {
    if !require(&["fio"]) {
        return;
    }
    for poll in ["50", "0"] {
        let dir = volume();
        // Over TCP: a reply's send costs more there, and the poll window must start after it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let server = Serve::start(
            dir.path(),
            &[
                "--stats-json",
                "--default-size",
                "64M",
                "--poll-us",
                poll,
                "--listen",
                &listen,
            ],
        );
        let uri = format!("nbd://{listen}/");
        run(
            "fio",
            &[
                "--name=qd1",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=1",
                "--size=16M",
                "--number_ios=4000",
            ],
        );
        let (status, log) = server.stop();
        assert!(status.success(), "{log}");
        let total = total_report(&log);
        let (polled, slept) = (
            total["waits"]["polled"].as_u64().unwrap(),
            total["waits"]["slept"].as_u64().unwrap(),
        );
        assert!(total["requests"].as_u64().unwrap() >= 4000, "{total}");
        println!("--poll-us {poll}: {polled} waits caught polling, {slept} slept");
        if poll == "0" {
            assert_eq!(polled, 0, "{total}");
            assert!(slept >= 1000, "{total}");
        } else {
            assert!(polled > 0, "no wait was caught by polling: {total}");
        }
    }
}

#[test]
fn loopback_connections_are_not_paced_by_bbr() {
    if !require(&["ss"]) {
        return;
    }
    let system =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap_or_default();
    if !system.trim().starts_with("bbr") {
        println!(
            "the system's congestion control is {system:?}, which does not pace: nothing to see"
        );
        return;
    }
    let dir = volume();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Serve::start(dir.path(), &["--default-size", "16M", "--listen", &listen]);
    // A connection in progress: the server accepted it and greeted.
    let held = std::net::TcpStream::connect(&listen).unwrap();
    let mut greeting = [0u8; 8];
    (&held).read_exact(&mut greeting).unwrap();
    // The kernel's view of the server's end (source port = the server's).
    let ss = run(
        "ss",
        &[
            "-tin",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ],
    );
    let report = text(&ss.stdout);
    let info = report
        .lines()
        .skip_while(|l| !l.contains(&format!(":{port} ")))
        .nth(1)
        .unwrap_or_else(|| panic!("no server socket in ss's report:\n{report}"));
    // `ts sack cubic wscale:7,7 rto:...`: the algorithm comes just before the window scale.
    let tokens: Vec<&str> = info.split_whitespace().collect();
    let algorithm = tokens
        .iter()
        .position(|t| t.starts_with("wscale:"))
        .and_then(|i| i.checked_sub(1))
        .map_or("", |i| tokens[i]);
    assert!(
        algorithm == "cubic" || algorithm == "reno",
        "the server's end of a loopback connection uses {algorithm:?}:\n{report}"
    );
    // The client's end keeps the system's algorithm: only the server's own sends change.
    drop(held);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// The CPUs this process may run on (`Cpus_allowed_list`), ascending.
fn allowed_cpus(status: &str) -> Vec<u32> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_default()
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(first.parse::<u32>().unwrap()..=last.parse::<u32>().unwrap());
    }
    cpus
}

/// The allowed CPUs of the server's connection threads (`nbd-ch*-c*`) now.
fn connection_thread_cpus(pid: u32) -> Vec<Vec<u32>> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.starts_with("nbd-ch") && comm.contains("-c"))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .map(|status| allowed_cpus(&status))
        .collect()
}

#[test]
fn a_queue_depth_one_client_pinned_to_a_cpu_is_served_on_that_cpu_unless_pinned_to_the_node() {
    if !require(&["fio"]) {
        return;
    }
    let ours = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    if ours.len() < 2 {
        println!("one CPU: nothing to move between");
        return;
    }
    let client_cpu = *ours.last().unwrap();
    for pin in ["client", "node"] {
        let dir = volume();
        // Over TCP: the kernel records the CPU a connection's data arrives on.
        let listen = format!("127.0.0.1:{}", free_port());
        let server = Serve::start(
            dir.path(),
            &[
                "--stats-json",
                "--default-size",
                "64M",
                "--pin",
                pin,
                "--listen",
                &listen,
            ],
        );
        let pid = server.child.as_ref().unwrap().id();
        let mut fio = client("fio")
            .args([
                "--name=qd1",
                "--ioengine=nbd",
                &format!("--uri=nbd://{listen}/"),
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=1",
                "--size=16M",
                "--number_ios=40000",
                &format!("--cpus_allowed={client_cpu}"),
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("start fio");
        // What the connection's thread may run on, sampled while fio runs.
        let mut seen = Vec::new();
        while fio.try_wait().unwrap().is_none() {
            seen.extend(connection_thread_cpus(pid));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(fio.wait().unwrap().success());
        let (status, log) = server.stop();
        assert!(status.success(), "{log}");
        let total = total_report(&log);
        let moves = &total["thread_moves"];
        let on_client_cpu = seen.iter().filter(|cpus| **cpus == [client_cpu]).count();
        println!(
            "--pin {pin}: moves {moves}; {on_client_cpu} of {} samples on CPU {client_cpu} alone",
            seen.len()
        );
        if pin == "client" {
            assert!(moves["to_client"].as_u64().unwrap() >= 1, "{total}");
            assert!(
                on_client_cpu > 0,
                "the connection's thread never ran on the client's CPU alone: {seen:?}"
            );
        } else {
            assert_eq!(moves["to_client"].as_u64(), Some(0), "{total}");
            assert_eq!(on_client_cpu, 0, "{seen:?}");
        }
    }
}

const NEGATIVE: &str = r#"
import errno, os, sys
import nbd

def expect(what, call, want):
    try:
        call()
    except nbd.Error as e:
        # libnbd gives the errno's name.
        if e.errno != errno.errorcode[want]:
            sys.exit(f"{what}: errno {e.errno} ({e.string}), wanted {want}")
        return
    sys.exit(f"{what}: succeeded, wanted errno {want}")

def usable(h):
    h.pwrite(b"\xab" * 4096, 8192)
    if h.pread(4096, 8192) != b"\xab" * 4096:
        sys.exit("the connection no longer reads back what it wrote")

h = nbd.NBD()
h.set_strict_mode(0)
h.add_meta_context("base:allocation")
h.connect_uri(os.environ["RW_URI"])
size = h.get_size()
usable(h)
expect("read past the end", lambda: h.pread(1024, size - 512), errno.EINVAL)
usable(h)
expect("write past the end", lambda: h.pwrite(b"x" * 1024, size - 512), errno.ENOSPC)
usable(h)
# The minimum block size is 1: unaligned requests are ordinary ones.
h.pwrite(b"y" * 512, 7)
if h.pread(100, 1) != bytes(6) + b"y" * 94 or h.pread(512, 7) != b"y" * 512:
    sys.exit("an unaligned write does not read back")
usable(h)
expect("oversized read", lambda: h.pread(33 << 20, 0), errno.EINVAL)
usable(h)
expect("unknown command flag", lambda: h.flush(flags=1 << 9), errno.EINVAL)
usable(h)
expect("fast zero that must provision a hole", lambda: h.zero(1 << 20, size - (1 << 20), nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE), errno.ENOTSUP)
usable(h)
h.zero(4096, 8192, nbd.CMD_FLAG_FAST_ZERO)
if h.pread(4096, 8192) != bytes(4096):
    sys.exit("write zeroes left data behind")
# Zero-length requests are no-ops (as qemu-nbd answers them), with or without structured
# replies; block status must describe something, so a zero-length one is EINVAL.
if h.pread(0, 4096) != b"" or h.pread(0, size) != b"":
    sys.exit("a zero-length read returned bytes")
h.pwrite(b"", 8192)
h.trim(0, 8192)
h.zero(0, 8192)
h.cache(0, 8192)
usable(h)
h.block_status(4096, 0, lambda *a: 0)  # with a length, block status works here
expect("zero-length block status", lambda: h.block_status(0, 0, lambda *a: 0), errno.EINVAL)
usable(h)
h.shutdown()
plain = nbd.NBD()
plain.set_strict_mode(0)
plain.set_request_structured_replies(False)
plain.connect_uri(os.environ["RW_URI"])
if plain.pread(0, 0) != b"":
    sys.exit("a zero-length read (simple replies) returned bytes")
usable(plain)
plain.shutdown()

r = nbd.NBD()
r.set_strict_mode(0)
r.connect_uri(os.environ["RO_URI"])
if not r.is_read_only():
    sys.exit("the ro export is not flagged read-only")
before = r.pread(4096, 0)
expect("write to a read-only export", lambda: r.pwrite(b"z" * 4096, 0), errno.EPERM)
expect("trim on a read-only export", lambda: r.trim(4096, 0), errno.EPERM)
expect("zero on a read-only export", lambda: r.zero(4096, 0), errno.EPERM)
if r.pread(4096, 0) != before:
    sys.exit("a refused write changed the read-only export")
r.shutdown()
print("negative tests passed")
"#;

#[test]
fn nbdsh_negative_requests_get_the_protocols_errors_and_the_connection_stays_usable() {
    if !require(&["nbdsh"]) {
        return;
    }
    let dir = volume();
    // Create the file the read-only export will serve, with known contents.
    let first = Serve::start(dir.path(), &["--export", "ro=fs:/ro.img,size=1M"]);
    run(
        "nbdsh",
        &["-u", &first.uri("ro"), "-c", "h.pwrite(b'\\x5a' * 4096, 0)"],
    );
    assert!(first.stop().0.success());

    let server = Serve::start(
        dir.path(),
        &[
            "--export",
            "rw=fs:/rw.img,size=16M",
            "--export",
            "ro=fs:/ro.img,ro",
        ],
    );
    let output = nbdsh(
        None,
        NEGATIVE,
        &[("RW_URI", &server.uri("rw")), ("RO_URI", &server.uri("ro"))],
    );
    assert!(
        output.status.success() && text(&output.stdout).contains("negative tests passed"),
        "{}\n{}\nserver: {}",
        text(&output.stdout),
        text(&output.stderr),
        server.log()
    );
    let check = run(
        "nbdsh",
        &[
            "-u",
            &server.uri("ro"),
            "-c",
            "assert h.pread(4096, 0) == b'\\x5a' * 4096",
        ],
    );
    assert!(check.status.success());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// A raw connection, for what no real client sends.
struct Raw(UnixStream);

impl Raw {
    fn connect(socket: &Path) -> Raw {
        let stream = UnixStream::connect(socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut raw = Raw(stream);
        let greeting = raw.read(18);
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        raw
    }

    fn read(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        self.0.read_exact(&mut buf).expect("read from the server");
        buf
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).expect("write to the server");
    }

    /// The server closed the connection (reads end), rather than answering.
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.0.read(&mut byte), Ok(0) | Err(_))
    }

    fn option(code: u32, data: &[u8]) -> Vec<u8> {
        let mut bytes = b"IHAVEOPT".to_vec();
        bytes.extend(code.to_be_bytes());
        bytes.extend((data.len() as u32).to_be_bytes());
        bytes.extend(data);
        bytes
    }

    /// Reads one option reply: (option, type, data).
    fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let header = self.read(20);
        assert_eq!(
            u64::from_be_bytes(header[..8].try_into().unwrap()),
            0x0003_e889_0455_65a9
        );
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        (option, kind, self.read(len))
    }

    /// NBD_OPT_GO for `name`, reading replies up to the ACK.
    fn go(&mut self, name: &str) {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend(name.as_bytes());
        data.extend(0u16.to_be_bytes());
        self.send(&Raw::option(7, &data));
        loop {
            let (_, kind, _) = self.option_reply();
            assert_eq!(kind & (1 << 31), 0, "GO refused");
            if kind == 1 {
                return;
            }
        }
    }

    fn request(&mut self, command: u16, cookie: u64, offset: u64, len: u32) {
        let mut bytes = 0x2560_9513u32.to_be_bytes().to_vec();
        bytes.extend(0u16.to_be_bytes());
        bytes.extend(command.to_be_bytes());
        bytes.extend(cookie.to_be_bytes());
        bytes.extend(offset.to_be_bytes());
        bytes.extend(len.to_be_bytes());
        self.send(&bytes);
    }

    /// A simple reply: (error, cookie).
    fn simple_reply(&mut self) -> (u32, u64) {
        let reply = self.read(16);
        assert_eq!(
            u32::from_be_bytes(reply[..4].try_into().unwrap()),
            0x6744_6698
        );
        (
            u32::from_be_bytes(reply[4..8].try_into().unwrap()),
            u64::from_be_bytes(reply[8..16].try_into().unwrap()),
        )
    }
}

#[test]
fn handshake_abuse_never_stops_other_clients() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(dir.path(), &["--default-size", "8M"]);
    let socket = server.socket.clone();

    // A well-behaved connection in transmission throughout.
    let mut steady = Raw::connect(&socket);
    steady.send(&1u32.to_be_bytes());
    steady.go("");

    // Disconnect at every byte of a complete handshake.
    let mut script = 1u32.to_be_bytes().to_vec();
    script.extend(Raw::option(8, &[])); // structured replies
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend(1u16.to_be_bytes());
    go.extend(3u16.to_be_bytes());
    script.extend(Raw::option(7, &go));
    for cut in 0..script.len() {
        let mut raw = Raw::connect(&socket);
        raw.send(&script[..cut]);
    }

    // Garbage magic: the server hangs up.
    let mut raw = Raw::connect(&socket);
    raw.send(&1u32.to_be_bytes());
    raw.send(b"GARBAGE!\0\0\0\x07\0\0\0\0");
    assert!(raw.closed(), "garbage magic was answered");

    // Unknown client flags: the server hangs up.
    let mut raw = Raw::connect(&socket);
    raw.send(&0xff00u32.to_be_bytes());
    assert!(raw.closed(), "unknown client flags were accepted");

    // A 4097-byte name in NBD_OPT_GO is refused and negotiation goes on.
    let mut raw = Raw::connect(&socket);
    raw.send(&1u32.to_be_bytes());
    let mut long = 4097u32.to_be_bytes().to_vec();
    long.extend(vec![b'n'; 4097]);
    long.extend(0u16.to_be_bytes());
    raw.send(&Raw::option(7, &long));
    let (option, kind, message) = raw.option_reply();
    assert_eq!((option, kind), (7, (1 << 31) | 3), "{}", text(&message));
    // An unknown option is refused as unsupported, and negotiation goes on.
    raw.send(&Raw::option(77, b"whatever"));
    assert_eq!(raw.option_reply().1, (1 << 31) | 1);
    // An option claiming more data than the server reads is skipped and refused.
    raw.send(&Raw::option(3, &vec![0u8; 70_000]));
    assert_eq!(raw.option_reply().1, (1 << 31) | 9);
    raw.go("");
    // Transmission: an unknown command gets EINVAL with its cookie, then reads still work.
    raw.request(99, 0xfeed, 0, 0);
    assert_eq!(raw.simple_reply(), (22, 0xfeed));
    raw.request(0, 0xbeef, 0, 512);
    assert_eq!(raw.simple_reply(), (0, 0xbeef));
    assert_eq!(raw.read(512), vec![0u8; 512]);
    // Bad request magic: hang up.
    raw.send(&[0xde; 28]);
    assert!(raw.closed(), "bad request magic was answered");

    // A 4097-byte NBD_OPT_EXPORT_NAME cannot be answered: hang up.
    let mut raw = Raw::connect(&socket);
    raw.send(&1u32.to_be_bytes());
    raw.send(&Raw::option(1, &vec![b'e'; 4097]));
    assert!(raw.closed(), "an oversized export name was answered");

    // Every other client is still served.
    steady.request(0, 1, 4096, 4096);
    assert_eq!(steady.simple_reply(), (0, 1));
    steady.read(4096);
    let info = run("nbdinfo", &["--size", &server.uri("")]);
    assert_eq!(text(&info.stdout).trim(), (8u64 << 20).to_string());
    steady.request(2, 2, 0, 0); // NBD_CMD_DISC
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    // Logged where an operator sees it by default, naming the client.
    let me = format!("unix peer pid {}", std::process::id());
    assert!(
        log.lines()
            .any(|l| l.contains("protocol violation") && l.contains("WARN") && l.contains(&me)),
        "{log}"
    );
}

/// The negotiation limit is a deadline: a client that sends an option of 0xFFFFFFFF bytes and
/// then trickles 16 bytes every 200 ms is closed once `--handshake-timeout` has passed since it
/// connected, like a silent one (as an idle timeout it was never closed), while another client
/// is served meanwhile.
#[test]
fn a_trickling_negotiator_is_closed_at_the_deadline() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(
        dir.path(),
        &["--default-size", "8M", "--handshake-timeout", "2"],
    );
    let mut slow = Raw::connect(&server.socket);
    slow.send(&1u32.to_be_bytes());
    let mut header = b"IHAVEOPT".to_vec();
    header.extend(6u32.to_be_bytes()); // NBD_OPT_INFO
    header.extend(u32::MAX.to_be_bytes());
    slow.send(&header);
    let started = Instant::now();
    let mut closed_after = None;
    while started.elapsed() < Duration::from_secs(20) {
        if slow.0.write_all(&[0u8; 16]).is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        // Another client is served while the slow one trickles.
        if started.elapsed() < Duration::from_millis(500) {
            let info = run("nbdinfo", &["--size", &server.uri("")]);
            assert_eq!(text(&info.stdout).trim(), (8u64 << 20).to_string());
        }
    }
    let closed_after = closed_after.expect("the trickling client was never closed");
    assert!(
        closed_after < Duration::from_secs(12),
        "closed only after {closed_after:?} with a 2 s deadline"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn the_connection_limit_refuses_with_a_reason() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(
        dir.path(),
        &["--default-size", "8M", "--max-connections", "1"],
    );
    let mut held = Raw::connect(&server.socket);
    held.send(&1u32.to_be_bytes());
    held.go("");
    refused_saying(&server.uri(""), "maximum of 1 connections");
    drop(held);
    // Once the held connection is gone, clients are served again.
    served_within(&server.uri(""), Duration::from_secs(10));
}

/// nbdinfo is refused, and libnbd's debug output shows the server's reason.
fn refused_saying(uri: &str, says: &str) {
    let refused = client("nbdinfo")
        .arg(uri)
        .env("LIBNBD_DEBUG", "1")
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{uri} served nbdinfo");
    assert!(
        text(&refused.stderr).contains(says),
        "{}",
        text(&refused.stderr)
    );
}

/// Tries `nbdinfo --size` until it succeeds (panicking after `limit`); returns its output.
fn served_within(uri: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        let info = run_unchecked("nbdinfo", &["--size", uri]);
        if info.status.success() {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "not served within {limit:?}: {}",
            text(&info.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lock-out attack: 64 clients each send `NBD_OPT_INFO` claiming 0xFFFFFFFF bytes and
/// then trickle 16 bytes a second. Negotiations have their own limit (the oldest is ended for
/// a newcomer) and never count against transmission slots, so real clients are still served
/// — before any deadline could have freed a slot.
#[test]
fn clients_that_never_finish_negotiating_cannot_lock_others_out() {
    if !require(&["nbdinfo", "nbdsh"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(
        dir.path(),
        &[
            "--default-size",
            "8M",
            "--max-connections",
            "4",
            "--max-negotiating",
            "16",
            "--handshake-timeout",
            "600",
        ],
    );
    let mut attackers: Vec<UnixStream> = (0..64)
        .map(|_| {
            let mut raw = Raw::connect(&server.socket);
            raw.send(&1u32.to_be_bytes());
            let mut header = b"IHAVEOPT".to_vec();
            header.extend(6u32.to_be_bytes()); // NBD_OPT_INFO
            header.extend(u32::MAX.to_be_bytes());
            raw.send(&header);
            raw.0
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut alive = attackers.len();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                alive = 0;
                for a in &mut attackers {
                    if a.write_all(&[0u8; 16]).is_ok() {
                        alive += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(1000));
            }
            alive
        })
    };
    // Four real clients at once hold every transmission slot; a fifth is refused with the
    // reason, not locked out by the attackers.
    let held: Vec<Raw> = (0..4)
        .map(|_| {
            let mut raw = Raw::connect(&server.socket);
            raw.send(&1u32.to_be_bytes());
            raw.go("");
            raw
        })
        .collect();
    refused_saying(&server.uri(""), "maximum of 4 connections");
    drop(held);
    let info = served_within(&server.uri(""), Duration::from_secs(20));
    assert_eq!(text(&info.stdout).trim(), (8u64 << 20).to_string());
    let copied = run_unchecked(
        "nbdsh",
        &[
            "-u",
            &server.uri(""),
            "-c",
            "h.pwrite(b'x' * 4096, 0); assert h.pread(4096, 0) == b'x' * 4096",
        ],
    );
    assert!(copied.status.success(), "{}", text(&copied.stderr));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let alive = trickler.join().unwrap();
    assert!(
        alive <= 16,
        "{alive} attackers still negotiating past a limit of 16"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("ending the oldest unfinished negotiation")
            && l.contains("unix peer pid")),
        "{log}"
    );
}

/// `--allow` admits only the ranges given (the default admits this host); others are closed
/// at once and named in a warning. `--max-connections-per-peer` caps one address.
#[test]
fn tcp_clients_are_admitted_by_address_and_counted_per_peer() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let dir = volume();
    let port = free_port().to_string();
    let address = format!("127.0.0.1:{port}");
    let uri = format!("nbd://127.0.0.1:{port}");
    let server = Serve::start(
        dir.path(),
        &[
            "--default-size",
            "8M",
            "--listen",
            &address,
            "--allow",
            "10.255.255.0/24",
            "--allow",
            "fd00::/8",
        ],
    );
    let refused = run_unchecked("nbdinfo", &["--size", &uri]);
    assert!(
        !refused.status.success(),
        "a client outside --allow was served"
    );
    // The Unix socket is not governed by --allow.
    let info = run_unchecked("nbdinfo", &["--size", &server.uri("")]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("not in --allow")
            && l.contains("127.0.0.1:")),
        "{log}"
    );

    let server = Serve::start(
        dir.path(),
        &[
            "--listen",
            &address,
            "--allow",
            "127.0.0.0/8",
            "--max-connections-per-peer",
            "1",
        ],
    );
    let info = run_unchecked("nbdinfo", &["--size", &uri]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    // nbdinfo's connection counts against the peer until the server has seen it close,
    // which may be a moment after nbdinfo exits: until then a new one is closed at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let held = std::net::TcpStream::connect(&address).unwrap();
        let mut greeting = [0u8; 8];
        match (&held).read_exact(&mut greeting) {
            Ok(()) => {
                assert_eq!(&greeting, b"NBDMAGIC");
                break held;
            }
            Err(e) if Instant::now() < deadline => {
                println!("closed while the first connection still counted ({e}); again");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("no greeting within 10 s of nbdinfo's exit: {e}"),
        }
    };
    let refused = run_unchecked("nbdinfo", &["--size", &uri]);
    assert!(
        !refused.status.success(),
        "a second connection from one peer was served"
    );
    drop(held);
    // The peer's count is released with the connection.
    served_within(&uri, Duration::from_secs(20));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("its maximum of connections open"), "{log}");
}

#[test]
fn unix_sockets_get_the_mode_and_group_asked_for() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = volume();
    let server = Serve::start(dir.path(), &["--default-size", "8M"]);
    let mode = std::fs::metadata(&server.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "default socket mode {mode:o}");
    drop(server);
    let gid = std::fs::metadata(dir.path()).unwrap().gid().to_string();
    let server = Serve::start(dir.path(), &["--unix-mode", "0660", "--unix-group", &gid]);
    let meta = std::fs::metadata(&server.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid().to_string(), gid);
    drop(server);
    for (args, says) in [
        (&["--unix-mode", "999"][..], "octal"),
        (&["--unix-group", "no-such-group-here"][..], "no such group"),
        (&["--allow", "10.0.0.1/8"][..], "did you mean 10.0.0.0/8"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", dir.path().to_str().unwrap(), "--unix"])
            .arg(dir.path().join("other.sock"))
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} started");
        assert!(
            text(&output.stderr).contains(says),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
}

const WRITE_ACKNOWLEDGED: &str = r#"
import os
import nbd
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
for i in range(96):
    block = bytes([i]) * 65536
    flags = nbd.CMD_FLAG_FUA if i % 2 else 0
    h.pwrite(block, i * 65536, flags)
    if i % 32 == 31:
        h.flush()
print("acknowledged", flush=True)
"#;

const CHECK_ACKNOWLEDGED: &str = r#"
import os, sys
import nbd
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
for i in range(96):
    if h.pread(65536, i * 65536) != bytes([i]) * 65536:
        sys.exit(f"block {i} lost")
print("all there")
"#;

/// A READ reply is sent from the file system's memory while the range is held; a client
/// that stops reading must not keep it held: writers of the same range (and everything
/// else) go on, and the stalled client still gets the bytes as they were when it asked.
#[test]
fn a_client_that_stops_reading_stalls_only_itself() {
    stalled_reader(&[], 1);
}

/// With queued submission the channel's workers serve every connection: two 32 MiB reads a
/// client never reads (one per worker) must not keep them from others' requests — the
/// replies are parked for the stalled connection's own sender.
#[test]
fn a_client_that_stops_reading_stalls_only_itself_with_queued_submission() {
    stalled_reader(&["--submit", "queued", "--workers", "2"], 2);
}

fn stalled_reader(args: &[&str], stalled_reads: u64) {
    if !require(&["nbdcopy", "nbdsh"]) {
        return;
    }
    let dir = volume();
    let mut all = vec!["--default-size", "64M"];
    all.extend_from_slice(args);
    let server = Serve::start(dir.path(), &all);
    let image = dir.path().join("before.img");
    let before = random_file(&image, 32 << 20, 11);
    run("nbdcopy", &[image.to_str().unwrap(), &server.uri("")]);

    // 32 MiB asked for (each time) and not read: far more than the socket buffers hold.
    let mut stalled = Raw::connect(&server.socket);
    stalled.send(&[0, 0, 0, 1]); // fixed newstyle
    stalled.go("");
    for i in 0..stalled_reads {
        stalled.request(0, 42 + i, 0, 32 << 20);
    }
    std::thread::sleep(Duration::from_millis(300));

    // Another client overwrites the start of that range while the reply is stuck.
    let mut writer = client("nbdsh")
        .args([
            "-u",
            &server.uri(""),
            "-c",
            "h.pwrite(b'\\x5a' * 65536, 0, nbd.CMD_FLAG_FUA); print('written')",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while writer.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "a write waited for a client that does not read its reply"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = writer.wait_with_output().unwrap();
    assert!(
        text(&output.stdout).contains("written"),
        "{}",
        text(&output.stderr)
    );

    // The stalled client reads at last: the data as it was when it asked (replies may come
    // in any order with queued submission).
    let mut cookies = Vec::new();
    for _ in 0..stalled_reads {
        let (error, cookie) = stalled.simple_reply();
        assert_eq!(error, 0);
        cookies.push(cookie);
        let data = stalled.read(32 << 20);
        assert!(
            data == before,
            "the stalled read did not return the bytes it asked for"
        );
    }
    cookies.sort_unstable();
    assert_eq!(cookies, (42..42 + stalled_reads).collect::<Vec<_>>());

    let after = dir.path().join("after.img");
    run("nbdcopy", &[&server.uri(""), after.to_str().unwrap()]);
    let now = std::fs::read(&after).unwrap();
    assert!(
        now[..65536].iter().all(|&b| b == 0x5a),
        "the write is missing"
    );
    assert!(
        now[65536..32 << 20] == before[65536..],
        "bytes after the write changed"
    );
    drop(stalled);
    assert!(server.stop().0.success());
}

/// TRIM and WRITE_ZEROES (without NO_HOLE) punch holes: the range reads as zeros, block
/// status calls it a hole, and its memory goes back to the volume (fsck counts the mapped
/// bytes of the files afterwards).
/// qemu honours the advertised minimum block size: with 1, as qemu-nbd and nbdkit advertise,
/// it sends unaligned discards and writes as they are, and locus takes them.
#[test]
fn qemu_io_discards_and_writes_at_any_byte() {
    if !require(&["qemu-io"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(dir.path(), &["--default-size", "16M"]);
    let uri = server.uri("");
    let io = |commands: &[&str]| {
        let mut args = vec!["-f", "raw"];
        for c in commands {
            args.extend(["-c", c]);
        }
        args.push(&uri);
        let output = run("qemu-io", &args);
        let out = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(
            output.status.success() && !out.contains("error") && !out.contains("Invalid"),
            "qemu-io {commands:?}: {out}\nserver: {}",
            server.log()
        );
        out
    };
    io(&["write -P 0xab 0 64k"]);
    io(&["discard 1 1", "discard 0 4097", "discard 8193 3"]);
    io(&["write -P 0xcd 5 7"]);
    // Discarded bytes read as zeros (a trimmed range becomes a hole); the others are there.
    io(&[
        "read -P 0 0 5",
        "read -P 0xcd 5 7",
        "read -P 0 12 4085",
        "read -P 0xab 4097 4095",
        "read -P 0xab 8192 1",
        "read -P 0 8193 3",
        "read -P 0xab 8196 100",
    ]);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn trim_and_write_zeroes_give_memory_back() {
    if !require(&["nbdsh", "nbdinfo"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(dir.path(), &["--default-size", "64M"]);
    let output = nbdsh(Some(&server.uri("")), TRIM_AND_ZERO, &[]);
    assert!(
        output.status.success() && text(&output.stdout).contains("holes read as zeros"),
        "{}\n{}\nserver: {}",
        text(&output.stdout),
        text(&output.stderr),
        server.log()
    );
    // Block status: [8 MiB, 40 MiB) is a hole (type 3: hole, reads as zeros), the rest data.
    let map = run("nbdinfo", &["--map", "--json", &server.uri("")]);
    let map: serde_json::Value = serde_json::from_slice(&map.stdout).expect("map JSON");
    let hole = map
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["offset"] == 8 << 20)
        .unwrap_or_else(|| panic!("no extent starts at 8 MiB: {map}"));
    assert_eq!(
        (hole["length"].clone(), hole["type"].clone()),
        ((32 << 20).into(), 3.into()),
        "{map}"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    let report: serde_json::Value =
        serde_json::from_str(&fsck(dir.path(), &["--json"])).expect("fsck JSON");
    assert_eq!(
        report["fs"]["mapped_bytes"],
        (64u64 << 20) - (32 << 20) - 4096,
        "64 MiB written, 32 MiB and one block punched: {report}"
    );
}

const TRIM_AND_ZERO: &str = r#"
chunk = b'\xab' * (8 << 20)
for i in range(8):
    h.pwrite(chunk, i << 23)
h.trim(16 << 20, 8 << 20)            # [8, 24) MiB
h.zero(16 << 20, 24 << 20)           # [24, 40) MiB, holes allowed
# Not 4 KiB aligned: the block inside is freed, the edges zeroed, nothing else touched.
at = (48 << 20) + 512
h.trim(8192, at)
assert h.pread(512, at - 512) == b'\xab' * 512
assert h.pread(8192, at) == bytes(8192)
assert h.pread(512, at + 8192) == b'\xab' * 512
assert h.pread(1 << 20, 8 << 20) == bytes(1 << 20)
assert h.pread(1 << 20, 39 << 20) == bytes(1 << 20)
assert h.pread(1 << 20, 40 << 20) == b'\xab' * (1 << 20)
print("holes read as zeros")
"#;

/// Random writes (4 KiB to 1 MiB, aligned or not, some FUA), trims, zeroes and reads by
/// nbdsh against a byte model, on an export half its volume's size: every read agrees, no
/// write fails for want of one contiguous extent (freed blocks fragment free memory; the
/// export then receives a payload into several buffers), and after `kill -9` and a restart
/// the whole export equals the model; fsck is clean at the end.
#[test]
fn random_writes_trims_and_zeroes_agree_with_a_model_across_kill_9() {
    if !require(&["nbdsh"]) {
        return;
    }
    let dir = volume_of("96M");
    let model = dir.path().join("model.bin");
    let run_script = |server: &Serve, mode: &str| {
        let output = nbdsh(
            Some(&server.uri("")),
            RANDOM_OPS,
            &[("MODEL", model.to_str().unwrap()), ("MODE", mode)],
        );
        assert!(
            output.status.success(),
            "{mode}: {}\n{}\nserver: {}",
            text(&output.stdout),
            text(&output.stderr),
            server.log()
        );
        text(&output.stdout)
    };
    let server = Serve::start(dir.path(), &["--default-size", "48M"]);
    assert!(run_script(&server, "run").contains("2000 operations agree"));
    server.kill9();
    let server = Serve::start(dir.path(), &[]);
    assert!(run_script(&server, "check").contains("the export equals the model"));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    fsck(dir.path(), &[]);
}

const RANDOM_OPS: &str = r#"
import os, random, sys
import nbd
model_path = os.environ["MODEL"]
size = h.get_size()
if os.environ["MODE"] == "check":
    model = open(model_path, "rb").read()
    for at in range(0, size, 4 << 20):
        got = h.pread(min(4 << 20, size - at), at)
        if got != model[at:at + len(got)]:
            bad = next(i for i in range(len(got)) if got[i] != model[at + i])
            sys.exit(f"byte {at + bad}: {got[bad]}, the model has {model[at + bad]}")
    print("the export equals the model")
    sys.exit(0)
rng = random.Random(5)
model = bytearray(size)
for i in range(2000):
    if rng.random() < 0.5:
        off = rng.randrange(size // 4096) * 4096
        ln = rng.choice([4096, 8192, 65536, 262144, 1 << 20])
    else:
        off = rng.randrange(size // 512) * 512
        ln = rng.randrange(1, 600) * 512
    ln = min(ln, size - off)
    kind = rng.random()
    if kind < 0.6:
        data = rng.randbytes(ln)
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0)
        model[off:off + ln] = data
    elif kind < 0.75:
        h.trim(ln, off)
        model[off:off + ln] = bytes(ln)
    elif kind < 0.85:
        h.zero(ln, off)
        model[off:off + ln] = bytes(ln)
    else:
        got = h.pread(ln, off)
        if got != model[off:off + ln]:
            bad = next(j for j in range(ln) if got[j] != model[off + j])
            sys.exit(f"operation {i}: byte {off + bad} reads {got[bad]}, the model has {model[off + bad]}")
open(model_path, "wb").write(model)
print("2000 operations agree")
"#;

/// An export larger than its volume: writes past the space get ENOSPC (not a dropped
/// connection or a stopped file system), everything written before reads back, the server
/// stops cleanly and the volume checks clean.
#[test]
fn an_export_larger_than_its_volume_answers_enospc_and_keeps_serving() {
    if !require(&["nbdsh"]) {
        return;
    }
    let dir = volume(); // 512 MiB
    let server = Serve::start(dir.path(), &["--default-size", "1G"]);
    let output = nbdsh(Some(&server.uri("")), FILL_TO_ENOSPC, &[]);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("ENOSPC after"),
        "{stdout}\n{}\nserver: {}",
        text(&output.stderr),
        server.log()
    );
    let mib: u64 = stdout
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .expect("MiB count");
    assert!((400..512).contains(&mib), "{stdout}");
    // A new connection is served as before.
    run(
        "nbdsh",
        &[
            "-u",
            &server.uri(""),
            "-c",
            "assert h.pread(4096, 4096) == b'\\x42' * 4096",
        ],
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("warning: the exports add up to 1.00 GiB on a volume of"),
        "the oversized export is announced: {log}"
    );
    fsck(dir.path(), &[]);
}

const FILL_TO_ENOSPC: &str = r#"
import errno
import nbd
chunk = b'\x42' * (1 << 20)
n = 0
while True:
    try:
        h.pwrite(chunk, n << 20)
    except nbd.Error as e:
        # libnbd gives the errno's name.
        assert e.errno == errno.errorcode[errno.ENOSPC], (e.errno, e.string)
        break
    n += 1
    assert n < 1024, "wrote past the volume"
assert h.pread(1 << 20, (n - 1) << 20) == chunk
print("ENOSPC after", n, "MiB")
"#;

#[test]
fn acknowledged_writes_survive_kill_9() {
    if !require(&["nbdsh"]) {
        return;
    }
    let dir = volume();
    for round in 0..2 {
        let server = Serve::start(dir.path(), &["--default-size", "16M"]);
        let source = WRITE_ACKNOWLEDGED.replace("bytes([i])", &format!("bytes([i + {round}])"));
        let output = nbdsh(None, &source, &[("URI", &server.uri(""))]);
        assert!(
            text(&output.stdout).contains("acknowledged"),
            "{}",
            text(&output.stderr)
        );
        server.kill9();

        let server = Serve::start(dir.path(), &[]);
        let source = CHECK_ACKNOWLEDGED.replace("bytes([i])", &format!("bytes([i + {round}])"));
        let output = nbdsh(None, &source, &[("URI", &server.uri(""))]);
        assert!(
            text(&output.stdout).contains("all there"),
            "round {round}: {}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
        let (status, log) = server.stop();
        assert!(status.success(), "{log}");
        // The restart said what recovery brought back.
        assert!(
            log.contains("was not stopped cleanly; recovery replayed"),
            "round {round}: {log}"
        );
    }
}

#[test]
fn libnbd_starts_the_server_by_socket_activation() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let dir = volume();
    let output = run(
        "nbdinfo",
        &[
            "--json",
            "--",
            "[",
            env!("CARGO_BIN_EXE_locus"),
            "serve",
            "--volume",
            dir.path().to_str().unwrap(),
            "--export",
            "act=fs:/act.img,size=2M",
            "]",
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["exports"][0]["export-name"], "act", "{json}");
    assert_eq!(json["exports"][0]["export-size"], 2 << 20);
}

#[test]
fn bad_exports_and_busy_addresses_fail_to_start_with_a_reason() {
    let dir = volume();
    let serve = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", dir.path().to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    for (args, says) in [
        (
            &[
                "--export",
                "x=fs:/missing.img",
                "--unix",
                "/dev/shm/unused.sock",
            ][..],
            "give size=SIZE",
        ),
        (
            &[
                "--export",
                "x=fs:/missing.img,ro",
                "--unix",
                "/dev/shm/unused.sock",
            ][..],
            "does not exist",
        ),
        (&["--export", "x=fs:/"][..], "absolute file path"),
        (
            &[
                "--export",
                "x=fs:/a,size=1M",
                "--export",
                "x=fs:/b,size=1M",
                "--unix",
                "/dev/shm/unused2.sock",
            ][..],
            "given twice",
        ),
        (&["--submit", "sideways"][..], "invalid value"),
    ] {
        let output = serve(args);
        assert!(!output.status.success(), "{args:?} started");
        assert!(
            text(&output.stderr).contains(says),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    for socket in ["/dev/shm/unused.sock", "/dev/shm/unused2.sock"] {
        assert!(
            !Path::new(socket).exists(),
            "a failed start left {socket} behind"
        );
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = busy.local_addr().unwrap().to_string();
    let output = serve(&["--listen", &address]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("another server"),
        "{}",
        text(&output.stderr)
    );
}

/// Parses Prometheus text with Prometheus's own Python parser; prints `name{labels} value`
/// per sample, labels sorted, so the test can look samples up.
const PARSE_METRICS: &str = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f"{family.type} {s.name}{{{labels}}} {s.value}")
"#;

/// `--metrics`: curl gets Prometheus text that Prometheus's parser reads, and the counters
/// agree with what the client did.
#[test]
fn metrics_are_prometheus_text_that_counts_what_clients_did() {
    if !require(&["nbdsh", "curl"]) {
        return;
    }
    let dir = volume();
    let port = free_port().to_string();
    let address = format!("127.0.0.1:{port}");
    let server = Serve::start(
        dir.path(),
        &[
            "--export",
            "a=fs:/a.img,size=8M",
            "--export",
            "b=fs:/b.img,size=8M",
            "--metrics",
            &address,
        ],
    );
    let script = "
for i in range(10):
    h.pwrite(b'w' * 8192, i * 8192)
for i in range(3):
    h.pread(4096, 0)
h.set_strict_mode(0)  # let the server judge the out-of-range read
try:
    h.pread(4096, 8 << 20)
except nbd.Error:
    pass
h.flush()
";
    let sh = run_unchecked("nbdsh", &["-u", &server.uri("b"), "-c", script]);
    assert!(sh.status.success(), "{}", text(&sh.stderr));
    let scrape = run("curl", &["-sSf", &format!("http://{address}/metrics")]);
    let parse = client("python3")
        .args(["-c", PARSE_METRICS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    parse
        .stdin
        .as_ref()
        .unwrap()
        .write_all(&scrape.stdout)
        .unwrap();
    let parsed = parse.wait_with_output().unwrap();
    assert!(
        parsed.status.success(),
        "Prometheus's parser refused the text: {}\n{}",
        text(&parsed.stderr),
        text(&scrape.stdout)
    );
    let samples = text(&parsed.stdout);
    let value = |kind: &str, sample: &str| -> f64 {
        let line = samples
            .lines()
            .find(|l| {
                l.strip_prefix(kind)
                    .and_then(|l| l.strip_prefix(' '))
                    .is_some_and(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
            })
            .unwrap_or_else(|| panic!("no {kind} sample {sample} in:\n{samples}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let b = "channel=0,export=b";
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_requests_total{{{b},kind=write,node=0}}")
        ),
        10.0
    );
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_requests_total{{{b},kind=read,node=0}}")
        ),
        3.0
    );
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_written_bytes_total{{{b},node=0}}")
        ),
        81920.0
    );
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_read_bytes_total{{{b},node=0}}")
        ),
        12288.0
    );
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_request_errors_total{{{b},node=0}}")
        ),
        1.0
    );
    // FLUSH (and the disconnect's nothing) are "other".
    assert_eq!(
        value(
            "counter",
            &format!("locus_nbd_requests_total{{{b},kind=other,node=0}}")
        ),
        1.0
    );
    assert_eq!(
        value(
            "counter",
            "locus_nbd_requests_total{channel=0,export=a,kind=write,node=0}"
        ),
        0.0
    );
    // The histogram holds every request once.
    assert_eq!(
        value(
            "histogram",
            &format!("locus_nbd_request_duration_seconds_count{{{b},node=0}}")
        ),
        15.0
    );
    assert_eq!(
        value(
            "histogram",
            &format!("locus_nbd_request_duration_seconds_bucket{{{b},le=+Inf,node=0}}")
        ),
        15.0
    );
    assert!(
        value(
            "histogram",
            &format!("locus_nbd_request_duration_seconds_sum{{{b},node=0}}")
        ) > 0.0
    );
    assert_eq!(
        value("counter", "locus_nbd_connections_total{channel=0,node=0}"),
        1.0
    );
    let free = value("gauge", "locus_volume_free_bytes{}");
    let capacity = value("gauge", "locus_volume_capacity_bytes{}");
    assert!(free > 0.0 && free < capacity, "free {free} of {capacity}");
    // Ten small writes on a fresh volume never wait for the checkpoint; each reason has
    // its sample.
    for reason in ["log", "buffers", "space", "journal"] {
        assert_eq!(
            value(
                "counter",
                &format!("locus_fs_backpressure_waits_total{{reason={reason}}}")
            ),
            0.0
        );
    }
    // A fresh volume written in ten small pieces has nothing to defragment, and says so.
    for earned_by in ["writes", "reads"] {
        assert_eq!(
            value(
                "counter",
                &format!("locus_fs_defragmented_windows_total{{earned_by={earned_by}}}")
            ),
            0.0
        );
    }
    assert_eq!(
        value("gauge", "locus_fs_defrag_windows{state=deferred}"),
        0.0
    );
    // Ten writes into a fresh volume's recycled-page lists: none of what they replaced went
    // back to the volume in pages.
    assert_eq!(value("counter", "locus_fs_unrecycled_blocks_total{}"), 0.0);
    // The snapshots' pauses: the sum at least the longest, the longest at least the last,
    // none without a snapshot.
    let snapshots = value("counter", "locus_fs_snapshots_total{}");
    let total = value("counter", "locus_fs_snapshot_pause_seconds_total{}");
    let longest = value("gauge", "locus_fs_snapshot_pause_max_seconds{}");
    let last = value("gauge", "locus_fs_snapshot_pause_last_seconds{}");
    assert!(value("gauge", "locus_fs_snapshot_bytes{}") > 0.0);
    assert!(
        total >= longest && longest >= last && (snapshots > 0.0 || total == 0.0),
        "{snapshots} snapshots, pauses {total} s in all, {longest} s at most, {last} s last"
    );
    // Anything but /metrics is a 404.
    let other = run_unchecked("curl", &["-sSf", &format!("http://{address}/other")]);
    assert!(!other.status.success());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// `locus status` and `fsck` of a volume `locus serve` holds: status asks the server through
/// its control socket and shows what a real client just did; fsck is made by the server,
/// clean each time while a client writes (its writes held meanwhile), and `fsck --repair`
/// and `format` are refused naming the server; once the server stops (its socket gone) both
/// open the volume themselves again.
#[test]
fn status_of_a_served_volume_is_the_servers_live_view() {
    if !require(&["qemu-io"]) {
        return;
    }
    let dir = volume();
    let server = Serve::start(dir.path(), &["--default-size", "16M"]);
    let pid = server.child.as_ref().unwrap().id();
    run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0xab 0 1M", &server.uri("")],
    );
    let locus = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(args)
            .args(["--volume", dir.path().to_str().unwrap()])
            .output()
            .expect("run locus")
    };

    let output = locus(&["status", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let live: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert_eq!(live["served_by"]["pid"], pid, "{live}");
    let channels = live["channels"].as_array().expect("channels");
    let sum = |key: &str| {
        channels
            .iter()
            .map(|c| c[key].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(sum("writes") >= 1, "{live}");
    assert!(sum("written_bytes") >= 1 << 20, "{live}");
    assert!(live["fs_live"]["writes"].as_u64().unwrap() >= 1, "{live}");
    assert!(!live["devices"].as_array().unwrap().is_empty(), "{live}");
    // The snapshots' pauses: every counter there, the sum at least the longest, the
    // longest at least the last.
    let fs_live = &live["fs_live"];
    let count = |key: &str| {
        fs_live[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key}: {live}"))
    };
    assert!(count("snapshot_bytes") > 0, "{live}");
    assert!(
        count("snapshot_pause_total_ns") >= count("snapshot_pause_max_ns")
            && count("snapshot_pause_max_ns") >= count("snapshot_pause_last_ns")
            && (count("snapshots") > 0 || count("snapshot_pause_total_ns") == 0),
        "{live}"
    );
    let output = locus(&["status"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains(&format!("served by `locus serve` (pid {pid})"))
            && out.contains("snapshots: "),
        "{out}"
    );

    // fsck through the server, while a client writes.
    let mut writer = Command::new("qemu-io")
        .args(["-f", "raw"])
        .args(
            (0..600)
                .flat_map(|i| {
                    let at = (i * 37 % 200) * 64;
                    // Writes, zeroes and discards: log records and journal records both.
                    let command = match i % 3 {
                        0 => format!("write -P {} {at}k 64k", i % 250),
                        1 => format!("write -z {at}k 64k"),
                        _ => format!("discard {at}k 64k"),
                    };
                    ["-c".to_owned(), command]
                })
                .collect::<Vec<_>>(),
        )
        .arg(server.uri(""))
        .stdout(Stdio::null())
        .spawn()
        .expect("start qemu-io");
    for _ in 0..10 {
        let output = locus(&["fsck"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let out = text(&output.stdout);
        assert!(
            out.contains(&format!(
                "checked by `locus serve` (pid {pid}), its writes held"
            )) && out.contains("file system: ")
                && !out.contains("problem"),
            "{out}"
        );
    }
    let output = locus(&["fsck", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("fsck JSON");
    assert_eq!(report["held_by"]["server"], "serve", "{report}");
    assert_eq!(report["held_by"]["pid"], pid, "{report}");
    assert_eq!(report["fs"]["state"], "present", "{report}");
    assert!(writer.wait().expect("qemu-io").success());

    // The commands that need the volume to themselves name the server.
    for command in [
        &["fsck", "--repair"][..],
        &["format", "--emulate", "64M", "--force"],
    ] {
        let output = locus(command);
        assert!(!output.status.success(), "{command:?}");
        assert!(
            text(&output.stderr).contains(&format!("served by `locus serve` (pid {pid})")),
            "{command:?}: {}",
            text(&output.stderr)
        );
    }

    // scrub asks the server, which says why it has nothing to check.
    let output = locus(&["scrub"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains(&format!("through `locus serve` (pid {pid})"))
            && text(&output.stderr).contains("no data checksums"),
        "{}",
        text(&output.stderr)
    );

    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(!dir.path().join("locus.serve.sock").exists());
    let output = locus(&["status", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let offline: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert!(offline.get("served_by").is_none(), "{offline}");
    fsck(dir.path(), &[]);
}

/// `locus scrub` of a volume with data checksums that `locus serve` holds is run by the
/// server beside a client's writes (qemu-io, with fio's nbd engine verifying what it writes
/// at the same time): clean while nothing is damaged, and once a bit is flipped in a block
/// the client wrote, it names that block of the export's file and exits 1; the client's data
/// stays intact throughout.
#[test]
fn scrub_of_a_served_volume_runs_in_the_server_beside_its_clients() {
    if !require(&["qemu-io", "fio"]) {
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm");
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["format", "--volume", dir.path().to_str().unwrap()])
        .args(["--emulate=256M", "--data-checksums"])
        .output()
        .expect("run locus format");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let server = Serve::start(
        dir.path(),
        &[
            "--export",
            "disk=fs:/disk,size=32M",
            "--export",
            "busy=fs:/busy,size=32M",
        ],
    );
    let pid = server.child.as_ref().unwrap().id();
    // Block 1 of /disk: 4 KiB of one byte no other write uses.
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 4096 4096",
            &server.uri("disk"),
        ],
    );
    let scrub = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .arg("scrub")
            .args(args)
            .args(["--volume", dir.path().to_str().unwrap()])
            .output()
            .expect("run locus scrub")
    };
    let mut writer = Command::new("fio")
        .args([
            "--name=busy",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri("busy")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--time_based",
            "--runtime=3",
            "--verify=crc32c",
            "--verify_backlog=256",
            "--verify_state_save=0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio");
    let mut scrubs = 0;
    while writer.try_wait().unwrap().is_none() {
        let output = scrub(&["--json"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            report["damaged"].as_array().map(Vec::len),
            Some(0),
            "{report}"
        );
        assert!(report["blocks"].as_u64().unwrap() >= 1, "{report}");
        assert_eq!(
            report["scrubbed_by"],
            format!("`locus serve` (pid {pid})"),
            "{report}"
        );
        scrubs += 1;
    }
    let fio = writer.wait_with_output().unwrap();
    assert!(fio.status.success(), "{}", text(&fio.stderr));
    assert!(
        text(&fio.stdout).contains("err= 0"),
        "{}",
        text(&fio.stdout)
    );
    assert!(scrubs >= 3, "only {scrubs} scrubs ran beside the writer");

    let device = common::emulated_device(dir.path());
    let image = std::fs::read(&device).unwrap();
    let block = image
        .chunks(4096)
        .position(|b| b.iter().all(|&x| x == 0x5a))
        .expect("the written block is on the device");
    drop(image);
    common::poke(&device, (block * 4096 + 777) as u64, 0x5b);
    let output = scrub(&[]);
    assert!(!output.status.success(), "a damaged block fails the scrub");
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains(&format!("through `locus serve` (pid {pid})"))
            && stdout.contains("damaged: /disk bytes 4096..8192 (file block"),
        "{stdout}"
    );
    assert!(
        text(&output.stderr).contains("1 damaged block(s)"),
        "{}",
        text(&output.stderr)
    );
    // The server's status tells how its last scrub ended.
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["status", "--json", "--volume", dir.path().to_str().unwrap()])
        .output()
        .expect("run locus status");
    let live: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert_eq!(
        live["scrub"]["report"]["damaged"][0]["path"], "/disk",
        "{live}"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// The control socket's name in the volume directory is not free for an NBD socket: `serve`
/// refuses it at once, naming it, instead of serving on a socket its control thread replaces.
#[test]
fn an_nbd_socket_on_the_control_sockets_path_is_refused() {
    let dir = volume();
    let taken = dir.path().join("locus.serve.sock");
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["serve", "--volume", dir.path().to_str().unwrap(), "--unix"])
        .arg(&taken)
        .output()
        .expect("run locus serve");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("is the server's control socket"),
        "{}",
        text(&output.stderr)
    );
    assert!(!taken.exists());
}
