//! TartarOS eBPF programs (built for `bpfel-unknown-none`, see docs/ebpf.md).
//!
//! Cgroup network filter, attached to the sandbox's cgroup v2 directory:
//! - `connect4` / `connect6` (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`, attach types
//!   `BPF_CGROUP_INET4_CONNECT` / `BPF_CGROUP_INET6_CONNECT`; Linux >= 4.17),
//! - `sendmsg4` / `sendmsg6` (`BPF_CGROUP_UDP4_SENDMSG` / `BPF_CGROUP_UDP6_SENDMSG`,
//!   unconnected UDP sends with an explicit destination; Linux >= 4.18),
//! - `sock_create` (`BPF_PROG_TYPE_CGROUP_SOCK`, `BPF_CGROUP_INET_SOCK_CREATE`;
//!   Linux >= 4.10; the kernel runs it for AF_INET / AF_INET6 sockets only).
//!
//! Only destinations present in `ALLOW` pass; everything else (other
//! families, IPv6 unless granted, IPv4-mapped IPv6 unless the IPv4 pair is
//! granted, failed lookups) is refused, which the kernel reports to the
//! caller as `EPERM`. Every connect / sendmsg decision and every refused
//! socket creation is written to the `EVENTS` ring buffer (Linux >= 5.8);
//! failed reservations are counted in the per-CPU `EVENTS_LOST` map because
//! the kernel keeps no drop counter for ring buffers.
//!
//! `probe_*` programs are never attached: the supervisor loads them to find
//! out which program types the host accepts (`tartaros doctor`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod bpf {
    use aya_ebpf::{
        bindings::{bpf_sock, bpf_sock_addr},
        helpers::{
            bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
            generated::{bpf_get_current_cgroup_id, bpf_ktime_get_ns},
        },
        macros::{btf_tracepoint, cgroup_sock, cgroup_sock_addr, fentry, lsm, map, raw_tracepoint},
        maps::{Array, HashMap, PerCpuArray, RingBuf},
        programs::{
            BtfTracePointContext, FEntryContext, LsmContext, RawTracePointContext, SockAddrContext,
            SockContext,
        },
    };
    use core::ptr::{addr_of, read_volatile};
    use tartaros_common::{
        AF_INET, AF_INET6, AF_NETLINK, AF_UNIX, ALLOW_MAX_ENTRIES, AllowKey, ConnectEvent,
        EVENTS_BYTES, FILTER_MODE_INDEX, FILTER_MONITOR, IPPROTO_TCP, IPPROTO_UDP, SOCK_DGRAM,
        SOCK_STREAM, kind, verdict,
    };

    /// Return value of a cgroup program that lets the operation proceed.
    const PASS: i32 = 1;
    /// Return value that refuses it; the caller sees `EPERM`.
    const REFUSE: i32 = 0;

    /// GPL-compatible licence: needed by the tracing probes (tp_btf, LSM,
    /// fentry only load with a GPL-compatible licence).
    #[unsafe(no_mangle)]
    #[unsafe(link_section = "license")]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

    #[map(name = "ALLOW")]
    static ALLOW: HashMap<AllowKey, u32> = HashMap::with_max_entries(ALLOW_MAX_ENTRIES, 0);

    #[map(name = "FILTER")]
    static FILTER: Array<u32> = Array::with_max_entries(1, 0);

    #[map(name = "EVENTS")]
    static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

    #[map(name = "EVENTS_LOST")]
    static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    // ---- connect / sendmsg ------------------------------------------------

    #[cgroup_sock_addr(connect4)]
    pub fn connect4(ctx: SockAddrContext) -> i32 {
        decide(kind::CONNECT4, &ctx, try_connect4)
    }

    fn try_connect4(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
        check_v4(ctx, ev)
    }

    #[cgroup_sock_addr(connect6)]
    pub fn connect6(ctx: SockAddrContext) -> i32 {
        decide(kind::CONNECT6, &ctx, try_connect6)
    }

    fn try_connect6(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
        check_v6(ctx, ev)
    }

    #[cgroup_sock_addr(sendmsg4)]
    pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
        decide(kind::SENDMSG4, &ctx, try_sendmsg4)
    }

    fn try_sendmsg4(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
        check_v4(ctx, ev)
    }

    #[cgroup_sock_addr(sendmsg6)]
    pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
        decide(kind::SENDMSG6, &ctx, try_sendmsg6)
    }

    fn try_sendmsg6(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
        check_v6(ctx, ev)
    }

    /// Runs `check`, records the event and turns the verdict into the
    /// program's return value. An `Err` is a verdict too (always a denial).
    #[inline(always)]
    fn decide(
        kind: u16,
        ctx: &SockAddrContext,
        check: impl Fn(&SockAddrContext, &mut ConnectEvent) -> Result<u16, u16>,
    ) -> i32 {
        let mut ev = new_event(kind);
        let v = match check(ctx, &mut ev) {
            Ok(v) => v,
            Err(v) => v,
        };
        ev.verdict = v;
        emit(&ev);
        if verdict::is_denied(v) { REFUSE } else { PASS }
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
    fn check_v4(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
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
        lookup(&AllowKey::v4(ip, ev.port))
    }

    #[inline(always)]
    fn check_v6(ctx: &SockAddrContext, ev: &mut ConnectEvent) -> Result<u16, u16> {
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
            return lookup(&AllowKey::v4(words[3], ev.port));
        }
        lookup(&AllowKey::v6(ev.addr, ev.port))
    }

    /// Allowed if granted; otherwise allowed only in monitor mode. A failed
    /// lookup of the mode, or any mode value but `FILTER_MONITOR`, enforces.
    #[inline(always)]
    fn lookup(key: &AllowKey) -> Result<u16, u16> {
        // SAFETY: the value is a plain `u32` that we only read; concurrent
        // updates from user space can at worst give us a stale value.
        if unsafe { ALLOW.get(key) }.is_some() {
            return Ok(verdict::ALLOW);
        }
        match FILTER.get(FILTER_MODE_INDEX) {
            Some(&FILTER_MONITOR) => Ok(verdict::ALLOW_MONITOR),
            Some(_) => Ok(verdict::DENY),
            None => Err(verdict::DENY_ERROR),
        }
    }

    // ---- socket creation ---------------------------------------------------

    #[cgroup_sock(sock_create)]
    pub fn sock_create(ctx: SockContext) -> i32 {
        match try_sock_create(&ctx) {
            Ok(()) => PASS,
            Err(ev) => {
                emit(&ev);
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
    /// is full.
    #[inline(always)]
    fn emit(ev: &ConnectEvent) {
        match EVENTS.reserve::<ConnectEvent>(0) {
            Some(mut entry) => {
                entry.write(*ev);
                entry.submit(0);
            }
            None => {
                if let Some(lost) = EVENTS_LOST.get_ptr_mut(0) {
                    // SAFETY: per-CPU slot of this CPU; programs do not
                    // migrate while running, so nothing else writes it now.
                    unsafe { *lost += 1 };
                }
            }
        }
    }

    // ---- capability probes (loaded by `probe_program_types`, never attached) --

    #[raw_tracepoint(tracepoint = "sys_enter")]
    pub fn probe_raw_tp(_ctx: RawTracePointContext) -> i32 {
        0
    }

    #[btf_tracepoint(function = "sched_process_exec")]
    pub fn probe_tp_btf(_ctx: BtfTracePointContext) -> i32 {
        0
    }

    #[lsm(hook = "file_open")]
    pub fn probe_lsm(_ctx: LsmContext) -> i32 {
        0
    }

    #[fentry(function = "do_unlinkat")]
    pub fn probe_fentry(_ctx: FEntryContext) -> i32 {
        0
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
