//! `cargo xtask vm-test`: boots qemu guests with several NUMA nodes, HMAT, CPU-less memory
//! nodes, NVDIMMs and a NIC on a chosen node, and runs locus inside them.
//!
//! This machine has one NUMA node; the guests are where locality is tested for real. Each
//! topology is a description (`topology.rs`) from which the qemu flags and the expected
//! answers are derived. Without a command, the in-guest suite runs and the host checks its
//! output (`checks.rs`); with `-- COMMAND...`, the command runs in each guest and its exit
//! status is the result.

mod assets;
mod checks;
mod guest;
mod initramfs;
mod topology;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use guest::Accel;
use initramfs::Step;
use topology::VmTopology;

/// Boot multi-node qemu guests with emulated NVDIMMs and run locus in them.
#[derive(Debug, Args)]
pub struct VmTestArgs {
    /// Topology to boot: two-socket, four-node, cxl, or all.
    #[arg(long, default_value = "all")]
    topology: String,

    /// CPU acceleration. TCG works everywhere; KVM is faster where nested KVM works but can
    /// hang where it does not.
    #[arg(long, value_enum, default_value_t = Accel::Tcg)]
    accel: Accel,

    /// Kill a guest that has not powered off after this many seconds.
    #[arg(long, default_value_t = 180)]
    timeout: u64,

    /// Kill a guest that has not reached the start of its suite after this many seconds and
    /// boot it again (a TCG guest on a loaded host occasionally stalls in early boot; a boot
    /// here takes about 10 s).
    #[arg(long, default_value_t = 60)]
    boot_timeout: u64,

    /// How many times to boot a guest whose boot stalled, or whose qemu died before the guest
    /// was ready, before giving up.
    #[arg(long, default_value_t = 3)]
    boot_attempts: u32,

    /// Show all kernel messages on the console (default: emergencies only).
    #[arg(long)]
    verbose_kernel: bool,

    /// List the topologies and exit.
    #[arg(long)]
    list: bool,

