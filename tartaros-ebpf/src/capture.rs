//! Event capture for the effect log, filtered to the sandbox cgroup:
//! - `sched_process_exec` / `sched_process_fork` / `sched_process_exit`
//!   (`BPF_PROG_TYPE_TRACING`, `tp_btf`, Linux 5.5);
//! - `sys_exit` (`BPF_PROG_TYPE_TRACING`, `tp_btf`, Linux 5.5): file,
//!   network and signal syscalls with the kernel's return value as the
//!   verdict. As `tp_btf` its `struct pt_regs *` is a BTF pointer, read with
//!   plain (fault-checked) loads instead of a `bpf_probe_read_kernel` call:
//!   this program runs for every syscall on the host.
//!
//! The syscall arguments are read at syscall *exit* from the saved user
//! registers (`struct pt_regs`), which the kernel leaves untouched for the
//! calls captured here (only the return value in `ax` changes), so no
//! enter/exit pairing map is needed: no per-task state, no stale entries,
//! no losses from a full pairing map. Paths are read from the caller's
//! memory after the kernel has read them itself, so the pages are resident
//! (a read at entry fails on pages not yet faulted in). Like any read of
//! the agent's memory, the result is what the agent asked for, not what
//! the kernel resolved: another thread may change it meanwhile.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use tartaros_common::capture::{
    ADDR_BYTES, ARGV_BYTES, AT_FDCWD, AT_REMOVEDIR, CaptureConfig, ExecEvent, ExitEvent, ForkEvent,
    PATH_BYTES, SysAddrEvent, SysEvent, SysPath2Event, SysPathEvent, effect, flag, nr, oflag,
    record,
};

use crate::maps::{EVENTS, config, count_lost, fill_header, in_sandbox, read_kernel, wake_flags};

/// x86 `TS_COMPAT`: the current syscall came through the 32-bit entry
/// (cleared on the return to user mode, after `sys_exit`).
const TS_COMPAT: u32 = 0x0002;
/// Word index of `r10` in x86_64 `struct pt_regs`: the registers r10, r9,
/// r8, ax, cx, dx, si, di, orig_ax are the words 7 to 15, the syscall
/// number and all six arguments.
const REGS_R10: usize = 7;
/// Word index of `di` (then `si`, `dx` below it).
const REGS_DI: usize = 14;
/// Word index of `orig_ax` (the syscall number).
const REGS_ORIG_AX: usize = 15;
const EACCES: i64 = 13;
const EPERM: i64 = 1;

// ---- processes ---------------------------------------------------------------

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sched_process_exec(&ctx);
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct
/// linux_binprm *bprm)`, called in the new image with the new credentials.
fn try_sched_process_exec(ctx: &BtfTracePointContext) -> Option<()> {
    let cfg = config()?;
    if !in_sandbox(cfg) {
        return None;
    }
    let bprm: u64 = ctx.arg(2);
    let Some(mut entry) = EVENTS.reserve::<ExecEvent>(0) else {
        count_lost(effect::EXEC);
        return None;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record; every helper below is given a
    // destination inside it of the size it is told.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::EXEC, effect::EXEC);
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
    }
    entry.submit(wake_flags(cfg, size_of::<ExecEvent>()));
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
    let cfg = config()?;
    if !in_sandbox(cfg) {
        return None;
    }
    let child: u64 = ctx.arg(1);
    let pid: u32 = read_kernel(child + cfg.task_pid as u64)?;
    let tgid: u32 = read_kernel(child + cfg.task_tgid as u64)?;
    if pid != tgid {
        return None;
    }
    let Some(mut entry) = EVENTS.reserve::<ForkEvent>(0) else {
        count_lost(effect::FORK);
        return None;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::FORK, effect::FORK);
        (*ev).child = tgid;
        (*ev)._pad = 0;
    }
    entry.submit(wake_flags(cfg, size_of::<ForkEvent>()));
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
    let cfg = config()?;
    if !in_sandbox(cfg) {
        return None;
    }
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
    let Some(mut entry) = EVENTS.reserve::<ExitEvent>(0) else {
        count_lost(effect::EXIT);
        return None;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record.
    unsafe {
        fill_header(&raw mut (*ev).header, cfg, record::EXIT, effect::EXIT);
        (*ev).status = status;
        (*ev)._pad = 0;
    }
    entry.submit(wake_flags(cfg, size_of::<ExitEvent>()));
    Some(())
}

