//! `sock_ops` (`BPF_PROG_TYPE_SOCK_OPS`, Linux 4.13): moves what the
//! connect programs saved for a gateway connection (see filter.rs) from its
//! socket cookie to the connection, where the gateway looks it up on
//! accept, and removes it when the socket closes.

use aya_ebpf::{
    EbpfContext as _, helpers::generated::bpf_get_socket_cookie, macros::sock_ops,
    programs::SockOpsContext,
};
use core::ptr::{addr_of, read_volatile};
use tartaros_common::{AF_INET, AF_INET6, ConnOwner, TransparentKey};

use crate::maps::{CONN_LIVE, OWNER_COOKIE, OWNER_PORT, TPROXY_COOKIE, TPROXY_PORT};
use crate::slots::{BPF_NOEXIST, claim, release};

// ---- sock_ops ----------------------------------------------------------

/// `BPF_SOCK_OPS_TCP_CONNECT_CB`: called from `tcp_connect()`, after the
/// local port is bound and before the SYN is sent (Linux 4.13; needs no
/// `bpf_sock_ops_cb_flags_set`).
const BPF_SOCK_OPS_TCP_CONNECT_CB: u32 = 3;
/// `BPF_SOCK_OPS_STATE_CB`: a state change of a socket that asked for
/// them (`BPF_SOCK_OPS_STATE_CB_FLAG`, Linux 4.16), called from
/// `tcp_set_state()` before the change (the ports are still bound);
/// `args[1]` is the new state.
const BPF_SOCK_OPS_STATE_CB: u32 = 10;
const BPF_SOCK_OPS_STATE_CB_FLAG: i32 = 1 << 2;
/// `TCP_SYN_SENT`, `TCP_CLOSE` (include/net/tcp_states.h); `args[0]` of
/// the state callback is the old state.
const TCP_SYN_SENT: u32 = 2;
const TCP_CLOSE: u32 = 7;
/// Return value of a sock_ops program (ignored for this callback).
const SOCK_OPS_OK: u32 = 1;

/// Moves the saved destination of an intercepted connect from its socket
/// cookie to its connection, where the gateway looks it up on accept.
#[sock_ops]
pub fn sock_ops(ctx: SockOpsContext) -> u32 {
    let _ = try_sock_ops(&ctx);
    SOCK_OPS_OK
}

/// `::ffff:a.b.c.d` (the words in network byte order, as sock_ops has
/// them).
#[inline(always)]
fn v4_mapped(ip6: [u32; 4]) -> bool {
    ip6[0] == 0 && ip6[1] == 0 && ip6[2] == 0x0000_ffff_u32.to_be()
}

/// The connection as the gateway sees it on accept (see
/// [`TransparentKey`]): keyed by the family the gateway sees (an IPv6
/// socket connected to an IPv4-mapped address reaches it as IPv4; keyed by
/// the socket's own family instead, an older IPv4 entry answered for it),
/// the client's address and port, and the gateway's port.
#[inline(always)]
fn connection_key(ctx: &SockOpsContext, run: u64) -> TransparentKey {
    let v6 = ctx.family() == u32::from(AF_INET6) && !v4_mapped(ctx.remote_ip6());
    let mut addr = [0u8; 16];
    if v6 {
        let ops = ctx.ops;
        // SAFETY: `ops` is the context pointer the kernel passed in; one
        // volatile 4-byte load per word at a constant offset, the access
        // the verifier accepts (it refuses a load through a pointer the
        // compiler computed from the context).
        let words = unsafe {
            [
                read_volatile(addr_of!((*ops).local_ip6[0])),
                read_volatile(addr_of!((*ops).local_ip6[1])),
                read_volatile(addr_of!((*ops).local_ip6[2])),
                read_volatile(addr_of!((*ops).local_ip6[3])),
            ]
        };
        let mut i = 0;
        while i < 16 {
            addr[i] = words[i / 4].to_ne_bytes()[i % 4];
            i += 1;
        }
    } else {
        // Also for a mapped connection of an IPv6 socket: `tcp_v4_connect`
        // has set the IPv4 source, the IPv6 one is set after this callback.
        let ip = ctx.local_ip4().to_ne_bytes();
        addr[0] = ip[0];
        addr[1] = ip[1];
        addr[2] = ip[2];
        addr[3] = ip[3];
    }
    TransparentKey {
        run,
        family: if v6 { AF_INET6 } else { AF_INET },
        // `local_port` is in host byte order; `remote_port` holds the
        // network-order port in the high bytes of a network-order word.
        port: ctx.local_port() as u16,
        gateway_port: u32::from_be(ctx.remote_port()) as u16,
        _pad: 0,
        addr,
    }
}

