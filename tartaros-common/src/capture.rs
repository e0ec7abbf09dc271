//! Event capture records (exec / fork / exit, file, network and signal
//! syscalls, unix-socket policy decisions) shared by the eBPF programs and
//! the supervisor. See docs/ebpf.md, "Capture".
//!
//! Every ring-buffer record starts with 28 bytes laid out like the first
//! fields of [`crate::ConnectEvent`], followed by a `u16` at byte 28 that
//! tells the record apart: the connect filter's kinds (`crate::kind`, 1-5) or
//! one of [`record`] (>= 0x10). Capture records start with [`EventHeader`].
//!
//! Strings are fixed-size buffers; the `*_len` fields hold what the read
//! helper returned (bytes copied including the final NUL, or a negative
//! errno when the read failed).

/// Record type, the `u16` at byte offset 28 of every ring-buffer record.
pub mod record {
    /// [`super::ExecEvent`] (`tp_btf/sched_process_exec`).
    pub const EXEC: u16 = 0x10;
    /// [`super::ForkEvent`] (`tp_btf/sched_process_fork`, new processes only).
    pub const FORK: u16 = 0x11;
    /// [`super::ExitEvent`] (`tp_btf/sched_process_exit`, whole process).
    pub const EXIT: u16 = 0x12;
    /// [`super::SysEvent`] without a string (fd-based calls, signals).
    pub const SYS: u16 = 0x13;
    /// [`super::SysPathEvent`]: one path.
    pub const SYS_PATH: u16 = 0x14;
    /// [`super::SysPath2Event`]: two paths (rename, link, symlink).
    pub const SYS_PATH2: u16 = 0x15;
    /// [`super::SysAddrEvent`]: a socket address (connect, sendto, sendmsg).
    pub const SYS_ADDR: u16 = 0x16;
    /// [`super::UnixEvent`]: a decision of the unix-socket path policy.
    pub const UNIX: u16 = 0x17;
    /// [`super::SysFileEvent`]: a call on a descriptor, with the file the
    /// kernel had behind it (`fchmod`, `fsetxattr`, `futimens`, the
    /// inode-flag ioctls, an open's returned descriptor, ...).
    pub const SYS_FILE: u16 = 0x18;

    /// Whether `r` (the `u16` at offset 28) is a capture record.
    pub const fn is_capture(r: u16) -> bool {
        r >= EXEC && r <= SYS_FILE
    }
}

/// Effect kinds, as in the effect log (`effectlog::EFFECT_KINDS`), and the
/// index of the loss counters in [`crate::MAP_EVENTS_LOST`].
pub mod effect {
    /// Unknown / not attributable.
    pub const OTHER: u16 = 0;
    pub const EXEC: u16 = 1;
    pub const EXIT: u16 = 2;
    pub const FORK: u16 = 3;
    pub const OPEN: u16 = 4;
    pub const CREATE: u16 = 5;
    pub const WRITE: u16 = 6;
    pub const UNLINK: u16 = 7;
    pub const RENAME: u16 = 8;
    pub const CHMOD: u16 = 9;
    pub const TRUNCATE: u16 = 10;
    pub const MKDIR: u16 = 11;
    pub const RMDIR: u16 = 12;
    pub const LINK: u16 = 13;
    pub const SYMLINK: u16 = 14;
    pub const CHOWN: u16 = 15;
    pub const CONNECT: u16 = 16;
    pub const SENDTO: u16 = 17;
    pub const SIGNAL: u16 = 18;
    /// A successful chdir / fchdir: not logged, but it keeps the
    /// supervisor's model of each process's cwd, against which relative
    /// paths are resolved.
    pub const CHDIR: u16 = 19;
    /// mknod / mknodat: a regular file, FIFO, socket or device node.
    pub const MKNOD: u16 = 20;
    /// bind: for `AF_UNIX` pathnames, a socket file is created.
    pub const BIND: u16 = 21;
    /// setxattr / removexattr family (POSIX ACLs are the `system.posix_acl_*` names).
    pub const XATTR: u16 = 22;
    /// utime / utimes / futimesat / utimensat: file times set.
    pub const UTIME: u16 = 23;
    /// ioctl FS_IOC_SETFLAGS / FS_IOC_FSSETXATTR, file_setattr: inode flags
    /// (immutable, append-only, ...).
    pub const SETFLAGS: u16 = 24;
    /// An attempt of a syscall the seccomp filter refuses (io_uring, mount,
    /// bpf, ...): the call name and the errno it got.
    pub const SYSCALL: u16 = 25;

