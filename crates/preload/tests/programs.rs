//! Real programs under `liblocus_preload.so`: coreutils compared with tmpfs, fio's `psync`,
//! `pvsync` and `pvsync2` engines with verification, a shell script, Python's `os` calls
//! (locks, dup, seek holes, mmap, fork), and a kill -9 in the middle of a fio write job.
//!
//! Each test formats a small volume of its own on /dev/shm and runs the programs with
//! `LD_PRELOAD`, `LOCUS_VOLUME` and `LOCUS_MOUNT` set; the test process itself is not
//! preloaded and reads the volume back through the `fs` crate where it checks contents.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

const MOUNT: &str = "/locus";

/// The freshly built library: cargo builds the cdylib beside this test's binary.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps directory");
    for candidate in [
        deps.join("liblocus_preload.so"),
        deps.parent().unwrap().join("liblocus_preload.so"),
    ] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("liblocus_preload.so not found next to {}", exe.display());
}

/// A formatted 256 MiB volume with an empty file system.
fn volume() -> tempfile::TempDir {
    volume_with(false)
}

/// [`volume`], with data checksums when `checksums` is true.
fn volume_with(checksums: bool) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("locus-preload-test")
        .tempdir_in("/dev/shm")
        .expect("tempdir on /dev/shm");
    let topology = topology::Topology::read_live().expect("topology");
    let config = volume::default_config(dir.path(), &topology, Some(256 << 20)).expect("config");
    volume::Volume::format(dir.path(), &config, false).expect("format volume");
    fs::format_volume_with(dir.path(), topology, checksums, None).expect("format fs");
    dir
}

