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
