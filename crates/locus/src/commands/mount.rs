//! `locus mount`: the volume's file system as a kernel file system (FUSE) that every process
//! on the machine shares, served by this process until it is unmounted or stopped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::volume::{VolumeDir, open_or_create_default};

/// Mount the volume's file system on a directory, for every process on the machine.
///
/// One locus process owns the volume and serves its files to the kernel over FUSE: shells,
/// pipelines, a second `sqlite3` and rsync's two processes all use /MOUNTPOINT through
/// ordinary system calls. A write that returns is atomic and durable, as everywhere in
/// locus (no write-back cache holds acknowledged data, unless --writeback-cache asks for
/// one); `fsync` has nothing left to do.
/// Shared `mmap` works through the kernel's page cache: mapped stores are written when the
/// kernel writes the pages back (`msync`, `munmap`, `fsync`).
///
/// Without --foreground the command returns once the file system is mounted and the server
/// runs on in the background (in its own process group, logging to locus-mount.log in the
/// volume directory). It stops cleanly on `umount MOUNTPOINT` (or `fusermount -u`), SIGINT,
/// SIGTERM or SIGHUP: requests finish, the file system is checkpointed and the volume closed
/// (while a process still has a file open or its working directory in the mount, it says so
/// and serves on until the mount point is free). If the server is killed,
/// the mount point answers ENOTCONN ("Transport endpoint is not connected") until it is
/// unmounted (`umount -l MOUNTPOINT`); mounting again recovers every acknowledged write.
#[derive(Debug, clap::Args)]
pub struct MountArgs {
    #[command(flatten)]
    pub volume: VolumeDir,

    /// An existing directory to mount the file system on.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,

    /// Serve in this process until unmounted or stopped, instead of returning once mounted.
    #[arg(long)]
    pub foreground: bool,

    /// Let users other than the one mounting use the files (FUSE `allow_other`; the kernel
    /// checks each file's permission bits).
    #[arg(long)]
    pub allow_other: bool,

    /// Mount read-only: every change is EROFS.
    #[arg(long)]
    pub read_only: bool,

    /// Let the kernel keep written pages in its page cache and send them to locus later,
    /// merged (FUSE's write-back cache). Small writes then run at the page cache's speed,
    /// but a write is no longer durable when it returns: it is once `fsync`, `fdatasync`,
    /// `msync` or the `close` of its file returns (the kernel writes the file's dirty pages
    /// back first), or once the kernel writes it back on its own (within about 30 s). If the
    /// server is killed or the machine stops, what the kernel had not sent is lost; a
    /// `write(2)` is not atomic either (its pages may go in separate requests). Reads are
    /// cached by the kernel too. Without it (the default) every `write(2)` that returns is
    /// atomic and durable. See docs/mount.md.
    #[arg(long, conflicts_with = "read_only")]
    pub writeback_cache: bool,

    /// Do not defragment while idle. By default, once no write has come for 100 ms, 2 MiB
    /// windows of files that small overwrites scattered (64 or more pieces) are rewritten
    /// into one extent each, so later reads gather one piece of memory instead of hundreds;
    /// the rewrites count as media writes. See docs/defrag.md.
    #[arg(long)]
    pub no_defrag: bool,

    /// Refuse extended attributes (the kernel then answers `EOPNOTSUPP` without asking).
    /// By default they are kept (`user.`, `trusted.`, `security.` names), at a cost: the
    /// kernel cannot cache them, and `ls -l` reads one per file for its security-label
    /// check, a round trip each — `ls -l` of 20,000 files takes about four times as long.
    #[arg(long)]
    pub no_xattrs: bool,

    /// Refuse POSIX ACLs (`setfacl`, `cp -a` and `rsync -A` of files that have them):
    /// `EOPNOTSUPP`, as before locus kept them. By default they are kept with the files and
    /// the kernel enforces them; `--no-xattrs` refuses them too.
    #[arg(long)]
    pub no_acl: bool,

    /// How requests travel between the kernel and locus. `io-uring`: FUSE over io_uring, a
    /// queue per CPU served by a thread pinned to that CPU, so each request is served where
    /// it was made (Linux 6.14+, enabled with `echo Y >
    /// /sys/module/fuse/parameters/enable_uring` as root). `read`: threads reading
    /// /dev/fuse, a thread per CPU. `auto`: io-uring when the kernel offers it, else read.
    #[arg(long, value_enum, default_value = "auto")]
    pub transport: TransportArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    Auto,
    IoUring,
    Read,
}