    /// Command to run in each guest instead of the in-guest suite (binaries are in /bin).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

struct Outcome {
    topology: &'static str,
    boot_to_ready: Option<Duration>,
    problems: Vec<String>,
    /// Exit status of the user's command, when one was given and it ran to the end.
    command_status: Option<i32>,
}

/// Runs the guests. The exit code is 0 when everything passed; with a command, the first
/// non-zero status the command returned in a guest; otherwise 1.
pub fn run(root: &Path, args: &VmTestArgs) -> Result<ExitCode> {
    if args.list {
        for topology in topology::all() {
            println!("{:<11} {}", topology.name, topology.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let topologies: Vec<VmTopology> = if args.topology == "all" {
        topology::all()
    } else {
        vec![topology::by_name(&args.topology).with_context(|| {
            let names: Vec<&str> = topology::all().iter().map(|t| t.name).collect();
            format!(
                "unknown topology `{}` (known: {}, all)",
                args.topology,
                names.join(", ")
            )
        })?]
    };

    super::cargo(root, &["build", "--release", "--package", "locus"])?;
    let mut binaries = vec![(root.join("target/release/locus"), "locus".to_owned())];
    for (package, test) in GUEST_TESTS {
        binaries.push((build_test(root, package, test)?, (*test).to_owned()));
    }
    for (host_path, name, package) in GUEST_TOOLS {
        let path = Path::new(host_path);
        if path.exists() {
            binaries.push((path.to_owned(), (*name).to_owned()));
        } else {
            eprintln!("vm-test: {host_path} is missing (install {package}); guests get no {name}");
        }
    }

    let work = root.join("target/vm");
    let assets = assets::prepare(&work.join("cache"))?;
    let modules = assets::module_load_order(&assets.kernel.modules_dir, assets::GUEST_MODULES)?;
    let staging = work.join("root");
    let module_names = initramfs::stage(&staging, &assets.busybox, &binaries, &modules)?;
    eprintln!(
        "vm-test: kernel {}, modules {}",
        assets.kernel.version,
        module_names.join(" ")
    );

    let steps = if args.command.is_empty() {
        suite_steps()
    } else {
        vec![Step {
            name: "command".into(),
            argv: args.command.clone(),
            captured: false,
        }]
    };

    let mut outcomes = Vec::new();
    for topology in &topologies {
        let dir = work.join(topology.name);
        fs::create_dir_all(&dir)?;
        let archive = dir.join("initramfs.cpio");
        initramfs::pack(&staging, &archive, topology, &module_names, &steps)?;
        let mut attempt = 1;
        let run = loop {
            let run = boot_once(topology, &dir, &archive, &assets.kernel.vmlinuz, args)?;
            // Before the guest is ready nothing of the suite has run, so a boot that stalled
            // or a qemu that died on its own (TCG has asserted in `iotlb_to_section` here)
            // can be tried again without hiding a test failure.
            let crashed_before_ready =
                run.boot_to_ready.is_none() && !run.done && !run.timed_out && !run.boot_stalled;
            let retry = run.boot_stalled || crashed_before_ready;
            if !retry || attempt >= args.boot_attempts.max(1) {
                break run;
            }
            if run.boot_stalled {
                eprintln!(
                    "vm-test {}: the guest did not reach its suite within {} s (attempt {attempt} of {}); booting it again",
                    topology.name, args.boot_timeout, args.boot_attempts
                );
            } else {
                eprintln!(
                    "vm-test {}: qemu stopped before the guest was ready (attempt {attempt} of {}): {}; booting it again",
                    topology.name,
                    args.boot_attempts,
                    run.qemu_stderr.trim()
                );
            }
            attempt += 1;
        };
        let problems = evaluate(topology, &run, &steps);
        let command_status = run.steps.get("command").and_then(|step| step.status);
        outcomes.push(Outcome {
            topology: topology.name,
            boot_to_ready: run.boot_to_ready,
            problems,
            command_status,
        });
    }

    println!();
    let mut failed = 0;
    for outcome in &outcomes {
        let boot = outcome.boot_to_ready.map_or_else(
            || "never ready".to_owned(),
            |d| format!("boot to command {:.1} s", d.as_secs_f64()),
        );
        if outcome.problems.is_empty() {
            println!("vm-test {:<11} PASS  ({boot})", outcome.topology);
        } else {
            failed += 1;
            println!("vm-test {:<11} FAIL  ({boot})", outcome.topology);
            for problem in &outcome.problems {
                println!("    - {problem}");
            }
        }
    }
    if failed == 0 {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("vm-test: {failed} of {} topologies failed", outcomes.len());
    let command_status = outcomes
        .iter()
        .filter_map(|o| o.command_status)
        .find(|&status| status != 0)
        .and_then(|status| u8::try_from(status).ok());
    Ok(ExitCode::from(command_status.unwrap_or(1)))
}

/// Boots `topology` once on fresh NVDIMM and scratch-disk files, which are removed afterwards.
fn boot_once(
    topology: &VmTopology,
    dir: &Path,
    archive: &Path,
    kernel: &Path,
    args: &VmTestArgs,
) -> Result<guest::GuestRun> {
    let nvdimm_files = fresh_nvdimm_files(dir, topology)?;
    let disk = dir.join("disk.img");
    fs::File::create(&disk)?.set_len(GUEST_DISK_BYTES)?;
    let boot = guest::Boot {
        label: topology.name,
        machine_args: {
            let mut machine = topology.qemu_args(&nvdimm_files);
            machine.extend([
                "-drive".to_owned(),
                format!(
                    "file={},format=raw,if=none,id=scratch,cache=none",
                    disk.display()
                ),
                "-device".to_owned(),
                "virtio-blk-pci,drive=scratch,bus=pci.0".to_owned(),
            ]);
            machine
        },
        kernel,
        initramfs: archive,
        accel: args.accel,
        timeout: Duration::from_secs(args.timeout),
        boot_timeout: Duration::from_secs(args.boot_timeout),
        verbose_kernel: args.verbose_kernel,
    };
    let run = guest::run(&boot);
    for file in nvdimm_files.iter().chain([&disk]) {
        let _ = fs::remove_file(file);
    }
    run
}

/// Size of the guest's scratch disk (sparse on the host).
const GUEST_DISK_BYTES: u64 = 128 << 20;

/// Integration tests (package, test target) that run inside the guests, as `/bin/<test>`.
/// Each must pass on the host too; in a guest it sees a multi-node machine.
const GUEST_TESTS: &[(&str, &str)] = &[
    ("volume", "numa_placement"),
    ("pmem", "dax_devices"),
    ("uring", "numa_buffers"),
    ("locus", "serve_numa"),
];

/// The guest's virtio disk (O_DIRECT needs a real block device; the root is a RAM file system).
const GUEST_DISK: &str = "/dev/vda";

/// Host programs the guest tests use, and their name in the guest's /bin (with the shared
/// libraries they load).
const GUEST_TOOLS: &[(&str, &str, &str)] = &[
    ("/usr/sbin/mke2fs", "mkfs.ext4", "e2fsprogs"),
    ("/usr/bin/nbdcopy", "nbdcopy", "libnbd-bin"),
];

/// Builds one integration test in release mode and returns its executable.
fn build_test(root: &Path, package: &str, test: &str) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo test --release -p {package} --test {test} --no-run");
    let output = std::process::Command::new(cargo)
        .args([
            "test",
            "--release",
            "--package",
            package,
            "--test",
            test,
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    anyhow::ensure!(
        output.status.success(),
        "building test {test} of {package} failed"
    );
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == test
            && let Some(executable) = message["executable"].as_str()
        {
            return Ok(PathBuf::from(executable));
        }
    }
    anyhow::bail!("cargo reported no executable for test {test} of {package}")
}

/// The in-guest suite: what exists today. Later parts add their steps and checks here.
fn suite_steps() -> Vec<Step> {
    let locus = |args: &[&str]| {
        let mut argv = vec!["/bin/locus".to_owned()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv
    };
    vec![
        Step {
            name: "topology".into(),
            argv: locus(&["topology", "--json"]),
            captured: true,
        },
        Step {
            name: "probe".into(),
            argv: locus(&[
                "topology",
                "--json",
                "--probe",
                "--probe-bytes",
                &checks::PROBE_BUFFER_BYTES.to_string(),
                "--probe-loads",
                &checks::PROBE_LOADS.to_string(),
            ]),
            captured: true,
        },
    ]
    .into_iter()
    .chain(GUEST_TESTS.iter().map(|(_, test)| Step {
        name: (*test).to_owned(),
        argv: vec![
            "/bin/env".into(),
            format!("LOCUS_URING_TEST_DEVICE={GUEST_DISK}"),
            "LOCUS_BIN=/bin/locus".into(),
            format!("/bin/{test}"),
            "--test-threads=1".into(),
            "--nocapture".into(),
        ],
        captured: true,
    }))
    .collect()
}

fn evaluate(topology: &VmTopology, run: &guest::GuestRun, steps: &[Step]) -> Vec<String> {
    let mut problems = Vec::new();
    if run.timed_out {
        problems.push("the guest did not finish before the timeout".to_owned());
    }
    if run.boot_stalled {
        problems.push(
            "the guest never reached its suite (its boot stalled on every attempt)".to_owned(),
        );
    }
    if let Some(why) = &run.setup_failure {
        problems.push(format!("guest set-up failed: {why}"));
    }
    if !run.done && !run.timed_out && !run.boot_stalled {
        problems.push(format!(
            "the guest stopped early; qemu said: {}",
            run.qemu_stderr.trim()
        ));
    }
    for step in steps {
        let Some(result) = run.steps.get(&step.name) else {
            if run.setup_failure.is_none() && run.done {
                problems.push(format!("step {} never ran", step.name));
            }
            continue;
        };
        match result.status {
            Some(0) => {}
            Some(status) => problems.push(format!(
                "step {} exited with {status}: {}",
                step.name,
                last_lines(&format!("{}{}", result.stdout, result.stderr), 12)
            )),
            None => problems.push(format!("step {} did not finish", step.name)),
        }
        if result.status != Some(0) {
            continue;
        }
        let found = match step.name.as_str() {
            "topology" => checks::topology_json(topology, &result.stdout),
            "probe" => checks::probe_json(topology, &result.stdout),
            _ => Vec::new(),
        };
        problems.extend(found.into_iter().map(|p| format!("{}: {p}", step.name)));
    }
    problems
}

/// The last `count` lines of `text`, for failure reports.
fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n      ")
}

/// Zero-filled sparse backing files, new for every boot: a stale fs-dax info block from an
/// earlier run would make the kernel claim the namespace before the set-up does.
fn fresh_nvdimm_files(dir: &Path, topology: &VmTopology) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for (index, nvdimm) in topology.nvdimms.iter().enumerate() {
        let path = dir.join(format!("nvdimm{index}.img"));
        let _ = fs::remove_file(&path);
        let file =
            fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        file.set_len(u64::from(nvdimm.size_mib) << 20)?;
        files.push(path);
    }
    Ok(files)
}
