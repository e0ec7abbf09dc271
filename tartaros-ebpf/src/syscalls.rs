//! Syscall capture, filtered to the sandbox cgroup, in two halves:
//! - `sys_enter` (`tp_btf`, Linux 5.5) decides whether the call is
//!   recorded and reads its pointer arguments (paths, socket address,
//!   `struct open_how`, `struct msghdr`, xattr name) from the caller's
//!   memory *once*, into a per-task entry of `PENDING`;
//! - `sys_exit` (`tp_btf`) adds the kernel's return value, the verdict,
//!   and writes the record. It does not read the caller's memory again: a
//!   second thread that rewrites a buffer while the call blocks changes
//!   nothing in the record. (One exception: a name unreadable at entry of
//!   a call that failed, below.)
//!
//! Both run for every syscall of every task on the host, so the cheapest
//! test comes first: the syscall number, then the cgroup. A call the
//! seccomp filter refuses never reaches `sys_enter` (seccomp runs first),
//! but does reach `sys_exit` with the filter's errno: the refused-only
//! syscalls (`nr::is_refused`) are recorded there from their registers.
//!
//! A path read at entry can fail on a page not yet faulted in (the kernel
//! would fault it in). When the call then fails (a refusal), the kernel's
//! copy has faulted the page in, and `sys_exit` reads the name once
//! (`PATH_READ_AFTER`): a refused read of a literal on an untouched
//! `.rodata` page named nothing, and made the log `incomplete` (round 20).
//! Read after the call or before it, a refused call's name is the agent's
//! claim either way: another thread can rewrite it in both windows. A call
//! that succeeded keeps the path unreadable: the kernel's own path of a
//! successful effect comes from elsewhere (docs/ebpf.md).

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated,
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use tartaros_common::capture::{
    ADDR_BYTES, AT_FDCWD, PATH_BYTES, RunConfig, SYSCALL_KINDS, X32_SYSCALL_BIT, call_shape,
    effect, flag, ioctl, nr, record, refused_sometimes,
};

use crate::argmem;
use crate::classify::classify;
use crate::maps::{captured_run_of, count_lost, read_kernel};
use crate::sysemit::emit;
use crate::task_storage::TaskStorage;

/// x86 `TS_COMPAT`: the current syscall came through the 32-bit entry.
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

/// When `sys_exit` writes the record ([`Call::when`]); one definition with
/// the descriptor table's.
use call_shape::when;

/// What to record for one syscall. 64 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Call {
    pub(crate) effect: u16,
    pub(crate) record: u16,
    pub(crate) fd: i32,
    pub(crate) fd2: i32,
    pub(crate) flags: u32,
    /// User pointer of the (first) path or of the socket address.
    pub(crate) ptr: u64,
    /// User pointer of the second string.
    pub(crate) ptr2: u64,
    /// Address length (`SYS_ADDR`).
    pub(crate) len: u32,
    /// One of [`when`].
    pub(crate) when: u32,
    pub(crate) args: [u64; 3],
}

const _: () = assert!(size_of::<Call>() == 64);

/// A call between `sys_enter` and `sys_exit`: the decision and what was
/// read at entry. The socket address of a `SYS_ADDR` call is in `path`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) call: Call,
    nr: u64,
    pub(crate) len: i32,
    pub(crate) len2: i32,
    /// The `struct file *` at the call's descriptor when it started, for
    /// a call that may act on it (`SYS_FILE`, `BY_FD`): compared with the
    /// one at exit, never written to a record.
    pub(crate) file: u64,
    pub(crate) path: [u8; PATH_BYTES],
    pub(crate) path2: [u8; PATH_BYTES],
}

const _: () = assert!(size_of::<Pending>() == 600);
const _: () = assert!(ADDR_BYTES <= PATH_BYTES);

