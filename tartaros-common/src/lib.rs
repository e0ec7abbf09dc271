//! Types shared by the eBPF programs and the supervisor. Every type is
//! `#[repr(C)]` without implicit padding so both sides agree on the layout.
//!
//! Byte orders: addresses are kept as the raw network-order bytes the kernel
//! hands over (IPv4 in `addr[0..4]`, the rest zero); ports are in host order.
#![no_std]

pub mod capture;
pub mod syscalls;

/// `AF_UNIX`.
pub const AF_UNIX: u16 = 1;
/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// `AF_NETLINK`.
pub const AF_NETLINK: u16 = 16;

/// `SOCK_STREAM`.
pub const SOCK_STREAM: u16 = 1;
/// `SOCK_DGRAM`.
pub const SOCK_DGRAM: u16 = 2;
/// `SOCK_RAW`.
pub const SOCK_RAW: u16 = 3;

/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u16 = 6;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u16 = 17;

/// Name of the allow map (`HashMap<AllowKey, u32>`).
pub const MAP_ALLOW: &str = "ALLOW";
/// Name of every run's ring buffer, by `RunConfig::ring` (declared as a hash map of
/// `u32`, created by the loader as `BPF_MAP_TYPE_HASH_OF_MAPS` whose values
/// are ring buffers, Linux 5.10 for rings in maps).
pub const MAP_EVENTS: &str = "EVENTS";
/// Name of the per-CPU lost-event counters (`PerCpuHashMap<u64, [u64;
/// LOST_SLOTS]>` by run id, indexed by `capture::effect` kind).
pub const MAP_EVENTS_LOST: &str = "EVENTS_LOST";
/// Name of the runs' configurations (`HashMap<u64, capture::RunConfig>`,
/// by run id).
pub const MAP_RUNS: &str = "RUNS";
/// Name of the level of every run's cgroup (`Array<u32>`, one entry).
pub const MAP_RUN_LEVEL: &str = "RUN_LEVEL";
/// Name of the unix policy (`HashMap<u64, capture::UnixAllow>`, by run id).
pub const MAP_UNIX_ALLOW: &str = "UNIX_ALLOW";
/// Name of the transparent-interception map filled by `connect4` /
/// `connect6` (`LruHashMap<u64, SavedDst>`, keyed by socket cookie).
pub const MAP_TPROXY_COOKIE: &str = "TPROXY_COOKIE";
/// Name of the map `sock_ops` moves those entries to
/// (`LruHashMap<TransparentKey, SavedDst>`, keyed by the connection),
/// which the transparent proxy reads (and deletes from) on accept.
pub const MAP_TPROXY_PORT: &str = "TPROXY_PORT";
/// Name of the map of who opened each TCP connection, filled by
/// `connect4` / `connect6` (`LruHashMap<u64, ConnOwner>`, by socket cookie).
pub const MAP_OWNER_COOKIE: &str = "OWNER_COOKIE";
/// Name of the map `sock_ops` moves those entries to (`LruHashMap<
/// TransparentKey, u32>`, by the connection), which the gateways
/// read to attribute their records.
pub const MAP_OWNER_PORT: &str = "OWNER_PORT";
/// Name of the map of live gateway connections (`HashMap<u64,
/// ConnOwner>`, by socket cookie): made by `sock_ops` when a connection's
/// port-map entries are made, removed when the socket closes; it names the
/// run and the user whose entries and slot the close gives back.
pub const MAP_CONN_LIVE: &str = "CONN_LIVE";
/// Name of the per-user count of live gateway connections (`HashMap<u32,
/// i64>`, by the connecting task's uid on the host).
pub const MAP_CONN_QUOTA: &str = "CONN_QUOTA";
/// Capacity of the cookie maps (`TPROXY_COOKIE`, `OWNER_COOKIE`; LRU: an
/// entry lives from the connect program to `sock_ops` in the same
/// `connect` call, and one whose connect failed in between ages out).
pub const TPROXY_MAX_ENTRIES: u32 = 4096;
/// Capacity of the maps by connection (`TPROXY_PORT`, `OWNER_PORT`,
/// `CONN_LIVE`): plain hashes, so no run's entry is ever evicted to make
/// room for another's (adversarial round 22b: one user's flood evicted
/// another user's entries from the service's shared LRU maps). Four users'
/// quotas ([`CONN_QUOTA_PER_USER`]).
pub const CONN_MAX_ENTRIES: u32 = 16384;
/// Live gateway connections (each an entry in the maps by connection) one
/// user may hold at once, over all its runs of one object: a quarter of
/// [`CONN_MAX_ENTRIES`], as much as the whole LRU held before. A connection
/// over it gets no entry (its proxy refuses it, its records are unnamed):
/// only that user's connections suffer.
pub const CONN_QUOTA_PER_USER: i64 = 4096;
/// Capacity of [`MAP_CONN_QUOTA`]: one entry per user that ever connected
/// through a gateway in this object's life (never removed: a count of
/// zero costs one entry).
pub const CONN_QUOTA_USERS: u32 = 65536;

