//! The map of intercepted connects: the transparent proxy asks it where a
//! redirected connection was going.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};

use aya::maps::HashMap as AyaHashMap;

use super::load::{Object, map_data};
use super::{EbpfError, SavedDst, TransparentKey};
use crate::events::ConnectionEnds;

/// The map of intercepted connects, keyed by the connection.
pub(super) struct OriginalDstMap {
    map: Mutex<AyaHashMap<aya::maps::MapData, TransparentKey, SavedDst>>,
    run: u64,
}

impl OriginalDstMap {
    /// A second handle (own fd) on the map, for the connections of run
    /// `run`.
    pub(super) fn open(object: &Object, run: u64) -> Result<Self, EbpfError> {
        let name = tartaros_common::MAP_TPROXY_PORT;
        let err = |source| EbpfError::Map { map: name, source };
        let data = map_data(object, name).ok_or_else(|| EbpfError::MissingInObject {
            what: format!("map {name}"),
        })?;
        let id = data.info().map_err(err)?.id();
        let data = aya::maps::MapData::from_id(id).map_err(err)?;
        let map = AyaHashMap::try_from(aya::maps::Map::HashMap(data)).map_err(err)?;
        Ok(Self {
            map: Mutex::new(map),
            run,
        })
    }

    /// Removes and returns the original destination of the accepted
    /// connection `ends`.
    pub(super) fn take(&self, ends: ConnectionEnds) -> Option<SocketAddr> {
        let key = transparent_key(self.run, ends);
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let saved = map.get(&key, 0).ok()?;
        // A failed removal leaves a stale entry that the next connection
        // with the same ends replaces or removes (`sock_ops`, adversarial
        // round 24a).
        let _ = map.remove(&key);
        saved_destination(&saved)
    }
}

/// Who opened each TCP connection, keyed by the connection.
pub(super) struct OwnerMap {
    map: Mutex<AyaHashMap<aya::maps::MapData, TransparentKey, u32>>,
    run: u64,
}

impl OwnerMap {
    /// A second handle (own fd) on the map, for the connections of run
    /// `run`.
    pub(super) fn open(object: &Object, run: u64) -> Result<Self, EbpfError> {
        let name = tartaros_common::MAP_OWNER_PORT;
        let err = |source| EbpfError::Map { map: name, source };
        let data = map_data(object, name).ok_or_else(|| EbpfError::MissingInObject {
            what: format!("map {name}"),
        })?;
        let id = data.info().map_err(err)?.id();
        let data = aya::maps::MapData::from_id(id).map_err(err)?;
        let map = AyaHashMap::try_from(aya::maps::Map::HashMap(data)).map_err(err)?;
        Ok(Self {
            map: Mutex::new(map),
            run,
        })
    }

    /// The tgid that opened the accepted connection `ends`. The program
    /// keys an IPv6 socket connected to an IPv4-mapped address as IPv4, as
    /// the gateway sees it, so one family is looked up: a fallback to the
    /// other found a stale entry of another process that had used the same
    /// port. The entry is removed: each connection is accepted (and asked
    /// about) once, so the map holds only connections still waiting in a
    /// gateway's backlog.
    pub(super) fn owner(&self, ends: ConnectionEnds) -> Option<u32> {
        let key = transparent_key(self.run, ends);
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let owner = map.get(&key, 0).ok()?;
        // A failed removal leaves an entry that the next connection with
        // the same ends replaces or removes (`sock_ops`, adversarial round
        // 24a).
        let _ = map.remove(&key);
        Some(owner)
    }
}

/// The map key of an accepted connection: the client's address and port
/// (the peer) and the gateway's port (local). An IPv4 client (or an
/// IPv4-mapped one, on a dual-stack listener) is `AF_INET`, its address in
/// the first 4 bytes, as `sock_ops` writes it.
fn transparent_key(run: u64, ends: ConnectionEnds) -> TransparentKey {
    let mut addr = [0u8; 16];
    let v4 = match ends.peer.ip() {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    };
    let family = match (v4, ends.peer.ip()) {
        (Some(a), _) => {
            addr[..4].copy_from_slice(&a.octets());
            tartaros_common::AF_INET
        }
        (None, IpAddr::V6(a)) => {
            addr = a.octets();
            tartaros_common::AF_INET6
        }
        (None, IpAddr::V4(_)) => tartaros_common::AF_INET,
    };
    TransparentKey {
        run,
        family,
        port: ends.peer.port(),
        gateway_port: ends.local.port(),
        _pad: 0,
        addr,
    }
}

/// The socket address of a saved destination.
fn saved_destination(s: &SavedDst) -> Option<SocketAddr> {
    let ip = match s.family {
        tartaros_common::AF_INET => {
            IpAddr::V4(Ipv4Addr::new(s.addr[0], s.addr[1], s.addr[2], s.addr[3]))
        }
        tartaros_common::AF_INET6 => IpAddr::V6(Ipv6Addr::from(s.addr)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, s.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transparent_keys_and_destinations() {
        let ends = |peer: &str, local: &str| ConnectionEnds {
            peer: peer.parse().unwrap(),
            local: local.parse().unwrap(),
        };
        let k = transparent_key(5, ends("127.0.0.1:40000", "127.0.0.1:3129"));
        assert_eq!(
            (k.family, k.port, k.gateway_port),
            (tartaros_common::AF_INET, 40000, 3129)
        );
        assert_eq!(k.addr[..4], [127, 0, 0, 1]);
        assert!(k.addr[4..].iter().all(|b| *b == 0));
        // The same port from another address, or to another gateway, is
        // another connection: another key.
        let other = transparent_key(5, ends("127.0.0.2:40000", "127.0.0.1:3129"));
        assert_ne!(k, other);
        let other = transparent_key(5, ends("127.0.0.1:40000", "127.0.0.1:3128"));
        assert_ne!(k, other);
        let k = transparent_key(
            5,
            ends("[::ffff:127.0.0.1]:40001", "[::ffff:127.0.0.1]:3128"),
        );
        assert_eq!((k.family, k.port), (tartaros_common::AF_INET, 40001));
        assert_eq!(k.addr[..4], [127, 0, 0, 1]);
        let k = transparent_key(5, ends("[::1]:40002", "[::1]:3129"));
        assert_eq!((k.family, k.port), (tartaros_common::AF_INET6, 40002));
        assert_eq!(k.addr, std::net::Ipv6Addr::LOCALHOST.octets());
        let mut s = SavedDst {
            run: 5,
            family: tartaros_common::AF_INET,
            port: 443,
            addr: [0; 16],
            listener_family: tartaros_common::AF_INET,
            pad: 0,
        };
        s.addr[..4].copy_from_slice(&[192, 0, 2, 1]);
        assert_eq!(
            saved_destination(&s),
            Some("192.0.2.1:443".parse().unwrap())
        );
        s.family = tartaros_common::AF_INET6;
        s.addr = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(
            saved_destination(&s),
            Some("[2001:db8::1]:443".parse().unwrap())
        );
        s.family = 0;
        assert_eq!(saved_destination(&s), None);
    }
}
