//! Helpers shared by the tests that run `locus serve`.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn require(tools: &[&str]) -> bool {
    for tool in tools {
        let found = client(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "{tool} is missing; .ci/run installs it"
            );
            eprintln!("skipping: {tool} is not installed");
            return false;
        }
    }
    true
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A client command. nbdsh runs `python3` from PATH, and the Debian module (python3-libnbd)
/// belongs to the system's Python, which may not come first in a developer's PATH.
pub fn client(program: &str) -> Command {
    let mut command = Command::new(program);
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("/usr/bin:{path}"));
    command
}

/// Runs a client and insists it succeeds.
pub fn run(program: &str, args: &[&str]) -> Output {
    let output = client(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}

/// Waits until the server `child`, logging to `log`, says it is serving. Panics with the log
/// if it exits first or takes longer than `limit`.
pub fn wait_until_serving(child: &mut Child, log: &Path, limit: Duration) {
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    let deadline = Instant::now() + limit;
    while !read_log().contains("locus: serving") {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("locus serve exited with {status}: {}", read_log());
        }
        assert!(
            Instant::now() < deadline,
            "locus serve did not start: {}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a client and returns what it did, success or not.
pub fn run_unchecked(program: &str, args: &[&str]) -> Output {
    client(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

/// A TCP port on 127.0.0.1 that nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Writes `bytes` pseudo-random bytes (xorshift from `seed`) to `path` and returns them.
pub fn random_file(path: &Path, bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(path, &data).expect("write image");
    data
}

/// The preload library: `cargo build` leaves it beside the binary, `cargo test --workspace`
/// in deps/.
pub fn preload_library() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_locus")).parent().unwrap();
    [
        dir.join("liblocus_preload.so"),
        dir.join("deps/liblocus_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "liblocus_preload.so is in neither {} nor its deps/: `cargo test --workspace` \
             builds it",
            dir.display()
        )
    })
}

// The device-damage helpers are testkit's, shared with the file system's and the preload
// library's tests.
#[allow(unused_imports, reason = "each test binary uses a different subset")]
pub use testkit::{damage_marked_block, emulated_device, poke};
