//! Boots one guest under qemu and follows its serial console: every line is echoed to the
//! user, marker lines are parsed into step results, and a deadline kills a hung guest.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::initramfs::{MARKER, STALL_REPORT};

/// How qemu runs the guest's CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// Software emulation: slow but works everywhere, including inside VMs.
    Tcg,
    /// Hardware virtualisation via /dev/kvm: fast when nested KVM works, can hang when not.
    Kvm,
}

#[derive(Debug, Default)]
pub struct StepResult {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The guest's stall report, if the step ran past its limit and was killed.
    pub stall: Option<String>,
}

#[derive(Debug, Default)]
pub struct GuestRun {
    pub steps: BTreeMap<String, StepResult>,
    /// Time from starting qemu to the guest's `ready` marker.
    pub boot_to_ready: Option<Duration>,
    pub setup_failure: Option<String>,
    pub done: bool,
    pub timed_out: bool,
    /// The guest did not reach its `ready` marker within the boot deadline and was killed.
    /// The suite never started, so the caller may boot it again.
    pub boot_stalled: bool,
    pub qemu_stderr: String,
}

#[derive(Debug)]
pub struct Boot<'a> {
    pub label: &'a str,
    pub machine_args: Vec<String>,
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    pub accel: Accel,
    pub timeout: Duration,
    /// Kill a guest that has not reached its `ready` marker after this long.
    pub boot_timeout: Duration,
    pub verbose_kernel: bool,
}

enum Section {
    Console,
    Stdout(String),
    Stderr(String),
    Stall(String),
}

pub fn run(boot: &Boot<'_>) -> Result<GuestRun> {
    let append = if boot.verbose_kernel {
        "console=ttyS0 panic=-1 loglevel=7"
    } else {
        "console=ttyS0 panic=-1 quiet loglevel=1"
    };
    let mut command = Command::new("qemu-system-x86_64");
    match boot.accel {
        Accel::Tcg => command.args(["-accel", "tcg", "-cpu", "max"]),
        Accel::Kvm => command.args(["-accel", "kvm", "-cpu", "host"]),
    };
    command
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ])
        .args(&boot.machine_args)
        .arg("-kernel")
        .arg(boot.kernel)
        .arg("-initrd")
        .arg(boot.initramfs)
        .args(["-append", append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .context("starting qemu-system-x86_64 (install qemu-system-x86)")?;

    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let text = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_owned();
            if sender.send(text).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });

    let deadline = started + boot.timeout;
    let boot_deadline = started + boot.boot_timeout.min(boot.timeout);
    let mut run = GuestRun::default();
    let mut section = Section::Console;
    loop {
        let now = Instant::now();
        if run.boot_to_ready.is_none() && now >= boot_deadline {
            run.boot_stalled = true;
            let _ = child.kill();
            break;
        }
        if now >= deadline {
            run.timed_out = true;
            let _ = child.kill();
            break;
        }
        let wake = if run.boot_to_ready.is_none() {
            boot_deadline
        } else {
            deadline
        };
        match receiver.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(line) => {
                println!("[{}] {line}", boot.label);
                handle_line(&line, &mut run, &mut section, started);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.wait();
    let _ = reader.join();
    run.qemu_stderr = stderr_reader.join().unwrap_or_default();
    Ok(run)
}

fn handle_line(line: &str, run: &mut GuestRun, section: &mut Section, started: Instant) {
    // The marker may follow console noise on the same line (a kernel message without a
    // newline), so look for it anywhere.
    let Some(at) = line.find(MARKER) else {
        match section {
            Section::Console => {}
            Section::Stdout(step) => {
                push_line(&mut run.steps.entry(step.clone()).or_default().stdout, line);
            }
            Section::Stderr(step) => {
                push_line(&mut run.steps.entry(step.clone()).or_default().stderr, line);
            }
            Section::Stall(step) => {
                let report = run.steps.entry(step.clone()).or_default().stall.as_mut();
                push_line(report.expect("a stall report is open"), line);
            }
        }
        return;
    };
    let words: Vec<&str> = line[at + MARKER.len()..].split_whitespace().collect();
    match words.as_slice() {
        ["ready"] => run.boot_to_ready = Some(started.elapsed()),
        ["done"] => run.done = true,
        ["setup-failed", why @ ..] => run.setup_failure = Some(why.join(" ")),
        ["step", name, "begin"] => {
            run.steps.entry((*name).to_owned()).or_default();
            *section = Section::Console;
        }
        ["step", name, "stdout"] => *section = Section::Stdout((*name).to_owned()),
        ["step", name, "stderr"] => *section = Section::Stderr((*name).to_owned()),
        ["step", name, word, ..] if *word == STALL_REPORT.0 => {
            run.steps.entry((*name).to_owned()).or_default().stall = Some(String::new());
            *section = Section::Stall((*name).to_owned());
        }
        ["step", _, word] if *word == STALL_REPORT.1 => *section = Section::Console,
        ["step", name, "end", status] => {
            run.steps.entry((*name).to_owned()).or_default().status = status.parse().ok();
            *section = Section::Console;
        }
        _ => {}
    }
}

fn push_line(buffer: &mut String, line: &str) {
    buffer.push_str(line);
    buffer.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_report_is_kept_apart_from_the_steps_output() {
        let lines = [
            "@@locus-vm ready",
            "@@locus-vm step numa_buffers begin",
            "@@locus-vm step numa_buffers stalled 90",
            "task 93/task/95 numa_buffers State:\tS (sleeping) wchan io_cqring_wait",
            "[<0>] io_cqring_wait+0x1/0x2",
            "@@locus-vm step numa_buffers stall-report-end",
            "Killed",
            "@@locus-vm step numa_buffers stdout",
            "node 0: data intact",
            "@@locus-vm step numa_buffers stderr",
            "@@locus-vm step numa_buffers end 137",
        ];
        let mut run = GuestRun::default();
        let mut section = Section::Console;
        for line in lines {
            handle_line(line, &mut run, &mut section, Instant::now());
        }
        let step = &run.steps["numa_buffers"];
        assert_eq!(step.status, Some(137));
        assert_eq!(step.stdout, "node 0: data intact\n");
        let report = step.stall.as_deref().expect("the report");
        assert!(
            report.starts_with("task 93/task/95 numa_buffers"),
            "{report}"
        );
        assert!(report.ends_with("io_cqring_wait+0x1/0x2\n"), "{report}");
        assert!(!report.contains("Killed"), "{report}");
    }
}