// ---- syscalls ----------------------------------------------------------------

/// What to record for one syscall. 64 bytes, no padding (the value of
/// [`SYS_CALL`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct Call {
    effect: u16,
    record: u16,
    fd: i32,
    fd2: i32,
    flags: u32,
    /// User pointer of the (first) path or of the socket address.
    ptr: u64,
    /// User pointer of the second path.
    ptr2: u64,
    /// Address length (`SYS_ADDR`).
    len: u64,
    args: [u64; 3],
}

const _: () = assert!(size_of::<Call>() == 64);

/// `sys_exit`'s decision, handed from `classify` to `emit` through memory.
/// Each `classify` arm makes a `Call` of different constants, and the
/// verifier tracks exactly the ones that matter below: the record type
/// (it picks the reservation size), the effect kind (an index into
/// `EVENTS_LOST`), the address length (a helper's size). Carried in
/// registers, those constants are marked precise back into every arm, so no
/// two arms' states are alike at the join and the verifier walked `emit`
/// once per arm (4,500 instructions, 5 ms). A value loaded from a map is
/// unknown to it: `emit` is now walked once per record type for all arms.
#[map(name = "SYS_CALL")]
static SYS_CALL: PerCpuArray<Call> = PerCpuArray::with_max_entries(1, 0);

impl Call {
    #[inline(always)]
    const fn new(effect: u16, record: u16) -> Self {
        Self {
            effect,
            record,
            ptr: 0,
            fd: AT_FDCWD,
            ptr2: 0,
            fd2: AT_FDCWD,
            len: 0,
            args: [0; 3],
            flags: 0,
        }
    }

    #[inline(always)]
    const fn path(effect: u16, fd: i32, ptr: u64, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS_PATH);
        c.fd = fd;
        c.ptr = ptr;
        c.args = args;
        c
    }

    #[inline(always)]
    const fn path2(effect: u16, fd: i32, ptr: u64, fd2: i32, ptr2: u64, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS_PATH2);
        c.fd = fd;
        c.ptr = ptr;
        c.fd2 = fd2;
        c.ptr2 = ptr2;
        c.args = args;
        c
    }

    #[inline(always)]
    const fn plain(effect: u16, fd: i32, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS);
        c.fd = fd;
        c.args = args;
        c
    }

    #[inline(always)]
    const fn addr(effect: u16, fd: i32, ptr: u64, len: u64, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS_ADDR);
        c.fd = fd;
        c.ptr = ptr;
        c.len = len;
        c.args = args;
        c
    }
}

#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
}

/// Word `index` of the tracepoint's `struct pt_regs`.
#[inline(always)]
fn reg(regs: *const u64, index: usize) -> u64 {
    // SAFETY: `regs` is the tracepoint's `struct pt_regs *` (a BTF pointer)
    // and `index` one of its `unsigned long` members; the verifier checks
    // the offset against the type and makes the load fault-safe.
    unsafe { core::ptr::read_volatile(regs.add(index)) }
}

/// `sys_exit(struct pt_regs *regs, long ret)`: runs for every syscall of
/// every task on the host, so the cheapest test comes first: the syscall
/// number, then the cgroup.
fn try_sys_exit(ctx: &BtfTracePointContext) -> Option<()> {
    let regs: *const u64 = ctx.arg(0);
    let number = reg(regs, REGS_ORIG_AX);
    if !nr::is_captured(number) {
        return None;
    }
    let cfg = config()?;
    if !in_sandbox(cfg) {
        return None;
    }
    // Read again rather than reused: the verifier has narrowed the first
    // value to one of the captured ranges, and would walk everything below
    // once per range.
    let number = reg(regs, REGS_ORIG_AX);
    let ret: i64 = ctx.arg(1);
    // The arguments are in di, si, dx, r10, r8, r9.
    let args = [
        reg(regs, REGS_DI),
        reg(regs, REGS_DI - 1),
        reg(regs, REGS_DI - 2),
        reg(regs, REGS_R10),
        reg(regs, REGS_R10 + 2),
        reg(regs, REGS_R10 + 1),
    ];
    let call = classify(number, ret, args)?;
    if cfg.task_ti_status != u32::MAX {
        // SAFETY: helper without arguments; used as an address only.
        let task = unsafe { generated::bpf_get_current_task() };
        let status: u32 = read_kernel(task + cfg.task_ti_status as u64).unwrap_or(0);
        if status & TS_COMPAT != 0 {
            // A 32-bit syscall: its number and registers mean something
            // else (the seccomp filter refuses these calls anyway).
            return None;
        }
    }
    // Through this CPU's `SYS_CALL` slot (see there). The only entry of an
    // array map is always there.
    let slot = SYS_CALL.get_ptr_mut(0)?;
    // SAFETY: this CPU's entry of a per-CPU map only this program uses; the
    // tracepoint runs with preemption disabled and a program never nests on
    // one CPU. The volatile read keeps the compiler from handing `emit` the
    // values it has just stored.
    let call = unsafe {
        slot.write(call);
        slot.read_volatile()
    };
    emit(cfg, &call, number as u32, ret);
    Some(())
}

