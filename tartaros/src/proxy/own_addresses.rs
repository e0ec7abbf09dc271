//! The host's own addresses. The proxy and the broker run on the host, so
//! an allowed name that resolves to an address of one of its interfaces
//! reaches the host itself: every service bound to `0.0.0.0` or `::` on an
//! allowed port, as if from loopback. Ranges cannot say which addresses
//! those are (a host may have a public address, or one of the
//! documentation ranges left public on purpose, as here: `192.0.2.2` on
//! eth0), so the interfaces are asked.

use std::net::{IpAddr, SocketAddr};

/// Whether `ip` is an address of one of this network namespace's
/// interfaces (asked anew on each call: addresses come and go). A failure
/// to list them answers `true`: the caller refuses, as for an internal
/// address.
pub fn is_own_address(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return true;
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .any(|own| own.to_canonical() == ip)
}

/// Whether a connected stream reached this host itself: the kernel routes
/// a connect to one of its own addresses through loopback with that
/// address as the source, so both ends are the same address. Checked
/// after the connect too, for an address added between the listing and
/// the connect.
pub fn connected_to_self(local: SocketAddr, peer: SocketAddr) -> bool {
    local.ip().to_canonical() == peer.ip().to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_an_own_address_and_a_documentation_address_is_not() {
        assert!(is_own_address("127.0.0.1".parse().unwrap()));
        assert!(is_own_address("::ffff:127.0.0.1".parse().unwrap()));
        // 203.0.113.0/24 (RFC 5737) is on no interface of a test host.
        assert!(!is_own_address("203.0.113.77".parse().unwrap()));
    }

    #[test]
    fn a_connection_to_self_has_one_address_at_both_ends() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(connected_to_self(a("192.0.2.2:40000"), a("192.0.2.2:443")));
        assert!(connected_to_self(
            a("[::ffff:192.0.2.2]:40000"),
            a("192.0.2.2:443")
        ));
        assert!(!connected_to_self(
            a("192.0.2.2:40000"),
            a("198.51.100.1:443")
        ));
    }
}
