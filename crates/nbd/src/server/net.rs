//! Sockets: TCP and Unix-domain listeners and connections behind one type each.

use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::tls::Session;

/// A listening socket.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix-domain; the path (if the server created it) is removed when the server stops.
    Unix(UnixListener, Option<PathBuf>),
}

impl Listener {
    /// Where clients connect, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "tcp socket".into(), |a| format!("nbd://{a}")),
            Self::Unix(l, _) => l
                .local_addr()
                .ok()
                .and_then(|a| {
                    a.as_pathname()
                        .map(|p| format!("nbd+unix:///?socket={}", p.display()))
                })
                .unwrap_or_else(|| "unix socket".into()),
        }
    }

    /// Accepts one connection and the local address it arrived on (TCP only).
    pub(crate) fn accept(&self) -> io::Result<(Stream, Option<IpAddr>)> {
        match self {
            Self::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                let loopback = stream.peer_addr().is_ok_and(|a| a.ip().is_loopback());
                if loopback && let Some(algorithm) = super::sys::unpace_loopback(&stream) {
                    tracing::debug!(algorithm, "a loopback connection left BBR, which paces");
                }
                let acks = if loopback { Acks::AtOnce } else { Acks::Kernel };
                let local = stream.local_addr().ok().map(|a| a.ip());
                Ok((Stream::Tcp(stream, acks), local))
            }
            Self::Unix(l, _) => Ok((Stream::Unix(l.accept()?.0), None)),
        }
    }

    pub(crate) fn stop(&self) -> io::Result<()> {
        match self {
            Self::Tcp(l) => super::sys::stop_accepting(l),
            Self::Unix(l, _) => super::sys::stop_accepting(l),
        }
    }

    pub(crate) fn remove_path(&self) {
        if let Self::Unix(_, Some(path)) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// When a TCP connection acknowledges what it received.
///
/// The kernel holds an acknowledgement back while the application is behind (sending it
/// would shrink the window it offers) and sends it when the application reads next. A
/// client whose congestion control is BBR estimates its bandwidth from the pace of the
/// acknowledgements and paces its sends to match: each acknowledgement held back while the
/// connection's thread copies a write payload in lowers the estimate, and over loopback
/// every paced burst costs the client a high-resolution timer (on a virtual machine, an
/// exit to the hypervisor), so client and server settle at the rate the server happened to
/// read at. Receives inside a write payload — the client is sending the rest of it — are
/// therefore acknowledged at once. Measured on the development VM (BBR the system's default,
/// fio's nbd engine at queue depth 16, 64 KiB random writes, 3 s runs, servers alternated):
/// 2.3–3.2 GB/s with the kernel's timing, 3.7–4.3 GB/s acknowledged at once, nbdkit's memory
/// plugin (whose reading thread does nothing but read) 3.4–3.7; with the client on CUBIC, which
/// does not pace, 3.3–3.7 GB/s either way. Acknowledging every receive, also between
/// requests, gained nothing more and cost 4 KiB writes a system call per receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acks {
    /// The kernel's timing: connections from other hosts (not measured there) and Unix
    /// sockets' have no reason found to change it.
    Kernel,
    /// `TCP_QUICKACK` after each receive inside a write payload (loopback connections).
    AtOnce,
}

/// A connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream, Acks),
    Unix(UnixStream),
    /// TLS over one of the others (every clone shares the session).
    Tls(Arc<Session>),
}

impl super::export::ReadDebug for Stream {
    fn read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Stream::read_now(self, buf)
    }

    fn acknowledge(&mut self) {
        if let Self::Tcp(s, Acks::AtOnce) = self {
            // A failure only leaves the acknowledgement to the kernel's timing.
            let _ = super::sys::acknowledge_now(s);
        }
    }
}

impl Stream {
    /// The client, for logs: its address and port over TCP; the Unix socket's peer process
    /// when the kernel names it.
    pub(crate) fn peer(&self) -> String {
        match self {
            Self::Tcp(s, _) => s
                .peer_addr()
                .map_or_else(|_| "tcp peer".into(), |a| a.to_string()),
            Self::Unix(s) => super::sys::peer_pid(s)
                .map_or_else(|| "unix peer".into(), |pid| format!("unix peer pid {pid}")),
            Self::Tls(s) => s.socket.peer(),
        }
    }

    /// The client's address (TCP only).
    pub(crate) fn peer_ip(&self) -> Option<IpAddr> {
        match self {
            Self::Tcp(s, _) => s.peer_addr().ok().map(|a| a.ip()),
            Self::Unix(_) => None,
            Self::Tls(s) => s.socket.peer_ip(),
        }
    }

