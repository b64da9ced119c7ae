//! `locus format`, `locus status` and `locus bench volume` as a user runs them, on volumes in
//! temporary directories under /dev/shm.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

fn locus(volume: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(&args[..1])
        .arg("--volume")
        .arg(volume)
        .args(&args[1..])
        .output()
        .expect("run locus")
}

/// The file system of the (closed) volume in `dir`, opened in this process.
fn open_fs(dir: &Path) -> fs::Fs {
    let topology = topology::Topology::read_live().unwrap();
    let volume = volume::Volume::open(dir, topology, &Default::default()).unwrap();
    fs::Fs::open(std::sync::Arc::new(volume), fs::FsOptions::default()).unwrap()
}

/// [`open_fs`] with the checkpoint run only on demand: what is written stays in the logs
/// until a drain, the unmount or (after `abandon`) the next open.
fn open_fs_on_demand(dir: &Path) -> fs::Fs {
    let topology = topology::Topology::read_live().unwrap();
    let volume = volume::Volume::open(dir, topology, &Default::default()).unwrap();
    let options = fs::FsOptions {
        checkpoint: fs::CheckpointMode::OnDemand,
        ..fs::FsOptions::default()
    };
    fs::Fs::open(std::sync::Arc::new(volume), options).unwrap()
}