/// A command that runs under the preload library on `vol`.
fn preloaded(vol: &Path, program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("LD_PRELOAD", library())
        .env("LOCUS_VOLUME", vol)
        .env("LOCUS_MOUNT", MOUNT)
        // The system's python3 (the one with the standard library the tests use).
        .env(
            "PATH",
            format!(
                "/usr/bin:/bin:{}",
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    cmd
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

/// Runs `program -c script` under the preload library on `vol` and returns its stdout
/// (failing the test, with both outputs, if the program fails).
fn run_c(vol: &Path, program: &str, script: &str, what: &str) -> String {
    ok(
        &preloaded(vol, program)
            .args(["-c", script])
            .output()
            .unwrap(),
        what,
    )
}

/// Opens the volume in the test process and returns the file system.
fn open_fs(vol: &Path) -> fs::Fs {
    let topology = topology::Topology::read_live().expect("topology");
    let volume = volume::Volume::open(vol, topology, &Default::default()).expect("open volume");
    fs::Fs::open(Arc::new(volume), fs::FsOptions::default()).expect("mount")
}

fn read_all(fs: &fs::Fs, path: &str) -> Vec<u8> {
    let file = fs.open_read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut data = vec![0u8; file.len() as usize];
    let mut done = 0;
    while done < data.len() {
        let n = file.read_at(&mut data[done..], done as u64).expect("read");
        assert!(n > 0);
        done += n;
    }
    data
}

/// Compiles `tests/c/NAME.c` into a temporary directory (kept alive by the returned guard).
fn compile(name: &str) -> (tempfile::TempDir, PathBuf) {
    let build = tempfile::tempdir().unwrap();
    let program = build.path().join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    ok(
        &Command::new(&compiler)
            .args(["-Wall", "-Werror", "-O1", "-o"])
            .arg(&program)
            .arg(&source)
            .output()
            .unwrap(),
        &format!("compiling {name}.c"),
    );
    (build, program)
}

/// `SHELL -c SCRIPT script ARGS...`, under the library on `vol` when one is given: its
/// stdout and stderr.
fn shell(
    vol: Option<&Path>,
    shell: &str,
    script: &str,
    args: &[&std::ffi::OsStr],
) -> (String, String) {
    let mut cmd = match vol {
        Some(vol) => preloaded(vol, shell),
        None => Command::new(shell),
    };
    let output = cmd
        .arg("-c")
        .arg(script)
        .arg("script")
        .args(args)
        .output()
        .expect(shell);
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs the bash script `script` with `dir` as its `$1`, through the library on `vol` or
/// (`None`) without it; its stdout, after checking that it wrote nothing on stderr.
fn bash_in(vol: Option<&Path>, script: &str, dir: &str) -> String {
    let (out, err) = shell(vol, "bash", script, &[dir.as_ref()]);
    assert_eq!(err, "", "{dir}");
    out
}

/// Whether the tests run as root (changing effective ids, `trusted.` attributes).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The same coreutils script on tmpfs (no preload) and on locus (preloaded): identical
/// output, error messages included, with the root replaced by `ROOT`.
#[test]
fn coreutils_behave_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let source = tmp.path().join("source");
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&source, &data).unwrap();
    let script = r#"
        set -u
        R=$1; SRC=$2
        mkdir $R/d && echo mkdir ok
        mkdir -p $R/p/q/r && ls -d $R/p/q/r | sed "s|$R|ROOT|"
        rm -r $R/p
        mkdir $R/d 2>&1 | sed "s|$R|ROOT|"
        cp $SRC $R/d/a && echo cp ok
        cat $R/d/a | md5sum
        md5sum < $R/d/a
        cp $R/d/a $R/d/h && fallocate -p -o 5000 -l 70000 $R/d/h && md5sum < $R/d/h
        stat -c '%s' $R/d/h && rm $R/d/h
        dd if=$SRC of=$R/d/b bs=4096 count=20 2>/dev/null && echo dd ok
        dd if=$SRC of=$R/d/b bs=1000 seek=7 skip=3 count=5 conv=notrunc 2>/dev/null
        md5sum $R/d/b | sed "s|$R|ROOT|"
        truncate -s 123457 $R/d/b
        stat -c '%s %F %a %h' $R/d/b && stat -c '%F %a %h' $R/d
        truncate -s 1000 $R/d/b && md5sum $R/d/b | sed "s|$R|ROOT|"
        mv $R/d/b $R/d/c && echo mv ok
        ls $R/d
        ls -a $R/d
        cat $R/d/b 2>&1 | sed "s|$R|ROOT|"
        rmdir $R/d 2>&1 | sed "s|$R|ROOT|"
        mkdir $R/e
        mv $R/d/c $R/e/ && ls $R/e
        cp $R/d/a $R/e/a2 && cmp $R/d/a $R/e/a2 && echo cmp ok
        chmod 600 $R/e/a2 && stat -c '%a' $R/e/a2
        ls -1 $R/e
        rm $R/d/a && ls $R/d | wc -l
        rm $R/nothing 2>&1 | sed "s|$R|ROOT|"
        rm -r $R/e && echo rm -r ok
        ls $R
        rmdir $R/d && echo rmdir ok
        ls $R | wc -l
        dd if=$SRC of=$R/big bs=64k 2>/dev/null && cp $R/big $3/back && cmp $SRC $3/back && echo roundtrip ok
        rm $R/big
    "#;
    let run = |root: &str, preload: bool| {
        let out_dir = tempfile::tempdir().unwrap();
        let args = [
            root.as_ref(),
            source.as_os_str(),
            out_dir.path().as_os_str(),
        ];
        shell(preload.then(|| vol.path()), "sh", script, &args)
    };
    let tmpfs_root = tmp.path().join("root");
    std::fs::create_dir(&tmpfs_root).unwrap();
    let (expected, expected_err) = run(tmpfs_root.to_str().unwrap(), false);
    let (got, got_err) = run(MOUNT, true);
    assert!(
        expected.contains("roundtrip ok"),
        "tmpfs run broken:\n{expected}\n{expected_err}"
    );
    assert_eq!(got, expected, "stderr on locus:\n{got_err}");
    assert!(got_err.is_empty(), "unexpected stderr on locus:\n{got_err}");
}

/// Archives, copies and version control with symbolic links and set times, compared with
/// the same script on tmpfs: `tar -xf` of a tree with links (relative, absolute, dangling, to
/// a directory) and times to the nanosecond (pax), `tar -d`, `cp -a`, `gzip`/`gunzip`,
/// `touch -d`/`-h`, `ln -s`, `readlink -f`, `realpath`, Python's `shutil.copytree`, and git
/// with fixed dates (so the commit hashes must agree byte for byte). Listings print type,
/// mode, size (not for directories, whose sizes differ by design), times and link targets.
/// Runs bash `script` with `$1` the root and `$2` the archive `t.tar` in `tmp`: on a fresh
/// directory in `tmp` without the library, then on /locus with it. Returns (stdout, stderr)
/// of each run, and the tmpfs root.
fn archive_script_both(
    vol: &Path,
    tmp: &Path,
    script: &str,
) -> ((String, String), (String, String), PathBuf) {
    let tar = tmp.join("t.tar");
    let run = |root: &str, preload: bool| {
        let args = [root.as_ref(), tar.as_os_str()];
        shell(preload.then_some(vol), "bash", script, &args)
    };
    let tmpfs_root = tmp.join("root");
    std::fs::create_dir(&tmpfs_root).unwrap();
    let on_tmpfs = run(tmpfs_root.to_str().unwrap(), false);
    (on_tmpfs, run(MOUNT, true), tmpfs_root)
}

#[test]
fn archives_links_and_times_behave_as_on_tmpfs() {
    for program in ["tar", "git", "gzip", "find"] {
        assert!(
            have(program),
            "{program} is not installed (.ci/run installs it)"
        );
    }
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    // The archive, made on the host: what a user downloads.
    let src = tmp.path().join("src");
    let make = format!(
        r#"set -e
        S={src}
        mkdir -p $S/a/b $S/c
        echo hello > $S/a/f
        head -c 100000 /dev/zero | tr '\0' z > $S/a/b/g
        ln -s ../a/f $S/c/rel; ln -s /etc/hostname $S/c/abs; ln -s nowhere $S/c/dangling
        ln -s a $S/alink
        chmod 640 $S/a/b/g
        touch -d '2001-02-03 04:05:06.789123456' $S/a/f
        touch -h -d '2002-01-01 00:00:00.5' $S/c/rel
        touch -d '2003-03-03' $S/a/b $S/a/b/g $S/c $S/a $S
        tar --format=posix -C $S -cf {tar} .
        "#,
        src = src.display(),
        tar = tmp.path().join("t.tar").display()
    );
    ok(
        &Command::new("sh").args(["-c", &make]).output().unwrap(),
        "making the archive",
    );
    let script = r#"
        set -u
        R=$1; T=$2
        # Only the subshell has its working directory in /locus: `sort` must not (a process
        # with a locus working directory takes the volume, one process at a time).
        list() { (cd $1 && find . -printf '%P %y %m %T@ %l\n' -type f -printf '  size %s\n') | sort; }
        mkdir $R/x && tar -xf $T -C $R/x && echo "tar -x $?"
        tar -df $T -C $R/x && echo "tar -d $?"
        list $R/x
        cat $R/x/c/rel $R/x/alink/f
        readlink $R/x/c/abs; readlink -f $R/x/alink/b/g | sed "s|$R|ROOT|"
        realpath $R/x/c/rel | sed "s|$R|ROOT|"
        test -L $R/x/c/dangling && ! test -e $R/x/c/dangling && echo dangling ok
        cat $R/x/c/dangling 2>&1 | sed "s|$R|ROOT|"
        cp -a $R/x $R/y && echo "cp -a $?" && list $R/y
        ln -s y/a $R/ya && ls $R/ya/ && rm $R/ya && ls $R
        touch -d '2010-10-10 10:10:10.123456789' $R/y/a/f && stat -c '%y' $R/y/a/f
        touch -h -d '2011-01-01' $R/y/alink && stat -c '%y %N' $R/y/alink | sed "s|$R|ROOT|"
        touch -a -d '2012-02-02' $R/y/a/f && stat -c '%x|%y' $R/y/a/f
        cp $R/x/a/b/g $R/z && gzip $R/z && test ! -e $R/z && gunzip $R/z.gz && cmp $R/z $R/x/a/b/g && echo gzip ok
        python3 -c '
import shutil, sys, os
shutil.copytree(sys.argv[1] + "/x", sys.argv[1] + "/py", symlinks=True)
print(sorted(os.listdir(sys.argv[1] + "/py/c")), os.readlink(sys.argv[1] + "/py/c/rel"))
print(os.stat(sys.argv[1] + "/py/a/f").st_mtime_ns)
' $R
        export GIT_AUTHOR_DATE='2020-01-01T00:00:00Z' GIT_COMMITTER_DATE='2020-01-01T00:00:00Z'
        export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
        # git's automatic maintenance is a second process, which would wait for the volume
        # (one process at a time under the library; a `locus mount` has no such limit).
        export GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0=gc.auto GIT_CONFIG_VALUE_0=0 \
            GIT_CONFIG_KEY_1=maintenance.auto GIT_CONFIG_VALUE_1=false
        cd $R && git init -q -b main g && cd g && cp -a ../x/. . && git add -A \
            && git -c user.name=u -c user.email=u@e commit -qm first && git log --format='%H %s' \
            && echo more >> a/f && git diff --stat && git status --short \
            && git -c user.name=u -c user.email=u@e commit -qam second && git log -1 --format='%H %s'
        git ls-files -s
    "#;
    let ((expected, expected_err), (got, got_err), tmpfs_root) =
        archive_script_both(vol.path(), tmp.path(), script);
    assert!(
        expected.contains("gzip ok") && expected.contains(" second"),
        "tmpfs run broken:\n{expected}\n{expected_err}"
    );
    assert_eq!(got, expected, "stderr on locus:\n{got_err}");
    assert_eq!(
        got_err.replace(MOUNT, "ROOT"),
        expected_err.replace(tmpfs_root.to_str().unwrap(), "ROOT")
    );
    // What the file system itself holds.
    let fs = open_fs(vol.path());
    assert_eq!(fs.readlink("/x/c/rel").unwrap(), "../a/f");
    let st = fs.stat("/x/a/f").unwrap();
    assert_eq!(st.mtime_ns, 981_173_106_789_123_456);
}

/// Hard links through the library, as on tmpfs: `ln` and `stat`'s counts, a write through
/// one name read through another, the errors, `rm` of one name, `linkat` following a
/// symbolic link or not, `EXDEV` to another file system, an archive with hard links
/// extracted by tar, and `cp -al`.
#[test]
fn hard_links_behave_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    // An archive with hard links, made on the host.
    let make = format!(
        "set -e; mkdir -p {s}/d && echo linked > {s}/f && ln {s}/f {s}/d/g && ln {s}/f {s}/h \
         && tar -C {s} -cf {t} .",
        s = tmp.path().join("src").display(),
        t = tmp.path().join("t.tar").display()
    );
    ok(
        &Command::new("sh").args(["-c", &make]).output().unwrap(),
        "making the archive",
    );
    let script = r#"
        set -u
        R=$1; T=$2
        # Every command here is one process at a time: with the working directory in /locus,
        # each holds the volume while it runs (no pipelines).
        cd $R
        names() { for f; do echo "$f $(stat -c '%h %s' $f)"; done; }
        same() { [ "$(stat -c %i "$1")" = "$(stat -c %i "$2")" ] && echo "$1 and $2: one inode"; }
        mkdir d && printf 'one\n' > a && ln a d/b && names a d/b && same a d/b
        printf 'two\n' >> d/b && cat a
        ln a d/b || echo "ln refused"
        python3 -c '
import errno, os
for what, call in [
    ("directory", lambda: os.link("d", "d2")),
    ("missing", lambda: os.link("nothing", "c")),
    ("other file system", lambda: os.link("a", "/tmp/locus-hard-link-test")),
]:
    try:
        call()
        print(what, "linked")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
'
        ln -s a s && ln -P s s-itself && ln -L s s-followed && names s-followed a
        [ -L s-itself ] && [ ! -L s-followed ] && echo "-P links the link, -L what it leads to"
        rm a && names d/b s-followed
        mkdir x && tar -C x -xf $T && echo "tar -x $?" && names x/f x/d/g x/h && same x/f x/h
        cp -al x y && names y/f x/f && same y/f x/f
        rm x/f x/h && names x/d/g && cat y/h
    "#;
    let ((expected, expected_err), (got, got_err), _) =
        archive_script_both(vol.path(), tmp.path(), script);
    assert!(
        expected.contains("d/b 2 4")
            && expected.contains("x/f and x/h: one inode")
            && expected.contains("other file system EXDEV")
            && expected.contains("-P links the link"),
        "tmpfs run broken:\n{expected}\n{expected_err}"
    );
    assert_eq!(got, expected, "stderr on locus:\n{got_err}");
    assert_eq!(got_err, expected_err);
    // What the file system itself holds, after the program's exit.
    let fs = open_fs(vol.path());
    let (g, h) = (fs.stat("/x/d/g").unwrap(), fs.stat("/y/h").unwrap());
    assert_eq!((g.ino, g.nlink), (h.ino, 4));
    assert_eq!(read_all(&fs, "/y/d/g"), b"linked\n");
}

/// FIFOs, sockets' names and device nodes through the library, as on tmpfs where they are
/// names: made by `mkfifo` and `mknod`, seen by `stat` and listings with their kind and
/// device number, renamed, linked, copied by tar and removed. Opening one is `EOPNOTSUPP`
/// here (the kernel serves them through `locus mount`), so the opens are not compared.
#[test]
fn special_files_are_names_as_on_tmpfs() {
    let vol = volume();
    let script = r#"
import os, stat, subprocess, sys
R = sys.argv[1]
os.mkfifo(R + "/pipe", 0o640)
os.mknod(R + "/sock", 0o600 | stat.S_IFSOCK)
os.mknod(R + "/null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
os.mknod(R + "/disk", 0o660 | stat.S_IFBLK, os.makedev(259, 70000))
os.mknod(R + "/plain", 0o640)
for name in ["pipe", "sock", "null", "disk", "plain"]:
    st = os.lstat(R + "/" + name)
    print(name, stat.filemode(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev), st.st_size)
print(sorted((e.name, e.is_file(), e.is_dir(), e.is_symlink()) for e in os.scandir(R)))
try:
    os.mkfifo(R + "/pipe")
except OSError as e:
    print("again", e.errno)
os.link(R + "/pipe", R + "/pipe2")
os.rename(R + "/disk", R + "/disk2")
print(os.lstat(R + "/pipe").st_nlink, stat.S_ISBLK(os.lstat(R + "/disk2").st_mode))
os.unlink(R + "/pipe2")
os.chmod(R + "/null", 0o644)
print(oct(os.lstat(R + "/null").st_mode))
"#;
    let (tmpfs, locus, status) = python_both(vol.path(), script);
    assert!(status.success(), "{locus}");
    assert!(
        tmpfs.contains("pipe prw-r-----") && tmpfs.contains("disk brw-r----- 259 70000"),
        "{tmpfs}"
    );
    assert_eq!(locus, tmpfs);
    // Opening one, and tar copying the tree (in one process each: the library serves one
    // process at a time).
    let out = preloaded(vol.path(), "python3")
        .args([
            "-c",
            r#"
import errno, os
try:
    os.open("/locus/pipe", os.O_RDONLY | os.O_NONBLOCK)
except OSError as e:
    print("open", errno.errorcode[e.errno])
"#,
        ])
        .output()
        .unwrap();
    assert_eq!(ok(&out, "python3"), "open ENOTSUP\n"); // EOPNOTSUPP by its other name
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let tar = tmp.path().join("special.tar");
    for args in [
        vec![
            "-C",
            "/locus",
            "-cf",
            tar.to_str().unwrap(),
            "pipe",
            "null",
            "disk2",
        ],
        vec!["--one-top-level=/locus/copy", "-xf", tar.to_str().unwrap()],
    ] {
        let out = preloaded(vol.path(), "tar").args(&args).output().unwrap();
        ok(&out, "tar");
    }
    let fs = open_fs(vol.path());
    let kinds: Vec<_> = ["/copy/pipe", "/copy/null", "/copy/disk2"]
        .iter()
        .map(|p| {
            fs.lstat(p)
                .map(|st| (st.kind, st.rdev))
                .map_err(|e| e.to_string())
        })
        .collect();
    assert_eq!(
        kinds,
        [
            Ok((fs::Kind::Fifo, 0)),
            Ok((fs::Kind::CharDevice, libc::makedev(1, 3))),
            Ok((fs::Kind::BlockDevice, libc::makedev(259, 70_000)))
        ]
    );
    let st = fs.lstat("/disk2").unwrap();
    assert_eq!(
        (st.kind, st.rdev),
        (fs::Kind::BlockDevice, libc::makedev(259, 70_000))
    );
    assert_eq!(fs.lstat("/null").unwrap().mode, 0o644);
    assert!(matches!(fs.lstat("/pipe2"), Err(fs::FsError::NotFound(_))));
}

/// Owners: files belong to the effective user and group that made them (a set-group-ID
/// directory gives its group), `chown`, `lchown` and `fchown` change them with the kernel's
/// rules for who may (root anything; a file's owner its group, to a group of its own) and
/// clear set-ID bits, and `access` answers by owner, group and others — as on tmpfs. The
/// script changes its effective ids, so it needs root.
#[test]
fn owners_behave_as_on_tmpfs() {
    if !is_root() {
        eprintln!("skipped: changing effective ids needs root");
        return;
    }
    let vol = volume();
    let script = r#"
import errno, os, stat, sys
R = sys.argv[1]
def show(name):
    st = os.lstat(R + "/" + name)
    print(name, oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid)
def attempt(what, call):
    try:
        call()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
os.chmod(R, 0o1777)
os.close(os.open(R + "/f", os.O_CREAT | os.O_WRONLY, 0o644))
os.mkdir(R + "/d", 0o755)
os.symlink("f", R + "/l")
show("f"); show("d"); show("l")
os.chown(R + "/f", 1000, 100); show("f")
os.chmod(R + "/f", 0o6755); os.chown(R + "/f", 1001, -1); show("f")
os.chmod(R + "/f", 0o2745); os.chown(R + "/f", -1, -1); show("f")
os.chmod(R + "/d", 0o6755); os.chown(R + "/d", 5, -1); show("d")
os.lchown(R + "/l", 7, 8); show("l"); show("f")
fd = os.open(R + "/f", os.O_RDONLY)
os.fchown(fd, 1002, 102)
os.close(fd)
show("f")
os.chmod(R + "/d", 0o2777); os.chown(R + "/d", 0, 100)
os.mkdir(R + "/d/sub", 0o755)
os.close(os.open(R + "/d/g", os.O_CREAT | os.O_WRONLY, 0o640))
show("d/sub"); show("d/g")
os.chown(R + "/d/g", 1000, 100)
os.setgroups([100, 200])
os.setegid(300)
os.seteuid(1000)
os.mkdir(R + "/d/mine", 0o700)
os.close(os.open(R + "/new", os.O_CREAT | os.O_WRONLY, 0o600))
os.symlink("new", R + "/newlink")
show("d/mine"); show("new"); show("newlink")
attempt("chgrp to a group of mine", lambda: os.chown(R + "/d/g", -1, 200)); show("d/g")
attempt("chgrp to another group", lambda: os.chown(R + "/d/g", -1, 400))
attempt("chown to root", lambda: os.chown(R + "/d/g", 0, -1))
attempt("chown to myself", lambda: os.chown(R + "/d/g", 1000, -1))
attempt("chgrp of a file not mine", lambda: os.chown(R + "/f", -1, 100))
print("access", [os.access(R + "/" + n, m, effective_ids=True)
                 for n in ["f", "d/g", "new", "d"] for m in (os.R_OK, os.W_OK, os.X_OK)])
os.seteuid(0)
attempt("chown back as root", lambda: os.chown(R + "/new", 0, 0)); show("new")
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(status.success());
    assert!(
        expected.contains("f 0o755 1001 100")
            && expected.contains("d/sub 0o2755 0 100")
            && expected.contains("new 0o600 1000 300")
            && expected.contains("chown to root EPERM"),
        "{expected}"
    );
    assert_eq!(got, expected);
}

/// Extended attributes through every call form (path, link's own, fd, and an fd whose name
/// is gone): create and replace flags, `user.` names refused on a link and a FIFO, 64 KiB
/// values and 255-byte names and past them, `trusted.` names hidden from a process that is
/// not root, and the size probe and `ERANGE` of the C calls — as on tmpfs.
#[test]
fn extended_attributes_behave_as_on_tmpfs() {
    if !is_root() {
        eprintln!("skipped: trusted. attributes need root");
        return;
    }
    let vol = volume();
    let script = r#"
import ctypes, errno, os, sys
R = sys.argv[1]
os.chmod(R, 0o755)
os.chdir(R)
def attempt(what, call):
    try:
        r = call()
        print(what, "ok", r if r is not None else "")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
open("f", "w").close()
os.mkdir("d")
os.symlink("f", "l")
os.mkfifo("p")
attempt("set", lambda: os.setxattr("f", "user.a", b"hello"))
attempt("create", lambda: os.setxattr("f", "user.c", b"v", os.XATTR_CREATE))
attempt("create again", lambda: os.setxattr("f", "user.c", b"w", os.XATTR_CREATE))
attempt("replace missing", lambda: os.setxattr("f", "user.none", b"w", os.XATTR_REPLACE))
attempt("replace", lambda: os.setxattr("f", "user.c", b"w", os.XATTR_REPLACE))
attempt("get", lambda: os.getxattr("f", "user.c"))
attempt("get missing", lambda: os.getxattr("f", "user.none"))
attempt("through the link", lambda: os.getxattr("l", "user.a"))
attempt("user. on the link itself", lambda: os.setxattr("l", "user.x", b"1", follow_symlinks=False))
attempt("trusted. on the link itself", lambda: os.setxattr("l", "trusted.x", b"1", follow_symlinks=False))
attempt("the link's own", lambda: os.listxattr("l", follow_symlinks=False))
attempt("user. on a fifo", lambda: os.setxattr("p", "user.x", b"1"))
attempt("trusted. on a dir", lambda: os.setxattr("d", "trusted.t", b"1"))
attempt("security. on a dir", lambda: os.setxattr("d", "security.s", b"label"))
attempt("dir list", lambda: sorted(os.listxattr("d")))
attempt("64 KiB", lambda: os.setxattr("f", "user.big", bytes(range(256)) * 256))
attempt("64 KiB back", lambda: os.getxattr("f", "user.big")[-3:])
attempt("over 64 KiB", lambda: os.setxattr("f", "user.bigger", b"x" * 65537))
attempt("a long name", lambda: os.setxattr("f", "user." + "n" * 250, b""))
attempt("too long a name", lambda: os.setxattr("f", "user." + "n" * 251, b""))
attempt("list", lambda: sorted(n[:8] for n in os.listxattr("f")))
attempt("remove", lambda: os.removexattr("f", "user.big"))
attempt("remove missing", lambda: os.removexattr("f", "user.big"))
attempt("a name no namespace has", lambda: os.setxattr("f", "nospace", b"1"))
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(3)
for call, args in [("getxattr", (b"f", b"user.a", None, 0)), ("getxattr", (b"f", b"user.a", buf, 3)),
                   ("listxattr", (b"d", None, 0)), ("listxattr", (b"d", buf, 3))]:
    n = getattr(libc, call)(*args)
    print(call, args[-1], n, errno.errorcode.get(ctypes.get_errno(), "") if n < 0 else "")
fd = os.open("f", os.O_RDONLY)
attempt("fset", lambda: os.setxattr(fd, "user.fd", b"1"))
os.unlink("f")
attempt("fget after unlink", lambda: os.getxattr(fd, "user.a"))
attempt("flist after unlink", lambda: sorted(n[:8] for n in os.listxattr(fd)))
attempt("fremove after unlink", lambda: os.removexattr(fd, "user.fd"))
os.close(fd)
dfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
attempt("dir fd", lambda: os.getxattr(dfd, "security.s"))
os.close(dfd)
os.setegid(100)
os.seteuid(1000)
attempt("trusted. hidden", lambda: sorted(os.listxattr("d")))
attempt("trusted. unreadable", lambda: os.getxattr("d", "trusted.t"))
attempt("trusted. unsettable", lambda: os.setxattr("d", "trusted.u", b"1"))
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(status.success());
    assert!(
        expected.contains("over 64 KiB E2BIG")
            && expected.contains("user. on the link itself EPERM")
            && expected.contains("trusted. hidden ok ['security.s']")
            && expected.contains("getxattr 3 -1 ERANGE"),
        "{expected}"
    );
    assert_eq!(got, expected);
}

/// `renameat2(RENAME_EXCHANGE)` through the library: files, a file and a directory across
/// directories, a directory and its parent's sibling, two names of one file, and the
/// refusals give tmpfs's tree.
#[test]
fn exchanging_two_names_behaves_as_on_tmpfs() {
    let vol = volume();
    let script = include_str!("scripts/exchange.py");
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(status.success());
    assert!(
        expected.contains("files ok two one") && expected.contains("into itself EINVAL EINVAL"),
        "{expected}"
    );
    assert_eq!(got, expected);
}

/// Everyday programs through the library on a volume filled to `ENOSPC` (`dd` in 1 MiB,
/// 4 KiB and 1-byte writes): `df` shows nothing available (it showed the checkpoint's
/// reserve, about 1 MiB, on a volume that refused every write), and `sqlite3` in WAL mode,
/// `head`, `git add` and `commit`, `sed -i` and `tar -x` each fail without harming the
/// database, repository or file they worked on; once the filler is removed the space is back
/// and each of them works. The same transcript as a size-limited tmpfs (the script `locus
/// mount`'s test runs, which checks that against tmpfs); afterwards the volume checks clean.
#[test]
fn everyday_programs_on_a_full_volume_fail_cleanly_and_recover() {
    for program in ["sqlite3", "git", "tar", "sed", "dd"] {
        assert!(
            have(program),
            "{program} is not installed (.ci/run installs it)"
        );
    }
    let vol = volume();
    let script = include_str!("scripts/full.sh");
    let (out, err) = shell(Some(vol.path()), "bash", script, &[MOUNT.as_ref()]);
    assert_eq!(format!("{out}{err}"), include_str!("scripts/full.expected"));
    let topology = topology::Topology::read_live().expect("topology");
    let volume = volume::Volume::open(vol.path(), topology, &Default::default()).unwrap();
    let check = fs::Fs::check(&volume).expect("the volume checks clean");
    assert_eq!(check.damaged_root_copy, None);
    drop(volume);
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/text").len(), 23_895, "sed -i's result");
    fs.unmount().unwrap();
}

/// `fallocate` through the library allocates: mode 0 and `--keep-size` give holes blocks
/// that `stat` counts, data written into them stays, a punched hole and a truncation free
/// them, and a request beyond the volume's free space is `ENOSPC` — as on tmpfs (the script
/// `locus mount`'s test runs too).
#[test]
fn fallocate_allocates_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let script = include_str!("scripts/fallocate.sh");
    let expected = shell(None, "bash", script, &[tmp.path().as_os_str()]);
    assert!(
        expected.0.contains("mode 0: 1048576 bytes, 2048 blocks")
            && expected.0.contains("No space left on device")
            && expected.0.contains("big: 0 bytes, 0 blocks"),
        "{expected:?}"
    );
    let got = shell(Some(vol.path()), "bash", script, &[MOUNT.as_ref()]);
    assert_eq!(got, expected);
}

/// Programs stored on the volume run: scripts by absolute and relative name (their
/// interpreter a host program, `env`, a script on the volume itself, with the `#!` line's
/// argument), a program copied in, one found on `PATH` by `env`, a link out of the volume,
/// one started by Python's `subprocess` and by `os.posix_spawn`, `make` building a C program
/// with `cc` and running it (make spawns with `posix_spawn`), a C program using `popen` and
/// `system` with relative names; a file without execute
/// permission and a missing
/// one fail as on tmpfs, and a file without a `#!` line runs as a shell script (bash's
/// fallback). Before, the kernel was handed the /locus name and every one of them failed.
#[test]
fn programs_on_the_volume_run_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let script = include_str!("scripts/programs.sh");
    let shown =
        |(out, err): (String, String), root: &str| (out.replace(root, "D"), err.replace(root, "D"));
    let root = tmp.path().to_str().unwrap();
    let expected = shown(shell(None, "bash", script, &[tmp.path().as_os_str()]), root);
    assert!(
        expected.0.contains("sh script: D/s.sh one")
            && expected.0.contains("python script: ['a', 'b']")
            && expected.0.contains("sh script: D/s.sh D/nested")
            && expected.0.contains("found on PATH by env")
            && expected.0.contains("not executable: 126"),
        "{expected:?}"
    );
    let got = shown(
        shell(Some(vol.path()), "bash", script, &[MOUNT.as_ref()]),
        MOUNT,
    );
    assert_eq!(got, expected);
}

