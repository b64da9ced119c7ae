//! Cache exports (`--export NAME=cache:PATH,...`) tested with real NBD clients: fio's nbd
//! engine with crc32c verification through a cache its data overflows and through one its hot
//! set fits, qemu-img converting in and out, and kill -9 of the server with dirty blocks in
//! NVRAM, after which every acknowledged write reads back.
//!
//! The backing store is a file on the disk (/var/tmp, opened O_DIRECT); the NVRAM is a file
//! of a volume in /dev/shm. Without the tools (Debian: fio, qemu-utils, libnbd-bin,
//! python3-libnbd) the tests say so and pass, except under CI=true, where `.ci/run` installs
//! them and a missing one is a failure.

mod common;

use common::{client, require, run, text};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A volume in shared memory and a backing file of `backing_bytes` on the disk.
struct Setup {
    volume: tempfile::TempDir,
    disk: tempfile::TempDir,
}

impl Setup {
    fn new(backing_bytes: u64) -> Setup {
        let volume = tempfile::tempdir_in("/dev/shm").unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["format", "--volume", volume.path().to_str().unwrap()])
            .arg("--emulate=256M")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let disk = tempfile::tempdir_in("/var/tmp").unwrap();
        let backing = std::fs::File::create(disk.path().join("backing.img")).unwrap();
        backing.set_len(backing_bytes).unwrap();
        Setup { volume, disk }
    }

    fn backing(&self) -> PathBuf {
        self.disk.path().join("backing.img")
    }

    fn export(&self, nvram: &str, dram: &str) -> String {
        format!(
            "c=cache:{},nvram={nvram},dram={dram}",
            self.backing().display()
        )
    }
}

/// A running `locus serve` on a Unix socket.
struct Serve {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl Serve {
    fn start(volume: &Path, export: &str) -> Serve {
        Serve::start_with(volume, export, &[])
    }

    fn start_with(volume: &Path, export: &str, extra: &[&str]) -> Serve {
        let socket = volume.join("nbd.sock");
        let log = volume.join("serve.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", volume.to_str().unwrap(), "--unix"])
            .arg(&socket)
            .args(["--export", export])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        common::wait_until_serving(&mut child, &log, Duration::from_secs(60));
        Serve {
            child: Some(child),
            socket,
            log,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///c?socket={}", self.socket.display())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill_9(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_file(&self.socket);
    }