/// Decides whether syscall `nr` with arguments `a` and result `ret` is
/// recorded, and how. x86_64 numbering.
#[inline(always)]
fn classify(nr: u64, ret: i64, a: [u64; 6]) -> Option<Call> {
    if nr > u32::MAX as u64 {
        return None;
    }
    let fd = |v: u64| v as i32;
    let call = match nr as u32 {
        nr::OPEN => open_call(ret, AT_FDCWD, a[0], a[1], a[2])?,
        nr::OPENAT => open_call(ret, fd(a[0]), a[1], a[2], a[3])?,
        nr::CREAT => open_call(ret, AT_FDCWD, a[0], oflag::CREAT_FLAGS, a[1])?,
        nr::OPENAT2 => {
            // struct open_how { u64 flags; u64 mode; u64 resolve; }
            match read_user::<[u64; 2]>(a[2]) {
                Some(how) => open_call(ret, fd(a[0]), a[1], how[0], how[1])?,
                None => {
                    let mut c = Call::path(effect::OPEN, fd(a[0]), a[1], [0; 3]);
                    c.flags = flag::ADDR_UNREADABLE;
                    c
                }
            }
        }
        // A successful exec is reported by sched_process_exec (and its
        // registers belong to the new image by now); a refused one only
        // here, with the kernel's errno.
        nr::EXECVE if ret < 0 => Call::path(effect::EXEC, AT_FDCWD, a[0], [0; 3]),
        nr::EXECVEAT if ret < 0 => Call::path(effect::EXEC, fd(a[0]), a[1], [a[4], 0, 0]),
        nr::TRUNCATE => Call::path(effect::TRUNCATE, AT_FDCWD, a[0], [a[1], 0, 0]),
        nr::FTRUNCATE => Call::plain(effect::TRUNCATE, fd(a[0]), [a[1], 0, 0]),
        nr::UNLINK => Call::path(effect::UNLINK, AT_FDCWD, a[0], [0; 3]),
        nr::UNLINKAT => {
            let e = if a[2] & AT_REMOVEDIR != 0 {
                effect::RMDIR
            } else {
                effect::UNLINK
            };
            Call::path(e, fd(a[0]), a[1], [a[2], 0, 0])
        }
        nr::RMDIR => Call::path(effect::RMDIR, AT_FDCWD, a[0], [0; 3]),
        nr::MKDIR => Call::path(effect::MKDIR, AT_FDCWD, a[0], [a[1], 0, 0]),
        nr::MKDIRAT => Call::path(effect::MKDIR, fd(a[0]), a[1], [a[2], 0, 0]),
        nr::RENAME => Call::path2(effect::RENAME, AT_FDCWD, a[0], AT_FDCWD, a[1], [0; 3]),
        nr::RENAMEAT => Call::path2(effect::RENAME, fd(a[0]), a[1], fd(a[2]), a[3], [0; 3]),
        nr::RENAMEAT2 => Call::path2(effect::RENAME, fd(a[0]), a[1], fd(a[2]), a[3], [a[4], 0, 0]),
        nr::LINK => Call::path2(effect::LINK, AT_FDCWD, a[0], AT_FDCWD, a[1], [0; 3]),
        nr::LINKAT => Call::path2(effect::LINK, fd(a[0]), a[1], fd(a[2]), a[3], [a[4], 0, 0]),
        // The first string of a symlink is the link's contents, not a path
        // looked up now: user space does not resolve it.
        nr::SYMLINK => Call::path2(effect::SYMLINK, AT_FDCWD, a[0], AT_FDCWD, a[1], [0; 3]),
        nr::SYMLINKAT => Call::path2(effect::SYMLINK, AT_FDCWD, a[0], fd(a[1]), a[2], [0; 3]),
        nr::CHMOD => Call::path(effect::CHMOD, AT_FDCWD, a[0], [a[1], 0, 0]),
        nr::FCHMOD => Call::plain(effect::CHMOD, fd(a[0]), [a[1], 0, 0]),
        nr::FCHMODAT => Call::path(effect::CHMOD, fd(a[0]), a[1], [a[2], 0, 0]),
        nr::FCHMODAT2 => Call::path(effect::CHMOD, fd(a[0]), a[1], [a[2], a[3], 0]),
        nr::CHOWN | nr::LCHOWN => Call::path(effect::CHOWN, AT_FDCWD, a[0], [a[1], a[2], 0]),
        nr::FCHOWN => Call::plain(effect::CHOWN, fd(a[0]), [a[1], a[2], 0]),
        nr::FCHOWNAT => Call::path(effect::CHOWN, fd(a[0]), a[1], [a[2], a[3], a[4]]),
        nr::CONNECT => Call::addr(effect::CONNECT, fd(a[0]), a[1], a[2], [0; 3]),
        nr::SENDTO => {
            // Without a destination it is a send on a connected socket,
            // whose destination was recorded at connect.
            if a[4] == 0 {
                return None;
            }
            Call::addr(effect::SENDTO, fd(a[0]), a[4], a[5], [a[3], 0, 0])
        }
        nr::SENDMSG => {
            // struct msghdr { void *msg_name; int msg_namelen; ... }
            match read_user::<[u64; 2]>(a[1]) {
                Some(m) if m[0] == 0 => return None,
                Some(m) => Call::addr(
                    effect::SENDTO,
                    fd(a[0]),
                    m[0],
                    m[1] & 0xffff_ffff,
                    [a[2], 0, 0],
                ),
                None => {
                    let mut c = Call::addr(effect::SENDTO, fd(a[0]), 0, 0, [a[2], 0, 0]);
                    c.flags = flag::ADDR_UNREADABLE;
                    c
                }
            }
        }
        // Only successful ones change the cwd.
        nr::CHDIR if ret == 0 => Call::path(effect::CHDIR, AT_FDCWD, a[0], [0; 3]),
        nr::FCHDIR if ret == 0 => Call::plain(effect::CHDIR, fd(a[0]), [0; 3]),
        nr::KILL => Call::plain(effect::SIGNAL, -1, [a[0], a[1], 0]),
        nr::TKILL => Call::plain(effect::SIGNAL, -1, [a[0], a[1], 0]),
        nr::TGKILL => Call::plain(effect::SIGNAL, -1, [a[0], a[2], a[1]]),
        _ => return None,
    };
    Some(call)
}

