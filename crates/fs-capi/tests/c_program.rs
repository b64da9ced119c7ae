//! The C API from C: `tests/c/api_test.c` is compiled against `include/locus_fs.h` and the
//! built `liblocus_fs.so` with the system C compiler, then run four times on one volume —
//! build a tree checking every call and error, write more and `_exit` without closing, then
//! reopen (recovering) and check everything acknowledged is there; then once more to check
//! that a signal the program blocks after opening stays pending for it (none of the file
//! system's threads takes it).

use std::path::{Path, PathBuf};
use std::process::Command;

struct ShmVolume(PathBuf);

impl Drop for ShmVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where cargo builds this test and, in the same run, the library: `target/<profile>/deps`
/// (`target/<profile>/liblocus_fs.so` is a copy `cargo build` makes, and may be stale).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_owned()
}

fn compile(out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = profile_dir();
    assert!(
        lib_dir.join("liblocus_fs.so").exists(),
        "{} not built",
        lib_dir.join("liblocus_fs.so").display()
    );
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(crate_dir.join("tests/c/api_test.c"))
        .arg(format!("-I{}", crate_dir.join("include").display()))
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-llocus_fs")
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler {compiler}: {e}"));
    assert!(
        output.status.success(),
        "compiling api_test.c failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn run(program: &Path, volume: &Path, phase: &str) {
    let output = Command::new(program)
        .arg(volume)
        .arg(phase)
        .env("RUST_BACKTRACE", "1")
        // cargo's own LD_LIBRARY_PATH names target/<profile> first, whose copy of the
        // library may be stale, and it outranks the program's run path.
        .env("LD_LIBRARY_PATH", profile_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("ok {phase}")),
        "phase {phase}: {}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_c_program_uses_the_file_system_and_survives_a_crash() {
    let dir = ShmVolume(PathBuf::from(format!(
        "/dev/shm/locus-capi-test-{}",
        std::process::id()
    )));
    let topology = topology::Topology::read_live().unwrap();
    let config = volume::default_config(&dir.0, &topology, Some(256 << 20)).unwrap();
    volume::Volume::format(&dir.0, &config, true).unwrap();

    let program = dir.0.join("api_test");
    compile(&program);
    run(&program, &dir.0, "write");
    run(&program, &dir.0, "crash");
    run(&program, &dir.0, "verify");
    run(&program, &dir.0, "signals");
}
