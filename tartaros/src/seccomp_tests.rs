use super::*;

fn opts(strict: bool, deny_unix: bool) -> SeccompOptions {
    SeccompOptions {
        strict,
        deny_unix,
        host_terminal: false,
    }
}

fn has(rules: &[Rule], text: &str) -> bool {
    rules.iter().any(|r| r.to_string() == text)
}

#[test]
fn constants_match_libc() {
    use libc as c;
    let pairs: [(Named, i64); 27] = [
        (CLONE_NEWTIME, c::CLONE_NEWTIME.into()),
        (CLONE_NEWNS, c::CLONE_NEWNS.into()),
        (CLONE_NEWCGROUP, c::CLONE_NEWCGROUP.into()),
        (CLONE_NEWUTS, c::CLONE_NEWUTS.into()),
        (CLONE_NEWIPC, c::CLONE_NEWIPC.into()),
        (CLONE_NEWUSER, c::CLONE_NEWUSER.into()),
        (CLONE_NEWPID, c::CLONE_NEWPID.into()),
        (CLONE_NEWNET, c::CLONE_NEWNET.into()),
        (TIOCSTI, c::TIOCSTI as i64),
        (TIOCSWINSZ, c::TIOCSWINSZ as i64),
        (FS_IOC_SETVERSION, c::FS_IOC_SETVERSION as i64),
        (FS_IOC32_SETVERSION, c::FS_IOC32_SETVERSION as i64),
        (AF_UNIX, c::AF_UNIX.into()),
        (AF_INET, c::AF_INET.into()),
        (AF_INET6, c::AF_INET6.into()),
        (AF_NETLINK, c::AF_NETLINK.into()),
        (NETLINK_ROUTE, c::NETLINK_ROUTE.into()),
        (NETLINK_SOCK_DIAG, c::NETLINK_SOCK_DIAG.into()),
        (NETLINK_GENERIC, c::NETLINK_GENERIC.into()),
        (SOCK_RAW, c::SOCK_RAW.into()),
        (MMAP_PAGE_ZERO, c::MMAP_PAGE_ZERO.into()),
        (READ_IMPLIES_EXEC, c::READ_IMPLIES_EXEC.into()),
        (PR_SET_MM, c::PR_SET_MM.into()),
        (S_ISUID, c::S_ISUID.into()),
        (S_ISGID, c::S_ISGID.into()),
        (F_SETLEASE, c::F_SETLEASE.into()),
        (POSIX_FADV_DONTNEED, c::POSIX_FADV_DONTNEED.into()),
    ];
    for (named, libc_value) in pairs {
        assert_eq!(i64::from(named.value), libc_value, "{}", named.name);
    }
    assert_eq!(i64::from(MFD_EXEC.value), i64::from(c::MFD_EXEC));
    assert_eq!(
        SOCK_TYPE_MASK & (c::SOCK_CLOEXEC | c::SOCK_NONBLOCK) as u32,
        0
    );
    assert_eq!(MAX_INSNS, c::BPF_MAXINSNS as usize);
    // linux/fcntl.h: F_LINUX_SPECIFIC_BASE (1024) + 12 and + 14; `libc`
    // lacks them.
    assert_eq!(F_SET_RW_HINT.value, c::F_SETLEASE as u32 + 12);
    assert_eq!(F_SET_FILE_RW_HINT.value, c::F_SETLEASE as u32 + 14);
}