/// A program with more threads than the file system has slots (64 with the default
/// format): 96 Python threads, all alive at once, each create, write, `fsync`, append,
/// rename and read back a file of their own — as on tmpfs, every call succeeds (the threads
/// past the slots a thread may own take turns on the shared ones; before, their `open`
/// failed with `EAGAIN`).
#[test]
fn a_program_with_more_threads_than_slots_runs_as_on_tmpfs() {
    let vol = volume();
    let script = r#"
import os, sys, threading
root = sys.argv[1]
N = 96
barrier = threading.Barrier(N)
errors, sizes = [], {}
def work(i):
    path = f"{root}/t{i}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        barrier.wait()
        for k in range(64):
            os.write(fd, bytes([i % 251]) * 4096)
        os.fsync(fd)
        os.close(fd)
        barrier.wait()
        with open(path, "ab") as f:
            f.write(b"tail %d" % i)
        os.rename(path, path + ".done")
        with open(path + ".done", "rb") as f:
            data = f.read()
        assert data[:262144] == bytes([i % 251]) * 262144, i
        sizes[i] = len(data)
    except Exception as e:
        errors.append(f"thread {i}: {e!r}")
        barrier.abort()
threads = [threading.Thread(target=work, args=(i,)) for i in range(N)]
for t in threads: t.start()
for t in threads: t.join()
print("errors:", errors[:3])
print("sizes:", sorted(set(sizes.values())), len(sizes))
print("files:", len([n for n in os.listdir(root) if n.endswith(".done")]))
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(
        expected.contains("errors: []") && expected.contains("files: 96"),
        "{expected}"
    );
    assert_eq!(got, expected);
    assert!(status.success());
    let fs = open_fs(vol.path());
    assert!(fs.stats().slots <= 64, "{:?}", fs.stats());
    for i in [0u64, 63, 95] {
        let data = read_all(&fs, &format!("/t{i}.done"));
        assert_eq!(
            data.len(),
            64 * 4096 + format!("tail {i}").len(),
            "thread {i}"
        );
        assert!(data[..64 * 4096].iter().all(|&b| u64::from(b) == i % 251));
    }
}

/// Runs `script` (Python, given the root as `sys.argv[1]`) on tmpfs without the library and
/// on /locus with it; returns (tmpfs output, locus output, the locus run's status).
fn python_both(vol: &Path, script: &str) -> (String, String, std::process::ExitStatus) {
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let plain = Command::new("python3")
        .args(["-c", script, tmp.path().to_str().unwrap()])
        .output()
        .unwrap();
    let expected = ok(&plain, "the script on tmpfs");
    let locus = preloaded(vol, "python3")
        .args(["-c", script, MOUNT])
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&locus.stdout).into_owned();
    if !locus.status.success() {
        eprintln!(
            "stderr on locus:\n{}",
            String::from_utf8_lossy(&locus.stderr)
        );
    }
    (expected, got, locus.status)
}

/// Shared mappings, with libc's `mmap` through ctypes (Python's own refuses to map past
/// the end): stores are the file's bytes and writes are the mapping's, both ways at once;
/// a mapping holds an unlinked file; `msync`, partial `munmap`; pages past the end of the
/// file `SIGBUS` and come to life when the file grows; the file shrinking under a mapping
/// makes its tail `SIGBUS` again — the same on tmpfs and on locus. Then synced stores
/// survive kill -9, and stores reach the file when the program exits or calls `exec`
/// without syncing them.
#[test]
fn shared_mappings_behave_as_on_tmpfs() {
    shared_mappings_on(false);
}

/// The same on a volume with data checksums, where the mappings map a copy of the file in
/// memory (a store to a block would leave its checksum behind): and the volume scrubs clean.
#[test]
fn shared_mappings_of_a_checksummed_volume_behave_as_on_tmpfs() {
    shared_mappings_on(true);
}

/// Python helpers for the mapping tests: libc's `mmap` through ctypes (`smap`, which
/// raises `OSError` as `mmap` fails; Python's own `mmap` refuses to map past the end),
/// `peek` and `poke` at an address; `R` is the directory the script works in.
const MAPPING_PRELUDE: &str = r#"
import ctypes, mmap, os, signal, sys
R = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
P = 4096
def smap(fd, length, offset=0, prot=mmap.PROT_READ | mmap.PROT_WRITE):
    a = libc.mmap(None, length, prot, mmap.MAP_SHARED, fd, offset)
    if a in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return a
def peek(a, n):
    return ctypes.string_at(a, n)
def poke(a, data):
    ctypes.memmove(a, data, len(data))
"#;