    /// Number of kinds (and of loss counters in use).
    pub const COUNT: usize = 26;

    /// Log names, indexed by kind. `OTHER` is logged as `event`.
    pub const NAMES: [&str; COUNT] = [
        "event", "exec", "exit", "fork", "open", "create", "write", "unlink", "rename", "chmod",
        "truncate", "mkdir", "rmdir", "link", "symlink", "chown", "connect", "sendto", "signal",
        "chdir", "mknod", "bind", "xattr", "utime", "setflags", "syscall",
    ];

    /// Log name of `kind` (`event` when unknown).
    pub const fn name(kind: u16) -> &'static str {
        if (kind as usize) < COUNT {
            NAMES[kind as usize]
        } else {
            NAMES[0]
        }
    }
}

/// Bits of [`EventHeader::flags`].
pub mod flag {
    /// The (first) path could not be read from the caller's memory.
    pub const PATH_UNREADABLE: u32 = 1 << 0;
    /// The (first) path is longer than [`super::PATH_BYTES`] - 1 bytes.
    pub const PATH_TRUNCATED: u32 = 1 << 1;
    /// The second path could not be read.
    pub const PATH2_UNREADABLE: u32 = 1 << 2;
    /// The second path is longer than [`super::PATH_BYTES`] - 1 bytes.
    pub const PATH2_TRUNCATED: u32 = 1 << 3;
    /// exec: the argument strings could not be read.
    pub const ARGV_UNREADABLE: u32 = 1 << 4;
    /// exec: the argument strings are longer than [`super::ARGV_BYTES`].
    pub const ARGV_TRUNCATED: u32 = 1 << 5;
    /// The socket address (or `struct open_how` / `struct msghdr`) could not
    /// be read.
    pub const ADDR_UNREADABLE: u32 = 1 << 6;
    /// The socket address is longer than [`super::ADDR_BYTES`].
    pub const ADDR_TRUNCATED: u32 = 1 << 7;
    /// The parent's pid could not be read.
    pub const PPID_UNREADABLE: u32 = 1 << 8;
    /// A `syscall` record of the 32-bit entry (`int 0x80`, `TS_COMPAT`):
    /// its number is of the i386 table.
    pub const ABI_IA32: u32 = 1 << 9;
    /// A `syscall` record of a number with the x32 bit (or beyond it).
    pub const ABI_X32: u32 = 1 << 10;
    /// An open that may write: when it succeeds without creating its
    /// file, `sys_exit` names the descriptor it returned
    /// ([`super::SysFileEvent`]).
    pub const OPENS_FILE: u32 = 1 << 11;
    /// A call that may act on its descriptor's file: `AT_EMPTY_PATH`
    /// (`fchownat`, `fchmodat2`, `utimensat`, `setxattrat`,
    /// `removexattrat`, `file_setattr`), `futimesat(fd, NULL)`, and
    /// `fsetxattr` / `fremovexattr`. When the path read at entry is empty
    /// (or NULL), the call changed the file of its descriptor, and
    /// `sys_exit` names that file ([`super::SysFileEvent`]).
    pub const BY_FD: u32 = 1 << 12;
    /// The caller's fd table was shared (`files_struct.count > 1`: another
    /// thread, or a `CLONE_FILES` child) when a call on a descriptor
    /// started: another task could swap the descriptor between the
    /// kernel's lookup and `sys_exit`, so the file read at exit is not
    /// proof of the file the call changed.
    pub const FD_SHARED: u32 = 1 << 13;
    /// A fork record whose child shares its parent's `fs_struct`
    /// (`clone(CLONE_FS)`): a `chdir` by either moves both cwds.
    pub const FS_SHARED: u32 = 1 << 14;
    /// Another task shared the caller's memory (`mm_struct.mm_users > 1`,
    /// or unread) when a path-named call started: it could rewrite the
    /// name between this read and the kernel's copy, so the name is the
    /// agent's claim until a notification proves it.
    pub const NAME_SHARED: u32 = 1 << 15;
    /// The (first) path was unreadable at `sys_enter` (a page not yet
    /// faulted in) and was read at `sys_exit` of a call that failed, after
    /// the kernel's own copy had faulted it in: the agent's claim, read
    /// after the call.
    pub const PATH_READ_AFTER: u32 = 1 << 16;
    /// An xattr call's attribute name was unreadable at `sys_enter` and
    /// was read at `sys_exit`, after the kernel's copy had faulted its
    /// page in (adversarial round 23: a name on a page the capture could
    /// not fault in was logged as `""`). Proven against the file as any
    /// name is.
    pub const NAME_READ_AFTER: u32 = 1 << 17;
    /// A path-named call (`sys_enter`) whose caller's `fs_struct` has
    /// fewer users than its process has threads (`fs->users <
    /// signal->nr_threads`, or unread): some thread of the process has a
    /// cwd of its own (`unshare(CLONE_FS)`, or a thread cloned without
    /// `CLONE_FS`), and the cwd model, one per process, cannot be right
    /// for every thread (adversarial round 25b). An exiting thread leaves
    /// its `fs_struct` before its process stops counting it, so this can
    /// also be set for a moment in a process that never split: it only
    /// makes a record the agent's claim. On a fork record: the forking
    /// thread's `fs_struct`, less the `CLONE_FS` child, against its
    /// process (the child may start in a cwd the model never saw).
    pub const FS_SPLIT: u32 = 1 << 18;
    /// A path-named call whose caller's `fs_struct` has exactly as many
    /// users as its process has threads: with [`FS_THREADS`] clear, no
    /// other process shares it (a `chdir` moves the caller alone, even
    /// if it was cloned with `CLONE_FS` and has called `unshare` since).
    pub const FS_ALONE: u32 = 1 << 19;
    /// A path-named call whose caller's process has more than one thread.
    pub const FS_THREADS: u32 = 1 << 20;
}

