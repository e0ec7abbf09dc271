//! The seccomp filter, checked twice:
//! - pure: a small classic-BPF interpreter runs the compiled program on
//!   synthetic `seccomp_data` (every rule, the compat/x32 head, the controls);
//! - kernel: a python3 helper started under the installed filter attempts each
//!   denied call (and controls that must keep working) in a forked child and
//!   reports the errno; the same helper without the filter is the baseline.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use seccompiler::{BpfProgram, sock_filter};
use tartaros::seccomp::{ArgTest, Rule, SeccompOptions, build_program, install, rules};

const EPERM: i32 = libc::EPERM;
const ENOSYS: i32 = libc::ENOSYS;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;

fn all_options() -> [SeccompOptions; 8] {
    let mut all = [SeccompOptions::default(); 8];
    for (i, opts) in all.iter_mut().enumerate() {
        *opts = SeccompOptions {
            strict: i & 1 != 0,
            deny_unix: i & 2 != 0,
            host_terminal: i & 4 != 0,
        };
    }
    all
}

// ---------------------------------------------------------------- pure ---

/// Runs a seccomp classic-BPF program like the kernel does (only the
/// instructions seccompiler and our prologue emit).
fn run(prog: &[sock_filter], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
    let word = |off: u32| -> u32 {
        match off {
            0 => nr as u32,
            4 => arch,
            o if (16..64).contains(&o) && o % 4 == 0 => {
                let a = args[(o as usize - 16) / 8];
                if o % 8 == 0 {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            o => panic!("load from offset {o}"),
        }
    };
    let (mut acc, mut pc) = (0u32, 0usize);
    loop {
        let i = &prog[pc];
        let taken = |c: bool| 1 + usize::from(if c { i.jt } else { i.jf });
        pc += match i.code {
            0x20 => {
                acc = word(i.k);
                1
            }
            0x54 => {
                acc &= i.k;
                1
            }
            0x05 => 1 + i.k as usize,
            0x15 => taken(acc == i.k),
            0x25 => taken(acc > i.k),
            0x35 => taken(acc >= i.k),
            0x45 => taken(acc & i.k != 0),
            0x06 => return i.k,
            code => panic!("unexpected opcode {code:#x} at {pc}"),
        };
    }
}

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}

fn native(prog: &[sock_filter], nr: i64, args: [u64; 6]) -> u32 {
    run(prog, nr, AUDIT_ARCH_X86_64, args)
}

/// Arguments for which every condition of `rule` holds.
fn matching_args(rule: &Rule) -> [u64; 6] {
    let mut args = [0u64; 6];
    for c in &rule.when {
        let a = &mut args[usize::from(c.index)];
        match &c.test {
            ArgTest::Eq(v) => *a = v.value.into(),
            ArgTest::HasBits(v) => *a |= u64::from(v.value),
            ArgTest::MaskedEq { mask, value } => {
                *a = (*a & !u64::from(*mask)) | u64::from(value.value)
            }
            ArgTest::Ne(v) if *a == u64::from(v.value) => *a ^= 0x7000_0000,
            ArgTest::NotIn(vs) if vs.iter().any(|v| *a == u64::from(v.value)) => *a = 0x7777,
            // A pointer whose low half is zero is still not NULL.
            ArgTest::NotNull => *a = 0x7f00_0000_0000,
            _ => {}
        }
    }
    args
}

#[cfg(target_arch = "x86_64")]
#[test]
fn every_rule_is_enforced_by_the_program() {
    for opts in all_options() {
        let prog = build_program(&opts).expect("program");
        for rule in rules(&opts) {
            let nr = nr_of(rule.syscall).expect("number");
            let args = matching_args(&rule);
            // The kernel compares only what it uses: upper halves of int
            // arguments must not matter.
            let high = args.map(|a| a | 0xdead_beef_0000_0000);
            for a in [args, high] {
                assert_eq!(
                    native(&prog, nr, a),
                    errno(rule.errno),
                    "{rule} {a:x?} {opts:?}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn compat_and_x32_entries_are_refused_with_eperm() {
    for opts in all_options() {
        let prog = build_program(&opts).expect("program");
        for nr in [0, 20, 39, 120] {
            assert_eq!(run(&prog, nr, AUDIT_ARCH_I386, [0; 6]), errno(EPERM));
            assert_eq!(run(&prog, nr, 0xc000_00b7, [0; 6]), errno(EPERM));
            assert_eq!(native(&prog, nr | 0x4000_0000, [0; 6]), errno(EPERM));
        }
        assert_eq!(native(&prog, -1, [0; 6]), errno(EPERM));
        assert_eq!(native(&prog, libc::SYS_clone3, [0; 6]), errno(ENOSYS));
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn everyday_calls_are_allowed_under_every_option() {
    use libc::*;
    let thread = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    let thread = thread | CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID;
    let calls: &[(i64, [u64; 6])] = &[
        (SYS_read, [0; 6]),
        (SYS_openat, [0; 6]),
        // Ordinary chmods; setuid/setgid are refused.
        (SYS_fchmodat, [0, 0, 0o1777, 0, 0, 0]),
        (SYS_fchmod, [0, 0o755, 0, 0, 0, 0]),
        (SYS_execve, [0; 6]),
        (SYS_clone, [SIGCHLD as u64, 0, 0, 0, 0, 0]),
        (SYS_clone, [thread as u64, 0, 0, 0, 0, 0]),
        (
            SYS_clone,
            [(CLONE_VM | CLONE_VFORK | SIGCHLD) as u64, 0, 0, 0, 0, 0],
        ),
        (SYS_unshare, [CLONE_FILES as u64, 0, 0, 0, 0, 0]),
        (
            SYS_socket,
            [
                AF_INET as u64,
                (SOCK_STREAM | SOCK_CLOEXEC) as u64,
                0,
                0,
                0,
                0,
            ],
        ),
        (SYS_socket, [AF_INET6 as u64, SOCK_DGRAM as u64, 0, 0, 0, 0]),
        (
            SYS_socket,
            [
                AF_INET as u64,
                SOCK_DGRAM as u64,
                IPPROTO_ICMP as u64,
                0,
                0,
                0,
            ],
        ),
        (SYS_ioctl, [1, TCGETS, 0, 0, 0, 0]),
        (SYS_ioctl, [1, TIOCGWINSZ, 0, 0, 0, 0]),
        (SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]),
        (SYS_memfd_create, [0, MFD_CLOEXEC as u64, 0, 0, 0, 0]),
        (SYS_prctl, [PR_SET_NAME as u64, 0, 0, 0, 0, 0]),
        (SYS_seccomp, [0; 6]),
        (SYS_landlock_restrict_self, [0; 6]),
        // Locks and queries; DONTNEED's value in the length, not the advice.
        (SYS_fcntl, [3, F_SETLKW as u64, 0, 0, 0, 0]),
        (SYS_fcntl, [3, F_GETLEASE as u64, 0, 0, 0, 0]),
        (SYS_fadvise64, [3, 0, 0, POSIX_FADV_SEQUENTIAL as u64, 0, 0]),
        (SYS_fadvise64, [3, 0, 4, 0, 0, 0]),
        // The allocators' advice; PAGEOUT's value in the length.
        (SYS_madvise, [0x7000, 4096, MADV_DONTNEED as u64, 0, 0, 0]),
        (SYS_madvise, [0x7000, 4096, MADV_FREE as u64, 0, 0, 0]),
        (SYS_madvise, [0x7000, 21, MADV_HUGEPAGE as u64, 0, 0, 0]),
    ];
    for opts in all_options() {
        let prog = build_program(&opts).expect("program");
        for (nr, args) in calls {
            assert_eq!(native(&prog, *nr, *args), ALLOW, "{nr} {args:x?} {opts:?}");
        }
        let unix = [AF_UNIX as u64, SOCK_STREAM as u64, 0, 0, 0, 0];
        let expect = if opts.deny_unix { errno(EPERM) } else { ALLOW };
        assert_eq!(native(&prog, SYS_socket, unix), expect);
        // Anonymous pairs reach nothing outside and stay allowed.
        assert_eq!(native(&prog, SYS_socketpair, unix), ALLOW);
        // The launcher's terminal's size: refused only where it is handed over.
        let winsz = [0, libc::TIOCSWINSZ, 0, 0, 0, 0];
        let expect = if opts.host_terminal {
            errno(EPERM)
        } else {
            ALLOW
        };
        assert_eq!(native(&prog, SYS_ioctl, winsz), expect, "{opts:?}");
        // Allowed by default, refused under strict.
        let expect = if opts.strict { errno(EPERM) } else { ALLOW };
        let netlink = [
            AF_NETLINK as u64,
            (SOCK_RAW | SOCK_CLOEXEC) as u64,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(native(&prog, SYS_socket, netlink), expect);
        assert_eq!(
            native(&prog, SYS_ptrace, [PTRACE_TRACEME as u64, 0, 0, 0, 0, 0]),
            expect
        );
        let no_aslr = [ADDR_NO_RANDOMIZE as u64, 0, 0, 0, 0, 0];
        assert_eq!(native(&prog, SYS_personality, no_aslr), expect);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn argument_tricks_do_not_slip_through() {
    let prog = build_program(&SeccompOptions::default()).expect("program");
    let deny = errno(EPERM);
    // ioctl's cmd is an unsigned int: upper bits are dropped by the kernel.
    assert_eq!(
        native(&prog, libc::SYS_ioctl, [0, 0x1_0000_5412, 0, 0, 0, 0]),
        deny
    );
    // AF_PACKET with upper bits set is still AF_PACKET for the kernel.
    let packet = [0xffff_ffff_0000_0011, 3, 0, 0, 0, 0];
    assert_eq!(native(&prog, libc::SYS_socket, packet), deny);
    // SOCK_RAW hidden behind SOCK_NONBLOCK | SOCK_CLOEXEC.
    let raw = [
        2,
        (3 | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64,
        0,
        0,
        0,
        0,
    ];
    assert_eq!(native(&prog, libc::SYS_socket, raw), deny);
    // The legacy (AF_INET, SOCK_PACKET) spelling of a packet socket.
    assert_eq!(native(&prog, libc::SYS_socket, [2, 10, 0, 0, 0, 0]), deny);
    // Namespace flags mixed with ordinary clone flags.
    let flags = (libc::CLONE_NEWUSER | libc::CLONE_VM | libc::SIGCHLD) as u64;
    assert_eq!(native(&prog, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), deny);
}

fn nr_of(name: &str) -> Option<i64> {
    probe_numbers()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, nr)| nr)
}

/// Names and numbers handed to the python helper (and used above).
fn probe_numbers() -> Vec<(&'static str, i64)> {
    // Each `SYS_x` constant is handed over as `x`.
    macro_rules! numbers {
        ($($id:ident)*) => { vec![$((&stringify!($id)[4..], libc::$id)),*] };
    }
    let mut v = numbers! {
        SYS_ptrace SYS_process_vm_readv SYS_process_vm_writev SYS_process_madvise
        SYS_pidfd_getfd SYS_bpf SYS_perf_event_open SYS_kexec_load SYS_kexec_file_load
        SYS_init_module SYS_finit_module SYS_delete_module SYS_mount SYS_umount2
        SYS_pivot_root SYS_move_mount SYS_open_tree SYS_fsopen SYS_fsmount SYS_fsconfig
        SYS_fspick SYS_mount_setattr SYS_setns SYS_unshare SYS_clone SYS_clone3 SYS_keyctl
        SYS_add_key SYS_request_key SYS_userfaultfd SYS_ioctl SYS_io_setup SYS_io_submit SYS_io_uring_setup
        SYS_io_uring_enter SYS_io_uring_register SYS_socket SYS_socketpair SYS_acct
        SYS_swapon SYS_swapoff SYS_reboot SYS_syslog SYS_quotactl SYS_quotactl_fd
        SYS_open_by_handle_at SYS_name_to_handle_at SYS_lookup_dcookie SYS_personality
        SYS_settimeofday SYS_clock_settime SYS_clock_adjtime SYS_adjtimex SYS_sethostname
        SYS_setdomainname SYS_chroot SYS_memfd_create SYS_prctl SYS_fanotify_init SYS_kcmp
        SYS_migrate_pages SYS_move_pages SYS_setrlimit SYS_prlimit64 SYS_getpid
        SYS_fchmod SYS_fchmodat SYS_openat SYS_mknodat SYS_openat2 SYS_fcntl SYS_fadvise64
        SYS_madvise
    };
    #[cfg(target_arch = "x86_64")]
    v.extend(numbers! { SYS_iopl SYS_ioperm SYS_modify_ldt SYS_uselib SYS_chmod SYS_open SYS_creat SYS_mknod });
    // Linux 6.6, not in `libc` on every architecture.
    v.push(("fchmodat2", 452));
    // Linux 6.15, not yet in `libc`.
    v.push(("open_tree_attr", 467));
    v
}

// -------------------------------------------------------------- kernel ---

/// Probes whose syscall is allowed under every option: the filtered result
/// must equal the unfiltered one.
// The probe lists below read as tables; rustfmt would put one name per line.
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    "unshare_files", "clone_plain", "ioctl_tcgets", "socket_inet_stream", "socket_inet6_dgram",
    "socketpair_unix", "personality_query", "memfd_cloexec", "prctl_set_name", "fork", "threads",
    "posix_spawn", "exec_true", "exec_sh_pipeline", "exec_git", "exec_python",
    "exec_python_asyncio", "exec_cargo", "exec_node", "openat_plain_create",
];
/// Probes that must succeed (0) without the filter, or the controls prove nothing.
#[rustfmt::skip]
const MUST_SUCCEED: &[&str] = &[
    "unshare_files", "clone_plain", "ioctl_tcgets", "socket_inet_stream", "personality_query",
    "memfd_cloexec", "prctl_set_name", "fork", "threads", "posix_spawn", "exec_true",
    "exec_sh_pipeline", "exec_git", "exec_python", "exec_python_asyncio", "ptrace_traceme",
    "socket_unix", "socketpair_unix", "socket_netlink", "personality_no_random",
];
#[rustfmt::skip]
const STRICT_ONLY: &[&str] = &[
    "ptrace_traceme", "ptrace_attach", "ptrace_seize", "personality_no_random", "memfd_exec",
    "socket_netlink", "prctl_set_mm", "chroot", "fanotify_init", "kcmp", "migrate_pages", "move_pages",
];
const DENY_UNIX_ONLY: &[&str] = &["socket_unix"];
/// Denied probes that, run as root without the filter, do not fail with the
/// filter's errno on any sane host: they prove the errno came from the filter.
#[rustfmt::skip]
const DISCRIMINATING: &[&str] = &[
    "process_vm_readv", "mount", "umount2", "pivot_root",
    "unshare_newuser", "unshare_newns", "clone_newuser", "clone_newnet", "clone3", "keyctl",
    "request_key", "setns", "socket_packet", "socket_packet_high", "socket_inet_raw",
    "socket_inet_raw_flags", "socket_inet_packet", "ioctl_tiocsti", "ioctl_tiocsti_high",
    "ioctl_tioclinux", "syslog", "reboot", "x32_getpid", "compat_int80", "personality_page_zero",
    "sethostname", "adjtimex", "acct", "openat2", "openat_setgid", "mknodat_setgid",
    "openat_setuid", "mknodat_setuid",
];

/// The errno `name` must fail with under `opts`, or `None` when the
/// filtered result must equal the baseline. Unknown names are denied.
fn denial(name: &str, opts: &SeccompOptions) -> Option<i32> {
    // The helper does not try the x86-only probes elsewhere.
    let x86_only =
        cfg!(not(target_arch = "x86_64")) && ["x32_getpid", "compat_int80"].contains(&name);
    if name == "clone3" || name == "openat2" {
        Some(ENOSYS)
    } else if ALLOWED.contains(&name) || x86_only {
        None
    } else if STRICT_ONLY.contains(&name) {
        opts.strict.then_some(EPERM)
    } else if DENY_UNIX_ONLY.contains(&name) {
        opts.deny_unix.then_some(EPERM)
    } else {
        Some(EPERM)
    }
}

const HELPER: &str = r#"
import ctypes, mmap, os, shutil, subprocess, sys, threading, time

NR = {k: int(v) for k, v in (kv.split("=") for kv in os.environ["TT_NR"].split())}
TARGET = int(os.environ["TT_TARGET"])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NOPE = b"/nonexistent-tartaros-probe"

def conv(x):
    if isinstance(x, int):
        return ctypes.c_long(x)
    if isinstance(x, bytes):
        return ctypes.c_char_p(x)
    return x

def raw(nr, *a):
    ctypes.set_errno(0)
    return libc.syscall(ctypes.c_long(nr), *map(conv, a))

def sc(name, *a):
    return 0 if raw(NR[name], *a) >= 0 else ctypes.get_errno()

def clone(flags):
    r = raw(NR["clone"], flags | 17, 0, 0, 0, 0)  # 17: SIGCHLD
    if r == 0:
        os._exit(0)
    if r < 0:
        return ctypes.get_errno()
    os.waitpid(r, 0)
    return 0

def pty_ioctl(cmd, arg):
    _, slave = os.openpty()
    return sc("ioctl", slave, cmd, arg)

def int80():
    # mov eax, 20 (i386 getpid); int 0x80; ret
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    r = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
    return 0 if r >= 0 else -r

def run(*argv):
    quiet = subprocess.DEVNULL
    return subprocess.run(argv, stdin=quiet, stdout=quiet, stderr=quiet).returncode

def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    return 0

def spawn():
    pid = os.posix_spawn("/bin/true", ["true"], {})
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

ASYNCIO = "import asyncio; asyncio.run(asyncio.create_subprocess_exec('true'))"
buf = lambda n=256: ctypes.create_string_buffer(n)
now = int(time.time())
X86 = os.uname().machine == "x86_64"
PROBES = [
    ("ptrace_attach", lambda: sc("ptrace", 16, TARGET, 0, 0)),
    ("ptrace_seize", lambda: sc("ptrace", 0x4206, TARGET, 0, 0)),
    ("ptrace_traceme", lambda: sc("ptrace", 0, 0, 0, 0)),
    ("process_vm_readv", lambda: sc("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0)),
    ("process_vm_writev", lambda: sc("process_vm_writev", os.getpid(), 0, 0, 0, 0, 0)),
    ("process_madvise", lambda: sc("process_madvise", -1, 0, 0, 0, 0)),
    ("pidfd_getfd", lambda: sc("pidfd_getfd", -1, 0, 0)),
    ("bpf", lambda: sc("bpf", 0, 0, 0)),
    ("perf_event_open", lambda: sc("perf_event_open", 0, 0, -1, -1, 0)),
    ("kexec_load", lambda: sc("kexec_load", 0, 1, 0, 0xDEAD0000)),
    ("kexec_file_load", lambda: sc("kexec_file_load", -1, -1, 0, 0, 0x80000000)),
    ("init_module", lambda: sc("init_module", 0, 0, b"")),
    ("finit_module", lambda: sc("finit_module", -1, b"", 0)),
    ("delete_module", lambda: sc("delete_module", b"tartaros_no_such_module", 0o4000)),
    ("mount", lambda: sc("mount", b"none", NOPE, b"tmpfs", 0, 0)),
    ("umount2", lambda: sc("umount2", NOPE, 0)),
    ("pivot_root", lambda: sc("pivot_root", NOPE, NOPE)),
    ("move_mount", lambda: sc("move_mount", -1, b"", -1, b"", 0)),
    ("open_tree", lambda: sc("open_tree", -100, NOPE, 0)),
    ("open_tree_attr", lambda: sc("open_tree_attr", -100, NOPE, 0, 0, 0)),
    ("fsopen", lambda: sc("fsopen", b"tartaros_nofs", 0)),
    ("fsmount", lambda: sc("fsmount", -1, 0, 0)),
    ("fsconfig", lambda: sc("fsconfig", -1, 0, 0, 0, 0)),
    ("fspick", lambda: sc("fspick", -100, NOPE, 0)),
    ("mount_setattr", lambda: sc("mount_setattr", -100, NOPE, 0, 0, 0)),
    ("setns", lambda: sc("setns", -1, 0)),
    ("unshare_newns", lambda: sc("unshare", 0x00020000)),
    ("unshare_newcgroup", lambda: sc("unshare", 0x02000000)),
    ("unshare_newuts", lambda: sc("unshare", 0x04000000)),
    ("unshare_newipc", lambda: sc("unshare", 0x08000000)),
    ("unshare_newuser", lambda: sc("unshare", 0x10000000)),
    ("unshare_newpid", lambda: sc("unshare", 0x20000000)),
    ("unshare_newnet", lambda: sc("unshare", 0x40000000)),
    ("unshare_newtime", lambda: sc("unshare", 0x00000080)),
    ("unshare_files", lambda: sc("unshare", 0x400)),
    ("clone_newuser", lambda: clone(0x10000000)),
    ("clone_newnet", lambda: clone(0x40000000)),
    ("clone_newpid", lambda: clone(0x20000000)),
    ("clone_newns", lambda: clone(0x00020000)),
    ("clone_plain", lambda: clone(0)),
    ("clone3", lambda: sc("clone3", 0, 0)),
    ("openat2", lambda: sc("openat2", -100, NOPE, 0, 0)),
    ("openat_setgid", lambda: sc("openat", -100, NOPE + b"/x", 0o100 | 0o1, 0o2745)),
    ("mknodat_setgid", lambda: sc("mknodat", -100, NOPE + b"/x", 0o102745, 0)),
    ("openat_setuid", lambda: sc("openat", -100, NOPE + b"/x", 0o100 | 0o1, 0o4755)),
    ("mknodat_setuid", lambda: sc("mknodat", -100, NOPE + b"/x", 0o104755, 0)),
    ("openat_plain_create", lambda: sc("openat", -100, NOPE + b"/x", 0o100 | 0o1, 0o745)),
    ("keyctl", lambda: sc("keyctl", 0, -3, 0)),
    ("add_key", lambda: sc("add_key", b"tartaros_no_type", b"x", 0, 0, -2)),
    ("request_key", lambda: sc("request_key", b"user", b"tartaros:none", 0, 0)),
    ("userfaultfd", lambda: sc("userfaultfd", 0)),
    ("io_uring_setup", lambda: sc("io_uring_setup", 1, 0)),
    ("io_uring_enter", lambda: sc("io_uring_enter", -1, 0, 0, 0, 0, 0)),
    ("io_uring_register", lambda: sc("io_uring_register", -1, 0, 0, 0)),
    ("io_setup", lambda: sc("io_setup", 0, 0)),
    ("io_submit", lambda: sc("io_submit", 0, 0, 0)),
    ("ioctl_tiocsti", lambda: pty_ioctl(0x5412, b"x")),
    ("ioctl_tiocsti_high", lambda: pty_ioctl(0x1_0000_5412, b"x")),
    ("ioctl_tioclinux", lambda: pty_ioctl(0x541C, buf())),
    ("ioctl_tiocsetd", lambda: pty_ioctl(0x5423, ctypes.byref(ctypes.c_int(0)))),
    ("ioctl_tcgets", lambda: pty_ioctl(0x5401, buf())),
    ("socket_packet", lambda: sc("socket", 17, 3, 0)),
    ("socket_packet_high", lambda: sc("socket", 0x1_0000_0011, 3, 0)),
    ("socket_inet_raw", lambda: sc("socket", 2, 3, 1)),
    ("socket_inet_raw_flags", lambda: sc("socket", 2, 3 | 0x80000 | 0x800, 1)),
    ("socket_inet6_raw", lambda: sc("socket", 10, 3, 58)),
    ("socket_inet_packet", lambda: sc("socket", 2, 10, 0)),
    ("socket_vsock", lambda: sc("socket", 40, 1, 0)),
    ("socket_alg", lambda: sc("socket", 38, 5, 0)),
    ("socket_netlink", lambda: sc("socket", 16, 3, 0)),
    ("socket_inet_stream", lambda: sc("socket", 2, 1, 0)),
    ("socket_inet6_dgram", lambda: sc("socket", 10, 2, 0)),
    ("socket_unix", lambda: sc("socket", 1, 1, 0)),
    ("socketpair_unix", lambda: sc("socketpair", 1, 1, 0, (ctypes.c_int * 2)())),
    ("acct", lambda: sc("acct", NOPE)),
    ("swapon", lambda: sc("swapon", NOPE, 0)),
    ("swapoff", lambda: sc("swapoff", NOPE)),
    ("reboot", lambda: sc("reboot", 0, 0, 0, 0)),
    ("syslog", lambda: sc("syslog", 10, 0, 0)),
    ("quotactl", lambda: sc("quotactl", 0, 0, 0, 0)),
    ("quotactl_fd", lambda: sc("quotactl_fd", -1, 0, 0, 0)),
    ("open_by_handle_at", lambda: sc("open_by_handle_at", -1, 0, 0)),
    ("name_to_handle_at", lambda: sc("name_to_handle_at", -100, b"/", 0, 0, 0)),
    ("lookup_dcookie", lambda: sc("lookup_dcookie", 0, 0, 0)),
    ("personality_page_zero", lambda: sc("personality", 0x0100000)),
    ("personality_read_exec", lambda: sc("personality", 0x0400000)),
    ("personality_no_random", lambda: sc("personality", 0x0040000)),
    ("personality_query", lambda: sc("personality", 0xFFFFFFFF)),
    # Invalid values only: an unfiltered run must never change the clock.
    ("settimeofday", lambda: sc("settimeofday", (ctypes.c_long * 2)(now, 2000000), 0)),
    ("clock_settime", lambda: sc("clock_settime", 1, (ctypes.c_long * 2)(now, -1))),
    ("clock_adjtime", lambda: sc("clock_adjtime", 1, buf())),
    ("adjtimex", lambda: sc("adjtimex", buf())),
    ("sethostname", lambda: sc("sethostname", b"x", 1000)),
    ("setdomainname", lambda: sc("setdomainname", b"x", 1000)),
    ("iopl", lambda: sc("iopl", 0)),
    ("ioperm", lambda: sc("ioperm", 0, 0, 0)),
    ("modify_ldt", lambda: sc("modify_ldt", 0, buf(), 16)),
    ("uselib", lambda: sc("uselib", NOPE)),
    ("chroot", lambda: sc("chroot", NOPE)),
    ("memfd_exec", lambda: sc("memfd_create", b"t", 0x10)),
    ("memfd_cloexec", lambda: sc("memfd_create", b"t", 1)),
    ("prctl_set_mm", lambda: sc("prctl", 35, 0xFF, 0, 0, 0)),
    ("prctl_set_name", lambda: sc("prctl", 15, b"probe", 0, 0, 0)),
    ("fanotify_init", lambda: sc("fanotify_init", 0, 0)),
    ("kcmp", lambda: sc("kcmp", os.getpid(), os.getpid(), 0, 0, 0)),
    ("migrate_pages", lambda: sc("migrate_pages", 0, 0, 0, 0)),
    ("move_pages", lambda: sc("move_pages", 0, 0, 0, 0, 0, 0)),
    ("x32_getpid", lambda: (0 if raw(0x40000000 | 39) >= 0 else ctypes.get_errno()) if X86 else 0),
    ("compat_int80", lambda: int80() if X86 else 0),
    ("fork", fork),
    ("threads", thread),
    ("posix_spawn", spawn),
    ("exec_true", lambda: run("/bin/true")),
    ("exec_sh_pipeline", lambda: run("/bin/sh", "-c", "echo hi | cat")),
    ("exec_git", lambda: run("git", "--version")),
    ("exec_python", lambda: run(sys.executable, "-c", "import json, socket, ssl, subprocess")),
    ("exec_python_asyncio", lambda: run(sys.executable, "-c", ASYNCIO)),
]
if os.environ.get("TT_CARGO"):
    PROBES.append(("exec_cargo", lambda: run(os.environ["TT_CARGO"], "--version")))
if shutil.which("node"):
    script = "require('child_process').execFileSync('true')"
    PROBES.append(("exec_node", lambda: run("node", "-e", script)))

for name, fn in PROBES:
    pid = os.fork()
    if pid == 0:
        try:
            rc = fn()
        except KeyError:
            rc = 251  # syscall unknown on this architecture
        except OSError as e:
            rc = e.errno
        except BaseException:
            rc = 250
        os._exit(rc & 0xFF)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        print(name, 300 + os.WTERMSIG(status))
    elif os.WEXITSTATUS(status) != 251:
        print(name, os.WEXITSTATUS(status))
sys.stdout.flush()
"#;

/// Runs the python helper (under `program` when given) and returns each
/// probe's result: 0, an errno, 250 for an unexpected exception, 300+signal.
fn probe(program: Option<BpfProgram>) -> BTreeMap<String, i32> {
    let python = python();
    let mut target = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let numbers: Vec<String> = probe_numbers()
        .iter()
        .map(|(n, nr)| format!("{n}={nr}"))
        .collect();
    let mut cmd = Command::new(&python);
    cmd.arg("-c")
        .arg(HELPER)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    cmd.env("TT_NR", numbers.join(" "))
        .env("TT_TARGET", target.id().to_string());
    cmd.env("TT_CARGO", option_env!("CARGO").unwrap_or(""));
    if let Some(prog) = program {
        // SAFETY: the hook runs between fork and exec and only makes two
        // syscalls (prctl, seccomp) on memory prepared before the fork; it
        // neither allocates nor takes locks.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                install(&prog).map_err(|e| {
                    io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EINVAL))
                })
            });
        }
    }
    let out = cmd.output().expect("run the python helper");
    let _ = target.kill();
    let _ = target.wait();
    assert!(out.status.success(), "helper failed: {:?}", out.status);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut results = BTreeMap::new();
    for line in text.lines() {
        let (name, value) = line.split_once(' ').expect("`name value` line");
        results.insert(name.to_string(), value.parse().expect("number"));
    }
    results
}

fn python() -> String {
    // Resolve the real interpreter once (pyenv shims are shell scripts).
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed for the seccomp kernel tests");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
    .clone()
}

fn baseline() -> &'static BTreeMap<String, i32> {
    static BASE: OnceLock<BTreeMap<String, i32>> = OnceLock::new();
    BASE.get_or_init(|| probe(None))
}

fn check_on_kernel(opts: SeccompOptions) {
    let base = baseline();
    let got = probe(Some(build_program(&opts).expect("program")));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>()
    );
    let mut wrong = Vec::new();
    for (name, &value) in &got {
        let want = denial(name, &opts).unwrap_or(base[name]);
        if value != want {
            wrong.push(format!(
                "{name}: got {value}, want {want} (unfiltered {})",
                base[name]
            ));
        }
    }
    assert!(wrong.is_empty(), "{opts:?}:\n{}", wrong.join("\n"));
}