#[test]
fn default_set_denies_what_breaks_the_walls() {
    let rules = rules(&SeccompOptions::default());
    #[rustfmt::skip]
    let always = [
        "process_vm_readv",
        "process_vm_writev",
        "bpf",
        "perf_event_open",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "mount_setattr",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "io_setup",
        "io_submit",
        "acct",
        "swapon",
        "swapoff",
        "reboot",
        "syslog",
        "quotactl",
        "open_by_handle_at",
        "name_to_handle_at",
        "lookup_dcookie",
        "settimeofday",
        "clock_settime",
        "adjtimex",
        "pidfd_getfd",
    ];
    for name in always {
        assert!(has(&rules, &format!("{name} -> EPERM")), "{name} missing");
    }
    for text in [
        "unshare if flags has CLONE_NEWUSER -> EPERM",
        "unshare if flags has CLONE_NEWTIME -> EPERM",
        "clone if flags has CLONE_NEWUSER -> EPERM",
        "clone if flags has CLONE_NEWNET -> EPERM",
        "ioctl if cmd == TIOCSTI -> EPERM",
        "ioctl if cmd == TIOCLINUX -> EPERM",
        "ioctl if cmd == FS_IOC_SETVERSION -> EPERM",
        "ioctl if cmd == FS_IOC32_SETVERSION -> EPERM",
        "socket if domain not in {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK} -> EPERM",
        "socket if domain == AF_INET and type & 0xf == SOCK_RAW -> EPERM",
        "socket if domain == AF_INET6 and type & 0xf == SOCK_RAW -> EPERM",
        "socket if domain == AF_NETLINK and protocol not in {NETLINK_ROUTE, NETLINK_SOCK_DIAG, NETLINK_GENERIC} -> EPERM",
        "clone3 -> ENOSYS",
        "fchmod if mode has S_ISUID -> EPERM",
        "fchmodat2 if mode has S_ISGID -> EPERM",
        "chmod if mode has S_ISUID -> EPERM",
        "fchmodat if mode has S_ISGID -> EPERM",
        "openat if mode has S_ISGID -> EPERM",
        "mknodat if mode has S_ISGID -> EPERM",
        "open if mode has S_ISGID -> EPERM",
        "creat if mode has S_ISGID -> EPERM",
        "openat if mode has S_ISUID -> EPERM",
        "mknodat if mode has S_ISUID -> EPERM",
        "mknod if mode has S_ISUID -> EPERM",
        "open if mode has S_ISUID -> EPERM",
        "creat if mode has S_ISUID -> EPERM",
        "openat2 -> ENOSYS",
    ] {
        assert!(has(&rules, text), "{text} missing");
    }
    // The exit signal shares CLONE_NEWTIME's bit in clone's flags.
    assert!(!has(&rules, "clone if flags has CLONE_NEWTIME -> EPERM"));
    assert!(
        !rules
            .iter()
            .any(|r| r.syscall == "socketpair" || r.syscall == "chroot")
    );
    assert!(
        rules
            .iter()
            .all(|r| r.tier == Tier::Default && !r.reason.is_empty())
    );
    assert!(
        rules
            .iter()
            .all(|r| r.errno == libc::EPERM || ["clone3", "openat2"].contains(&r.syscall))
    );
}

#[test]
fn options_only_add_rules() {
    let base = rules(&opts(false, false));
    let unix = rules(&opts(false, true));
    let strict = rules(&opts(true, false));
    let both = rules(&opts(true, true));
    for set in [&unix, &strict, &both] {
        assert!(base.iter().all(|r| set.contains(r)));
    }
    assert!(unix.iter().chain(&strict).all(|r| both.contains(r)));
    assert!(has(&unix, "socket if domain == AF_UNIX -> EPERM"));
    assert!(!unix.iter().any(|r| r.syscall == "socketpair"));
    assert!(!has(&strict, "socket if domain == AF_UNIX -> EPERM"));
    for text in [
        "ptrace -> EPERM",
        "chroot -> EPERM",
        "personality if persona not in {PER_LINUX, PERSONALITY_QUERY} -> EPERM",
        "memfd_create if flags has MFD_EXEC -> EPERM",
        "socket if domain == AF_NETLINK -> EPERM",
        "prctl if option == PR_SET_MM -> EPERM",
    ] {
        assert!(has(&strict, text) && !has(&base, text), "{text}");
    }
}

#[test]
fn every_rule_has_a_number_here() {
    for rule in rules(&opts(true, true)) {
        assert!(syscall_nr(rule.syscall).is_some(), "{}", rule.syscall);
    }
    assert_eq!(syscall_nr("no_such_call"), None);
    assert_eq!(syscall_nr("clone3"), Some(libc::SYS_clone3));
}

