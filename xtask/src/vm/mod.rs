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

    /// How many times to boot a guest that stalled (in early boot, in a step of the suite
    /// that ran past its limit, or as a whole after it was ready) or whose qemu died before
    /// the guest was ready, before giving up. A stalled step's kernel stacks are printed
    /// before the guest is booted again.
    #[arg(long, default_value_t = 3)]
    boot_attempts: u32,

    /// Seconds after which a step counts as stalled: the guest prints the kernel stacks of its
    /// processes and kills it [default: 90 for the suite's steps; none for a COMMAND].
    #[arg(long, value_name = "SECS")]
    stall_after: Option<u32>,

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
    /// Why earlier boots of this topology were given up and the guest booted again.
    retried: Vec<String>,
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

    // The release build as the README and CI make it, then the guest tests in one command
    // over the same default members: cargo unifies dependency features over the packages a
    // command selects, and a test build per package (`-p volume --test ...`, and so on)
    // compiled libc, serde, syn and more again for each selection (141 s in CI, 81 s now).
    super::cargo(root, &["build", "--release"])?;
    let mut binaries = vec![(root.join("target/release/locus"), "locus".to_owned())];
    for (test, executable) in build_tests(root)? {
        binaries.push((executable, test.to_owned()));
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
        suite_steps(args.stall_after.unwrap_or(STEP_STALL_SECS))
    } else {
        vec![Step {
            name: "command".into(),
            argv: args.command.clone(),
            captured: false,
            stall_after: args.stall_after,
        }]
    };

    let mut outcomes = Vec::new();
    for topology in &topologies {
        let dir = work.join(topology.name);
        fs::create_dir_all(&dir)?;
        let archive = dir.join("initramfs.cpio");
        initramfs::pack(&staging, &archive, topology, &module_names, &steps)?;
        let mut attempt = 1;
        let mut retried = Vec::new();
        let run = loop {
            let run = boot_once(topology, &dir, &archive, &assets.kernel.vmlinuz, args)?;
            let Some(why) = stall(&run) else { break run };
            if attempt >= args.boot_attempts.max(1) {
                break run;
            }
            eprintln!(
                "vm-test {}: {why} (attempt {attempt} of {}); booting it again",
                topology.name, args.boot_attempts
            );
            retried.push(format!("boot {attempt}: {why}"));
            attempt += 1;
        };
        let problems = evaluate(topology, &run, &steps);
        let command_status = run.steps.get("command").and_then(|step| step.status);
        outcomes.push(Outcome {
            topology: topology.name,
            boot_to_ready: run.boot_to_ready,
            problems,
            command_status,
            retried,
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
            for why in &outcome.retried {
                println!("    - passed on a later boot; {why}");
            }
        } else {
            failed += 1;
            println!("vm-test {:<11} FAIL  ({boot})", outcome.topology);
            for problem in &outcome.problems {
                println!("    - {problem}");
            }
            for why in &outcome.retried {
                println!("    - {why}");
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

/// Builds the guest's integration tests in release mode, in one cargo command, and returns
/// each test's name and executable, in [`GUEST_TESTS`] order.
fn build_tests(root: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let mut args = vec!["test", "--release", "--no-run", "--message-format=json"];
    for (_, test) in GUEST_TESTS {
        args.extend(["--test", test]);
    }
    eprintln!("xtask: cargo {}", args.join(" "));
    let started = std::time::Instant::now();
    let output = super::cargo_command(root)
        .args(&args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    anyhow::ensure!(output.status.success(), "building the guest's tests failed");
    eprintln!(
        "xtask: cargo test --no-run took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut built = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(package), Some(name), Some(executable)) = (
            message["package_id"].as_str(),
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        built.push((
            package.to_owned(),
            name.to_owned(),
            PathBuf::from(executable),
        ));
    }
    GUEST_TESTS
        .iter()
        .map(|&(package, test)| {
            built
                .iter()
                .find(|(id, name, _)| name == test && package_id_names(id, package))
                .map(|(_, _, executable)| (test, executable.clone()))
                .with_context(|| {
                    format!("cargo reported no executable for test {test} of {package}")
                })
        })
        .collect()
}

/// Whether cargo's package id `id` is the workspace package `package`: a path id ends in
/// `/crates/<package>#<version>`, or in `#<package>@<version>` when the directory name differs.
fn package_id_names(id: &str, package: &str) -> bool {
    let Some((path, rest)) = id.rsplit_once('#') else {
        return false;
    };
    match rest.split_once('@') {
        Some((name, _)) => name == package,
        None => path.rsplit('/').next() == Some(package),
    }
}

/// Seconds after which a step of the in-guest suite counts as stalled by default. The longest step,
/// `serve_numa`, takes about 15 s in a TCG guest here; the guest's own deadline (180 s by
/// default) leaves room for the report and the steps after it.
const STEP_STALL_SECS: u32 = 90;

/// Why a boot is worth repeating, if it is: nothing the suite checks went wrong, the guest
/// or qemu stalled. A boot that never reached `ready`, a qemu that died on its own before
/// it (TCG has asserted in `iotlb_to_section` here), a step the guest's watchdog found
/// stalled (its kernel stacks are in the console output), or a guest that stopped answering
/// after it was ready with no step over its limit (so its watchdog did not run either).
/// A step that fails is never retried.
fn stall(run: &guest::GuestRun) -> Option<String> {
    if run.boot_stalled {
        return Some("the guest did not reach its suite within the boot deadline".to_owned());
    }
    if run.boot_to_ready.is_none() && !run.done && !run.timed_out {
        return Some(format!(
            "qemu stopped before the guest was ready: {}",
            run.qemu_stderr.trim()
        ));
    }
    let failed =
        |step: &guest::StepResult| step.stall.is_none() && step.status.is_some_and(|s| s != 0);
    if run.steps.values().any(failed) {
        return None;
    }
    if let Some((name, _)) = run.steps.iter().find(|(_, step)| step.stall.is_some()) {
        return Some(format!(
            "step {name} stalled and was killed (its kernel stacks are above)"
        ));
    }
    if run.timed_out {
        let running = run.steps.iter().find(|(_, step)| step.status.is_none());
        return Some(match running {
            Some((name, _)) => {
                format!("the guest stopped answering during step {name}, with no stall report")
            }
            None => "the guest stopped answering between steps".to_owned(),
        });
    }
    None
}

/// The in-guest suite: what exists today. Later parts add their steps and checks here.
fn suite_steps(stall_after: u32) -> Vec<Step> {
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
            stall_after: Some(stall_after),
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
            stall_after: Some(stall_after),
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
        stall_after: Some(stall_after),
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
        if let Some(report) = &result.stall {
            problems.push(format!(
                "step {} stalled: still running at its limit, killed; what the guest's tasks waited for:\n      {}",
                step.name,
                last_lines(&waiting_tasks(report), 16)
            ));
            continue;
        }
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

/// The task lines of a stall report (name, state, wait channel), without the stacks.
fn waiting_tasks(report: &str) -> String {
    report
        .lines()
        .filter(|line| line.starts_with("task "))
        .collect::<Vec<_>>()
        .join("\n")
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

#[cfg(test)]
mod tests {
    use super::*;
    use guest::{GuestRun, StepResult};

    fn ready_run(steps: &[(&str, Option<i32>, bool)]) -> GuestRun {
        let mut run = GuestRun {
            boot_to_ready: Some(Duration::from_secs(9)),
            ..GuestRun::default()
        };
        for &(name, status, stalled) in steps {
            let step = StepResult {
                status,
                stall: stalled.then(|| "task 90/task/90 t State: S wchan io_cqring_wait\n".into()),
                ..StepResult::default()
            };
            run.steps.insert(name.to_owned(), step);
        }
        run
    }

    #[test]
    fn package_ids_name_their_workspace_package() {
        let volume = "path+file:///work/main/crates/volume#0.1.0";
        assert!(package_id_names(volume, "volume"));
        assert!(!package_id_names(volume, "vol"));
        assert!(!package_id_names(volume, "pmem"));
        let renamed = "path+file:///work/main/crates/fs-capi#locus-fs@0.1.0";
        assert!(package_id_names(renamed, "locus-fs"));
        assert!(!package_id_names(renamed, "fs-capi"));
        assert!(!package_id_names(
            "registry+https://x/index#libc@0.2.1",
            "volume"
        ));
        assert!(!package_id_names("no hash here", "volume"));
    }

    #[test]
    fn only_stalls_are_worth_another_boot() {
        let mut passed = ready_run(&[("a", Some(0), false), ("b", Some(0), false)]);
        passed.done = true;
        assert_eq!(stall(&passed), None);

        let mut failed = ready_run(&[("a", Some(101), false), ("b", Some(0), false)]);
        failed.done = true;
        assert_eq!(stall(&failed), None, "a failing step is never retried");

        let mut stalled = ready_run(&[("a", Some(0), false), ("b", Some(137), true)]);
        stalled.done = true;
        let why = stall(&stalled).expect("a stalled step is retried");
        assert!(why.contains("step b stalled"), "{why}");

        let mut failed_then_stalled = ready_run(&[("a", Some(1), false), ("b", Some(137), true)]);
        failed_then_stalled.done = true;
        assert_eq!(
            stall(&failed_then_stalled),
            None,
            "a stall does not give a failed step another chance"
        );

        let mut frozen = ready_run(&[("a", Some(0), false), ("b", None, false)]);
        frozen.timed_out = true;
        let why = stall(&frozen).expect("a guest that froze is retried");
        assert!(why.contains("during step b"), "{why}");

        let never_ready = GuestRun {
            boot_stalled: true,
            ..GuestRun::default()
        };
        assert!(stall(&never_ready).is_some());
        let qemu_died = GuestRun {
            qemu_stderr: "assertion failed".into(),
            ..GuestRun::default()
        };
        assert!(stall(&qemu_died).unwrap().contains("assertion failed"));
    }

    #[test]
    fn a_stall_report_names_what_each_task_waits_for() {
        let report = "task 1/task/1 init State: S wchan sigsuspend\n[<0>] sigsuspend+0x77/0xb0\ninterrupts:\n 28: 0 virtio0-req.0\n";
        assert_eq!(
            waiting_tasks(report),
            "task 1/task/1 init State: S wchan sigsuspend"
        );
    }
}