#[test]
fn kernel_default_filter() {
    check_on_kernel(SeccompOptions::default());
}

#[test]
fn kernel_deny_unix_filter() {
    check_on_kernel(SeccompOptions {
        strict: false,
        deny_unix: true,
        ..SeccompOptions::default()
    });
}

#[test]
fn kernel_strict_filter() {
    check_on_kernel(SeccompOptions {
        strict: true,
        deny_unix: false,
        ..SeccompOptions::default()
    });
}

#[test]
fn kernel_strict_deny_unix_filter() {
    check_on_kernel(SeccompOptions {
        strict: true,
        deny_unix: true,
        ..SeccompOptions::default()
    });
}

#[test]
fn kernel_probes_discriminate_on_this_host() {
    let base = baseline();
    eprintln!("unfiltered results: {base:?}");
    for name in MUST_SUCCEED {
        assert_eq!(
            base.get(*name),
            Some(&0),
            "control {name} fails without any filter"
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: skipping the check that denials differ from the unfiltered host");
        return;
    }
    for name in DISCRIMINATING {
        let Some(want) = denial(name, &SeccompOptions::default()) else {
            continue; // x86-only probe on another architecture
        };
        assert_ne!(
            base[*name], want,
            "{name}: the host alone already answers {want}"
        );
    }
}

#[test]
fn install_refuses_without_no_new_privs() {
    let prog = build_program(&SeccompOptions::default()).expect("program");
    let mut cmd = Command::new("/bin/true");
    // SAFETY: as above, the hook only makes syscalls; it does not set
    // no_new_privs, which `install` must notice (even as root).
    unsafe {
        cmd.pre_exec(move || {
            install(&prog).map_err(|e| io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0)))
        });
    }
    let err = cmd.status().expect_err("install must refuse");
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
}