#[test]
fn program_builds_for_every_option_combination() {
    let (_, audit_arch, _) = arch().expect("supported test architecture");
    for (strict, deny_unix) in [(false, false), (false, true), (true, false), (true, true)] {
        let program = build_program(&opts(strict, deny_unix)).expect("program");
        assert!(program.len() < MAX_INSNS);
        assert_eq!(program[0], stmt(BPF_LD_W_ABS, DATA_ARCH));
        assert_eq!(program[1], jump(BPF_JMP_JEQ_K, audit_arch, 1, 0));
        assert_eq!(program[2], ret_errno(libc::EPERM));
    }
}

#[test]
fn install_refuses_a_bad_length_before_any_syscall() {
    assert!(matches!(
        install(&Vec::new()),
        Err(SeccompError::BadLength(0))
    ));
    let long = vec![ret_errno(libc::EPERM); MAX_INSNS + 1];
    assert!(matches!(install(&long), Err(SeccompError::BadLength(_))));
}

#[test]
fn the_capture_records_every_call_refused_for_its_arguments_or_in_some_runs() {
    use tartaros_common::capture::refused_sometimes;
    // Every call some rule refuses, but those refused in every run
    // (`nr::is_refused`) and the terminal ioctls.
    let conditional: std::collections::BTreeSet<&str> = rules(&opts(true, true))
        .into_iter()
        .filter(|r| (!r.when.is_empty() || r.tier != Tier::Default) && r.syscall != "ioctl")
        .map(|r| r.syscall)
        .collect();
    for name in &conditional {
        let nr = syscall_nr(name).expect("a number") as u32;
        assert!(
            refused_sometimes::contains(nr),
            "{name} ({nr}) is not recorded"
        );
    }
    let listed = (0..512)
        .filter(|nr| refused_sometimes::contains(*nr))
        .count();
    assert_eq!(listed, conditional.len(), "{conditional:?}");
}

#[test]
fn refusing_rule_tells_the_filter_s_refusals_from_the_kernel_s() {
    let ns = u64::from(CLONE_NEWUSER.value | CLONE_NEWNS.value);
    assert!(refusing_rule("unshare", &[ns, 0, 0]).is_some());
    assert!(
        refusing_rule("unshare", &[0x400, 0, 0]).is_none(),
        "CLONE_FILES"
    );
    assert!(refusing_rule("socket", &[17, 3, 0]).is_some(), "AF_PACKET");
    assert!(
        refusing_rule("socket", &[2, 0x8_0003, 1]).is_some(),
        "raw IPv4"
    );
    assert!(refusing_rule("socket", &[2, 2, 0]).is_none(), "UDP");
    assert!(refusing_rule("socket", &[16, 2, 15]).is_some(), "uevents");
    assert!(refusing_rule("prlimit64", &[0, 4, 0x7fff_0000_0000]).is_some());
    assert!(
        refusing_rule("prlimit64", &[0, 4, 0]).is_none(),
        "a read of the limit"
    );
    assert!(
        refusing_rule("prlimit64", &[0, 7, 0x7fff_0000_0000]).is_none(),
        "NOFILE"
    );
    // Another process's limit (round 23b: RLIMIT_CPU 0 on the init); the
    // caller's own (0, what glibc passes) and reads stay allowed.
    let other = refusing_rule("prlimit64", &[1, 0, 0x7fff_0000_0000]).expect("pid 1");
    assert_eq!(other.tier, Tier::Default, "proof the filter refused");
    let text = "prlimit64 if pid != 0 and new_limit != NULL -> EPERM";
    assert!(has(&rules(&SeccompOptions::default()), text), "{text}");
    assert!(refusing_rule("prlimit64", &[1, 0, 0]).is_none(), "a read");
    assert!(
        refusing_rule("prlimit64", &[0x1_0000_0000, 0, 0x7fff_0000_0000]).is_none(),
        "the kernel's pid_t is the low half: 0, the caller"
    );
    assert!(
        refusing_rule("personality", &[0xffff_ffff, 0, 0]).is_none(),
        "the query"
    );
    let ptrace = refusing_rule("ptrace", &[0, 0, 0]).expect("strict refuses every ptrace");
    assert_eq!(ptrace.tier, Tier::Strict, "not proof the filter refused");
}

