//! `locus serve --tls`: TLS with X.509 credentials and with pre-shared keys, checked with
//! real clients (libnbd's nbdinfo, nbdcopy and nbdsh with `nbds://` URIs, and qemu-img with
//! `tls-creds-x509` and `tls-creds-psk`), on credentials the test makes with `openssl`.

mod common;

use common::{client, free_port, random_file, require, run, run_unchecked, text};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A CA, a server certificate for `localhost`/127.0.0.1 signed by it (in `server/`), and two
/// client directories: `client/` with a client certificate the CA signed, `anonymous/` with
/// the CA's certificate only.
struct Credentials {
    dir: tempfile::TempDir,
}

impl Credentials {
    fn make() -> Credentials {
        let dir = tempfile::tempdir().expect("temporary directory");
        let script = r"
set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca-cert.pem -days 2 -subj '/CN=locus test CA'
mkdir server client anonymous stranger
openssl req -newkey rsa:2048 -nodes -keyout server/server-key.pem -out server.csr -subj '/CN=localhost'
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server/server-cert.pem -days 2 -extfile server.ext
openssl req -newkey rsa:2048 -nodes -keyout client/client-key.pem -out client.csr -subj '/CN=client'
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out client/client-cert.pem -days 2 -extfile client.ext
cp ca-cert.pem server/ && cp ca-cert.pem client/ && cp ca-cert.pem anonymous/
# A client certificate from a CA the server does not know.
openssl req -x509 -newkey rsa:2048 -nodes -keyout stranger/client-key.pem -out stranger/client-cert.pem -days 2 -subj '/CN=stranger'
cp ca-cert.pem stranger/
";
        let output = Command::new("sh")
            .args(["-c", script])
            .current_dir(dir.path())
            .output()
            .expect("run openssl");
        assert!(output.status.success(), "{}", text(&output.stderr));
        Credentials { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

struct Serve {
    child: Child,
    log: PathBuf,
    port: u16,
    _volume: tempfile::TempDir,
}

impl Serve {
    fn start(args: &[&str]) -> Serve {
        let volume = tempfile::tempdir_in("/dev/shm").expect("volume directory");
        let format = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["format", "--volume", volume.path().to_str().unwrap()])
            .arg("--emulate=256M")
            .output()
            .expect("run locus format");
        assert!(format.status.success(), "{}", text(&format.stderr));
        let port = free_port();
        let log = volume.path().join("serve.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", volume.path().to_str().unwrap()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--default-size", "16M"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start locus serve");
        common::wait_until_serving(&mut child, &log, Duration::from_secs(60));
        Serve {
            child,
            log,
            port,
            _volume: volume,
        }
    }

    /// An `nbds://` URI whose client credentials are in `dir`.
    fn tls_uri(&self, dir: &Path) -> String {
        format!(
            "nbds://localhost:{}?tls-certificates={}",
            self.port,
            dir.display()
        )
    }

    fn plain_uri(&self) -> String {
        format!("nbd://localhost:{}", self.port)
    }

    /// qemu's JSON image name for the export over TLS, with `--object` credentials `tls0`.
    fn qemu_image(&self) -> String {
        format!(
            r#"json:{{"driver":"nbd","host":"localhost","port":"{}","tls-creds":"tls0"}}"#,
            self.port
        )
    }

    /// SIGTERM; the exit status and the log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        run("kill", &["-TERM", &self.child.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "locus serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the `openssl` command is here to make credentials (`.ci/run` installs it).
fn have_openssl() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found || std::env::var_os("CI").is_none(),
        "openssl is missing; .ci/run installs it"
    );
    found
}

/// The default with credentials is `--tls require`: data moves intact over TLS for libnbd and
/// qemu, and a plain client is told TLS is required.
#[test]
fn data_moves_intact_over_tls_and_plain_clients_are_refused() {
    if !require(&["nbdinfo", "nbdcopy", "nbdsh", "qemu-img"]) || !have_openssl() {
        return;
    }
    let credentials = Credentials::make();
    let server = Serve::start(&[
        "--tls-certificates",
        credentials.path("server").to_str().unwrap(),
    ]);
    let uri = server.tls_uri(&credentials.path("anonymous"));
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("in.img");
    let data = random_file(&image, 16 << 20, 0x9E37_79B9_7F4A_7C15);
    run("nbdcopy", &[image.to_str().unwrap(), &uri]);
    let back = work.path().join("out.img");
    run("nbdcopy", &[&uri, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "nbdcopy round trip");
    // Small and unaligned requests, and one as large as the protocol allows.
    let script = r"
import os
h.pwrite(b'abc', 4097)
assert h.pread(5, 4096) == bytes([data_at_4096]) + b'abc' + bytes([data_at_4100])
h.pwrite(b'\x5a' * (32 << 20 >> 1), 0)
assert h.pread(16 << 20, 0) == b'\x5a' * (16 << 20)
h.zero(1 << 20, 4096)
assert h.pread(1 << 20, 4096) == bytes(1 << 20)
h.flush()
print('ok')
"
    .replace("data_at_4096", &data[4096].to_string())
    .replace("data_at_4100", &data[4100].to_string());
    let sh = run_unchecked(
        "nbdsh",
        &[
            "-c",
            "h.set_uri_allow_local_file(True)",
            "-c",
            &format!("h.connect_uri({uri:?})"),
            "-c",
            &script,
        ],
    );
    assert!(sh.status.success(), "{}", text(&sh.stderr));
    assert_eq!(text(&sh.stdout).trim(), "ok");
    // qemu-img over TLS sees what nbdsh wrote.
    let expected = work.path().join("expected.img");
    let mut model = vec![0x5au8; 16 << 20];
    model[4096..4096 + (1 << 20)].fill(0);
    std::fs::write(&expected, &model).unwrap();
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        credentials.path("anonymous").display()
    );
    run(
        "qemu-img",
        &[
            "compare",
            "--object",
            &creds,
            &server.qemu_image(),
            expected.to_str().unwrap(),
        ],
    );
    // Plain text is refused, with the reason.
    let plain = client("nbdinfo")
        .arg(server.plain_uri())
        .env("LIBNBD_DEBUG", "1")
        .output()
        .unwrap();
    assert!(!plain.status.success(), "a plain client was served");
    assert!(
        text(&plain.stderr).contains("requires TLS"),
        "{}",
        text(&plain.stderr)
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("TLS required"), "{log}");
}

/// `--tls-verify-peer`: only clients with a certificate the CA signed get in; a failed TLS
/// handshake is a warning naming the client. With `--tls on`, plain clients are still served.
#[test]
fn client_certificates_are_checked_when_asked() {
    if !require(&["nbdinfo", "qemu-img"]) || !have_openssl() {
        return;
    }
    let credentials = Credentials::make();
    let server = Serve::start(&[
        "--tls",
        "on",
        "--tls-certificates",
        credentials.path("server").to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    let size = (16u64 << 20).to_string();
    let signed = run_unchecked(
        "nbdinfo",
        &["--size", &server.tls_uri(&credentials.path("client"))],
    );
    assert!(signed.status.success(), "{}", text(&signed.stderr));
    assert_eq!(text(&signed.stdout).trim(), size);
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        credentials.path("client").display()
    );
    let info = run(
        "qemu-img",
        &["info", "--object", &creds, &server.qemu_image()],
    );
    assert!(
        text(&info.stdout).contains("16 MiB"),
        "{}",
        text(&info.stdout)
    );
    for who in ["anonymous", "stranger"] {
        let refused = run_unchecked(
            "nbdinfo",
            &["--size", &server.tls_uri(&credentials.path(who))],
        );
        assert!(!refused.status.success(), "{who} was served");
    }
    // --tls on: plain text is still served.
    let plain = run_unchecked("nbdinfo", &["--size", &server.plain_uri()]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    let warnings = log
        .lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("TLS handshake failed") && l.contains("127.0.0.1:")
        })
        .count();
    assert_eq!(warnings, 2, "{log}");
}

#[test]
fn bad_tls_settings_fail_to_start_with_a_reason() {
    if !have_openssl() {
        return;
    }
    let credentials = Credentials::make();
    let volume = tempfile::tempdir_in("/dev/shm").unwrap();
    let empty = tempfile::tempdir().unwrap();
    let garbled = tempfile::tempdir().unwrap();
    std::fs::write(garbled.path().join("server-cert.pem"), "not a certificate").unwrap();
    std::fs::copy(
        credentials.path("server/server-key.pem"),
        garbled.path().join("server-key.pem"),
    )
    .unwrap();
    let mismatched = tempfile::tempdir().unwrap();
    std::fs::copy(
        credentials.path("server/server-cert.pem"),
        mismatched.path().join("server-cert.pem"),
    )
    .unwrap();
    std::fs::copy(
        credentials.path("client/client-key.pem"),
        mismatched.path().join("server-key.pem"),
    )
    .unwrap();
    let server_dir = credentials.path("server");
    let server_dir = server_dir.to_str().unwrap();
    let psk = PskFiles::make(&["alice"]);
    let psk_path = psk.server.to_str().unwrap();
    let garbled_psk = tempfile::tempdir().unwrap();
    let garbled_psk_path = garbled_psk.path().join("keys.psk");
    std::fs::write(&garbled_psk_path, "alice:00ff\nbob 00ff\n").unwrap();
    let garbled_psk_path = garbled_psk_path.to_str().unwrap();
    for (args, says) in [
        (vec!["--tls", "on"], "--tls needs credentials"),
        (
            vec!["--tls", "off", "--tls-certificates", server_dir],
            "--tls off excludes",
        ),
        (
            vec!["--tls-certificates", server_dir, "--tls-psk", psk_path],
            "cannot be used with",
        ),
        (
            vec!["--tls-psk", garbled_psk_path],
            "keys.psk line 2: not `identity:hexkey`",
        ),
        (
            vec!["--tls-psk", "/nonexistent/keys.psk"],
            "/nonexistent/keys.psk: No such file",
        ),
        (
            vec!["--tls-psk", psk_path, "--tls-verify-peer"],
            "with --tls-psk a client proves itself with its key",
        ),
        (
            vec!["--tls-certificates", empty.path().to_str().unwrap()],
            "server-cert.pem",
        ),
        (
            vec!["--tls-certificates", garbled.path().to_str().unwrap()],
            "no PEM certificate",
        ),
        (
            vec!["--tls-certificates", mismatched.path().to_str().unwrap()],
            "do not make a usable certificate and key",
        ),
        (vec!["--tls-verify-peer"], "--tls-certificates"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_locus"))
            .args(["serve", "--volume", volume.path().to_str().unwrap()])
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} started");
        assert!(
            text(&output.stderr).contains(says),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
}

/// Pre-shared key files as `psktool` writes them: the server's (`keys.psk` with every
/// identity), and a client directory per identity (`DIR/keys.psk` with that identity's line,
/// as qemu's `tls-creds-psk` reads it); `stranger` has an identity the server lacks, and
/// `impostor` the first identity with another key.
struct PskFiles {
    dir: tempfile::TempDir,
    server: PathBuf,
}

impl PskFiles {
    fn make(identities: &[&str]) -> PskFiles {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let mut key = || {
            (0..32)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    format!("{:02x}", (seed >> 56) as u8)
                })
                .collect::<String>()
        };
        let mut lines = String::new();
        let client = |name: &str, identity: &str, key: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("keys.psk"), format!("{identity}:{key}\n")).unwrap();
        };
        for identity in identities {
            let key = key();
            client(identity, identity, &key);
            lines.push_str(&format!("{identity}:{key}\n"));
        }
        client("stranger", "stranger", &key());
        client("impostor", identities[0], &key());
        let server = dir.path().join("keys.psk");
        std::fs::write(&server, lines).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o600)).unwrap();
        PskFiles { dir, server }
    }

    /// The client directory of `who`.
    fn client(&self, who: &str) -> PathBuf {
        self.dir.path().join(who)
    }
}

