//! The control socket of a process that holds a volume: how `locus status` shows, and
//! `locus scrub` scrubs, a volume that process has open.
//!
//! A volume is open in one process at a time, so while `locus serve` or a program through
//! the preload library holds it, `status` and `scrub` cannot open it. The holder answers for
//! it instead: it listens on a Unix socket in the volume directory ([`SOCKET_NAME`], mode
//! 0600: the volume's owner only). A client sends one request line and gets one JSON object
//! back, then the connection closes:
//! - [`STATUS_REQUEST`]: what the holder's status function returns (its pid, the volume's
//!   devices and space, the file system's counters, and what is its own), with the last
//!   scrub's status under `scrub`;
//! - [`SCRUB_REQUEST`]: starts a scrub of the file data beside the holder's own I/O
//!   ([`crate::Fs::scrub_live`], on a thread of its own) unless one runs, and answers its
//!   status ([`crate::ScrubStatus`], under the key `scrub`);
//! - [`SCRUB_STATUS_REQUEST`]: the status of the last scrub started, which a client asks for
//!   until `running` is false;
//! - [`CHECK_REQUEST`]: what `locus fsck` checks ([`LiveCheck`]), made by the holder with its
//!   own I/O stopped and the checkpoint held for the few milliseconds it takes, so the media
//!   hold what recovery would find if the holder died then;
//! - [`RELEASE_REQUEST`]: asks a holder that can let go of the volume between its calls (a
//!   program through the preload library, [`Release`]) to do so now, for another process
//!   that wants it: `{"releasing": true}` when it is idle (it then closes the volume on a
//!   thread of its own, which stops this socket), else `{"releasing": false, "why": ...}`.
//!   `locus serve` never lets go (an error).
//!
//! A failed request is answered `{"error": "..."}`. The thread that answers sleeps in
//! `poll(2)` until a client connects or [`Control`] is dropped (an eventfd wakes it): it
//! costs a process that holds a volume nothing while nobody asks. A holder killed
//! with SIGKILL leaves the socket file behind; nobody answers on it then, and the next
//! holder of the volume replaces it.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Fs, ScrubRunner};

/// The control socket's name in the volume directory.
pub const SOCKET_NAME: &str = "locus.serve.sock";

/// The request for the holder's live status.
pub const STATUS_REQUEST: &str = "status";
/// The request that starts (or joins) a scrub.
pub const SCRUB_REQUEST: &str = "scrub";
/// The request for the last scrub's status.
pub const SCRUB_STATUS_REQUEST: &str = "scrub status";
/// The request for a check of the volume and its file system, as `locus fsck` makes it.
pub const CHECK_REQUEST: &str = "check";

/// What a holder runs for [`CHECK_REQUEST`]: stops its own I/O, then (usually through
/// [`check_held`]) checks the volume; the answer, or `{"error": ...}`.
pub type Checker = Box<dyn Fn() -> serde_json::Value + Send>;

/// The request that asks the holder to let go of the volume now, if it is idle.
pub const RELEASE_REQUEST: &str = "release";

/// How a holder lets go of its volume when another process asks ([`RELEASE_REQUEST`]).
pub struct Release {
    /// On the control thread: whether the holder is idle now (`Ok`), or why it cannot let
    /// go (files open, a call in progress).
    pub idle: Box<dyn Fn() -> Result<(), String> + Send>,
    /// After an idle answer was sent, on a thread of its own (marked by
    /// [`Hooks::on_thread`]): closes the volume if the holder is still idle, stopping the
    /// [`Control`] first (dropping it joins the control thread, which has answered by then).
    pub release: fn(),
}

impl std::fmt::Debug for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Release").finish_non_exhaustive()
    }
}

/// What a volume's file system looks like to `status` and `fsck`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FsState {
    /// It would open; what recovery found.
    Present(crate::FsCheck),
    /// The volume carries none.
    None,
    /// Recovery refuses it; the error names the structure.
    Damaged {
        /// What is wrong, and where.
        error: String,
    },
}

impl FsState {
    /// Checks the file system on a freshly opened `volume` (changes nothing on media; the
    /// volume's allocator then counts the file system's memory as used).
    pub fn of(volume: &volume::Volume) -> Self {
        Self::of_offline(&Fs::offline(volume))
    }

    /// The same, from a read-only view already loaded ([`Fs::offline`]), which the caller
    /// may go on reading files through.
    pub fn of_offline(offline: &crate::Result<crate::OfflineFs<'_>>) -> Self {
        let checked = match offline {
            Ok(offline) => offline.check(),
            Err(crate::FsError::NoFileSystem) => return Self::None,
            Err(e) => {
                return Self::Damaged {
                    error: e.to_string(),
                };
            }
        };
        match checked {
            Ok(check) => Self::Present(check),
            Err(crate::FsError::NoFileSystem) => Self::None,
            Err(e) => Self::Damaged {
                error: e.to_string(),
            },
        }
    }
}