/// `sys_exit` builds the entry of a call `sys_enter` did not note (a
/// refused one) here: too big for the stack. The kernel never runs one
/// program twice at once on a CPU (it skips and counts the second run).
#[map(name = "SYS_CALL")]
static SYS_CALL: PerCpuArray<Pending> = PerCpuArray::with_max_entries(1, 0);
const EXIT_SLOT: u32 = 0;

/// `nr` of an entry whose call has been written or dropped.
const DONE: u64 = u64::MAX;

/// `call_shape::TABLE`: each syscall number's effect kind and descriptor,
/// in the frozen `.rodata`. Read at an index the verifier does not know,
/// an entry is one unknown value for it instead of a constant per
/// `classify` arm: it walks half as many instructions.
#[unsafe(no_mangle)]
static SYSCALL_TABLE: [u32; SYSCALL_KINDS as usize] = call_shape::TABLE;

/// The table's entry of `n`; 0 (no kind, decided in code) past its end.
#[inline(always)]
pub(crate) fn table_entry(n: u64) -> u32 {
    if n >= SYSCALL_KINDS as u64 {
        return 0;
    }
    // SAFETY: `n` is below the array's length; a volatile read, so that
    // the compiler cannot fold the table into the code.
    unsafe { core::ptr::read_volatile((&raw const SYSCALL_TABLE).cast::<u32>().add(n as usize)) }
}

/// The call in flight of each task (`task_storage.rs`): `sys_enter`
/// writes it in place, `sys_exit` reads it and marks it [`DONE`]. Also
/// breaks the verifier's tracking of `classify`'s constants: loaded back
/// from a map value, they are unknown to it, and what follows is walked
/// once per record type instead of once per `classify` arm. An entry that
/// cannot be made is a loss, counted.
#[map(name = "PENDING")]
static PENDING: TaskStorage<Pending> = TaskStorage::new();

impl Call {
    #[inline(always)]
    pub(crate) const fn new(effect: u16, record: u16) -> Self {
        Self {
            effect,
            record,
            ptr: 0,
            fd: AT_FDCWD,
            ptr2: 0,
            fd2: AT_FDCWD,
            len: 0,
            when: when::ALWAYS,
            args: [0; 3],
            flags: 0,
        }
    }

    #[inline(always)]
    pub(crate) const fn path(effect: u16, fd: i32, ptr: u64, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS_PATH);
        c.fd = fd;
        c.ptr = ptr;
        c.args = args;
        c
    }

    #[inline(always)]
    pub(crate) const fn plain(effect: u16, fd: i32, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS);
        c.fd = fd;
        c.args = args;
        c
    }

    #[inline(always)]
    pub(crate) const fn addr(effect: u16, fd: i32, ptr: u64, len: u64, args: [u64; 3]) -> Self {
        let mut c = Self::new(effect, record::SYS_ADDR);
        c.fd = fd;
        c.ptr = ptr;
        c.len = if len > u32::MAX as u64 {
            u32::MAX
        } else {
            len as u32
        };
        c.args = args;
        c
    }

    #[inline(always)]
    pub(crate) const fn only(mut self, when: u32) -> Self {
        self.when = when;
        self
    }
}

/// Word `index` of the tracepoint's `struct pt_regs`.
#[inline(always)]
fn reg(regs: *const u64, index: usize) -> u64 {
    // SAFETY: `regs` is the tracepoint's `struct pt_regs *` (a BTF pointer)
    // and `index` one of its `unsigned long` members; the verifier checks
    // the offset against the type and makes the load fault-safe.
    unsafe { core::ptr::read_volatile(regs.add(index)) }
}

/// The syscall number as the kernel runs it: `entry_SYSCALL_64` passes
/// the low 32 bits of `rax` on (`movslq %eax`) and seccomp sees only
/// those, but `orig_ax` keeps the whole register. Compared whole, a call
/// made with bit 32 set (`0x1_0000_0101` runs `openat`) matched nothing
/// in the table and was never recorded.
#[inline(always)]
fn syscall_number(regs: *const u64) -> u64 {
    reg(regs, REGS_ORIG_AX) & u64::from(u32::MAX)
}