impl Serve {
    /// An `nbds://` URI for libnbd as `identity` with the keys of `file`.
    fn psk_uri(&self, identity: &str, file: &Path) -> String {
        format!(
            "nbds://{identity}@localhost:{}?tls-psk-file={}",
            self.port,
            file.display()
        )
    }
}

/// `--tls-psk`: libnbd and qemu (over TLS 1.3, and over TLS 1.2 when qemu's priority string
/// rules 1.3 out) move data intact with a key from the file; an identity the file lacks, a
/// wrong key and plain text are refused, each refusal a warning that says why.
#[test]
fn pre_shared_keys_serve_libnbd_and_qemu_and_refuse_others() {
    if !require(&["nbdinfo", "nbdcopy", "qemu-img"]) {
        return;
    }
    let psk = PskFiles::make(&["alice", "bob"]);
    let server = Serve::start(&["--tls-psk", psk.server.to_str().unwrap()]);
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("in.img");
    let data = random_file(&image, 16 << 20, 0xD1B5_4A32_D192_ED03);
    let alice = server.psk_uri("alice", &psk.client("alice").join("keys.psk"));
    run("nbdcopy", &[image.to_str().unwrap(), &alice]);
    // bob reads back what alice wrote.
    let back = work.path().join("out.img");
    let bob = server.psk_uri("bob", &psk.client("bob").join("keys.psk"));
    run("nbdcopy", &[&bob, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "nbdcopy round trip");
    for priority in ["", ",priority=NORMAL:-VERS-TLS1.3"] {
        let creds = format!(
            "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client{priority}",
            psk.client("alice").display()
        );
        run(
            "qemu-img",
            &[
                "compare",
                "--object",
                &creds,
                &server.qemu_image(),
                image.to_str().unwrap(),
            ],
        );
    }
    for (who, identity) in [("stranger", "stranger"), ("impostor", "alice")] {
        let uri = server.psk_uri(identity, &psk.client(who).join("keys.psk"));
        let refused = run_unchecked("nbdinfo", &["--size", &uri]);
        assert!(!refused.status.success(), "{who} was served");
    }
    let plain = run_unchecked("nbdinfo", &["--size", &server.plain_uri()]);
    assert!(!plain.status.success(), "a plain client was served");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("TLS required (PSK)"), "{log}");
    let warned = |says: &str| {
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(says) && l.contains("127.0.0.1:"))
    };
    assert!(
        warned("PSK identity \"stranger\" is not in"),
        "no warning naming the unknown identity: {log}"
    );
    assert!(
        warned("as PSK identity \"alice\" failed; most likely the client's key is not"),
        "no warning about the wrong key: {log}"
    );
}

