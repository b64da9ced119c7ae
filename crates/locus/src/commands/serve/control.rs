//! `locus serve`'s control socket: how `locus status` shows, and `locus scrub` scrubs, a
//! volume the server holds.
//!
//! A volume is open in one process at a time, so while `locus serve` runs, `status` and
//! `scrub` cannot open it. The server answers for it instead: it listens on a Unix socket in
//! the volume directory ([`SOCKET_NAME`], mode 0600: the volume's owner only). A client sends
//! one request line and gets one JSON object back, then the connection closes:
//! - `status`: the server's pid, the volume's devices and space, the file system's counters
//!   and each channel's request counters;
//! - `scrub`: starts a scrub of the file data beside the clients' requests
//!   (`fs::Fs::scrub_live`, on a thread of its own) unless one runs, and answers its status
//!   (`fs::ScrubStatus`, under the key `scrub`);
//! - `scrub status`: the status of the last scrub started, which a client asks for until
//!   `running` is false.
//!
//! A server killed with SIGKILL leaves the socket file behind; nobody answers on it then
//! ([`ask`] reports no server), and the next server of the volume replaces it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The control socket's name in the volume directory.
pub const SOCKET_NAME: &str = "locus.serve.sock";

/// The request for the server's live status.
const STATUS_REQUEST: &str = "status";
/// The request that starts (or joins) a scrub.
pub const SCRUB_REQUEST: &str = "scrub";
/// The request for the last scrub's status.
pub const SCRUB_STATUS_REQUEST: &str = "scrub status";

/// How long either side waits for the other's bytes.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the accepting thread looks whether the server is stopping.
const STOP_POLL: Duration = Duration::from_millis(50);

/// The longest request line read.
const MAX_REQUEST: u64 = 256;

/// The listening control socket and its thread; dropping it stops the thread and removes the
/// socket file.
pub struct Control {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Control {
    /// Listens in `dir` (whose volume this process holds: a socket file there is a killed
    /// server's, and is replaced), answers `status` with what `status` returns, and the
    /// scrub requests by scrubbing `scrubbed` (without it they get an error).
    pub fn start(
        dir: &Path,
        status: impl Fn() -> serde_json::Value + Send + 'static,
        scrubbed: Option<fs::Fs>,
    ) -> Result<Self> {
        let path = dir.join(SOCKET_NAME);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("removing the stale control socket {}", path.display())
                });
            }
        }
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("creating the control socket {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
        listener
            .set_nonblocking(true)
            .context("making the control socket non-blocking")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("serve-control".into())
                .spawn(move || {
                    let answers = Answers {
                        status: &status,
                        scrubbed,
                        // Dropped with the thread: a running scrub stops, and is waited for.
                        scrubber: fs::ScrubRunner::new(),
                    };
                    accept_loop(&listener, &stop, &answers);
                })
                .context("starting the control socket's thread")?
        };
        Ok(Self {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the control socket answers with.
struct Answers<'a> {
    status: &'a dyn Fn() -> serde_json::Value,
    scrubbed: Option<fs::Fs>,
    scrubber: fs::ScrubRunner,
}

impl Answers<'_> {
    fn to(&self, request: &str) -> serde_json::Value {
        match request {
            STATUS_REQUEST => {
                let mut status = (self.status)();
                // The last scrub `locus scrub` started here (null: none yet).
                let scrub = Some(self.scrubber.status()).filter(|s| s.id > 0);
                status["scrub"] = serde_json::to_value(scrub).unwrap_or_default();
                status
            }
            SCRUB_REQUEST => self.scrub(true),
            SCRUB_STATUS_REQUEST => self.scrub(false),
            other => serde_json::json!({
                "error": format!(
                    "unknown request {other:?}; the requests are {STATUS_REQUEST:?}, \
                     {SCRUB_REQUEST:?} and {SCRUB_STATUS_REQUEST:?}"
                )
            }),
        }
    }

    /// The scrub's status, after starting it (or joining the one running) when `start`.
    /// Under its own key: the status has an `error` of its own (why the scrub ended without
    /// a report), which is not the request's.
    fn scrub(&self, start: bool) -> serde_json::Value {
        let Some(fs) = &self.scrubbed else {
            return serde_json::json!({"error": "this server has no file system to scrub"});
        };
        let status = if start {
            match self.scrubber.start(fs) {
                Ok(status) => {
                    tracing::info!(
                        scrub = status.id,
                        "scrubbing the file data for `locus scrub`"
                    );
                    status
                }
                Err(e) => {
                    return serde_json::json!({"error": format!("starting the scrub: {e}")});
                }
            }
        } else {
            self.scrubber.status()
        };
        serde_json::json!({ "scrub": status })
    }
}