/// A holder's check of its volume ([`CHECK_REQUEST`]), or why it could not be made.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LiveCheck {
    /// The devices as `locus fsck` checks them, and the file system on a second, read-only
    /// view of the media.
    Checked {
        volume: volume::CheckReport,
        /// Absent when the volume itself has problems (boxed: a report is far larger than
        /// the failure's message).
        fs: Option<Box<FsState>>,
    },
    Failed(String),
}

/// Checks the volume in `dir`, which this process holds open, as `locus fsck` would: the
/// devices' superblocks, then the file system on a read-only view of the media. The caller
/// has stopped its own writers and holds the checkpoint ([`Fs::quiesced`]), so the media
/// hold still and the report is what recovery would find if the process died now.
pub fn check_held(dir: &Path, topology: &topology::Topology) -> LiveCheck {
    match volume::check_held(dir) {
        Ok(report) => {
            let fs =
                report
                    .is_clean()
                    .then(|| match volume::Volume::open_view(dir, topology.clone()) {
                        Ok(view) => FsState::of(&view),
                        Err(e) => FsState::Damaged {
                            error: format!("opening a view of the media: {e}"),
                        },
                    });
            LiveCheck::Checked {
                volume: report,
                fs: fs.map(Box::new),
            }
        }
        Err(e) => LiveCheck::Failed(format!("{e}")),
    }
}

/// How long either side waits for the other's bytes.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest request line read.
const MAX_REQUEST: u64 = 256;

/// What a holder with needs of its own asks of the control thread (the preload library: its
/// fds out of the program's way, its thread marked as the library's). The default does
/// nothing. (The thread inherits the signal mask of the thread that calls
/// [`Control::start`]; the preload library blocks every signal there first.)
#[derive(Debug, Clone, Copy)]
pub struct Hooks {
    /// Called first on the control thread.
    pub on_thread: fn(),
    /// Given each fd the control socket opens (the listening socket, its wake-up eventfd,
    /// each client's connection) and returns the fd to use: the same, or a duplicate made
    /// elsewhere (the given one then closed). They are closed on the control thread, and
    /// the eventfd where the [`Control`] is dropped.
    pub keep_fd: fn(OwnedFd) -> OwnedFd,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            on_thread: || {},
            keep_fd: |fd| fd,
        }
    }
}

/// The listening control socket and its thread; dropping it stops the thread (and a scrub it
/// runs) and removes the socket file.
pub struct Control {
    path: PathBuf,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").field("path", &self.path).finish()
    }
}