/// Capacity of the allow map (every run's grants).
pub const ALLOW_MAX_ENTRIES: u32 = 16384;
/// Runs one loaded object can hold at once: capacity of the maps keyed by
/// run id. A run is one cgroup (see `capture::RunConfig`).
pub const MAX_RUNS: u32 = 1024;
/// `BPF_F_NO_PREALLOC`: the maps keyed by run hold one entry per live run,
/// and a root run creates them for itself alone; preallocating every
/// `MAX_RUNS` entry (about 2 MiB for the unix policy) cost that run time.
pub const MAP_NO_PREALLOC: u32 = 1;
/// Size of the event ring buffer in bytes as compiled (power of two, page
/// multiple); the supervisor resizes it at load time.
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Filter mode: only destinations in the allow map pass. Any value other
/// than [`FILTER_MONITOR`] (including an unset `0` and a failed lookup) is
/// treated as enforcing, so a half-initialised filter fails closed.
pub const FILTER_ENFORCE: u32 = 1;
/// Filter mode: every destination passes, events are still emitted.
pub const FILTER_MONITOR: u32 = 2;

/// Value stored in the allow map for a granted destination.
pub const ALLOW_VALUE: u32 = 1;

/// [`AllowKey::family`] of a gateway's port ([`AllowKey::gateway`]): no
/// address family has this number, so no destination's key can be one.
pub const FAMILY_GATEWAY: u16 = 0xfffe;

/// Key of the allow map: one destination granted to one run.
///
/// 32 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllowKey {
    /// The run (its cgroup id, see `capture::RunConfig`).
    pub run: u64,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// Destination port, host byte order.
    pub port: u16,
    /// Network-order address bytes; IPv4 uses `addr[0..4]`, the rest is zero.
    /// IPv4-mapped IPv6 destinations are looked up as `AF_INET` keys.
    pub addr: [u8; 16],
    /// Zero.
    pub _pad: u32,
}

impl AllowKey {
    /// Key for an IPv4 destination (`octets` as in `Ipv4Addr::octets`).
    pub const fn v4(run: u64, octets: [u8; 4], port: u16) -> Self {
        let mut addr = [0u8; 16];
        addr[0] = octets[0];
        addr[1] = octets[1];
        addr[2] = octets[2];
        addr[3] = octets[3];
        Self {
            run,
            family: AF_INET,
            port,
            addr,
            _pad: 0,
        }
    }

    /// Key saying that a gateway of run `run` (a `--port` relay, the
    /// proxy, the broker) listens on loopback port `port`: the connect
    /// programs save the owner of a TCP connection only for connects to
    /// such a port on loopback (or to a redirect), so the owner maps hold
    /// entries for gateway connections alone. Every connect once had one,
    /// also those to the agent's own servers, and 6,000 of them evicted a
    /// waiting gateway connection's entry from the LRU (adversarial round 7).
    pub const fn gateway(run: u64, port: u16) -> Self {
        Self {
            run,
            family: FAMILY_GATEWAY,
            port,
            addr: [0; 16],
            _pad: 0,
        }
    }

