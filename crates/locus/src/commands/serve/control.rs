//! The client side of the control socket a process holding a volume answers on
//! ([`fs::control`]: `locus serve`, or a program through the preload library): how `locus
//! status` shows, and `locus scrub` scrubs, a volume such a process holds.
//!
//! A holder killed with SIGKILL leaves the socket file behind; nobody answers on it then
//! ([`ask`] reports no holder), and the next holder of the volume replaces it.

use std::path::Path;

use anyhow::{Context, Result, bail};

pub use fs::control::{
    CHECK_REQUEST, Checker, Control, Hooks, SCRUB_REQUEST, SCRUB_STATUS_REQUEST, SOCKET_NAME,
    STATUS_REQUEST,
};

/// Whether `path` names the control socket of the volume in `dir` (directories compared
/// as the file system resolves them, when they exist).
pub fn is_socket_of(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    path.file_name() == Some(std::ffi::OsStr::new(SOCKET_NAME))
        && path
            .parent()
            .is_some_and(|parent| resolve(parent) == resolve(dir))
}

/// The live status of the process holding the volume in `dir` (`locus serve`, or a program
/// through the preload library): `None` when nobody answers there, else what it said, or why
/// its answer could not be had. No holder answers
/// when the socket cannot be connected to, whatever the reason — no socket file, one a
/// killed server left, a `dir` that is no directory, another user's socket: the caller then
/// opens the volume itself, and that says what is wrong.
pub fn ask(dir: &Path) -> Option<Result<serde_json::Value>> {
    ask_for(dir, STATUS_REQUEST)
}

/// Who answered a status request: "`locus serve` (pid N)", or the program holding the
/// volume through the preload library, "`python3 app.py` (pid N, through the preload
/// library)".
pub fn holder(status: &serde_json::Value) -> String {
    let pid = status["server_pid"]
        .as_u64()
        .map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"));
    match status["server"].as_str() {
        Some("preload") => format!(
            "`{}` ({pid}, through the preload library)",
            status["program"].as_str().unwrap_or("?")
        ),
        _ => format!("`locus serve` ({pid})"),
    }
}

/// "served by `locus serve` (pid N)", or "held by" the program holding the volume through
/// the preload library ([`holder`]).
pub fn held_by(status: &serde_json::Value) -> String {
    let verb = if status["server"] == "preload" {
        "held"
    } else {
        "served"
    };
    format!("{verb} by {}", holder(status))
}

/// What stops the holder that answered `status`, for messages that need the volume to
/// themselves.
pub fn how_to_stop(status: &serde_json::Value) -> &'static str {
    match status["server"].as_str() {
        Some("preload") => {
            "let the program end first (it unmounts the volume at exit), or run it on a \
             `locus mount` of the volume instead"
        }
        _ => {
            "stop it first (SIGTERM or Ctrl-C: it finishes the requests in progress and stops \
             cleanly)"
        }
    }
}