impl TransportArg {
    fn config(self) -> mount::Transport {
        match self {
            TransportArg::Auto => mount::Transport::Auto,
            TransportArg::IoUring => mount::Transport::IoUring,
            TransportArg::Read => mount::Transport::Read,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TransportArg::Auto => "auto",
            TransportArg::IoUring => "io-uring",
            TransportArg::Read => "read",
        }
    }
}

pub fn run(dir: &Path, sysfs: &Path, args: &MountArgs) -> Result<()> {
    // Before the directory is looked at: the mount point of a server that died answers
    // ENOTCONN to `stat`, and a second file system stacked on a live one would hide it.
    if is_mounted(&args.mountpoint) {
        bail!(
            "{0} already has a locus file system mounted; unmount it first (`umount {0}`, or \
             `umount -l {0}` if its server is gone)",
            args.mountpoint.display()
        );
    }
    let meta = std::fs::metadata(&args.mountpoint)
        .with_context(|| format!("mount point {}", args.mountpoint.display()))?;
    if !meta.is_dir() {
        bail!(
            "mount point {} is not a directory",
            args.mountpoint.display()
        );
    }
    if args.foreground {
        serve(dir, sysfs, args)
    } else {
        background(dir, args)
    }
}

/// Whether a locus FUSE file system is mounted at `mountpoint`, live or with its server
/// gone (then the path cannot be resolved, `stat` fails with ENOTCONN, and it is looked up
/// as written, made absolute).
fn is_mounted(mountpoint: &Path) -> bool {
    mountpoint
        .canonicalize()
        .or_else(|_| std::path::absolute(mountpoint))
        .is_ok_and(|m| volume::is_locus_mount(&m))
}

/// The background server's log, in the volume directory.
const LOG_FILE: &str = "locus-mount.log";

