//! The `locus` command: one binary for every user-facing job of the storage stack.
//!
//! Subcommands live in `commands/`, one file each. This file owns only argument parsing,
//! logging set-up and the mapping of errors to an exit status.

mod commands;
mod output;
mod plot;
mod progress;
mod size;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// locus — a NUMA-aware user-space storage stack for persistent memory, CXL memory and NVMe.
///
/// locus pools every NUMA node's memory-bus storage into one volume and allocates each write
/// from the device nearest the writing CPU; it also simulates hybrid DRAM/NVRAM caches over
/// block traces and does io_uring I/O to SSDs through a registered buffer pool. Its
/// crash-atomic file system is served to the network over NBD (`locus serve`). Logs go to stderr and are chosen with RUST_LOG
/// (e.g. RUST_LOG=debug).
#[derive(Debug, Parser)]
#[command(name = "locus", version, about, long_about, propagate_version = true)]
struct Cli {
    /// Read the machine's layout from this sysfs tree instead of /sys (for inspecting a
    /// copy of another machine's sysfs, and for tests).
    #[arg(long, global = true, env = "LOCUS_SYSFS", default_value = topology::LIVE_SYSFS)]
    sysfs: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Serve(commands::serve::ServeArgs),
    Mount(commands::mount::MountArgs),
    Topology(commands::topology::TopologyArgs),
    Format(commands::format::FormatArgs),
    Status(commands::status::StatusArgs),
    Fsck(commands::fsck::FsckArgs),
    Scrub(commands::scrub::ScrubArgs),
    Tune(commands::tune::TuneArgs),
    Extend(commands::extend::ExtendArgs),
    Sim(commands::sim::SimArgs),
    Cache(commands::cache::CacheArgs),
    Bench(commands::bench::BenchArgs),
    Report(commands::report::ReportArgs),
    TlsCredentials(commands::credentials::CredentialsArgs),
    TlsPsk(commands::credentials::PskArgs),
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Serve(args) => commands::serve::run(&args.volume.path, &cli.sysfs, args),
        Command::Mount(args) => commands::mount::run(&args.volume.path, &cli.sysfs, args),
        Command::Topology(args) => commands::topology::run(&cli.sysfs, args),
        Command::Format(args) => commands::format::run(&args.volume.path, &cli.sysfs, args),
        Command::Status(args) => commands::status::run(&args.volume.path, &cli.sysfs, args),
        Command::Fsck(args) => commands::fsck::run(&args.volume.path, &cli.sysfs, args),
        Command::Scrub(args) => commands::scrub::run(&args.volume.path, &cli.sysfs, args),
        Command::Tune(args) => commands::tune::run(&args.volume.path, &cli.sysfs, args),
        Command::Extend(args) => commands::extend::run(&args.volume.path, &cli.sysfs, args),
        Command::Sim(args) => commands::sim::run(args),
        Command::Cache(args) => commands::cache::run(args),
        Command::Bench(args) => commands::bench::run(&cli.sysfs, args),
        Command::Report(args) => commands::report::run(&cli.sysfs, args),
        Command::TlsCredentials(args) => commands::credentials::run(args),
        Command::TlsPsk(args) => commands::credentials::run_psk(args),
    };
    match result.and_then(|()| output::flush().map_err(anyhow::Error::from)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => match error.downcast_ref::<output::StdoutError>() {
            Some(stdout) if stdout.is_closed_pipe() => ExitCode::SUCCESS,
            _ => {
                eprintln!("locus: {}", describe(&error));
                ExitCode::FAILURE
            }
        },
    }
}

/// The error and its causes on one line, each cause once: an error whose message already
/// quotes its source (`... (os error 20)`) is not followed by that source again.
fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let line = cause.to_string();
        if text.contains(&line) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&line);
    }
    text
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // fuser logs an error when it unmounts what `umount` already took away (the normal
        // way a mount ends); `locus mount` reports real unmount failures itself.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser::mnt=off"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_cause_already_quoted_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(20);
        let error = anyhow::Error::new(io)
            .context(format!(
                "opening /x/y: {}",
                std::io::Error::from_raw_os_error(20)
            ))
            .context("reading the volume");
        assert_eq!(
            describe(&error),
            "reading the volume: opening /x/y: Not a directory (os error 20)"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(describe(&plain), "outer: inner");
    }
}
