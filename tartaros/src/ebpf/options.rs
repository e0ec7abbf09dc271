//! What to attach: the connect grants and the attach options.

use std::net::IpAddr;
use std::path::PathBuf;

use super::*;

/// A destination the sandboxed processes may connect or send to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectGrant {
    pub addr: IpAddr,
    pub port: u16,
}

impl ConnectGrant {
    /// The allow-map key for this grant. An IPv4-mapped IPv6 address is
    /// stored as the IPv4 address it maps to, matching how the programs
    /// judge `::ffff:a.b.c.d`.
    pub fn key(&self, run: u64) -> AllowKey {
        match self.addr {
            IpAddr::V4(a) => AllowKey::v4(run, a.octets(), self.port),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => AllowKey::v4(run, v4.octets(), self.port),
                None => AllowKey::v6(run, a.octets(), self.port),
            },
        }
    }
}

/// What [`attach_with`] installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachOptions {
    /// Attach the connect filter (connect4/6, sendmsg4/6, socket
    /// creation). A run that neither records attempts nor intercepts has
    /// no use for it: its network namespace has no way out but the
    /// gateways, and the unix policy alone costs a fraction of the start.
    pub filter: bool,
    /// Destinations the connect filter lets through.
    pub grants: Vec<ConnectGrant>,
    /// Attach the capture programs (exec / fork / exit, syscalls).
    pub capture: bool,
    /// Size of the event ring buffer: a power of two, >= 4096; 0 for none
    /// (the records are then counted as lost).
    pub ring_bytes: u32,
    /// Install the unix-socket path policy.
    pub unix_policy: bool,
    /// With `unix_policy`: pathname sockets are reachable only under these
    /// directories (at most 8, absolute, shorter than 107 bytes). Empty
    /// means no pathname socket at all.
    pub unix_allowed: Vec<PathBuf>,
    /// Transparent interception: TCP connects to destinations that are not
    /// granted go to this port on loopback (127.0.0.1, ::ffff:127.0.0.1 or
    /// ::1, after the destination's family) instead of being refused. UDP
    /// stays refused. `None`: refuse them.
    pub transparent_port: Option<u16>,
    /// With `capture`: gateways (relay, proxy, broker) will ask who opened
    /// their connections (`CgroupPrograms::connection_owner`).
    pub attribution: bool,
    /// With `attribution`: the loopback ports the gateways listen on. Only
    /// TCP connects to these (and redirected ones) get an owner entry.
    pub gateway_ports: Vec<u16>,
}

/// Entries of a map a run's own object does not use (its programs
/// reference it, nothing reads it): small. The programs ignore a failed
/// insert into these maps, and an LRU map takes a free entry from another
/// CPU's list before it fails; a full plain hash of connections leaves a
/// connection without an entry, which nothing there asks for.
pub const UNUSED_MAP_ENTRIES: u32 = 64;
/// Entries of a run's own `ALLOW`: its grants (two, loopback) and what
/// [`super::CgroupPrograms::allow`] adds.
pub const OWN_ALLOW_ENTRIES: u32 = 256;

impl AttachOptions {
    /// The parts installed for the run (`capture::feature` bits), and so
    /// the programs it needs.
    pub fn features(&self) -> u32 {
        use tartaros_common::capture::feature;
        let transparent = self.transparent_port.is_some();
        let mut bits = 0;
        if self.filter || self.capture || transparent {
            bits |= feature::FILTER;
        }
        if self.capture || transparent {
            bits |= feature::SOCK_OPS;
        }
        if self.unix_policy {
            bits |= feature::UNIX;
        }
        if self.capture {
            bits |= feature::CAPTURE;
        }
        bits
    }

    /// How many entries a run's own object gives map `name`, where that
    /// is not what the object declares (the service's object serves every
    /// run and keeps the declared sizes). A preallocated LRU map of 4,096
    /// entries took ~0.15 ms to create and the buckets of a 16,384-entry
    /// `ALLOW` ~0.4 ms, on the path of every `--log` start before the
    /// verifier could begin.
    pub fn own_map_entries(&self, name: &str) -> Option<u32> {
        use tartaros_common::{
            MAP_ALLOW, MAP_CONN_LIVE, MAP_CONN_QUOTA, MAP_OWNER_COOKIE, MAP_OWNER_PORT,
            MAP_TPROXY_COOKIE, MAP_TPROXY_PORT, TPROXY_MAX_ENTRIES,
        };
        let unless = |used: bool| (!used).then_some(UNUSED_MAP_ENTRIES);
        // The maps by connection are declared for every user of the
        // service's object (`CONN_MAX_ENTRIES`); one run alone needs no
        // more than a user's quota, as the LRU maps had before round 22b.
        let own = |used: bool| {
            Some(if used {
                TPROXY_MAX_ENTRIES
            } else {
                UNUSED_MAP_ENTRIES
            })
        };
        let transparent = self.transparent_port.is_some();
        let owners = self.capture && self.attribution;
        match name {
            MAP_ALLOW => Some(OWN_ALLOW_ENTRIES.saturating_add(self.gateway_entries())),
            MAP_TPROXY_COOKIE => unless(transparent),
            MAP_TPROXY_PORT => own(transparent),
            MAP_OWNER_PORT => own(owners),
            // `sock_ops` makes an intercepted connection's entries from its
            // owner (round 22b), whether or not anyone asks who it was.
            MAP_OWNER_COOKIE => unless(transparent || owners),
            MAP_CONN_LIVE => own(transparent || owners),
            // One run's users: its agent's uid, a few at most.
            MAP_CONN_QUOTA => Some(UNUSED_MAP_ENTRIES),
            _ => None,
        }
    }

    /// What decides the sizes of [`Self::own_map_entries`]: two options
    /// with the same key make the same object.
    pub fn sizing(&self) -> (bool, bool, u32) {
        (
            self.transparent_port.is_some(),
            self.capture && self.attribution,
            self.gateway_entries(),
        )
    }

    /// Room in a run's own `ALLOW` for its gateways' ports (one each).
    fn gateway_entries(&self) -> u32 {
        if self.attribution {
            u32::try_from(self.gateway_ports.len()).unwrap_or(u32::MAX)
        } else {
            0
        }
    }
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self {
            filter: true,
            grants: Vec::new(),
            capture: false,
            ring_bytes: DEFAULT_RING_BYTES,
            unix_policy: false,
            unix_allowed: Vec::new(),
            transparent_port: None,
            attribution: false,
            gateway_ports: Vec::new(),
        }
    }
}
