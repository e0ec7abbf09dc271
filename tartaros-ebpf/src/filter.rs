//! The cgroup connect filter: `connect4` / `connect6` (Linux 4.17),
//! `sendmsg4` / `sendmsg6` (4.18) and `sock_create` (4.10). See main.rs.
//!
//! Each program judges by the configuration of the calling task's run
//! (`maps::run`); a task of no registered run is refused (these programs
//! are only attached above run cgroups), and a run without the filter
//! passes, as if the programs were not attached.
//!
//! Transparent interception: with a port in the run's `transparent_port`,
//! a TCP connect to a destination that is not granted is rewritten to that
//! port on loopback (writing `user_ip4` / `user_ip6` / `user_port`, Linux
//! 4.17) instead of refused. The original destination is saved under the
//! socket cookie (`bpf_get_socket_cookie` in sock_addr and sock_ops
//! programs, Linux 4.19), and `sock_ops` (Linux 4.13) moves it, once the
//! local port is bound (`BPF_SOCK_OPS_TCP_CONNECT_CB`, before the SYN is
//! sent), to `TPROXY_PORT` keyed by the connection (client address and
//! port, gateway port), where the proxy finds it.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_sock, bpf_sock_addr},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
        generated::{bpf_get_current_cgroup_id, bpf_get_socket_cookie, bpf_ktime_get_ns},
    },
    macros::{cgroup_sock, cgroup_sock_addr},
    programs::{SockAddrContext, SockContext},
};
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use tartaros_common::{
    AF_INET, AF_INET6, AF_NETLINK, AF_UNIX, AllowKey, ConnOwner, ConnectEvent, FILTER_MONITOR,
    IPPROTO_TCP, IPPROTO_UDP, SOCK_DGRAM, SOCK_STREAM, SavedDst,
    capture::{effect, feature},
    kind, verdict,
};

use crate::maps::{ALLOW, OWNER_COOKIE, Run, TPROXY_COOKIE, run};

/// Return value of a cgroup program that lets the operation proceed.
pub const PASS: i32 = 1;
/// Return value that refuses it; the caller sees `EPERM`.
pub const REFUSE: i32 = 0;

// ---- connect / sendmsg ------------------------------------------------

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    decide(kind::CONNECT4, &ctx, try_connect4)
}

fn try_connect4(ctx: &SockAddrContext, run: &Run, ev: &mut ConnectEvent) -> Result<u16, u16> {
    check_v4(ctx, run, ev, true)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    decide(kind::CONNECT6, &ctx, try_connect6)
}

fn try_connect6(ctx: &SockAddrContext, run: &Run, ev: &mut ConnectEvent) -> Result<u16, u16> {
    check_v6(ctx, run, ev, true)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    decide(kind::SENDMSG4, &ctx, try_sendmsg4)
}

fn try_sendmsg4(ctx: &SockAddrContext, run: &Run, ev: &mut ConnectEvent) -> Result<u16, u16> {
    check_v4(ctx, run, ev, false)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    decide(kind::SENDMSG6, &ctx, try_sendmsg6)
}

fn try_sendmsg6(ctx: &SockAddrContext, run: &Run, ev: &mut ConnectEvent) -> Result<u16, u16> {
    check_v6(ctx, run, ev, false)
}

/// Runs `check`, records the event and turns the verdict into the
/// program's return value. An `Err` is a verdict too (always a denial).
#[inline(always)]
fn decide(
    kind: u16,
    ctx: &SockAddrContext,
    check: impl Fn(&SockAddrContext, &Run, &mut ConnectEvent) -> Result<u16, u16>,
) -> i32 {
    let Some(run) = run() else {
        return REFUSE;
    };
    if !run.has(feature::FILTER) {
        return PASS;
    }
    let mut ev = new_event(kind);
    let v = match check(ctx, &run, &mut ev) {
        Ok(v) => v,
        Err(v) => v,
    };
    ev.verdict = v;
    if run.cfg.policy_quiet != 0 {
        // Syscall capture records the attempt; this event only tells its
        // record the destination the kernel used (`emit`).
        ev.verdict |= verdict::DESTINATION_NOTE;
    }
    emit(&run, &ev);
    if verdict::is_denied(v) {
        return REFUSE;
    }
    if (kind == kind::CONNECT4 || kind == kind::CONNECT6)
        && ev.sock_type == SOCK_STREAM
        && (v == verdict::REDIRECT || to_gateway(kind, ctx, &run, &ev))
    {
        // Runs in the connecting task: its tgid is who opened the
        // connection, race-free, whatever happens to the socket later.
        // SAFETY: the helper takes the context pointer the kernel passed in.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        let owner = ConnOwner {
            run: run.id,
            tgid: ev.tgid,
            uid: ev.uid,
        };
        let _ = OWNER_COOKIE.insert(&cookie, &owner, 0);
    }
    PASS
}