/// Opens are recorded when they may write (write access, create, truncate,
/// tmpfile), and read-only opens only when they were refused (EACCES /
/// EPERM): the denied reads.
#[inline(always)]
fn open_call(ret: i64, fd: i32, path: u64, flags: u64, mode: u64) -> Option<Call> {
    let path_only = flags & oflag::O_PATH != 0;
    let access = flags & oflag::O_ACCMODE;
    let creates = flags & (oflag::O_CREAT | oflag::O_TMPFILE_BIT) != 0;
    let truncates = flags & oflag::O_TRUNC != 0;
    let writes = !path_only && (access != 0 || creates || truncates);
    if !writes && ret != -EACCES && ret != -EPERM {
        return None;
    }
    let e = if !writes {
        effect::OPEN
    } else if creates {
        effect::CREATE
    } else if truncates {
        effect::TRUNCATE
    } else {
        effect::OPEN
    };
    Some(Call::path(e, fd, path, [flags, mode, 0]))
}

#[inline(always)]
fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

/// Reads the user string at `src` into `dst` (PATH_BYTES); returns the
/// helper's result and the flags to set (`unreadable`, `truncated`).
#[inline(always)]
fn read_path(dst: *mut [u8; PATH_BYTES], src: u64, unreadable: u32, truncated: u32) -> (i32, u32) {
    // SAFETY: `dst` has PATH_BYTES bytes; the helper checks `src`.
    let n = unsafe {
        generated::bpf_probe_read_user_str(
            dst.cast::<c_void>(),
            PATH_BYTES as u32,
            src as *const c_void,
        )
    } as i32;
    if n <= 0 {
        return (n, unreadable);
    }
    // A full buffer is a truncation unless the byte at the limit is the
    // string's end.
    if n as usize == PATH_BYTES && read_user::<u8>(src + PATH_BYTES as u64 - 1).unwrap_or(1) != 0 {
        return (n, truncated);
    }
    (n, 0)
}

