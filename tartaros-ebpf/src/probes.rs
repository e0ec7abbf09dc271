//! Capability probes, loaded by `probe_program_types`, never attached.

use aya_ebpf::{
    macros::{btf_tracepoint, cgroup_sock, cgroup_sock_addr, fentry, lsm, raw_tracepoint},
    programs::{
        BtfTracePointContext, FEntryContext, LsmContext, RawTracePointContext, SockAddrContext,
        SockContext,
    },
};

#[cgroup_sock_addr(connect4)]
pub fn probe_sock_addr(_ctx: SockAddrContext) -> i32 {
    1
}

#[cgroup_sock(sock_create)]
pub fn probe_sock(_ctx: SockContext) -> i32 {
    1
}

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
