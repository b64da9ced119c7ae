//! How `locus` behaves as one stage of a shell pipeline: a reader that goes away ends the
//! command quietly, a full disk is one error message and exit status 1, and every message
//! names its cause once.

use std::process::{Command, Stdio};

fn fixture_sysfs() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topology/tests/fixtures/four-node-cxl"
    )
    .to_owned()
}

/// `locus topology | head -0`: the pipe's reader is gone before locus writes a byte.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    for args in [&["topology"][..], &["topology", "--json"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["--sysfs", &fixture_sysfs()])
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn a_full_disk_is_an_error_message_and_status_1() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["--sysfs", &fixture_sysfs(), "topology"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "locus: writing to standard output: No space left on device (os error 28)"
    );
}

#[test]
fn a_cause_is_named_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["--sysfs", "/etc/hostname/sys", "topology"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
}

fn locus(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn volume_is_an_option_only_of_the_commands_that_use_one() {
    for command in ["serve", "format", "status", "fsck"] {
        let help = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args([command, "--help"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("--volume <DIR>"),
            "{command}"
        );
    }
    for command in [
        &["topology"][..],
        &["sim", "--trace", "t.csv"],
        &["bench", "fs"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--volume", "/dev/shm/locus"]);
        let (code, stderr) = locus(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--volume'"),
            "{stderr}"
        );
    }
}

#[test]
fn a_listen_address_without_a_port_says_what_is_expected() {
    for (text, words) in [
        ("10809", "is only a port"),
        ("localhost", "has no port"),
        ("no such host:1", "is not ADDR:PORT"),
    ] {
        let (code, stderr) = locus(&["serve", "--listen", text]);
        assert_eq!(code, Some(2), "{text}: {stderr}");
        assert!(stderr.contains(words), "{text}: {stderr}");
        assert!(stderr.contains("127.0.0.1:10809"), "{text}: {stderr}");
    }
}

#[test]
fn a_missing_device_is_named_as_missing() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let volume = dir.path().join("v");
    let (code, stderr) = locus(&[
        "format",
        "--volume",
        volume.to_str().unwrap(),
        "--device",
        "/dev/dax9.9",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("device /dev/dax9.9 does not exist"),
        "{stderr}"
    );
    let file = dir.path().join("img");
    let (code, stderr) = locus(&[
        "format",
        "--volume",
        volume.to_str().unwrap(),
        "--device",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("give its size"), "{stderr}");
}

#[test]
fn a_plot_that_cannot_be_written_is_refused_before_the_work() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/traces/vm.disksim.trace"
    );
    for (plot, words) in [
        ("/nonexistent-dir/fig.png", "cannot write there"),
        ("fig.jpg", "use a .svg or .png file name"),
    ] {
        let (code, stderr) = locus(&["sim", "--trace", trace, "--plot", plot]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(words), "{stderr}");
        // Refused before the trace was read: no summary line.
        assert!(!stderr.contains("3000 requests"), "{stderr}");
        assert!(!stderr.contains("Error("), "{stderr}");
    }
}

/// An emulated device must name its node, and must fit in the node's free memory: checked
/// before any page is allocated, so a refusal leaves nothing behind.
#[test]
fn an_emulated_device_names_its_node_and_fits_its_memory() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let volume = dir.path().join("v");
    let device = dir.path().join("dev.pmem");
    let format = |spec: String| {
        locus(&[
            "format",
            "--volume",
            volume.to_str().unwrap(),
            "--device",
            &spec,
        ])
    };
    let (code, stderr) = format(format!("{},size=64M", device.display()));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is emulated: give the node"), "{stderr}");
    let (code, stderr) = format(format!("{},node=0,size=16T", device.display()));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("emulated devices on node 0 need") && stderr.contains("free"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "a refused format left {left:?}");
    let (code, stderr) = format(format!("{},node=0,size=16M", device.display()));
    assert_eq!(code, Some(0), "{stderr}");
}