/// Starts `locus mount --foreground` in its own process group, logging to [`LOG_FILE`],
/// and waits until the mount is there (or the server has failed: its messages are shown).
fn background(dir: &Path, args: &MountArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the locus executable")?;
    let mut command = Command::new(exe);
    command
        .arg("mount")
        .arg("--foreground")
        .arg("--volume")
        .arg(dir)
        .arg(&args.mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0);
    if args.allow_other {
        command.arg("--allow-other");
    }
    if args.read_only {
        command.arg("--read-only");
    }
    if args.writeback_cache {
        command.arg("--writeback-cache");
    }
    if args.no_defrag {
        command.arg("--no-defrag");
    }
    if args.no_xattrs {
        command.arg("--no-xattrs");
    }
    if args.no_acl {
        command.arg("--no-acl");
    }
    command.arg("--transport").arg(args.transport.name());
    // The log lives in the volume directory, so the directory must be one the server will
    // use: a volume, or where it creates the embedded default (the default directory, made
    // here on first use, or an empty one). Anywhere else the error is the volume's, as in
    // the foreground, not the log's.
    if volume::VolumeConfig::read(dir)?.is_none() {
        if !volume::may_create_default_in(dir) {
            return Err(volume::VolumeError::NoVolume {
                dir: dir.to_owned(),
            }
            .into());
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the volume directory {}", dir.display()))?;
    }
    // The server's messages go to a log beside the volume: holding this command's stderr
    // would keep a pipe it writes into (`locus mount ... | tee`) open forever.
    let log_path = dir.join(LOG_FILE);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening the server's log {}", log_path.display()))?;
    let start = log.metadata().map_or(0, |m| m.len());
    command.stderr(log);
    let mut child = command.spawn().context("starting the mount server")?;
    // What this server has written to the log so far.
    let said = || {
        let bytes = std::fs::read(&log_path).unwrap_or_default();
        String::from_utf8_lossy(bytes.get(start as usize..).unwrap_or_default()).into_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().context("waiting for the mount server")? {
            eprint!("{}", said());
            bail!("the mount server stopped before mounting ({status})");
        }
        // Mounted, and recorded as the volume's server: the preload library and `status`
        // find the mount through that record, so it must be there when this command
        // returns (the server writes it just after the kernel shows the mount, or logs why
        // it could not).
        if is_mounted(&args.mountpoint)
            && (volume::find_served(dir).is_some_and(|served| served.pid == child.id())
                || said().contains(volume::UNRECORDED))
        {
            // What the server said on the way (the embedded default created, what recovery
            // replayed) is written before it mounts; its "serving" line, which this one
            // replaces, may or may not be there yet.
            for line in said().lines().filter(|l| !l.starts_with("locus: serving ")) {
                eprintln!("{line}");
            }
            eprintln!(
                "locus: mounted {} at {} (server pid {}, log {}); unmount with `umount {}`",
                dir.display(),
                args.mountpoint.display(),
                child.id(),
                log_path.display(),
                args.mountpoint.display()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the mount server did not mount within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Opens the volume, mounts, serves until unmounted or signalled, then closes cleanly.
fn serve(dir: &Path, sysfs: &Path, args: &MountArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the signal handlers")?;
    }
    let volume = open_or_create_default(dir, sysfs, true)?;
    let options = fs::FsOptions {
        // A read-only mount writes nothing, its own layout included.
        defrag: !args.no_defrag && !args.read_only,
        ..fs::FsOptions::default()
    };
    let fs = fs::Fs::open(Arc::new(volume), options)
        .with_context(|| format!("mounting the file system of {}", dir.display()))?;
    let replayed = fs.replayed();
    if replayed.any() {
        eprintln!(
            "locus: the last run did not unmount cleanly; recovery replayed {} logged write(s) \
             ({} bytes) and {} metadata operation(s){}",
            replayed.log_records,
            replayed.log_bytes,
            replayed.journal_records,
            super::torn_note(replayed.torn_writes)
        );
    }
    let topology = fs.volume().topology().clone();
    let checked_dir = dir.to_owned();
    let config = mount::MountConfig {
        read_only: args.read_only,
        allow_other: args.allow_other,
        xattrs: !args.no_xattrs,
        acl: !args.no_xattrs && !args.no_acl,
        transport: args.transport.config(),
        writeback_cache: args.writeback_cache,
        checker: Some(mount::Checker(Arc::new(move || {
            super::fsck::live_check(&checked_dir, &topology)
        }))),
    };
    let mounted = mount::mount(fs.clone(), &args.mountpoint, &config)
        .with_context(|| format!("mounting on {}", args.mountpoint.display()))?;
    // For the preload library and `status`: who serves this volume, and where.
    if let Err(e) = volume::record_served(dir, &args.mountpoint) {
        eprintln!(
            "locus: {} in {} ({e}); the preload library will not find it",
            volume::UNRECORDED,
            dir.display()
        );
    }
    let negotiated = mounted.negotiated();
    eprintln!(
        "locus: serving {} at {} ({}, {} threads, {}); stop with `umount {}`, Ctrl-C or SIGTERM",
        dir.display(),
        args.mountpoint.display(),
        if negotiated.io_uring {
            "FUSE over io_uring, a queue per CPU"
        } else {
            "/dev/fuse reads"
        },
        negotiated.threads,
        if negotiated.writeback_cache {
            "write-back cache: writes are durable at fsync, msync or close"
        } else if negotiated.direct_io {
            "direct I/O"
        } else {
            "page cache"
        },
        args.mountpoint.display()
    );
    // Asked to stop: unmount, unless a process is still using the mount point — then serve
    // on and try again each second, so the server stops once it is free (rather than cut a
    // shell or a program off, or wait for it without a word).
    let mut busy_said = false;
    let mut next_try = Instant::now();
    while !mounted.finished() {
        if stop.load(Ordering::Relaxed) && Instant::now() >= next_try {
            match mounted.request_unmount() {
                Ok(mount::Unmount::Done) => {}
                Ok(mount::Unmount::Busy) if !busy_said => {
                    eprintln!(
                        "locus: {0} is busy (a process has a file open or its working directory \
                         in it): serving on until it is free, then stopping; `umount -l {0}` \
                         detaches it now",
                        args.mountpoint.display()
                    );
                    busy_said = true;
                }
                Ok(mount::Unmount::Busy) => {}
                Err(e) => {
                    // Dropping the session detaches the mount point lazily (`umount2` with
                    // `MNT_DETACH`, else `fusermount3 -u -z`): processes with files open
                    // there keep them, served, until they close them.
                    eprintln!(
                        "locus: {e}; detaching {} lazily instead: stopping once no process \
                         uses it any more (or once it is unmounted, should detaching fail too)",
                        args.mountpoint.display()
                    );
                    break;
                }
            }
            next_try = Instant::now() + Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The record stays until the volume is closed: a command that finds the volume held
    // meanwhile knows by it that the holder is closing (`volume::find_stopping`) and waits.
    let closed = mounted
        .unmount()
        .with_context(|| format!("unmounting {}", args.mountpoint.display()))
        .and_then(|()| fs.unmount().context("closing the file system"));
    volume::clear_served(dir);
    closed?;
    eprintln!("locus: unmounted {}", args.mountpoint.display());
    Ok(())
}
