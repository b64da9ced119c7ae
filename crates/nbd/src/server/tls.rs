//! TLS for connections that ask for it with `NBD_OPT_STARTTLS`: the server's credentials,
//! and a TLS session over a connection's socket that its reading thread and its reply
//! writers share.
//!
//! X.509 credentials are served by rustls, pre-shared keys by OpenSSL ([`super::psk`]:
//! rustls has no external PSKs). Either session is an [`Engine`] behind a mutex that reads
//! ciphertext handed to it and writes ciphertext for its holder to send. The reading thread
//! never holds that mutex while it waits for the socket: it receives ciphertext into its own
//! buffer and takes the lock only to hand it over and take the plaintext out, so a reply can
//! be encrypted and sent while the reader waits for the next request.

use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::net::Stream;
use super::psk;

/// When clients must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Clients may upgrade with `NBD_OPT_STARTTLS` or stay in plain text.
    On,
    /// Only `NBD_OPT_STARTTLS` (or `NBD_OPT_ABORT`) is answered before TLS is on; anything
    /// else is refused with `NBD_REP_ERR_TLS_REQD`.
    Require,
}

/// The server's TLS settings.
#[derive(Clone)]
pub struct Tls {
    credentials: Credentials,
    pub(crate) mode: TlsMode,
}

#[derive(Clone)]
enum Credentials {
    X509(Arc<rustls::ServerConfig>),
    Psk(psk::Credentials),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("credentials", &self.kind())
            .field("mode", &self.mode)
            .finish()
    }
}

/// The file names in a credentials directory, as qemu and nbdkit name them.
pub const CA_CERT: &str = "ca-cert.pem";
/// The server's certificate chain.
pub const SERVER_CERT: &str = "server-cert.pem";
/// The server's private key.
pub const SERVER_KEY: &str = "server-key.pem";

impl Tls {
    /// Optional or required.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// X.509 credentials from `dir`: `server-cert.pem` (the chain, the server's first) and
    /// `server-key.pem`; with `verify_peer`, clients must present a certificate that
    /// `ca-cert.pem` signed.
    pub fn x509(dir: &Path, verify_peer: bool, mode: TlsMode) -> io::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let file = |name: &str| dir.join(name);
        let chain = certificates(&file(SERVER_CERT))?;
        let key = PrivateKeyDer::from_pem_file(file(SERVER_KEY))
            .map_err(|e| pem_error(&file(SERVER_KEY), "a private key", &e))?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(other)?;
        let builder = if verify_peer {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(&file(CA_CERT))? {
                roots.add(certificate).map_err(|e| {
                    invalid(format!(
                        "{}: not a usable CA certificate: {e}",
                        file(CA_CERT).display()
                    ))
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(other)?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            invalid(format!(
                "{} and {} do not make a usable certificate and key: {e}",
                file(SERVER_CERT).display(),
                file(SERVER_KEY).display()
            ))
        })?;
        Ok(Self {
            credentials: Credentials::X509(Arc::new(config)),
            mode,
        })
    }

    /// Pre-shared keys from `path`, one `identity:hexkey` per line (the files GnuTLS's
    /// `psktool` makes and qemu and nbdkit read). Garbage in the file is an error naming the
    /// line; a file other users may read is a warning.
    pub fn psk(path: &Path, mode: TlsMode) -> io::Result<Self> {
        Ok(Self {
            credentials: Credentials::Psk(psk::Credentials::load(path)?),
            mode,
        })
    }

    /// `"X.509"` or `"PSK"`, for log lines.
    pub fn kind(&self) -> &'static str {
        match self.credentials {
            Credentials::X509(_) => "X.509",
            Credentials::Psk(_) => "PSK",
        }
    }
}