    fn stop(&mut self) -> String {
        let child = self.child.take().unwrap();
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", self.log());
        self.log()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn fio(uri: &str, args: &[&str]) -> String {
    let mut all = vec![
        "--name=cache".to_owned(),
        "--ioengine=nbd".to_owned(),
        format!("--uri={uri}"),
        "--verify=crc32c".to_owned(),
        "--verify_fatal=1".to_owned(),
        "--do_verify=1".to_owned(),
        "--verify_state_save=0".to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    text(&run("fio", &refs).stdout)
}

#[test]
fn fio_verifies_through_a_cache_its_data_overflows_and_one_its_hot_set_fits() {
    if !require(&["fio"]) {
        return;
    }
    let setup = Setup::new(64 << 20);
    let mut serve = Serve::start(setup.volume.path(), &setup.export("1M", "1M"));
    // 16 MiB of random 4 KiB writes and reads through 1 MiB of NVRAM: most writes evict.
    let out = fio(
        &serve.uri(),
        &["--rw=randrw", "--bs=4k", "--size=16M", "--offset=0"],
    );
    assert!(out.contains("err= 0"), "{out}");
    // A 512 KiB hot set, mixed sizes, fits NVRAM: writes hit.
    let out = fio(
        &serve.uri(),
        &[
            "--rw=randrw",
            "--bsrange=512-64k",
            "--size=512k",
            "--offset=32M",
            "--loops=4",
        ],
    );
    assert!(out.contains("err= 0"), "{out}");
    let log = serve.stop();
    let totals = log
        .lines()
        .find(|l| l.contains("total: cache c"))
        .unwrap_or_else(|| panic!("no cache totals: {log}"));
    for needed in ["write-backs", "write hits", "partial-block reads"] {
        assert!(totals.contains(needed), "{totals}");
    }
    let number = |label: &str| -> u64 {
        let at = totals.find(label).unwrap();
        totals[..at]
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(number(" write-backs") > 1000, "{totals}");
    assert!(number(" write hits") > 0, "{totals}");
    assert!(
        number(" partial-block reads") > 0,
        "bsrange 512-64k: {totals}"
    );
}

#[test]
fn qemu_img_converts_in_and_out_through_the_cache() {
    if !require(&["qemu-img"]) {
        return;
    }
    let setup = Setup::new(32 << 20);
    let serve = Serve::start(setup.volume.path(), &setup.export("2M", "1M"));
    let source = setup.disk.path().join("source.img");
    let data: Vec<u8> = (0..(24u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&source, &data).unwrap();
    let uri = serve.uri();
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            source.to_str().unwrap(),
            &uri,
        ],
    );
    let out = setup.disk.path().join("out.img");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            out.to_str().unwrap(),
        ],
    );
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len(), 32 << 20);
    assert!(back[..data.len()] == data[..], "what went in comes out");
    assert!(back[data.len()..].iter().all(|&b| b == 0));
}

/// Writes 4 KiB blocks in order through nbdsh, printing each block number once its write
/// returned (acknowledged).
const WRITER: &str = r#"
import sys
for i in range(100000):
    h.pwrite(i.to_bytes(8, "little") * 512, (i % 4096) * 4096)
    print(i, flush=True)
"#;

#[test]
fn kill_9_with_dirty_blocks_in_nvram_loses_no_acknowledged_write() {
    if !require(&["nbdsh"]) {
        return;
    }
    let setup = Setup::new(16 << 20);
    // 256 KiB of NVRAM: the writer overflows it all the time.
    let export = setup.export("256K", "128K");
    let mut serve = Serve::start(setup.volume.path(), &export);
    let mut writer = client("nbdsh")
        .args(["-u", &serve.uri(), "-c", WRITER])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = writer.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.parse::<u64>().ok())
            .last()
    });
    std::thread::sleep(Duration::from_millis(1500));
    serve.kill_9();
    let _ = writer.wait();
    let last = reader
        .join()
        .unwrap()
        .expect("the writer acknowledged some blocks before the kill");
    assert!(
        last > 64,
        "more blocks than NVRAM holds were written: {last}"
    );
    let mut serve = Serve::start(setup.volume.path(), &export);
    assert!(
        serve.log().contains("recovered") && serve.log().contains("dirty block(s)"),
        "{}",
        serve.log()
    );
    // The write after the last acknowledged one may have been made durable with its reply
    // still unsent when the server died: then its block holds it, and it counts as written
    // (an unacknowledged write may or may not be there; an acknowledged one must be).
    let next = last + 1;
    let probe = format!(
        r#"
got = h.pread(8, {block} * 4096)
print("landed" if got == ({next}).to_bytes(8, "little") else "absent")
"#,
        block = next % 4096
    );
    let probed = run("nbdsh", &["-u", &serve.uri(), "-c", &probe]);
    let last = if text(&probed.stdout).trim() == "landed" {
        next
    } else {
        last
    };
    // Every acknowledged block holds its last write.
    let check = format!(
        r#"
last = {last}
for b in range(min(last + 1, 4096)):
    newest = max(i for i in range(b, last + 1, 4096))
    got = h.pread(4096, b * 4096)
    want = newest.to_bytes(8, "little") * 512
    assert got == want, (b, newest, got[:8])
print("ok")
"#
    );
    let out = run("nbdsh", &["-u", &serve.uri(), "-c", &check]);
    assert_eq!(text(&out.stdout).trim(), "ok");
    serve.stop();

    // Restarted with --writeback-on-stop and stopped: the backing file alone holds it all.
    let mut serve = Serve::start_with(setup.volume.path(), &export, &["--writeback-on-stop"]);
    let log = serve.stop();
    assert!(log.contains("dirty block(s) back"), "{log}");
    let raw = std::fs::read(setup.backing()).unwrap();
    for b in 0..=last.min(4095) {
        let newest = (b..=last).step_by(4096).max().unwrap();
        let want: Vec<u8> = newest.to_le_bytes().repeat(512);
        assert!(
            raw[(b * 4096) as usize..][..4096] == want[..],
            "block {b} of the backing file after write-back"
        );
    }
}