/// `AT_EMPTY_PATH` (include/uapi/linux/fcntl.h).
pub const AT_EMPTY_PATH: u64 = 0x1000;

/// The x32 ABI bit of x86_64 syscall numbers (`__X32_SYSCALL_BIT`).
pub const X32_SYSCALL_BIT: u64 = 0x4000_0000;

/// Size of a path buffer (including the final NUL).
pub const PATH_BYTES: usize = 256;
/// Bytes of the argument strings kept for an exec.
pub const ARGV_BYTES: usize = 1024;
/// Bytes of a socket address kept (`sizeof(struct sockaddr_storage)`).
pub const ADDR_BYTES: usize = 128;
/// Bytes of `sun_path` compared by the unix policy (108, rounded up to 8).
pub const UNIX_PATH_BYTES: usize = 112;
/// `sizeof(((struct sockaddr_un *)0)->sun_path)`.
pub const SUN_PATH_MAX: usize = 108;
/// Words of a unix path prefix.
pub const UNIX_WORDS: usize = UNIX_PATH_BYTES / 8;
/// Number of prefix slots in [`UnixAllow`].
pub const UNIX_PREFIXES: u32 = 8;
/// Slots of the per-CPU loss counters (>= [`effect::COUNT`]).
pub const LOST_SLOTS: usize = 32;

/// `RunConfig::cgroup_level` value meaning "match the cgroup itself
/// only" (the level of the cgroup in the hierarchy is not known).
pub const LEVEL_UNKNOWN: u32 = u32::MAX;

/// Which unix-socket operation a [`UnixEvent`] is about.
pub mod unix_hook {
    /// `cgroup/connect_unix`.
    pub const CONNECT: u16 = 1;
    /// `cgroup/sendmsg_unix`.
    pub const SENDMSG: u16 = 2;
}

/// Why the unix policy decided as it did ([`UnixEvent::verdict`]).
pub mod unix_verdict {
    /// Under an allowed prefix.
    pub const ALLOW: u16 = 1;
    /// Abstract name (Landlock scopes these).
    pub const ALLOW_ABSTRACT: u16 = 2;
    /// Pathname outside every allowed prefix.
    pub const DENY: u16 = 3;
    /// Relative pathname (cannot be judged without the caller's cwd).
    pub const DENY_RELATIVE: u16 = 4;
    /// Pathname with a `..` component.
    pub const DENY_DOTDOT: u16 = 5;
    /// The address or the configuration could not be read (fail closed).
    pub const DENY_ERROR: u16 = 6;
    /// Allowed, but its name rewritten under [`super::UNIX_MIRROR`] would
    /// not fit in `sun_path`, or the kernel refused the rewrite.
    pub const DENY_UNPINNED: u16 = 7;
    /// Or'ed into an allowed verdict when syscall capture records the
    /// attempt: the event is no record of its own, only the path the
    /// kernel copied, for the `connect` / `sendto` record of the same task
    /// (as [`crate::verdict::DESTINATION_NOTE`] for inet).
    pub const DESTINATION_NOTE: u16 = crate::verdict::DESTINATION_NOTE;
}

