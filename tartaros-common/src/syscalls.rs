//! Every x86-64 syscall, classified by what the effect log does about it.
//! The seccomp filter refuses the i386 (`int 0x80`, other audit arch) and
//! x32 (numbers with bit 30 set) ABIs outright with EPERM before any other
//! rule, so the native x86-64 table is the only one an agent can reach.
//! `tests/syscall_table.rs` holds this table against the kernel's list
//! and the capture's own choice ([`crate::capture::nr`]); the supervisor's
//! tests hold it against the seccomp filter. See docs/ebpf.md, "Completeness".

use crate::capture::effect;

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

/// (number, name, class) for every x86-64 syscall up to Linux 6.18, by number.
pub const TABLE: &[(u32, &str, Class)] = {
    use Class::*;
    &[
        (0, "read", Inert("reads or queries only")),
        (
            1,
            "write",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (2, "open", Captured(effect::OPEN)),
        (
            3,
            "close",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (4, "stat", Inert("reads or queries only")),
        (5, "fstat", Inert("reads or queries only")),
        (6, "lstat", Inert("reads or queries only")),
        (7, "poll", Inert("reads or queries only")),
        (8, "lseek", Inert("reads or queries only")),
        (
            9,
            "mmap",
            ThroughFd("a shared writable mapping of an fd whose open for writing is recorded"),
        ),
        (10, "mprotect", Inert("the process's own memory")),
        (11, "munmap", Inert("the process's own memory")),
        (12, "brk", Inert("the process's own memory")),
        (13, "rt_sigaction", Inert("signal handling of the caller")),
        (14, "rt_sigprocmask", Inert("signal handling of the caller")),
        (15, "rt_sigreturn", Inert("signal handling of the caller")),
        (16, "ioctl", Captured(effect::SETFLAGS)),
        (17, "pread64", Inert("reads or queries only")),
        (
            18,
            "pwrite64",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (19, "readv", Inert("reads or queries only")),
        (
            20,
            "writev",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (21, "access", Inert("reads or queries only")),
        (
            22,
            "pipe",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (23, "select", Inert("reads or queries only")),
        (24, "sched_yield", Inert("waits, sleeps or yields")),
        (25, "mremap", Inert("the process's own memory")),
        (26, "msync", Inert("the process's own memory")),
        (27, "mincore", Inert("reads or queries only")),
        (28, "madvise", Inert("the process's own memory")),
        (
            29,
            "shmget",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            30,
            "shmat",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            31,
            "shmctl",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            32,
            "dup",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            33,
            "dup2",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (34, "pause", Inert("waits, sleeps or yields")),
        (35, "nanosleep", Inert("waits, sleeps or yields")),
        (36, "getitimer", Inert("reads or queries only")),
        (37, "alarm", Inert("waits, sleeps or yields")),
        (38, "setitimer", Inert("waits, sleeps or yields")),
        (39, "getpid", Inert("reads or queries only")),
        (
            40,
            "sendfile",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (
            41,
            "socket",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (42, "connect", Captured(effect::CONNECT)),
        (
            43,
            "accept",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (44, "sendto", Captured(effect::SENDTO)),
        (45, "recvfrom", Inert("reads or queries only")),
        (46, "sendmsg", Captured(effect::SENDTO)),
        (47, "recvmsg", Inert("reads or queries only")),
        (
            48,
            "shutdown",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (49, "bind", Captured(effect::BIND)),
        (
            50,
            "listen",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (51, "getsockname", Inert("reads or queries only")),
        (52, "getpeername", Inert("reads or queries only")),
        (
            53,
            "socketpair",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            54,
            "setsockopt",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (55, "getsockopt", Inert("reads or queries only")),
        (56, "clone", Traced(effect::FORK)),
        (57, "fork", Traced(effect::FORK)),
        (58, "vfork", Traced(effect::FORK)),
        (59, "execve", Captured(effect::EXEC)),
        (60, "exit", Traced(effect::EXIT)),
        (61, "wait4", Inert("waits, sleeps or yields")),
        (62, "kill", Captured(effect::SIGNAL)),
        (63, "uname", Inert("reads or queries only")),
        (
            64,
            "semget",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            65,
            "semop",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            66,
            "semctl",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            67,
            "shmdt",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            68,
            "msgget",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            69,
            "msgsnd",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            70,
            "msgrcv",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            71,
            "msgctl",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            72,
            "fcntl",
            ThroughFd("changes the lock or state of an open fd only"),
        ),
        (
            73,
            "flock",
            ThroughFd("changes the lock or state of an open fd only"),
        ),
        (
            74,
            "fsync",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            75,
            "fdatasync",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (76, "truncate", Captured(effect::TRUNCATE)),
        (77, "ftruncate", Captured(effect::TRUNCATE)),
        (78, "getdents", Inert("reads or queries only")),
        (79, "getcwd", Inert("reads or queries only")),
        (80, "chdir", Captured(effect::CHDIR)),
        (81, "fchdir", Captured(effect::CHDIR)),
        (82, "rename", Captured(effect::RENAME)),
        (83, "mkdir", Captured(effect::MKDIR)),
        (84, "rmdir", Captured(effect::RMDIR)),
        (85, "creat", Captured(effect::OPEN)),
        (86, "link", Captured(effect::LINK)),
        (87, "unlink", Captured(effect::UNLINK)),
        (88, "symlink", Captured(effect::SYMLINK)),
        (89, "readlink", Inert("reads or queries only")),
        (90, "chmod", Captured(effect::CHMOD)),
        (91, "fchmod", Captured(effect::CHMOD)),
        (92, "chown", Captured(effect::CHOWN)),
        (93, "fchown", Captured(effect::CHOWN)),
        (94, "lchown", Captured(effect::CHOWN)),
        (
            95,
            "umask",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (96, "gettimeofday", Inert("reads or queries only")),
        (97, "getrlimit", Inert("reads or queries only")),
        (98, "getrusage", Inert("reads or queries only")),
        (99, "sysinfo", Inert("reads or queries only")),
        (100, "times", Inert("reads or queries only")),
        (
            101,
            "ptrace",
            Inert("only the agent's own processes (Landlock scopes tracing to them)"),
        ),
        (102, "getuid", Inert("reads or queries only")),
        (103, "syslog", Refused),
        (104, "getgid", Inert("reads or queries only")),
        (
            105,
            "setuid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            106,
            "setgid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (107, "geteuid", Inert("reads or queries only")),
        (108, "getegid", Inert("reads or queries only")),
        (
            109,
            "setpgid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (110, "getppid", Inert("reads or queries only")),
        (111, "getpgrp", Inert("reads or queries only")),
        (
            112,
            "setsid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            113,
            "setreuid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            114,
            "setregid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (115, "getgroups", Inert("reads or queries only")),
        (
            116,
            "setgroups",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            117,
            "setresuid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (118, "getresuid", Inert("reads or queries only")),
        (
            119,
            "setresgid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (120, "getresgid", Inert("reads or queries only")),
        (121, "getpgid", Inert("reads or queries only")),
        (
            122,
            "setfsuid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            123,
            "setfsgid",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (124, "getsid", Inert("reads or queries only")),
        (125, "capget", Inert("reads or queries only")),
        (
            126,
            "capset",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (127, "rt_sigpending", Inert("reads or queries only")),
        (128, "rt_sigtimedwait", Inert("waits, sleeps or yields")),
        (129, "rt_sigqueueinfo", Captured(effect::SIGNAL)),
        (130, "rt_sigsuspend", Inert("waits, sleeps or yields")),
        (131, "sigaltstack", Inert("reads or queries only")),
        (132, "utime", Captured(effect::UTIME)),
        (133, "mknod", Captured(effect::MKNOD)),
        (134, "uselib", Refused),
        (
            135,
            "personality",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (136, "ustat", Inert("reads or queries only")),
        (137, "statfs", Inert("reads or queries only")),
        (138, "fstatfs", Inert("reads or queries only")),
        (139, "sysfs", Inert("reads or queries only")),
        (140, "getpriority", Inert("reads or queries only")),
        (
            141,
            "setpriority",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            142,
            "sched_setparam",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (143, "sched_getparam", Inert("reads or queries only")),
        (
            144,
            "sched_setscheduler",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (145, "sched_getscheduler", Inert("reads or queries only")),
        (
            146,
            "sched_get_priority_max",
            Inert("reads or queries only"),
        ),
        (
            147,
            "sched_get_priority_min",
            Inert("reads or queries only"),
        ),
        (148, "sched_rr_get_interval", Inert("reads or queries only")),
        (149, "mlock", Inert("the process's own memory")),
        (150, "munlock", Inert("the process's own memory")),
        (151, "mlockall", Inert("the process's own memory")),
        (152, "munlockall", Inert("the process's own memory")),
        (
            153,
            "vhangup",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (154, "modify_ldt", Refused),
        (155, "pivot_root", Refused),
        (156, "_sysctl", Absent),
        (
            157,
            "prctl",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (158, "arch_prctl", Inert("the process's own memory")),
        (159, "adjtimex", Refused),
        (
            160,
            "setrlimit",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            161,
            "chroot",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (
            162,
            "sync",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (163, "acct", Refused),
        (164, "settimeofday", Refused),
        (165, "mount", Refused),
        (166, "umount2", Refused),
        (167, "swapon", Refused),
        (168, "swapoff", Refused),
        (169, "reboot", Refused),
        (170, "sethostname", Refused),
        (171, "setdomainname", Refused),
        (172, "iopl", Refused),
        (173, "ioperm", Refused),
        (174, "create_module", Absent),
        (175, "init_module", Refused),
        (176, "delete_module", Refused),
        (177, "get_kernel_syms", Absent),
        (178, "query_module", Absent),
        (179, "quotactl", Refused),
        (180, "nfsservctl", Absent),
        (181, "getpmsg", Absent),
        (182, "putpmsg", Absent),
        (183, "afs_syscall", Absent),
        (184, "tuxcall", Absent),
        (185, "security", Absent),
        (186, "gettid", Inert("reads or queries only")),
        (
            187,
            "readahead",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (188, "setxattr", Captured(effect::XATTR)),
        (189, "lsetxattr", Captured(effect::XATTR)),
        (190, "fsetxattr", Captured(effect::XATTR)),
        (191, "getxattr", Inert("reads or queries only")),
        (192, "lgetxattr", Inert("reads or queries only")),
        (193, "fgetxattr", Inert("reads or queries only")),
        (194, "listxattr", Inert("reads or queries only")),
        (195, "llistxattr", Inert("reads or queries only")),
        (196, "flistxattr", Inert("reads or queries only")),
        (197, "removexattr", Captured(effect::XATTR)),
        (198, "lremovexattr", Captured(effect::XATTR)),
        (199, "fremovexattr", Captured(effect::XATTR)),
        (200, "tkill", Captured(effect::SIGNAL)),
        (201, "time", Inert("reads or queries only")),
        (202, "futex", Inert("waits, sleeps or yields")),
        (
            203,
            "sched_setaffinity",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (204, "sched_getaffinity", Inert("reads or queries only")),
        (205, "set_thread_area", Absent),
        (
            206,
            "io_setup",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            207,
            "io_destroy",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (208, "io_getevents", Inert("waits, sleeps or yields")),
        (
            209,
            "io_submit",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            210,
            "io_cancel",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (211, "get_thread_area", Absent),
        (212, "lookup_dcookie", Refused),
        (
            213,
            "epoll_create",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (214, "epoll_ctl_old", Absent),
        (215, "epoll_wait_old", Absent),
        (
            216,
            "remap_file_pages",
            ThroughFd("a shared writable mapping of an fd whose open for writing is recorded"),
        ),
        (217, "getdents64", Inert("reads or queries only")),
        (218, "set_tid_address", Inert("the process's own memory")),
        (219, "restart_syscall", Inert("waits, sleeps or yields")),
        (
            220,
            "semtimedop",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            221,
            "fadvise64",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (222, "timer_create", Inert("waits, sleeps or yields")),
        (223, "timer_settime", Inert("waits, sleeps or yields")),
        (224, "timer_gettime", Inert("reads or queries only")),
        (225, "timer_getoverrun", Inert("reads or queries only")),
        (226, "timer_delete", Inert("waits, sleeps or yields")),
        (227, "clock_settime", Refused),
        (228, "clock_gettime", Inert("reads or queries only")),
        (229, "clock_getres", Inert("reads or queries only")),
        (230, "clock_nanosleep", Inert("waits, sleeps or yields")),
        (231, "exit_group", Traced(effect::EXIT)),
        (232, "epoll_wait", Inert("reads or queries only")),
        (
            233,
            "epoll_ctl",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (234, "tgkill", Captured(effect::SIGNAL)),
        (235, "utimes", Captured(effect::UTIME)),
        (236, "vserver", Absent),
        (237, "mbind", Inert("the process's own memory")),
        (238, "set_mempolicy", Inert("the process's own memory")),
        (239, "get_mempolicy", Inert("reads or queries only")),
        (
            240,
            "mq_open",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            241,
            "mq_unlink",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            242,
            "mq_timedsend",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            243,
            "mq_timedreceive",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            244,
            "mq_notify",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (
            245,
            "mq_getsetattr",
            Inert("System V IPC and POSIX message queues of the sandbox's own IPC namespace"),
        ),
        (246, "kexec_load", Refused),
        (247, "waitid", Inert("waits, sleeps or yields")),
        (248, "add_key", Refused),
        (249, "request_key", Refused),
        (250, "keyctl", Refused),
        (
            251,
            "ioprio_set",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (252, "ioprio_get", Inert("reads or queries only")),
        (
            253,
            "inotify_init",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            254,
            "inotify_add_watch",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            255,
            "inotify_rm_watch",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (256, "migrate_pages", Inert("the process's own memory")),
        (257, "openat", Captured(effect::OPEN)),
        (258, "mkdirat", Captured(effect::MKDIR)),
        (259, "mknodat", Captured(effect::MKNOD)),
        (260, "fchownat", Captured(effect::CHOWN)),
        (261, "futimesat", Captured(effect::UTIME)),
        (262, "newfstatat", Inert("reads or queries only")),
        (263, "unlinkat", Captured(effect::UNLINK)),
        (264, "renameat", Captured(effect::RENAME)),
        (265, "linkat", Captured(effect::LINK)),
        (266, "symlinkat", Captured(effect::SYMLINK)),
        (267, "readlinkat", Inert("reads or queries only")),
        (268, "fchmodat", Captured(effect::CHMOD)),
        (269, "faccessat", Inert("reads or queries only")),
        (270, "pselect6", Inert("reads or queries only")),
        (271, "ppoll", Inert("reads or queries only")),
        (
            272,
            "unshare",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (273, "set_robust_list", Inert("the process's own memory")),
        (274, "get_robust_list", Inert("reads or queries only")),
        (
            275,
            "splice",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (
            276,
            "tee",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (
            277,
            "sync_file_range",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            278,
            "vmsplice",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (279, "move_pages", Inert("the process's own memory")),
        (280, "utimensat", Captured(effect::UTIME)),
        (281, "epoll_pwait", Inert("reads or queries only")),
        (
            282,
            "signalfd",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (283, "timerfd_create", Inert("waits, sleeps or yields")),
        (
            284,
            "eventfd",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            285,
            "fallocate",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (286, "timerfd_settime", Inert("waits, sleeps or yields")),
        (287, "timerfd_gettime", Inert("reads or queries only")),
        (
            288,
            "accept4",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            289,
            "signalfd4",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            290,
            "eventfd2",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            291,
            "epoll_create1",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            292,
            "dup3",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            293,
            "pipe2",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            294,
            "inotify_init1",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (295, "preadv", Inert("reads or queries only")),
        (
            296,
            "pwritev",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (297, "rt_tgsigqueueinfo", Captured(effect::SIGNAL)),
        (298, "perf_event_open", Refused),
        (299, "recvmmsg", Inert("reads or queries only")),
        (
            300,
            "fanotify_init",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            301,
            "fanotify_mark",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            302,
            "prlimit64",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (303, "name_to_handle_at", Refused),
        (304, "open_by_handle_at", Refused),
        (305, "clock_adjtime", Refused),
        (
            306,
            "syncfs",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (307, "sendmmsg", Captured(effect::SENDTO)),
        (308, "setns", Refused),
        (309, "getcpu", Inert("reads or queries only")),
        (310, "process_vm_readv", Refused),
        (311, "process_vm_writev", Refused),
        (312, "kcmp", Inert("reads or queries only")),
        (313, "finit_module", Refused),
        (
            314,
            "sched_setattr",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (315, "sched_getattr", Inert("reads or queries only")),
        (316, "renameat2", Captured(effect::RENAME)),
        (
            317,
            "seccomp",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (318, "getrandom", Inert("reads or queries only")),
        (
            319,
            "memfd_create",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (320, "kexec_file_load", Refused),
        (321, "bpf", Refused),
        (322, "execveat", Captured(effect::EXEC)),
        (323, "userfaultfd", Refused),
        (324, "membarrier", Inert("the process's own memory")),
        (325, "mlock2", Inert("the process's own memory")),
        (
            326,
            "copy_file_range",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (327, "preadv2", Inert("reads or queries only")),
        (
            328,
            "pwritev2",
            ThroughFd("writes through an fd whose open for writing (or connect) is recorded"),
        ),
        (329, "pkey_mprotect", Inert("the process's own memory")),
        (330, "pkey_alloc", Inert("the process's own memory")),
        (331, "pkey_free", Inert("the process's own memory")),
        (332, "statx", Inert("reads or queries only")),
        (333, "io_pgetevents", Inert("waits, sleeps or yields")),
        (334, "rseq", Inert("the process's own memory")),
        (424, "pidfd_send_signal", Captured(effect::SIGNAL)),
        (425, "io_uring_setup", Refused),
        (426, "io_uring_enter", Refused),
        (427, "io_uring_register", Refused),
        (428, "open_tree", Refused),
        (429, "move_mount", Refused),
        (430, "fsopen", Refused),
        (431, "fsconfig", Refused),
        (432, "fsmount", Refused),
        (433, "fspick", Refused),
        (
            434,
            "pidfd_open",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            435,
            "clone3",
            RefusedQuiet(
                "ENOSYS; glibc tries it before every thread and falls back to clone, whose process is a fork record",
            ),
        ),
        (
            436,
            "close_range",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (437, "openat2", Captured(effect::OPEN)),
        (438, "pidfd_getfd", Refused),
        (439, "faccessat2", Inert("reads or queries only")),
        (440, "process_madvise", Refused),
        (441, "epoll_pwait2", Inert("reads or queries only")),
        (442, "mount_setattr", Refused),
        (443, "quotactl_fd", Refused),
        (
            444,
            "landlock_create_ruleset",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            445,
            "landlock_add_rule",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (
            446,
            "landlock_restrict_self",
            Inert(
                "creates or manages fds of the caller only (pipes, events, epoll, inotify, sockets in the sandbox's network namespace)",
            ),
        ),
        (447, "memfd_secret", Inert("the process's own memory")),
        (
            448,
            "process_mrelease",
            Inert("only the agent's own processes (Landlock scopes tracing to them)"),
        ),
        (449, "futex_waitv", Inert("waits, sleeps or yields")),
        (
            450,
            "set_mempolicy_home_node",
            Inert("the process's own memory"),
        ),
        (451, "cachestat", Inert("reads or queries only")),
        (452, "fchmodat2", Captured(effect::CHMOD)),
        (453, "map_shadow_stack", Inert("the process's own memory")),
        (454, "futex_wake", Inert("waits, sleeps or yields")),
        (455, "futex_wait", Inert("waits, sleeps or yields")),
        (456, "futex_requeue", Inert("waits, sleeps or yields")),
        (457, "statmount", Inert("reads or queries only")),
        (458, "listmount", Inert("reads or queries only")),
        (459, "lsm_get_self_attr", Inert("reads or queries only")),
        (
            460,
            "lsm_set_self_attr",
            Inert(
                "the process's own attributes (no capabilities: ids, limits and scheduling stay within the sandbox)",
            ),
        ),
        (461, "lsm_list_modules", Inert("reads or queries only")),
        (462, "mseal", Inert("the process's own memory")),
        (463, "setxattrat", Captured(effect::XATTR)),
        (464, "getxattrat", Inert("reads or queries only")),
        (465, "listxattrat", Inert("reads or queries only")),
        (466, "removexattrat", Captured(effect::XATTR)),
        (467, "open_tree_attr", Refused),
        (468, "file_getattr", Inert("reads or queries only")),
        (469, "file_setattr", Captured(effect::SETFLAGS)),
    ]
};

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
