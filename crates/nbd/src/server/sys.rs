//! The server's system calls that std does not wrap: adopting sockets inherited through
//! systemd-style socket activation, listing interface addresses (to find the NIC, and so the
//! node, a connection arrived on), blocking and waiting for termination signals, and waking a
//! thread blocked in `accept`.
//!
//! This is the only module of the crate with `unsafe`.

#![allow(
    unsafe_code,
    reason = "the server's one gateway to fd adoption, getifaddrs and signal masks"
)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixListener;

/// First inherited fd under socket activation (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;
/// Most inherited sockets adopted.
const MAX_LISTEN_FDS: usize = 64;

/// A listening socket inherited from the process that started us.
#[derive(Debug)]
pub enum Inherited {
    /// A TCP socket.
    Tcp(TcpListener),
    /// A Unix-domain socket.
    Unix(UnixListener),
}

/// The sockets passed by socket activation (`LISTEN_PID` = this process, `LISTEN_FDS` = n:
/// fds 3..3+n), or `None` when the environment does not pass any to this process.
pub fn inherited_listeners() -> io::Result<Option<Vec<Inherited>>> {
    let Ok(pid) = std::env::var("LISTEN_PID") else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let count = std::env::var("LISTEN_FDS").unwrap_or_default();
    let count: usize = count.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={count:?} is not a number"),
        )
    })?;
    if count > MAX_LISTEN_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={count}: at most {MAX_LISTEN_FDS} sockets"),
        ));
    }
    let mut listeners = Vec::with_capacity(count);
    for fd in (LISTEN_FDS_START..).take(count) {
        let domain = socket_option(fd, libc::SO_DOMAIN).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("inherited fd {fd} (LISTEN_FDS) is not a socket: {e}"),
            )
        })?;
        if socket_option(fd, libc::SO_ACCEPTCONN)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("inherited fd {fd} (LISTEN_FDS) is not a listening socket"),
            ));
        }
        // `fd` is an open listening socket (getsockopt succeeded on it) that socket activation
        // handed to this process; nothing else in the process owns it, and it is adopted once.
        let listener = match domain {
            // SAFETY: as above.
            libc::AF_UNIX => Inherited::Unix(unsafe { UnixListener::from_raw_fd(fd) }),
            libc::AF_INET | libc::AF_INET6 => {
                // SAFETY: as above.
                Inherited::Tcp(unsafe { TcpListener::from_raw_fd(fd) })
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("inherited fd {fd} has socket domain {other}, not TCP or Unix"),
                ));
            }
        };
        set_cloexec(fd)?;
        listeners.push(listener);
    }
    Ok(Some(listeners))
}

/// The process id at the other end of a Unix-domain connection (`SO_PEERCRED`), if the
/// kernel says.
pub(crate) fn peer_pid(socket: &impl AsRawFd) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; a bad fd only makes
    // the call fail.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

/// The CPU the kernel last received the socket's data on (`SO_INCOMING_CPU`), if it
/// recorded one (TCP does; Unix-domain sockets do not).
pub(crate) fn incoming_cpu(socket: &impl AsRawFd) -> Option<u32> {
    socket_option(socket.as_raw_fd(), libc::SO_INCOMING_CPU)
        .ok()
        .and_then(|cpu| u32::try_from(cpu).ok())
}

/// Turns off pacing on a TCP connection with a peer on this machine (the caller checked
/// that it is one). The kernel paces the
/// sends of a connection whose congestion control asks for it (BBR: one high-resolution
/// timer per burst), which over loopback — no link to share, no queue to spare — only
/// costs: on the development VM, where arming a timer exits to the hypervisor, it halved
/// 64 KiB reads (fio at queue depth 16: 2.3 GB/s with BBR, 4.4 GB/s with CUBIC). Such a
/// connection is moved to CUBIC, or Reno where CUBIC is not allowed; connections from other
/// hosts keep the system's choice. Returns the algorithm now in use when it changed it.
pub(crate) fn unpace_loopback(stream: &std::net::TcpStream) -> Option<&'static str> {
    let mut name = [0u8; 16];
    let paced = get_option(
        stream.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_CONGESTION,
        &mut name,
    )
    .is_ok_and(|()| name.starts_with(b"bbr"));
    if !paced {
        return None;
    }
    ["cubic", "reno"].into_iter().find(|algorithm| {
        set_option(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            algorithm.as_bytes(),
        )
        .is_ok()
    })
}

fn socket_option(fd: RawFd, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value = [0u8; size_of::<libc::c_int>()];
    get_option(fd, libc::SOL_SOCKET, option, &mut value)?;
    Ok(libc::c_int::from_ne_bytes(value))
}