impl Control {
    /// Listens in `dir` (whose volume this process holds: a socket file there is a killed
    /// holder's, and is replaced), answers [`STATUS_REQUEST`] with what `status` returns,
    /// the scrub requests by scrubbing `scrubbed`, and [`CHECK_REQUEST`] with what `check`
    /// returns (without them, those requests get an error).
    pub fn start(
        dir: &Path,
        status: impl Fn() -> serde_json::Value + Send + 'static,
        scrubbed: Option<Fs>,
        check: Option<Checker>,
        release: Option<Release>,
        hooks: Hooks,
    ) -> io::Result<Self> {
        let path = dir.join(SOCKET_NAME);
        let with =
            |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(with(format!(
                    "removing the stale control socket {}",
                    path.display()
                ))(e));
            }
        }
        let listener = UnixListener::bind(&path).map_err(with(format!(
            "creating the control socket {}",
            path.display()
        )))?;
        let listener = UnixListener::from((hooks.keep_fd)(OwnedFd::from(listener)));
        let started = (|| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(with(format!("setting the mode of {}", path.display())))?;
            listener.set_nonblocking(true)?;
            let flags =
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK;
            let wake = rustix::event::eventfd(0, flags).map_err(|e| {
                with("making the control socket's wake-up eventfd".into())(e.into())
            })?;
            let wake = (hooks.keep_fd)(wake);
            let thread = {
                let woken = (hooks.keep_fd)(wake.try_clone()?);
                std::thread::Builder::new()
                    .name("locus-control".into())
                    .spawn(move || {
                        (hooks.on_thread)();
                        let answers = Answers {
                            status: &status,
                            check,
                            release,
                            scrubbed,
                            // Dropped with the thread: a running scrub stops, and is waited
                            // for.
                            scrubber: ScrubRunner::new(),
                        };
                        accept_loop(&listener, &woken, &answers, hooks);
                    })
                    .map_err(with("starting the control socket's thread".into()))?
            };
            Ok((wake, thread))
        })();
        match started {
            Ok((wake, thread)) => Ok(Self {
                path,
                wake,
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }
}

impl Control {
    /// Stops answering without waiting for the thread: the socket file goes now, and the
    /// thread ends when it wakes, dropping what it holds then. For a process about to exit,
    /// which has no use for the wait (a wake-up of the thread on another CPU, 0.1–0.4 ms on
    /// the development VM); a process that goes on must drop the `Control` instead, so that
    /// nothing the thread holds (the file system, and through it the volume's lock) outlives
    /// the call.
    pub fn abandon(mut self) {
        self.wake_thread();
        let _ = std::fs::remove_file(&self.path);
        // Dropping the handle detaches the thread.
        drop(self.thread.take());
    }

    fn wake_thread(&self) {
        // An eventfd takes 8-byte counts; a write fails only when the count would overflow,
        // which means the thread has been woken already.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.wake_thread();
            let _ = thread.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the control socket answers with.
struct Answers<'a> {
    status: &'a dyn Fn() -> serde_json::Value,
    check: Option<Checker>,
    release: Option<Release>,
    scrubbed: Option<Fs>,
    scrubber: ScrubRunner,
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
            CHECK_REQUEST => match &self.check {
                Some(check) => check(),
                None => serde_json::json!({"error": "this holder does not check its volume"}),
            },
            RELEASE_REQUEST => match &self.release {
                Some(release) => match (release.idle)() {
                    Ok(()) => serde_json::json!({"releasing": true}),
                    Err(why) => serde_json::json!({"releasing": false, "why": why}),
                },
                None => serde_json::json!({"error": "this holder keeps its volume"}),
            },
            other => serde_json::json!({
                "error": format!(
                    "unknown request {other:?}; the requests are {STATUS_REQUEST:?}, \
                     {SCRUB_REQUEST:?}, {SCRUB_STATUS_REQUEST:?}, {CHECK_REQUEST:?} and \
                     {RELEASE_REQUEST:?}"
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

/// Answers one client at a time until the eventfd `woken` is written to (its count stays
/// non-zero, so a write before the first `poll` is seen too).
fn accept_loop(listener: &UnixListener, woken: &OwnedFd, answers: &Answers<'_>, hooks: Hooks) {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut fds = [
            PollFd::new(listener, PollFlags::IN),
            PollFd::new(woken, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "waiting on the control socket; it stops answering");
                return;
            }
        }
        if fds[0]
            .revents()
            .intersects(PollFlags::NVAL | PollFlags::ERR)
        {
            tracing::warn!("the control socket was closed under it; it stops answering");
            return;
        }
        if fds[1].revents().contains(PollFlags::IN) {
            return;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let stream = UnixStream::from((hooks.keep_fd)(OwnedFd::from(stream)));
                // One connection at a time, each bounded by the timeouts: a client that says
                // nothing delays the next by at most IO_TIMEOUT and never the data path.
                if let Err(e) = answer(&stream, answers, hooks) {
                    tracing::warn!(error = %e, "control socket request failed");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!(error = %e, "accepting on the control socket"),
        }
    }
}

fn answer(stream: &UnixStream, answers: &Answers<'_>, hooks: Hooks) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_REQUEST)).read_line(&mut line)?;
    let reply = answers.to(line.trim_end_matches(['\r', '\n']));
    let mut bytes = serde_json::to_vec(&reply)?;
    bytes.push(b'\n');
    let mut out = stream;
    out.write_all(&bytes)?;
    if let Some(release) = &answers.release
        && reply["releasing"] == true
    {
        // Not on this thread: closing the volume stops the control socket, which joins it.
        let finish = release.release;
        let on_thread = hooks.on_thread;
        std::thread::Builder::new()
            .name("locus-release".into())
            .spawn(move || {
                on_thread();
                finish();
            })?;
    }
    Ok(())
}

/// Sends `request` to the holder of the volume in `dir` and returns its JSON answer as
/// sent (an `error` key included): `None` when nobody answers there (no socket, a killed
/// holder's, another user's).
pub fn ask(dir: &Path, request: &str) -> Option<io::Result<serde_json::Value>> {
    let stream = UnixStream::connect(dir.join(SOCKET_NAME)).ok()?;
    let asked = (|| {
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        (&stream).write_all(format!("{request}\n").as_bytes())?;
        let mut bytes = Vec::new();
        (&stream).read_to_end(&mut bytes)?;
        Ok(serde_json::from_slice(&bytes)?)
    })();
    Some(asked)
}