/// Whether a connect goes to one of the run's gateways: to `127.0.0.1`
/// (`connect4`), `::1` or `::ffff:127.0.0.1` (`connect6`), on a port in the
/// run's gateway set (`AllowKey::gateway`). Only those connections get an
/// owner entry: the gateways remove theirs on accept, so the entries are
/// bounded by the listen backlogs, and a flood of connects to the agent's
/// own servers cannot evict a waiting gateway connection's entry. The
/// address is read again from the context (4-byte loads, cheaper for the
/// verifier than rebuilding words from `ev.addr`).
#[inline(always)]
fn to_gateway(kind: u16, ctx: &SockAddrContext, run: &Run, ev: &ConnectEvent) -> bool {
    let sa = ctx.sock_addr;
    let loopback4 = u32::from_ne_bytes([127, 0, 0, 1]);
    let loopback = if kind == kind::CONNECT4 {
        // SAFETY: as in `read_common`.
        unsafe { read_volatile(addr_of!((*sa).user_ip4)) == loopback4 }
    } else {
        // SAFETY: as in `check_v6`.
        let (w0, w1, w2, w3) = unsafe {
            (
                read_volatile(addr_of!((*sa).user_ip6[0])),
                read_volatile(addr_of!((*sa).user_ip6[1])),
                read_volatile(addr_of!((*sa).user_ip6[2])),
                read_volatile(addr_of!((*sa).user_ip6[3])),
            )
        };
        let v6 = w2 == 0 && w3 == u32::from_ne_bytes([0, 0, 0, 1]);
        let mapped = w2 == u32::from_ne_bytes([0, 0, 0xff, 0xff]) && w3 == loopback4;
        w0 == 0 && w1 == 0 && (v6 || mapped)
    };
    // SAFETY: the value is a plain `u32` that we only test for presence.
    loopback && unsafe { ALLOW.get(&AllowKey::gateway(run.id, ev.port)) }.is_some()
}

/// Reads the socket's family, type and protocol into `ev`. These fields
/// are readable in sock_addr programs since Linux 4.17.
#[inline(always)]
fn read_common(sa: *const bpf_sock_addr, ev: &mut ConnectEvent) -> u32 {
    // SAFETY: `sa` is the context pointer the kernel passed in; the
    // verifier rewrites these loads into reads of the kernel's
    // `struct bpf_sock_addr_kern`, checked at load time. Volatile 4-byte
    // loads keep the compiler from merging them into wider loads the
    // verifier would refuse.
    let (family, sock_type, protocol) = unsafe {
        (
            read_volatile(addr_of!((*sa).user_family)),
            read_volatile(addr_of!((*sa).type_)),
            read_volatile(addr_of!((*sa).protocol)),
        )
    };
    ev.family = family as u16;
    ev.sock_type = sock_type as u16;
    ev.protocol = protocol as u16;
    family
}

#[inline(always)]
fn check_v4(
    ctx: &SockAddrContext,
    run: &Run,
    ev: &mut ConnectEvent,
    connect: bool,
) -> Result<u16, u16> {
    let sa = ctx.sock_addr;
    let family = read_common(sa, ev);
    // SAFETY: as in `read_common`.
    let (ip, port) = unsafe {
        (
            read_volatile(addr_of!((*sa).user_ip4)),
            read_volatile(addr_of!((*sa).user_port)),
        )
    };
    let ip = ip.to_ne_bytes(); // network order, as stored in the sockaddr
    ev.addr[0] = ip[0];
    ev.addr[1] = ip[1];
    ev.addr[2] = ip[2];
    ev.addr[3] = ip[3];
    // `user_port` holds the 16-bit network-order port in its low bytes.
    ev.port = u16::from_be(port as u16);
    if family != AF_INET as u32 {
        return Err(verdict::DENY_FAMILY);
    }
    let key = AllowKey::v4(run.id, ip, ev.port);
    let v = lookup(run, &key)?;
    if connect && v == verdict::DENY {
        return redirect(ctx, run, ev, key, Listener::V4);
    }
    Ok(v)
}