fn accept_loop(listener: &UnixListener, stop: &AtomicBool, answers: &Answers<'_>) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                // One connection at a time, each bounded by the timeouts: a client that says
                // nothing delays the next by at most IO_TIMEOUT and never the data path.
                if let Err(e) = answer(&stream, answers) {
                    tracing::warn!(error = %format!("{e:#}"), "control socket request failed");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
            Err(e) => {
                tracing::warn!(error = %e, "accepting on the control socket");
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

fn answer(stream: &UnixStream, answers: &Answers<'_>) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_REQUEST))
        .read_line(&mut line)
        .context("reading the request")?;
    let reply = answers.to(line.trim_end_matches(['\r', '\n']));
    let mut bytes = serde_json::to_vec(&reply)?;
    bytes.push(b'\n');
    let mut out = stream;
    out.write_all(&bytes).context("sending the reply")?;
    Ok(())
}

/// Whether `path` names the control socket of the volume in `dir` (directories compared
/// as the file system resolves them, when they exist).
pub fn is_socket_of(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    path.file_name() == Some(std::ffi::OsStr::new(SOCKET_NAME))
        && path
            .parent()
            .is_some_and(|parent| resolve(parent) == resolve(dir))
}

/// The live status of the `locus serve` holding the volume in `dir`: `None` when no server
/// answers there, else what it said, or why its answer could not be had. No server answers
/// when the socket cannot be connected to, whatever the reason — no socket file, one a
/// killed server left, a `dir` that is no directory, another user's socket: the caller then
/// opens the volume itself, and that says what is wrong.
pub fn ask(dir: &Path) -> Option<Result<serde_json::Value>> {
    ask_for(dir, STATUS_REQUEST)
}

/// [`ask`] with another request (`SCRUB_REQUEST`, `SCRUB_STATUS_REQUEST`).
pub fn ask_for(dir: &Path, request: &str) -> Option<Result<serde_json::Value>> {
    let path = dir.join(SOCKET_NAME);
    let stream = UnixStream::connect(&path).ok()?;
    Some(self::request(&stream, &path, request))
}

fn request(stream: &UnixStream, path: &Path, request: &str) -> Result<serde_json::Value> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    (&*stream)
        .write_all(format!("{request}\n").as_bytes())
        .with_context(|| format!("asking the server through {}", path.display()))?;
    let mut bytes = Vec::new();
    (&*stream)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading the server's reply through {}", path.display()))?;
    let reply: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("the server's reply through {}", path.display()))?;
    if let Some(error) = reply.get("error").filter(|e| !e.is_null()) {
        bail!("the server through {} said: {error}", path.display());
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_answered_and_the_socket_goes_with_the_server() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ask(dir.path()).is_none(), "no server yet");
        let control =
            Control::start(dir.path(), || serde_json::json!({"answer": 42}), None).unwrap();
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
        let _control =
            Control::start(dir.path(), || serde_json::json!({"fresh": true}), None).unwrap();
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
    fn a_path_through_a_file_has_no_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(ask(&file.join("vol")).is_none());
    }

    #[test]
    fn an_unknown_request_gets_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let _control = Control::start(dir.path(), || serde_json::json!({}), None).unwrap();
        let stream = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        (&stream).write_all(b"reboot\n").unwrap();
        let mut reply = String::new();
        (&stream).read_to_string(&mut reply).unwrap();
        assert!(reply.contains("unknown request \\\"reboot\\\""), "{reply}");
    }
}
