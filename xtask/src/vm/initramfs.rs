//! The guest's root file system: busybox, the locus binaries with the shared libraries `ldd`
//! lists, the kernel modules, and a generated `/init` that sets the machine up, runs the
//! steps and powers off.
//!
//! Guest → host protocol: lines starting with [`MARKER`] on the serial console.
//! `ready` after set-up; per step `step NAME begin`, `step NAME stdout`, `step NAME stderr`,
//! `step NAME end STATUS` (captured steps) or `step NAME begin` / `step NAME end STATUS`
//! (streamed steps); `setup-failed WHY`; and `done` last. A step with a stall limit that
//! runs past it prints a stall report (see [`STALL_REPORT`]) and is killed, so its end
//! follows with status 137.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::topology::{PmemMode, VmTopology};

pub const MARKER: &str = "@@locus-vm";

/// The guest NIC's address (qemu's user network hands out this one by default).
pub const NIC_ADDRESS: &str = "10.0.2.15";

/// One command the guest runs.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub argv: Vec<String>,
    /// Capture stdout and stderr separately and print them between markers (for steps the
    /// host parses); otherwise the command writes straight to the console.
    pub captured: bool,
    /// Seconds after which the step counts as stalled: the guest prints what its processes
    /// wait for (see [`STALL_REPORT`]) and kills it. `None` lets it run until the guest's
    /// own deadline (a command the user gave may run as long as it likes).
    pub stall_after: Option<u32>,
}

/// Marker words around a stall report: `step NAME stalled SECONDS` opens it, `step NAME
/// stall-report-end` closes it. In between: for every task of every user process its state,
/// wait channel and kernel stack, the virtio lines of `/proc/interrupts`, and the kernel's
/// blocked-task report (sysrq `w`).
pub const STALL_REPORT: (&str, &str) = ("stalled", "stall-report-end");

/// Builds the shared part of the root: busybox, binaries and libraries, modules.
pub fn stage(
    staging: &Path,
    busybox: &Path,
    binaries: &[(PathBuf, String)],
    modules: &[PathBuf],
) -> Result<Vec<String>> {
    if staging.exists() {
        fs::remove_dir_all(staging)?;
    }
    for dir in ["bin", "dev", "proc", "sys", "tmp", "lib/modules", "etc"] {
        fs::create_dir_all(staging.join(dir))?;
    }
    copy_file(busybox, &staging.join("bin/busybox"))?;
    for (binary, name) in binaries {
        let target = staging.join("bin").join(name);
        let status = Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&target)
            .arg(binary)
            .status()
            .context("running strip")?;
        if !status.success() {
            bail!("strip {} failed", binary.display());
        }
        for library in shared_libraries(binary)? {
            let relative = library.strip_prefix("/").unwrap_or(&library);
            let target = staging.join(relative);
            if !target.exists() {
                fs::create_dir_all(target.parent().expect("library path has a parent"))?;
                copy_file(&library, &target)?;
            }
        }
    }
    let mut names = Vec::new();
    for module in modules {
        let name = module
            .file_stem()
            .context("module without a name")?
            .to_string_lossy();
        copy_file(module, &staging.join(format!("lib/modules/{name}.ko")))?;
        names.push(name.into_owned());
    }
    fs::write(staging.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    Ok(names)
}

/// Writes `/init` for `topology` and packs the staged root into a newc cpio archive.
pub fn pack(
    staging: &Path,
    archive: &Path,
    topology: &VmTopology,
    module_names: &[String],
    steps: &[Step],
) -> Result<()> {
    let init = staging.join("init");
    fs::write(&init, init_script(topology, module_names, steps))?;
    set_executable(&init)?;

    let mut files = Vec::new();
    collect(staging, staging, &mut files)?;
    let output =
        fs::File::create(archive).with_context(|| format!("creating {}", archive.display()))?;
    let mut cpio = Command::new("cpio")
        .args(["--quiet", "-o", "-H", "newc", "-R", "0:0"])
        .current_dir(staging)
        .stdin(Stdio::piped())
        .stdout(output)
        .spawn()
        .context("running cpio (install the cpio package)")?;
    {
        let mut stdin = cpio.stdin.take().expect("piped stdin");
        for file in &files {
            writeln!(stdin, "{file}")?;
        }
    }
    let status = cpio.wait()?;
    if !status.success() {
        bail!("cpio failed ({status})");
    }
    Ok(())
}