#[inline(always)]
fn check_v6(
    ctx: &SockAddrContext,
    run: &Run,
    ev: &mut ConnectEvent,
    connect: bool,
) -> Result<u16, u16> {
    let sa = ctx.sock_addr;
    let family = read_common(sa, ev);
    // SAFETY: as in `read_common`; `user_ip6` is read one 32-bit word at
    // a time, the access size the verifier accepts at every offset.
    let (w0, w1, w2, w3, port) = unsafe {
        (
            read_volatile(addr_of!((*sa).user_ip6[0])),
            read_volatile(addr_of!((*sa).user_ip6[1])),
            read_volatile(addr_of!((*sa).user_ip6[2])),
            read_volatile(addr_of!((*sa).user_ip6[3])),
            read_volatile(addr_of!((*sa).user_port)),
        )
    };
    let words = [
        w0.to_ne_bytes(),
        w1.to_ne_bytes(),
        w2.to_ne_bytes(),
        w3.to_ne_bytes(),
    ];
    let mut i = 0;
    while i < 16 {
        ev.addr[i] = words[i / 4][i % 4];
        i += 1;
    }
    ev.port = u16::from_be(port as u16);
    if family != AF_INET6 as u32 {
        return Err(verdict::DENY_FAMILY);
    }
    // ::ffff:a.b.c.d reaches IPv4 a.b.c.d through a dual-stack socket
    // without passing connect4/sendmsg4: judge it as that IPv4 pair.
    if w0 == 0 && w1 == 0 && words[2] == [0, 0, 0xff, 0xff] {
        let key = AllowKey::v4(run.id, words[3], ev.port);
        let v = lookup(run, &key)?;
        if connect && v == verdict::DENY {
            return redirect(ctx, run, ev, key, Listener::Mapped);
        }
        return Ok(v);
    }
    let key = AllowKey::v6(run.id, ev.addr, ev.port);
    let v = lookup(run, &key)?;
    if connect && v == verdict::DENY {
        return redirect(ctx, run, ev, key, Listener::V6);
    }
    Ok(v)
}

/// Where an intercepted connect is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listener {
    /// 127.0.0.1 (connect4).
    V4,
    /// ::ffff:127.0.0.1 (connect6 of an IPv4-mapped destination).
    Mapped,
    /// ::1 (connect6).
    V6,
}

/// Rewrites a refused TCP connect to the transparent proxy and saves its
/// original destination `dst` under the socket cookie. Returns
/// `Ok(REDIRECT)`, or `Ok(DENY)` when interception is off or does not apply
/// (not TCP), or `Err(DENY_ERROR)` when the destination cannot be saved
/// (fail closed: without it the proxy could not forward the connection).
#[inline(always)]
fn redirect(
    ctx: &SockAddrContext,
    run: &Run,
    ev: &ConnectEvent,
    dst: AllowKey,
    listener: Listener,
) -> Result<u16, u16> {
    let port = match run.cfg.transparent_port {
        p if p != 0 && p <= 0xffff => p as u16,
        _ => return Ok(verdict::DENY),
    };
    if ev.sock_type != SOCK_STREAM || ev.protocol != IPPROTO_TCP {
        return Ok(verdict::DENY);
    }
    // SAFETY: the helper takes the context pointer the kernel passed in
    // (`bpf_get_socket_cookie_sock_addr`).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let saved = SavedDst {
        run: run.id,
        family: dst.family,
        port: dst.port,
        addr: dst.addr,
        listener_family: if listener == Listener::V6 {
            AF_INET6
        } else {
            AF_INET
        },
        pad: 0,
    };
    if TPROXY_COOKIE.insert(&cookie, &saved, 0).is_err() {
        return Err(verdict::DENY_ERROR);
    }
    let sa = ctx.sock_addr;
    let loopback4 = u32::from_ne_bytes([127, 0, 0, 1]);
    // SAFETY: writes to the context the verifier allows for connect
    // programs (4-byte stores to `user_ip4`, `user_ip6[i]` and
    // `user_port`, Linux 4.17); checked at load time. `user_port` takes
    // the network-order port in its low 16 bits.
    unsafe {
        match listener {
            Listener::V4 => write_volatile(addr_of_mut!((*sa).user_ip4), loopback4),
            Listener::Mapped => {
                write_volatile(addr_of_mut!((*sa).user_ip6[0]), 0);
                write_volatile(addr_of_mut!((*sa).user_ip6[1]), 0);
                write_volatile(
                    addr_of_mut!((*sa).user_ip6[2]),
                    u32::from_ne_bytes([0, 0, 0xff, 0xff]),
                );
                write_volatile(addr_of_mut!((*sa).user_ip6[3]), loopback4);
            }
            Listener::V6 => {
                write_volatile(addr_of_mut!((*sa).user_ip6[0]), 0);
                write_volatile(addr_of_mut!((*sa).user_ip6[1]), 0);
                write_volatile(addr_of_mut!((*sa).user_ip6[2]), 0);
                write_volatile(
                    addr_of_mut!((*sa).user_ip6[3]),
                    u32::from_ne_bytes([0, 0, 0, 1]),
                );
            }
        }
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(port.to_be()));
    }
    Ok(verdict::REDIRECT)
}

