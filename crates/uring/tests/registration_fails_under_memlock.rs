//! When the kernel refuses to pin (RLIMIT_MEMLOCK), the pool warns once, counts, and the I/O
//! still happens with unregistered buffers. Run in a child process that lowers its memlock
//! limit to 128 KiB — room for the ring itself and the small blocks, not for a 4 MiB chunk or
//! a large buffer — and drops CAP_IPC_LOCK (with it, root is exempt from the limit).

#![allow(
    unsafe_code,
    reason = "setrlimit and capset in the child process of this test"
)]

use std::process::Command;

use uring::{DirectFile, Engine, PoolConfig, Strategy};

const CHILD: &str = "LOCUS_URING_MEMLOCK_CHILD";
const CAP_IPC_LOCK: u32 = 14;

#[test]
fn the_pool_falls_back_when_pinning_is_refused() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_pool_falls_back_when_pinning_is_refused",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("registration failures:"), "{stdout}");
    assert!(stdout.contains("data intact"), "{stdout}");
}

fn child() {
    limit_memlock(128 << 10);
    let dir = std::path::PathBuf::from(std::env::var_os(CHILD).unwrap());
    let file = DirectFile::open(&dir.join("disk.img"), Some(64 << 20)).unwrap();
    let mut engine = Engine::new(file, Strategy::Pool, PoolConfig::default(), 4).unwrap();
    for (i, len) in [4096usize, 256 << 10, 4 << 20, 6 << 20]
        .into_iter()
        .enumerate()
    {
        let offset = i as u64 * (8 << 20);
        let data: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
        engine.write_all(offset, &data).unwrap();
        assert_eq!(
            engine.read_exact(offset, len).unwrap(),
            data,
            "request {i} of {len} bytes"
        );
    }
    let stats = engine.pool_stats();
    assert!(
        stats.registration_failures >= 2,
        "the chunk and the large buffer: {stats:?}"
    );
    assert_eq!(
        stats.served[1] + stats.served[2],
        0,
        "no medium or large buffer was registered: {stats:?}"
    );
    assert!(stats.served[3] >= 2, "{stats:?}");
    println!(
        "registration failures: {}; data intact",
        stats.registration_failures
    );
}

fn limit_memlock(bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads the struct we pass.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    assert_eq!(rc, 0, "setrlimit");
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two Data structs for version 3 headers; both live across the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget");
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    data[0].inheritable &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads the header and the two Data structs.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset");
}
