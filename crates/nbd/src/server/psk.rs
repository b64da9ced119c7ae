//! TLS with pre-shared keys (`--tls-psk FILE`), on OpenSSL.
//!
//! rustls, which serves X.509 credentials, does not implement external pre-shared keys, and
//! PSK is what qemu and nbdkit users commonly set up (a `username:hexkey` file made by
//! `psktool`, no certificate authority). OpenSSL serves them: TLS 1.3 with the PSK and an
//! ephemeral key exchange (the keys' SHA-256 binder, as GnuTLS clients — libnbd, qemu — send
//! it), and the ECDHE-PSK/PSK suites of TLS 1.2.
//!
//! OpenSSL here never touches the socket. Its session reads and writes an in-memory [`Pipe`]:
//! the connection's reading thread hands it ciphertext it received, and whoever holds the
//! session sends what it wrote. That is the shape of the rustls session, so the connection
//! shares one TLS session between its reader and its reply writers the same way with both.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslMethod, SslOptions, SslRef, SslSessionCacheMode, SslStream,
    SslVersion,
};

use super::net::Stream;

/// The identities and keys of a PSK file, and the TLS context that looks them up.
#[derive(Clone)]
pub(crate) struct Credentials {
    context: SslContext,
    /// Where a connection notes the identity its client offered, for the warning when the
    /// handshake fails.
    offered: Index<Ssl, Offered>,
    keys: Arc<Keys>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("path", &self.keys.path)
            .finish_non_exhaustive()
    }
}

/// A key file's identities and keys as last read, re-read when the file changes.
struct Keys {
    path: PathBuf,
    state: RwLock<KeysState>,
}

struct KeysState {
    /// What the file looked like when last read (or found unreadable).
    stamp: Option<Stamp>,
    keys: HashMap<Vec<u8>, Vec<u8>>,
}

/// A file's identity as far as telling a change goes: inode, size, modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        inode: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// Reads and parses a key file, warning when other users may read it.
fn read_keys(path: &Path) -> io::Result<HashMap<Vec<u8>, Vec<u8>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let keys = parse_keys(path, &text)?;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{}: other users may read these keys (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        );
    }
    Ok(keys)
}

impl Keys {
    /// Re-reads the file if it changed since it was last read. A file that no longer reads
    /// or parses is a warning (once per change), and the keys read before stay in force.
    fn refresh(&self) {
        let now = stamp(&self.path);
        if self.state.read().expect("PSK keys").stamp == now {
            return;
        }
        let mut state = self.state.write().expect("PSK keys");
        if state.stamp == now {
            return;
        }
        state.stamp = now;
        match read_keys(&self.path) {
            Ok(keys) => {
                tracing::info!(
                    "{}: re-read, {} identities (were {})",
                    self.path.display(),
                    keys.len(),
                    state.keys.len()
                );
                state.keys = keys;
            }
            Err(e) => tracing::warn!(
                "{e}; the {} identities read before stay in force",
                state.keys.len()
            ),
        }
    }
}

/// The identity a client offered, and whether the file holds it.
#[derive(Debug)]
struct Offered {
    identity: String,
    known: bool,
}

/// A key longer than this is refused when the file is read (OpenSSL's limit).
const MAX_KEY_BYTES: usize = 512;

/// Parses a PSK file: one `identity:hexkey` per line, as GnuTLS's `psktool` writes them and
/// qemu and nbdkit read them. Blank lines are skipped; anything else that does not parse, an
/// empty identity or key, an odd number of hex digits, or an identity given twice is an
/// error naming the line.
pub fn parse_keys(path: &Path, text: &str) -> io::Result<HashMap<Vec<u8>, Vec<u8>>> {
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let at = || format!("{} line {}", path.display(), i + 1);
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((identity, hex)) = line.rsplit_once(':') else {
            return Err(invalid(format!(
                "{}: not `identity:hexkey` (no colon)",
                at()
            )));
        };
        if identity.is_empty() {
            return Err(invalid(format!("{}: the identity is empty", at())));
        }
        let key = decode_hex(hex.trim()).map_err(|e| invalid(format!("{}: {e}", at())))?;
        if key.len() > MAX_KEY_BYTES {
            return Err(invalid(format!(
                "{}: the key has {} bytes, more than the {MAX_KEY_BYTES} TLS allows",
                at(),
                key.len()
            )));
        }
        if keys.insert(identity.as_bytes().to_vec(), key).is_some() {
            return Err(invalid(format!(
                "{}: identity {identity:?} is given twice",
                at()
            )));
        }
    }
    if keys.is_empty() {
        return Err(invalid(format!(
            "{}: no `identity:hexkey` line in it",
            path.display()
        )));
    }
    Ok(keys)
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if hex.is_empty() {
        return Err("the key is empty".into());
    }
    if !hex.len().is_multiple_of(2) {
        return Err(format!(
            "the key has {} hex digits, not an even number",
            hex.len()
        ));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(format!("the key has {:?}, not a hex digit", char::from(c))),
    };
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