/// `getsockopt` into `value`.
fn get_option(
    fd: RawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: &mut [u8],
) -> io::Result<()> {
    let mut len = value.len() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given; a bad fd only makes
    // the call fail.
    let rc =
        unsafe { libc::getsockopt(fd, level, option, value.as_mut_ptr().cast(), &raw mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_option(fd: RawFd, level: libc::c_int, option: libc::c_int, value: &[u8]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, which the kernel only reads; a bad fd
    // only makes the call fail.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd this process owns, with integer arguments only.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every (interface name, address) pair of this host (`getifaddrs`).
pub fn interface_addresses() -> io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, which is valid for a write.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut entry = head;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs built, alive until freeifaddrs.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr whose family says its real type and size.
        let address = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                }
                _ => None,
            }
        };
        if let Some(address) = address {
            out.push((name, address));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// SIGINT, SIGTERM and SIGHUP blocked in the calling thread (and every thread it starts
/// afterwards), to be taken synchronously with [`TerminationSignals::wait`].
#[derive(Debug)]
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    /// Blocks the signals. Call before starting any thread, so that all inherit the mask.
    pub fn block() -> io::Result<Self> {
        // SAFETY: sigemptyset/sigaddset initialise and fill `set`, a plain value owned here;
        // pthread_sigmask reads it and changes only the calling thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&raw mut set, signal);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Ok(Self { set })
        }
    }

    /// Waits for one of the signals and returns its number.
    pub fn wait(&self) -> io::Result<i32> {
        let mut signal: libc::c_int = 0;
        // SAFETY: `self.set` was initialised by `block`; `signal` is valid for a write.
        let rc = unsafe { libc::sigwait(&raw const self.set, &raw mut signal) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(signal)
    }
}

/// Receives what is already queued on the socket, without waiting (`MSG_DONTWAIT`):
/// `WouldBlock` when nothing is, `Ok(0)` at the end of the stream.
pub fn recv_now(socket: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length and outlives the call.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Sends the acknowledgement of what a TCP socket received, if one is due, now rather than
/// when the kernel's delayed-acknowledgement rules would (`TCP_QUICKACK`; see `Acks` in
/// `server/net.rs`). The setting does not last: each receive that needs it asks again.
pub fn acknowledge_now(socket: &impl AsRawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    set_option(
        socket.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_QUICKACK,
        &on.to_ne_bytes(),
    )
}

/// Sends what the socket takes now from `slices` (at most `IOV_MAX` of them), without
/// waiting (`MSG_DONTWAIT`, and `MSG_NOSIGNAL`: a closed peer is an error, not a signal).
pub fn send_now(socket: &impl AsRawFd, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
    let count = slices.len().min(libc::UIO_MAXIOV as usize);
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` on Unix; sendmsg only reads through it.
    message.msg_iov = slices.as_ptr().cast_mut().cast();
    message.msg_iovlen = count as _;
    // SAFETY: `message` points at `count` valid iovecs whose buffers outlive the call.
    let n = unsafe {
        libc::sendmsg(
            socket.as_raw_fd(),
            &message,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Wakes every thread blocked in `accept` on `listener` (they fail with `EINVAL`), so that
/// an acceptor can stop without another connection arriving.
pub fn stop_accepting(listener: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: shutdown on an fd the caller's listener owns; no memory is passed.
    let rc = unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RD) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Binds a Unix socket that never exists with looser permissions than `mode`: created under
/// a umask that leaves only the owner in, then given `mode` and `group`. The umask is
/// process-wide: call this at start, before other threads create files.
pub fn bind_unix(
    path: &std::path::Path,
    mode: u32,
    group: Option<libc::gid_t>,
) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: umask only swaps the process's file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound?;
    let finish = || -> io::Result<()> {
        if let Some(gid) = group {
            std::os::unix::fs::chown(path, None, Some(gid))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(listener)
}

/// A group's id, by name or number.
pub fn group_id(text: &str) -> io::Result<libc::gid_t> {
    if let Ok(gid) = text.parse::<libc::gid_t>() {
        return Ok(gid);
    }
    let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_owned());
    let name = std::ffi::CString::new(text).map_err(|_| invalid("a group name with a NUL byte"))?;
    // SAFETY: `group` is plain data that getgrnam_r fills in; all-zero is a valid value.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buffer = vec![0 as libc::c_char; 64 << 10];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, `group`,
    // `buffer` and `found` are writable and `buffer.len()` is the buffer's true size.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &raw mut group,
            buffer.as_mut_ptr(),
            buffer.len(),
            &raw mut found,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if found.is_null() {
        return Err(invalid("no such group"));
    }
    Ok(group.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_wakes_a_blocked_accept_on_tcp_and_unix() {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind");
        let dir = std::env::temp_dir().join(format!("locus-nbd-sys-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let unix = UnixListener::bind(&dir).expect("bind unix");
        std::thread::scope(|s| {
            let t = s.spawn(|| tcp.accept().is_err());
            let u = s.spawn(|| unix.accept().is_err());
            std::thread::sleep(std::time::Duration::from_millis(50));
            stop_accepting(&tcp).expect("shutdown tcp");
            stop_accepting(&unix).expect("shutdown unix");
            assert!(
                t.join().expect("tcp thread"),
                "accept returned a connection"
            );
            assert!(
                u.join().expect("unix thread"),
                "accept returned a connection"
            );
        });
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn loopback_is_among_the_interface_addresses() {
        let addresses = interface_addresses().expect("getifaddrs");
        assert!(
            addresses
                .iter()
                .any(|(name, ip)| name == "lo" && *ip == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{addresses:?}"
        );
    }
}