fn shared_mappings_on(checksums: bool) {
    let vol = volume_with(checksums);
    let prelude = MAPPING_PRELUDE;
    let main = r#"
fd = os.open(R + "/f", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"a" * 10000)
a = smap(fd, 4 * P)
print(peek(a, 3), peek(a + 9998, 2))
poke(a, b"HELLO")
print(os.pread(fd, 5, 0))
os.pwrite(fd, b"WORLD", 100)
print(peek(a + 100, 5))
os.pwrite(fd, b"x" * 70000, 8192)      # grows the file across the mapping and beyond
print(peek(a + 3 * P, 4), os.fstat(fd).st_size)
poke(a + 3 * P + 10, b"tail")
print(os.pread(fd, 4, 3 * P + 10))
print(libc.msync(a, 4 * P, 4))
# a second mapping of the same pages sees the first's stores
b = smap(fd, P, 0, mmap.PROT_READ)
print(peek(b, 5))
libc.munmap(b, P)
# a read-only descriptor cannot map for writing
ro = os.open(R + "/f", os.O_RDONLY)
try:
    smap(ro, P)
except OSError as e:
    print("read-only:", os.strerror(e.errno))
os.close(ro)
# partial unmap: the rest stays
print(libc.munmap(a + P, P))
print(peek(a, 5), peek(a + 2 * P, 1))
libc.munmap(a, 4 * P)
# an unlinked file lives on while mapped
g = os.open(R + "/g", os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(g, 2 * P)
m = smap(g, 2 * P)
os.close(g)
os.unlink(R + "/g")
poke(m + P, b"still here")
print(peek(m + P, 10), os.path.exists(R + "/g"))
libc.munmap(m, 2 * P)
# growth: pages mapped past the end come to life
h = os.open(R + "/h", os.O_RDWR | os.O_CREAT, 0o644)
os.write(h, b"h" * 100)
m = smap(h, 3 * P)
os.ftruncate(h, 3 * P)
poke(m + 2 * P + 5, b"grown")
print(os.pread(h, 5, 2 * P + 5), peek(m + 50, 3))
os.ftruncate(h, 50)                    # and shrinking keeps the first page, zeroed past 50
print(peek(m + 45, 10))
os.ftruncate(h, 2 * P)
print(peek(m + P, 4) == bytes(4))
libc.munmap(m, 3 * P)
# a punched hole reads zeros through the mapping; O_TRUNC empties it
k = os.open(R + "/k", os.O_RDWR | os.O_CREAT, 0o644)
os.write(k, b"k" * 3 * P)
m = smap(k, 3 * P)
poke(m + 2 * P, b"stored")
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
print(libc.fallocate(k, 3, P, P), peek(m + P, 4), peek(m + P - 1, 1), os.pread(k, 6, 2 * P))
t = os.open(R + "/k", os.O_RDWR | os.O_TRUNC)
os.write(t, b"new")
print(peek(m, 4), os.fstat(k).st_size, os.pread(k, 8, 0))
os.close(t)
libc.munmap(m, 3 * P)
os.close(k)
# mprotect: write access needs a descriptor opened for writing; a mapping made writable
# stays so where the file grows under it, and a part made read-only stays apart
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
q = os.open(R + "/q", os.O_RDWR | os.O_CREAT, 0o644)
os.write(q, b"q" * 100)
ro = os.open(R + "/q", os.O_RDONLY)
r = smap(ro, P, 0, mmap.PROT_READ)
print(libc.mprotect(r, P, mmap.PROT_READ | mmap.PROT_WRITE), os.strerror(ctypes.get_errno()))
libc.munmap(r, P)
os.close(ro)
m = smap(q, 3 * P, 0, mmap.PROT_READ)
print(libc.mprotect(m, 3 * P, mmap.PROT_READ | mmap.PROT_WRITE))
os.ftruncate(q, 3 * P)
poke(m + 2 * P, b"writable after growth")
print(libc.mprotect(m + P, P, mmap.PROT_READ), os.pread(q, 21, 2 * P))
poke(m, b"first page")
print(libc.msync(m, 3 * P, 4), os.pread(q, 10, 0), peek(m + P, 2))
libc.munmap(m, 3 * P)
os.close(q)
os.close(fd)
"#;
    let script = format!("{prelude}{main}");
    let (expected, got, status) = python_both(vol.path(), &script);
    assert!(status.success(), "{got}");
    assert_eq!(got, expected);
    assert!(
        expected.contains("still here")
            && expected.contains("grown")
            && expected.contains("-1 Permission denied")
            && expected.contains("writable after growth"),
        "{expected}"
    );

    // SIGBUS past the end of the file, and after a shrink.
    for (case, body) in [
        ("past the end", "a = smap(fd, 2 * P)\npeek(a + P, 1)\n"),
        (
            "after a shrink",
            "a = smap(fd, 2 * P)\nos.ftruncate(fd, 2 * P)\npeek(a + P, 1)\nos.ftruncate(fd, 10)\npeek(a + P, 1)\n",
        ),
    ] {
        let script = format!(
            "{prelude}fd = os.open(R + '/bus', os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)\n\
             os.write(fd, b'b' * 100)\nprint('mapped', flush=True)\n{body}print('no signal')\n"
        );
        let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
        for (name, mut cmd, root) in [
            (
                "tmpfs",
                Command::new("python3"),
                tmp.path().to_str().unwrap().to_owned(),
            ),
            ("locus", preloaded(vol.path(), "python3"), MOUNT.to_owned()),
        ] {
            let out = cmd.args(["-c", &script, &root]).output().unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                (
                    out.status.signal(),
                    String::from_utf8_lossy(&out.stdout).as_ref()
                ),
                (Some(libc::SIGBUS), "mapped\n"),
                "{case} on {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // Synced stores survive kill -9 of the process that made them.
    let crash = format!(
        "{prelude}fd = os.open(R + '/crash', os.O_RDWR | os.O_CREAT, 0o644)\n\
         os.ftruncate(fd, 4 * P)\na = smap(fd, 4 * P)\n\
         poke(a + 3 * P, b'synced before the kill')\nlibc.msync(a, 4 * P, 4)\n\
         print('ready', flush=True)\nimport time\ntime.sleep(60)\n"
    );
    let mut child = preloaded(vol.path(), "python3")
        .args(["-c", &crash, MOUNT])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    child.kill().unwrap();
    child.wait().unwrap();
    // A program that ends without msync or munmap: its stores are written at exit.
    let exits = format!(
        "{prelude}fd = os.open(R + '/exit', os.O_RDWR | os.O_CREAT, 0o644)\n\
         os.ftruncate(fd, 2 * P)\na = smap(fd, 2 * P)\npoke(a + P + 7, b'stored, then exit')\n"
    );
    ok(
        &preloaded(vol.path(), "python3")
            .args(["-c", &exits, MOUNT])
            .output()
            .unwrap(),
        "a program storing through a mapping, then exiting",
    );
    // One that runs another program in its place: they are written before the exec.
    let execs = format!(
        "{prelude}fd = os.open(R + '/exec', os.O_RDWR | os.O_CREAT, 0o644)\n\
         os.ftruncate(fd, 2 * P)\na = smap(fd, 2 * P)\npoke(a + 9, b'stored, then exec')\n\
         os.execv('/bin/true', ['true'])\n"
    );
    ok(
        &preloaded(vol.path(), "python3")
            .args(["-c", &execs, MOUNT])
            .output()
            .unwrap(),
        "a program storing through a mapping, then calling exec",
    );
    let fs = open_fs(vol.path());
    let data = read_all(&fs, "/exit");
    assert_eq!(&data[4096 + 7..4096 + 24], b"stored, then exit");
    assert_eq!(&read_all(&fs, "/exec")[9..26], b"stored, then exec");
    let data = read_all(&fs, "/crash");
    assert_eq!(&data[3 * 4096..3 * 4096 + 22], b"synced before the kill");
    assert_eq!(read_all(&fs, "/f")[..5], *b"HELLO");
    drop(fs);
    scrubs_clean(vol.path(), checksums);
}

/// A program that let the volume go at a fork (no locus fd open: `subprocess.run`) and
/// mounted it again maps a file and syncs it. On a volume with data checksums the sync is a
/// write, whose thread first drops what it held of the earlier mount — one of the file
/// system's own mappings, whose `munmap` waited for the table of shared mappings the sync
/// held: the program hung (`timeout` ends it with 124) until the library's own calls went
/// straight to libc.
#[test]
fn a_mapping_synced_after_a_remount_returns() {
    let script = r#"
import ctypes, mmap, os, subprocess, sys
R = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
P = 4096
fd = os.open(R + "/again", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"a" * 2 * P)
os.close(fd)
subprocess.run(["true"], check=True)
fd = os.open(R + "/again", os.O_RDWR)
a = libc.mmap(None, 2 * P, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
ctypes.memmove(a + P, b"after a fork", 12)
print(libc.msync(a, 2 * P, 4), os.pread(fd, 12, P))  # MS_SYNC
"#;
    for checksums in [false, true] {
        let vol = volume_with(checksums);
        let out = preloaded(vol.path(), "timeout")
            .args(["60", "python3", "-c", script, MOUNT])
            .output()
            .unwrap();
        assert_eq!(
            ok(&out, &format!("checksums {checksums}")),
            "0 b'after a fork'\n"
        );
        let fs = open_fs(vol.path());
        assert_eq!(&read_all(&fs, "/again")[4096..4108], b"after a fork");
        drop(fs);
        scrubs_clean(vol.path(), checksums);
    }
}

/// SQLite in WAL mode (its `-shm` index is a shared mapping): transactions, a second
/// connection reading while the first writes (threads of one process), a checkpoint, then
/// `integrity_check` and a digest of the table — the same output as on tmpfs; and the
/// `sqlite3` shell reads the database back afterwards.
#[test]
fn sqlite_in_wal_mode_behaves_as_on_tmpfs() {
    sqlite_in_wal_mode_on(false);
}

/// The same on a volume with data checksums (the `-shm` index maps a copy of the file in
/// memory there), which then scrubs clean.
#[test]
fn sqlite_in_wal_mode_on_a_checksummed_volume_behaves_as_on_tmpfs() {
    sqlite_in_wal_mode_on(true);
}

fn sqlite_in_wal_mode_on(checksums: bool) {
    assert!(
        have("sqlite3"),
        "sqlite3 is not installed (.ci/run installs it)"
    );
    let vol = volume_with(checksums);
    let script = r#"
import hashlib, sqlite3, sys, threading
R = sys.argv[1]
db = sqlite3.connect(R + "/w.db", isolation_level=None, check_same_thread=False)
print(db.execute("PRAGMA journal_mode=WAL").fetchone()[0])
db.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)")
seen = []
stop = threading.Event()
def reader():
    r = sqlite3.connect(R + "/w.db", isolation_level=None)
    while not stop.is_set():
        n = r.execute("SELECT count(*) FROM t").fetchone()[0]
        assert n % 100 == 0, n          # whole transactions only
        seen.append(n)
    r.close()
th = threading.Thread(target=reader)
th.start()
for i in range(60):
    db.execute("BEGIN")
    db.executemany("INSERT INTO t(v) VALUES (?)", [("%d-%d" % (i, j) * 3,) for j in range(100)])
    db.execute("COMMIT")
    if i == 30:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
stop.set()
th.join()
print(db.execute("SELECT count(*) FROM t").fetchone()[0], len(seen) > 0)
print(db.execute("PRAGMA integrity_check").fetchone()[0])
rows = db.execute("SELECT k, v FROM t ORDER BY k").fetchall()
print(hashlib.sha256(repr(rows).encode()).hexdigest())
db.close()
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(status.success(), "{got}");
    assert_eq!(got, expected);
    assert!(expected.starts_with("wal\n6000 True\nok\n"), "{expected}");
    let out = ok(
        &preloaded(vol.path(), "sqlite3")
            .args([
                &format!("{MOUNT}/w.db"),
                "PRAGMA journal_mode; SELECT count(*) FROM t; PRAGMA integrity_check;",
            ])
            .output()
            .unwrap(),
        "sqlite3 shell",
    );
    assert_eq!(out, "wal\n6000\nok\n");
    scrubs_clean(vol.path(), checksums);
}

/// Two SQLite processes at once, each with its own database (rollback journal, so `fcntl`
/// locks and no shared memory): `sqlite3 a.db .dump | sqlite3 b.db`, the example of a
/// pipeline with /locus in two busy stages. The stages take turns with the volume, each
/// stalled on the pipe in its turn, and b.db ends as a.db (before, the second failed with
/// `EBUSY` and b.db was left empty: the first held locks, and a lock kept the volume).
#[test]
fn a_sqlite_dump_piped_into_another_sqlite_copies_the_database() {
    assert!(
        have("sqlite3"),
        "sqlite3 is not installed (.ci/run installs it)"
    );
    let vol = volume();
    let script = r#"
        set -e
        mkdir -p /locus/db
        {
            echo 'BEGIN; CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);'
            for i in $(seq 3000); do echo "INSERT INTO t(v) VALUES (printf('%0200d', $i));"; done
            echo 'COMMIT;'
        } | sqlite3 /locus/db/a.db
        sqlite3 /locus/db/a.db .dump | sqlite3 /locus/db/b.db
        for db in a b; do
            sqlite3 /locus/db/$db.db 'SELECT count(*), sum(k), sum(length(v)) FROM t; PRAGMA integrity_check;'
        done
    "#;
    let out = preloaded(vol.path(), "bash")
        .args(["-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(&out, "a dump piped into a second sqlite3");
    assert_eq!(stdout, "3000|4501500|600000\nok\n".repeat(2));
    assert_eq!(stderr, "", "nothing failed to mount");
}

/// On a volume with data checksums: every block of every file matches its checksum.
/// A file with a damaged block, mapped on a volume with data checksums: the mapping works
/// but for that page, which is `SIGBUS` — in the process and, after a `fork`, in both — as a
/// kernel file system's page it cannot read; a read of it is `EIO`, pages beside it read,
/// store and sync as usual, and a write of the whole block replaces it under the mapping.
/// (Before, `mmap` of such a file failed with `EIO` whole.)
#[test]
fn a_damaged_block_of_a_mapped_file_faults_only_there() {
    const P: usize = 4096;
    const MARKER: &[u8] = b"the block a flipped bit damages";
    let vol = volume_with(true);
    {
        let fs = open_fs(vol.path());
        let mut data = vec![b'a'; 4 * P];
        data[P..2 * P].fill(b'b');
        data[P..P + MARKER.len()].copy_from_slice(MARKER);
        data[2 * P..3 * P].fill(b'c');
        data[3 * P..].fill(b'd');
        fs.create("/d").unwrap().write_at(&data, 0).unwrap();
    }
    // A bit of the marked block flipped on the device.
    testkit::damage_marked_block(vol.path(), MARKER);
    let prelude =
        format!("{MAPPING_PRELUDE}fd = os.open(R + '/d', os.O_RDWR)\na = smap(fd, 4 * P)\n");
    // Touching the damaged page: SIGBUS, after the pages beside it read — also in a child
    // and in the parent after a fork (whose mappings become private copies).
    let touch = format!(
        "{prelude}print(peek(a, 3), peek(a + 2 * P, 3), peek(a + 3 * P, 3), flush=True)\n\
         pid = os.fork()\n\
         if pid == 0:\n    print('child', peek(a + 2 * P, 1), flush=True)\n    peek(a + P, 1)\n    os._exit(0)\n\
         _, status = os.waitpid(pid, 0)\n\
         print('child signal', os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)\n\
         print('parent', peek(a + 3 * P, 1), flush=True)\n\
         peek(a + P, 1)\nprint('no signal')\n"
    );
    let out = preloaded(vol.path(), "python3")
        .args(["-c", &touch, MOUNT])
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (
            out.status.signal(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (
            Some(libc::SIGBUS),
            format!(
                "b'aaa' b'ccc' b'ddd'\nchild b'c'\nchild signal {}\nparent b'd'\n",
                libc::SIGBUS
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("whose 4 KiB pages at offsets 4096 cannot be read"),
        "{stderr}"
    );

    // Reads, stores beside it, a partial write (still damaged, and not written back from
    // the copy at a sync: the file's own read fails once the mapping is gone), a whole-block
    // write (the page of a new mapping maps the new bytes), a store to it.
    let repair = format!(
        "{prelude}try:\n    os.pread(fd, 10, P + 100)\nexcept OSError as e:\n    print('read:', os.strerror(e.errno))\n\
         print(os.pread(fd, 3, 2 * P))\n\
         poke(a + 2 * P, b'CC')\n\
         print(libc.msync(a, 4 * P, 4), os.pread(fd, 3, 2 * P))\n\
         os.pwrite(fd, b'x' * 10, P + 5)\n\
         print(libc.msync(a, 4 * P, 4), libc.munmap(a, 4 * P))\n\
         try:\n    os.pread(fd, 1, P)\nexcept OSError as e:\n    print('after a partial write and a sync:', os.strerror(e.errno))\n\
         a = smap(fd, 4 * P)\n\
         os.pwrite(fd, b'B' * P, P)\n\
         print(peek(a + P, 3), os.pread(fd, 3, P))\n\
         poke(a + P, b'b')\n\
         print(libc.munmap(a, 4 * P))\n"
    );
    let got = ok(
        &preloaded(vol.path(), "python3")
            .args(["-c", &repair, MOUNT])
            .output()
            .unwrap(),
        "reads and writes around a damaged mapped block",
    );
    assert_eq!(
        got,
        "read: Input/output error\nb'ccc'\n0 b'CCc'\n\
         0 0\nafter a partial write and a sync: Input/output error\nb'BBB' b'BBB'\n0\n"
    );
    let fs = open_fs(vol.path());
    let data = read_all(&fs, "/d");
    assert_eq!(data.len(), 4 * P);
    assert!(data[..P].iter().all(|&b| b == b'a'));
    assert_eq!(&data[P..P + 2], b"bB");
    assert!(data[P + 1..2 * P].iter().all(|&b| b == b'B'));
    assert_eq!(&data[2 * P..2 * P + 3], b"CCc");
    assert!(data[3 * P..].iter().all(|&b| b == b'd'));
    drop(fs);
    scrubs_clean(vol.path(), true);
}

fn scrubs_clean(vol: &Path, checksums: bool) {
    if checksums {
        let report = fs::Fs::scrub(&open_volume_for_check(vol)).expect("scrub");
        assert!(report.damaged.is_empty() && report.blocks > 0, "{report:?}");
    }
}

/// kill -9 of a program committing SQLite transactions in WAL mode, several rounds on one
/// database: every round's database passes `integrity_check` and holds every transaction
/// the program reported committed before it was killed.
#[test]
fn sqlite_in_wal_mode_survives_kill_9() {
    sqlite_in_wal_mode_survives_kill_9_on(false);
}

/// The same on a volume with data checksums: the index's stores since its last write-back
/// die with the program, and SQLite rebuilds it from the WAL; the volume scrubs clean.
#[test]
fn sqlite_in_wal_mode_on_a_checksummed_volume_survives_kill_9() {
    sqlite_in_wal_mode_survives_kill_9_on(true);
}

fn sqlite_in_wal_mode_survives_kill_9_on(checksums: bool) {
    let vol = volume_with(checksums);
    let writer = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE IF NOT EXISTS t(k INTEGER PRIMARY KEY, round INTEGER, v BLOB)")
r = int(sys.argv[2])
i = 0
while True:
    db.execute("BEGIN")
    db.executemany("INSERT INTO t(round, v) VALUES (?, ?)", [(r, b"x" * 300)] * 20)
    db.execute("COMMIT")
    i += 1
    print(i, flush=True)
"#;
    let check = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(db.execute("PRAGMA integrity_check").fetchone()[0])
for r, n in db.execute("SELECT round, count(*) FROM t GROUP BY round ORDER BY round"):
    print(r, n)
"#;
    let path = format!("{MOUNT}/k.db");
    let mut reported = Vec::new();
    for round in 0..5u64 {
        let mut child = preloaded(vol.path(), "python3")
            .args(["-c", writer, &path, &round.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Let it commit a while: until a round-dependent number of transactions.
        let until = 20 + 15 * round;
        let mut last = 0;
        for line in lines.by_ref() {
            last = line.unwrap().trim().parse::<u64>().unwrap();
            if last >= until {
                break;
            }
        }
        child.kill().unwrap();
        // Lines already written before the kill are reports too.
        for line in lines.map_while(Result::ok) {
            if let Ok(n) = line.trim().parse::<u64>() {
                last = last.max(n);
            }
        }
        child.wait().unwrap();
        reported.push(last);
        let out = ok(
            &preloaded(vol.path(), "python3")
                .args(["-c", check, &path])
                .output()
                .unwrap(),
            "integrity check",
        );
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("ok"), "round {round}: {out}");
        for (r, line) in lines.enumerate() {
            let (rr, n) = line.split_once(' ').unwrap();
            assert_eq!(rr.parse::<usize>().unwrap(), r);
            let n: u64 = n.parse().unwrap();
            assert!(
                n >= 20 * reported[r],
                "round {r}: {n} rows, {} transactions reported committed",
                reported[r]
            );
        }
    }
    scrubs_clean(vol.path(), checksums);
}

/// A shell creates, appends, renames and reads back, with redirections the shell itself
/// performs and commands it forks.
#[test]
fn a_shell_script_creates_renames_appends_and_reads_back() {
    let vol = volume();
    let script = r#"
        set -e
        mkdir /locus/s
        echo first > /locus/s/log
        echo second >> /locus/s/log
        printf 'third\n' >> /locus/s/log
        mv /locus/s/log /locus/s/log.1
        test -f /locus/s/log.1 && test ! -e /locus/s/log && echo renamed
        while read line; do echo "read: $line"; done < /locus/s/log.1
        cat /locus/s/log.1
        exec 3>>/locus/s/log.1
        echo fourth >&3
        exec 3>&-
        wc -l < /locus/s/log.1
        [ "$(head -c 5 /locus/s/log.1)" = first ] && echo head ok
    "#;
    let out = run_c(vol.path(), "bash", script, "bash script");
    assert_eq!(
        out,
        "renamed\nread: first\nread: second\nread: third\nfirst\nsecond\nthird\n4\nhead ok\n"
    );
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/s/log.1"), b"first\nsecond\nthird\nfourth\n");
    assert!(fs.stat("/s/log").is_err());
}

/// An fd a shell opens once and its children inherit shares one offset between them, as a
/// kernel file's open description does: `cmd > log 2>&1` keeps stdout and stderr in order,
/// commands a group or loop starts write after each other and after the group's own lines
/// (`./build.sh > log 2>&1`), and a child that reads
/// a line of the group's input leaves the group the line after it. The same script on tmpfs
/// and on locus, the second with dash (which ends with `_exit`, without exit handlers) and
/// bash as the children.
#[test]
fn inherited_fds_share_their_offset_with_children_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"
        set -e
        export LC_ALL=C
        cd "$1"
        for sh in sh bash; do
            $sh -c 'echo a; echo b >&2; echo c' > both 2>&1
            ( echo one; ls ./missing; echo three ) > sub 2>&1 || true
            { echo start; for i in 1 2 3; do $sh -c 'echo out $0; echo err $0 >&2' $i; done; echo end; } > loop 2>&1
            printf '1\n2\n3\n4\n' > in
            { read a; $sh -c 'read b; echo "child $b"'; read c; echo "group $a $c"; } < in > read
            cat both sub loop read
        done
    "#;
    let run = |dir: &str, preload: bool| bash_in(preload.then_some(vol.path()), script, dir);
    let on_tmpfs = run(tmp.path().to_str().unwrap(), false);
    let once = "a\nb\nc\none\nls: cannot access './missing': No such file or directory\nthree\n\
                start\nout 1\nerr 1\nout 2\nerr 2\nout 3\nerr 3\nend\nchild 2\ngroup 1 3\n";
    assert_eq!(on_tmpfs, once.repeat(2), "the script itself");
    assert_eq!(run(MOUNT, true), on_tmpfs);
}

/// Pipelines run in a locus working directory: bash's child resolves `.` while it looks its
/// command up, which mounts the volume there until its `exec`, so each stage of `ls f |
/// cat` mounts — and one of them failed with `EBUSY` (`ls` in about a third of the runs,
/// the other child's lookup every time) until a mount waited for a holder that lets go.
/// A child whose lookup comes while a writer into its pipe holds the volume gets `.` as it
/// was at the `chdir` instead of waiting (the writer would wait for it: a second's stall and
/// a "cannot mount" line before). A process that keeps the volume still makes the other
/// fail with `EBUSY`, once the wait (`LOCUS_BUSY_WAIT`) has passed.
#[test]
fn pipelines_in_a_locus_directory_run_as_on_tmpfs() {
    let vol = volume();
    let script = r#"
        set -e
        mkdir -p /locus/p && cd /locus/p
        echo data > f
        for i in $(seq 20); do ls f | cat; done
        for i in $(seq 5); do cat f | tr a-z A-Z | sort; done
        # a reader that looks its command up while the writer holds the volume, and the
        # writer waits for it (more than a pipe's worth): answered, no wait, no message
        seq 1 300000 > big
        cat big | { read x; grep -c 7; }
        echo done
    "#;
    let out = preloaded(vol.path(), "bash")
        .args(["-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = ok(&out, "pipelines");
    let sevens = (2..=300_000)
        .filter(|n: &u32| n.to_string().contains('7'))
        .count();
    assert_eq!(
        stdout,
        format!("{}{}{sevens}\ndone\n", "f\n".repeat(20), "DATA\n".repeat(5))
    );
    assert_eq!(stderr, "", "nothing failed to mount");

    // A holder that stays (a directory stream of the volume, which could not be taken up
    // again as it was): the second program fails once the wait is over, saying who holds
    // the volume.
    let mut holder = preloaded(vol.path(), "python3")
        .args([
            "-c",
            "import os, sys\nd = os.scandir('/locus/p')\nnext(d)\n\
             print('held', flush=True)\nsys.stdin.read()\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n");
    let second = preloaded(vol.path(), "cat")
        .env("LOCUS_BUSY_WAIT", "0.2")
        .arg("/locus/p/f")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success()
            && err.contains(&format!("in use by pid {}", holder.id()))
            && err.contains("Device or resource busy"),
        "{err}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // A malformed wait is named.
    let bad = preloaded(vol.path(), "cat")
        .env("LOCUS_BUSY_WAIT", "soon")
        .arg("/locus/p/f")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("LOCUS_BUSY_WAIT=soon: not a number of seconds"),
        "{err}"
    );
}

/// Locks hold across processes as on tmpfs: a program holding a `flock` and a record lock
/// lets go of the volume between its calls (the kernel keeps its locks, on the inode's lock
/// file), and other programs find them — a non-blocking attempt fails, `F_GETLK` names the
/// holder's pid, a blocking one waits until the holder unlocks — a forked child shares its
/// parent's `flock` (unlocking it there releases it), and closing any fd of the file drops
/// the process's record locks. (Before, a program holding a lock kept the volume: the others
/// failed with `EBUSY` instead of seeing the lock.)
#[test]
fn locks_hold_across_processes_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir().unwrap();
    let driver = r#"
import fcntl, os, struct, subprocess, sys, time
p = os.path.join(sys.argv[1], 'f')
open(p, 'w').write('data')
os.environ['HOLDER'] = str(os.getpid())
probe = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
out = []
for name, call in [('flock', lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)),
                   ('lockf 5+5', lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 5)),
                   ('lockf 20+5', lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 20))]:
    try:
        call()
        out.append(name + ' ok')
    except OSError:
        out.append(name + ' busy')
got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqixxxx', fcntl.F_WRLCK, 0, 0, 1, 0))
kind, _, start, length, pid = struct.unpack('hhqqixxxx', got)
holder = 'holder' if pid == int(os.environ['HOLDER']) else pid
out.append('getlk ' + ('none' if kind == fcntl.F_UNLCK else '%d+%d by %s' % (start, length, holder)))
print(', '.join(out))
"""
def other():
    r = subprocess.run([sys.executable, '-c', probe, p], capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()
fd = os.open(p, os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
print('held:', other())
waiter = subprocess.Popen([sys.executable, '-c',
    'import fcntl, sys\nf = open(sys.argv[1])\nfcntl.flock(f, fcntl.LOCK_SH)\nprint("waited")', p],
    stdout=subprocess.PIPE, text=True)
time.sleep(0.5)
print('waiter before the unlock:', 'done' if waiter.poll() is not None else 'waiting')
fcntl.flock(fd, fcntl.LOCK_UN)
print('waiter after:', waiter.communicate()[0].strip())
fcntl.flock(fd, fcntl.LOCK_EX)
child = os.fork()
if child == 0:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os._exit(0)
os.waitpid(child, 0)
print('after the child unlocked:', other())
os.close(os.open(p, os.O_RDONLY))
print('after a close:', other())
os.remove(p)
"#;
    let run = |dir: &str, preload: bool| {
        let mut cmd = match preload {
            true => preloaded(vol.path(), "python3"),
            false => Command::new("python3"),
        };
        ok(
            &cmd.args(["-c", driver, dir]).output().unwrap(),
            &format!("locks in {dir}"),
        )
    };
    let on_tmpfs = run(tmp.path().to_str().unwrap(), false);
    assert_eq!(
        on_tmpfs,
        "held: flock busy, lockf 5+5 busy, lockf 20+5 ok, getlk 0+10 by holder\n\
         waiter before the unlock: waiting\n\
         waiter after: waited\n\
         after the child unlocked: flock ok, lockf 5+5 busy, lockf 20+5 ok, getlk 0+10 by holder\n\
         after a close: flock ok, lockf 5+5 ok, lockf 20+5 ok, getlk none\n",
        "the script itself"
    );
    assert_eq!(run(MOUNT, true), on_tmpfs);
    // The file's lock file went with the file: kept while the driver held it (suspended
    // while its children ran), gone with the next mount after it.
    ok(
        &preloaded(vol.path(), "ls").arg(MOUNT).output().unwrap(),
        "a mount after the driver",
    );
    let lock_files: Vec<_> = std::fs::read_dir(vol.path().join("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(lock_files.is_empty(), "{lock_files:?}");
}

/// Where the volume directory's lock files cannot be made (here a file stands where their
/// directory goes; in use, a volume directory the user cannot write), locks still hold
/// among a program's own descriptions, on a lock file of the program's own, and it says so
/// once.
#[test]
fn locks_hold_within_a_program_without_the_volumes_lock_files() {
    let vol = volume();
    ok(
        &preloaded(vol.path(), "sh")
            .args(["-c", "echo data > /locus/f"])
            .output()
            .unwrap(),
        "setup",
    );
    std::fs::write(vol.path().join("locks"), b"not a directory").unwrap();
    let script = r#"
import fcntl, os
a = os.open('/locus/f', os.O_RDWR)
b = os.open('/locus/f', os.O_RDWR)
fcntl.flock(a, fcntl.LOCK_EX)
try:
    fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print('second flock taken')
except BlockingIOError:
    print('second flock refused')
fcntl.flock(a, fcntl.LOCK_UN)
fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
fcntl.lockf(a, fcntl.LOCK_EX, 10, 0)
print('done')
"#;
    let out = preloaded(vol.path(), "python3")
        .args(["-c", script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        ok(&out, "locks without lock files"),
        "second flock refused\ndone\n"
    );
    assert_eq!(
        stderr
            .matches("locks on locus files hold within this program only")
            .count(),
        1,
        "{stderr}"
    );
}

/// Processes take turns: a program through the library that holds nothing of the volume
/// between its calls lets go of it when another process asks (over the volume's control
/// socket), and mounts it again at its next call. So `make -j2` builds in a locus
/// directory (make holds the volume while it waits for its compilers, which need it, and
/// each compiler for the other: before, one of them failed with `EBUSY`), and an idle
/// program does not keep a second one out, even with files open.
#[test]
fn processes_take_turns_with_the_volume() {
    let vol = volume();
    let script = r#"
        set -e
        mkdir -p /locus/mk && cd /locus/mk
        cat > main.c <<'EOF'
#include <stdio.h>
int f(int);
int main(void) { printf("%d\n", f(20)); return 0; }
EOF
        echo 'int f(int x) { return x < 2 ? x : f(x - 1) + f(x - 2); }' > f.c
        objs="main.o f.o"
        for i in 1 2 3 4 5 6; do
            echo "int g$i(int x) { return x * $i; }" > g$i.c
            objs="$objs g$i.o"
        done
        {
            echo "prog: $objs"
            printf '\t$(CC) -o $@ $^\n'
            echo '%.o: %.c'
            printf '\t$(CC) -O2 -c -o $@ $<\n'
        } > Makefile
        make -s -j2
        ./prog
        ls *.o | wc -l
    "#;
    let out = run_c(vol.path(), "bash", script, "make -j2 in a locus directory");
    assert_eq!(out, "6765\n8\n");

    // An idle holder lets a second program in, and goes on afterwards.
    let (second, rest) = beside_an_idle_holder(
        vol.path(),
        r#"
import sys
with open('/locus/first', 'w') as f:
    f.write('from the first\n')
print('ready', flush=True)
sys.stdin.readline()
with open('/locus/first', 'a') as f:
    f.write('and again\n')
print(open('/locus/second').read(), end='', flush=True)
"#,
        "cat /locus/first && echo 'from the second' > /locus/second",
        "a second program beside an idle one",
    );
    assert_eq!(second, "from the first\n");
    assert_eq!(rest, ["from the second"]);

    // A holder with files open lets go too: they are suspended and reopened at their next
    // use, where they were (a file read half way, a file written half way).
    let (second, rest) = beside_an_idle_holder(
        vol.path(),
        r#"
import os, sys
r = os.open('/locus/first', os.O_RDONLY)
w = os.open('/locus/log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(w, os.read(r, 5))
print('ready', flush=True)
sys.stdin.readline()
os.write(w, os.read(r, 100))
os.close(w)
print(open('/locus/log').read(), end='', flush=True)
"#,
        "cat /locus/log; echo 'from the third' > /locus/third",
        "a second program beside one with files open",
    );
    assert_eq!(second, "from ");
    assert_eq!(rest, ["from the first", "and again"]);
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/first"), b"from the first\nand again\n");
    assert_eq!(read_all(&fs, "/third"), b"from the third\n");
}

/// A program whose thread reads and writes its open locus file without pause still lets
/// others in between its calls, and none of its calls fails for it: a release checks that no
/// call holds one of the descriptions it suspends (one did: `ESHUTDOWN` from a write that
/// ran into the unmount), a call that finds its fd suspended under it reopens it (`EBADF`
/// before), and the holder gives way for a moment after it let go (it took the volume back
/// at once before: most of the other programs failed with `EBUSY`).
#[test]
fn a_busy_holder_lets_others_in_without_failing_a_call() {
    let vol = volume();
    let setup = "import os\nfd = os.open('/locus/data', os.O_WRONLY | os.O_CREAT)\n\
                 for i in range(64):\n    os.write(fd, bytes([i]) * 4096)\n\
                 open('/locus/small', 'w').write('small\\n')\n";
    ok(
        &preloaded(vol.path(), "python3")
            .args(["-c", setup])
            .output()
            .unwrap(),
        "setup",
    );
    let (cats, rest) = beside_an_idle_holder_while(
        vol.path(),
        r#"
import os, sys, threading
fd = os.open('/locus/data', os.O_RDWR)
errors, calls, stop = [], [0], [False]
def work():
    i = 0
    while not stop[0]:
        off = (i * 7 % 64) * 4096
        want = bytes([off // 4096]) * 4096
        try:
            os.pwrite(fd, want, off)
            if os.pread(fd, 4096, off) != want:
                errors.append('wrong bytes at %d' % off)
        except OSError as e:
            errors.append('%s at %d' % (e, off))
        i += 1
        calls[0] += 1
t = threading.Thread(target=work)
t.start()
print('ready', flush=True)
sys.stdin.readline()
stop[0] = True
t.join()
print('calls', 'many' if calls[0] > 100 else calls[0], 'errors', errors[:3], flush=True)
"#,
        || {
            (0..40)
                .map(|_| {
                    preloaded(vol.path(), "cat")
                        .arg("/locus/small")
                        .output()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        },
    );
    for (i, cat) in cats.iter().enumerate() {
        assert_eq!(ok(cat, &format!("cat {i} beside a busy holder")), "small\n");
    }
    assert_eq!(rest, ["calls many errors []"]);
}

/// A file another process renames or removes while this one's fd of it is suspended (across
/// a fork, an exec, or the other process's turn with the volume) is still the fd's file, as
/// on tmpfs: a shell reading a log that `mv` rotates reads on in the renamed file, a writer
/// appends to it, a file `rm` removed or `sed -i` replaced reads as it was, a directory fd
/// and the working directory follow their directory's rename, and an idle holder reads the
/// rest of such files. (Before, the fd was reopened by its path, which
/// named another file or none: it was closed with a message.) Removed files are kept only
/// while a live process holds them: once the holders are done — or killed — the next mount
/// frees them.
#[test]
fn renamed_and_removed_files_stay_open_across_turns_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"
        set -e
        export LC_ALL=C
        mkdir -p "$1" && cd "$1"
        printf 'one\ntwo\nthree\n' > log
        exec 3< log
        read -r first <&3
        mv log log.1
        echo four >> log.1
        echo new > log
        cat <&3
        exec 3<&-
        exec 4>> out
        echo a >&4
        mv out out.old
        echo b >&4
        exec 4>&-
        printf 'kept\n' > gone
        exec 5< gone
        rm gone
        cat <&5
        printf 'old\n' > edited
        exec 6< edited
        sed -i s/old/new/ edited
        cat - edited <&6
        exec 5<&- 6<&-
        mkdir -p sub/inner && echo deep > sub/inner/f
        cd sub
        exec 7< inner
        mv ../sub ../moved
        cat inner/f
        ls /dev/fd/7/
        exec 7<&-
        cd ..
        echo "$first"; cat out.old log; ls
    "#;
    let run = |dir: &str, preload: bool| bash_in(preload.then_some(vol.path()), script, dir);
    let on_tmpfs = run(tmp.path().to_str().unwrap(), false);
    assert_eq!(
        on_tmpfs,
        "two\nthree\nfour\nkept\nold\nnew\ndeep\nf\none\na\nb\nnew\nedited\nlog\nlog.1\nmoved\n\
         out.old\n",
        "the script itself"
    );
    assert_eq!(run(&format!("{MOUNT}/d"), true), on_tmpfs);

    let (_, rest) = beside_an_idle_holder(
        vol.path(),
        r#"
import os, sys
open('/locus/rot', 'w').write('0123456789')
fd = os.open('/locus/rot', os.O_RDWR)
os.read(fd, 4)
print('ready', flush=True)
sys.stdin.readline()
os.write(fd, b'ab')
print(os.read(fd, 100).decode(), end='', flush=True)
"#,
        "mv /locus/rot /locus/rot.1 && echo more >> /locus/rot.1 && echo new > /locus/rot",
        "renaming the file an idle holder has open",
    );
    assert_eq!(rest, ["6789more"]);
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/rot.1"), b"0123ab6789more\n");
    assert_eq!(read_all(&fs, "/rot"), b"new\n");
    fs.unmount().unwrap();

    let setup = "printf 'old text' > /locus/edited; printf 'doomed' > /locus/removed";
    ok(
        &preloaded(vol.path(), "bash")
            .args(["-c", setup])
            .output()
            .unwrap(),
        "setup",
    );
    let orphans = "ls -a /locus; ls -a /locus/.locus-orphans 2>/dev/null | wc -l";
    let (second, rest) = beside_an_idle_holder(
        vol.path(),
        r#"
import os, sys
a = os.open('/locus/edited', os.O_RDONLY)
b = os.open('/locus/removed', os.O_RDWR)
first = os.read(a, 4).decode() + '|' + os.read(b, 4).decode()
print('ready', flush=True)
sys.stdin.readline()
os.write(b, b'!')
print(first, os.read(a, 100).decode(), os.pread(b, 100, 0).decode(), flush=True)
"#,
        &format!(
            "sed -i s/old/new/ /locus/edited && rm /locus/removed && cat /locus/edited; {orphans}"
        ),
        "replacing and removing files an idle holder has open",
    );
    // Meanwhile the two files wait in the orphans' directory, out of the way.
    let names = "d\nedited\nrot\nrot.1\n";
    assert_eq!(second, format!("new text.\n..\n.locus-orphans\n{names}4\n"));
    assert_eq!(rest, ["old |doom text doom!d"]);
    let run = |script: &str, what: &str| {
        ok(
            &preloaded(vol.path(), "bash")
                .args(["-c", script])
                .output()
                .unwrap(),
            what,
        )
    };
    assert_eq!(
        run(orphans, "after the holder"),
        format!(".\n..\n{names}0\n")
    );

    // A holder killed while it holds a removed file leaves nothing behind either.
    let mut holder = preloaded(vol.path(), "python3")
        .args([
            "-c",
            "import os, sys\nfd = os.open('/locus/edited', os.O_RDONLY)\n\
             print('ready', flush=True)\nsys.stdin.readline()\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    assert_eq!(
        run(
            &format!("rm /locus/edited; {orphans}"),
            "rm beside a holder"
        ),
        ".\n..\n.locus-orphans\nd\nrot\nrot.1\n3\n"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(
        run(orphans, "after the holder's kill"),
        ".\n..\nd\nrot\nrot.1\n0\n"
    );
}

/// Runs the Python script `holder` under the library until it prints `ready` (idle between
/// its locus calls, waiting for a line on its stdin), then the bash script `second` beside
/// it; then lets the holder go on to its end. The second's stdout, and the holder's lines
/// after `ready`.
fn beside_an_idle_holder(
    vol: &Path,
    holder: &str,
    second: &str,
    what: &str,
) -> (String, Vec<String>) {
    beside_an_idle_holder_while(vol, holder, || {
        ok(
            &preloaded(vol, "bash")
                .args(["-c", second])
                .output()
                .unwrap(),
            what,
        )
    })
}

/// [`beside_an_idle_holder`] with `meanwhile` run while the holder waits: its result, and
/// the holder's lines after `ready`.
fn beside_an_idle_holder_while<T>(
    vol: &Path,
    holder: &str,
    meanwhile: impl FnOnce() -> T,
) -> (T, Vec<String>) {
    use std::io::Write;
    let mut child = preloaded(vol, "python3")
        .args(["-c", holder])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let result = meanwhile();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let rest = lines.map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success(), "the holder");
    (result, rest)
}

/// Programs that make temporary files beside their target and check streams with
/// `fstat(fileno(f))`: `sed -i`, `sort -o F F`, `git init`; and libc's `mkstemp`/`mkdtemp`
/// from a working directory inside /locus — every name is made on the volume, nothing on the
/// host (the process's real working directory stays empty).
#[test]
fn temporary_files_and_stream_descriptors_stay_on_the_volume() {
    let vol = volume();
    let host = tempfile::tempdir_in("/dev/shm").unwrap();
    let script = r#"
        set -e
        printf 'b
c
a
' > /locus/list
        sort -o /locus/list /locus/list && echo sorted
        printf 'hello
world
' > /locus/t
        sed -i s/world/there/ /locus/t && echo edited
        git init -q /locus/repo && test -f /locus/repo/.git/config && echo git ok
        mkdir /locus/d
        python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/locus/d")
name = ctypes.create_string_buffer(b"relXXXXXX")
fd = libc.mkstemp(name)
assert fd >= 0, os.strerror(ctypes.get_errno())
os.write(fd, b"temp")
os.close(fd)
dname = ctypes.create_string_buffer(b"/locus/d/dirXXXXXX")
assert libc.mkdtemp(dname), os.strerror(ctypes.get_errno())
bad = ctypes.create_string_buffer(b"/locus/d/noXs")
assert libc.mkstemp(bad) == -1 and ctypes.get_errno() == 22
print(sorted(n[:3] for n in os.listdir(".")))
'
    "#;
    let out = ok(
        &preloaded(vol.path(), "bash")
            .current_dir(host.path())
            .args(["-c", script])
            .output()
            .unwrap(),
        "temporary files",
    );
    assert_eq!(
        out,
        "sorted
edited
git ok
['dir', 'rel']
"
    );
    let leaked: Vec<_> = std::fs::read_dir(host.path()).unwrap().collect();
    assert!(leaked.is_empty(), "files made on the host: {leaked:?}");
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/list"), b"a\nb\nc\n");
    assert_eq!(read_all(&fs, "/t"), b"hello\nthere\n");
    let names: Vec<String> = fs
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let file = names
        .iter()
        .find(|n| n.starts_with("rel"))
        .expect("the temp file");
    assert_eq!(file.len(), 9);
    assert_eq!(read_all(&fs, &format!("/d/{file}")), b"temp");
}

/// `*at` calls from a descriptor of a host directory above the mount reach it (how rsync and
/// other tree walkers get into /locus), and names that stay outside stay the kernel's.
#[test]
fn at_calls_from_a_host_directory_reach_the_mount() {
    let vol = volume();
    let script = r#"
import os
os.mkdir("/locus/x")
with open("/locus/x/f", "w") as f:
    f.write("hi")
root = os.open("/", os.O_RDONLY)
print(os.stat("locus/x/f", dir_fd=root).st_size)
d = os.open("locus", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
print(sorted(os.listdir(d)))
tmp = os.open("/tmp", os.O_RDONLY)
print(os.path.isdir("/locus/x"), os.stat("../locus/x", dir_fd=tmp).st_mode & 0o170000 == 0o040000)
fd = os.open("locus/x/g", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=root)
os.write(fd, b"made")
os.close(fd)
print(os.stat("etc", dir_fd=root).st_mode & 0o170000 == 0o040000)
"#;
    let out = run_c(vol.path(), "python3", script, "python at calls");
    assert_eq!(out, "2\n['x']\nTrue True\nTrue\n");
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/x/g"), b"made");
}

/// A program whose last write is the stdio flush that exit handlers run, after the thread's
/// thread-locals are gone (`head` writing a file through its stdout): the write succeeds.
#[test]
fn a_stream_flushed_at_exit_is_written() {
    let vol = volume();
    ok(
        &preloaded(vol.path(), "sh")
            .args([
                "-c",
                "head -c 3000000 /dev/zero | tr '\\0' x | head -c 3000000 > /locus/big",
            ])
            .output()
            .unwrap(),
        "head writing at exit",
    );
    let fs = open_fs(vol.path());
    let data = read_all(&fs, "/big");
    assert_eq!(data.len(), 3_000_000);
    assert!(data.iter().all(|&b| b == b'x'));
}

/// fio's synchronous engines write with `verify=crc32c`, read everything back and check it;
/// the files are then on the volume, at their size, as the test process sees it.
#[test]
fn fio_sync_engines_verify_their_data() {
    if !have("fio") {
        eprintln!("skipped: fio is not installed");
        return;
    }
    let vol = volume();
    for (engine, bs) in [("psync", "4k"), ("pvsync", "16k"), ("pvsync2", "1k,4k,64k")] {
        let output = preloaded(vol.path(), "fio")
            .args([
                "--name=verify",
                &format!("--ioengine={engine}"),
                &format!("--filename_format={MOUNT}/fio.{engine}.$jobnum"),
                "--size=8m",
                "--rw=randwrite",
                &format!("--bs={}", bs.split(',').next().unwrap()),
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--numjobs=2",
                "--thread",
                "--group_reporting",
            ])
            .args(if engine == "pvsync2" {
                vec![
                    "--bssplit=1k/30:4k/40:64k/30".to_string(),
                    "--hipri=1".into(),
                ]
            } else {
                vec![]
            })
            .output()
            .unwrap();
        let out = ok(&output, &format!("fio {engine}"));
        assert!(
            out.contains("err= 0"),
            "fio {engine} reported an error:\n{out}"
        );
    }
    let fs = open_fs(vol.path());
    for engine in ["psync", "pvsync", "pvsync2"] {
        for job in 0..2 {
            let st = fs
                .stat(&format!("/fio.{engine}.{job}"))
                .expect("fio's file is on the volume");
            assert_eq!(st.size, 8 << 20, "{engine}");
            assert!(
                st.allocated >= 4 << 20,
                "{engine}: {} bytes held",
                st.allocated
            );
        }
    }
}

/// kill -9 in the middle of a sequential fio write job: everything fio reported written
/// (its last status line before the kill) reads back and verifies afterwards.
#[test]
fn kill_9_during_a_fio_write_loses_nothing_reported() {
    if !have("fio") {
        eprintln!("skipped: fio is not installed");
        return;
    }
    let vol = volume();
    let job = |extra: &[&str]| {
        let mut cmd = preloaded(vol.path(), "fio");
        cmd.args([
            "--name=crash",
            &format!("--filename={MOUNT}/crash"),
            "--ioengine=psync",
            "--rw=write",
            "--bs=64k",
            "--size=160m",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--thread",
            "--rate=40m",
        ])
        .args(extra);
        cmd
    };
    let mut child = job(&[
        "--status-interval=1",
        "--output-format=json",
        "--do_verify=0",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    // fio prints one JSON document per interval; keep the write bytes of each.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            text.push_str(&line);
            text.push('\n');
            let docs = serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>();
            let mut consumed = 0;
            for doc in docs {
                let Ok(doc) = doc else { break };
                if let Some(bytes) = doc["jobs"][0]["write"]["io_bytes"].as_u64() {
                    let _ = tx.send(bytes);
                }
                consumed = text.len();
            }
            if consumed > 0 {
                text.clear();
            }
        }
    });
    let mut reported = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while reported < (48 << 20) && std::time::Instant::now() < deadline {
        if let Ok(bytes) = rx.recv_timeout(std::time::Duration::from_secs(5)) {
            reported = reported.max(bytes);
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    while let Ok(bytes) = rx.try_recv() {
        reported = reported.max(bytes);
    }
    assert!(
        reported >= 48 << 20,
        "fio reported only {reported} bytes in 60 s"
    );
    assert!(reported < 160 << 20, "fio finished before the kill");

    // Recovery runs in the next process that mounts the volume: fio itself, verifying.
    let size = format!("--size={reported}");
    let out = ok(
        &job(&[&size, "--verify_only"]).output().unwrap(),
        "fio verify_only",
    );
    assert!(out.contains("err= 0"), "verification failed:\n{out}");
    let fs = open_fs(vol.path());
    assert!(fs.stat("/crash").unwrap().size >= reported);
}

/// Python's `os` module: positional I/O, `O_APPEND`, dup2, fcntl/flock/lockf locks, seek
/// data/holes, select, mmap (private works, shared is refused), fstat, and the errno of
/// each refusal.
/// A program that blocks signals to take them when it is ready (with `sigwait` or a
/// signalfd, as daemons do) finds them pending, after the library started its threads: none
/// of them takes a signal (with the default action, which for SIGTERM and SIGUSR1 ends the
/// process). Failed — the process killed by SIGUSR1 — while the library's threads started
/// with the signals unblocked.
#[test]
fn signals_a_program_blocks_stay_pending_for_it() {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let vol = volume();
    let script = r#"
import os, signal, sys
with open("/locus/started", "w") as f:  # the library mounts: its threads start
    f.write("x")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
print("ready", flush=True)
sys.stdin.read()  # the signals are sent meanwhile; they wait, blocked, as with a signalfd
print(sorted(int(s) for s in signal.sigpending()), flush=True)
"#;
    let mut child = preloaded(vol.path(), "python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    for signal in ["-USR1", "-TERM"] {
        let sent = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    let printed = lines.next().map(Result::unwrap);
    assert!(status.success(), "{status}: {printed:?}");
    assert_eq!(
        printed.as_deref(),
        Some(
            format!(
                "[{}, {}]",
                libc::SIGUSR1.min(libc::SIGTERM),
                libc::SIGUSR1.max(libc::SIGTERM)
            )
            .as_str()
        )
    );
}

#[test]
fn python_os_calls_see_posix_semantics() {
    if !have("python3") {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let vol = volume();
    let script = r#"
import errno, fcntl, mmap, os, select, stat
M = "/locus"
fd = os.open(M + "/p", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o640)
assert fd > 2
try:
    os.open(M + "/p", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    raise SystemExit("O_EXCL opened an existing file")
except FileExistsError:
    pass
assert os.pwrite(fd, b"hello world", 0) == 11
assert os.pread(fd, 5, 6) == b"world"
assert os.lseek(fd, 0, os.SEEK_CUR) == 0
os.write(fd, b"HELLO")
assert os.pread(fd, 11, 0) == b"HELLO world"
assert os.fstat(fd).st_size == 11
assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o640
assert stat.S_ISREG(os.stat(M + "/p").st_mode)
# An fd number reused for another file while the old description lives on in a dup: each
# call reaches the file its fd names now.
x = os.open(M + "/reuse-a", os.O_CREAT | os.O_RDWR)
os.pwrite(x, b"a", 0)
keep = os.dup(x)
os.close(x)
y = os.open(M + "/reuse-b", os.O_CREAT | os.O_RDWR)
assert y == x, (x, y)
os.pwrite(y, b"b", 0)
assert os.pread(keep, 1, 0) == b"a"
assert os.pread(y, 1, 0) == b"b"
os.close(y)
os.close(keep)
# O_APPEND through a second description
a = os.open(M + "/p", os.O_WRONLY | os.O_APPEND)
os.write(a, b"!")
assert os.pread(fd, 20, 0) == b"HELLO world!"
assert fcntl.fcntl(a, fcntl.F_GETFL) & os.O_APPEND
# dup2 onto a number, shares the offset
d = os.dup2(fd, 50)
assert d == 50
os.lseek(fd, 6, os.SEEK_SET)
assert os.read(50, 5) == b"world"
assert os.lseek(fd, 0, os.SEEK_CUR) == 11
assert fcntl.fcntl(50, fcntl.F_GETFD) == 0
assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
os.close(50)
try:
    os.read(50, 1)
    raise SystemExit("read after close")
except OSError as e:
    assert e.errno == errno.EBADF, e
# holes
os.ftruncate(fd, 1 << 20)
os.pwrite(fd, b"x" * 4096, 512 << 10)
assert os.lseek(fd, 0, os.SEEK_HOLE) == 4096 * ((12 + 4095) // 4096) or os.lseek(fd, 0, os.SEEK_HOLE) == 12, os.lseek(fd, 0, os.SEEK_HOLE)
assert os.lseek(fd, 4096, os.SEEK_DATA) == 512 << 10
try:
    os.lseek(fd, 1 << 20, os.SEEK_DATA)
    raise SystemExit("SEEK_DATA past the end")
except OSError as e:
    assert e.errno == errno.ENXIO
# locks: OFD locks conflict between descriptions, flock too
g = os.open(M + "/p", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
fcntl.flock(fd, fcntl.LOCK_EX)
try:
    fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
    raise SystemExit("second flock succeeded")
except BlockingIOError:
    pass
fcntl.flock(fd, fcntl.LOCK_UN)
fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
# select on a locus fd: ready, as a regular file
r, w, _ = select.select([fd], [fd], [], 0)
assert r == [fd] and w == [fd]
# mmap
m = mmap.mmap(fd, 4096, mmap.MAP_PRIVATE, mmap.PROT_READ)
assert m[:5] == b"HELLO"
m.close()
s = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
assert s[:5] == b"HELLO"
s.close()
# errors programs rely on
os.symlink("loop", M + "/loop")
os.symlink("p/", M + "/pdir")
for call, want in [
    (lambda: os.open(M + "/missing/x", os.O_RDONLY), errno.ENOENT),
    (lambda: os.open(M + "/p/x", os.O_RDONLY), errno.ENOTDIR),
    (lambda: os.mkdir(M + "/p"), errno.EEXIST),
    (lambda: os.rmdir(M + "/p"), errno.ENOTDIR),
    (lambda: os.unlink(M), errno.EISDIR),
    (lambda: os.rename(M + "/p", "/tmp/elsewhere"), errno.EXDEV),
    (lambda: os.read(a, 1), errno.EBADF),
    (lambda: os.write(os.open(M + "/p", os.O_RDONLY), b"x"), errno.EBADF),
    (lambda: os.open(M + "/" + "n" * 256, os.O_CREAT | os.O_WRONLY), errno.ENAMETOOLONG),
    (lambda: os.symlink("/tmp", M + "/p"), errno.EEXIST),
    (lambda: os.open(M + "/loop", os.O_RDONLY), errno.ELOOP),
    (lambda: os.stat(M + "/loop/x"), errno.ELOOP),
    (lambda: os.open(M + "/pdir", os.O_RDONLY), errno.ENOTDIR),
    (lambda: os.open(M + "/pdir", os.O_RDONLY | os.O_NOFOLLOW), errno.ELOOP),
    (lambda: os.open(M + "/loop", os.O_CREAT | os.O_EXCL | os.O_WRONLY), errno.EEXIST),
    (lambda: os.link(M, M + "/hard"), errno.EPERM),
    (lambda: os.link(M + "/p", M + "/pdir"), errno.EEXIST),
]:
    try:
        call()
        raise SystemExit("no error; expected " + errno.errorcode[want])
    except OSError as e:
        assert e.errno == want, (e, errno.errorcode[want])
# directories
os.mkdir(M + "/dir")
for name in ["b", "a", "c"]:
    os.close(os.open(M + "/dir/" + name, os.O_CREAT | os.O_WRONLY))
assert sorted(os.listdir(M + "/dir")) == ["a", "b", "c"]
dfd = os.open(M + "/dir", os.O_RDONLY | os.O_DIRECTORY)
assert os.stat("a", dir_fd=dfd).st_size == 0
os.rename("a", "z", src_dir_fd=dfd, dst_dir_fd=dfd)
assert sorted(os.listdir(dfd)) == ["b", "c", "z"]
os.unlink("z", dir_fd=dfd)
assert [e.name for e in sorted(os.scandir(M + "/dir"), key=lambda e: e.name)] == ["b", "c"]
# fork: the parent lets go of the volume; its fds are suspended and reopened on use. The
# child (or the parent) mounts on first use; the other asks it to let go, which it does
# between its calls unless it holds a lock (the parent here does: the child could not
# mount again until the parent ends).
r1, w1 = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    code = 0
    if os.pread(fd, 5, 0) != b"HELLO":
        code = 10
    f = os.open(M + "/child", os.O_CREAT | os.O_WRONLY)
    os.write(f, b"from the child")
    os.write(w1, b"x")
    os.read(r2, 1)
    os.close(f)
    os._exit(code)
os.read(r1, 1)
# The child, idle with a file open, lets go when asked (its file is suspended).
assert os.pread(fd, 5, 0) == b"HELLO"
os.write(w2, b"x")
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
assert os.pread(fd, 5, 0) == b"HELLO"
# the offset survived the suspension (the SEEK_DATA above left it there)
assert os.lseek(fd, 0, os.SEEK_CUR) == 512 << 10
with open(M + "/child", "rb") as f:
    assert f.read() == b"from the child"
# a child program executed with a locus fd as its stdin and stdout
import subprocess
with open(M + "/child", "rb") as src, open(M + "/copy", "wb") as dst:
    subprocess.run(["cat"], stdin=src, stdout=dst, check=True)
with open(M + "/copy", "rb") as f:
    assert f.read() == b"from the child"
for f in [fd, a, g, dfd]:
    os.close(f)
print("python ok")
"#;
    let out = run_c(vol.path(), "python3", script, "python script");
    assert_eq!(out, "python ok\n");
    let fs = open_fs(vol.path());
    assert_eq!(&read_all(&fs, "/p")[..12], b"HELLO world!");
    assert_eq!(read_all(&fs, "/child"), b"from the child");
}

/// Paths outside the mount prefix are untouched: a preloaded `cp` between tmpfs files works
/// and never creates the volume.
#[test]
fn other_paths_pass_through_without_mounting() {
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let unused = tmp.path().join("no-volume-here");
    std::fs::write(tmp.path().join("a"), b"plain file").unwrap();
    ok(
        &preloaded(&unused, "cp")
            .arg(tmp.path().join("a"))
            .arg(tmp.path().join("b"))
            .output()
            .unwrap(),
        "cp on tmpfs",
    );
    assert_eq!(std::fs::read(tmp.path().join("b")).unwrap(), b"plain file");
    assert!(
        !unused.exists(),
        "the preload library touched the volume directory"
    );
}

/// glibc's walkers and `freopen` (`scandir`, `scandirat`, `nftw` with `FTW_PHYS`,
/// `FTW_DEPTH`, `FTW_ACTIONRETVAL`, `FTW_CHDIR`, links followed and dangling, `ftw`;
/// `freopen` of a stream and of `stdout`, by a relative name) see the same tree on /locus as
/// on tmpfs: a C program prints what it sees in both places, and nothing lands in the
/// host's working directory.
#[test]
fn glibc_walkers_and_freopen_behave_as_on_tmpfs() {
    let vol = volume();
    let (_build, program) = compile("glibc_walks");
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let host_cwd = tempfile::tempdir_in("/dev/shm").unwrap();
    let expected = ok(
        &Command::new(&program)
            .arg(tmp.path())
            .current_dir(host_cwd.path())
            .output()
            .unwrap(),
        "glibc_walks on tmpfs",
    );
    std::fs::remove_file(tmp.path().join("rel.txt")).unwrap();
    let program = program.to_str().unwrap();
    let got = ok(
        &preloaded(vol.path(), program)
            .arg(MOUNT)
            .current_dir(host_cwd.path())
            .output()
            .unwrap(),
        "glibc_walks on locus",
    );
    assert_eq!(got, expected);
    assert!(expected.contains("/t/l/f F level=2") && expected.contains("\"second\""));
    let leaked: Vec<_> = std::fs::read_dir(host_cwd.path()).unwrap().collect();
    assert!(leaked.is_empty(), "host files for /locus names: {leaked:?}");
    let fs = open_fs(vol.path());
    assert!(read_all(&fs, "/rel.txt").starts_with(b"through stdout"));
}

/// Calls made with `syscall(2)` by number (fsx's `copy_file_range`, `getdents64`, `statx`,
/// `renameat2`, `getcwd`, ...) reach locus files as the C-library calls do: the same output
/// as on tmpfs. Without the routing they reach the kernel with the fd's placeholder or a
/// path the host does not have.
#[test]
fn calls_made_by_number_behave_as_on_tmpfs() {
    let (expected, got) = tmpfs_and_locus("raw");
    assert_eq!(got, expected);
    assert!(expected.contains("bytes: 012345678923456") && expected.contains("entries: moved sub"));
}

/// Calls on an fd with an empty name (`AT_EMPTY_PATH` and without it: `ENOENT` before
/// `ENOTDIR`), a null name, and flags glibc itself refuses give tmpfs's answers.
#[test]
fn calls_with_empty_names_behave_as_on_tmpfs() {
    let (expected, got) = tmpfs_and_locus("empty");
    assert_eq!(got, expected);
    assert!(expected.contains("fchownat AT_EMPTY_PATH: 0") && expected.contains("mtime: 2000"));
}

/// `raw_and_closing MODE DIR` on a tmpfs directory and, preloaded, on a fresh /locus one:
/// both outputs.
fn tmpfs_and_locus(mode: &str) -> (String, String) {
    let vol = volume();
    let (_build, program) = compile("raw_and_closing");
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let expected = ok(
        &Command::new(&program)
            .arg(mode)
            .arg(tmp.path())
            .output()
            .unwrap(),
        &format!("{mode} on tmpfs"),
    );
    let got = ok(
        &preloaded(vol.path(), "sh")
            .arg("-c")
            .arg(format!(
                "mkdir {MOUNT}/d && exec {} {mode} {MOUNT}/d",
                program.display()
            ))
            .output()
            .unwrap(),
        &format!("{mode} on locus"),
    );
    (expected, got)
}

/// A program that closes every fd it did not open (`closefrom`, a loop over every number,
/// `close_range`, `close_range` by number), as daemons do at start, keeps its locus files
/// and leaves the library's own fds alone: the volume stays locked to it (another process
/// cannot open it meanwhile) and its writes before and after land.
#[test]
fn closing_every_other_fd_keeps_the_volume_held() {
    let (_build, program) = compile("raw_and_closing");
    for how in ["closefrom", "loop", "close_range", "raw"] {
        let vol = volume();
        let mut child = preloaded(vol.path(), program.to_str().unwrap())
            .args(["close", how, MOUNT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line != "ready\n" {
            let _ = child.kill();
            let status = child.wait().unwrap();
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("{how}: not ready ({status}): {line:?} {err}");
        }
        let topology = topology::Topology::read_live().expect("topology");
        let second = volume::Volume::open(vol.path(), topology, &Default::default());
        assert!(
            second.is_err(),
            "{how}: another process opened the volume while the program still had it"
        );
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{how}: {status}");
        assert_eq!(rest, "before\nafter\n", "{how}");
        let fs = open_fs(vol.path());
        assert_eq!(read_all(&fs, "/data"), b"before\nafter\n", "{how}");
    }
}

/// The kernel's names of open fds — `/dev/stdin`, `/dev/stdout`, `/dev/fd/N`,
/// `/proc/self/fd/N` — lead to the locus file an fd has open, as they lead to the open file on
/// tmpfs: `wc /dev/stdin < file`, `cat /dev/fd/3 3< file`, `tee /dev/stdout`, `sort -o
/// /dev/stdout`, a name under a directory fd, `readlink` of the fd's link. Without this they
/// reach the fd's placeholder (a descriptor of `/`): "Is a directory".
#[test]
fn fd_names_lead_to_the_open_file_as_on_tmpfs() {
    let vol = volume();
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let script = r#"
        set -u
        R=$1
        printf 'c\nb\na\n' > $R/s
        wc -l /dev/stdin < $R/s
        cat /dev/fd/3 3< $R/s
        cat /dev/stdin < $R/s | wc -c
        stat -L -c '%s %F' /dev/stdin < $R/s
        stat -c '%F' /dev/stdin < $R/s
        readlink /proc/self/fd/0 < $R/s | sed "s|$R|ROOT|"
        exec 4< $R/s
        readlink /dev/fd/4 | sed "s|$R|ROOT|"
        readlink -f /dev/fd/4 | sed "s|$R|ROOT|"
        readlink /dev/stdin
        exec 4<&-
        echo hi | tee /dev/stdout > $R/t && cat $R/t
        sort -o /dev/stdout $R/s > $R/sorted && cat $R/sorted
        mkdir $R/d && exec 5< $R/d
        touch /dev/fd/5/inner && ls $R/d
        cat /dev/fd/5/missing 2>&1 | sed "s|$R|ROOT|"
        exec 5<&-
        cat /dev/fd/7 2>&1
    "#;
    let run = |root: &str, preload: bool| {
        shell(
            preload.then(|| vol.path()),
            "bash",
            script,
            &[root.as_ref()],
        )
    };
    let (expected, expected_err) = run(tmp.path().to_str().unwrap(), false);
    let (got, got_err) = run(MOUNT, true);
    assert!(
        expected.contains("3 /dev/stdin") && expected.contains("inner"),
        "tmpfs run broken:\n{expected}\n{expected_err}"
    );
    assert_eq!(got, expected, "stderr on locus:\n{got_err}");
}

/// `open(dir, O_TMPFILE)` through the library, as on tmpfs: a file with no name
/// (`st_nlink` 0, in no listing) that takes the umask and `fchmod` through its descriptor,
/// gets a name with `linkat(fd, "", AT_EMPTY_PATH)` (not when opened `O_EXCL`), and the
/// errors (read-only, a file or a missing directory). Then, on locus only (this machine's
/// kernel may refuse to follow `/proc/self/fd` links across mounts), the usual way of naming
/// one — `linkat` of `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW` — and a file left unnamed:
/// after the program's exit the named files hold their bytes and the unnamed one is gone,
/// though a fork moved it into memory (it cannot be reopened by a path) and it stayed
/// readable.
#[test]
fn unnamed_files_behave_as_on_tmpfs() {
    let vol = volume();
    let script = r#"
import ctypes, errno, os, sys
R = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
def link_fd(fd, path):
    if libc.linkat(fd, b"", -100, path.encode(), 0x1000) != 0:
        return errno.errorcode[ctypes.get_errno()]
    return "ok"
def fails(what, call):
    try:
        call()
        print(what, "opened")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
os.umask(0o027)
os.mkdir(R + "/d")
fd = os.open(R + "/d", os.O_TMPFILE | os.O_RDWR, 0o666)
st = os.fstat(fd)
print("made", st.st_nlink, oct(st.st_mode), os.listdir(R + "/d"))
os.write(fd, b"written before it had a name\n")
os.fchmod(fd, 0o600)
print("link", link_fd(fd, R + "/d/named"))
st = os.stat(R + "/d/named")
print("named", st.st_nlink, oct(st.st_mode), os.listdir(R + "/d"), open(R + "/d/named").read(), end="")
print("again", link_fd(fd, R + "/d/named"))
os.close(fd)
fd = os.open(R + "/d", os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
os.write(fd, b"z" * 300000)
print("exclusive", link_fd(fd, R + "/d/x"))
os.close(fd)
fails("read-only", lambda: os.open(R + "/d", os.O_TMPFILE | os.O_RDONLY))
fails("in a file", lambda: os.open(R + "/d/named", os.O_TMPFILE | os.O_RDWR, 0o600))
fails("missing", lambda: os.open(R + "/none", os.O_TMPFILE | os.O_RDWR, 0o600))
print(sorted(os.listdir(R + "/d")))
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(
        expected.contains("made 0 0o100640 []")
            && expected.contains("exclusive ENOENT\nread-only EINVAL\nin a file ENOTDIR"),
        "tmpfs run broken:\n{expected}"
    );
    assert!(status.success());
    assert_eq!(got, expected);

    let by_proc = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/locus", os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(fd, b"named through /proc/self/fd\n")
# linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, new, AT_SYMLINK_FOLLOW), as C programs do.
source = b"/proc/self/fd/%d" % fd
assert libc.linkat(-100, source, -100, b"/locus/by-proc", 0x400) == 0, ctypes.get_errno()
left = os.open("/locus/d", os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(left, b"never named" * 100000)
print(sorted(os.listdir("/locus")))
# A fork suspends every locus fd, to be reopened by its path: one with no name cannot be,
# and moves into a memory file instead.
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print("after a fork:", os.fstat(left).st_size, os.pread(left, 11, 0))
"#;
    let out = preloaded(vol.path(), "python3")
        .args(["-c", by_proc])
        .output()
        .unwrap();
    assert_eq!(
        ok(&out, "python3"),
        "['by-proc', 'd']\nafter a fork: 1100000 b'never named'\n"
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("is a file with no name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fs = open_fs(vol.path());
    assert_eq!(read_all(&fs, "/by-proc"), b"named through /proc/self/fd\n");
    assert_eq!(read_all(&fs, "/d/named"), b"written before it had a name\n");
    let mut names: Vec<_> = fs
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, ["named"]);
    fs.unmount().unwrap();
    // The unnamed files' memory is free: only the two named files map blocks.
    let check = fs::Fs::check(&open_volume_for_check(vol.path())).unwrap();
    assert_eq!(check.files, 2, "{check:?}");
    assert!(check.mapped_bytes <= 2 * 4096, "{check:?}");
}

/// Files without a name — Python's `TemporaryFile` (`O_TMPFILE | O_EXCL`), a file removed
/// while open, a write-only `O_TMPFILE` with `O_APPEND` — outlive a `subprocess.run`, a
/// `fork` and an `exec` that inherits one, as on tmpfs: their bytes, offsets (shared by
/// `dup`s, and with a forked child), access modes and `O_APPEND` stay, and a child reads
/// the inherited one, as does the program an `exec` runs. (The library moves them into memory files at the fork: no path leads
/// back to them.) Nothing of them is left on the volume after the program.
#[test]
fn files_without_a_name_outlive_fork_and_exec_as_on_tmpfs() {
    let vol = volume();
    let script = r#"
import os, subprocess, sys, tempfile
d = sys.argv[1]
f = tempfile.TemporaryFile(dir=d)
f.write(b"hello" * 1000); f.flush()
subprocess.run(["true"])
f.seek(0); print("read back:", len(f.read()), f.tell())
f.write(b" more"); f.seek(4998); print("after a write:", f.read())
g = open(os.path.join(d, "u"), "w+b"); g.write(b"removed while open"); g.flush()
os.unlink(os.path.join(d, "u"))
h = os.dup(g.fileno())
r = os.open(d, os.O_TMPFILE | os.O_WRONLY | os.O_APPEND, 0o600); os.write(r, b"wo")
os.lseek(g.fileno(), 8, os.SEEK_SET)
p = subprocess.run(["sh", "-c", "cat <&%d" % g.fileno()], pass_fds=[g.fileno()], capture_output=True)
print("a child's read:", p.stdout, p.returncode)
print("offset after it:", os.lseek(h, 0, os.SEEK_CUR))
pid = os.fork()
if pid == 0:
    os.lseek(h, 3, os.SEEK_SET); os._exit(0)
os.waitpid(pid, 0)
print("offset a forked child set:", os.lseek(g.fileno(), 0, os.SEEK_CUR))
os.write(r, b"+"); os.lseek(r, 0, os.SEEK_SET); os.write(r, b"!")
print("write-only, appending:", os.fstat(r).st_size)
try:
    os.read(r, 1)
except OSError as e:
    print("read of it:", e.strerror)
print(sorted(os.listdir(d)))
e = tempfile.TemporaryFile(dir=d); e.write(b"handed to an exec"); e.flush(); e.seek(7)
os.set_inheritable(e.fileno(), True)
sys.stdout.flush()
os.execv("/bin/sh", ["sh", "-c", "cat <&%d" % e.fileno()])
"#;
    let (expected, got, status) = python_both(vol.path(), script);
    assert!(
        expected.ends_with("[]\nto an exec")
            && expected.contains("read back: 5000 5000")
            && expected.contains("a child's read: b'while open' 0")
            && expected.contains("write-only, appending: 4"),
        "tmpfs run broken:\n{expected}"
    );
    assert!(status.success());
    assert_eq!(got, expected);
    let fs = open_fs(vol.path());
    assert!(fs.readdir("/").unwrap().is_empty());
    fs.unmount().unwrap();
    let check = fs::Fs::check(&open_volume_for_check(vol.path())).unwrap();
    assert_eq!((check.files, check.mapped_bytes), (0, 0), "{check:?}");
}

fn open_volume_for_check(vol: &Path) -> volume::Volume {
    let topology = topology::Topology::read_live().expect("topology");
    volume::Volume::open(vol, topology, &Default::default()).expect("open volume")
}