impl Credentials {
    /// Reads the keys of `path` and makes the TLS context that serves them. The file is
    /// read again, when it has changed, as each connection starts TLS
    /// ([`Session::new`]): identities added or removed count from the next connection.
    pub(crate) fn load(path: &Path) -> io::Result<Self> {
        let first = stamp(path);
        let keys = Arc::new(Keys {
            path: path.to_path_buf(),
            state: RwLock::new(KeysState {
                keys: read_keys(path)?,
                stamp: first,
            }),
        });
        let offered = Ssl::new_ex_index::<Offered>().map_err(|e| openssl_error(&e))?;
        let mut builder =
            SslContext::builder(SslMethod::tls_server()).map_err(|e| openssl_error(&e))?;
        builder
            .set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| openssl_error(&e))?;
        // TLS 1.2: pre-shared keys with an ephemeral key exchange first, plain PSK for
        // clients that offer nothing else; never RSA-PSK (it needs a certificate).
        builder
            .set_cipher_list("ECDHEPSK+AESGCM:ECDHEPSK+CHACHA20:PSK+AESGCM:PSK+CHACHA20:!RSAPSK")
            .map_err(|e| openssl_error(&e))?;
        // TLS 1.3 keys without a hash of their own are used with SHA-256: these suites.
        builder
            .set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")
            .map_err(|e| openssl_error(&e))?;
        // No resumption: every connection proves it holds a key from the file as it is now.
        // No TLS 1.2 renegotiation (a client could make the server redo handshakes at will;
        // rustls has none either). The server's order of suites: in the client's, libnbd got
        // ChaCha20-Poly1305 here, where AES-GCM is the faster on CPUs with AES instructions.
        builder.set_options(
            SslOptions::NO_TICKET
                | SslOptions::NO_RENEGOTIATION
                | SslOptions::IGNORE_UNEXPECTED_EOF
                | SslOptions::CIPHER_SERVER_PREFERENCE,
        );
        builder.set_session_cache_mode(SslSessionCacheMode::OFF);
        let lookup = Arc::clone(&keys);
        builder.set_psk_server_callback(move |ssl: &mut SslRef, identity, out| {
            let identity = identity.unwrap_or_default();
            let state = lookup.state.read().expect("PSK keys");
            let key = state
                .keys
                .get(identity)
                .filter(|key| key.len() <= out.len());
            ssl.set_ex_data(
                offered,
                Offered {
                    identity: String::from_utf8_lossy(identity).into_owned(),
                    known: key.is_some(),
                },
            );
            // No key: the handshake fails with unknown_psk_identity.
            let Some(key) = key else { return Ok(0) };
            out[..key.len()].copy_from_slice(key);
            Ok(key.len())
        });
        Ok(Self {
            context: builder.build(),
            offered,
            keys,
        })
    }
}