    /// Key for an IPv6 destination (`octets` as in `Ipv6Addr::octets`).
    pub const fn v6(run: u64, octets: [u8; 16], port: u16) -> Self {
        Self {
            run,
            family: AF_INET6,
            port,
            addr: octets,
            _pad: 0,
        }
    }
}

/// The original destination of an intercepted TCP connect.
///
/// 32 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SavedDst {
    /// The run of the connecting task (`sock_ops` keys the port map by it).
    pub run: u64,
    /// `AF_INET` or `AF_INET6` (an IPv4-mapped IPv6 destination is saved
    /// as the `AF_INET` address it maps to).
    pub family: u16,
    /// Destination port, host byte order.
    pub port: u16,
    /// Network-order address bytes; IPv4 uses `addr[0..4]`.
    pub addr: [u8; 16],
    /// Family of the loopback address the connect was rewritten to
    /// (`AF_INET` for 127.0.0.1 and ::ffff:127.0.0.1, `AF_INET6` for ::1):
    /// the family under which the proxy sees the client.
    pub listener_family: u16,
    /// Zero.
    pub pad: u16,
}

/// Key of [`MAP_TPROXY_PORT`] and [`MAP_OWNER_PORT`]: one connection to a
/// gateway, as the gateway sees it on accept: the client's address and
/// port (the accepted connection's peer), the gateway's port, and the
/// family of the loopback address the client connected to.
///
/// The whole connection, not the client's port alone: two sockets may
/// share a local port (`SO_REUSEADDR`) while their connections differ, so
/// a second process connecting from the same port elsewhere (or to the
/// same gateway from 127.0.0.2) overwrote the first one's entry before the
/// gateway accepted it, and the gateway named the wrong process (adversarial
/// round 6). TCP keeps a live connection's four-tuple unique.
///
/// Runs have network namespaces of their own, so the same connection can
/// exist in two of them: the key names the run too.
///
/// 32 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransparentKey {
    /// The run (see [`SavedDst::run`]).
    pub run: u64,
    /// [`SavedDst::listener_family`].
    pub family: u16,
    /// Client's local port, host byte order.
    pub port: u16,
    /// The gateway's port (the client's remote port), host byte order.
    pub gateway_port: u16,
    /// Zero.
    pub _pad: u16,
    /// Client's local address in network order: an IPv4 address (also one
    /// an IPv6 socket uses through `::ffff:a.b.c.d`) in the first 4 bytes,
    /// the rest zero.
    pub addr: [u8; 16],
}

/// Who opened a TCP connection, by socket cookie: in `OWNER_COOKIE` until
/// `sock_ops` keys it by the connection, then in `CONN_LIVE` until the
/// socket closes.
///
/// 16 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnOwner {
    /// The run of the connecting task.
    pub run: u64,
    /// Its thread-group id.
    pub tgid: u32,
    /// Its uid on the host: the key of its slot in `CONN_QUOTA`.
    pub uid: u32,
}

/// Hook that produced an event ([`ConnectEvent::kind`]).
pub mod kind {
    /// `cgroup/connect4`.
    pub const CONNECT4: u16 = 1;
    /// `cgroup/connect6`.
    pub const CONNECT6: u16 = 2;
    /// `cgroup/sendmsg4` (unconnected UDP send with a destination).
    pub const SENDMSG4: u16 = 3;
    /// `cgroup/sendmsg6`.
    pub const SENDMSG6: u16 = 4;
    /// `cgroup/sock_create` (only denials are reported).
    pub const SOCK_CREATE: u16 = 5;
}

/// Decision recorded in [`ConnectEvent::verdict`].
pub mod verdict {
    /// Destination is in the allow map.
    pub const ALLOW: u16 = 1;
    /// Filter in monitor mode: allowed without a grant.
    pub const ALLOW_MONITOR: u16 = 2;
    /// Destination not granted.
    pub const DENY: u16 = 3;
    /// Address family / socket type / protocol not supported by the filter.
    pub const DENY_FAMILY: u16 = 4;
    /// A read of the context or a map lookup failed (fail closed).
    pub const DENY_ERROR: u16 = 5;
    /// Not granted, but a TCP connect: rewritten to the transparent proxy
    /// on loopback (the event carries the original destination).
    pub const REDIRECT: u16 = 6;
    /// Or'ed into a verdict when syscall capture records the attempt
    /// (`policy_quiet`): the event only tells the decoder the destination
    /// the kernel used, for the `connect` / `sendto` record of the same
    /// task, and is no record of its own.
    pub const DESTINATION_NOTE: u16 = 0x100;