/// [`ask`] with another request (`SCRUB_REQUEST`, `SCRUB_STATUS_REQUEST`).
pub fn ask_for(dir: &Path, request: &str) -> Option<Result<serde_json::Value>> {
    let path = dir.join(SOCKET_NAME);
    let reply = fs::control::ask(dir, request)?;
    Some((|| {
        let reply =
            reply.with_context(|| format!("asking the server through {}", path.display()))?;
        if let Some(error) = reply.get("error").filter(|e| !e.is_null()) {
            bail!("the server through {} said: {error}", path.display());
        }
        Ok(reply)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fs::control::IO_TIMEOUT;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    use std::os::unix::net::UnixStream;

    #[test]
    fn status_is_answered_and_the_socket_goes_with_the_server() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ask(dir.path()).is_none(), "no server yet");
        let control = answering(dir.path(), || serde_json::json!({"answer": 42}));
        let mode = std::fs::metadata(dir.path().join(SOCKET_NAME))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let reply = ask(dir.path()).expect("a server").unwrap();
        assert_eq!(reply["answer"], 42);
        drop(control);
        assert!(!dir.path().join(SOCKET_NAME).exists());
        assert!(ask(dir.path()).is_none(), "the server stopped");
    }

    #[test]
    fn a_killed_servers_socket_is_not_a_server_and_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        // What SIGKILL leaves: the socket file, nobody listening.
        drop(UnixListener::bind(dir.path().join(SOCKET_NAME)).unwrap());
        assert!(dir.path().join(SOCKET_NAME).exists());
        assert!(ask(dir.path()).is_none());
        let _control = answering(dir.path(), || serde_json::json!({"fresh": true}));
        assert_eq!(ask(dir.path()).unwrap().unwrap()["fresh"], true);
    }

    #[test]
    fn the_control_socket_is_recognised_however_its_directory_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("v");
        std::fs::create_dir(&sub).unwrap();
        assert!(is_socket_of(&sub.join(SOCKET_NAME), &sub));
        assert!(is_socket_of(
            &dir.path().join("v/../v").join(SOCKET_NAME),
            &sub
        ));
        assert!(!is_socket_of(&sub.join("nbd.sock"), &sub));
        assert!(!is_socket_of(&dir.path().join(SOCKET_NAME), &sub));
    }

    #[test]
    fn the_holder_is_named_as_it_said() {
        let serve = serde_json::json!({"server": "serve", "server_pid": 7});
        assert_eq!(holder(&serve), "`locus serve` (pid 7)");
        let program = serde_json::json!({
            "server": "preload", "server_pid": 8, "program": "sqlite3 /locus/a.db"
        });
        assert_eq!(
            holder(&program),
            "`sqlite3 /locus/a.db` (pid 8, through the preload library)"
        );
        assert!(held_by(&program).starts_with("held by `sqlite3"));
        assert!(held_by(&serve).starts_with("served by `locus serve`"));
        assert!(how_to_stop(&program).contains("locus mount"));
        assert!(how_to_stop(&serve).contains("SIGTERM"));
    }

    #[test]
    fn a_path_through_a_file_has_no_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(ask(&file.join("vol")).is_none());
    }

    /// A control socket that answers status requests with `status`, and nothing else.
    fn answering(dir: &Path, status: impl Fn() -> serde_json::Value + Send + 'static) -> Control {
        Control::start(dir, status, None, None, None, Hooks::default()).unwrap()
    }

    #[test]
    fn a_release_request_is_answered_by_the_holders_idleness() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        static IDLE: AtomicUsize = AtomicUsize::new(0);
        let dir = tempfile::tempdir().unwrap();
        let _control = Control::start(
            dir.path(),
            || serde_json::json!({}),
            None,
            None,
            Some(fs::control::Release {
                idle: Box::new(|| match IDLE.load(Ordering::SeqCst) {
                    0 => Err("2 locus file(s) open".into()),
                    _ => Ok(()),
                }),
                release: || {
                    RELEASED.fetch_add(1, Ordering::SeqCst);
                },
            }),
            Hooks::default(),
        )
        .unwrap();
        let busy = fs::control::ask(dir.path(), fs::control::RELEASE_REQUEST)
            .unwrap()
            .unwrap();
        assert_eq!(
            busy,
            serde_json::json!({"releasing": false, "why": "2 locus file(s) open"})
        );
        IDLE.store(1, Ordering::SeqCst);
        let idle = fs::control::ask(dir.path(), fs::control::RELEASE_REQUEST)
            .unwrap()
            .unwrap();
        assert_eq!(idle, serde_json::json!({"releasing": true}));
        let waited = std::time::Instant::now();
        while RELEASED.load(Ordering::SeqCst) == 0 {
            assert!(waited.elapsed() < IO_TIMEOUT, "release never ran");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1, "released once");

        // A holder without a way to let go says so.
        let other = tempfile::tempdir().unwrap();
        let _server = answering(other.path(), || serde_json::json!({}));
        let kept = fs::control::ask(other.path(), fs::control::RELEASE_REQUEST)
            .unwrap()
            .unwrap();
        assert_eq!(kept["error"], "this holder keeps its volume");
    }

    #[test]
    fn an_unknown_request_gets_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let _control = answering(dir.path(), || serde_json::json!({}));
        let stream = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        (&stream).write_all(b"reboot\n").unwrap();
        let mut reply = String::new();
        (&stream).read_to_string(&mut reply).unwrap();
        assert!(reply.contains("unknown request \\\"reboot\\\""), "{reply}");
    }
}