/// The six arguments: di, si, dx, r10, r8, r9.
#[inline(always)]
fn args_of(regs: *const u64) -> [u64; 6] {
    [
        reg(regs, REGS_DI),
        reg(regs, REGS_DI - 1),
        reg(regs, REGS_DI - 2),
        reg(regs, REGS_R10),
        reg(regs, REGS_R10 + 2),
        reg(regs, REGS_R10 + 1),
    ]
}

/// Whether the current syscall came through the 32-bit entry: its number
/// and registers mean something else (the seccomp filter refuses them).
#[inline(always)]
fn compat(cfg: &RunConfig) -> bool {
    if cfg.task_ti_status == u32::MAX {
        return false;
    }
    // SAFETY: helper without arguments; used as an address only.
    let task = unsafe { generated::bpf_get_current_task() };
    let status: u32 = read_kernel(task + cfg.task_ti_status as u64).unwrap_or(0);
    status & TS_COMPAT != 0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sys_enter(&ctx);
    0
}

/// `sys_enter(struct pt_regs *regs, long id)`.
fn try_sys_enter(ctx: &BtfTracePointContext) -> Option<()> {
    let regs: *const u64 = ctx.arg(0);
    let id: u64 = ctx.arg(1);
    if !nr::is_captured(id) {
        return None;
    }
    let run = captured_run_of(ctx)?;
    let cfg = run.cfg;
    if compat(cfg) {
        return None;
    }
    // Read again rather than reused: the verifier has narrowed the first
    // value to one of the captured ranges, and would walk everything below
    // once per range.
    let number = syscall_number(regs);
    let call = classify(number, args_of(regs))?;
    if call.effect == effect::OTHER {
        // A captured number without a kind: the table and `nr::is_captured`
        // disagree (a test of `call_shape` forbids it). Counted, so the
        // log says it is incomplete.
        count_lost(run.id, effect::OTHER);
        return None;
    }
    let Some(slot) = PENDING.get_or_create() else {
        // No entry for this task (no memory): the loss is counted.
        count_lost(run.id, call.effect);
        return None;
    };
    // SAFETY: the current task's own entry, which only this task's
    // programs use, one at a time. Every helper gets a destination inside
    // the entry of the size it is told.
    unsafe {
        (*slot).call = call;
        (*slot).nr = number;
        (*slot).len = 0;
        (*slot).len2 = 0;
        // Volatile: the compiler must not hand the code below the
        // constants it has just stored (see `PENDING`).
        let c = core::ptr::read_volatile(&raw const (*slot).call);
        (*slot).file = 0;
        if c.record == record::SYS_FILE || c.flags & flag::BY_FD != 0 {
            // The file before the kernel looks the fd up; `sys_exit`
            // names the one there then, and says when they differ.
            let (file, shared) = crate::fdpath::note(c.fd);
            (*slot).file = file;
            if shared {
                (*slot).call.flags |= flag::FD_SHARED;
            }
        }
        match c.record {
            record::SYS_PATH | record::SYS_PATH2 => {
                // Every path-named call, `chdir` among them: the cwd model
                // (`decode_cwd.rs`) moves by these at a `chdir`, and
                // doubts any relative name of a split process. First in
                // the arm: after `read_path`'s outcomes the verifier
                // walked it once per outcome.
                (*slot).call.flags |= crate::fdpath::fs_facts(0);
                let (n, f) = read_path(
                    &raw mut (*slot).path,
                    c.ptr,
                    flag::PATH_UNREADABLE,
                    flag::PATH_TRUNCATED,
                );
                (*slot).len = n;
                (*slot).call.flags |= f;
                let mut shared = crate::fdpath::memory_shared() || !argmem::private(c.ptr, n);
                if c.record == record::SYS_PATH2 {
                    let (n2, f2) = read_path(
                        &raw mut (*slot).path2,
                        c.ptr2,
                        flag::PATH2_UNREADABLE,
                        flag::PATH2_TRUNCATED,
                    );
                    (*slot).len2 = n2;
                    (*slot).call.flags |= f2;
                    shared = shared || !argmem::private(c.ptr2, n2);
                }
                if shared {
                    (*slot).call.flags |= flag::NAME_SHARED;
                }
            }
            record::SYS_ADDR => {
                let mut flags = 0;
                // A unix `bind`'s name creates a file, as a path-named
                // call's does: the join needs to know whether another task
                // could rewrite it before the kernel copied it (round 18),
                // or another process (round 23: a `MAP_SHARED` page).
                if crate::fdpath::memory_shared() || !argmem::private(c.ptr, c.len as i32) {
                    flags |= flag::NAME_SHARED;
                }
                let want: u32 = if c.len > ADDR_BYTES as u32 {
                    flags |= flag::ADDR_TRUNCATED;
                    ADDR_BYTES as u32
                } else {
                    c.len
                };
                let r = generated::bpf_probe_read_user(
                    (&raw mut (*slot).path).cast::<c_void>(),
                    want,
                    c.ptr as *const c_void,
                );
                if r < 0 || c.ptr == 0 {
                    flags |= flag::ADDR_UNREADABLE;
                    (*slot).len = if r < 0 { r as i32 } else { -14 };
                } else {
                    (*slot).len = want as i32;
                }
                (*slot).call.flags |= flags;
            }
            _ => {}
        }
    }
    Some(())
}