/// Fills the fixed part of a syscall record.
#[inline(always)]
fn fill_sys(s: *mut SysEvent, cfg: &CaptureConfig, call: &Call, nr: u32, ret: i64) {
    fill_header(
        // SAFETY: `s` points to a reserved record.
        unsafe { &raw mut (*s).header },
        cfg,
        call.record,
        call.effect,
    );
    // SAFETY: as above.
    unsafe {
        (*s).header.flags |= call.flags;
        (*s).nr = nr;
        (*s).fd = call.fd;
        (*s).fd2 = call.fd2;
        (*s).len = 0;
        (*s).len2 = 0;
        (*s)._pad = 0;
        (*s).ret = ret;
        (*s).args = call.args;
    }
}

#[inline(always)]
fn emit(cfg: &CaptureConfig, call: &Call, nr: u32, ret: i64) {
    match call.record {
        record::SYS_PATH => {
            let Some(mut entry) = EVENTS.reserve::<SysPathEvent>(0) else {
                return count_lost(call.effect);
            };
            let ev = entry.as_mut_ptr();
            // SAFETY: `ev` is the reserved record.
            unsafe {
                fill_sys(&raw mut (*ev).sys, cfg, call, nr, ret);
                let (n, f) = read_path(
                    &raw mut (*ev).path,
                    call.ptr,
                    flag::PATH_UNREADABLE,
                    flag::PATH_TRUNCATED,
                );
                (*ev).sys.len = n;
                (*ev).sys.header.flags |= f;
            }
            entry.submit(wake_flags(cfg, size_of::<SysPathEvent>()));
        }
        record::SYS_PATH2 => {
            let Some(mut entry) = EVENTS.reserve::<SysPath2Event>(0) else {
                return count_lost(call.effect);
            };
            let ev = entry.as_mut_ptr();
            // SAFETY: `ev` is the reserved record.
            unsafe {
                fill_sys(&raw mut (*ev).sys, cfg, call, nr, ret);
                let (n, f) = read_path(
                    &raw mut (*ev).path,
                    call.ptr,
                    flag::PATH_UNREADABLE,
                    flag::PATH_TRUNCATED,
                );
                let (n2, f2) = read_path(
                    &raw mut (*ev).path2,
                    call.ptr2,
                    flag::PATH2_UNREADABLE,
                    flag::PATH2_TRUNCATED,
                );
                (*ev).sys.len = n;
                (*ev).sys.len2 = n2;
                (*ev).sys.header.flags |= f | f2;
            }
            entry.submit(wake_flags(cfg, size_of::<SysPath2Event>()));
        }
        record::SYS_ADDR => {
            let Some(mut entry) = EVENTS.reserve::<SysAddrEvent>(0) else {
                return count_lost(call.effect);
            };
            let ev = entry.as_mut_ptr();
            let mut flags = 0;
            let want: u32 = if call.len > ADDR_BYTES as u64 {
                flags |= flag::ADDR_TRUNCATED;
                ADDR_BYTES as u32
            } else {
                call.len as u32
            };
            // SAFETY: `ev` is the reserved record; `want` <= ADDR_BYTES.
            unsafe {
                fill_sys(&raw mut (*ev).sys, cfg, call, nr, ret);
                let r = generated::bpf_probe_read_user(
                    (&raw mut (*ev).addr).cast::<c_void>(),
                    want,
                    call.ptr as *const c_void,
                );
                if r < 0 {
                    flags |= flag::ADDR_UNREADABLE;
                    (*ev).sys.len = r as i32;
                } else {
                    (*ev).sys.len = want as i32;
                }
                (*ev).sys.header.flags |= flags;
            }
            entry.submit(wake_flags(cfg, size_of::<SysAddrEvent>()));
        }
        _ => {
            let Some(mut entry) = EVENTS.reserve::<SysEvent>(0) else {
                return count_lost(call.effect);
            };
            fill_sys(entry.as_mut_ptr(), cfg, call, nr, ret);
            entry.submit(wake_flags(cfg, size_of::<SysEvent>()));
        }
    }
}
