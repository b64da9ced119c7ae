//! Project automation, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `ci`: the architecture check, `cargo fmt --check`, clippy with warnings as errors, and
//!   every test of the workspace — what `.ci/run` and the README's test command run.
//! - `vm-test`: boots multi-node qemu guests with NVDIMMs and runs locus in them (see
//!   `vm/mod.rs` and docs/testing.md).

mod architecture;
mod vm;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "locus project automation")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Check architecture invariants, formatting, lints, then run every test.
    Ci,
    /// Check the architecture invariants only (dependency direction, where unsafe lives).
    Architecture,
    /// Boot multi-node qemu guests with emulated NVDIMMs and run locus in them.
    VmTest(vm::VmTestArgs),
}

fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.task {
        Task::Ci => ci(&root).map(|()| ExitCode::SUCCESS),
        Task::Architecture => report_architecture(&root).map(|()| ExitCode::SUCCESS),
        Task::VmTest(args) => vm::run(&root, &args),
    }
}

fn ci(root: &Path) -> Result<()> {
    report_architecture(root)?;
    cargo(root, &["fmt", "--all", "--", "--check"])?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    cargo(root, &["test", "--workspace"])?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}

fn report_architecture(root: &Path) -> Result<()> {
    let problems = architecture::check(root)?;
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("architecture: {problem}");
        }
        bail!(
            "{} architecture invariant(s) broken (see ARCHITECTURE.md)",
            problems.len()
        );
    }
    eprintln!("xtask: architecture invariants hold");
    Ok(())
}

/// A cargo command in `root`, with the environment a cargo run by hand would have.
///
/// `cargo xtask` runs this program through `cargo run`, which sets the package variables
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...) to xtask's. A cargo started with them
/// reruns every build script that watches them (ring's does), so the release build CI made
/// just before was compiled again from ring up (90 s here).
fn cargo_command(root: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if is_package_variable(name) {
            command.env_remove(name);
        }
    }
    command
}

/// The variables `cargo run` sets to describe the package it runs.
fn is_package_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
        )
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let started = std::time::Instant::now();
    let status = cargo_command(root)
        .args(args)
        .status()
        .with_context(|| format!("starting cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    eprintln!(
        "xtask: cargo {} took {:.0} s",
        args.first().copied().unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::is_package_variable;

    #[test]
    fn only_the_run_packages_variables_are_dropped() {
        for name in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            assert!(is_package_variable(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_TERM_COLOR",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!is_package_variable(name), "{name}");
        }
    }
}