fn init_script(topology: &VmTopology, module_names: &[String], steps: &[Step]) -> String {
    let mut script = String::new();
    let _ = write!(
        script,
        r#"#!/bin/busybox sh
# Generated by `cargo xtask vm-test` for the {name} topology.
/bin/busybox --install -s /bin
export PATH=/bin HOME=/ RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
# fd 3 stays the console while a step's output goes to files.
exec 3>&1
marker() {{ echo "{MARKER} $*"; }}
fail() {{ marker "setup-failed $*"; marker done; poweroff -f; }}
for module in {modules}; do
    insmod /lib/modules/$module.ko || fail "insmod $module"
done
# Loopback, and the NIC with an address of its own (qemu's user network), so that servers in
# the guest can be reached through it.
ip link set lo up || fail "bringing up lo"
if [ -e /sys/class/net/eth0 ]; then
    ip link set eth0 up && ip addr add {NIC_ADDRESS}/24 dev eth0 || fail "configuring eth0"
fi

# qemu's NVDIMMs have no labels, so the kernel sees raw namespaces without DAX. Give each
# the mode the topology asks for, the way ndctl does it: claim the namespace with the
# region's pfn (fs-dax) or dax (device-DAX) seed device and bind that to its driver.
ND=/sys/bus/nd/devices
convert() {{
    region=$1 mode=$2
    ns=$(ls -d $region/namespace*.0 2>/dev/null | head -n 1)
    [ -n "$ns" ] || return 1
    ns=${{ns##*/}}
    case $mode in
        fsdax) seed=$(cat $region/pfn_seed) driver=nd_pmem ;;
        devdax) seed=$(cat $region/dax_seed) driver=dax_pmem ;;
    esac
    echo $ns > /sys/bus/nd/drivers/nd_pmem/unbind || return 1
    cat /proc/sys/kernel/random/uuid > $ND/$seed/uuid || return 1
    echo pmem > $ND/$seed/mode || return 1
    echo 2097152 > $ND/$seed/align || return 1
    echo $ns > $ND/$seed/namespace || return 1
    echo $seed > /sys/bus/nd/drivers/$driver/bind || return 1
}}
for region in $ND/region*; do
    [ -e "$region" ] || continue
    node=$(cat $region/numa_node)
    case $node in
"#,
        name = topology.name,
        modules = module_names.join(" "),
    );
    for node in 0..topology.nodes.len() as u32 {
        if let Some(mode) = topology.mode_of_node(node) {
            let mode = match mode {
                PmemMode::Fsdax => "fsdax",
                PmemMode::Devdax => "devdax",
            };
            let _ = writeln!(
                script,
                "        {node}) convert $region {mode} || fail \"{mode} set-up of ${{region##*/}}\" ;;"
            );
        }
    }
    script.push_str(
        r#"        *) fail "NVDIMM ${region##*/} on node $node, where the topology has none" ;;
    esac
done
marker ready
# A step still running after its limit has stalled: say what every user process waits for,
# then kill the step so that the rest of the suite runs and the host sees why.
stall_report() {
    name=$1 pid=$2 limit=$3
    marker "step $name stalled $limit"
    for task in /proc/[0-9]*/task/[0-9]*; do
        grep -q '^VmRSS' $task/status 2>/dev/null || continue
        echo "task ${task#/proc/} $(cat $task/comm) $(grep '^State' $task/status) wchan $(cat $task/wchan)"
        cat $task/stack 2>/dev/null
    done
    echo "interrupts:"
    grep -i virtio /proc/interrupts
    echo w > /proc/sysrq-trigger 2>/dev/null
    dmesg | sed -n '/sysrq: Show Blocked State/,$p' | tail -n 80
    marker "step $name stall-report-end"
    kill -9 $pid
}
watch_step() {
    sleep $3
    kill -0 $2 2>/dev/null && stall_report "$@"
}
# Runs a command (its redirections already set by the caller) under a stall limit; 0 means
# none. Returns its status.
run_step() {
    name=$1 limit=$2; shift 2
    if [ "$limit" = 0 ]; then
        "$@"
        return
    fi
    "$@" &
    pid=$!
    watch_step $name $pid $limit >&3 2>&3 &
    watchdog=$!
    wait $pid
    status=$?
    kill $watchdog 2>/dev/null
    return $status
}
step_captured() {
    name=$1 limit=$2; shift 2
    marker "step $name begin"
    run_step $name $limit "$@" > /tmp/step.out 2> /tmp/step.err
    status=$?
    marker "step $name stdout"
    cat /tmp/step.out
    marker "step $name stderr"
    cat /tmp/step.err
    marker "step $name end $status"
}
step_streamed() {
    name=$1 limit=$2; shift 2
    marker "step $name begin"
    run_step $name $limit "$@"
    marker "step $name end $?"
}
"#,
    );
    for step in steps {
        let function = if step.captured {
            "step_captured"
        } else {
            "step_streamed"
        };
        let argv: Vec<String> = step.argv.iter().map(|a| shell_quote(a)).collect();
        let _ = writeln!(
            script,
            "{function} {} {} {}",
            shell_quote(&step.name),
            step.stall_after.unwrap_or(0),
            argv.join(" ")
        );
    }
    script.push_str("marker done\npoweroff -f\n");
    script
}

/// Quotes a word for sh: single quotes, with embedded single quotes spliced in.
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Absolute paths of the shared libraries `ldd` reports for `binary` (the loader included).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // A static binary: ldd says so and fails; it needs no libraries.
        return Ok(Vec::new());
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Relative paths under `root`, each directory before what it contains.
fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let relative = path.strip_prefix(root).expect("under root");
        files.push(format!("./{}", relative.display()));
        if entry.file_type()?.is_dir() {
            collect(root, &path, files)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("a b"), "'a b'");
    }
}