/// The in-memory transport OpenSSL reads ciphertext from and writes it to.
#[derive(Debug, Default)]
struct Pipe {
    incoming: Vec<u8>,
    taken: usize,
    /// The client closed its side: reads past `incoming` are an end of stream.
    ended: bool,
    outgoing: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let waiting = &self.incoming[self.taken..];
        if waiting.is_empty() {
            return if self.ended {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = waiting.len().min(buf.len());
        buf[..n].copy_from_slice(&waiting[..n]);
        self.taken += n;
        if self.taken == self.incoming.len() {
            self.incoming.clear();
            self.taken = 0;
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Plaintext encrypted at most at once before the ciphertext goes out, so that a large
/// reply is not held whole in memory twice.
const WRITE_BYTES: usize = 64 << 10;

/// One connection's PSK session.
pub(crate) struct Session {
    stream: SslStream<Pipe>,
    credentials: Credentials,
    handshaking: bool,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("handshaking", &self.handshaking)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(credentials: &Credentials) -> io::Result<Self> {
        credentials.keys.refresh();
        let ssl = Ssl::new(&credentials.context).map_err(|e| openssl_error(&e))?;
        let stream = SslStream::new(ssl, Pipe::default()).map_err(|e| openssl_error(&e))?;
        Ok(Self {
            stream,
            credentials: credentials.clone(),
            handshaking: true,
        })
    }

    pub(crate) fn is_handshaking(&self) -> bool {
        self.handshaking
    }

    /// Takes all of `ciphertext` and goes on with the handshake if it is under way (records
    /// after it are decrypted as they are read).
    pub(crate) fn receive(&mut self, ciphertext: &mut &[u8]) -> io::Result<()> {
        self.stream.get_mut().incoming.extend_from_slice(ciphertext);
        *ciphertext = &[];
        self.handshake()
    }

    /// The client closed its side. (During the handshake that is for the caller to report:
    /// OpenSSL would only say its input ended.)
    pub(crate) fn end_of_input(&mut self) -> io::Result<()> {
        self.stream.get_mut().ended = true;
        Ok(())
    }

    fn handshake(&mut self) -> io::Result<()> {
        if !self.handshaking {
            return Ok(());
        }
        match self.stream.accept() {
            Ok(()) => {
                self.handshaking = false;
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(()),
            Err(e) => Err(self.failure(&e)),
        }
    }

    /// Plaintext into `buf`: `WouldBlock` when none can be decrypted from what arrived,
    /// `Ok(0)` at the client's close (with or without `close_notify`).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.handshaking {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match self.stream.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) => match e.code() {
                ErrorCode::WANT_READ if !self.stream.get_ref().ended => {
                    Err(io::ErrorKind::WouldBlock.into())
                }
                ErrorCode::ZERO_RETURN | ErrorCode::WANT_READ => Ok(0),
                _ => Err(self.failure(&e)),
            },
        }
    }

    /// Encrypts up to 64 KiB of `buf` into the outgoing ciphertext.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(WRITE_BYTES);
        if n == 0 {
            return Ok(0);
        }
        self.stream
            .ssl_write(&buf[..n])
            .map_err(|e| self.failure(&e))
    }

    /// Sends the ciphertext the session wrote.
    pub(crate) fn flush(&mut self, socket: &mut Stream) -> io::Result<()> {
        let pipe = self.stream.get_mut();
        if pipe.outgoing.is_empty() {
            return Ok(());
        }
        let sent = socket.write_all(&pipe.outgoing);
        pipe.outgoing.clear();
        sent
    }

    pub(crate) fn close_notify(&mut self) {
        if !self.handshaking {
            let _ = self.stream.shutdown();
        }
    }

    /// An error naming what failed: during the handshake, the identity the client offered
    /// (not in the file, or its key differs); then OpenSSL's reason.
    fn failure(&self, e: &openssl::ssl::Error) -> io::Error {
        let reason = e
            .ssl_error()
            .map_or_else(|| e.to_string(), ErrorStack::to_string);
        let path = self.credentials.keys.path.display();
        match self.stream.ssl().ex_data(self.credentials.offered) {
            Some(Offered {
                identity,
                known: false,
            }) => {
                return io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("TLS: the client's PSK identity {identity:?} is not in {path}"),
                );
            }
            Some(Offered { identity, .. }) if self.handshaking => {
                return io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "TLS: the handshake as PSK identity {identity:?} failed; most likely \
                         the client's key is not the one in {path} ({reason})"
                    ),
                );
            }
            _ => {}
        }
        if e.code() == ErrorCode::SYSCALL {
            return io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "TLS: the client closed the connection mid-record",
            );
        }
        io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {reason}"))
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn openssl_error(e: &ErrorStack) -> io::Error {
    io::Error::other(format!("OpenSSL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
        parse_keys(Path::new("keys.psk"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_psktool_file_parses_to_its_identities_and_keys() {
        let keys = parse("alice:00ff10Ab\n\nbob:0102\r\n").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[&b"alice"[..]], [0x00, 0xff, 0x10, 0xab]);
        assert_eq!(keys[&b"bob"[..]], [0x01, 0x02]);
    }

    #[test]
    fn garbage_in_a_psk_file_is_an_error_naming_the_line() {
        for (text, says) in [
            (
                "alice:0011\nnocolon\n",
                "keys.psk line 2: not `identity:hexkey`",
            ),
            (":0011\n", "line 1: the identity is empty"),
            ("alice:\n", "line 1: the key is empty"),
            ("alice:012\n", "3 hex digits, not an even number"),
            ("alice:00zz\n", "'z', not a hex digit"),
            (
                "alice:00\nalice:01\n",
                "line 2: identity \"alice\" is given twice",
            ),
            ("\n\n", "no `identity:hexkey` line"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
        let long = format!("alice:{}\n", "ab".repeat(MAX_KEY_BYTES + 1));
        assert!(parse(&long).unwrap_err().contains("more than the 512"));
    }
}