    /// Whether `v` denies the operation.
    pub const fn is_denied(v: u16) -> bool {
        let v = v & !DESTINATION_NOTE;
        v >= DENY && v != REDIRECT
    }
}

/// One connect / sendmsg / socket-creation decision, as written to the
/// [`MAP_EVENTS`] ring buffer.
///
/// 56 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the decision.
    pub ktime_ns: u64,
    /// `bpf_get_current_cgroup_id()`: inode of the caller's cgroup v2 directory.
    pub cgroup_id: u64,
    /// Kernel task id (thread id) of the caller.
    pub pid: u32,
    /// Thread-group id (process id) of the caller.
    pub tgid: u32,
    /// Real uid of the caller.
    pub uid: u32,
    /// One of [`kind`].
    pub kind: u16,
    /// One of [`verdict`].
    pub verdict: u16,
    /// Address family of the destination (or of the socket, for `SOCK_CREATE`).
    pub family: u16,
    /// Destination port, host byte order (0 for `SOCK_CREATE`).
    pub port: u16,
    /// Socket type (`SOCK_STREAM`, ...), 0 when unknown.
    pub sock_type: u16,
    /// Socket protocol (`IPPROTO_TCP`, ...), 0 when unknown.
    pub protocol: u16,
    /// Network-order destination address, as for [`AllowKey::addr`]; an
    /// IPv4-mapped IPv6 destination is reported as the 16 bytes it was given.
    pub addr: [u8; 16],
}

impl ConnectEvent {
    /// An all-zero event.
    pub const ZERO: Self = Self {
        ktime_ns: 0,
        cgroup_id: 0,
        pid: 0,
        tgid: 0,
        uid: 0,
        kind: 0,
        verdict: 0,
        family: 0,
        port: 0,
        sock_type: 0,
        protocol: 0,
        addr: [0; 16],
    };
}

// Layout checks: both sides must agree, and there must be no padding (the
// kernel does not zero padding of ring-buffer records or map keys).
const _: () = assert!(core::mem::size_of::<AllowKey>() == 32);
const _: () = assert!(core::mem::align_of::<AllowKey>() == 8);
const _: () = assert!(core::mem::size_of::<ConnectEvent>() == 56);
const _: () = assert!(core::mem::align_of::<ConnectEvent>() == 8);
const _: () = assert!(core::mem::size_of::<SavedDst>() == 32);
const _: () = assert!(core::mem::align_of::<SavedDst>() == 8);
const _: () = assert!(core::mem::size_of::<TransparentKey>() == 32);
const _: () = assert!(core::mem::size_of::<ConnOwner>() == 16);

#[cfg(feature = "user")]
mod user {
    // SAFETY: `AllowKey` is `repr(C)`, `Copy`, has no padding (checked above)
    // and every bit pattern is a valid value.
    unsafe impl aya::Pod for super::AllowKey {}
    // SAFETY: as above for `ConnectEvent`.
    unsafe impl aya::Pod for super::ConnectEvent {}
    // SAFETY: as above: `repr(C)`, `Copy`, no padding (size asserts in
    // `capture`), integers only.
    unsafe impl aya::Pod for super::capture::RunConfig {}
    unsafe impl aya::Pod for super::ConnOwner {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::capture::UnixAllow {}
    // SAFETY: as above: `repr(C)`, `Copy`, 20 `u32`s (size asserted).
    unsafe impl aya::Pod for super::capture::FileLayout {}
    // SAFETY: as above: `repr(C)`, `Copy`, no padding (asserted), integers.
    unsafe impl aya::Pod for super::SavedDst {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TransparentKey {}
}