/// `locus SUBCOMMAND TARGET ARGS...` (a credentials maker), its output.
fn make_with_locus(subcommand: &str, target: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_locus"))
        .arg(subcommand)
        .arg(target)
        .args(args)
        .output()
        .unwrap()
}

/// `locus tls-credentials` makes what `--tls-certificates` and libnbd/qemu clients need,
/// client certificate included, and never replaces existing files.
#[test]
fn credentials_made_by_locus_work_with_real_clients() {
    if !require(&["nbdinfo", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let made = dir.path().join("tls");
    let locus = |args: &[&str]| make_with_locus("tls-credentials", &made, args);
    let first = locus(&["--name", "localhost", "--days", "3"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    use std::os::unix::fs::PermissionsExt;
    for key in ["server/server-key.pem", "client/client-key.pem"] {
        let mode = std::fs::metadata(made.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let again = locus(&[]);
    assert!(
        !again.status.success(),
        "existing credentials were replaced"
    );
    assert!(
        text(&again.stderr).contains("never replaced"),
        "{}",
        text(&again.stderr)
    );
    let server = Serve::start(&[
        "--tls-certificates",
        made.join("server").to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    let info = run_unchecked(
        "nbdinfo",
        &["--size", &server.tls_uri(&made.join("client"))],
    );
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert_eq!(text(&info.stdout).trim(), (16u64 << 20).to_string());
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        made.join("client").display()
    );
    run(
        "qemu-img",
        &["info", "--object", &creds, &server.qemu_image()],
    );
    // Only the client directory's certificate gets in.
    let anonymous = dir.path().join("anonymous");
    std::fs::create_dir(&anonymous).unwrap();
    std::fs::copy(
        made.join("client/ca-cert.pem"),
        anonymous.join("ca-cert.pem"),
    )
    .unwrap();
    let refused = run_unchecked("nbdinfo", &["--size", &server.tls_uri(&anonymous)]);
    assert!(
        !refused.status.success(),
        "a client without a certificate was served"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// `locus tls-psk` makes key files that `--tls-psk` and libnbd and qemu use, adds identities
/// without touching existing keys, and never replaces a key.
#[test]
fn key_files_made_by_locus_work_with_real_clients() {
    if !require(&["nbdinfo", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.psk");
    let locus = |args: &[&str]| make_with_locus("tls-psk", &file, args);
    let first = locus(&["--identity", "alice"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let alice_line = std::fs::read_to_string(&file).unwrap();
    let added = locus(&["--identity", "bob"]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    let again = locus(&["--identity", "alice"]);
    assert!(!again.status.success(), "a key was replaced");
    assert!(
        text(&again.stderr).contains("never replaced"),
        "{}",
        text(&again.stderr)
    );
    let text_now = std::fs::read_to_string(&file).unwrap();
    assert!(text_now.starts_with(&alice_line), "alice's key changed");
    assert_eq!(text_now.lines().count(), 2, "{text_now}");
    // Keys are 32 random bytes: alice's and bob's differ.
    let keys: Vec<&str> = text_now
        .lines()
        .map(|l| &l[l.find(':').unwrap() + 1..])
        .collect();
    assert_eq!(keys[0].len(), 64);
    assert_ne!(keys[0], keys[1]);
    let server = Serve::start(&["--tls-psk", file.to_str().unwrap()]);
    let info = run_unchecked("nbdinfo", &["--size", &server.psk_uri("bob", &file)]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert_eq!(text(&info.stdout).trim(), (16u64 << 20).to_string());
    // qemu reads DIR/keys.psk: alice's line alone.
    let client = dir.path().join("alice");
    std::fs::create_dir(&client).unwrap();
    std::fs::write(client.join("keys.psk"), &alice_line).unwrap();
    let creds = format!(
        "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
        client.display()
    );
    run(
        "qemu-img",
        &["info", "--object", &creds, &server.qemu_image()],
    );
    // The running server takes an identity added to the file, drops one removed from it,
    // and keeps its keys when the file is garbled.
    let carol = locus(&["--identity", "carol"]);
    assert!(carol.status.success(), "{}", text(&carol.stderr));
    let served = |who: &str, keys: &Path| {
        run_unchecked("nbdinfo", &["--size", &server.psk_uri(who, keys)])
            .status
            .success()
    };
    assert!(
        served("carol", &file),
        "an identity added while serving was refused"
    );
    let without_bob: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("bob:"))
        .map(|l| format!("{l}\n"))
        .collect();
    // The client keeps bob's line in a file of its own.
    let bob_file = dir.path().join("bob.psk");
    std::fs::copy(&file, &bob_file).unwrap();
    std::fs::write(&file, &without_bob).unwrap();
    assert!(
        !served("bob", &bob_file),
        "an identity removed while serving was still served"
    );
    assert!(served("carol", &file));
    std::fs::write(&file, format!("{without_bob}garbage\n")).unwrap();
    assert!(
        served("alice", &bob_file),
        "the keys read before a garbled file were dropped"
    );
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("keys.psk line 3: not `identity:hexkey`")
            && l.contains("identities read before stay in force")),
        "{log}"
    );
}
