//! TartarOS eBPF programs (built for `bpfel-unknown-none`, see docs/ebpf.md).
//!
//! Cgroup network filter (`filter.rs`), attached to the sandbox's cgroup v2
//! directory:
//! - `connect4` / `connect6` (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`, attach types
//!   `BPF_CGROUP_INET4_CONNECT` / `BPF_CGROUP_INET6_CONNECT`; Linux >= 4.17),
//! - `sendmsg4` / `sendmsg6` (`BPF_CGROUP_UDP4_SENDMSG` / `BPF_CGROUP_UDP6_SENDMSG`,
//!   unconnected UDP sends with an explicit destination; Linux >= 4.18),
//! - `sock_create` (`BPF_PROG_TYPE_CGROUP_SOCK`, `BPF_CGROUP_INET_SOCK_CREATE`;
//!   Linux >= 4.10; the kernel runs it for AF_INET / AF_INET6 sockets only).
//!
//! - `sock_ops` (`BPF_PROG_TYPE_SOCK_OPS`, `BPF_CGROUP_SOCK_OPS`; Linux >= 4.13),
//!   only with transparent interception: a TCP connect that is not granted
//!   is rewritten to the transparent proxy on loopback and its original
//!   destination saved (see filter.rs and docs/ebpf.md).
//!
//! Only destinations present in `ALLOW` pass; everything else (other
//! families, IPv6 unless granted, IPv4-mapped IPv6 unless the IPv4 pair is
//! granted, failed lookups) is refused, which the kernel reports to the
//! caller as `EPERM`.
//!
//! Unix-socket path policy (`unix.rs`): `unix_connect` / `unix_sendmsg`
//! (`BPF_CGROUP_UNIX_CONNECT` / `BPF_CGROUP_UNIX_SENDMSG`, Linux >= 6.7).
//!
//! Event capture (`capture.rs`), filtered to the sandbox cgroup:
//! `sched_process_exec` / `sched_process_fork` / `sched_process_exit`
//! (`tp_btf`, Linux >= 5.5); `sys_enter` / `sys_exit` (`tp_btf` as well,
//! `syscalls.rs`); the file behind the descriptor of an inode-flag ioctl
//! is read from the kernel at its exit (`fdpath.rs`).
//!
//! Every record goes to the `EVENTS` ring buffer (Linux >= 5.8); failed
//! reservations are counted per effect kind in the per-CPU `EVENTS_LOST`
//! map because the kernel keeps no drop counter for ring buffers.
//!
//! `probe_*` programs are never attached: the supervisor loads them to find
//! out which program types the host accepts (`tartaros doctor`).
#![cfg_attr(target_arch = "bpf", no_std)]
// `core::intrinsics::atomic_xadd` for the per-user slot counters
// (slots.rs): the target has no `AtomicI64::fetch_add`.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod argmem;
#[cfg(target_arch = "bpf")]
mod capture;
#[cfg(target_arch = "bpf")]
mod classify;
#[cfg(target_arch = "bpf")]
mod fdpath;
#[cfg(target_arch = "bpf")]
mod filter;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod probes;
#[cfg(target_arch = "bpf")]
mod slots;
#[cfg(target_arch = "bpf")]
mod sockops;
#[cfg(target_arch = "bpf")]
mod syscalls;
#[cfg(target_arch = "bpf")]
mod sysemit;
#[cfg(target_arch = "bpf")]
mod task_storage;
#[cfg(target_arch = "bpf")]
mod unix;

/// GPL-compatible licence: needed by the tracing programs (tp_btf, LSM and
/// fentry only load with a GPL-compatible licence) and by GPL-only helpers
/// such as bpf_probe_read_*.
#[cfg(target_arch = "bpf")]
#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
