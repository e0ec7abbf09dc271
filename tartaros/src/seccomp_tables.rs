//! The seccomp filter's tables: what is denied whatever the arguments, on
//! every run and under `--seccomp-strict`, and why (for docs/seccomp.md and
//! the refusal records).

/// Denied whatever the arguments, on every run: (syscalls, reason).
// One entry per line reads as the table it is; rustfmt would spread it out.
#[rustfmt::skip]
pub(super) const DEFAULT_ALWAYS: &[(&[&str], &str)] = &[
    (&["process_vm_readv", "process_vm_writev", "process_madvise"], WHY_VM),
    (&["pidfd_getfd"], "copies a file descriptor out of another process (e.g. the init)"),
    (&["bpf"], "loads kernel programs and maps: large attack surface, reaches our own maps"),
    (&["perf_event_open"], "kernel/CPU profiling: side channels, a long history of bugs"),
    (&["kexec_load", "kexec_file_load"], "replaces the running kernel"),
    (&["init_module", "finit_module", "delete_module"], "loads or unloads kernel code"),
    (&["mount", "umount2", "pivot_root", "move_mount", "open_tree", "open_tree_attr"], WHY_MOUNT),
    (&["fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr"], WHY_MOUNT),
    (&["setns"], "joins another namespace (e.g. the host's) and leaves the sandbox's"),
    (&["keyctl", "add_key", "request_key"], WHY_KEYS),
    (&["userfaultfd"], "stalls kernel page faults: the standard tool to win kernel races"),
    (&["io_uring_setup", "io_uring_enter", "io_uring_register"], WHY_URING),
    (&["io_setup", "io_submit"], WHY_AIO),
    (&["acct"], "host-wide process accounting"),
    (&["swapon", "swapoff"], "host-wide swap configuration"),
    (&["reboot"], "reboots or halts the host"),
    (&["syslog"], "reads the kernel log: kernel addresses, other users' messages"),
    (&["quotactl", "quotactl_fd"], "host filesystem quota administration"),
    (&["open_by_handle_at"], "opens any file by handle, past every path wall (container escape)"),
    (&["name_to_handle_at"], "makes the handles open_by_handle_at consumes"),
    (&["lookup_dcookie"], "kernel profiling internals (gone from recent kernels)"),
    (&["settimeofday", "clock_settime", "clock_adjtime", "adjtimex"], WHY_CLOCK),
    (&["sethostname", "setdomainname"], "renames the host"),
    (&["iopl", "ioperm"], "direct hardware I/O port access"),
    (&["modify_ldt"], "x86 segment descriptors: old attack surface, only 16-bit code needs it"),
    (&["uselib"], "obsolete a.out library loader"),
];
/// Denied whatever the arguments under `--seccomp-strict`.
#[rustfmt::skip]
pub(super) const STRICT_ALWAYS: &[(&[&str], &str)] = &[
    (&["ptrace"], "no tracing at all, not even PTRACE_TRACEME: gdb and strace stop working"),
    (&["chroot"], "changes the root directory (needs a capability anyway; refused outright)"),
    (&["fanotify_init"], "filesystem-wide event monitoring"),
    (&["kcmp"], "compares kernel objects of other processes (checkpoint/restore only)"),
    (&["migrate_pages", "move_pages"], "moves another process's memory between NUMA nodes"),
];
pub(super) const WHY_VM: &str =
    "reads, writes or advises another process's memory (ptrace-attach check)";
pub(super) const WHY_MOUNT: &str =
    "changes the mount tree: could uncover what the mount plan hid or remount paths writable";
pub(super) const WHY_KEYS: &str =
    "keyrings are per user, not per sandbox: could read or plant the launching user's keys";
pub(super) const WHY_URING: &str =
    "does I/O through no syscall seccomp sees, frequent kernel bugs; tools fall back to syscalls";
pub(super) const WHY_AIO: &str =
    "Linux AIO writes files with no change notification (unlogged); tools fall back to syscalls";
pub(super) const WHY_CLOCK: &str =
    "sets the host clock (skewing the log's wall time); adjtimex's read-only mode is in a struct";
pub(super) const WHY_NS: &str = "new namespaces: a user namespace grants capabilities and a large kernel \
    attack surface; the others need capabilities the agent lacks";
pub(super) const WHY_CLONE3: &str = "its flags sit in a struct seccomp cannot read; ENOSYS makes glibc and \
    others fall back to clone, whose flags are filtered";
pub(super) const WHY_FAMILY: &str = "only the families coding tools use: no AF_PACKET (raw frames past the \
    connect filters), AF_VSOCK (the host/hypervisor) or rarely-used, bug-prone families";
pub(super) const WHY_NETLINK: &str = "netlink protocols past route, sock_diag and generic reach the host: \
    uevents of every host device (kobject_uevent), audit, netfilter, crypto, connector";
pub(super) const WHY_UNIX: &str =
    "--deny-unix: AF_UNIX reaches local daemons (docker.sock, ssh-agent, D-Bus) no wall sees";
pub(super) const WHY_SETID: &str = "a setuid or setgid file left in a root runs as the agent's uid or gid for \
    any local user after the run, outside every sandbox";
pub(super) const WHY_CORE: &str = "RLIMIT_CORE stays 1, the kernel's marker that refuses a core_pattern pipe: \
    at 0 a crash would run the host's root core handler (apport, systemd-coredump) outside the sandbox";
pub(super) const WHY_PRLIMIT: &str = "sets another process's limits: the kernel asks only for the same uid, \
    which the init shares under --user root or in a user namespace (RLIMIT_CPU 0 killed it mid-run)";
pub(super) const WHY_SETGID_CREATE: &str = "a setgid creation mode survives writes while group-execute is off, and a \
    POSIX ACL then adds group-execute without chmod: a file setgid to the agent's group for any local user";