    /// The CPU the kernel last received this connection's data on (TCP; see
    /// `server/follow.rs`).
    pub(crate) fn incoming_cpu(&self) -> Option<u32> {
        match self {
            Self::Tcp(s, _) => super::sys::incoming_cpu(s),
            Self::Unix(_) => None,
            Self::Tls(s) => s.socket.incoming_cpu(),
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(s, acks) => Self::Tcp(s.try_clone()?, *acks),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
            Self::Tls(s) => Self::Tls(Arc::clone(s)),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Self::Tcp(s, _) => s.shutdown(how),
            Self::Unix(s) => s.shutdown(how),
            Self::Tls(s) => return s.socket.shutdown(how),
        };
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s, _) => s.set_read_timeout(timeout),
            Self::Unix(s) => s.set_read_timeout(timeout),
            Self::Tls(s) => s.socket.set_read_timeout(timeout),
        }
    }

    /// Whether the connection is encrypted.
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Ends a TLS session with its goodbye (nothing for plain connections).
    pub(crate) fn close_tls(&self) {
        if let Self::Tls(s) = self {
            s.close();
        }
    }

    /// What has arrived, without waiting (`WouldBlock` when nothing has).
    pub(crate) fn read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tls(s) => s.read_now(buf),
            _ => super::sys::recv_now(self, buf),
        }
    }

    /// Writes every slice, in order, with as few system calls as the kernel allows.
    pub(crate) fn write_all_slices(&mut self, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut slices, 0);
        while !slices.is_empty() {
            match self.write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Stream {
    /// Sends as much of `slices` as the socket takes without waiting and advances past it;
    /// returns true when everything went.
    /// (TLS sends nothing here: encrypting is a copy anyway, so the caller's copy of the
    /// rest costs nothing more and nothing waits while the bytes are lent.)
    pub(crate) fn send_now<'a>(&mut self, slices: &mut &mut [IoSlice<'a>]) -> io::Result<bool> {
        IoSlice::advance_slices(slices, 0);
        if self.is_tls() {
            return Ok(slices.is_empty());
        }
        while !slices.is_empty() {
            match super::sys::send_now(self, slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Self::Tcp(s, _) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
            Self::Tls(s) => s.socket.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s, _) => s.read(buf),
            Self::Unix(s) => s.read(buf),
            Self::Tls(s) => s.read(buf),
        }
    }

    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Self::Tcp(s, _) => s.read_vectored(bufs),
            Self::Unix(s) => s.read_vectored(bufs),
            Self::Tls(s) => {
                let Some(buf) = bufs.iter_mut().find(|b| !b.is_empty()) else {
                    return Ok(0);
                };
                s.read(buf)
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s, _) => s.write(buf),
            Self::Unix(s) => s.write(buf),
            Self::Tls(s) => s.write_vectored(&[IoSlice::new(buf)]),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Tcp(s, _) => s.write_vectored(bufs),
            Self::Unix(s) => s.write_vectored(bufs),
            Self::Tls(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Never polled: a negotiation's reads are few and small.
impl super::export::ReadDebug for Deadlined<'_> {}

/// A connection during negotiation: every read waits at most until one deadline, so a client
/// that trickles bytes cannot hold the handshake open longer than a silent one.
#[derive(Debug)]
pub(crate) struct Deadlined<'a> {
    pub(crate) stream: &'a mut Stream,
    pub(crate) deadline: std::time::Instant,
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the negotiation deadline passed",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::export::ReadDebug;

    #[test]
    fn loopback_connections_acknowledge_payload_receives_at_once() {
        let listener = Listener::Tcp(TcpListener::bind("127.0.0.1:0").expect("bind"));
        let Listener::Tcp(tcp) = &listener else {
            unreachable!()
        };
        let mut client = TcpStream::connect(tcp.local_addr().expect("address")).expect("connect");
        let (mut stream, local) = listener.accept().expect("accept");
        assert_eq!(local, Some(IpAddr::from([127, 0, 0, 1])));
        assert!(
            matches!(stream, Stream::Tcp(_, Acks::AtOnce)),
            "a loopback connection: {stream:?}"
        );
        assert!(
            matches!(
                stream.try_clone().expect("clone"),
                Stream::Tcp(_, Acks::AtOnce)
            ),
            "its clones (the reply writer, a TLS session's reader) keep the policy"
        );
        client.write_all(b"payload").expect("send");
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).expect("receive");
        assert_eq!(&buf, b"payload");
        // The kernel takes the option on a connected socket (a refusal would only be
        // ignored by `acknowledge`, so it is asked for directly here).
        let Stream::Tcp(socket, _) = &stream else {
            unreachable!()
        };
        super::super::sys::acknowledge_now(socket).expect("TCP_QUICKACK");
        stream.acknowledge();
    }
}