/// `locus status --json` of the volume in `dir`, which must succeed.
fn status_json(dir: &Path) -> Value {
    let status = locus(dir, &["status", "--json"]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    serde_json::from_slice(&status.stdout).unwrap()
}

/// Asserts that `output`'s standard output contains `needle`, showing it when not.
fn assert_says(output: &Output, needle: &str) {
    let out = text(&output.stdout);
    assert!(out.contains(needle), "{needle:?} not in:\n{out}");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn format_two_devices_then_status_reports_them() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let a = dir.path().join("a.pmem");
    let b = dir.path().join("b.pmem");
    let output = locus(
        dir.path(),
        &[
            "format",
            "--device",
            &format!("{},node=0,size=8M", a.display()),
            "--device",
            &format!("{},node=0,size=16M", b.display()),
            "--no-fs",
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_says(&output, "with 2 device(s)");

    let output = locus(dir.path(), &["status", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap();
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["path"], a.display().to_string());
    assert_eq!(devices[0]["kind"], "emulated");
    assert_eq!(devices[0]["node"], 0);
    assert_eq!(devices[1]["capacity_bytes"], 16 << 20);
    assert_eq!(devices[1]["free_bytes"], (16 << 20) - (2 << 20));
    assert_eq!(devices[0]["state"], "candidate");
    assert_eq!(doc["orders"][0]["devices"], serde_json::json!([0, 1]));

    let again = locus(
        dir.path(),
        &[
            "format",
            "--device",
            &format!("{},node=0,size=8M", a.display()),
        ],
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("--force"),
        "{}",
        text(&again.stderr)
    );
    let forced = locus(
        dir.path(),
        &[
            "format",
            "--force",
            "--device",
            &format!("{},node=0,size=8M", a.display()),
        ],
    );
    assert!(forced.status.success(), "{}", text(&forced.stderr));
}

#[test]
fn status_creates_the_embedded_default_and_says_so() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let volume = dir.path().join("vol");
    // A small default: format with --emulate sizes it, status then finds it.
    let output = locus(&volume, &["format", "--emulate=8M"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = locus(&volume, &["status"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("emulated") && stdout.contains("candidate"),
        "{stdout}"
    );
    assert!(
        stdout.contains("survive process crashes, not reboots"),
        "{stdout}"
    );

    // An empty directory made for it gets the embedded default.
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["status", "--volume", fresh.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("created the embedded default"),
        "{}",
        text(&output.stderr)
    );
    assert!(fresh.join("locus.toml").exists());
}

#[test]
fn a_mistyped_volume_gets_no_volume_and_nothing_is_left_behind() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let typo = dir.path().join("vlume").join("x");
    for command in [
        &["status"][..],
        &["fsck"],
        &["fsck", "--repair"],
        &["serve"],
    ] {
        let output = locus(&typo, command);
        assert_eq!(output.status.code(), Some(1), "{command:?}");
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(&format!("no volume at {}", typo.display())),
            "{command:?}: {stderr}"
        );
        assert!(
            !stderr.contains("created the embedded default"),
            "{command:?}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{command:?} left {left:?}");
    }
    // A path through a file is no volume either, not an I/O error.
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let output = locus(&file.join("vol"), &["status"]);
    assert!(
        text(&output.stderr).contains("no volume at"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn a_volume_in_use_names_the_holder() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(dir.path(), &["format", "--emulate=8M"])
            .status
            .success()
    );
    let _held = volume::VolumeLock::acquire(dir.path()).unwrap();
    let output = locus(dir.path(), &["status"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("in use by pid {}", std::process::id())),
        "{stderr}"
    );
    // This test program's command line names it.
    let me = std::env::args().next().unwrap();
    assert!(
        stderr.contains(&format!("(`{me}")) && stderr.contains("one process at a time"),
        "{stderr}"
    );
}

/// A program holding the volume through the preload library answers for it on the control
/// socket: `status` shows its live view and names it, `scrub` runs in it beside its writes
/// (clean while it writes, then naming a block damaged under it), `fsck` is made by it
/// between its calls, `fsck --repair` and `format` are refused naming it and what frees the
/// volume; after it exits the socket is gone and the volume opens here again.
#[test]
fn a_program_through_the_preload_library_answers_for_its_volume() {
    const MARKER: &[u8] = b"the block of /victim that a bit is flipped in, under its program";
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let formatted = locus(dir.path(), &["format", "--emulate=64M", "--data-checksums"]);
    assert!(formatted.status.success(), "{}", text(&formatted.stderr));
    // Writes /victim (its second block holds MARKER) and 4 MiB of /busy, says so, then
    // writes and checks /busy until its stdin closes, and prints how many writes it made.
    let script = r#"
import os, select, sys
marker = sys.argv[1].encode()
victim = bytearray(b"\x11" * 3 * 4096)
victim[4096 + 100:4096 + 100 + len(marker)] = marker
with open("/locus/victim", "wb") as f:
    f.write(victim)
fd = os.open("/locus/busy", os.O_RDWR | os.O_CREAT, 0o644)
model = bytearray(4 << 20)
os.pwrite(fd, bytes(model), 0)
print("ready", flush=True)
n = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    off = (n * 7919 % 1024) * 4096 + (n % 5) * 100
    data = bytes([n % 251 + 1]) * (700 if n % 3 else 4096)
    os.pwrite(fd, data, off)
    model[off:off + len(data)] = data
    if n % 4 == 0:
        # Changes of names and holes too (journal records beside the log's).
        with open("/locus/scratch-%d" % (n % 3), "wb") as f:
            f.write(data)
        if n % 8 == 0:
            os.unlink("/locus/scratch-%d" % (n % 3))
    n += 1
assert os.pread(fd, len(model), 0) == bytes(model), "read back differs"
print(n, flush=True)
"#;
    let mut program = Command::new("python3")
        .args(["-c", script])
        .arg(std::str::from_utf8(MARKER).unwrap())
        .env("LD_PRELOAD", common::preload_library())
        .env("LOCUS_VOLUME", dir.path())
        .env("LOCUS_MOUNT", "/locus")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(program.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = u64::from(program.id());

    let live = status_json(dir.path());
    assert_eq!(live["served_by"]["server"], "preload", "{live}");
    assert_eq!(live["served_by"]["pid"], pid, "{live}");
    assert!(
        live["served_by"]["program"]
            .as_str()
            .is_some_and(|p| p.contains("python3 -c") && !p.contains('\n')),
        "{live}"
    );
    assert!(live["fs_live"]["inodes"].as_u64().unwrap() >= 3, "{live}");
    assert_eq!(live["devices"][0]["index"], 0, "{live}");
    let status = locus(dir.path(), &["status"]);
    assert_says(&status, "through the preload library): its live view");
    assert_says(&status, "held by `");
    assert_says(
        &status,
        &format!("(pid {pid}, through the preload library)"),
    );

    for _ in 0..3 {
        let out = locus(dir.path(), &["scrub", "--json"]);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
        assert!(out.status.success(), "a scrub beside the writes: {report}");
        assert_eq!(
            report["damaged"].as_array().map(Vec::len),
            Some(0),
            "{report}"
        );
        assert!(report["blocks"].as_u64().unwrap() >= 3 + 1024, "{report}");
        assert!(
            report["scrubbed_by"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("(pid {pid}, through the preload library)"))),
            "{report}"
        );
    }

    common::damage_marked_block(dir.path(), MARKER);
    let out = locus(dir.path(), &["scrub"]);
    assert!(!out.status.success(), "a damaged block fails the scrub");
    assert_says(&out, "damaged: /victim bytes 4096..8192 (file block");
    let live = status_json(dir.path());
    assert_eq!(
        live["scrub"]["report"]["damaged"][0]["path"], "/victim",
        "{live}"
    );

    // fsck is made by the program, between two of its calls (the damaged data block is
    // scrub's to find: fsck checks the structures).
    for _ in 0..8 {
        let out = locus(dir.path(), &["fsck"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_says(
            &out,
            &format!("(pid {pid}, through the preload library), its writes held"),
        );
        assert_says(&out, "file system: ");
        assert!(
            !text(&out.stdout).contains("problem"),
            "{}",
            text(&out.stdout)
        );
    }
    let out = locus(dir.path(), &["fsck", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("fsck JSON");
    assert_eq!(report["held_by"]["server"], "preload", "{report}");
    assert_eq!(report["held_by"]["pid"], pid, "{report}");
    assert_eq!(report["fs"]["state"], "present", "{report}");
    for command in [
        &["fsck", "--repair"][..],
        &["format", "--emulate=8M", "--force"],
    ] {
        let out = locus(dir.path(), command);
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("held by `")
                && stderr.contains(&format!("(pid {pid}, through the preload library)"))
                && stderr.contains("let the program end first"),
            "{command:?}: {stderr}"
        );
    }

    drop(program.stdin.take());
    let writes: u64 = lines.next().unwrap().unwrap().parse().unwrap();
    let exit = program.wait_with_output().unwrap();
    assert!(exit.status.success(), "{}", text(&exit.stderr));
    assert!(writes > 0);
    assert!(
        !dir.path().join("locus.serve.sock").exists(),
        "the program's control socket outlived it"
    );
    // The volume is nobody's now: scrub reads it from the media and finds the block.
    let out = locus(dir.path(), &["scrub"]);
    assert!(!out.status.success());
    assert_says(&out, "damaged: /victim bytes 4096..8192 (file block");
    assert!(
        !text(&out.stdout).contains("through"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn bad_device_specs_are_refused() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let output = locus(dir.path(), &["format", "--device", "/dev/shm/x,speed=fast"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("unknown key `speed`"));
    let output = locus(
        dir.path(),
        &[
            "format",
            "--device",
            &format!("{}/tiny,node=0,size=1M", dir.path().display()),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("smaller than"),
        "{}",
        text(&output.stderr)
    );
    // A device in a directory that does not exist: named, and nothing is created — not
    // even the volume directory.
    let volume = dir.path().join("new-volume");
    let output = locus(
        &volume,
        &[
            "format",
            "--device",
            &format!("{}/missing/a.pmem,node=0,size=64M", dir.path().display()),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("missing does not exist"),
        "{}",
        text(&output.stderr)
    );
    assert!(!volume.exists(), "a refused format leaves nothing behind");
    // A device file in the volume directory still to be made is fine.
    let output = locus(
        &volume,
        &[
            "format",
            "--device",
            &format!("{}/a.pmem,node=0,size=64M", volume.display()),
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn bench_volume_prints_one_json_object_per_case() {
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["bench", "volume", "--json", "--seconds", "0.05"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let cases: Vec<Value> = text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(cases.len(), 8, "alloc and free x 2 sizes x 2 thread counts");
    for case in &cases {
        assert_eq!(case["suite"], "volume");
        assert!(case["ops_per_sec"].as_f64().unwrap() > 0.0);
        for key in ["op", "bs_bytes", "threads", "local_share"] {
            assert!(!case[key].is_null(), "{key} missing in {case}");
        }
    }
}

#[test]
fn fsck_reports_every_problem_by_device() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let a = dir.path().join("a.pmem");
    let b = dir.path().join("b.pmem");
    let spec = |p: &Path| format!("{},node=0,size=8M", p.display());
    assert!(
        locus(
            dir.path(),
            &["format", "--device", &spec(&a), "--device", &spec(&b)]
        )
        .status
        .success()
    );
    let clean = locus(dir.path(), &["fsck"]);
    assert!(clean.status.success(), "{}", text(&clean.stderr));
    assert!(text(&clean.stdout).contains("clean"));

    // Device b from another volume, device a damaged: both reported in one run.
    let other = tempfile::tempdir_in("/dev/shm").unwrap();
    let c = other.path().join("c.pmem");
    assert!(
        locus(other.path(), &["format", "--device", &spec(&c)])
            .status
            .success()
    );
    std::fs::copy(&c, &b).unwrap();
    let mut bytes = std::fs::read(&a).unwrap();
    bytes[36] ^= 0xff; // device_count
    std::fs::write(&a, bytes).unwrap();
    let output = locus(dir.path(), &["fsck", "--json"]);
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let problems: Vec<String> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("a.pmem") && p.contains("crc32c")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("locus.toml lists 2 devices") || p.contains("missing")),
        "{problems:?}"
    );

    std::fs::remove_file(&b).unwrap();
    let output = locus(dir.path(), &["fsck"]);
    assert_eq!(output.status.code(), Some(1));
    assert_says(&output, "b.pmem");
}

#[test]
fn fsck_checks_the_file_system_and_repairs_what_is_safe() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let output = locus(dir.path(), &["format", "--emulate", "64M"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("with an empty file system"));

    let fsck_json = |args: &[&str]| {
        let output = locus(dir.path(), args);
        let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "locus {args:?}: {e}: {}{}",
                text(&output.stdout),
                text(&output.stderr)
            )
        });
        (output.status.code(), report)
    };
    let (code, report) = fsck_json(&["fsck", "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(report["fs"]["state"], "present");
    assert_eq!(report["fs"]["files"], 0);
    assert_eq!(report["fs"]["directories"], 1);

    // Logged writes a crash left behind: reported, then replayed by --repair.
    {
        let fs = open_fs_on_demand(dir.path());
        fs.mkdir("/d", 0o755).unwrap();
        let file = fs.create("/d/f").unwrap();
        for i in 0..10u8 {
            file.write_at(&[i; 4096], u64::from(i) * 4096).unwrap();
        }
        drop(file); // no checkpoint: dropping is not closing
        fs.abandon(); // stops like a crash: the writes stay in the logs
    }
    let (code, report) = fsck_json(&["fsck", "--json"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["fs"]["files"], 1);
    assert_eq!(report["fs"]["directories"], 2);
    assert_eq!(report["fs"]["log_records"], 10, "{report}");
    assert_eq!(report["fs"]["file_bytes"], 40960);
    let (code, report) = fsck_json(&["fsck", "--repair", "--json"]);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report["repaired"]
            .as_str()
            .unwrap()
            .contains("10 logged write")
    );
    let (_, report) = fsck_json(&["fsck", "--json"]);
    assert_eq!(report["fs"]["log_records"], 0, "replayed: {report}");
    assert_eq!(report["fs"]["mapped_bytes"], 40960, "{report}");
    let status = locus(dir.path(), &["status"]);
    assert_says(&status, "file system: 1 file, 2 directories");

    // Both root copies damaged: named, exit 1, nothing "repaired".
    let device = dir.path().join("node0.pmem");
    let mut bytes = std::fs::read(&device).unwrap();
    bytes[4096 + 100] ^= 0x5a;
    bytes[2 * 4096 + 100] ^= 0x5a;
    std::fs::write(&device, bytes).unwrap();
    let output = locus(dir.path(), &["fsck", "--repair"]);
    assert_eq!(output.status.code(), Some(1));
    let out = text(&output.stdout);
    assert!(
        out.contains("problem: file system:") && out.contains("root copy"),
        "{out}"
    );
    assert!(!out.contains("repaired"), "{out}");
    let (_, report) = fsck_json(&["status", "--json"]);
    assert_eq!(report["fs"]["state"], "damaged");
}

#[test]
fn scrub_names_a_damaged_data_block_and_exits_1() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let output = locus(
        dir.path(),
        &["format", "--emulate", "64M", "--data-checksums"],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_says(&output, "with data checksums");
    // A file with a distinctive block, moved into the file by the unmount.
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 251) as u8).collect();
    {
        let fs = open_fs(dir.path());
        fs.mkdir("/d", 0o755).unwrap();
        let file = fs.create("/d/f").unwrap();
        file.write_at(&[1; 8192], 0).unwrap();
        file.write_at(&block, 8192).unwrap();
        drop(file);
        fs.unmount().unwrap();
    }
    let output = locus(dir.path(), &["scrub"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_says(&output, "clean");
    let status = locus(dir.path(), &["status"]);
    assert_says(&status, "; data checksums");

    let device = dir.path().join("node0.pmem");
    let mut bytes = std::fs::read(&device).unwrap();
    let at = bytes
        .windows(block.len())
        .position(|w| w == block.as_slice())
        .expect("the block is on the device");
    bytes[at + 1000] ^= 0x01;
    std::fs::write(&device, bytes).unwrap();

    let output = locus(dir.path(), &["scrub"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("damaged: /d/f bytes 8192..12288 (file block"),
        "{out}"
    );
    assert!(text(&output.stderr).contains("1 damaged block(s)"));
    let output = locus(dir.path(), &["scrub", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["damaged"][0]["path"], "/d/f");
    assert_eq!(report["damaged"][0]["offset"], 8192);
    // The metadata is sound: fsck, which does not read data, stays clean.
    assert!(locus(dir.path(), &["fsck"]).status.success());

    // Without data checksums, scrub says why it cannot check.
    let plain = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(plain.path(), &["format", "--emulate", "64M"])
            .status
            .success()
    );
    let output = locus(plain.path(), &["scrub"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("--data-checksums"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn fsck_repair_cuts_a_damaged_journal_back_and_says_what_it_dropped() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(dir.path(), &["format", "--emulate", "64M"])
            .status
            .success()
    );
    {
        let fs = open_fs_on_demand(dir.path());
        for i in 0..10 {
            fs.create(&format!("/repair-me-{i:02}")).unwrap();
        }
        fs.abandon();
    }
    flip_on_device(dir.path(), b"repair-me-06");

    let output = locus(dir.path(), &["fsck"]);
    assert_eq!(output.status.code(), Some(1));
    assert_says(&output, "journal of slot");
    let output = locus(dir.path(), &["fsck", "--repair"]);
    let out = text(&output.stdout);
    assert!(output.status.success(), "{out}{}", text(&output.stderr));
    assert!(out.contains("damaged: journal of slot"), "{out}");
    assert!(out.contains("dropped 3 metadata operation(s)"), "{out}");
    assert!(out.contains("file system: 6 files"), "{out}");
    assert!(out.contains("clean"), "{out}");
    let again = locus(dir.path(), &["fsck"]);
    assert!(again.status.success(), "{}", text(&again.stdout));
}

/// `format --thread-slots N` lays the file system out for N thread slots (2 to 120): the
/// output and `status` (text and JSON) say so, an opened file system has that many, and
/// values out of range, or with `--no-fs`, are refused naming the option; without it the
/// file system has the default 64.
#[test]
fn format_takes_the_thread_slots_and_status_shows_them() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let output = locus(
        dir.path(),
        &["format", "--emulate", "64M", "--thread-slots", "120"],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_says(&output, "with an empty file system, 120 thread slots");
    let status = locus(dir.path(), &["status"]);
    assert_says(&status, "thread slots: 1 of 120 (104 a thread may own");
    let json = status_json(dir.path());
    assert_eq!(json["fs"]["slot_limit"], 120, "{json}");
    {
        let fs = open_fs(dir.path());
        assert_eq!(fs.stats().slot_limit, 120);
        fs.unmount().unwrap();
    }

    for (value, says) in [
        ("121", "121 is not in 2..=120"),
        ("1", "1 is not in 2..=120"),
        ("many", "invalid digit"),
    ] {
        let output = locus(
            dir.path(),
            &[
                "format",
                "--emulate",
                "64M",
                "--force",
                "--thread-slots",
                value,
            ],
        );
        assert_eq!(output.status.code(), Some(2), "--thread-slots {value}");
        let err = text(&output.stderr);
        assert!(
            err.contains("--thread-slots") && err.contains(says),
            "{err}"
        );
    }
    let output = locus(
        dir.path(),
        &[
            "format",
            "--emulate",
            "64M",
            "--force",
            "--no-fs",
            "--thread-slots",
            "8",
        ],
    );
    assert_eq!(output.status.code(), Some(2));
    let err = text(&output.stderr);
    assert!(
        err.contains("cannot be used with")
            && err.contains("--no-fs")
            && err.contains("--thread-slots"),
        "{err}"
    );
    // The refusals changed nothing.
    let json = status_json(dir.path());
    assert_eq!(json["fs"]["slot_limit"], 120, "{json}");

    let plain = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(plain.path(), &["format", "--emulate", "64M"])
            .status
            .success()
    );
    let json = status_json(plain.path());
    assert_eq!(json["fs"]["slot_limit"], 64, "{json}");
}

/// The bytes thread `t` of `round` writes into its file.
fn tuned_bytes(round: u32, t: u32) -> Vec<u8> {
    (0..20_000u32)
        .map(|i| (i.wrapping_mul(31) ^ t ^ (round << 4)) as u8)
        .collect()
}

/// `threads` threads of `fs`, alive at once, each create `/round-{round}-{t}` and write
/// [`tuned_bytes`] into it (aligned, then unaligned at its end).
fn write_at_once(fs: &fs::Fs, round: u32, threads: u32) {
    let barrier = std::sync::Barrier::new(threads as usize);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (fs, barrier) = (&fs, &barrier);
            s.spawn(move || {
                barrier.wait();
                let file = fs.create(&format!("/round-{round}-{t}")).unwrap();
                let bytes = tuned_bytes(round, t);
                file.write_at(&bytes[..16384], 0).unwrap();
                barrier.wait();
                file.write_at(&bytes[16384..], 16384).unwrap();
            });
        }
    });
}

fn assert_written(fs: &fs::Fs, round: u32, threads: u32) {
    for t in 0..threads {
        let file = fs
            .open_file(&format!("/round-{round}-{t}"), fs::OpenOptions::default())
            .unwrap();
        let mut back = vec![0u8; 20_000];
        file.read_at(&mut back, 0).unwrap();
        assert!(back == tuned_bytes(round, t), "round {round}, thread {t}");
    }
}

/// `tune --thread-slots N` changes the slot limit of a closed volume and keeps every file,
/// writes still in the logs of a crashed process included: down to the slots made so far
/// and no lower, up to 120; refused (exit 1, nothing changed) while the volume is held or
/// when its file system is damaged, and an opened file system then has the new limit —
/// threads past its ownable slots take turns.
#[test]
fn tune_changes_the_thread_slots_keeping_every_file() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(dir.path(), &["format", "--emulate", "64M"])
            .status
            .success()
    );
    let slot_limit = |dir: &Path| status_json(dir)["fs"]["slot_limit"].clone();
    {
        // Six threads at once, then a crash: seven slots made (the checkpoint's), the
        // writes only in their logs.
        let fs = open_fs_on_demand(dir.path());
        write_at_once(&fs, 0, 6);
        let held = locus(dir.path(), &["tune", "--thread-slots", "120"]);
        assert_eq!(held.status.code(), Some(1));
        let err = text(&held.stderr);
        assert!(
            err.contains(&format!("in use by pid {}", std::process::id())),
            "{err}"
        );
        fs.abandon();
    }
    assert_eq!(slot_limit(dir.path()), 64);

    let below = locus(dir.path(), &["tune", "--thread-slots", "6"]);
    assert_eq!(below.status.code(), Some(1));
    let err = text(&below.stderr);
    assert!(
        err.contains("7 slots have their log and journal areas already")
            && err.contains("can go down to 7"),
        "{err}"
    );
    assert_eq!(slot_limit(dir.path()), 64);

    let down = locus(dir.path(), &["tune", "--thread-slots", "7"]);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert_eq!(
        text(&down.stdout),
        "thread slots: 64 -> 7 (5 a thread may own, the rest shared); 7 made so far\n"
    );
    assert_eq!(slot_limit(dir.path()), 7);
    let fsck = locus(dir.path(), &["fsck"]);
    assert!(fsck.status.success(), "{}", text(&fsck.stdout));
    {
        let fs = open_fs(dir.path());
        assert_eq!(fs.stats().slot_limit, 7);
        assert_written(&fs, 0, 6);
        // Twelve threads at once: five own a slot, the others take turns on the shared one.
        write_at_once(&fs, 1, 12);
        assert_written(&fs, 1, 12);
        fs.unmount().unwrap();
    }

    let up = locus(dir.path(), &["tune", "--thread-slots", "120"]);
    assert!(up.status.success(), "{}", text(&up.stderr));
    assert!(
        text(&up.stdout).starts_with("thread slots: 7 -> 120 (104 a thread may own"),
        "{}",
        text(&up.stdout)
    );
    let again = locus(dir.path(), &["tune", "--thread-slots", "120"]);
    assert!(
        text(&again.stdout).starts_with("thread slots: already 120"),
        "{}",
        text(&again.stdout)
    );
    {
        let fs = open_fs(dir.path());
        assert_eq!(fs.stats().slot_limit, 120);
        assert_written(&fs, 0, 6);
        assert_written(&fs, 1, 12);
        // A name in the journal with records after it, for the damage below (a damaged
        // last record would be a torn append, not damage).
        fs.create("/tune-damage-me").unwrap();
        for i in 0..3 {
            fs.create(&format!("/after-{i}")).unwrap();
        }
        fs.abandon();
    }
    flip_on_device(dir.path(), b"tune-damage-me");
    let damaged = locus(dir.path(), &["tune", "--thread-slots", "64"]);
    assert_eq!(damaged.status.code(), Some(1));
    let err = text(&damaged.stderr);
    assert!(err.contains("journal of slot"), "{err}");
    assert!(
        locus(dir.path(), &["fsck", "--repair"]).status.success(),
        "repair"
    );
    assert_eq!(slot_limit(dir.path()), 120);
    let after_repair = locus(dir.path(), &["tune", "--thread-slots", "64"]);
    assert!(
        after_repair.status.success(),
        "{}",
        text(&after_repair.stderr)
    );
    let fs = open_fs(dir.path());
    assert_eq!(fs.stats().slot_limit, 64);
    assert_written(&fs, 1, 12);
    fs.unmount().unwrap();
}

/// Pseudo-random bytes (xorshift from `seed`): a run of 40 of them is found once on a
/// volume.
fn unique_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Flips one bit of the first copy of `needle` on the volume's device; returns where.
fn flip_on_device(dir: &Path, needle: &[u8]) -> usize {
    let device = dir.join("node0.pmem");
    let mut bytes = std::fs::read(&device).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the bytes are on the device");
    bytes[at] ^= 1;
    std::fs::write(&device, bytes).unwrap();
    at
}

fn unflip_on_device(dir: &Path, at: usize) {
    let device = dir.join("node0.pmem");
    let mut bytes = std::fs::read(&device).unwrap();
    bytes[at] ^= 1;
    std::fs::write(&device, bytes).unwrap();
}

/// `tune --data-checksums on` gives every block of data of a volume formatted without them
/// its entry — checkpointed blocks and logged writes a crash left — so that `scrub` is clean,
/// a flipped bit is then named by `scrub` and read as an error, and the files read back as
/// they were; `off` forgets them (scrub refused, the tables free again); a volume too full
/// for the tables and the checkpoint's reserve is refused and changes nothing.
#[test]
fn tune_turns_data_checksums_on_and_off_keeping_every_file() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    assert!(
        locus(dir.path(), &["format", "--emulate", "64M"])
            .status
            .success()
    );
    let a = unique_bytes(3, 256 << 10);
    let b = unique_bytes(5, 20_000);
    let patch = unique_bytes(7, 1000);
    let mut a_now = a.clone();
    a_now[5000..6000].copy_from_slice(&patch);
    {
        let fs = open_fs(dir.path());
        fs.create("/a").unwrap().write_at(&a, 0).unwrap();
        fs.unmount().unwrap();
    }
    {
        // Logged writes only, then a crash: a partial overwrite of a checkpointed block
        // and a new file.
        let fs = open_fs_on_demand(dir.path());
        let file = fs
            .open_file(
                "/a",
                fs::OpenOptions {
                    write: true,
                    ..Default::default()
                },
            )
            .unwrap();
        file.write_at(&patch, 5000).unwrap();
        fs.create("/b").unwrap().write_at(&b, 0).unwrap();
        fs.abandon();
    }
    let read_back = |dir: &Path| {
        let fs = open_fs(dir);
        for (path, want) in [("/a", &a_now), ("/b", &b)] {
            let file = fs.open_file(path, fs::OpenOptions::default()).unwrap();
            let mut back = vec![0u8; want.len()];
            file.read_at(&mut back, 0).unwrap();
            assert!(&back == want, "{path} reads back as written");
        }
        fs.unmount().unwrap();
    };
    let status = status_json;
    let free = |json: &Value| json["devices"][0]["free_bytes"].as_u64().unwrap();
    let scrub = locus(dir.path(), &["scrub"]);
    assert_eq!(scrub.status.code(), Some(1));
    assert!(text(&scrub.stderr).contains("no data checksums"));
    let before = status(dir.path());
    assert_eq!(before["fs"]["data_checksums"], false, "{before}");

    let on = locus(dir.path(), &["tune", "--data-checksums", "on"]);
    let out = text(&on.stdout);
    assert!(on.status.success(), "{out}{}", text(&on.stderr));
    // 64 blocks of /a, 5 of /b, and the buffer block of the patch.
    assert!(
        out.starts_with("data checksums: off -> on (70 block(s) of data given their entry"),
        "{out}"
    );
    let after = status(dir.path());
    assert_eq!(after["fs"]["data_checksums"], true, "{after}");
    // The tables (a 4-byte entry per block of the device) and their directory.
    let tables = free(&before) - free(&after);
    assert!((64 << 10..=80 << 10).contains(&tables), "{tables}");
    let scrub = locus(dir.path(), &["scrub"]);
    let out = text(&scrub.stdout);
    assert!(scrub.status.success(), "{out}{}", text(&scrub.stderr));
    assert!(
        out.contains("scrubbed 2 file(s): 70 block(s)") && out.contains("clean"),
        "{out}"
    );
    assert!(locus(dir.path(), &["fsck"]).status.success());
    let again = locus(dir.path(), &["tune", "--data-checksums", "on"]);
    assert_eq!(text(&again.stdout), "data checksums: already on\n");
    // The entries are real: a flipped bit in /b (still only in its logged write's buffer)
    // and one in a checkpointed block of /a are both found.
    let b_at = flip_on_device(dir.path(), &b[8192..8232]);
    let a_at = flip_on_device(dir.path(), &a[100_000..100_040]);
    let scrub = locus(dir.path(), &["scrub"]);
    let out = text(&scrub.stdout);
    assert_eq!(scrub.status.code(), Some(1), "{out}");
    assert!(
        out.contains("damaged: /a bytes 98304..102400 (file block")
            && out.contains("damaged: /b bytes 8192..12288 (logged write"),
        "{out}"
    );
    unflip_on_device(dir.path(), b_at);
    unflip_on_device(dir.path(), a_at);
    assert!(locus(dir.path(), &["scrub"]).status.success());
    // Opened, the file system moves the logged writes into their files (the patch into a
    // block rebuilt with its entry), and a read of a damaged block is an error.
    read_back(dir.path());
    let scrub = locus(dir.path(), &["scrub"]);
    assert_says(&scrub, "scrubbed 2 file(s): 69 block(s)");
    let a_at = flip_on_device(dir.path(), &a[100_000..100_040]);
    {
        let fs = open_fs(dir.path());
        let file = fs.open_file("/a", fs::OpenOptions::default()).unwrap();
        let mut back = vec![0u8; 4096];
        let err = file.read_at(&mut back, 98304).unwrap_err();
        assert!(matches!(err, fs::FsError::DataChecksum { .. }), "{err}");
        fs.unmount().unwrap();
    }
    unflip_on_device(dir.path(), a_at);
    assert!(locus(dir.path(), &["scrub"]).status.success());

    let on_status = status(dir.path());
    let off = locus(dir.path(), &["tune", "--data-checksums", "off"]);
    assert!(off.status.success(), "{}", text(&off.stderr));
    assert!(
        text(&off.stdout).starts_with("data checksums: on -> off"),
        "{}",
        text(&off.stdout)
    );
    let scrub = locus(dir.path(), &["scrub"]);
    assert_eq!(scrub.status.code(), Some(1));
    assert!(text(&scrub.stderr).contains("no data checksums"));
    let off_status = status(dir.path());
    assert_eq!(off_status["fs"]["data_checksums"], false);
    assert_eq!(
        free(&off_status) - free(&on_status),
        tables,
        "the tables are free again"
    );
    assert!(locus(dir.path(), &["fsck"]).status.success());
    read_back(dir.path());

    // Full: no room for the tables beside the checkpoint's reserve.
    {
        let fs = open_fs(dir.path());
        let file = fs.create("/fill").unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let mut at = 0;
        while file.write_at(&chunk, at).is_ok() {
            at += chunk.len() as u64;
        }
        while file.write_at(&chunk[..4096], at).is_ok() {
            at += 4096;
        }
        fs.unmount().unwrap();
    }
    // Both settings at once: checked before either changes, so the slot limit stays too.
    let full = locus(
        dir.path(),
        &["tune", "--thread-slots", "100", "--data-checksums", "on"],
    );
    assert_eq!(full.status.code(), Some(1));
    let err = text(&full.stderr);
    assert!(
        err.contains("too full for data checksums") && err.contains("remove files first"),
        "{err}"
    );
    assert!(text(&full.stdout).is_empty(), "{}", text(&full.stdout));
    let unchanged = status(dir.path());
    assert_eq!(unchanged["fs"]["data_checksums"], false);
    assert_eq!(unchanged["fs"]["slot_limit"], 64);
    {
        let fs = open_fs(dir.path());
        fs.truncate("/fill", 4 << 20).unwrap();
        fs.unmount().unwrap();
    }
    let both = locus(
        dir.path(),
        &["tune", "--thread-slots", "100", "--data-checksums", "on"],
    );
    let out = text(&both.stdout);
    assert!(both.status.success(), "{}", text(&both.stderr));
    assert!(
        out.starts_with("thread slots: 64 -> 100") && out.contains("data checksums: off -> on"),
        "{out}"
    );
    let tuned = status(dir.path());
    assert_eq!(tuned["fs"]["data_checksums"], true);
    assert_eq!(tuned["fs"]["slot_limit"], 100);
    let scrub = locus(dir.path(), &["scrub"]);
    assert!(scrub.status.success(), "{}", text(&scrub.stdout));
    read_back(dir.path());
}

/// Writes `len` bytes to a new file `path` in 1 MiB writes; the error of the first write
/// that fails.
fn write_big(fs: &fs::Fs, path: &str, len: usize) -> Result<(), fs::FsError> {
    let file = fs.create(path)?;
    for (i, chunk) in unique_bytes(11, len).chunks(1 << 20).enumerate() {
        file.write_at(chunk, (i << 20) as u64)?;
    }
    Ok(())
}

/// The device count a device's superblock gives, and rewrites it to `count` (CRC included)
/// when asked: what an extension that stopped before rewriting this device leaves.
fn superblock_count(device: &Path, set: Option<u32>) -> u32 {
    let mut bytes = std::fs::read(device).unwrap();
    let len = bytes.len() as u64;
    let head: &mut [u8; 128] = (&mut bytes[..128]).try_into().unwrap();
    let mut superblock = volume::superblock::Superblock::decode(head, "device", len).unwrap();
    if let Some(count) = set {
        superblock.device_count = count;
        *head = superblock.encode();
        std::fs::write(device, &bytes).unwrap();
    }
    superblock.device_count
}

/// `--grow` repeated, or `all`: every device is checked before any grows — one refused size
/// leaves every device as it was; a device named twice is refused; `all` grows each, and
/// the volume's files stay.
#[test]
fn grow_checks_every_device_before_growing_any() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = |name: &str| dir.path().join(name);
    let spec = |name: &str| format!("{},node=0,size=16M", path(name).display());
    let formatted = locus(
        dir.path(),
        &["format", "--device", &spec("d0"), "--device", &spec("d1")],
    );
    assert!(formatted.status.success(), "{}", text(&formatted.stderr));
    let a = unique_bytes(7, 3 << 20);
    {
        let fs = open_fs(dir.path());
        fs.create("/a").unwrap().write_at(&a, 0).unwrap();
        fs.unmount().unwrap();
    }
    let sizes = |dir: &Path| -> Vec<u64> {
        status_json(dir)["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["capacity_bytes"].as_u64().unwrap())
            .collect()
    };
    for (grows, says) in [
        (
            &["0,size=+16M", "1,size=8M"][..],
            "locus never shrinks a device",
        ),
        (&["0,size=+16M", "0,size=+8M"], "device 0 is named twice"),
        (&["all,size=+16M", "1,size=+8M"], "device 1 is named twice"),
    ] {
        let mut args = vec!["extend"];
        for g in grows {
            args.extend(["--grow", g]);
        }
        let refused = locus(dir.path(), &args);
        assert!(!refused.status.success(), "{grows:?}");
        assert!(
            text(&refused.stderr).contains(says),
            "{grows:?}: {}",
            text(&refused.stderr)
        );
        assert_eq!(sizes(dir.path()), [16 << 20, 16 << 20], "{grows:?}");
        for name in ["d0", "d1"] {
            assert_eq!(std::fs::metadata(path(name)).unwrap().len(), 16 << 20);
        }
    }
    let grown = locus(dir.path(), &["extend", "--grow", "all,size=+16M"]);
    assert!(grown.status.success(), "{}", text(&grown.stderr));
    assert_says(&grown, "device 0 (");
    assert_says(&grown, "device 1 (");
    assert_eq!(sizes(dir.path()), [32 << 20, 32 << 20]);
    let both = locus(
        dir.path(),
        &[
            "extend",
            "--grow",
            "0,size=40M",
            "--grow",
            &format!("{},size=+8M", path("d1").display()),
        ],
    );
    assert!(both.status.success(), "{}", text(&both.stderr));
    assert_eq!(sizes(dir.path()), [40 << 20, 40 << 20]);
    assert!(locus(dir.path(), &["fsck"]).status.success());
    let fs = open_fs(dir.path());
    let mut got = vec![0u8; a.len()];
    fs.open_file("/a", Default::default())
        .unwrap()
        .read_at(&mut got, 0)
        .unwrap();
    assert!(got == a, "/a changed");
    fs.unmount().unwrap();
}

/// Devices that do not fit the file system their files are on are refused before any is
/// made, counted together: a format of two devices that fit one by one but not both leaves
/// neither file, nor the volume; a grow past the room leaves the device file at its old
/// length: the volume opens at its old size, `fsck` has nothing to warn about, and no
/// unallocated tail is left for `locus extend` to record. (Mounts a small tmpfs: root only.)
#[test]
fn devices_that_do_not_fit_their_file_system_change_nothing() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let small = tempfile::tempdir_in("/dev/shm").unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48M", "tmpfs"])
        .arg(small.path())
        .output()
        .unwrap();
    assert!(mounted.status.success(), "{}", text(&mounted.stderr));
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(small.path());
    let device = small.path().join("d0");
    let spec = format!("{},kind=file,size=32M", device.display());
    let other = small.path().join("d1");
    let volume = dir.path().join("volume");
    for devices in [
        &[
            spec.clone(),
            format!("{},kind=file,size=32M", other.display()),
        ][..],
        &[format!("{},kind=file,size=1T", device.display())],
    ] {
        let mut args = vec!["format"];
        for d in devices {
            args.extend(["--device", d]);
        }
        let refused = locus(&volume, &args);
        assert_eq!(refused.status.code(), Some(1), "{devices:?}");
        assert!(
            text(&refused.stderr).contains("more than they hold, and it has"),
            "{}",
            text(&refused.stderr)
        );
        assert!(!device.exists() && !other.exists(), "{devices:?}");
        assert!(!volume.exists(), "{devices:?}");
    }
    let formatted = locus(dir.path(), &["format", "--device", &spec]);
    assert!(formatted.status.success(), "{}", text(&formatted.stderr));
    let refused = locus(dir.path(), &["extend", "--grow", "0,size=+32M"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("need 33554432 bytes more than they hold"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(std::fs::metadata(&device).unwrap().len(), 32 << 20);
    let fsck = locus(dir.path(), &["fsck"]);
    assert!(fsck.status.success(), "{}", text(&fsck.stdout));
    assert!(
        !text(&fsck.stdout).contains("warning"),
        "{}",
        text(&fsck.stdout)
    );
    let nothing = locus(dir.path(), &["extend"]);
    assert_says(&nothing, "1 device(s), no extension or grow to finish");
    let grown = locus(dir.path(), &["extend", "--grow", "0,size=40M"]);
    assert!(grown.status.success(), "{}", text(&grown.stderr));
    assert_says(&grown, "32.00 MiB -> 40.00 MiB");
}

/// A format that fails after making some devices — here the second, a DAX file on a file
/// system without DAX, fails only when it is mapped — gives back the files it made: the
/// first device's file is gone, as is the second's, and no volume is left.
#[test]
fn a_format_that_fails_part_way_leaves_no_device_file() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = dir.path().join("volume");
    let first = dir.path().join("d0");
    let second = disk.path().join("d1");
    let refused = locus(
        &volume,
        &[
            "format",
            "--device",
            &format!("{},node=0,size=32M", first.display()),
            "--device",
            &format!("{},kind=daxfile,size=8M", second.display()),
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("-o dax"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!first.exists(), "the first device's file is given back");
    assert!(!second.exists());
    assert!(!volume.join("locus.toml").exists());
}

/// A volume of one device (`spec`) with data checksums holding a checkpointed file `/a` and
/// a crashed process's logged write `/b`, on which an 80 MiB file did not fit: the paths and
/// their bytes.
fn checksummed_volume_with_files(dir: &Path, spec: &str) -> [(&'static str, Vec<u8>); 2] {
    let formatted = locus(dir, &["format", "--device", spec, "--data-checksums"]);
    assert!(formatted.status.success(), "{}", text(&formatted.stderr));
    let a = unique_bytes(3, 256 << 10);
    let b = unique_bytes(5, 20_000);
    {
        let fs = open_fs(dir);
        fs.create("/a").unwrap().write_at(&a, 0).unwrap();
        let full = write_big(&fs, "/big", 80 << 20).unwrap_err();
        assert_eq!(full.kind(), fs::ErrorKind::NoSpace, "{full}");
        fs.unlink("/big").unwrap();
        fs.unmount().unwrap();
    }
    {
        let fs = open_fs_on_demand(dir);
        fs.create("/b").unwrap().write_at(&b, 0).unwrap();
        fs.abandon();
    }
    [("/a", a), ("/b", b)]
}

/// The file system of the volume in `dir`, opened after checking that `files` read back.
fn reads_back(dir: &Path, files: &[(&str, Vec<u8>)]) -> fs::Fs {
    let fs = open_fs(dir);
    for (path, want) in files {
        let mut got = vec![0u8; want.len()];
        fs.open_file(path, Default::default())
            .unwrap()
            .read_at(&mut got, 0)
            .unwrap();
        assert!(&got == want, "{path} changed");
    }
    fs
}

/// `locus fsck` and `locus scrub` of the volume in `dir` succeed.
fn checks_clean(dir: &Path) {
    for check in [&["fsck"][..], &["scrub"]] {
        let out = locus(dir, check);
        assert!(out.status.success(), "{check:?}: {}", text(&out.stdout));
    }
}

/// The volume in `dir`, whose data-checksum tables a stopped `locus extend` left unmade
/// (or not grown): `fsck` fails saying `refusal`; `locus extend` makes the one table and
/// then has nothing left to finish ("`devices` device(s)"); `fsck` and `scrub` are clean and
/// `files` read back.
fn tables_finished_by_extend(dir: &Path, files: &[(&str, Vec<u8>)], refusal: &str, devices: u32) {
    let refused = locus(dir, &["fsck"]);
    assert!(!refused.status.success());
    let said = text(&refused.stdout) + &text(&refused.stderr);
    assert!(said.contains(refusal), "{said}");
    let finish = locus(dir, &["extend"]);
    assert!(finish.status.success(), "{}", text(&finish.stderr));
    assert_says(&finish, "data checksums: 1 table(s) made");
    let nothing = locus(dir, &["extend"]);
    assert_says(
        &nothing,
        &format!("{devices} device(s), no extension or grow to finish"),
    );
    checks_clean(dir);
    reads_back(dir, files).unmount().unwrap();
}

/// `locus extend --grow` lengthens a device of a volume that holds files (a checkpointed
/// file and a crashed process's logged writes), with data checksums: the files stay, a file
/// that did not fit fits, its blocks in the grown part have checksums (`scrub` names a
/// flipped bit there); a grow stopped after the file was lengthened leaves the volume at its
/// old size (`fsck` warns) until `locus extend` records it; one stopped before the table
/// grew is refused by `fsck`, naming the command; sizes that would not grow, unknown
/// devices, malformed specs and more memory than the node has are refused.
#[test]
fn grow_lengthens_a_device_keeping_every_file() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d0 = dir.path().join("d0");
    let spec = format!("{},node=0,size=64M", d0.display());
    let files = checksummed_volume_with_files(dir.path(), &spec);
    let capacity = |dir: &Path| status_json(dir)["devices"][0]["capacity_bytes"].as_u64();

    for (grow, says) in [
        ("0,size=32M", "locus never shrinks a device"),
        ("0,size=64M", "would not add any"),
        ("7,size=+1M", "the volume has no device 7 (its devices: 0 "),
        ("/nowhere,size=+1M", "the volume has no device /nowhere"),
        ("0", "give the new size"),
        ("0,size=+1M,node=1", "unknown part \"node=1\""),
        ("0,size=+1000T", "more bytes of memory"),
    ] {
        let refused = locus(dir.path(), &["extend", "--grow", grow]);
        assert!(!refused.status.success(), "{grow}");
        assert!(
            text(&refused.stderr).contains(says),
            "{grow}: {}",
            text(&refused.stderr)
        );
    }
    assert_eq!(std::fs::metadata(&d0).unwrap().len(), 64 << 20);
    assert_eq!(capacity(dir.path()), Some(64 << 20));

    let path_spec = format!("{},size=+64M", d0.display());
    let grown = locus(dir.path(), &["extend", "--grow", &path_spec]);
    assert!(grown.status.success(), "{}", text(&grown.stderr));
    assert_says(&grown, "device 0 (");
    assert_says(&grown, "64.00 MiB -> 128.00 MiB");
    assert_says(
        &grown,
        "data checksums: 1 table(s) made for the new or grown device(s)",
    );
    assert_eq!(capacity(dir.path()), Some(128 << 20));
    let config = std::fs::read_to_string(dir.path().join("locus.toml")).unwrap();
    assert!(config.contains("size_bytes = 134217728"), "{config}");
    checks_clean(dir.path());
    let fs = reads_back(dir.path(), &files);
    write_big(&fs, "/big", 80 << 20).unwrap();
    fs.unmount().unwrap();
    assert!(locus(dir.path(), &["scrub"]).status.success());
    // The file's last MiB went to the grown part; a bit flipped there is named.
    let needle = &unique_bytes(11, 80 << 20)[79 << 20..(79 << 20) + 64];
    let mut bytes = std::fs::read(&d0).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the file's last MiB is on the device");
    assert!(
        at >= 64 << 20,
        "the file's last MiB at {at}, before the grown part"
    );
    bytes[at] ^= 1;
    std::fs::write(&d0, &bytes).unwrap();
    let scrub = locus(dir.path(), &["scrub"]);
    assert_eq!(scrub.status.code(), Some(1), "{}", text(&scrub.stdout));
    bytes[at] ^= 1;
    std::fs::write(&d0, &bytes).unwrap();
    drop(bytes);

    // Stopped after the device file was lengthened, before its superblock recorded it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&d0)
        .unwrap()
        .set_len(160 << 20)
        .unwrap();
    let fsck = locus(dir.path(), &["fsck"]);
    assert!(fsck.status.success(), "{}", text(&fsck.stdout));
    assert!(
        text(&fsck.stdout).contains("stopped before its new size was recorded"),
        "{}",
        text(&fsck.stdout)
    );
    assert_eq!(capacity(dir.path()), Some(128 << 20));
    assert_eq!(
        status_json(dir.path())["devices"][0]["unrecorded_bytes"].as_u64(),
        Some(160 << 20)
    );
    let status = locus(dir.path(), &["status"]);
    assert_says(
        &status,
        "device 0 is 160.00 MiB long, but the volume uses 128.00 MiB",
    );
    let finish = locus(dir.path(), &["extend"]);
    assert!(finish.status.success(), "{}", text(&finish.stderr));
    assert_says(&finish, "128.00 MiB -> 160.00 MiB");
    assert_says(&finish, "data checksums: 1 table(s) made");
    assert_eq!(capacity(dir.path()), Some(160 << 20));
    assert!(status_json(dir.path())["devices"][0]["unrecorded_bytes"].is_null());
    // The tail the hand-made lengthening left unallocated was allocated before it was
    // recorded (a write there must not fault on a full tmpfs).
    let allocated = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&d0).unwrap().blocks() * 512
    };
    assert!(allocated >= 160 << 20, "{allocated} bytes allocated");

    // Stopped after the superblock recorded the new size, before the table grew.
    let topology = topology::Topology::read_live().unwrap();
    volume::Volume::grow(
        dir.path(),
        topology,
        &[("0".into(), volume::GrowTo::By(16 << 20))],
    )
    .unwrap();
    tables_finished_by_extend(
        dir.path(),
        &files,
        "`locus extend --volume DIR` grows it",
        1,
    );
}

/// `locus extend` grows a data-checksum volume that holds files — a checkpointed file and
/// writes a crash left in the logs — by a device: the files read back unchanged, a file too
/// large for the old volume now fits (some of it on the new device, whose blocks have their
/// checksums: a flipped bit there is named by `scrub`), `fsck` and `scrub` are clean. An
/// extension stopped before the old superblocks counted the new device, or before the new
/// device had its checksum table, is finished by `locus extend` without --device (and
/// refused by everything else meanwhile, naming that command); devices already in the
/// volume, or of another volume, are refused.
#[test]
fn extend_adds_devices_keeping_every_file() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let device = |name: &str| dir.path().join(name);
    let spec = |name: &str, size: &str| format!("{},node=0,size={size}", device(name).display());
    let d0 = spec("d0", "64M");
    let files = checksummed_volume_with_files(dir.path(), &d0);

    // Devices the volume has, or that belong to another volume, are refused.
    let again = locus(dir.path(), &["extend", "--device", &d0]);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("is in the volume already"));
    let other = tempfile::tempdir_in("/dev/shm").unwrap();
    let foreign = format!("{},node=0,size=8M", other.path().join("x").display());
    assert!(
        locus(other.path(), &["format", "--device", &foreign])
            .status
            .success()
    );
    let refused = locus(dir.path(), &["extend", "--device", &foreign]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("adding it destroys that volume's data"),
        "{}",
        text(&refused.stderr)
    );
    // Too small, or a second device that cannot be made: refused, nothing left behind.
    let small = locus(dir.path(), &["extend", "--device", &spec("s", "1M")]);
    assert!(
        text(&small.stderr).contains("a device needs at least"),
        "{}",
        text(&small.stderr)
    );
    // A directory where a device file should be: found only when it is made.
    std::fs::create_dir(device("sub")).unwrap();
    let unmade = format!("{},kind=file,size=8M", device("sub").display());
    let half = locus(
        dir.path(),
        &["extend", "--device", &spec("t", "8M"), "--device", &unmade],
    );
    assert!(!half.status.success());
    assert!(!device("s").exists() && !device("t").exists());
    assert_eq!(
        status_json(dir.path())["devices"].as_array().unwrap().len(),
        1
    );

    let extended = locus(dir.path(), &["extend", "--device", &spec("d1", "64M")]);
    assert!(extended.status.success(), "{}", text(&extended.stderr));
    assert_says(&extended, "1 -> 2 device(s)");
    assert_says(
        &extended,
        "data checksums: 1 table(s) made for the new or grown device(s)",
    );
    assert_eq!(superblock_count(&device("d0"), None), 2);
    assert_eq!(superblock_count(&device("d1"), None), 2);
    checks_clean(dir.path());
    {
        let fs = reads_back(dir.path(), &files);
        write_big(&fs, "/big", 80 << 20).unwrap();
        fs.unmount().unwrap();
    }
    let status = status_json(dir.path());
    let devices = status["devices"].as_array().unwrap();
    let free = |d: &Value| d["free_bytes"].as_u64().unwrap();
    assert!(
        free(&devices[1]) < 40 << 20,
        "the file went to the new device: {devices:?}"
    );
    assert!(locus(dir.path(), &["scrub"]).status.success());
    // A bit flipped in the file's bytes on the new device is named.
    let needle = &unique_bytes(11, 80 << 20)[79 << 20..(79 << 20) + 64];
    let mut d1 = std::fs::read(device("d1")).unwrap();
    let at = d1
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the file's last MiB is on the new device");
    d1[at] ^= 1;
    std::fs::write(device("d1"), &d1).unwrap();
    let scrub = locus(dir.path(), &["scrub"]);
    assert_eq!(scrub.status.code(), Some(1), "{}", text(&scrub.stdout));
    d1[at] ^= 1;
    std::fs::write(device("d1"), &d1).unwrap();

    // Stopped after locus.toml named a third device, before the old superblocks counted it.
    let extended = locus(dir.path(), &["extend", "--device", &spec("d2", "16M")]);
    assert!(extended.status.success(), "{}", text(&extended.stderr));
    superblock_count(&device("d0"), Some(2));
    superblock_count(&device("d1"), Some(2));
    let fsck = locus(dir.path(), &["fsck"]);
    assert!(
        text(&fsck.stdout).contains("an extension of the volume from 2 to 3 devices stopped"),
        "{}",
        text(&fsck.stdout)
    );
    superblock_count(&device("d0"), Some(2));
    let finish = locus(dir.path(), &["extend"]);
    assert!(finish.status.success(), "{}", text(&finish.stderr));
    assert_says(&finish, "finished an interrupted extension to 3 device(s)");
    for name in ["d0", "d1", "d2"] {
        assert_eq!(superblock_count(&device(name), None), 3, "{name}");
    }

    // Stopped after the volume took a fourth device, before its checksum table was made.
    let topology = topology::Topology::read_live().unwrap();
    let fourth = volume::DeviceConfig {
        path: device("d3"),
        kind: None,
        node: Some(0),
        size_bytes: Some(16 << 20),
    };
    volume::Volume::extend(dir.path(), topology, &[fourth], false).unwrap();
    tables_finished_by_extend(
        dir.path(),
        &files,
        "`locus extend --volume DIR` makes them",
        4,
    );
}

/// `locus status` names a node with CPUs but no device of the volume (its threads write to
/// other nodes' memory) and the command that adds one: read on the two-socket fixture, whose
/// node 1 has CPUs, over a volume whose one device is on node 0.
#[test]
fn status_names_a_node_without_a_device() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let device = format!("{},node=0,size=16M", dir.path().join("d0").display());
    assert!(
        locus(dir.path(), &["format", "--device", &device])
            .status
            .success()
    );
    let sysfs = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topology/tests/fixtures/two-socket"
    );
    let status = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_locus"));
        command
            .args(["--sysfs", sysfs, "status", "--volume"])
            .arg(dir.path());
        if json {
            command.arg("--json");
        }
        command.output().unwrap()
    };
    let text_status = status(false);
    assert!(
        text_status.status.success(),
        "{}",
        text(&text_status.stderr)
    );
    assert_says(
        &text_status,
        "node 1 has CPUs but no device: its threads write to other nodes' memory \
         (`locus extend --emulate` or `--device PATH,node=1,size=SIZE`",
    );
    assert!(!text(&text_status.stdout).contains("node 0 has CPUs but no device"));
    let json: Value = serde_json::from_slice(&status(true).stdout).unwrap();
    let local: Vec<bool> = json["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["has_local_device"].as_bool().unwrap())
        .collect();
    assert_eq!(local, [true, false]);
}

/// `extend --emulate SIZE` gives every node with memory that has no device of the volume an
/// emulated one bound to it (here node 0, whose only device so far is an ordinary file with no
/// node), and refuses when every node has one; it and --device exclude each other.
#[test]
fn extend_emulate_gives_each_node_without_a_device_one() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let file = format!("{},kind=file,size=16M", dir.path().join("f0").display());
    assert!(
        locus(dir.path(), &["format", "--device", &file, "--no-fs"])
            .status
            .success()
    );
    let orders = |dir: &Path| status_json(dir)["orders"][0]["has_local_device"].as_bool();
    assert_eq!(orders(dir.path()), Some(false));
    let added = locus(dir.path(), &["extend", "--emulate", "16M"]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert_says(&added, "1 -> 2 device(s)");
    assert_says(&added, "node0.pmem (emulated, 16.00 MiB, node 0)");
    assert_eq!(orders(dir.path()), Some(true));
    let again = locus(dir.path(), &["extend", "--emulate", "16M"]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("every NUMA node with memory has a device"),
        "{}",
        text(&again.stderr)
    );
    let both = locus(dir.path(), &["extend", "--emulate", "--device", &file]);
    assert!(!both.status.success());
    assert_eq!(
        status_json(dir.path())["devices"].as_array().unwrap().len(),
        2
    );
}

/// Relative paths: `format --volume vol --device dev/d0,...` run in one directory writes
/// absolute device paths, so `status` from another directory opens the same volume (the
/// relative paths used to be written as given and name other files from elsewhere); a
/// relative path written into `locus.toml` by hand names a file in the volume directory.
#[test]
fn relative_paths_name_the_same_files_from_any_directory() {
    let base = tempfile::tempdir_in("/dev/shm").unwrap();
    std::fs::create_dir(base.path().join("dev")).unwrap();
    let in_base = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_locus"))
            .current_dir(base.path())
            .args(args)
            .output()
            .unwrap()
    };
    let formatted = in_base(&[
        "format",
        "--volume",
        "vol",
        "--device",
        "dev/d0,node=0,size=8M",
    ]);
    assert!(formatted.status.success(), "{}", text(&formatted.stderr));
    let config = std::fs::read_to_string(base.path().join("vol/locus.toml")).unwrap();
    let device = base.path().join("dev/d0");
    assert!(
        config.contains(&format!("path = \"{}\"", device.display())),
        "{config}"
    );
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_locus"))
        .current_dir("/")
        .args(["status", "--json", "--volume"])
        .arg(base.path().join("vol"))
        .output()
        .unwrap();
    assert!(elsewhere.status.success(), "{}", text(&elsewhere.stderr));
    let status: Value = serde_json::from_slice(&elsewhere.stdout).unwrap();
    assert_eq!(status["devices"][0]["path"], device.display().to_string());

    // The embedded default made through a relative --volume: its devices' paths are absolute.
    let made = in_base(&["status", "--volume", "empty-default"]);
    assert!(!made.status.success(), "no volume and not empty: refused");
    std::fs::create_dir(base.path().join("default")).unwrap();
    let made = in_base(&["status", "--volume", "default"]);
    assert!(made.status.success(), "{}", text(&made.stderr));
    let config = std::fs::read_to_string(base.path().join("default/locus.toml")).unwrap();
    assert!(
        config.contains(&format!(
            "path = \"{}/",
            base.path().join("default").display()
        )),
        "{config}"
    );

    // Written by hand, relative: the volume directory's file.
    let vol = base.path().join("vol");
    std::fs::rename(&device, vol.join("d0")).unwrap();
    let config = std::fs::read_to_string(vol.join("locus.toml")).unwrap();
    std::fs::write(
        vol.join("locus.toml"),
        config.replace(&device.display().to_string(), "d0"),
    )
    .unwrap();
    let status = status_json(&vol);
    assert_eq!(
        status["devices"][0]["path"],
        vol.join("d0").display().to_string()
    );
}