/// Where the sandbox shows each allowed unix prefix again, on a mount that
/// follows no symlink (`MOUNT_ATTR_NOSYMFOLLOW`): slot `N` of
/// [`UnixAllow`] is `/dev/.u/N/`. The unix programs rewrite every allowed
/// name to it, so a symlink planted under a root cannot lead the kernel's
/// lookup to a socket outside (the hook sees the name before the lookup).
pub const UNIX_MIRROR: &[u8; 8] = b"/dev/.u/";
/// Bytes of a slot's mirror prefix: [`UNIX_MIRROR`], the slot digit, `/`.
pub const UNIX_MIRROR_LEN: usize = UNIX_MIRROR.len() + 2;
const _: () = assert!(UNIX_PREFIXES <= 10, "one digit per mirror slot");

/// The call the unix programs make to the kfunc
/// `bpf_sock_addr_set_sun_path` (Linux 6.7) is compiled as a call to this
/// helper number, which no kernel has; the loader turns it into a kfunc
/// call with the kernel's BTF id of the function.
pub const KFUNC_SET_SUN_PATH: u32 = 0x7e57_0001;
/// The same for `bpf_cast_to_kern_ctx` (Linux 6.2), which gives the
/// `struct bpf_sock_addr_kern *` that `bpf_sock_addr_set_sun_path` takes
/// (the verifier does not accept the program's context pointer there).
pub const KFUNC_CAST_TO_KERN_CTX: u32 = 0x7e57_0002;

/// Common head of every capture record. 40 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// `bpf_get_current_cgroup_id()` of the caller.
    pub cgroup_id: u64,
    /// Kernel task id (thread id).
    pub pid: u32,
    /// Thread-group id (process id, as seen from the host).
    pub tgid: u32,
    /// Real uid.
    pub uid: u32,
    /// One of [`record`].
    pub record: u16,
    /// One of [`effect`].
    pub effect: u16,
    /// Thread-group id of the real parent (0 if unreadable).
    pub ppid: u32,
    /// [`flag`] bits.
    pub flags: u32,
}

/// An exec (`sched_process_exec`). 2392 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// `bprm->argc`.
    pub argc: u32,
    /// Size of the argument strings (`mm->arg_end - mm->arg_start`).
    pub args_size: u32,
    /// Read result for `filename` (bytes with the NUL, or -errno).
    pub filename_len: i32,
    /// Bytes of `args` read (or -errno).
    pub args_len: i32,
    /// `bprm->filename`: the path the caller passed to execve.
    pub filename: [u8; PATH_BYTES],
    /// NUL-separated argument strings, bounded by [`ARGV_BYTES`] and by
    /// `arg_end` (the environment that follows is never read).
    pub args: [u8; ARGV_BYTES],
    /// `bprm->file`: what the kernel runs, whatever name `filename` gave
    /// (a symlink, `/proc/self/fd/N`, a memfd, a script's interpreter).
    pub file: KernelFile,
}

/// A new process (`sched_process_fork` with a new thread group). 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkEvent {
    pub header: EventHeader,
    /// Thread-group id of the child.
    pub child: u32,
    pub _pad: u32,
}

/// A process exit (the last thread of the group). 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// `task->exit_code`: wait status (`code << 8`, or the signal number).
    pub status: u32,
    pub _pad: u32,
}

/// A captured syscall, with the kernel's return value. 96 bytes; the path
/// and address records below extend it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysEvent {
    pub header: EventHeader,
    /// Syscall number (x86_64).
    pub nr: u32,
    /// Directory fd of the (first) path, an fd operated on, or -100
    /// (`AT_FDCWD`).
    pub fd: i32,
    /// Directory fd of the second path (`AT_FDCWD` when the call has none).
    pub fd2: i32,
    /// Read result of the (first) path or the address length read.
    pub len: i32,
    /// Read result of the second path.
    pub len2: i32,
    pub _pad: u32,
    /// The syscall's return value (negative errno on failure).
    pub ret: i64,
    /// Call-specific integers (flags, mode, uid/gid, length, signal, ...).
    pub args: [u64; 3],
}

