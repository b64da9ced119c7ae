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

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let started = std::time::Instant::now();
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root)
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
