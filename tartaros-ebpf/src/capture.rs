//! Event capture for the effect log, filtered to the sandbox cgroup:
//! - `sched_process_exec` / `sched_process_fork` / `sched_process_exit`
//!   (`BPF_PROG_TYPE_TRACING`, `tp_btf`, Linux 5.5);
//!
//! The syscalls are in `syscalls.rs`.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use tartaros_common::capture::{
    ARGV_BYTES, ExecEvent, ExitEvent, ForkEvent, PATH_BYTES, effect, flag, record,
};

use crate::maps::{captured_run_of, fill_header, read_kernel, wake_flags};

// ---- processes ---------------------------------------------------------------

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sched_process_exec(&ctx);
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct
/// linux_binprm *bprm)`, called in the new image with the new credentials.
fn try_sched_process_exec(ctx: &BtfTracePointContext) -> Option<()> {
    let run = captured_run_of(ctx)?;
    let cfg = run.cfg;
    let bprm: u64 = ctx.arg(2);
    let (ring, mut entry) = run.reserve::<ExecEvent>(effect::EXEC)?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record; every helper below is given a
    // destination inside it of the size it is told.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::EXEC, effect::EXEC);
        // The thread that called exec (`old_pid`): `de_thread` has made a
        // non-leader the leader by now, and the kernel's exec opens were
        // queued under its own tid, which only this record can name.
        (*ev).header.pid = ctx.arg::<u64>(1) as u32;
        let mut flags = (*ev).header.flags;

        let filename: u64 = read_kernel(bprm + cfg.bprm_filename as u64).unwrap_or(0);
        let n = generated::bpf_probe_read_kernel_str(
            (&raw mut (*ev).filename).cast::<c_void>(),
            PATH_BYTES as u32,
            filename as *const c_void,
        ) as i32;
        (*ev).filename_len = n;
        if n <= 0 {
            flags |= flag::PATH_UNREADABLE;
        } else if n as usize == PATH_BYTES
            && read_kernel::<u8>(filename + PATH_BYTES as u64 - 1).unwrap_or(1) != 0
        {
            flags |= flag::PATH_TRUNCATED;
        }
        (*ev).argc = read_kernel::<u32>(bprm + cfg.bprm_argc as u64).unwrap_or(0);

        // The argument strings of the new image, up to `arg_end` only:
        // the environment follows them and must never be read.
        let task = generated::bpf_get_current_task();
        let mm: u64 = read_kernel(task + cfg.task_mm as u64).unwrap_or(0);
        let start: u64 = read_kernel(mm + cfg.mm_arg_start as u64).unwrap_or(0);
        let end: u64 = read_kernel(mm + cfg.mm_arg_end as u64).unwrap_or(0);
        let size = end.saturating_sub(start);
        (*ev).args_size = size as u32;
        let want: u32 = if size > ARGV_BYTES as u64 {
            flags |= flag::ARGV_TRUNCATED;
            ARGV_BYTES as u32
        } else {
            size as u32
        };
        let r = generated::bpf_probe_read_user(
            (&raw mut (*ev).args).cast::<c_void>(),
            want,
            start as *const c_void,
        );
        if r < 0 || mm == 0 {
            flags |= flag::ARGV_UNREADABLE;
            (*ev).args_len = if r < 0 { r as i32 } else { -14 };
        } else {
            (*ev).args_len = want as i32;
        }
        (*ev).header.flags = flags;
        crate::fdpath::fill_exec(&raw mut (*ev).file, bprm);
    }
    entry.submit(wake_flags(&ring, cfg, size_of::<ExecEvent>()));
    Some(())
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sched_process_fork(&ctx);
    0
}

/// `sched_process_fork(struct task_struct *parent, struct task_struct
/// *child)`, run by the parent. Threads (child pid != child tgid) are not
/// processes and are skipped.
fn try_sched_process_fork(ctx: &BtfTracePointContext) -> Option<()> {
    let run = captured_run_of(ctx)?;
    let cfg = run.cfg;
    let child: u64 = ctx.arg(1);
    let pid: u32 = read_kernel(child + cfg.task_pid as u64)?;
    let tgid: u32 = read_kernel(child + cfg.task_tgid as u64)?;
    if pid != tgid {
        return None;
    }
    // A `CLONE_FS` child shares its parent's `fs_struct`: user space moves
    // both modelled cwds on a chdir of either.
    let shares_fs = cfg.task_fs != 0 && {
        let parent: u64 = ctx.arg(0);
        let theirs: u64 = read_kernel(parent + cfg.task_fs as u64).unwrap_or(0);
        let ours: u64 = read_kernel(child + cfg.task_fs as u64).unwrap_or(1);
        theirs == ours
    };
    let (ring, mut entry) = run.reserve::<ForkEvent>(effect::FORK)?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::FORK, effect::FORK);
        if shares_fs {
            (*ev).header.flags |= flag::FS_SHARED;
        }
        (*ev).child = tgid;
        (*ev)._pad = 0;
        // A forking thread with a cwd of its own (round 25b) gives the
        // child a cwd the per-process model may not hold. Last: a value
        // the verifier tracks apart (0 or the bit) doubles what it walks
        // after it.
        (*ev).header.flags |= crate::fdpath::fs_facts(i32::from(shares_fs)) & flag::FS_SPLIT;
    }
    entry.submit(wake_flags(&ring, cfg, size_of::<ForkEvent>()));
    Some(())
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sched_process_exit(&ctx);
    0
}

/// `sched_process_exit(struct task_struct *p[, bool group_dead])`, run by
/// the exiting thread. Reported once per process: when the last thread
/// exits (`group_dead`, in recent kernels), or, without that argument, when the
/// thread-group leader exits.
fn try_sched_process_exit(ctx: &BtfTracePointContext) -> Option<()> {
    let run = captured_run_of(ctx)?;
    let cfg = run.cfg;
    if cfg.exit_group_dead != 0 {
        let group_dead: u64 = ctx.arg(1);
        if group_dead & 0xff == 0 {
            return None;
        }
    } else {
        let pid_tgid = bpf_get_current_pid_tgid();
        if pid_tgid as u32 != (pid_tgid >> 32) as u32 {
            return None;
        }
    }
    // SAFETY: helper without arguments; used as an address only.
    let task = unsafe { generated::bpf_get_current_task() };
    let status: u32 = read_kernel(task + cfg.task_exit_code as u64).unwrap_or(0);
    let (ring, mut entry) = run.reserve::<ExitEvent>(effect::EXIT)?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::EXIT, effect::EXIT);
        (*ev).status = status;
        (*ev)._pad = 0;
    }
    entry.submit(wake_flags(&ring, cfg, size_of::<ExitEvent>()));
    Some(())
}