/// Allowed if granted (a grant with port 0 covers every port of its
/// address); otherwise allowed only in monitor mode. A failed lookup of the
/// mode, or any mode value but `FILTER_MONITOR`, enforces.
#[inline(always)]
fn lookup(run: &Run, key: &AllowKey) -> Result<u16, u16> {
    let any_port = AllowKey { port: 0, ..*key };
    // SAFETY: the value is a plain `u32` that we only read; concurrent
    // updates from user space can at worst give us a stale value.
    if unsafe { ALLOW.get(key) }.is_some() || unsafe { ALLOW.get(&any_port) }.is_some() {
        return Ok(verdict::ALLOW);
    }
    if run.cfg.filter_mode == FILTER_MONITOR {
        Ok(verdict::ALLOW_MONITOR)
    } else {
        Ok(verdict::DENY)
    }
}

// ---- socket creation ---------------------------------------------------

#[cgroup_sock(sock_create)]
pub fn sock_create(ctx: SockContext) -> i32 {
    let Some(run) = run() else {
        return REFUSE;
    };
    if !run.has(feature::FILTER) {
        return PASS;
    }
    match try_sock_create(&ctx) {
        Ok(()) => PASS,
        Err(ev) => {
            emit(&run, &ev);
            REFUSE
        }
    }
}

/// Lets through what a coding agent needs: TCP and UDP over IPv4/IPv6
/// (destinations are then judged by connect/sendmsg), UNIX and netlink
/// sockets. Refuses raw sockets (`SOCK_RAW`), ICMP "ping" sockets, SCTP,
/// MPTCP, UDP-Lite and every other family (AF_PACKET, AF_VSOCK, ...).
///
/// Note: the kernel runs this hook only from `inet_create` /
/// `inet6_create`, so other families never reach it; those must be
/// refused by the seccomp filter on `socket(2)`.
fn try_sock_create(ctx: &SockContext) -> Result<(), ConnectEvent> {
    let sk: *const bpf_sock = ctx.sock;
    // SAFETY: `sk` is the context pointer; the verifier checks these
    // 4-byte loads against `struct bpf_sock` at load time.
    let (family, sock_type, protocol) = unsafe {
        (
            read_volatile(addr_of!((*sk).family)),
            read_volatile(addr_of!((*sk).type_)),
            read_volatile(addr_of!((*sk).protocol)),
        )
    };
    let allowed = match family {
        f if f == AF_UNIX as u32 || f == AF_NETLINK as u32 => true,
        f if f == AF_INET as u32 || f == AF_INET6 as u32 => {
            (sock_type == SOCK_STREAM as u32 && protocol == IPPROTO_TCP as u32)
                || (sock_type == SOCK_DGRAM as u32 && protocol == IPPROTO_UDP as u32)
        }
        _ => false,
    };
    if allowed {
        return Ok(());
    }
    let mut ev = new_event(kind::SOCK_CREATE);
    ev.verdict = verdict::DENY_FAMILY;
    ev.family = family as u16;
    ev.sock_type = sock_type as u16;
    ev.protocol = protocol as u16;
    Err(ev)
}

// ---- events --------------------------------------------------------------

#[inline(always)]
fn new_event(kind: u16) -> ConnectEvent {
    let pid_tgid = bpf_get_current_pid_tgid();
    let mut ev = ConnectEvent::ZERO;
    // SAFETY: helper calls without pointer arguments.
    unsafe {
        ev.ktime_ns = bpf_ktime_get_ns();
        ev.cgroup_id = bpf_get_current_cgroup_id();
    }
    ev.pid = pid_tgid as u32;
    ev.tgid = (pid_tgid >> 32) as u32;
    ev.uid = bpf_get_current_uid_gid() as u32;
    ev.kind = kind;
    ev
}

/// Writes `ev` to the ring buffer, or counts it as lost when the buffer
/// is full. When syscall capture records the same attempt
/// (`policy_quiet`) the event is only a note (`DESTINATION_NOTE`) of the
/// destination the kernel used, for the syscall's record: the agent's
/// sockaddr, read at `sys_enter`, may be one the kernel ignored (`sendto`
/// on a connected TCP socket) or one a second thread rewrote after the
/// read.
#[inline(always)]
fn emit(run: &Run, ev: &ConnectEvent) {
    let lost = match ev.kind {
        kind::SENDMSG4 | kind::SENDMSG6 => effect::SENDTO,
        _ => effect::CONNECT,
    };
    run.output(lost, ev);
}