/// [`SysEvent`] with one path. 352 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SysPathEvent {
    pub sys: SysEvent,
    pub path: [u8; PATH_BYTES],
}

/// [`SysEvent`] with two paths. 608 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SysPath2Event {
    pub sys: SysEvent,
    pub path: [u8; PATH_BYTES],
    pub path2: [u8; PATH_BYTES],
}

/// [`SysEvent`] with a socket address (raw `struct sockaddr` bytes, `len`
/// of them valid). 224 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SysAddrEvent {
    pub sys: SysEvent,
    pub addr: [u8; ADDR_BYTES],
}

/// A decision of the unix-socket path policy. 160 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnixEvent {
    pub header: EventHeader,
    /// One of [`unix_hook`].
    pub hook: u16,
    /// One of [`unix_verdict`].
    pub verdict: u16,
    /// Length of the address (`uaddrlen`), including the family.
    pub addr_len: u32,
    /// `sun_path` (the first `addr_len - 2` bytes are meaningful).
    pub path: [u8; UNIX_PATH_BYTES],
}

/// One run's configuration (an entry of [`crate::MAP_RUNS`], keyed by the
/// run id): what is installed for it, and the kernel structure offsets read
/// from the kernel's BTF (the programs are not CO-RE). The programs find a
/// task's run as the id of its ancestor cgroup at the level in
/// [`crate::MAP_RUN_LEVEL`] (its own cgroup with [`LEVEL_UNKNOWN`]); a task
/// whose run has no entry is not a sandbox task for capture, and is
/// refused by the filters attached above it (fail closed).
/// 88 bytes, alignment 8, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunConfig {
    /// Inode of the run's cgroup v2 directory: the run id.
    pub cgroup_id: u64,
    /// Level of that cgroup (root = 0) for `bpf_get_current_ancestor_cgroup_id`,
    /// or [`LEVEL_UNKNOWN`].
    pub cgroup_level: u32,
    /// Non-zero: the connect filter and the unix policy do not write their
    /// decisions to the ring buffer, because syscall capture records the
    /// same attempts with the kernel's verdict (refused socket creations
    /// are still written). Zero, the state of a fresh map, reports them.
    pub policy_quiet: u32,
    /// Non-zero: `sched_process_exit` has the `group_dead` argument (recent
    /// kernels, 6.18 has it; read from the BTF).
    pub exit_group_dead: u32,
    /// Offsets in `struct task_struct`.
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_real_parent: u32,
    pub task_mm: u32,
    pub task_exit_code: u32,
    /// Offset of `thread_info.status` in `task_struct` (x86 `TS_COMPAT`),
    /// or `u32::MAX` when unknown.
    pub task_ti_status: u32,
    /// Offsets in `struct mm_struct`.
    pub mm_arg_start: u32,
    pub mm_arg_end: u32,
    /// Offsets in `struct linux_binprm`.
    pub bprm_filename: u32,
    pub bprm_argc: u32,
    /// Capture records are submitted without waking the reader until this
    /// many bytes wait in the ring buffer (the reader also polls on a
    /// timer): one wake-up per batch instead of one per event. 0: wake up
    /// for every record.
    pub wake_bytes: u32,
    /// [`feature`] bits: the parts installed for this run. A part that is
    /// off lets everything through, as if its programs were not attached.
    pub features: u32,
    /// `FILTER_ENFORCE` or `FILTER_MONITOR` (any other value enforces).
    pub filter_mode: u32,
    /// Port of the transparent proxy (host order) that refused TCP connects
    /// are rewritten to; 0: refused.
    pub transparent_port: u32,
    /// Offset of `task_struct.fs` (0: unknown; fork records then never
    /// say [`flag::FS_SHARED`]).
    pub task_fs: u32,
    /// Key of the run's ring buffer in [`crate::MAP_EVENTS`] (0: none, the
    /// run's records are counted as lost). A key of its own rather than the
    /// run id, so the ring can be put in place before the run's cgroup
    /// exists: every update of a map of maps waits for an RCU grace period
    /// (~4–12 ms here), which is then spent while the run is being set up.
    pub ring: u64,
}

