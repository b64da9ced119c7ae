//! Who may connect: address ranges (`--allow`) and per-peer connection counts.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Mutex;

/// An address range: an address and how many leading bits of it must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Every IPv4 and IPv6 address.
    pub const ALL: [Cidr; 2] = [
        Cidr {
            address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            prefix: 0,
        },
        Cidr {
            address: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            prefix: 0,
        },
    ];

    /// The range holding exactly `address`.
    pub fn host(address: IpAddr) -> Self {
        let address = address.to_canonical();
        Self {
            address,
            prefix: if address.is_ipv4() { 32 } else { 128 },
        }
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.address.is_ipv4() && Self::network(ip, self.prefix) == self.address
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (one host).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| {
            format!("{text:?}: not an address range (e.g. 192.168.1.0/24, 10.1.2.3, fd00::/8)")
        })?;
        let address = address.to_canonical();
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= bits => p,
                _ => return Err(format!("{text:?}: the prefix length must be 0 to {bits}")),
            },
        };
        let cidr = Self { address, prefix };
        // Host bits set below the prefix are almost always a typo for another range.
        if Self::network(address, prefix) != address {
            return Err(format!(
                "{text:?}: bits are set past the /{prefix} prefix (did you mean {}/{prefix}?)",
                Self::network(address, prefix)
            ));
        }
        Ok(cidr)
    }
}

impl Cidr {
    fn network(address: IpAddr, prefix: u8) -> IpAddr {
        fn clear<const N: usize>(mut octets: [u8; N], prefix: u8) -> [u8; N] {
            for (i, byte) in octets.iter_mut().enumerate() {
                let start = i * 8;
                let keep = usize::from(prefix).saturating_sub(start).min(8);
                *byte &= if keep == 0 { 0 } else { 0xFFu8 << (8 - keep) };
            }
            octets
        }
        match address {
            IpAddr::V4(a) => IpAddr::from(clear(a.octets(), prefix)),
            IpAddr::V6(a) => IpAddr::from(clear(a.octets(), prefix)),
        }
    }
}

/// Open connections per client address (TCP), from accept to close.
#[derive(Debug, Default)]
pub(crate) struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

impl PeerCounts {
    /// Counts one more connection from `ip` unless it already has `limit` (0: no limit).
    pub(crate) fn enter(&self, ip: IpAddr, limit: usize) -> bool {
        let mut counts = self.0.lock().expect("peer counts");
        let n = counts.entry(ip.to_canonical()).or_default();
        if limit != 0 && *n >= limit {
            if *n == 0 {
                counts.remove(&ip.to_canonical());
            }
            return false;
        }
        *n += 1;
        true
    }

    pub(crate) fn leave(&self, ip: IpAddr) {
        let mut counts = self.0.lock().expect("peer counts");
        let ip = ip.to_canonical();
        if let Some(n) = counts.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_contain_what_their_prefix_says() {
        let net: Cidr = "192.168.4.0/22".parse().unwrap();
        assert!(net.contains(ip("192.168.4.0")));
        assert!(net.contains(ip("192.168.7.255")));
        assert!(!net.contains(ip("192.168.8.0")));
        assert!(!net.contains(ip("192.168.3.255")));
        assert!(net.contains(ip("::ffff:192.168.5.1")), "v4-mapped v6");
        assert!(!net.contains(ip("fd00::1")));
        let host: Cidr = "10.1.2.3".parse().unwrap();
        assert!(host.contains(ip("10.1.2.3")));
        assert!(!host.contains(ip("10.1.2.4")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fdff:1::2")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        for all in Cidr::ALL {
            assert!(all.contains(ip("1.2.3.4")) || all.contains(ip("::2")));
        }
        assert!(Cidr::ALL.iter().any(|c| c.contains(ip("8.8.8.8"))));
        assert!(Cidr::ALL.iter().any(|c| c.contains(ip("2001:db8::1"))));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for (text, says) in [
            ("10.0.0.0/33", "prefix length"),
            ("10.0.0.0/", "prefix length"),
            ("fd00::/129", "prefix length"),
            ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
            ("host.example", "not an address range"),
            ("", "not an address range"),
        ] {
            let e = text.parse::<Cidr>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn peer_counts_enforce_the_limit_and_forget_idle_peers() {
        let counts = PeerCounts::default();
        let a = ip("10.0.0.1");
        assert!(counts.enter(a, 2));
        assert!(counts.enter(ip("::ffff:10.0.0.1"), 2));
        assert!(!counts.enter(a, 2));
        assert!(counts.enter(ip("10.0.0.2"), 2));
        counts.leave(a);
        assert!(counts.enter(a, 2));
        for _ in 0..5 {
            assert!(counts.enter(ip("10.0.0.3"), 0), "0 means no limit");
        }
        counts.leave(a);
        counts.leave(a);
        counts.leave(ip("10.0.0.2"));
        for _ in 0..5 {
            counts.leave(ip("10.0.0.3"));
        }
        assert!(counts.0.lock().unwrap().is_empty());
    }
}
