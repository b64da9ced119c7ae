//! Helpers shared by the tests that run `locus serve`.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

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