#[test]
fn the_window_size_is_refused_only_where_the_launchers_terminal_is_handed_over() {
    let text = "ioctl if cmd == TIOCSWINSZ -> EPERM";
    assert!(!has(&rules(&opts(true, true)), text));
    let handed = SeccompOptions {
        host_terminal: true,
        ..opts(false, false)
    };
    let rules = rules(&handed);
    let rule = rules.iter().find(|r| r.to_string() == text).expect(text);
    assert_eq!(rule.tier, Tier::HostTerminal);
    // Not a proof the filter refused: other runs allow it.
    let found = refusing_rule("ioctl", &[0, 0x1_0000_5414, 0]).expect("upper bits");
    assert_ne!(found.tier, Tier::Default);
}

#[test]
fn the_capture_records_exactly_the_ioctls_every_run_refuses() {
    use tartaros_common::capture::ioctl;
    for (cmd, _) in REFUSED_IOCTLS {
        let cmd = u64::from(cmd.value);
        assert!(ioctl::refused(cmd), "{cmd:#x} is refused but not recorded");
        assert!(
            ioctl::refused(cmd | 0xffff_ffff_0000_0000),
            "{cmd:#x} upper bits"
        );
    }
    assert!(!ioctl::refused(u64::from(TIOCSWINSZ.value)));
    assert!(!ioctl::refused(ioctl::FS_IOC_SETFLAGS));
}

/// `_IOC(dir, 'f', nr, size)` as the uapi headers compute it.
fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (u32::from(b'f') << 8) | nr
}

#[test]
fn the_state_changing_fs_ioctls_are_the_uapi_encodings() {
    const W: u32 = 1;
    const R: u32 = 2;
    // Struct sizes from linux/fscrypt.h and linux/fsverity.h: fixed-size
    // fields only, so the 32-bit ABI encodes the same commands.
    let key_spec = 4 + 4 + 32;
    let add_key_arg = key_spec + 4 + 4 + 8 * 4;
    let remove_key_arg = key_spec + 4 + 5 * 4;
    let policy_v1 = 1 + 1 + 1 + 1 + 8;
    let enable_arg = 4 * 4 + 8 + 4 + 4 + 8 + 11 * 8;
    assert_eq!(
        tables::FS_IOC_SET_ENCRYPTION_POLICY.value,
        ioc(R, 19, policy_v1)
    );
    assert_eq!(tables::FS_IOC_GET_ENCRYPTION_PWSALT.value, ioc(W, 20, 16));
    assert_eq!(
        tables::FS_IOC_ADD_ENCRYPTION_KEY.value,
        ioc(R | W, 23, add_key_arg)
    );
    assert_eq!(
        tables::FS_IOC_REMOVE_ENCRYPTION_KEY.value,
        ioc(R | W, 24, remove_key_arg)
    );
    assert_eq!(
        tables::FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS.value,
        ioc(R | W, 25, remove_key_arg)
    );
    assert_eq!(tables::FS_IOC_ENABLE_VERITY.value, ioc(W, 133, enable_arg));
}