pub(super) const WHY_SETUID_CREATE: &str = "a setuid creation mode stays on a file nothing writes, and keeps \
    the bit when a process with CAP_FSETID later writes it: a setuid file of the agent's uid left in a root";
pub(super) const WHY_OPENAT2: &str = "its mode sits in a struct seccomp cannot read (a setgid creation mode); ENOSYS \
    makes callers fall back to openat, whose mode is filtered";
/// The ioctl commands refused on every run (`cmd`'s low 32 bits, as the
/// kernel reads it), and why. The capture records their refused attempts
/// (`tartaros_common::capture::nr::ioctl::refused`, which must agree).
pub(super) const REFUSED_IOCTLS: [(super::Named, &str); 11] = [
    (
        super::TIOCSTI,
        "pushes input into the terminal; the user's shell runs it after the sandbox",
    ),
    (
        super::TIOCLINUX,
        "virtual-console selection paste: the same input injection",
    ),
    (
        super::TIOCSETD,
        "switches a tty line discipline: rarely-used, bug-prone kernel code",
    ),
    (super::FS_IOC_SETVERSION, WHY_GENERATION),
    (super::FS_IOC32_SETVERSION, WHY_GENERATION),
    (FS_IOC_SET_ENCRYPTION_POLICY, WHY_FSCRYPT_POLICY),
    (FS_IOC_GET_ENCRYPTION_PWSALT, WHY_FSCRYPT_POLICY),
    (FS_IOC_ADD_ENCRYPTION_KEY, WHY_FSCRYPT_KEYS),
    (FS_IOC_REMOVE_ENCRYPTION_KEY, WHY_FSCRYPT_KEYS),
    (FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS, WHY_FSCRYPT_KEYS),
    (FS_IOC_ENABLE_VERITY, WHY_VERITY),
];

// The filesystem ioctls that change state through a descriptor opened
// read-only (the kernel asks no write access of the file for them), so
// they reach files outside every root. One encoding each: their structs
// hold only fixed-size fields, so the 32-bit ABI's command is the same
// number (and 32-bit entry is refused by the prologue anyway).
// `FS_IOC_SET_ENCRYPTION_POLICY` is `_IOR` although it sets (uapi quirk).
pub(super) const FS_IOC_SET_ENCRYPTION_POLICY: super::Named =
    named(0x800c_6613, "FS_IOC_SET_ENCRYPTION_POLICY");
pub(super) const FS_IOC_GET_ENCRYPTION_PWSALT: super::Named =
    named(0x4010_6614, "FS_IOC_GET_ENCRYPTION_PWSALT");
pub(super) const FS_IOC_ADD_ENCRYPTION_KEY: super::Named =
    named(0xc050_6617, "FS_IOC_ADD_ENCRYPTION_KEY");
pub(super) const FS_IOC_REMOVE_ENCRYPTION_KEY: super::Named =
    named(0xc040_6618, "FS_IOC_REMOVE_ENCRYPTION_KEY");
pub(super) const FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS: super::Named =
    named(0xc040_6619, "FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS");
pub(super) const FS_IOC_ENABLE_VERITY: super::Named = named(0x4080_6685, "FS_IOC_ENABLE_VERITY");

const fn named(value: u32, name: &'static str) -> super::Named {
    super::Named { value, name }
}

const WHY_GENERATION: &str = "sets an inode's generation (ext4): the kernel's file handles of it \
    stop opening, which the effect log takes for a removed file or directory, and its writes, names and \
    seal hashes went unlogged";
const WHY_FSCRYPT_KEYS: &str = "fscrypt keys live in the filesystem, per user, not in the sandbox, and \
    any readable file's descriptor reaches them: removing the user's claim locks the user's encrypted \
    directories, added keys outlive the run (the user's key quota, unreclaimable kernel memory)";
const WHY_FSCRYPT_POLICY: &str = "persistent fscrypt state through a read-only descriptor: a directory's \
    encryption policy, the superblock's salt (written by the first query)";
const WHY_VERITY: &str = "makes a file permanently read-only (fs-verity) through a read-only \
    descriptor; not undone by any later chmod or write";
/// The fcntl commands refused on every run (`cmd`, an `unsigned int`),
/// and why. They act on the inode, not on the descriptor: the kernel
/// asks only that the caller own the file (or, for a lease, hold
/// `CAP_LEASE`), whatever the mount, so a read-only descriptor of a host
/// file the agent's uid owns reaches them.
pub(super) const REFUSED_FCNTLS: [(super::Named, &str); 3] = [
    (
        super::F_SETLEASE,
        "a lease held on a host file makes the host's writers (and, for a write lease, readers and \
         execs) wait up to the lease-break time (45 s) each, or until the run ends",
    ),
    (super::F_SET_RW_HINT, WHY_RW_HINT),
    (super::F_SET_FILE_RW_HINT, WHY_RW_HINT),
];
const WHY_RW_HINT: &str = "a write-life hint is stored in the inode: set on a host file the agent's uid \
    owns, it stays after the run and steers where the host's filesystem places its writes";
pub(super) const WHY_DONTNEED: &str = "drops the page cache of any file the agent can read, a host \
    file included (the host's binaries, libraries, databases): the host rereads them from disk, a \
    timing side channel and a slowdown the agent controls; other advice stays";
pub(super) const WHY_PAGEOUT: &str = "reclaims the pages of a mapping: of a host file the agent's uid \
    owns (every root-owned file under --user root), the host's own cache of it, as DONTNEED does; \
    other advice stays";
pub(super) const WHY_WINSZ: &str = "the launcher's terminal: a new window size outlives the run and SIGWINCH \
    reaches the launcher's job on the host";