fn certificates(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, "certificates", &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, "certificates", &e))?;
    if chain.is_empty() {
        return Err(invalid(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(chain)
}

fn pem_error(path: &Path, what: &str, e: &rustls::pki_types::pem::Error) -> io::Error {
    match e {
        rustls::pki_types::pem::Error::Io(e) => {
            io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        }
        e => invalid(format!("{}: no {what} in PEM form: {e:?}", path.display())),
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Ciphertext received at most at once.
const RECEIVE_BYTES: usize = 64 << 10;

/// A TLS session of either implementation, reading ciphertext handed to it and writing
/// ciphertext for its holder to send.
// One per connection, made in place and never moved: the size of rustls's is no cost.
#[allow(clippy::large_enum_variant)]
enum Engine {
    X509(rustls::ServerConnection),
    Psk(psk::Session),
}

impl Engine {
    fn is_handshaking(&self) -> bool {
        match self {
            Self::X509(session) => session.is_handshaking(),
            Self::Psk(session) => session.is_handshaking(),
        }
    }

    /// Takes ciphertext from the front of `pending` (perhaps not all of it) and processes
    /// the records it completes.
    fn receive(&mut self, pending: &mut &[u8]) -> io::Result<()> {
        match self {
            Self::X509(session) => {
                session.read_tls(pending)?;
                session.process_new_packets().map_err(|e| tls_error(&e))?;
                Ok(())
            }
            Self::Psk(session) => session.receive(pending),
        }
    }

    /// The client closed its side; the session tells a clean close (`close_notify`) from a
    /// cut one.
    fn end_of_input(&mut self) -> io::Result<()> {
        match self {
            Self::X509(session) => {
                session.read_tls(&mut &[][..])?;
                session.process_new_packets().map_err(|e| tls_error(&e))?;
                Ok(())
            }
            Self::Psk(session) => session.end_of_input(),
        }
    }

    /// Plaintext received: `WouldBlock` when none, `Ok(0)` or `UnexpectedEof` at the end.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::X509(session) => session.reader().read(buf),
            Self::Psk(session) => session.read(buf),
        }
    }

    /// Encrypts a first part of `buf` (how much: the result).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::X509(session) => session.writer().write(buf),
            Self::Psk(session) => session.write(buf),
        }
    }

    /// Sends every TLS record the session has ready.
    fn flush(&mut self, socket: &mut Stream) -> io::Result<()> {
        match self {
            Self::X509(session) => {
                while session.wants_write() {
                    match session.write_tls(socket) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Self::Psk(session) => session.flush(socket),
        }
    }

    fn close_notify(&mut self) {
        match self {
            Self::X509(session) => session.send_close_notify(),
            Self::Psk(session) => session.close_notify(),
        }
    }
}

/// A TLS session over a connection's socket.
pub(crate) struct Session {
    /// The session and the socket it writes ciphertext to, written under the lock.
    state: Mutex<(Engine, Stream)>,
    /// The reading thread's socket clone and ciphertext received but not yet handed to the
    /// session (only the reading thread uses it; the lock is never contended).
    inbound: Mutex<Inbound>,
    /// Another clone, for what needs no lock (shutdown, addresses, timeouts).
    pub(crate) socket: Stream,
}

struct Inbound {
    socket: Stream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

impl Session {
    /// Starts a server session on `socket` (the handshake runs as it is read from).
    pub(crate) fn new(tls: &Tls, socket: &Stream) -> io::Result<Self> {
        let engine = match &tls.credentials {
            Credentials::X509(config) => {
                Engine::X509(rustls::ServerConnection::new(Arc::clone(config)).map_err(other)?)
            }
            Credentials::Psk(credentials) => Engine::Psk(psk::Session::new(credentials)?),
        };
        Ok(Self {
            state: Mutex::new((engine, socket.try_clone()?)),
            inbound: Mutex::new(Inbound {
                socket: socket.try_clone()?,
                buf: vec![0u8; RECEIVE_BYTES].into_boxed_slice(),
                start: 0,
                end: 0,
            }),
            socket: socket.try_clone()?,
        })
    }

    fn state(&self) -> MutexGuard<'_, (Engine, Stream)> {
        self.state.lock().expect("TLS session")
    }

    /// Runs the TLS handshake to its end, or fails at `deadline`.
    pub(crate) fn handshake(&self, deadline: Instant) -> io::Result<()> {
        let mut inbound = self.inbound.lock().expect("TLS input");
        loop {
            {
                let mut state = self.state();
                let (session, socket) = &mut *state;
                session.flush(socket)?;
                if !session.is_handshaking() {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the negotiation deadline passed during the TLS handshake",
                ));
            }
            self.socket.set_read_timeout(Some(left))?;
            if !self.feed(&mut inbound, true)? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection during the TLS handshake",
                ));
            }
        }
    }

    /// Hands received ciphertext to the session, receiving more first if none is waiting
    /// (`wait`: block for it; otherwise only what has arrived). False when the client closed
    /// the connection (or, not waiting, nothing has arrived: `WouldBlock`).
    fn feed(&self, inbound: &mut Inbound, wait: bool) -> io::Result<bool> {
        if inbound.start == inbound.end {
            (inbound.start, inbound.end) = (0, 0);
            let Inbound { socket, buf, .. } = inbound;
            let n = if wait {
                loop {
                    match socket.read(buf) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        other => break other?,
                    }
                }
            } else {
                super::sys::recv_now(socket, buf)?
            };
            inbound.end = n;
        }
        let mut state = self.state();
        let (session, socket) = &mut *state;
        if inbound.start == inbound.end {
            // The client closed: let the session know, so that it can tell a clean close
            // (close_notify) from a cut.
            session.end_of_input()?;
            return Ok(false);
        }
        let mut pending = &inbound.buf[inbound.start..inbound.end];
        let before = pending.len();
        let received = session.receive(&mut pending);
        inbound.start += before - pending.len();
        // Alerts and post-handshake messages go out whatever happened.
        let flushed = session.flush(socket);
        received?;
        flushed?;
        Ok(true)
    }

    /// Plaintext into `buf`; waits for it unless `wait` is false (then `WouldBlock` when
    /// none has arrived).
    fn read_plain(&self, buf: &mut [u8], wait: bool) -> io::Result<usize> {
        let mut inbound = self.inbound.lock().expect("TLS input");
        loop {
            match self.state().0.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !self.feed(&mut inbound, wait)? {
                // The client closed. Many clients (libnbd after NBD_CMD_DISC, qemu) close
                // without close_notify; the NBD framing above tells a clean end between
                // requests from a cut one, as over plain TCP (a request or payload cut short
                // is an error there), so a close without the alert is an end of stream here.
                return match self.state().0.read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                    other => other,
                };
            }
        }
    }

    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_plain(buf, true)
    }

    /// Plaintext that has arrived, without waiting (`WouldBlock` when there is none).
    pub(crate) fn read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_plain(buf, false)
    }

    /// Encrypts and sends `bufs` (all of them, or an error).
    pub(crate) fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut state = self.state();
        let (session, socket) = &mut *state;
        let mut written = 0;
        for buf in bufs {
            let mut rest: &[u8] = buf;
            while !rest.is_empty() {
                let n = session.write(rest)?;
                rest = &rest[n..];
                written += n;
                session.flush(socket)?;
            }
        }
        session.flush(socket)?;
        Ok(written)
    }

    /// Says goodbye (`close_notify`), as far as the socket takes it.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        let (session, socket) = &mut *state;
        session.close_notify();
        let _ = session.flush(socket);
    }
}

fn tls_error(e: &rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}