#[test]
fn fscrypt_and_verity_changes_are_refused_and_their_queries_allowed() {
    let rules = rules(&SeccompOptions::default());
    for name in [
        "FS_IOC_ADD_ENCRYPTION_KEY",
        "FS_IOC_REMOVE_ENCRYPTION_KEY",
        "FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS",
        "FS_IOC_SET_ENCRYPTION_POLICY",
        "FS_IOC_GET_ENCRYPTION_PWSALT",
        "FS_IOC_ENABLE_VERITY",
    ] {
        let text = format!("ioctl if cmd == {name} -> EPERM");
        let rule = rules.iter().find(|r| r.to_string() == text).expect(&text);
        assert_eq!(rule.tier, Tier::Default, "{text}");
    }
    // Upper bits set: the kernel reads the low 32.
    let add = 0xffff_ffff_0000_0000 | u64::from(tables::FS_IOC_ADD_ENCRYPTION_KEY.value);
    assert!(refusing_rule("ioctl", &[3, add, 0]).is_some());
    // Read-only queries: get policy (v1, ex), key status, nonce, measure
    // and read verity metadata.
    for query in [
        ioc(1, 21, 12),
        ioc(3, 22, 9),
        ioc(3, 26, 128),
        ioc(2, 27, 16),
        ioc(3, 134, 4),
        ioc(3, 135, 40),
    ] {
        assert!(
            refusing_rule("ioctl", &[3, u64::from(query), 0]).is_none(),
            "{query:#x}"
        );
        assert!(!tartaros_common::capture::ioctl::refused(u64::from(query)));
    }
}

#[test]
fn the_capture_names_every_refused_ioctl_as_the_filter_does() {
    use tartaros_common::capture::ioctl;
    let filter: Vec<(u64, &str)> = REFUSED_IOCTLS
        .iter()
        .map(|(cmd, _)| (u64::from(cmd.value), cmd.name))
        .collect();
    assert_eq!(filter, ioctl::REFUSED.to_vec());
    for (cmd, name) in ioctl::REFUSED {
        assert!(ioctl::refused(cmd), "{name}");
        assert_eq!(ioctl::refused_name(cmd | 0x7_0000_0000), Some(name));
    }
    assert_eq!(ioctl::refused_name(ioctl::FS_IOC_SETFLAGS), None);
}

#[test]
fn host_inode_state_is_refused_and_ordinary_fcntl_and_advice_allowed() {
    let rules = rules(&SeccompOptions::default());
    for text in [
        "fcntl if cmd == F_SETLEASE -> EPERM",
        "fcntl if cmd == F_SET_RW_HINT -> EPERM",
        "fcntl if cmd == F_SET_FILE_RW_HINT -> EPERM",
        "fadvise64 if advice == POSIX_FADV_DONTNEED -> EPERM",
        "madvise if advice == MADV_COLD -> EPERM",
        "madvise if advice == MADV_PAGEOUT -> EPERM",
    ] {
        let rule = rules.iter().find(|r| r.to_string() == text).expect(text);
        assert_eq!(rule.tier, Tier::Default, "{text}");
    }
    for cmd in [1024, 1036, 1038, 0xffff_ffff_0000_0400] {
        let rule = refusing_rule("fcntl", &[3, cmd, 0]).expect("refused");
        assert_eq!(rule.tier, Tier::Default);
    }
    // F_GETFL, F_SETFD, F_SETLK, F_SETLKW, F_OFD_SETLK, F_GETLEASE,
    // F_GET_RW_HINT, F_SETPIPE_SZ, F_ADD_SEALS.
    for cmd in [3, 2, 6, 7, 37, 1025, 1035, 1031, 1033] {
        assert!(refusing_rule("fcntl", &[3, cmd, 0]).is_none(), "{cmd}");
    }
    // The advice is the fourth argument (fd, offset, len, advice).
    assert!(refusing_rule("fadvise64", &[3, 0, 0, 4]).is_some());
    for advice in [0, 1, 2, 3, 5] {
        assert!(refusing_rule("fadvise64", &[3, 0, 0, advice]).is_none());
    }
    assert!(
        refusing_rule("fadvise64", &[3, 0, 4]).is_none(),
        "no fourth register kept: no proof"
    );
    // madvise(addr, len, advice): the allocators' advice stays (DONTNEED,
    // FREE, HUGEPAGE, WILLNEED...).
    for advice in [20, 21] {
        assert!(refusing_rule("madvise", &[0x7000, 4096, advice]).is_some());
    }
    for advice in [0, 1, 2, 3, 4, 8, 9, 14, 15, 22, 23] {
        assert!(
            refusing_rule("madvise", &[0x7000, 4096, advice]).is_none(),
            "{advice}"
        );
    }
}