/// Bits of [`RunConfig::features`].
pub mod feature {
    /// The connect filter (`connect4/6`, `sendmsg4/6`, `sock_create`).
    pub const FILTER: u32 = 1 << 0;
    /// The unix socket path policy.
    pub const UNIX: u32 = 1 << 1;
    /// Syscall and process capture.
    pub const CAPTURE: u32 = 1 << 2;
    /// `sock_ops`: who opened each TCP connection, and the destinations of
    /// intercepted connects.
    pub const SOCK_OPS: u32 = 1 << 3;
}

/// One allowed unix path prefix, compared 8 bytes at a time:
/// `(path[w] ^ words[w]) & masks[w] == 0` for every word. 232 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixPrefix {
    /// Prefix length in bytes; 0 marks an unused slot.
    pub len: u32,
    pub _pad: u32,
    /// Prefix bytes, little-endian words, zero after `len`.
    pub words: [u64; UNIX_WORDS],
    /// 0xff for every byte below `len`, 0 after.
    pub masks: [u64; UNIX_WORDS],
}

impl UnixPrefix {
    /// An unused slot: it demands byte 0xff first, which no pathname (they
    /// start with `/`) has, so it never matches.
    pub const NEVER: Self = {
        let mut p = Self::EMPTY;
        p.words[0] = 0xff;
        p.masks[0] = 0xff;
        p
    };

    const EMPTY: Self = Self {
        len: 0,
        _pad: 0,
        words: [0; UNIX_WORDS],
        masks: [0; UNIX_WORDS],
    };

    /// The slot for `prefix`; `None` when it is empty or longer than a
    /// `sun_path` can be.
    pub fn new(prefix: &[u8]) -> Option<Self> {
        if prefix.is_empty() || prefix.len() >= SUN_PATH_MAX {
            return None;
        }
        let mut p = Self::EMPTY;
        p.len = prefix.len() as u32;
        let mut i = 0;
        while i < prefix.len() {
            let (w, shift) = (i / 8, (i % 8) * 8);
            p.words[w] |= (prefix[i] as u64) << shift;
            p.masks[w] |= 0xff << shift;
            i += 1;
        }
        Some(p)
    }
}

/// The unix policy: every allowed prefix, in one map value so the
/// program needs a single lookup. 1856 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixAllow {
    pub prefixes: [UnixPrefix; UNIX_PREFIXES as usize],
}

impl UnixAllow {
    /// No pathname allowed.
    pub const NONE: Self = Self {
        prefixes: [UnixPrefix::NEVER; UNIX_PREFIXES as usize],
    };
}

pub mod call_shape;
mod file;
mod syscall_numbers;
pub use file::{
    FILE_NAME_MAX, FILE_NAMES_BYTES, FILE_WALK_STEPS, FMODE_CREATED, FMODE_WRITE, FileLayout,
    KernelFile, MAP_FILE_LAYOUT, SysFileEvent, VM_SHARED_ANY, file_status,
};
pub use syscall_numbers::{
    AT_FDCWD, AT_REMOVEDIR, SYSCALL_KINDS, effect_of, ioctl, nr, oflag, refused_sometimes,
};

const _: () = assert!(core::mem::size_of::<EventHeader>() == 40);
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 2392);
const _: () = assert!(core::mem::size_of::<ForkEvent>() == 48);
const _: () = assert!(core::mem::size_of::<ExitEvent>() == 48);
const _: () = assert!(core::mem::size_of::<SysEvent>() == 96);
const _: () = assert!(core::mem::size_of::<SysPathEvent>() == 352);
const _: () = assert!(core::mem::size_of::<SysPath2Event>() == 608);
const _: () = assert!(core::mem::size_of::<SysAddrEvent>() == 224);
const _: () = assert!(core::mem::size_of::<UnixEvent>() == 160);
const _: () = assert!(core::mem::size_of::<RunConfig>() == 88);
const _: () = assert!(core::mem::size_of::<UnixPrefix>() == 232);
const _: () = assert!(core::mem::size_of::<UnixAllow>() == 1856);
const _: () = assert!(core::mem::align_of::<ExecEvent>() == 8);
const _: () = assert!(core::mem::align_of::<UnixEvent>() == 8);
// The record type sits where `ConnectEvent::kind` does.
const _: () = assert!(core::mem::offset_of!(EventHeader, record) == 28);
const _: () = assert!(core::mem::offset_of!(crate::ConnectEvent, kind) == 28);
const _: () = assert!(effect::COUNT <= LOST_SLOTS);
