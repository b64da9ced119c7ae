//! `locus mount` with real programs in separate processes: everyday programs and a pipeline
//! give the same output as on tmpfs, a second `sqlite3` process reads a live WAL database,
//! two processes write disjoint ranges of one file, kill -9 of the server loses no
//! acknowledged write (the mount point answers ENOTCONN, a new mount recovers), and SIGTERM
//! unmounts cleanly.
//!
//! Each test formats its own small volume on /dev/shm and mounts it on a fresh directory
//! with `locus mount --foreground`, started by the test so that it can signal and kill it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn locus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_locus"))
}

/// A formatted volume and a mount point; the server runs while `server` is `Some`.
struct Mount {
    volume: tempfile::TempDir,
    point: tempfile::TempDir,
    server: Option<Child>,
    /// `--transport` of every start, or `writeback`: the default transport with
    /// `--writeback-cache`.
    transport: &'static str,
}

/// Whether the kernel offers FUSE over io_uring (`.ci/run` turns it on).
fn uring_on() -> bool {
    std::fs::read_to_string(mount::URING_SWITCH).is_ok_and(|s| s.trim() == "Y")
}

/// Each test runs once per transport: `/dev/fuse` reads, and FUSE over io_uring when the
/// kernel offers it; those `also_cached` once more on a mount with the write-back cache
/// (module `writeback`). The others count requests the cache saves, or need what a write does to be done when it
/// returns: durable (kill -9), space taken (an unnamed file's blocks), `ENOSPC` or `EFBIG`
/// from the `write` itself (the cache reports them at `fsync` or `close`:
/// `a_full_volume_under_the_write_back_cache_says_so_at_fsync_and_close`).
macro_rules! transports {
    (
        also_cached: [$($cached:ident),* $(,)?],
        uncached_only: [$($uncached:ident),* $(,)?] $(,)?
    ) => {
        transports!(@every [$($cached,)* $($uncached,)*] @cached [$($cached,)*]);
    };
    (@every [$($test:ident,)*] @cached [$($cached:ident,)*]) => {
        mod read {
            $(#[test]
            fn $test() {
                super::$test("read");
            })*
        }
        mod io_uring {
            $(#[test]
            fn $test() {
                if super::uring_on() {
                    super::$test("io-uring");
                } else {
                    eprintln!("skipped: FUSE over io_uring is off ({})", mount::URING_SWITCH);
                }
            })*
        }
        mod writeback {
            $(#[test]
            fn $cached() {
                super::$cached("writeback");
            })*
        }
    };
}

transports!(
    also_cached: [
        everyday_programs_and_pipelines_behave_as_on_tmpfs,
        a_second_sqlite3_process_reads_a_live_wal_database,
        two_processes_write_disjoint_ranges_of_one_file,
        sigterm_unmounts_cleanly_and_the_files_stay,
        sigterm_while_the_mount_point_is_busy_serves_on_until_it_is_free,
        the_volume_opens_right_after_umount,
        the_preload_library_uses_a_running_mount,
        status_and_fsck_beside_a_mount,
        fio_jobs_as_processes_verify_their_data,
        special_files_behave_as_on_tmpfs_and_stay,
        hard_links_behave_as_on_tmpfs_and_stay,
        owners_and_permissions_behave_as_on_tmpfs_and_stay,
        extended_attributes_behave_as_on_tmpfs_and_stay,
        copy_file_range_copies_inside_the_server_as_on_tmpfs,
        fallocate_allocates_as_on_tmpfs_and_stays,
        programs_stored_in_the_mount_run_as_on_tmpfs,
        exchanging_two_names_behaves_as_on_tmpfs_and_stays,
        a_tree_deeper_than_path_max_behaves_as_on_tmpfs,
        a_change_without_cap_fsetid_drops_set_id_bits_as_on_tmpfs,
        posix_acls_behave_as_on_tmpfs_and_stay,
        shared_mappings_are_coherent_and_durable_at_msync,
    ],
    uncached_only: [
        kill_9_of_the_server_loses_no_acknowledged_write,
        scrub_beside_a_mount,
        special_files_and_sizes_past_the_largest_file,
        a_read_only_mount_refuses_every_change,
        the_server_forgets_what_the_kernel_forgets,
        a_missing_name_is_cached_until_something_makes_it,
        a_listing_carries_attributes_and_its_lookups_are_forgotten,
        everyday_programs_on_a_full_mount_fail_cleanly_and_recover,
        a_write_comes_in_requests_of_the_negotiated_size,
        unnamed_files_behave_as_on_tmpfs_and_go_with_a_crash,
        serving_threads_taking_turns_on_one_shared_slot,
        a_file_just_written_shows_its_blocks_as_on_tmpfs,
    ],
);

/// `locus status --json` of the volume in `volume`, parsed.
fn status_json(volume: &Path) -> serde_json::Value {
    let out = locus()
        .args(["status", "--json", "--volume"])
        .arg(volume)
        .output()
        .unwrap();
    serde_json::from_str(&ok(&out, "status --json")).unwrap()
}

/// The volume memory its file system's thread slots hold (`locus status --json`).
fn slot_bytes(volume: &Path) -> u64 {
    status_json(volume)["fs_live"]["slot_bytes"]
        .as_u64()
        .expect("status names the thread slots' memory")
}

