//! Opening the volume named by `--volume` for the commands that need one, creating the
//! embedded default when there is none yet.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use topology::Topology;

use crate::size::format_bytes;
use volume::{OpenOptions, Volume, VolumeConfig};

/// `--volume DIR`, for the commands that work on a volume (serve, format, status, fsck).
#[derive(Debug, clap::Args)]
pub struct VolumeDir {
    /// Directory that holds the volume: its locus.toml and, for emulated devices, their
    /// files. The default volume lives in shared memory: it survives process crashes, not
    /// reboots. `status` and `serve` create the embedded default there when it is the default
    /// location or an empty directory.
    #[arg(
        long = "volume",
        value_name = "DIR",
        env = "LOCUS_VOLUME",
        default_value = volume::DEFAULT_DIR,
        value_parser = absolute_dir
    )]
    pub path: PathBuf,
}

/// `--volume`'s directory made absolute, so that the device paths a command writes into its
/// `locus.toml` (the embedded default's, for one) do not depend on where it ran.
fn absolute_dir(value: &str) -> std::result::Result<PathBuf, String> {
    if value.is_empty() {
        return Err("the volume directory is empty".into());
    }
    std::path::absolute(value).map_err(|e| format!("{value}: {e}"))
}

/// Opens the volume in `dir`. With no `locus.toml` there, and `dir` the default location or an
/// empty directory ([`volume::may_create_default_in`]), formats the embedded default (one
/// emulated device per node, with an empty file system) first and says so on stderr; anywhere
/// else it is an error that names the directory and leaves nothing behind.
/// `prefault`: map every page of emulated devices now (for `serve`; see
/// [`volume::OpenOptions::prefault`]).
pub fn open_or_create_default(dir: &Path, sysfs: &Path, prefault: bool) -> Result<Volume> {
    let topology = read_topology(sysfs)?;
    if VolumeConfig::read(dir)?.is_none() {
        let config = fs::create_default_volume(dir, &topology).map_err(|e| match e {
            // Not a place for the default: the error says so, and names `locus format`.
            fs::FsError::Volume(volume::VolumeError::NoVolume { .. }) => anyhow::Error::new(e),
            e => anyhow::Error::new(e).context(format!(
                "creating the embedded default volume at {}",
                dir.display()
            )),
        })?;
        eprintln!(
            "locus: no volume at {}; created the embedded default: {} emulated device(s), one per \
             NUMA node, each bound to its node (survives process crashes, not reboots), with an \
             empty file system",
            dir.display(),
            config.devices.len()
        );
    }
    open(dir, &topology, prefault)
}

/// Reads the machine's layout.
pub fn read_topology(sysfs: &Path) -> Result<Topology> {
    Topology::read_from(sysfs)
        .with_context(|| format!("reading the NUMA topology from {}", sysfs.display()))
}

/// Opens the volume in `dir`.
pub fn open(dir: &Path, topology: &Topology, prefault: bool) -> Result<Volume> {
    let options = OpenOptions {
        prefault,
        ..OpenOptions::default()
    };
    after_stopping_server(dir, || Volume::open(dir, topology.clone(), &options))
        .with_context(|| format!("opening the volume at {}", dir.display()))
}

/// Runs `attempt` (something that takes the volume's lock), waiting while a `locus mount`
/// server that was unmounted closes the volume ([`volume::after_stopping_server`]; the wait
/// is announced on stderr). Errors name the holder ([`named_holder`]).
pub fn after_stopping_server<T>(
    dir: &Path,
    attempt: impl FnMut() -> volume::Result<T>,
) -> Result<T> {
    volume::after_stopping_server(dir, attempt, |stopping| {
        eprintln!(
            "locus: waiting for the `locus mount` server (pid {}), unmounted from {}, to close \
             the volume",
            stopping.pid,
            stopping.mountpoint.display()
        );
    })
    .map_err(|e| named_holder(dir, e))
}

/// A volume error, with the server that holds the volume named when it is locus's own —
/// `locus mount` (from its record in the directory) or `locus serve` (answering on its
/// control socket) — and what frees it, instead of only the pid the lock file gives.
pub fn named_holder(dir: &Path, error: volume::VolumeError) -> anyhow::Error {
    let volume::VolumeError::InUse { pid, .. } = &error else {
        return error.into();
    };
    if let Some(stopping) = volume::stopping_holder(dir, pid) {
        return anyhow::anyhow!(
            "volume {} is still held by the `locus mount` server (pid {}) {} s after it was \
             unmounted from {}: a lazy unmount (`umount -l`) keeps it serving the files still \
             open there until they are closed; SIGTERM stops it (it finishes the requests in \
             progress and closes the volume)",
            dir.display(),
            stopping.pid,
            volume::STOPPING_WAIT.as_secs(),
            stopping.mountpoint.display()
        );
    }
    if let Some(served) = volume::find_served(dir) {
        return anyhow::anyhow!(
            "volume {} is served by `locus mount` (pid {}) at {}; unmount it first (`umount {}`)",
            dir.display(),
            served.pid,
            served.mountpoint.display(),
            served.mountpoint.display()
        );
    }
    if let Some(Ok(live)) = super::serve::control::ask(dir) {
        return anyhow::anyhow!(
            "volume {} is {}; {}",
            dir.display(),
            super::serve::control::held_by(&live),
            super::serve::control::how_to_stop(&live)
        );
    }
    // Another process with the volume open — one using the file-system library (`fs`, the
    // C API) or a locus command — named by its command line when /proc shows it.
    if let Some(command) = pid.trim().parse().ok().and_then(volume::command_line) {
        return anyhow::anyhow!("{error} (`{command}`); a volume is open in one process at a time");
    }
    error.into()
}

/// Creates an empty file system on the (closed) volume in `dir`, replacing any there.
pub fn format_fs(
    dir: &Path,
    topology: Topology,
    data_checksums: bool,
    slot_limit: Option<u32>,
) -> Result<()> {
    fs::format_volume_with(dir, topology, data_checksums, slot_limit).with_context(|| {
        format!(
            "formatting a file system on the volume at {}",
            dir.display()
        )
    })
}

/// What a volume's file system looks like to `status` and `fsck`.
pub use fs::control::FsState;

/// One line for people about a file system's state.
pub fn describe_fs(state: &FsState) -> String {
    match state {
        FsState::Present(c) => format!(
            "file system: {}, {}, {} in files ({} mapped); {} ({}) and {} to replay{}; root \
             generation {}{}",
            count(c.files, "file"),
            count(c.directories, "directory"),
            format_bytes(c.file_bytes),
            format_bytes(c.mapped_bytes),
            count(c.log_records, "logged write"),
            format_bytes(c.log_bytes),
            count(c.journal_records, "journal record"),
            if c.torn_writes > 0 {
                format!(
                    ", {} a crash cut short to drop",
                    count(c.torn_writes, "write")
                )
            } else {
                String::new()
            },
            c.generation,
            if c.data_checksums {
                "; data checksums"
            } else {
                ""
            }
        ),
        FsState::None => "file system: none (create one with `locus format --force`)".into(),
        FsState::Damaged { error } => format!("file system: damaged: {error}"),
    }
}

/// "1 file", "2 files", "3 directories".
fn count(n: u64, noun: &str) -> String {
    match (n, noun.strip_suffix('y')) {
        (1, _) => format!("1 {noun}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        (_, None) => format!("{n} {noun}s"),
    }
}