/// TRIM and WRITE_ZEROES reach the backing store: trimmed whole blocks read as zeros and
/// leave a hole in the backing file (its blocks go back); zeroing an unaligned range zeros
/// exactly it.
#[test]
fn trim_and_write_zeroes_reach_the_backing_file() {
    use std::os::unix::fs::MetadataExt;
    if !require(&["nbdsh"]) {
        return;
    }
    let setup = Setup::new(8 << 20);
    // Background write-back at 50% of 64 KiB: most written blocks reach the backing file.
    let export = format!("{},writeback=50:10", setup.export("64K", "16K"));
    let mut serve = Serve::start(setup.volume.path(), &export);
    let script = r#"
data = bytes(range(256)) * 4096 * 4   # 4 MiB
h.pwrite(data, 0)
import time
time.sleep(0.5)
"#;
    run("nbdsh", &["-u", &serve.uri(), "-c", script]);
    let before = std::fs::metadata(setup.backing()).unwrap().blocks();
    assert!(
        before >= 2 * 2048,
        "the backing file holds most of 4 MiB: {before} sectors"
    );
    let script = r#"
h.trim(4 << 20, 0)
assert h.pread(4 << 20, 0) == bytes(4 << 20), "trimmed blocks read as zeros"
h.zero(5000, 10000)  # count, offset
print("ok")
"#;
    let out = run("nbdsh", &["-u", &serve.uri(), "-c", script]);
    assert_eq!(text(&out.stdout).trim(), "ok");
    let after = std::fs::metadata(setup.backing()).unwrap().blocks();
    assert_eq!(
        after, 0,
        "the trimmed range is a hole again ({before} -> {after} sectors)"
    );
    serve.stop();
    // After a restart (nothing dirty is resurrected), the data is still zeros, and the
    // zeroed unaligned range is exact.
    let serve = Serve::start(setup.volume.path(), &export);
    let script = r#"
assert h.pread(4 << 20, 0) == bytes(4 << 20)
h.pwrite(b"\xff" * 16384, 0)
h.zero(3000, 5000)   # count, offset
got = h.pread(16384, 0)
assert got[:5000] == b"\xff" * 5000 and got[5000:8000] == bytes(3000) and got[8000:] == b"\xff" * 8384, got[4990:8010]
print("ok")
"#;
    let out = run("nbdsh", &["-u", &serve.uri(), "-c", script]);
    assert_eq!(text(&out.stdout).trim(), "ok");
}

/// `locus status` of a stopped volume reads each cache export's NVRAM index without opening
/// the file system: the dirty blocks a kill -9 left awaiting write-back (as many as the next
/// start recovers), and none after a stop with --writeback-on-stop.
#[test]
fn status_of_a_stopped_volume_counts_the_dirty_blocks_awaiting_write_back() {
    if !require(&["nbdsh"]) {
        return;
    }
    let setup = Setup::new(16 << 20);
    let export = setup.export("1M", "128K");
    let mut serve = Serve::start(setup.volume.path(), &export);
    let writes = "
for b in range(0, 40, 2):
    h.pwrite(bytes([b]) * 4096, b * 4096)
print('written')
";
    let out = run("nbdsh", &["-u", &serve.uri(), "-c", writes]);
    assert_eq!(text(&out.stdout).trim(), "written");
    serve.kill_9();
    let status = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_locus"));
        command.args(["status", "--volume", setup.volume.path().to_str().unwrap()]);
        if json {
            command.arg("--json");
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let report: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    let caches = report["caches"].as_array().expect("a caches list");
    assert_eq!(caches.len(), 1, "{report}");
    assert_eq!(caches[0]["name"], "c");
    assert_eq!(caches[0]["path"], "/.cache/c.nvram");
    assert_eq!(caches[0]["slots"], 256);
    let dirty = caches[0]["dirty_blocks"].as_u64().expect("dirty_blocks");
    assert!(dirty > 0 && dirty <= 20, "{dirty} dirty blocks");
    let human = status(false);
    assert!(
        human.contains(&format!("cache c: {dirty} dirty block(s)")),
        "{human}"
    );
    // The next start recovers exactly those.
    let mut serve = Serve::start_with(setup.volume.path(), &export, &["--writeback-on-stop"]);
    assert!(
        serve
            .log()
            .contains(&format!("recovered {dirty} dirty block(s)")),
        "{}",
        serve.log()
    );
    serve.stop();
    let report: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    assert_eq!(report["caches"][0]["dirty_blocks"], 0, "{report}");
    assert!(status(false).contains("cache c: no dirty blocks"));
}