fn try_sock_ops(ctx: &SockOpsContext) -> Result<(), i32> {
    let op = ctx.op();
    // A state change matters only as the end of a client socket: the
    // close of a gateway connection (reset, connect failed or timed out,
    // or its end after the gateway's).
    let closed = op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == TCP_CLOSE;
    if op != BPF_SOCK_OPS_TCP_CONNECT_CB && !closed {
        return Ok(());
    }
    // SAFETY: the helper takes the context pointer the kernel passed in
    // (`bpf_get_socket_cookie_sock_ops`, Linux 4.19).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // One key for all the maps (the run is set per map): computed once,
    // the program stays within its verifier budget.
    let mut key = connection_key(ctx, 0);
    if closed {
        // SAFETY: copied out right away; written below for this socket.
        let Some(live) = (unsafe { CONN_LIVE.get(&cookie) }).copied() else {
            return Ok(());
        };
        // The gateway removes the connection's entries on accept. One
        // that never got past `SYN_SENT` (its SYN dropped by a full
        // backlog, then abandoned) will never be accepted: removed here.
        // One that was established may still wait in the backlog after
        // its client closed (a request sent, then `close`): the gateway
        // takes its entries on accept, a later socket on the same ends
        // replaces or removes them (below), and the run's end removes
        // what is left (`register::unregister`). Removing them at every
        // close would unname a short client: one that sends its request
        // and closes reaches `TCP_CLOSE` (from `FIN_WAIT2`, as an orphan
        // going to `TIME_WAIT`) one round trip later, while its
        // connection may still wait in the backlog. The listener's family
        // is the connection's (see `redirect`).
        if ctx.arg(0) == TCP_SYN_SENT {
            key.run = live.run;
            let _ = OWNER_PORT.remove(&key);
            let _ = TPROXY_PORT.remove(&key);
        }
        if CONN_LIVE.remove(&cookie).is_ok() {
            release(live.uid);
        }
        return Ok(());
    }
    // SAFETY: copied out right away; written by the connect programs of
    // the same socket, which run before this, in the same `connect` call.
    let Some(owner) = (unsafe { OWNER_COOKIE.get(&cookie) }).copied() else {
        return Ok(());
    };
    let _ = OWNER_COOKIE.remove(&cookie);
    // SAFETY: as above.
    let saved = unsafe { TPROXY_COOKIE.get(&cookie) }.copied();
    if saved.is_some() {
        let _ = TPROXY_COOKIE.remove(&cookie);
    }
    key.run = owner.run;
    // An entry describes the latest socket on its ends (adversarial round
    // 24a). One left by an earlier socket on these ends (reset while it
    // waited in the gateway's backlog: the gateway cannot read a reset
    // connection's ends, so it never took it) must not answer for this
    // one, which would then be named after the earlier socket's process
    // (F3) or served with its original destination (F2). So every map by
    // connection gets this socket's entry or loses the old one.
    if !admit(ctx, cookie, &owner) {
        let _ = OWNER_PORT.remove(&key);
        let _ = TPROXY_PORT.remove(&key);
        return Ok(());
    }
    if OWNER_PORT.insert(&key, &owner.tgid, 0).is_err() {
        let _ = OWNER_PORT.remove(&key);
    }
    let Some(saved) = saved else {
        // Not redirected (a direct connect to a gateway, also to the
        // transparent listener, which must refuse it): no destination.
        let _ = TPROXY_PORT.remove(&key);
        return Ok(());
    };
    // The listener's family is the family the gateway sees (`redirect`),
    // the one `connection_key` computed.
    let key = TransparentKey {
        run: saved.run,
        family: saved.listener_family,
        ..key
    };
    if TPROXY_PORT.insert(&key, &saved, 0).is_err() {
        let _ = TPROXY_PORT.remove(&key);
    }
    Ok(())
}

/// Counts the new connection of `owner` in its user's quota and asks for
/// its socket's state callbacks; `false` (nothing taken) when the user is
/// at its quota or either step fails: the connection then gets no entry,
/// its own proxy refuses it and its own records are unnamed; no other
/// user's entry goes.
#[inline(always)]
fn admit(ctx: &SockOpsContext, cookie: u64, owner: &ConnOwner) -> bool {
    if !claim(owner.uid) {
        return false;
    }
    if CONN_LIVE.insert(&cookie, owner, BPF_NOEXIST).is_err() {
        release(owner.uid);
        return false;
    }
    // The close of this socket gives the slot back (`closed` above);
    // without its state callbacks nothing would, and the slot would stay
    // taken for the object's life: no entry then.
    if ctx.set_cb_flags(BPF_SOCK_OPS_STATE_CB_FLAG).is_err() {
        let _ = CONN_LIVE.remove(&cookie);
        release(owner.uid);
        return false;
    }
    true
}