#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
}

/// `sys_exit(struct pt_regs *regs, long ret)`.
fn try_sys_exit(ctx: &BtfTracePointContext) -> Option<()> {
    let regs: *const u64 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    let captured = nr::is_captured(syscall_number(regs));
    // The seccomp filter refuses every call of another ABI with EPERM
    // (docs/seccomp.md); their numbers are of other tables, so they are
    // recorded as attempts of their ABI. EPERM is tested first: cheap, and
    // rare on the host.
    if !captured && ret != -EPERM {
        return None;
    }
    let run = captured_run_of(ctx)?;
    let cfg = run.cfg;
    let number = syscall_number(regs);
    // One `emit` for every case below: inlined twice, it doubled the
    // verifier's work on this program.
    let noted = if captured { PENDING.get() } else { None };
    let (p, pending) = match noted.filter(|p| unsafe { (**p).nr != DONE }) {
        // SAFETY: the entry of this task; only this task's programs use
        // it, one at a time, and the kernel frees it only with the task.
        Some(p) => unsafe {
            if (*p).nr != number || !wanted((*p).call.when, ret) {
                (*p).nr = DONE;
                return None;
            }
            if ret < 0 && (*p).call.flags & flag::PATH_UNREADABLE != 0 {
                // Without `read_path`'s test of the byte at the limit (230
                // more instructions to verify): a full buffer counts as cut.
                let n = generated::bpf_probe_read_user_str(
                    (&raw mut (*p).path).cast::<c_void>(),
                    PATH_BYTES as u32,
                    (*p).call.ptr as *const c_void,
                ) as i32;
                if n > 0 {
                    let cut = if n as usize >= PATH_BYTES {
                        flag::PATH_TRUNCATED
                    } else {
                        0
                    };
                    (*p).len = n;
                    (*p).call.flags =
                        ((*p).call.flags & !flag::PATH_UNREADABLE) | cut | flag::PATH_READ_AFTER;
                }
            }
            if (*p).call.effect == effect::XATTR && (*p).call.flags & flag::PATH2_UNREADABLE != 0 {
                // An attribute's name (at most 255 bytes: never cut) on a
                // page the kernel's copy has faulted in since (round 23).
                let n = generated::bpf_probe_read_user_str(
                    (&raw mut (*p).path2).cast::<c_void>(),
                    PATH_BYTES as u32,
                    (*p).call.ptr2 as *const c_void,
                ) as i32;
                if n > 0 {
                    (*p).len2 = n;
                    (*p).call.flags =
                        ((*p).call.flags & !flag::PATH2_UNREADABLE) | flag::NAME_READ_AFTER;
                }
            }
            (p as *const Pending, true)
        },
        // No entry: the call was refused by seccomp before `sys_enter`, or
        // `sys_enter` chose not to record it (or counted it lost), or it is
        // of another ABI.
        None => {
            let a = args_of(regs);
            let abi = if ret != -EPERM {
                0
            } else if compat(cfg) {
                flag::ABI_IA32
            } else if number & X32_SYSCALL_BIT != 0 {
                flag::ABI_X32
            } else {
                0
            };
            // Refused whatever the arguments (told by their kind: a lookup
            // the verifier walks once, where the comparison chain of
            // `nr::is_refused` was walked on every path here), or the
            // ioctls the filter refuses (input injection, generations), or an
            // EPERM of a call the filter refuses for some arguments (the
            // decoder keeps those its rules refuse: a namespace, a raw
            // socket).
            let refused = (captured
                && (call_shape::kind_of(table_entry(number)) == effect::SYSCALL
                    || (number == u64::from(nr::IOCTL) && ret == -EPERM && ioctl::refused(a[1]))))
                || (ret == -EPERM && refused_sometimes::contains(number as u32));
            if abi == 0 && (!refused || compat(cfg)) {
                return None;
            }
            // Another ABI's registers mean other arguments: none are kept.
            // openat's mode and fadvise64's advice, the arguments the
            // filter tests, are their fourth: they take the second's place
            // (a path pointer, an offset), which no record reads.
            let args = if abi != 0 {
                [0; 3]
            } else if number == u64::from(nr::OPENAT)
                || number == u64::from(refused_sometimes::FADVISE64)
            {
                [a[0], a[2], a[3]]
            } else {
                [a[0], a[1], a[2]]
            };
            let slot = SYS_CALL.get_ptr_mut(EXIT_SLOT)?;
            // SAFETY: as in `try_sys_enter`.
            // Field by field, only what `emit` reads of a plain record: a
            // whole `Call` is a `memset` call, a byte loop for the verifier.
            unsafe {
                let call = &raw mut (*slot).call;
                core::ptr::write_volatile(&raw mut (*call).effect, effect::SYSCALL);
                core::ptr::write_volatile(&raw mut (*call).record, record::SYS);
                core::ptr::write_volatile(&raw mut (*call).fd, -1);
                core::ptr::write_volatile(&raw mut (*call).fd2, AT_FDCWD);
                core::ptr::write_volatile(&raw mut (*call).flags, abi);
                for (i, arg) in args.into_iter().enumerate() {
                    core::ptr::write_volatile(&raw mut (*call).args[i], arg);
                }
                (*slot).nr = number;
                (*slot).len = 0;
                (*slot).len2 = 0;
            }
            (slot as *const Pending, false)
        }
    };
    // Numbers beyond 32 bits (-1, bogus ones) keep their low half.
    emit(&run, p, number as u32, ret);
    if pending {
        // SAFETY: as above; `p` is this task's entry.
        unsafe { (*(p as *mut Pending)).nr = DONE };
    }
    Some(())
}

#[inline(always)]
fn wanted(when: u32, ret: i64) -> bool {
    match when {
        when::REFUSED => ret == -EACCES || ret == -EPERM,
        when::FAILED => ret < 0,
        when::OK => ret == 0,
        _ => true,
    }
}

#[inline(always)]
pub(crate) fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

/// Reads the user string at `src` into `dst` (PATH_BYTES); returns the
/// helper's result and the flags to set (`unreadable`, `truncated`). A
/// NULL pointer (fd-based xattr calls) is an empty string, not an error.
#[inline(always)]
fn read_path(dst: *mut [u8; PATH_BYTES], src: u64, unreadable: u32, truncated: u32) -> (i32, u32) {
    if src == 0 {
        return (0, 0);
    }
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
