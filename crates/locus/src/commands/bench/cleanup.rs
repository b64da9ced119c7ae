//! What a bench leaves behind goes away however the bench ends.
//!
//! Benches make gigabytes of scratch volumes in `/dev/shm` and start servers and fio. `Drop`
//! guards remove them when a bench returns or fails; for Ctrl-C, SIGTERM and SIGHUP,
//! [`on_signals`] starts a thread that waits for those signals (handlers, not a blocked mask,
//! so the programs a bench starts keep their default dispositions), kills every child process
//! still registered, removes every scratch path still registered, and exits with 128 + the
//! signal's number, as a shell reports a command killed by it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Mutex;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Scratch paths and child pids that are live now.
static LIVE: Mutex<Live> = Mutex::new(Live {
    paths: Vec::new(),
    pids: Vec::new(),
});

struct Live {
    paths: Vec<PathBuf>,
    pids: Vec<u32>,
}

fn live() -> std::sync::MutexGuard<'static, Live> {
    // A panic while holding the lock leaves consistent lists; keep using them.
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the thread that cleans up on SIGINT, SIGTERM or SIGHUP. Call once, before the
/// bench creates anything.
pub fn on_signals() -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!(
                    "\nlocus bench: interrupted; stopping its programs, removing its scratch files"
                );
                // Hold the lock to the end: nothing registers or unregisters meanwhile.
                let live = live();
                for pid in &live.pids {
                    kill(*pid);
                }
                for path in &live.paths {
                    remove(path);
                }
                std::process::exit(128 + signal);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

fn kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

fn remove(path: &Path) {
    if std::fs::remove_dir_all(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// A scratch file or directory: removed when dropped, or on a signal.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// Takes charge of `path` (which need not exist yet; whatever is there when the guard
    /// goes is removed).
    pub fn new(path: PathBuf) -> Self {
        live().paths.push(path.clone());
        Self(path)
    }

    /// An empty directory `/dev/shm/PREFIX-PID`, emptied first if a run with a recycled pid
    /// left one.
    pub fn shm_dir(prefix: &str) -> Result<Self> {
        let scratch =
            Self::new(Path::new("/dev/shm").join(format!("{prefix}-{}", std::process::id())));
        remove(&scratch.0);
        std::fs::create_dir_all(&scratch.0)
            .with_context(|| format!("creating {}", scratch.0.display()))?;
        Ok(scratch)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut live = live();
        remove(&self.0);
        if let Some(at) = live.paths.iter().position(|p| *p == self.0) {
            live.paths.swap_remove(at);
        }
    }
}

/// Registers a child's pid until it is reaped; the caller reaps it (`Child::wait`) before
/// dropping the guard.
#[derive(Debug)]
pub struct ChildPid(u32);

impl ChildPid {
    pub fn new(child: &Child) -> Self {
        live().pids.push(child.id());
        Self(child.id())
    }
}

impl Drop for ChildPid {
    fn drop(&mut self) {
        let mut live = live();
        if let Some(at) = live.pids.iter().position(|p| *p == self.0) {
            live.pids.swap_remove(at);
        }
    }
}

/// `Command::output`, with the child killed if the bench is interrupted meanwhile.
pub fn output(command: &mut Command) -> std::io::Result<Output> {
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let _pid = ChildPid::new(&child);
    child.wait_with_output()
}
