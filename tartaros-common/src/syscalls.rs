//! Every x86-64 syscall, classified by what the effect log does about it.
//! The seccomp filter refuses the i386 (`int 0x80`, other audit arch) and
//! x32 (numbers with bit 30 set) ABIs outright with EPERM before any other
//! rule, so the native x86-64 table is the only one an agent can reach.
//! `tests/syscall_table.rs` holds this table against the kernel's list
//! and the capture's own choice ([`crate::capture::nr`]); the supervisor's
//! tests hold it against the seccomp filter. See docs/ebpf.md, "Completeness".

/// What the log does about one syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Recorded at syscall exit with the kernel's verdict, as this effect
    /// kind (the main one: opens become `create` / `truncate` / `open`,
    /// `unlinkat` with `AT_REMOVEDIR` `rmdir`). Some are recorded only
    /// when they can change something: opens for writing (read-only ones
    /// only when refused), sends with a destination, ioctls that set
    /// inode flags, successful chdirs (which move the cwd model only).
    Captured(u16),
    /// Recorded by a process tracepoint (`sched_process_fork` / `_exit`),
    /// which sees the new or ended process itself.
    Traced(u16),
    /// Refused by the default seccomp filter, whatever the arguments; the
    /// attempt is a `syscall` record with the errno.
    Refused,
    /// Refused by the default seccomp filter, and not recorded (why).
    RefusedQuiet(&'static str),
    /// Acts only through a file descriptor whose opening for writing (or
    /// connect) is recorded (why).
    ThroughFd(&'static str),
    /// No effect outside the sandbox's own processes, memory and namespaces
    /// (why).
    Inert(&'static str),
    /// Not implemented by the kernel (always ENOSYS).
    Absent,
}

mod table;
pub use table::TABLE;

// The reasons many syscalls share.
pub(super) const READS: &str = "reads or queries only";
pub(super) const OWN_FDS: &str = "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)";
pub(super) const OWN_MEMORY: &str = "the process's own memory";
pub(super) const OWN_ATTRIBUTES: &str = "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)";
pub(super) const WAITS: &str = "waits, sleeps or yields";
pub(super) const OWN_IPC: &str =
    "System V IPC and POSIX message queues of the sandbox's own IPC namespace";
pub(super) const WRITES_THROUGH_FD: &str =
    "writes through an fd whose open for writing (or connect) is recorded";
pub(super) const OWN_SIGNALS: &str = "signal handling of the caller";
pub(super) const SHARED_MAPPING: &str =
    "a shared writable mapping of an fd whose open for writing is recorded";
pub(super) const FD_STATE: &str = "changes the lock or state of an open fd only";
/// Locks stay (tools in the roots need them; they end with the run), the
/// commands that leave or hold state on the inode are refused by the
/// default filter for their `cmd` and recorded (`refused_sometimes`).
pub(super) const FCNTL: &str = "changes the lock or state of an open fd; the inode-state commands \
    (F_SETLEASE, F_SET_RW_HINT, F_SET_FILE_RW_HINT) are refused by seccomp, their attempts recorded";
pub(super) const FADVISE: &str = "page-cache advice for an open fd; POSIX_FADV_DONTNEED, which drops \
    the cache of a host file the agent can read, is refused by seccomp, its attempts recorded";
pub(super) const MADVISE: &str = "advice on the process's own mappings; MADV_COLD and MADV_PAGEOUT, \
    which reclaim the host's cache of a file the agent owns, are refused by seccomp, their attempts \
    recorded";
pub(super) const OWN_PROCESSES: &str =
    "only the agent's own processes (Landlock scopes tracing to them)";

/// The class of syscall `nr` (`None`: not a syscall of this table).
pub fn class_of(nr: u32) -> Option<Class> {
    TABLE
        .binary_search_by_key(&nr, |(n, _, _)| *n)
        .ok()
        .map(|i| TABLE[i].2)
}

/// The name of syscall `nr`.
pub fn name_of(nr: u32) -> Option<&'static str> {
    TABLE
        .binary_search_by_key(&nr, |(n, _, _)| *n)
        .ok()
        .map(|i| TABLE[i].1)
}

/// The number of syscall `name`.
pub fn number_of(name: &str) -> Option<u32> {
    TABLE
        .iter()
        .find(|(_, n, _)| *n == name)
        .map(|(nr, _, _)| *nr)
}