/// `python3 -c script dir`, its output piped: a writer in a process of its own.
fn python_in(dir: &Path, script: &str) -> Child {
    Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `umount -l` of a mount point whose server is gone (what a user does after a crash).
fn detach(point: &Path) {
    assert!(
        Command::new("umount")
            .arg("-l")
            .arg(point)
            .status()
            .unwrap()
            .success(),
        "umount -l {}",
        point.display()
    );
}

fn is_mounted(point: &Path) -> bool {
    volume::is_locus_mount(&point.canonicalize().unwrap())
}

/// A fresh directory on /dev/shm with a small volume formatted in it.
fn formatted_volume() -> tempfile::TempDir {
    formatted_volume_with(&[])
}

/// [`formatted_volume`], with more options to `locus format`.
fn formatted_volume_with(options: &[&str]) -> tempfile::TempDir {
    let volume = tempfile::Builder::new()
        .prefix("locus-mount-test")
        .tempdir_in("/dev/shm")
        .unwrap();
    let out = locus()
        .args(["format", "--volume"])
        .arg(volume.path())
        .args(["--emulate", "256M"])
        .args(options)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    volume
}

impl Mount {
    fn new(transport: &'static str) -> Mount {
        Mount::formatted_with(transport, &[])
    }

    /// A mount of a volume formatted with `options` to `locus format`.
    fn formatted_with(transport: &'static str, options: &[&str]) -> Mount {
        let volume = formatted_volume_with(options);
        let point = tempfile::tempdir().unwrap();
        let mut mount = Mount {
            volume,
            point,
            server: None,
            transport,
        };
        mount.start();
        mount
    }

    fn path(&self) -> &Path {
        self.point.path()
    }

    fn start(&mut self) {
        self.start_with(&[]);
    }

    fn start_with(&mut self, options: &[&str]) {
        let (transport, cache) = match self.transport {
            "writeback" => ("auto", Some("--writeback-cache")),
            transport => (transport, None),
        };
        let server = locus()
            .args(["mount", "--foreground", "--volume"])
            .arg(self.volume.path())
            .arg(self.point.path())
            .args(["--transport", transport])
            .args(cache)
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.server = Some(server);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Mounted, and recorded as the volume's server (the preload library and `status`
        // find the mount by that record, written just after the kernel shows the mount).
        let pid = self.server.as_ref().unwrap().id();
        while !(is_mounted(self.path())
            && volume::find_served(self.volume.path()).is_some_and(|s| s.pid == pid))
        {
            if let Some(status) = self.server.as_mut().unwrap().try_wait().unwrap() {
                let mut err = String::new();
                let _ = std::io::Read::read_to_string(
                    self.server.as_mut().unwrap().stderr.as_mut().unwrap(),
                    &mut err,
                );
                panic!("locus mount exited ({status}): {err}");
            }
            assert!(Instant::now() < deadline, "not mounted after 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `bash -c script` in the mount; its stdout (the test fails if it fails).
    fn run(&self, script: &str) -> String {
        let out = Command::new("bash")
            .args(["-c", script])
            .current_dir(self.path())
            .output()
            .unwrap();
        ok(&out, script)
    }

    /// Stops the server cleanly (SIGTERM) and starts it again with `options`.
    fn restart_with(&mut self, options: &[&str]) {
        let (status, stderr) = self.stop();
        assert!(status.success(), "{stderr}");
        self.start_with(options);
    }

    /// `script`'s output, checked to be the same after a restart of the server.
    fn same_after_restart(&mut self, script: &str) -> String {
        let before = self.run(script);
        self.restart_with(&[]);
        assert_eq!(self.run(script), before, "after a restart");
        before
    }

    /// Starts the stopped server: `name` holds `bytes`, and a stop after it is clean with
    /// nothing replayed (the last stop was clean too).
    fn holds_after_a_clean_restart(&mut self, name: &str, bytes: &[u8]) {
        self.start();
        assert_eq!(std::fs::read(self.path().join(name)).unwrap(), bytes);
        let (status, stderr) = self.stop();
        assert!(
            status.success() && !stderr.contains("recovery replayed"),
            "{stderr}"
        );
    }

    /// SIGTERM, then the server's exit and its stderr.
    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let server = self.server.take().expect("running");
        let pid = server.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let out = server.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        if is_mounted(self.path()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

fn ok(output: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Whether the tests run as root (acting as other users, `trusted.` attributes).
fn is_root() -> bool {
    let uid = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&uid.stdout).trim() == "0"
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `script` with `$R` set to a tmpfs directory and to the mount; returns both outputs
/// (stdout and stderr) with the root replaced by `R`.
fn both(mount: &Mount, script: &str) -> (String, String) {
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let run = |root: &Path| {
        let out = Command::new("bash")
            .args(["-c", script])
            .env("R", root)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("TZ", "UTC")
            .current_dir(root)
            .output()
            .unwrap();
        let text = format!(
            "{}{}exit {}\n",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            out.status.code().unwrap_or(-1)
        );
        text.replace(root.to_str().unwrap(), "R")
    };
    (run(tmp.path()), run(mount.path()))
}

/// Runs `scripts/full.sh` (the preload library's test runs it too) in `dir`: its stdout and
/// stderr.
fn full_script(dir: &Path) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(include_str!("../../preload/tests/scripts/full.sh"))
        .arg("full.sh")
        .arg(dir)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A size-limited tmpfs, mounted for the life of the value (root only).
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn new(size: &str) -> SmallTmpfs {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        ok(&out, "mount -t tmpfs");
        SmallTmpfs(dir)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// The server's request counters, from its status file.
fn fuse_counters(mount: &Mount) -> serde_json::Value {
    let text = std::fs::read_to_string(mount.path().join(mount::STATUS_NAME)).unwrap();
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    status["fuse"].clone()
}

/// A write, a truncation or an `O_TRUNC` open by a process without `CAP_FSETID` clears the
/// set-user-ID bit, and the set-group-ID bit when group execution is on; with the
/// capability they stay — as on tmpfs, and seen by `stat` at once (the kernel keeps no
/// attributes of such files).
fn a_change_without_cap_fsetid_drops_set_id_bits_as_on_tmpfs(transport: &'static str) {
    if !is_root() {
        eprintln!("skipped: dropping CAP_FSETID from a child (setpriv) needs root");
        return;
    }
    let mount = Mount::new(transport);
    let script = r#"
        without() { setpriv --bounding-set -fsetid --inh-caps -fsetid "$@"; }
        for m in 6775 6745 4700 2755; do
            f=f$m; echo a > $f
            chmod $m $f; without sh -c "echo b >> $f"; w=$(stat -c %a $f)
            chmod $m $f; without truncate -s 1 $f; t=$(stat -c %a $f)
            chmod $m $f; without sh -c "echo c > $f"; o=$(stat -c %a $f)
            chmod $m $f; echo d >> $f; r=$(stat -c %a $f)
            echo "$m: write $w, truncate $t, O_TRUNC $o, with CAP_FSETID $r; $(cat $f | tr '\n' ' ')"
        done
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("6775: write 775, truncate 775, O_TRUNC 775, with CAP_FSETID 6775; c d")
            && tmpfs.contains("6745: write 2745"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
}

/// Requests the server has served so far, by its status file (reading it costs a few).
fn requests_served(mount: &Mount) -> u64 {
    let fuse = fuse_counters(mount);
    fuse["dev_requests"].as_u64().unwrap()
        + fuse["queue_requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>()
}

/// A name looked up and missing is remembered by the kernel (the server answers with a
/// negative entry), so probing it again costs no request; and every way of making the name
/// — create, mkdir, rename onto it, symlink, another process's shell — is seen at once.
fn a_missing_name_is_cached_until_something_makes_it(transport: &'static str) {
    let mount = Mount::new(transport);
    let at = |name: &str| mount.path().join(name);
    let missing = |name: &str| matches!(std::fs::symlink_metadata(at(name)), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    let before = requests_served(&mount);
    let answered = fuse_counters(&mount)["missing_names"].as_u64().unwrap();
    for _ in 0..1000 {
        assert!(missing("absent"));
    }
    let spent = requests_served(&mount) - before;
    assert!(
        spent < 100,
        "1,000 looks at a missing name cost {spent} requests"
    );
    assert!(fuse_counters(&mount)["missing_names"].as_u64().unwrap() > answered);

    std::fs::write(at("absent"), b"made").unwrap();
    assert_eq!(std::fs::read(at("absent")).unwrap(), b"made");
    std::fs::remove_file(at("absent")).unwrap();
    assert!(missing("absent"));

    assert!(missing("dir"));
    std::fs::create_dir(at("dir")).unwrap();
    assert!(at("dir").is_dir());

    std::fs::write(at("source"), b"moved").unwrap();
    assert!(missing("dir/target"));
    std::fs::rename(at("source"), at("dir/target")).unwrap();
    assert_eq!(std::fs::read(at("dir/target")).unwrap(), b"moved");
    assert!(missing("source"));

    assert!(missing("link"));
    std::os::unix::fs::symlink("dir/target", at("link")).unwrap();
    assert_eq!(std::fs::read(at("link")).unwrap(), b"moved");

    assert!(missing("shell"));
    let out = Command::new("sh")
        .arg("-c")
        .arg("echo made by another process > shell")
        .current_dir(mount.path())
        .output()
        .unwrap();
    ok(&out, "sh");
    assert_eq!(
        std::fs::read_to_string(at("shell")).unwrap(),
        "made by another process\n"
    );
}

/// A tree deeper than `PATH_MAX` (4096 bytes), made one `cd` at a time as programs make
/// them: the server turns each request into a path from the root longer than any one
/// system call's argument, and the file system takes it (24 levels of 200-byte names).
fn a_tree_deeper_than_path_max_behaves_as_on_tmpfs(transport: &'static str) {
    let mount = Mount::new(transport);
    let script = r#"
        set -e
        for i in $(seq 10 33); do n=$(printf "%0200d" $i); mkdir $n; cd -P $n; done
        echo "at the bottom" > file
        mv file moved && ln -s moved link && cat link && ls
        cd "$R" && find . -name moved | wc -c
        rm -r "$R"/0*
        ls "$R" | wc -l
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("at the bottom") && tmpfs.contains("exit 0"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
}

/// Dropping the kernel's caches is machine-wide: the tests that do it take turns, or one's
/// table would shrink (or its counts grow) while another looks at it.
static DROPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Drops the kernel's dentries and inodes (it then forgets what it held) and waits until
/// the server's table is back near the root; `false` when /proc cannot be written.
fn forget_all(mount: &Mount) -> bool {
    if std::fs::write("/proc/sys/vm/drop_caches", "2").is_err() {
        return false;
    }
    let known = || fuse_counters(mount)["known_inodes"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while known() > 10 {
        assert!(Instant::now() < deadline, "{} inodes still known", known());
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A listing hands the kernel each entry's attributes (`READDIRPLUS`): `ls -l` of 2,000
/// files the kernel has forgotten costs far fewer requests than one lookup per file (not
/// counting its security-label and ACL checks: with ACLs on, a file's access ACL is read
/// once, then the kernel keeps it), what
/// it lists is right, the files are usable by name after, and the lookups the listing gave
/// the kernel are forgotten with the rest.
fn a_listing_carries_attributes_and_its_lookups_are_forgotten(transport: &'static str) {
    let _one_at_a_time = DROPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mount = Mount::new(transport);
    let dir = mount.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..2000 {
        std::fs::write(dir.join(format!("f{i:04}")), "x".repeat(i % 7)).unwrap();
    }
    if !forget_all(&mount) {
        eprintln!("skipped: /proc/sys/vm/drop_caches is not writable");
        return;
    }
    let xattr_requests = || fuse_counters(&mount)["xattr_requests"].as_u64().unwrap();
    let (before, xattrs_before) = (requests_served(&mount), xattr_requests());
    let out = Command::new("ls")
        .args(["-l", "--time-style=+"])
        .arg(&dir)
        .output()
        .unwrap();
    let xattrs = xattr_requests() - xattrs_before;
    let spent = requests_served(&mount) - before - xattrs;
    let listing = ok(&out, "ls -l");
    let sizes: Vec<&str> = listing
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(4).unwrap())
        .collect();
    let expected: Vec<String> = (0..2000).map(|i| (i % 7).to_string()).collect();
    assert_eq!(sizes, expected, "ls -l lists each file with its size");
    assert!(
        spent < 1000,
        "ls -l of 2,000 forgotten files cost {spent} requests (and {xattrs} for attributes)"
    );
    // The security label (which the kernel cannot cache), and the ACL when kept.
    let per_file = if fuse_counters(&mount)["acl"] == true {
        2
    } else {
        1
    };
    assert!(
        xattrs <= 2000 * per_file + 10,
        "{xattrs} attribute requests for 2,000 files: {per_file} each"
    );
    // Usable by name while the kernel holds what the listing gave it.
    assert_eq!(
        std::fs::read_to_string(dir.join("f0006")).unwrap(),
        "xxxxxx"
    );
    std::fs::rename(dir.join("f0001"), dir.join("moved")).unwrap();
    std::fs::remove_file(dir.join("f0002")).unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("moved")).unwrap(), "x");
    assert!(fuse_counters(&mount)["known_inodes"].as_u64().unwrap() > 1990);
    // Every lookup the listing gave is forgotten again: no inode is left behind.
    assert!(forget_all(&mount));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1999);
    assert_eq!(std::fs::read_to_string(dir.join("f1999")).unwrap(), "xxxx");
}

/// The server keeps a name for each inode the kernel holds, and lets it go when the kernel
/// forgets the inode: after the kernel's caches are dropped the table is back to the root,
/// and the files are found again by name — also below a directory renamed meanwhile.
fn the_server_forgets_what_the_kernel_forgets(transport: &'static str) {
    let _one_at_a_time = DROPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mount = Mount::new(transport);
    let known = || fuse_counters(&mount)["known_inodes"].as_u64().unwrap();
    let dir = mount.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..2000 {
        std::fs::write(dir.join(format!("f{i}")), i.to_string()).unwrap();
    }
    assert!(known() > 2000, "{}", known());
    // Dropping dentries and inodes makes the kernel send its forgets (root only).
    if !forget_all(&mount) {
        eprintln!("skipped the forgetting half: /proc/sys/vm/drop_caches is not writable");
        return;
    }
    std::fs::rename(&dir, mount.path().join("e")).unwrap();
    let moved = mount.path().join("e");
    assert_eq!(std::fs::read_dir(&moved).unwrap().count(), 2000);
    assert_eq!(
        std::fs::read_to_string(moved.join("f1999")).unwrap(),
        "1999"
    );
    std::fs::remove_file(moved.join("f7")).unwrap();
    assert!(!moved.join("f7").exists());
    assert_eq!(std::fs::read_to_string(moved.join("f8")).unwrap(), "8");
}

/// The server's pid, from the record the mount keeps in its volume directory.
fn served_pid(volume: &Path) -> u32 {
    let record = std::fs::read_to_string(volume.join(volume::SERVED_FILE)).unwrap();
    record.lines().next().unwrap().parse().unwrap()
}

/// `locus mount` without --foreground, as a user runs it: a directory that holds no volume
/// is refused before anything is made there; the command returns once mounted; a second
/// mount on the same point is refused and leaves the first serving; after kill -9 of the
/// server the dead mount point is named with `umount -l`, and once detached a new mount
/// recovers and says what it replayed; `umount` stops the server cleanly.
#[test]
fn a_background_mount_refuses_what_it_cannot_serve() {
    let volume = formatted_volume();
    let point = tempfile::tempdir().unwrap();
    // A failing assertion must not leave a background server behind: detaching its mount
    // point makes it stop.
    struct Detach<'a>(&'a Path);
    impl Drop for Detach<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .stderr(Stdio::null())
                .status();
        }
    }
    let _detach = Detach(point.path());
    let mount = |dir: &Path| {
        locus()
            .args(["mount", "--volume"])
            .arg(dir)
            .arg(point.path())
            .output()
            .unwrap()
    };
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let absent = volume.path().join("absent");
    let out = mount(&absent);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no volume at") && stderr(&out).contains("locus format"),
        "{}",
        stderr(&out)
    );
    assert!(!absent.exists(), "nothing is made where no volume is");

    let out = mount(volume.path());
    ok(&out, "locus mount");
    assert!(stderr(&out).contains("mounted"), "{}", stderr(&out));
    assert!(is_mounted(point.path()));
    let first = served_pid(volume.path());
    std::fs::write(point.path().join("kept"), b"written before the kill").unwrap();

    let out = mount(volume.path());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("already has a locus file system mounted"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        served_pid(volume.path()),
        first,
        "the first server still serves"
    );
    // A command that needs the volume to itself names the mount and what frees it (scrub
    // goes through the mount: `scrub_beside_a_mount`).
    let out = locus()
        .args(["format", "--emulate", "64M", "--force", "--volume"])
        .arg(volume.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(
        said.contains(&format!("served by `locus mount` (pid {first})"))
            && said.contains(&format!("umount {}", point.path().display())),
        "{said}"
    );
    assert_eq!(
        std::fs::read(point.path().join("kept")).unwrap(),
        b"written before the kill"
    );

    assert!(
        Command::new("kill")
            .args(["-KILL", &first.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(point.path()).is_ok() {
        assert!(Instant::now() < deadline, "the mount outlived its server");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = mount(volume.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("umount -l"), "{}", stderr(&out));

    detach(point.path());
    let out = mount(volume.path());
    ok(&out, "locus mount after the kill");
    assert!(
        stderr(&out).contains("recovery replayed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(point.path().join("kept")).unwrap(),
        b"written before the kill"
    );
    let second = served_pid(volume.path());
    assert!(
        Command::new("umount")
            .arg(point.path())
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{second}")).exists() {
        assert!(Instant::now() < deadline, "the server outlived umount");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = std::fs::read_to_string(volume.path().join("locus-mount.log")).unwrap();
    assert!(
        log.trim_end()
            .ends_with(&format!("unmounted {}", point.path().display())),
        "{log}"
    );
}

/// Over io_uring a request is served on the CPU that made it: the writes of a process pinned
/// to one CPU all come from that CPU's queue, and no queue's request is served on another CPU.
#[test]
fn io_uring_serves_each_request_on_the_cpu_that_made_it() {
    if !uring_on() {
        eprintln!(
            "skipped: FUSE over io_uring is off ({})",
            mount::URING_SWITCH
        );
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 || !have("taskset") {
        eprintln!("skipped: needs two CPUs and taskset");
        return;
    }
    let mount = Mount::new("io-uring");
    let before = fuse_counters(&mount);
    assert_eq!(before["io_uring"], true, "{before}");
    let cpu = cpus - 1;
    let out = Command::new("taskset")
        .args([
            "-c",
            &cpu.to_string(),
            "dd",
            "if=/dev/zero",
            "bs=4096",
            "count=2000",
        ])
        .arg(format!("of={}", mount.path().join("pinned").display()))
        .output()
        .unwrap();
    ok(&out, "dd");
    let after = fuse_counters(&mount);
    let count = |v: &serde_json::Value, q: usize| v["queue_requests"][q].as_u64().unwrap();
    let delta: Vec<u64> = (0..cpus)
        .map(|q| count(&after, q) - count(&before, q))
        .collect();
    assert!(
        delta[cpu] >= 2000,
        "2000 writes made on CPU {cpu}: {delta:?}"
    );
    let other: u64 = delta
        .iter()
        .enumerate()
        .filter(|&(q, _)| q != cpu)
        .map(|(_, n)| n)
        .sum();
    // Only this test's own look-ups of the status file may come from elsewhere.
    assert!(other < 50, "requests from other CPUs: {delta:?}");
    assert_eq!(
        after["served_elsewhere"], 0,
        "every queue's requests are served on its own CPU: {after}"
    );
    assert_eq!(
        std::fs::metadata(mount.path().join("pinned"))
            .unwrap()
            .len(),
        2000 * 4096
    );
}

fn everyday_programs_and_pipelines_behave_as_on_tmpfs(transport: &'static str) {
    for program in ["git", "rsync", "tar", "sqlite3", "python3"] {
        assert!(
            have(program),
            "{program} is not installed (.ci/run installs it)"
        );
    }
    let mount = Mount::new(transport);
    let script = r#"
        set -u
        export GIT_AUTHOR_DATE='2026-01-02T03:04:05Z' GIT_COMMITTER_DATE='2026-01-02T03:04:05Z'
        export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
        mkdir -p src/a/b && printf 'one\ntwo\nthree\n' > src/a/f && seq 1 5000 > src/a/b/n
        ln -s a/f src/link && ln -s missing src/dangling
        touch -d '2025-05-06 07:08:09' src/a/f
        # a pipeline with the mount in both stages (two processes)
        cat src/a/b/n | sort -n -r | head -3 > top && cat top
        sort -o src/a/f src/a/f && cat src/a/f
        sed -i 's/two/TWO/' src/a/f && cat src/a/f && touch -d '2025-05-06 07:08:09' src/a/f
        tar -cf t.tar src && mkdir x && tar -xf t.tar -C x && tar -df t.tar -C x && echo tar same
        rsync -a src/ copy/ && diff -r --no-dereference src copy && echo rsync same
        stat -c '%n %s %Y %F' copy/a/f && stat -c '%n %s %F' copy/link
        readlink copy/link copy/dangling
        git init -q repo && cd repo && cp ../src/a/b/n . && git add n && git commit -qm first
        git log --format='%H %s' && git status --short && cd ..
        python3 -c 'import shutil; shutil.copytree("src", "py", symlinks=True); print("copytree ok")'
        find . -path ./repo/.git -prune -o -print | sort | head -40
        rm -r x copy && ls
        df -P . | tail -1 | awk '{print ($2 > 0)}'
    "#;
    let (expected, got) = both(&mount, script);
    assert_eq!(got, expected);
    assert!(
        expected.contains("rsync same") && expected.ends_with("exit 0\n"),
        "{expected}"
    );
}

fn a_second_sqlite3_process_reads_a_live_wal_database(transport: &'static str) {
    assert!(have("sqlite3") && have("python3"));
    let mount = Mount::new(transport);
    let db = mount.path().join("w.db");
    let writer = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
db.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)")
print("ready", flush=True)
for i in range(150):
    db.execute("BEGIN")
    db.executemany("INSERT INTO t(v) VALUES (?)", [("x" * 50,)] * 100)
    db.execute("COMMIT")
print("done", flush=True)
"#;
    let mut w = Command::new("python3")
        .args(["-c", writer])
        .arg(&db)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // Another process reads while the writer commits: whole transactions only.
    let mut counts = Vec::new();
    loop {
        // A reader may meet a lock while the writer checkpoints the WAL: wait as users do.
        let out = Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000"])
            .arg(&db)
            .arg("SELECT count(*) FROM t;")
            .output()
            .unwrap();
        let n: u64 = ok(&out, "reader sqlite3").trim().parse().unwrap();
        assert_eq!(n % 100, 0, "a reader saw part of a transaction");
        counts.push(n);
        if n == 15_000 || counts.len() > 2000 {
            break;
        }
    }
    assert_eq!(lines.next().unwrap().unwrap(), "done");
    assert!(w.wait().unwrap().success());
    let out = Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA journal_mode; SELECT count(*) FROM t; PRAGMA integrity_check;")
        .output()
        .unwrap();
    assert_eq!(ok(&out, "final sqlite3"), "wal\n15000\nok\n");
}

/// Writes `count` 4 KiB records of `tag` at `stride`-spaced offsets, printing each index once
/// its `pwrite` returned.
const WRITER: &str = r#"
import os, sys
path, tag, first, count, stride = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
for i in range(first, first + count):
    block = (tag + b"%08d" % i) * (4096 // (len(tag) + 8))
    block = block.ljust(4096, b".")
    os.pwrite(fd, block, i * stride * 4096)
    print(i, flush=True)
"#;

/// Spawns `command` with piped stdin and stdout and returns it once its first line, which
/// must be `line`, says it holds what it was started to hold (it then waits on its stdin).
fn spawned_until(mut command: Command, line: &str) -> Child {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said, line);
    child
}

fn record(tag: &str, i: u64) -> Vec<u8> {
    let unit = format!("{tag}{i:08}");
    let mut block = unit.repeat(4096 / unit.len()).into_bytes();
    block.resize(4096, b'.');
    block
}

fn two_processes_write_disjoint_ranges_of_one_file(transport: &'static str) {
    let mount = Mount::new(transport);
    let file = mount.path().join("shared");
    // 1000 blocks: the even ones written by one process, the odd ones by another.
    let mut children = Vec::new();
    for (tag, parity) in [("even", 0u64), ("odd-", 1u64)] {
        let script = format!(
            "import os,sys\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o644)\n\
             for i in range({parity},1000,2):\n    u=('{tag}'+'%08d'%i).encode()\n    \
             b=(u*(4096//len(u))).ljust(4096,b'.')\n    os.pwrite(fd,b,i*4096)\n"
        );
        children.push(
            Command::new("python3")
                .args(["-c", &script])
                .arg(&file)
                .spawn()
                .unwrap(),
        );
    }
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len(), 1000 * 4096);
    for i in 0..1000u64 {
        let tag = if i % 2 == 0 { "even" } else { "odd-" };
        let at = (i * 4096) as usize;
        assert!(data[at..at + 4096] == record(tag, i)[..], "block {i}");
    }
}

fn kill_9_of_the_server_loses_no_acknowledged_write(transport: &'static str) {
    kill_9_loses_no_acknowledged_write(&mut Mount::new(transport), transport);
}

/// Two writers of 4 KiB records in `mount`, the server killed with SIGKILL 1.5 s in: after a
/// restart every record a writer acknowledged is there.
fn kill_9_loses_no_acknowledged_write(mount: &mut Mount, transport: &str) {
    let files: Vec<PathBuf> = (0..2).map(|i| mount.path().join(format!("f{i}"))).collect();
    let mut writers: Vec<Child> = files
        .iter()
        .map(|file| {
            Command::new("python3")
                .args(["-c", WRITER])
                .arg(file)
                .args(["rec", "0", "100000", "1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let readers: Vec<_> = writers
        .iter_mut()
        .map(|w| {
            let out = w.stdout.take().unwrap();
            std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(Result::ok)
                    .filter_map(|l| l.parse::<u64>().ok())
                    .last()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let mut server = mount.server.take().unwrap();
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    let acknowledged: Vec<Option<u64>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    for mut w in writers {
        let _ = w.wait();
    }
    // The mount point is still there, without its server.
    // (Over io_uring a request that meets the queues' teardown is answered ECONNABORTED, or
    // ECANCELED when the kernel cancels its queue entry.)
    let err = std::fs::metadata(mount.path().join("f0")).unwrap_err();
    let expected: &[i32] = if transport == "io-uring" {
        &[libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED]
    } else {
        &[libc::ENOTCONN]
    };
    assert!(expected.contains(&err.raw_os_error().unwrap_or(0)), "{err}");
    detach(mount.path());
    // The dead server's record is stale: status opens the volume itself (and recovers in
    // DRAM only, changing nothing).
    assert!(mount.volume.path().join("locus.mounted").exists());
    let report = status_json(mount.volume.path());
    assert!(report.get("served_by").is_none(), "{report}");
    assert_eq!(report["fs"]["state"], "present", "{report}");
    mount.start();
    for (file, last) in files.iter().zip(acknowledged) {
        let last = last.expect("the writer acknowledged some records before the kill");
        let data = std::fs::read(file).unwrap();
        assert!(
            data.len() as u64 >= (last + 1) * 4096,
            "{}: short",
            file.display()
        );
        for i in 0..=last {
            let at = (i * 4096) as usize;
            assert!(
                data[at..at + 4096] == record("rec", i)[..],
                "{}: acknowledged record {i} of {last} lost",
                file.display()
            );
        }
    }
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("recovery replayed"), "{stderr}");
}

/// Shared mappings of a file in the mount, in two processes: each sees the other's stores
/// and `write(2)`s, `read(2)` sees the stores, and what `msync` returned for survives
/// `kill -9` of the server, as on a kernel file system after a crash of its machine.
fn shared_mappings_are_coherent_and_durable_at_msync(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let file = mount.path().join("mapped");
    let mut mapper = Command::new("python3")
        .args(["-c", MAPPER])
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(mapper.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != "synced" {
        let _ = mapper.kill();
        let out = mapper.wait_with_output().unwrap();
        panic!(
            "the mapping process failed: {line}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The mapping is still held (not unmapped, so nothing is written back at munmap).
    let mut server = mount.server.take().unwrap();
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    let _ = mapper.kill();
    let _ = mapper.wait();
    detach(mount.path());
    mount.start();
    let mut expected = vec![0u8; 16 * 4096];
    expected[..8 * 4096].fill(b'A');
    expected[9 * 4096..10 * 4096].fill(b'W');
    expected[10 * 4096..11 * 4096].fill(b'V');
    expected[12 * 4096..14 * 4096].fill(b'M');
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len(), expected.len());
    for (page, (got, want)) in data.chunks(4096).zip(expected.chunks(4096)).enumerate() {
        assert!(
            got == want,
            "page {page} after the kill: {:?}.. where msync had returned for {:?}..",
            &got[..4],
            &want[..4]
        );
    }
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
}

/// Maps `argv[1]` (16 pages) shared, stores 'A' in its first 8 pages, has another process
/// check them through `read(2)` and a mapping of its own, then `pwrite` 'W' into page 9 and
/// store 'V' into page 10 through its mapping; checks that its own mapping sees both,
/// stores 'M' into pages 12 and 13, `msync`s, prints "synced" and holds the mapping until
/// its stdin closes. (The other process's exit closes its handle, which makes the kernel
/// write back every dirty page of the file then; the 'M' pages, stored after, reach the
/// server only by the `msync`.)
const MAPPER: &str = r#"
import mmap, os, subprocess, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"\0" * 16 * 4096)
m = mmap.mmap(fd, 16 * 4096, mmap.MAP_SHARED)
m[0:8 * 4096] = b"A" * 8 * 4096
other = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
got = os.pread(fd, 8 * 4096, 0)
assert got == b"A" * 8 * 4096, "read(2) of another process: %r" % got[:8]
m = mmap.mmap(fd, 16 * 4096, mmap.MAP_SHARED)
assert m[0:8 * 4096] == b"A" * 8 * 4096, "another mapping: %r" % m[0:8]
os.pwrite(fd, b"W" * 4096, 9 * 4096)
m[10 * 4096:11 * 4096] = b"V" * 4096
m.flush()
"""
subprocess.run([sys.executable, "-c", other, path], check=True)
assert m[9 * 4096:10 * 4096] == b"W" * 4096, "write(2) through the mapping: %r" % m[9 * 4096:9 * 4096 + 8]
assert m[10 * 4096:11 * 4096] == b"V" * 4096, "the other mapping: %r" % m[10 * 4096:10 * 4096 + 8]
m[12 * 4096:14 * 4096] = b"M" * 2 * 4096
m.flush()
print("synced", flush=True)
sys.stdin.read()
"#;

/// `--writeback-cache`: the kernel keeps small writes (256 of 4 KiB reach the server as a
/// handful of requests, none before `fsync`), `fsync` and `close` send what it kept, and what
/// they returned for survives `kill -9` of the server. A write covering part of a page the
/// kernel no longer caches makes it read the page through a write-only handle (the server
/// opens such files for reading too). The status file and the server's log say which mode
/// runs, and as root the kernel's strict dirty limit for the mount is lifted.
#[test]
fn the_write_back_cache_keeps_writes_until_fsync_or_close() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let mut mount = Mount::new("writeback");
    let fuse = fuse_counters(&mount);
    assert_eq!(fuse["writeback_cache"], true, "{fuse}");
    assert_eq!(fuse["direct_io"], false, "{fuse}");
    let writes = |mount: &Mount| fuse_counters(mount)["write_requests"].as_u64().unwrap();
    let path = mount.path().join("f");
    let before = writes(&mount);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    for i in 0..256 {
        file.write_at(&record("a", i), i * 4096).unwrap();
    }
    let held = writes(&mount) - before;
    assert!(held <= 16, "{held} write requests for 256 cached writes");
    file.sync_all().unwrap();
    let synced = writes(&mount) - before;
    assert!(synced > held, "fsync sent nothing ({synced} requests)");
    assert!(
        synced <= 64,
        "{synced} write requests for 1 MiB written back"
    );
    // Clean pages dropped: the next write, 100 bytes into block 3, reads the rest of it.
    let drop_cache = Command::new("python3")
        .args([
            "-c",
            "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); \
             os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
        ])
        .arg(&path)
        .output()
        .unwrap();
    ok(&drop_cache, "posix_fadvise(DONTNEED)");
    file.write_at(&[b'#'; 100], 3 * 4096 + 5).unwrap();
    for i in 256..512 {
        file.write_at(&record("b", i), i * 4096).unwrap();
    }
    drop(file); // close: the kernel writes the file's dirty pages back first
    if is_root() {
        let dev = std::fs::metadata(mount.path()).unwrap().dev();
        let strict = format!(
            "/sys/class/bdi/{}:{}/strict_limit",
            libc::major(dev),
            libc::minor(dev)
        );
        assert_eq!(
            std::fs::read_to_string(&strict).unwrap().trim(),
            "0",
            "{strict}"
        );
    }
    let mut server = mount.server.take().unwrap();
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    detach(mount.path());
    mount.start();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len(), 512 * 4096);
    for i in 0..512u64 {
        let mut expected = record(if i < 256 { "a" } else { "b" }, i);
        if i == 3 {
            expected[5..105].fill(b'#');
        }
        let at = (i * 4096) as usize;
        assert!(data[at..at + 4096] == expected[..], "block {i}");
    }
    let status = locus()
        .args(["status", "--volume"])
        .arg(mount.volume.path())
        .output()
        .unwrap();
    let said = ok(&status, "locus status beside the mount");
    assert!(
        said.contains("through the kernel's write-back cache (durable once written back"),
        "{said}"
    );
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("write-back cache: writes are durable at fsync, msync or close"),
        "{stderr}"
    );
}

/// A full volume under `--writeback-cache`: the kernel takes writes into its cache, so a
/// program learns of `ENOSPC` at `fsync` or `close` (as on other write-back file systems) —
/// dd with `conv=fsync`, dd closing its output and Python's `os.fsync` each fail naming it —
/// what was there before stays whole, and once the fillers are removed the space is back and
/// writes succeed again.
#[test]
fn a_full_volume_under_the_write_back_cache_says_so_at_fsync_and_close() {
    let mount = Mount::new("writeback");
    let script = r#"
        set -u
        nospace() { grep -q 'No space left on device' && echo "$1: no space" || echo "$1: ?"; }
        avail() { df -k --output=avail . | tail -n 1 | tr -d ' '; }
        seq 1 5000 > text
        before=$(avail)
        dd if=/dev/urandom of=fill1 bs=1M count=400 conv=fsync status=none 2>&1 | nospace "dd conv=fsync"
        dd if=/dev/urandom of=fill2 bs=1M count=16 status=none 2>&1 | nospace "dd close"
        python3 -c 'import os; fd = os.open("fill3", os.O_WRONLY | os.O_CREAT); os.write(fd, b"x" * (16 << 20)); os.fsync(fd)' 2>&1 | nospace "fsync"
        echo "text $(md5sum < text | cut -c1-8)"
        rm -f fill1 fill2 fill3
        for _ in $(seq 100); do [ $(( $(avail) + 2048 >= before )) = 1 ] && break; sleep 0.1; done
        echo "space back: $(( $(avail) + 2048 >= before ))"
        dd if=/dev/urandom of=after bs=1M count=16 conv=fsync status=none && echo "dd after: ok"
    "#;
    assert_eq!(
        mount.run(script),
        "dd conv=fsync: no space\ndd close: no space\nfsync: no space\ntext a5a208cd\n\
         space back: 1\ndd after: ok\n"
    );
}

/// SIGTERM while a process holds a file open in the mount: the server says the mount point
/// is busy and serves on — the holder still writes through its descriptor, and a new open
/// works — then stops by itself, cleanly, once the holder closes and exits. (It used to
/// wait without a word for an unmount nobody made.)
fn sigterm_while_the_mount_point_is_busy_serves_on_until_it_is_free(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let holder_script = "import os, sys\n\
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)\n\
        os.write(fd, b'before ')\n\
        print('open', flush=True)\n\
        sys.stdin.readline()\n\
        os.write(fd, b'after the signal')\n\
        os.close(fd)\n";
    let mut python = Command::new("python3");
    python
        .args(["-c", holder_script])
        .arg(mount.path().join("held"));
    let mut holder = spawned_until(python, "open\n");
    let mut server = mount.server.take().unwrap();
    let (lines, stderr) = std::sync::mpsc::channel();
    let err = server.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let signalled = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let busy = loop {
        let line = stderr
            .recv_timeout(Duration::from_secs(20))
            .expect("the server said nothing about a busy mount point within 20 s");
        if line.contains("is busy") {
            break line;
        }
    };
    assert!(busy.contains("umount -l"), "{busy}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        server.try_wait().unwrap().is_none(),
        "the server stopped while busy"
    );
    assert_eq!(
        std::fs::read(mount.path().join("held")).unwrap(),
        b"before "
    );
    std::io::Write::write_all(holder.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert!(holder.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not stop within 20 s of the mount point going free"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    reader.join().unwrap();
    let rest: Vec<String> = stderr.try_iter().collect();
    assert!(status.success(), "{status}: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("unmounted")), "{rest:?}");
    assert!(!is_mounted(mount.path()));
    mount.holds_after_a_clean_restart("held", b"before after the signal");
}

fn sigterm_unmounts_cleanly_and_the_files_stay(transport: &'static str) {
    let mut mount = Mount::new(transport);
    std::fs::write(mount.path().join("kept"), b"kept across mounts").unwrap();
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("unmounted"), "{stderr}");
    assert!(!is_mounted(mount.path()));
    assert!(
        !mount.path().join("kept").exists(),
        "the file is on the volume, not the host"
    );
    mount.holds_after_a_clean_restart("kept", b"kept across mounts");
}

/// `umount` returns before the server has closed the volume (the kernel drops the mount;
/// the server then checkpoints and closes). A command run right after it — `fsck`,
/// `status`, a new `locus mount`, a program through the preload library — waits for that
/// instead of failing with "in use" (the library: `EBUSY`). Each
/// round leaves the server 128 MiB of fresh writes to close, so that its close is still
/// running when the next command starts.
fn the_volume_opens_right_after_umount(transport: &'static str) {
    let library = common::preload_library();
    let mut mount = Mount::new(transport);
    for round in 0..4 {
        let name = format!("f{round}");
        mount.run(&format!(
            "dd if=/dev/urandom of={name} bs=1M count=64 status=none && cp {name} {name}.copy"
        ));
        let server = mount.server.take().expect("running");
        let umount = Command::new("umount").arg(mount.path()).output().unwrap();
        ok(&umount, "umount");
        let command = ["fsck", "status", "mount", "preload"][round];
        if command == "mount" {
            // `start_with` fails the test if the new server exits.
            mount.start_with(&[]);
        } else if command == "preload" {
            let out = Command::new("cmp")
                .args([format!("/locus/{name}"), format!("/locus/{name}.copy")])
                .env("LD_PRELOAD", &library)
                .env("LOCUS_VOLUME", mount.volume.path())
                .env("LOCUS_MOUNT", "/locus")
                .output()
                .unwrap();
            ok(&out, "cmp through the preload library");
            mount.start_with(&[]);
        } else {
            let out = locus()
                .arg(command)
                .arg("--volume")
                .arg(mount.volume.path())
                .output()
                .unwrap();
            let text = ok(&out, command);
            if command == "fsck" {
                assert!(text.trim_end().ends_with("clean"), "{text}");
            }
            mount.start_with(&[]);
        }
        let out = server.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.contains("unmounted"),
            "{stderr}"
        );
        mount.run(&format!("cmp {name} {name}.copy && rm {name} {name}.copy"));
    }
}

/// The preload library, finding the volume held by `locus mount`, passes /locus paths to
/// the mount: a pipeline with /locus in both stages and rsync (two processes each, which the
/// library alone refuses with EBUSY) work, and the files are the mount's.
fn the_preload_library_uses_a_running_mount(transport: &'static str) {
    let library = common::preload_library();
    let mount = Mount::new(transport);
    let script = r#"
        set -e
        sqlite3 /locus/a.db 'CREATE TABLE t(a); INSERT INTO t VALUES (1), (2), (3);'
        sqlite3 /locus/a.db .dump | sqlite3 /locus/b.db
        sqlite3 /locus/b.db 'SELECT sum(a) FROM t;'
        seq 1 1000 > /locus/n && cat /locus/n | sort -n -r | head -1 > /locus/top
        cat /locus/top
        mkdir -p /locus/src/d && cp /locus/n /locus/src/d/ && ln -s d/n /locus/src/l
        rsync -a /locus/src/ /locus/dst/ && diff -r --no-dereference /locus/src /locus/dst
        readlink /locus/dst/l
    "#;
    let out = Command::new("bash")
        .args(["-c", script])
        .env("LD_PRELOAD", &library)
        .env("LOCUS_VOLUME", mount.volume.path())
        .env("LOCUS_MOUNT", "/locus")
        .env(
            "PATH",
            format!(
                "/usr/bin:/bin:{}",
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    assert_eq!(ok(&out, "preloaded pipeline"), "6\n1000\nd/n\n");
    assert_eq!(std::fs::read(mount.path().join("top")).unwrap(), b"1000\n");
    assert!(mount.path().join("b.db").exists());
}

/// `locus status` of a mounted volume reads the server's live view through the mount;
/// `fsck` checks it through the server (which holds every request and the checkpoint while
/// it reads the media), also while another process writes, and sees damage; `--repair`
/// refuses, naming the mount; the status and check files are hidden and read-only.
fn status_and_fsck_beside_a_mount(transport: &'static str) {
    let mount = Mount::new(transport);
    std::fs::create_dir(mount.path().join("d")).unwrap();
    std::fs::write(mount.path().join("d/f"), b"x").unwrap();
    let report = status_json(mount.volume.path());
    let pid = u64::from(mount.server.as_ref().unwrap().id());
    assert_eq!(report["served_by"]["pid"].as_u64(), Some(pid), "{report}");
    assert_eq!(
        report["fs_live"]["inodes"].as_u64(),
        Some(3),
        "root, d, d/f: {report}"
    );
    assert!(report["devices"][0]["free_bytes"].as_u64().unwrap() > 0);

    // fsck through the mount sees what the media hold now.
    let fsck = |args: &[&str]| {
        locus()
            .arg("fsck")
            .args(args)
            .arg("--volume")
            .arg(mount.volume.path())
            .output()
            .unwrap()
    };
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let text = ok(&fsck(&[]), "fsck of a mounted volume");
    assert!(
        text.contains("checked through `locus mount`") && text.trim_end().ends_with("clean"),
        "{text}"
    );
    let report = json(&fsck(&["--json"]));
    assert_eq!(report["served_by"]["pid"].as_u64(), Some(pid), "{report}");
    assert_eq!(report["fs"]["state"], "present", "{report}");
    assert_eq!(report["fs"]["files"], 1, "{report}");
    assert_eq!(report["fs"]["directories"], 2, "{report}");
    std::fs::write(mount.path().join("d/g"), vec![7u8; 10_000]).unwrap();
    let report = json(&fsck(&["--json"]));
    assert_eq!(report["fs"]["files"], 2, "{report}");
    assert_eq!(report["fs"]["file_bytes"], 10_001, "{report}");

    let out = fsck(&["--repair"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("served by `locus mount`") && err.contains("umount"),
        "{err}"
    );

    // Checks while another process writes and creates files: every one clean, and the
    // writer's data intact afterwards (it verifies what it wrote).
    let mut writer = python_in(
        mount.path(),
        r#"
import os, sys, time
d = sys.argv[1]
fd = os.open(f"{d}/big", os.O_RDWR | os.O_CREAT, 0o644)
want = {}
end = time.time() + 3
n = 0
while time.time() < end:
    off = (n * 7919 % 1024) * 4096
    data = bytes([n % 251]) * (512 if n % 3 else 4096)
    os.pwrite(fd, data, off)
    want[off] = data
    if n % 50 == 0:
        with open(f"{d}/small{n % 500}", "w") as f:
            f.write("y" * (n % 3000))
    n += 1
for off, data in want.items():
    got = os.pread(fd, len(data), off)
    assert got == data, f"offset {off}: read back differs"
print(n)
"#,
    );
    let mut checks = 0;
    while writer.try_wait().unwrap().is_none() {
        let out = fsck(&["--json"]);
        let report = json(&out);
        assert!(
            out.status.success() && report["fs"]["state"] == "present",
            "fsck during writes: {report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let written = ok(&writer.wait_with_output().unwrap(), "the writer");
    assert!(checks >= 5, "only {checks} checks ran while writing");
    assert!(written.trim().parse::<u64>().unwrap() > 100, "{written}");

    // A damaged spare root copy on the media is reported through the mount. The volume must
    // be idle first: the writer above left scattered windows, and their idle-time rewrites
    // (a slot for the rewriting thread, a new root) would race with the flip below.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = locus()
            .args(["status", "--json", "--volume"])
            .arg(mount.volume.path())
            .output()
            .unwrap();
        let live = &json(&out)["fs_live"];
        if live["idle"].as_bool() == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mount never went idle: {live}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let device = common::emulated_device(mount.volume.path());
    let image = std::fs::read(&device).unwrap();
    let copies: Vec<usize> = image
        .windows(8)
        .enumerate()
        .filter(|(_, w)| *w == b"LOCUSFS1")
        .map(|(at, _)| at)
        .take(2)
        .collect();
    let generation = |at: usize| u64::from_le_bytes(image[at + 16..at + 24].try_into().unwrap());
    let older = *copies.iter().min_by_key(|&&at| generation(at)).unwrap();
    common::poke(&device, (older + 200) as u64, image[older + 200] ^ 1);
    let out = fsck(&["--json"]);
    assert!(!out.status.success(), "a damaged root copy fails fsck");
    let report = json(&out);
    assert!(
        report["fs"]["damaged_root_copy"]
            .as_str()
            .is_some_and(|d| d.contains("crc32c")),
        "{report}"
    );

    let status = mount.path().join(".locus-status");
    assert!(
        std::fs::read_to_string(&status)
            .unwrap()
            .contains("\"server_pid\"")
    );
    made_files_are_hidden_and_fixed(
        mount.path(),
        &[(mount::STATUS_NAME, 0o444), (mount::CHECK_NAME, 0o400)],
    );
}

/// The files the server makes at the root of the mount at `point` (name, mode) are not
/// listed, have their mode, and can be neither written nor removed.
fn made_files_are_hidden_and_fixed(point: &Path, made: &[(&str, u32)]) {
    let names: Vec<_> = std::fs::read_dir(point)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.to_string_lossy().starts_with(".locus")),
        "the server's files are not listed: {names:?}"
    );
    for &(name, mode) in made {
        let file = point.join(name);
        let permissions = std::fs::metadata(&file).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&permissions) & 0o777,
            mode,
            "{name}"
        );
        assert_eq!(
            std::fs::write(&file, b"x").unwrap_err().raw_os_error(),
            Some(libc::EACCES),
            "{name}"
        );
        assert_eq!(
            std::fs::remove_file(&file).unwrap_err().raw_os_error(),
            Some(libc::EPERM),
            "{name}"
        );
    }
}

/// `locus scrub` of a mounted volume with data checksums is run by the server beside the
/// requests: clean every time while another process writes and verifies what it wrote, and
/// once a bit is flipped in a block of a file, it names that block and exits 1. The scrub
/// file is hidden, its owner's only and read-only; a volume without data checksums says why
/// it cannot be scrubbed.
fn scrub_beside_a_mount(transport: &'static str) {
    let mount = Mount::formatted_with(transport, &["--data-checksums"]);
    const MARKER: &[u8] = b"the block of /victim that a bit will be flipped in";
    let mut victim = vec![0x11u8; 3 * 4096];
    victim[4096 + 100..][..MARKER.len()].copy_from_slice(MARKER);
    std::fs::write(mount.path().join("victim"), &victim).unwrap();
    let pid = u64::from(mount.server.as_ref().unwrap().id());
    let scrub = |args: &[&str]| {
        locus()
            .arg("scrub")
            .args(args)
            .arg("--volume")
            .arg(mount.volume.path())
            .output()
            .unwrap()
    };
    let mut writer = python_in(
        mount.path(),
        r#"
import os, sys, time
d = sys.argv[1]
fd = os.open(f"{d}/big", os.O_RDWR | os.O_CREAT, 0o644)
model = bytearray()
end = time.time() + 3
n = 0
while time.time() < end:
    # Whole blocks and partial ones over 8 MiB, cut back to 6 MiB now and then.
    off = (n * 7919 % 2048) * 4096 + (n % 5) * 100
    data = bytes([n % 251]) * (700 if n % 3 else 4096)
    os.pwrite(fd, data, off)
    model.extend(bytes(max(0, off + len(data) - len(model))))
    model[off:off + len(data)] = data
    if n % 100 == 99:
        os.truncate(f"{d}/big", 6 << 20)
        model = model[:6 << 20] + bytes(max(0, (6 << 20) - len(model)))
    n += 1
assert os.pread(fd, len(model) + 1, 0) == bytes(model), "read back differs"
print(n)
"#,
    );
    let mut scrubs = 0;
    while writer.try_wait().unwrap().is_none() {
        let out = scrub(&["--json"]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert!(out.status.success(), "scrub during writes: {report}");
        assert_eq!(
            report["damaged"].as_array().map(Vec::len),
            Some(0),
            "{report}"
        );
        assert!(report["blocks"].as_u64().unwrap() >= 3, "{report}");
        assert!(
            report["scrubbed_by"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("`locus mount` (pid {pid})"))),
            "{report}"
        );
        scrubs += 1;
    }
    let written = ok(&writer.wait_with_output().unwrap(), "the writer");
    assert!(written.trim().parse::<u64>().unwrap() > 100, "{written}");
    assert!(scrubs >= 3, "only {scrubs} scrubs ran while writing");

    common::damage_marked_block(mount.volume.path(), MARKER);
    let out = scrub(&[]);
    assert!(!out.status.success(), "a damaged block fails the scrub");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("damaged: /victim bytes 4096..8192 (file block"),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 damaged block(s)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The server's status tells how its last scrub ended.
    let live = status_json(mount.volume.path());
    assert_eq!(live["scrub"]["running"], false, "{live}");
    assert_eq!(
        live["scrub"]["report"]["damaged"][0]["path"], "/victim",
        "{live}"
    );
    let out = locus()
        .arg("status")
        .arg("--volume")
        .arg(mount.volume.path())
        .output()
        .unwrap();
    let text = ok(&out, "status");
    assert!(
        text.contains("last scrub (ended ") && text.contains(": 1 damaged block(s) in "),
        "{text}"
    );

    made_files_are_hidden_and_fixed(mount.path(), &[(mount::SCRUB_NAME, 0o400)]);

    let plain = Mount::new(transport);
    let out = locus()
        .args(["scrub", "--volume"])
        .arg(plain.volume.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("through `locus mount`") && err.contains("no data checksums"),
        "{err}"
    );
}

/// fio with several jobs as separate processes writes and verifies (crc32c) on the mount.
fn fio_jobs_as_processes_verify_their_data(transport: &'static str) {
    assert!(have("fio"), "fio is not installed (.ci/run installs it)");
    let mount = Mount::new(transport);
    fio_verifies(&mount);
    let files = std::fs::read_dir(mount.path()).unwrap().count();
    assert_eq!(files, 3, "one file per job");
}

/// fio's three jobs as processes write random 1–64 KiB blocks into a file each in `mount`
/// and verify them (crc32c); fails the test unless fio succeeds without an error.
fn fio_verifies(mount: &Mount) {
    let out = Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=psync",
            "--rw=randwrite",
            "--bsrange=1k-64k",
            "--size=8m",
            "--numjobs=3",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            // No `local-*-verify.state` files in the test's working directory.
            "--verify_state_save=0",
            "--group_reporting",
        ])
        .arg(format!("--directory={}", mount.path().display()))
        .output()
        .unwrap();
    let report = ok(&out, "fio");
    assert!(report.contains("err= 0"), "{report}");
}

/// `mknod` of a FIFO and a device node makes them; of a regular file, a file. Bytes past the
/// largest file (1 PiB; the kernel allows FUSE files up to 8 EiB) are EFBIG, as past the
/// kernel's own limit. The mount is `nodev`: the kernel refuses to open the device.
fn special_files_and_sizes_past_the_largest_file(transport: &'static str) {
    let mount = Mount::new(transport);
    let script = r#"
import errno, os, stat, sys
R = sys.argv[1]
for what, call in [
    ("mkfifo", lambda: os.mkfifo(R + "/fifo")),
    ("mknod char", lambda: os.mknod(R + "/dev", 0o644 | stat.S_IFCHR, os.makedev(1, 3))),
]:
    try:
        call()
        print(what, "made")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
os.mknod(R + "/plain", 0o640 | stat.S_IFREG)
print("mknod regular", oct(os.stat(R + "/plain").st_mode))
fd = os.open(R + "/plain", os.O_RDWR)
for what, call in [
    ("pwrite past", lambda: os.pwrite(fd, b"x", 1 << 62)),
    ("ftruncate past", lambda: os.ftruncate(fd, (1 << 50) + 1)),
    ("fallocate past", lambda: os.posix_fallocate(fd, 1 << 50, 4096)),
]:
    try:
        call()
        print(what, "done")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
print("size", os.fstat(fd).st_size)
print(sorted(os.listdir(R)))
try:
    open(R + "/dev")
except OSError as e:
    print("open char", errno.errorcode[e.errno])
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(mount.path())
        .output()
        .unwrap();
    assert_eq!(
        ok(&out, "python3"),
        "mkfifo made\nmknod char made\nmknod regular 0o100640\n\
         pwrite past EFBIG\nftruncate past EFBIG\nfallocate past EFBIG\nsize 0\n['dev', 'fifo', 'plain']\nopen char EACCES\n"
    );
}

/// FIFOs, Unix sockets and device nodes as on tmpfs: two processes talk through a FIFO
/// (the kernel makes the pipe), a server and a client through a socket bound in the mount;
/// `ls -l`, `stat` and `find -type` see each kind, mode and device number; they are renamed,
/// linked and copied by `cp -a` and tar. After a restart of the server they are all there.
fn special_files_behave_as_on_tmpfs_and_stay(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let script = r#"
        set -u
        mkdir s && cd s
        mkfifo -m 640 pipe && (echo "through the pipe" > pipe &) && cat pipe
        python3 -c '
import os, socket, stat
s = socket.socket(socket.AF_UNIX)
s.bind("sock")
s.listen(1)
c = socket.socket(socket.AF_UNIX)
c.connect("sock")
a, _ = s.accept()
c.sendall(b"through the socket")
print(a.recv(100).decode())
os.mknod("null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
os.mknod("disk", 0o660 | stat.S_IFBLK, os.makedev(259, 70000))
'
        stat -c '%n %F %a %h %t:%T' pipe sock null disk
        ln pipe pipe2 && mv disk disk2 && stat -c '%n %h' pipe pipe2 disk2
        cd .. && cp -a s copy && tar -cf t.tar s && mkdir x && tar -C x -xf t.tar
        find s copy x -type p -o -type s -o -type c -o -type b | sort
        stat -c '%n %F %a %t:%T' copy/null x/s/disk2
        rm s/pipe2 && ls s
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("through the pipe")
            && tmpfs.contains("through the socket")
            && tmpfs.contains("disk block special file 640 1 103:11170"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    mount.start();
    let out = Command::new("stat")
        .args([
            "-c",
            "%n %F %a %h %t:%T",
            "s/pipe",
            "s/sock",
            "s/null",
            "x/s/disk2",
        ])
        .current_dir(mount.path())
        .output()
        .unwrap();
    assert_eq!(
        ok(&out, "stat"),
        "s/pipe fifo 640 1 0:0\ns/sock socket 755 1 0:0\ns/null character special file 600 1 1:3\n\
         x/s/disk2 block special file 640 1 103:11170\n"
    );
}

/// Hard links through the kernel, as on tmpfs: `ln` (one inode, `st_nlink` counting the
/// names, a write through one name read through another), the errors (`EEXIST`, `EPERM` for a
/// directory), `rm` of one name, a rename between two names of one file (nothing changes), tar
/// archiving and extracting a tree with hard links, `cp -al` and `rsync -aH`. Then the server
/// is stopped and started again: the names and counts are still there.
fn hard_links_behave_as_on_tmpfs_and_stay(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let script = r#"
        set -u
        names() { stat -c '%n %h %s' "$@"; }
        same() { [ "$(stat -c %i "$1")" = "$(stat -c %i "$2")" ] && echo "$1 and $2: one inode"; }
        mkdir -p src/sub && printf 'first
' > src/a && ln src/a src/sub/b && ln src/a src/c
        names src/a src/sub/b src/c && same src/a src/sub/b
        printf 'through b
' >> src/sub/b && cat src/a
        ln src/a src/c 2>&1 | sed 's/^ln: //'
        python3 -c 'import os; os.link("src/sub", "src/sub2")' 2>&1 | tail -1
        ln -s a src/sym && ln src/sym src/sym2 && readlink src/sym2 && names src/sym
        python3 -c 'import os; os.rename("src/a", "src/c")' && names src/a src/c
        rm src/c && names src/a src/sub/b
        tar -C src -cf archive.tar . && tar -tvf archive.tar | grep -c 'link to'
        mkdir x && tar -C x -xf archive.tar && names x/a x/sub/b && same x/a x/sub/b
        cp -al src copy && names copy/a src/a && same copy/a src/a
        rsync -aH src/ synced/ && names synced/a synced/sub/b && same synced/a synced/sub/b
        find . -samefile src/a | sort
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("src/a 3 6") && tmpfs.contains("x/a and x/sub/b: one inode"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    mount.start();
    let out = Command::new("bash")
        .args([
            "-c",
            "stat -c '%n %h' src/a src/sub/b x/a copy/a synced/sub/b && cat src/sub/b",
        ])
        .current_dir(mount.path())
        .output()
        .unwrap();
    assert_eq!(
        ok(&out, "stat"),
        "src/a 4
src/sub/b 4
x/a 2
copy/a 4
synced/sub/b 2
first
through b
"
    );
}

/// Files belong to whoever made them, `chown` changes that (and clears set-ID bits), the
/// kernel checks every other user against owners and modes (the mount has
/// `default_permissions` and, here, `--allow-other`), and a set-group-ID directory hands on
/// its group — as on tmpfs, with tar and rsync keeping owners; all of it kept across a
/// restart of the server.
/// POSIX ACLs as tmpfs keeps them: `setfacl`/`getfacl`, the mode following the ACL and a
/// `chmod` the ACL, an ACL that says no more than a mode kept as the mode, default ACLs
/// inherited (the umask then plays no part), the kernel enforcing them for another user,
/// and `cp -a`, `tar --acls`, `rsync -A` carrying them; all of it after a restart too, and
/// hidden (kept, refused) with `--no-acl`.
fn posix_acls_behave_as_on_tmpfs_and_stay(transport: &'static str) {
    if !is_root() {
        eprintln!("skipped: acting as another user (setpriv) needs root");
        return;
    }
    assert!(
        have("setfacl"),
        "setfacl is not installed (.ci/run installs acl)"
    );
    let mut mount = Mount::new(transport);
    mount.restart_with(&["--allow-other"]);
    let script = r#"
        set -u
        umask 022
        chmod 755 .
        as() { setpriv --reuid 65534 --regid 65534 --clear-groups "$@"; }
        show() { for f in "$@"; do stat -c '%n %A' "$f"; getfacl -cpn "$f"; done; }
        echo data > f && setfacl -m u:65534:rw f && show f
        chmod 640 f && show f
        setfacl -m u:65534:r,m::rwx f && show f
        setfacl -m u::rwx,g::r,o::- f && setfacl -x u:65534 f && setfacl -x m f; show f
        setfacl -b f && show f
        setfacl -m u:1000:rwx,g:100:r f && setfacl -m d:u:1:r f; show f
        mkdir d && setfacl -d -m u:65534:rwx,g::rx,o::- d && show d
        touch d/a && mkdir d/sub && mkfifo d/p && ln -s a d/l && show d/a d/sub d/p
        stat -c '%n %A' d/l
        umask 077 && touch d/b && mkdir d/c && touch g && show d/b d/c g
        umask 022
        echo secret > s && chmod 600 s && as cat s
        setfacl -m u:65534:r s && as cat s
        setfacl -m m::- s && as cat s
        setfacl -x u:65534 s && as cat s
        as sh -c 'echo by-acl > d/sub/w && cat d/sub/w'
        touch k && chown 65534:0 k && chmod 2775 k && as setfacl -m u:1:r k
        touch k2 && chmod 2775 k2 && setfacl -m u:1:r k2 && stat -c '%n %A' k k2
        python3 -c '
import errno, os
def attempt(what, call):
    try:
        r = call()
        print(what, "ok", r if r is not None else "")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
attempt("garbage", lambda: os.setxattr("f", "system.posix_acl_access", b"\x02\x00\x00\x00\x01"))
attempt("version 3", lambda: os.setxattr("f", "system.posix_acl_access", b"\x03\x00\x00\x00" + b"\x01\x00\x06\x00\xff\xff\xff\xff"))
attempt("default on a file", lambda: os.setxattr("f", "system.posix_acl_default", os.getxattr("d", "system.posix_acl_default")))
attempt("remove missing", lambda: os.removexattr("g", "system.posix_acl_access"))
'
        mkdir src && echo x > src/x && setfacl -m u:65534:rwx,g:100:rx src/x && setfacl -d -m g:100:rwx src
        cp -a src cpd && tar --acls -cf a.tar src && mkdir u && tar --acls -C u -xf a.tar
        rsync -aA src/ rs/ && show cpd cpd/x u/src/x rs rs/x
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("user:65534:rw-\ngroup::r--\nmask::rw-")
            && tmpfs.contains("d/a -rw-rw----\nuser::rw-\nuser:65534:rwx\t#effective:rw-")
            && tmpfs.contains("default:user:65534:rwx")
            && tmpfs.contains("by-acl")
            && tmpfs.contains("k -rwxrwxr-x\nk2 -rwxrwsr-x")
            && tmpfs.contains("garbage EINVAL")
            && tmpfs.contains("Permission denied"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let kept = "getfacl -Rcpn . 2>&1 | sort | md5sum; stat -c '%n %A' f d d/a d/b cpd/x";
    let before = mount.same_after_restart(kept);
    assert!(before.contains("d/a -rw-rw----"), "{before}");
    // Without ACLs: none shown or changed, none inherited (the umask applies, as on a
    // kernel file system mounted `noacl`), and the volume keeps them for a later mount.
    mount.restart_with(&["--no-acl"]);
    let refused = Command::new("bash")
        .args([
            "-c",
            "getfacl -cpn d/a; setfacl -m u:1:r g; getfattr -d -m - d/a; \
             umask 027; touch d/plain; mkdir d/plaindir",
        ])
        .current_dir(mount.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        !said.contains("user:65534") && said.contains("setfacl: g: Operation not supported"),
        "{said}"
    );
    mount.restart_with(&[]);
    let made = mount.run("stat -c '%n %A' d/plain d/plaindir; getfacl -cpn d/plain d/plaindir");
    assert_eq!(
        made,
        "d/plain -rw-r-----\nd/plaindir drwxr-x---\nuser::rw-\ngroup::r--\nother::---\n\n\
         user::rwx\ngroup::r-x\nother::---\n\n"
    );
    mount.run("rm -r d/plain d/plaindir");
    assert_eq!(mount.run(kept), before, "after a mount without ACLs");
}

fn owners_and_permissions_behave_as_on_tmpfs_and_stay(transport: &'static str) {
    if !is_root() {
        eprintln!("skipped: acting as other users (setpriv) needs root");
        return;
    }
    let mut mount = Mount::new(transport);
    mount.restart_with(&["--allow-other"]);
    let script = r#"
        set -u
        as() { u=$1; shift; setpriv --reuid $u --regid $u --clear-groups "$@"; }
        show() { stat -c '%n %a %u %g' "$@"; }
        chmod 1777 .
        as 65534 sh -c 'echo mine > n1 && mkdir n1d && ln -s n1 n1l && mkfifo n1p'
        show n1 n1d n1p && stat -c '%n %u %g' n1l
        as 65534 chown 0 n1; as 65534 chgrp 0 n1; as 65534 chgrp 65534 n1 && echo own group ok
        chown 1000:100 n1 && show n1
        chmod 6755 n1 && chown 1001 n1 && show n1
        chmod 2745 n1 && chown :101 n1 && show n1
        chown -h 1002:102 n1l && stat -c '%n %u %g' n1l n1
        chmod 6777 n1d && chown 1003 n1d && show n1d
        touch rootfile && as 65534 rm -f rootfile; as 65534 mv rootfile elsewhere; show rootfile
        as 65534 touch -d @5 rootfile; as 65534 chmod 777 rootfile; show rootfile
        echo secret > private && chmod 600 private && as 65534 cat private
        chmod 644 private && as 65534 sh -c 'echo x >> private'; as 65534 cat private
        mkdir shared && chown 0:100 shared && chmod 2770 shared
        setpriv --reuid 1000 --regid 1000 --groups 100 sh -c 'echo g > shared/f && mkdir shared/d'
        as 65534 ls shared; show shared shared/f shared/d
        tar -cf own.tar n1 shared && mkdir x && tar -C x --same-owner -xpf own.tar
        show x/n1 x/shared x/shared/f x/shared/d
        rsync -a shared/ synced/ && show synced synced/f synced/d
    "#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("n1 644 65534 65534")
            && tmpfs.contains("n1 755 1001 100")
            && tmpfs.contains("shared/d 2755 1000 100")
            && tmpfs.contains("Permission denied")
            && tmpfs.contains("Operation not permitted"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let before = mount.same_after_restart(
        "show() { stat -c '%n %a %u %g' \"$@\"; }; \
         show n1 n1d n1p shared shared/f shared/d x/shared/f synced/d && stat -c '%n %u %g' n1l",
    );
    assert!(before.contains("shared/f 644 1000 100"), "{before}");
}

/// Extended attributes: `setfattr`/`getfattr` of user., trusted. and security. names on
/// files, directories and a link's own (user. names on links and FIFOs are the kernel's
/// `EPERM`), create and replace flags, 64 KiB values and 255-byte names and past them,
/// attributes of an open file whose name is gone, and `cp -a`, tar `--xattrs` and
/// `rsync -X` carrying them — as on tmpfs; then kept across a restart of the server.
fn extended_attributes_behave_as_on_tmpfs_and_stay(transport: &'static str) {
    if !is_root() {
        eprintln!("skipped: trusted. attributes need root");
        return;
    }
    assert!(
        have("setfattr"),
        "setfattr is not installed (.ci/run installs attr)"
    );
    let mut mount = Mount::new(transport);
    let script = r#"
set -u
touch f && mkdir d && ln -s f l && mkfifo p
setfattr -n user.a -v hello f && setfattr -n user.b -v 0xff00ff f && setfattr -n user.empty f
getfattr -d f
getfattr -n user.zz f
setfattr -x user.nothing f
setfattr -x user.b f && getfattr -d f
setfattr -n trusted.t -v 1 d && setfattr -n security.s -v label d && getfattr -d -m - d
setfattr -h -n user.x -v 1 l
setfattr -h -n trusted.x -v 1 l && getfattr -h -d -m trusted l
setfattr -n user.p -v 1 p
python3 -c '
import errno, os
def attempt(what, call):
    try:
        r = call()
        print(what, "ok", r if r is not None else "")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
attempt("create", lambda: os.setxattr("f", "user.c", b"v", os.XATTR_CREATE))
attempt("create again", lambda: os.setxattr("f", "user.c", b"w", os.XATTR_CREATE))
attempt("replace missing", lambda: os.setxattr("f", "user.none", b"w", os.XATTR_REPLACE))
attempt("replace", lambda: os.setxattr("f", "user.c", b"w", os.XATTR_REPLACE))
attempt("64 KiB", lambda: os.setxattr("f", "user.big", bytes(range(256)) * 256))
attempt("64 KiB back", lambda: len(os.getxattr("f", "user.big")) == 65536 and os.getxattr("f", "user.big")[:3])
attempt("over 64 KiB", lambda: os.setxattr("f", "user.bigger", b"x" * 65537))
attempt("list", lambda: sorted(os.listxattr("f")))
attempt("remove", lambda: os.removexattr("f", "user.big"))
attempt("a long name", lambda: os.setxattr("f", "user." + "n" * 250, b""))
attempt("too long a name", lambda: os.setxattr("f", "user." + "n" * 251, b""))
fd = os.open("f", os.O_RDONLY)
os.unlink("f")
attempt("fd after unlink", lambda: os.getxattr(fd, "user.a"))
attempt("fset after unlink", lambda: os.setxattr(fd, "user.late", b"1"))
attempt("flist after unlink", lambda: sorted(os.listxattr(fd))[:3])
os.close(fd)
'
touch g && setfattr -n user.k -v v g && setfattr -n trusted.k -v t g
cp -a g h && getfattr -d -m - h
tar --xattrs -cf a.tar g d && mkdir u && tar --xattrs --xattrs-include='*' -C u -xf a.tar && getfattr -d -m - u/g u/d
mkdir r && rsync -aX g d r/ && getfattr -d -m - r/g r/d
"#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("user.b=0s/wD/")
            && tmpfs.contains("over 64 KiB E2BIG")
            && tmpfs.contains("fd after unlink ok b'hello'")
            && tmpfs.contains("# file: r/d\nsecurity.s=\"label\"\ntrusted.t=\"1\""),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let kept = "getfattr -d -m - d h u/g r/d && getfattr -h -d -m - l";
    let before = mount.same_after_restart(kept);
    assert!(
        before.contains("# file: u/g\ntrusted.k=\"t\"\nuser.k=\"v\""),
        "{before}"
    );
    // `--no-xattrs`: refused without a request after the first, and kept for later.
    mount.restart_with(&["--no-xattrs"]);
    let refused = Command::new("bash")
        .args([
            "-c",
            "getfattr -d d; setfattr -n user.n -v 1 h; getfattr -d d",
        ])
        .current_dir(mount.path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "getfattr: d: Operation not supported\nsetfattr: h: Operation not supported\n\
         getfattr: d: Operation not supported\n"
    );
    assert!(fuse_counters(&mount)["xattr_requests"].as_u64().unwrap() <= 2);
    mount.restart_with(&[]);
    assert_eq!(mount.run(kept), before);
}

/// `copy_file_range` (what `cp` uses) is served inside the volume: whole files, past the
/// end, unaligned, extending the target, a sparse source's holes over existing data, two
/// ranges of one file and the kernel's refusal of overlapping ones give tmpfs's bytes, `cp`
/// keeps a sparse file sparse, and copying 64 MiB with `cp` costs a handful of requests
/// instead of two per MiB (a read and a write through the kernel).
/// The server asks for requests of 2 MiB; the kernel grants up to its limit
/// (`fs.fuse.max_pages_limit`, 256 pages unless root raised it — `.ci/run` raises it to 512).
/// A `write(2)` then reaches the server in requests of the granted size, each one atomic
/// write of the file system: an aligned 2 MiB write is one where the limit allows it.
fn a_write_comes_in_requests_of_the_negotiated_size(transport: &'static str) {
    use std::os::unix::fs::FileExt;
    let limit = std::fs::read_to_string(mount::PAGES_LIMIT)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(256);
    let granted = limit.clamp(1, 512) * 4096;
    let mount = Mount::new(transport);
    let fuse = fuse_counters(&mount);
    assert_eq!(fuse["max_write"].as_u64(), Some(granted), "{fuse}");

    const BIG: usize = 2 << 20;
    // Page-aligned, as fio's buffers are: the kernel pins the caller's pages for direct
    // I/O, and a misaligned buffer spans one page more than a request may.
    let mut buf = vec![0u8; BIG + 4096];
    let skip = buf.as_ptr().align_offset(4096);
    let data = &mut buf[skip..skip + BIG];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3];
    }
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(mount.path().join("big"))
        .unwrap();
    let writes = |m: &Mount| fuse_counters(m)["write_requests"].as_u64().unwrap();
    let before = writes(&mount);
    for at in [0, BIG as u64] {
        assert_eq!(file.write_at(data, at).unwrap(), BIG);
    }
    let per_write = (BIG as u64).div_ceil(granted);
    assert_eq!(
        writes(&mount) - before,
        2 * per_write,
        "two 2 MiB writes with requests of at most {granted} bytes"
    );
    let mut back = vec![0u8; BIG];
    for at in [0, BIG as u64] {
        file.read_exact_at(&mut back, at).unwrap();
        assert!(back == data, "the 2 MiB at {at} read back differ");
    }
}

fn copy_file_range_copies_inside_the_server_as_on_tmpfs(transport: &'static str) {
    let mount = Mount::new(transport);
    let script = r#"
python3 - <<'EOF'
import hashlib, os
def digest(path):
    with open(path, "rb") as f:
        data = f.read()
    return len(data), hashlib.sha256(data).hexdigest()[:16]
def show(what, path):
    print(what, *digest(path))
block = bytes(range(256)) * 16
with open("src", "wb") as f:
    for i in range(64):
        f.write(bytes([i]) * 4096 + block * 255)
with open("sparse", "wb") as f:
    f.write(b"head" * 1000)
    f.seek(8 << 20)
    f.write(b"tail" * 1000)
    f.seek(16 << 20)
    f.write(b"end")
src = os.open("src", os.O_RDONLY)
dst = os.open("dst", os.O_RDWR | os.O_CREAT, 0o644)
print("whole", os.copy_file_range(src, dst, 64 << 20))
show("dst", "dst")
print("past the end", os.copy_file_range(src, dst, 100, 64 << 20, 0))
print("unaligned", os.copy_file_range(src, dst, 12345, 777, 1 << 20))
print("extending", os.copy_file_range(src, dst, 3 << 20, 63 << 20, 80 << 20))
show("dst", "dst")
os.close(dst)
sp = os.open("sparse", os.O_RDONLY)
over = os.open("over", os.O_RDWR | os.O_CREAT, 0o644)
os.write(over, b"x" * (12 << 20))
print("holes over data", os.copy_file_range(sp, over, 16 << 20, 0, 0))
show("over", "over")
s2 = os.open("src", os.O_RDWR)
print("same file, apart", os.copy_file_range(s2, s2, 1 << 20, 0, 40 << 20))
try:
    os.copy_file_range(s2, s2, 1 << 20, 0, 1000)
except OSError as e:
    print("same file, overlapping", e.strerror)
show("src", "src")
for fd in [src, sp, over, s2]:
    os.close(fd)
EOF
cp sparse sparse.cp && python3 -c '
import os; st = os.stat("sparse.cp")
print("cp sparse", st.st_size, "sparse" if st.st_blocks * 512 < st.st_size else "dense")'
"#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("whole 67108864")
            && tmpfs.contains("same file, overlapping Invalid argument")
            && tmpfs.contains("cp sparse 16777219 sparse"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let before = requests_served(&mount);
    let out = Command::new("cp")
        .args(["src", "src.copy"])
        .current_dir(mount.path())
        .output()
        .unwrap();
    ok(&out, "cp");
    let spent = requests_served(&mount) - before;
    assert!(spent < 40, "cp of 64 MiB cost {spent} requests");
    assert_eq!(
        std::fs::read(mount.path().join("src")).unwrap(),
        std::fs::read(mount.path().join("src.copy")).unwrap()
    );
}

/// Everyday programs on a mount filled to `ENOSPC` (`dd` in 1 MiB, 4 KiB and 1-byte writes):
/// `df` shows nothing available (it showed the checkpoint's reserve, about 1 MiB, on a volume
/// that refused every write), and `sqlite3` in WAL mode, `head`, `git add` and `commit`,
/// `sed -i` and `tar -x` each fail without harming the database, repository or file they
/// worked on; once the filler is removed the space is back and each of them works. The
/// transcript is the one a size-limited tmpfs gives (checked when the test runs as root),
/// and the files are the same after a restart of the server and check clean.
fn everyday_programs_on_a_full_mount_fail_cleanly_and_recover(transport: &'static str) {
    for program in ["sqlite3", "git", "tar", "sed", "dd"] {
        assert!(
            have(program),
            "{program} is not installed (.ci/run installs it)"
        );
    }
    let expected = include_str!("../../preload/tests/scripts/full.expected");
    if is_root() {
        let tmpfs = SmallTmpfs::new("48m");
        assert_eq!(full_script(tmpfs.0.path()), expected, "on tmpfs");
    }
    let mut mount = Mount::new(transport);
    assert_eq!(full_script(mount.path()), expected);
    mount.same_after_restart(
        "sqlite3 db 'select count(*), sum(length(v)) from t; pragma integrity_check'; \
         git -C repo log --format=%s; md5sum text; ls -A | sort",
    );
    let fsck = locus()
        .args(["fsck", "--volume"])
        .arg(mount.volume.path())
        .output()
        .unwrap();
    ok(&fsck, "locus fsck beside the mount");
}

/// `fallocate` allocates: mode 0 and `--keep-size` give holes blocks (`stat` and `du`
/// count them, the volume's free space drops by them at once), data written into them
/// stays, a punched hole and a truncation free them again, and a request beyond the free
/// space is `ENOSPC` with nothing allocated — as on tmpfs, and the same after a restart.
fn fallocate_allocates_as_on_tmpfs_and_stays(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let script = include_str!("../../preload/tests/scripts/fallocate.sh");
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("mode 0: 1048576 bytes, 2048 blocks")
            && tmpfs.contains("No space left on device")
            && tmpfs.contains("big: 0 bytes, 0 blocks"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    mount.same_after_restart("stat -c '%s %b' f; md5sum f");

    // The volume's free space pays for an allocation at once, and gets it back on unlink.
    // Free blocks (`f_bfree`), not available ones: available leaves out the checkpoint's
    // reserve, which grows with the metadata the allocation adds until the next snapshot.
    let free = || -> u64 {
        mount
            .run("stat -f -c '%f %S' .")
            .split_whitespace()
            .map(|n| n.parse::<u64>().unwrap())
            .product()
    };
    let before = free();
    let slots_before = slot_bytes(mount.volume.path());
    mount.run("fallocate -l 64M reserved");
    let after = free();
    assert!(
        before - after >= 64 << 20,
        "{before} bytes free before, {after} after"
    );
    mount.run("rm reserved");
    // The blocks go with the file's last close, and the kernel sends that RELEASE after
    // `close` has returned (asynchronously): a slow server may see it after the `rm`. All
    // of them, but for the log area and journal of a thread slot made meanwhile (a request
    // served by a server thread that had not written before: ~2 MiB, kept for reuse) and a
    // few pages of slack.
    let deadline = Instant::now() + Duration::from_secs(10);
    let given_back = || free() + (slot_bytes(mount.volume.path()) - slots_before) + (128 << 10);
    while given_back() < before {
        assert!(
            Instant::now() < deadline,
            "given back on unlink: {} bytes free, {before} before; thread slots {} bytes, \
             {slots_before} before",
            free(),
            slot_bytes(mount.volume.path())
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Zeroing a range (`fallocate -z`; tmpfs has no such mode, so the bytes and blocks are
    // checked against what they must be): zeros inside, data around, every block allocated
    // (10 blocks of 4 KiB, then 12 with the size grown to 48,000 bytes: 96 sectors).
    let zeroed = mount.run(
        r#"
set -e
fallocate -l 40960 z
python3 -c 'open("z", "r+b").write(bytes(range(256)) * 160)'
fallocate -z -o 5000 -l 20000 z
fallocate -z -o 38000 -l 10000 z
python3 -c '
import os
want = bytearray(bytes(range(256)) * 160)
want[5000:25000] = bytes(20000)
want[38000:] = bytes(len(want) - 38000)
want += bytes(48000 - len(want))
print(os.stat("z").st_size, open("z", "rb").read() == bytes(want), os.stat("z").st_blocks)'
"#,
    );
    assert_eq!(zeroed, "48000 True 96\n");
}

/// `fstat` right after a write counts the blocks the write took, as on tmpfs, while the
/// write still waits in a log for the checkpoint: archivers (`tar --sparse`, `cp`) read a
/// file of some size and no blocks as all holes. Sizes from a few bytes to several blocks,
/// rewritten (truncated) and grown. Not under the write-back cache, whose kernel holds the
/// data the server would count until it writes it back.
fn a_file_just_written_shows_its_blocks_as_on_tmpfs(transport: &'static str) {
    let mount = Mount::new(transport);
    let script = r#"
python3 -c '
import os
seen, empty = [], 0
for i in range(400):
    fd = os.open("f%d" % (i % 10), os.O_CREAT | os.O_WRONLY | (os.O_TRUNC if i % 3 else 0))
    os.pwrite(fd, b"x" * (1 + i * 97 % 20000), i * 1000 % 9000)
    st = os.fstat(fd)
    seen.append((st.st_size, st.st_blocks))
    empty += st.st_blocks == 0
    os.close(fd)
print(empty, "of 400 written files showed no blocks")
print(seen[:40], "all:", hash(tuple(seen)))
'
du -k --apparent-size -s . | cut -f1
d=$(mktemp -d)
tar -cSf "$d/t.tar" f3 && tar -xf "$d/t.tar" -C "$d" && cmp f3 "$d/f3" && echo same
rm -r "$d"
"#;
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.starts_with("0 of 400") && tmpfs.contains("same"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
}

/// Programs stored in the mount run as on tmpfs — scripts (a host interpreter, `env`, a
/// script as interpreter, a `#!` argument), a program copied in, `PATH`, a link out, a
/// file without execute permission — by the kernel itself (the script the preload
/// library's test runs through the library).
fn programs_stored_in_the_mount_run_as_on_tmpfs(transport: &'static str) {
    let mount = Mount::new(transport);
    let script = include_str!("../../preload/tests/scripts/programs.sh");
    let (tmpfs, locus) = both(&mount, script);
    assert!(
        tmpfs.contains("sh script: R/s.sh R/nested") && tmpfs.contains("not executable: 126"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
}

/// The exchange cases the preload library's test runs too.
const EXCHANGE_SCRIPT: &str = include_str!("../../preload/tests/scripts/exchange.py");

/// `renameat2(RENAME_EXCHANGE)`: files, a file and a directory across directories, a
/// directory and its parent's sibling, two names of one file, and the refusals give
/// tmpfs's tree; the tree is the same after a restart of the server.
fn exchanging_two_names_behaves_as_on_tmpfs_and_stays(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let script = format!("python3 - \"$R\" <<'EOF'\n{EXCHANGE_SCRIPT}EOF\n");
    let (tmpfs, locus) = both(&mount, &script);
    assert!(
        tmpfs.contains("files ok two one")
            && tmpfs.contains("into itself EINVAL EINVAL")
            && tmpfs.contains("./d2/g/sub:f1 ./d2/g:d2 ./d2:d3"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    let before = mount.same_after_restart("find . | sort && cat d2/g/sub d2/g/f");
    assert!(before.ends_with("onetwo"), "{before}");
}

/// `--read-only`: reads work, every change is EROFS, and the volume is unchanged after.
fn a_read_only_mount_refuses_every_change(transport: &'static str) {
    let mut mount = Mount::new(transport);
    std::fs::write(mount.path().join("f"), b"before").unwrap();
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    mount.start_with(&["--read-only"]);
    assert_eq!(std::fs::read(mount.path().join("f")).unwrap(), b"before");
    let refused = |e: std::io::Error| e.raw_os_error();
    assert_eq!(
        std::fs::write(mount.path().join("f"), b"after").map_err(refused),
        Err(Some(libc::EROFS))
    );
    assert_eq!(
        std::fs::write(mount.path().join("new"), b"x").map_err(refused),
        Err(Some(libc::EROFS))
    );
    assert_eq!(
        std::fs::create_dir(mount.path().join("d")).map_err(refused),
        Err(Some(libc::EROFS))
    );
    assert_eq!(
        std::fs::remove_file(mount.path().join("f")).map_err(refused),
        Err(Some(libc::EROFS))
    );
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    mount.start();
    assert_eq!(std::fs::read(mount.path().join("f")).unwrap(), b"before");
    assert!(!mount.path().join("new").exists());
}

/// Python that names an open file with `linkat(fd, "", AT_EMPTY_PATH)` (what `/proc/self/fd`
/// links do; this test's sandbox may not follow those across mounts).
const LINK_FD: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def link_fd(fd, path):
    if libc.linkat(fd, b"", -100, path.encode(), 0x1000) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
"#;

/// `open(dir, O_TMPFILE)` as on tmpfs: a file with no name (`st_nlink` 0, in no listing)
/// that takes the umask, `fchmod` and `fstat` through its handle, gets a name with `linkat`
/// (not when opened `O_EXCL`), and is gone with its last close. Then the server is killed
/// while a process holds an unnamed file of 8 MiB and a named one: after the restart the
/// named file is there and the unnamed one's memory is free again.
fn unnamed_files_behave_as_on_tmpfs_and_go_with_a_crash(transport: &'static str) {
    let mut mount = Mount::new(transport);
    let script = format!(
        "{LINK_FD}{}",
        r#"
os.umask(0o027)
os.mkdir("d")
fd = os.open("d", os.O_TMPFILE | os.O_RDWR, 0o666)
st = os.fstat(fd)
print("made", st.st_nlink, oct(st.st_mode), os.listdir("d"))
os.write(fd, b"written before it had a name\n")
os.fchmod(fd, 0o600)
link_fd(fd, "d/named")
st = os.stat("d/named")
print("named", st.st_nlink, oct(st.st_mode), os.listdir("d"), open("d/named").read(), end="")
try:
    link_fd(fd, "d/named")
except OSError as e:
    print("again:", e.strerror)
os.close(fd)
fd = os.open("d", os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
try:
    link_fd(fd, "d/x")
except OSError as e:
    print("exclusive:", e.strerror)
os.write(fd, b"z" * 300000)
os.close(fd)
try:
    os.open("d/named", os.O_TMPFILE | os.O_RDWR, 0o600)
except OSError as e:
    print("in a file:", e.strerror)
print(sorted(os.listdir("d")))
"#
    );
    let (tmpfs, on_locus) = both(&mount, &format!("python3 -c '{script}'"));
    assert!(
        tmpfs.contains("made 0 0o100640 []")
            && tmpfs.contains("exclusive: No such file or directory\nin a file: Not a directory"),
        "{tmpfs}"
    );
    assert_eq!(on_locus, tmpfs);

    let free = free_bytes;
    let before = free(mount.path());
    let holder = format!(
        "{LINK_FD}{}",
        r#"
fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(fd, b"k" * (8 << 20))
kept = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(kept, b"kept\n")
link_fd(kept, "kept")
print("ready", flush=True)
sys.stdin.read()
"#
    );
    let mut python = Command::new("python3");
    python.args(["-c", &holder]).current_dir(mount.path());
    let mut child = spawned_until(python, "ready\n");
    let held = free(mount.path());
    // (Less than 8 MiB less: part of what is written sits in buffers that were counted as
    // used before.)
    assert!(
        held + (6 << 20) <= before,
        "{held} free while 8 MiB are held, {before} before"
    );
    // `locus status` names what holds the space.
    let report = status_json(mount.volume.path());
    assert_eq!(report["nameless"]["files"], 1, "{report}");
    assert!(
        report["nameless"]["bytes"].as_u64().unwrap() >= 8 << 20,
        "{report}"
    );
    let out = locus()
        .args(["status", "--volume"])
        .arg(mount.volume.path())
        .output()
        .unwrap();
    let text = ok(&out, "status");
    assert!(
        text.contains(
            "held open without a name (removed while open, or O_TMPFILE): 1 file(s), 8.00 MiB"
        ),
        "{text}"
    );
    let mut server = mount.server.take().unwrap();
    server.kill().unwrap(); // SIGKILL
    server.wait().unwrap();
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    detach(mount.path());
    mount.start();
    assert_eq!(
        std::fs::read_to_string(mount.path().join("kept")).unwrap(),
        "kept\n"
    );
    // (Within a few MiB: the reserve for the next snapshot and the log records recovery
    // found, until the checkpoint retires them, count as used; 8 MiB kept would not fit.)
    let after = free(mount.path());
    assert!(
        after + (3 << 20) >= before,
        "{after} free after the restart, {before} before the unnamed file"
    );
    let (status, stderr) = mount.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("recovery replayed"), "{stderr}");
}

/// Bytes free for users on the file system at `path` (`stat -f`).
fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(path)
        .output()
        .unwrap();
    let text = ok(&out, "stat -f");
    let mut parts = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    parts.next().unwrap() * parts.next().unwrap()
}

/// A file system formatted with `--thread-slots 2` has no slot a thread may own: every
/// serving thread of the mount takes turns on the one shared slot, request by request (as
/// the threads past the ownable slots do on a machine with more CPUs than slots). fio's
/// jobs as processes verify their data, and a kill -9 of the server loses no acknowledged
/// write; `status` shows the table.
fn serving_threads_taking_turns_on_one_shared_slot(transport: &'static str) {
    assert!(have("fio"), "fio is not installed (.ci/run installs it)");
    let mut mount = Mount::formatted_with(transport, &["--thread-slots", "2"]);
    fio_verifies(&mount);
    let status = ok(
        &locus()
            .args(["status", "--volume"])
            .arg(mount.volume.path())
            .output()
            .unwrap(),
        "status",
    );
    assert!(
        status.contains("thread slots: 2 of 2 (0 a thread may own, the rest shared)")
            && status.contains("operation(s) done on a turn by threads that found every slot"),
        "{status}"
    );
    kill_9_loses_no_acknowledged_write(&mut mount, transport);
}

/// `locus bench mount` measures the FUSE round trip with calls the server really serves: its
/// own request counters show one request per call, a call through the mount costs more than
/// the same call on tmpfs, and every column of the fio table is there with its numbers.
#[test]
fn bench_mount_measures_a_round_trip_per_call_that_the_server_counts() {
    assert!(have("fio"), "fio is not installed (.ci/run installs it)");
    let output = locus()
        .args([
            "bench",
            "mount",
            "--bs",
            "4K",
            "--numjobs",
            "1",
            "--seconds",
            "0.2",
            "--size",
            "16M",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = ok(&output, "bench mount");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    for engine in ["tmpfs", "mount", "mount-wb"] {
        let case = lines
            .iter()
            .find(|c| c["engine"] == engine)
            .unwrap_or_else(|| panic!("no {engine} case in:\n{stdout}"));
        assert!(case["iops"].as_f64().unwrap() > 0.0, "{case}");
    }
    let trip = lines
        .iter()
        .find(|c| c["op"] == "round-trip")
        .unwrap_or_else(|| panic!("no round trip in:\n{stdout}"));
    let per_call = trip["requests_per_call"].as_f64().unwrap();
    assert!(
        (per_call - 1.0).abs() < 0.01,
        "the probe's calls were not one request each: {trip}"
    );
    assert!(trip["calls"].as_u64().unwrap() >= 256, "{trip}");
    assert!(
        trip["mount_ns"].as_f64().unwrap() > trip["tmpfs_ns"].as_f64().unwrap(),
        "a round trip through the mount cost no more than a call on tmpfs: {trip}"
    );
}
