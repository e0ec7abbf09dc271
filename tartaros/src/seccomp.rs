//! The syscall wall: a seccomp-BPF filter installed in the agent process as
//! the very last step before `execve`.
//!
//! The decision is pure and readable ([`rules`]: syscall, condition, errno,
//! reason), the compilation is pure ([`build_program`]), and [`install`] is a
//! single syscall. Denied calls fail with `EPERM` (`clone3` with `ENOSYS`) and
//! never kill, so an agent gets an error it can report instead of dying.
//! `docs/seccomp.md` gives the reason for every entry.

use std::fmt;
use std::io;

/// Which filter to build. The default filter applies to every run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeccompOptions {
    /// `--seccomp-strict`: add the tighter set on top of the default one.
    pub strict: bool,
    /// `--deny-unix`: refuse `socket(AF_UNIX, ...)` (named and abstract
    /// sockets); anonymous `socketpair`s stay allowed.
    pub deny_unix: bool,
    /// A standard stream is the launcher's terminal (no pty of the run's
    /// own): refuse what reaches past it to the launcher's job.
    pub host_terminal: bool,
}

/// Which option brought a rule in. Tiers only ever add rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Every run.
    Default,
    /// `--deny-unix`.
    DenyUnix,
    /// `--seccomp-strict`.
    Strict,
    /// Runs that hand the agent the launcher's terminal.
    HostTerminal,
}

/// A constant together with its name, so rules print the way the man pages
/// spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub value: u32,
    pub name: &'static str,
}

/// A test on the low 32 bits of one syscall argument.
///
/// Only the low 32 bits are ever compared: every argument filtered here is an
/// `int` / `unsigned int` for the kernel (or only its low 32 bits are used),
/// so a caller cannot slip past an `==` test by setting the upper bits. For
/// `ptrace`'s `long request` this over-matches (a request with upper bits set
/// is refused too), which errs on the denying side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgTest {
    /// `arg == value`
    Eq(Named),
    /// `arg != value`
    Ne(Named),
    /// `arg & value == value` (every bit of `value` set)
    HasBits(Named),
    /// `arg & mask == value`
    MaskedEq { mask: u32, value: Named },
    /// `arg` is none of the values
    NotIn(Vec<Named>),
    /// `arg != 0` over all 64 bits: a pointer argument. A low-half test
    /// would take a pointer such as `0x7f00_0000_0000` for NULL.
    NotNull,
}

/// One condition: argument `index` (named `name` in the man page) passes `test`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgCond {
    pub index: u8,
    pub name: &'static str,
    pub test: ArgTest,
}

/// One decided entry: `syscall` fails with `errno` when every condition in
/// `when` holds (always, when `when` is empty). Several rules for the same
/// syscall are alternatives: any one of them denies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub syscall: &'static str,
    pub when: Vec<ArgCond>,
    pub errno: i32,
    pub tier: Tier,
    pub reason: &'static str,
}

/// Everything that can go wrong while building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error(
        "failed to build the seccomp filter: architecture {0} is not supported (x86_64 and aarch64 are)"
    )]
    UnsupportedArch(&'static str),
    #[error("failed to build the seccomp filter: syscall {0} has no number on this architecture")]
    UnknownSyscall(&'static str),
    #[error(
        "failed to build the seccomp filter: the rule for {syscall} returns errno {errno} under a condition, which only EPERM rules may"
    )]
    UnsupportedRule { syscall: &'static str, errno: i32 },
    #[error(
        "failed to build the seccomp filter's dispatch over {0} syscalls: a rule is too long for a jump over it"
    )]
    Dispatch(usize),
    #[error(
        "failed to load the seccomp filter: it has {0} instructions, the kernel accepts 1 to {MAX_INSNS}"
    )]
    BadLength(usize),
    #[error("failed to install the seccomp filter: no_new_privs is not set on this thread")]
    NoNewPrivs,
    #[error("failed to install the seccomp filter: cannot read no_new_privs")]
    QueryNoNewPrivs(#[source] io::Error),
    #[error("failed to install the seccomp filter: {0}")]
    Install(#[source] io::Error),
}

impl SeccompError {
    /// The OS error number behind an install failure, for callers that can
    /// only pass a number along (e.g. a `pre_exec` hook, which must not
    /// allocate after `fork`).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::QueryNoNewPrivs(e) | Self::Install(e) => e.raw_os_error(),
            Self::NoNewPrivs => Some(libc::EACCES),
            _ => None,
        }
    }
}

// Kernel uapi values (asm-generic; identical on x86_64 and aarch64). The unit
// tests cross-check them against `libc` where `libc` has them.
macro_rules! named {
    ($($id:ident = $v:expr;)*) => {
        $(const $id: Named = Named { value: $v, name: stringify!($id) };)*
    };
}
named! {
    CLONE_NEWTIME = 0x80; CLONE_NEWNS = 0x2_0000; CLONE_NEWCGROUP = 0x200_0000;
    CLONE_NEWUTS = 0x400_0000; CLONE_NEWIPC = 0x800_0000; CLONE_NEWUSER = 0x1000_0000;
    CLONE_NEWPID = 0x2000_0000; CLONE_NEWNET = 0x4000_0000;
    TIOCSTI = 0x5412; TIOCLINUX = 0x541c; TIOCSETD = 0x5423; TIOCSWINSZ = 0x5414;
    FS_IOC_SETVERSION = 0x4008_7602; FS_IOC32_SETVERSION = 0x4004_7602;
    AF_UNIX = 1; AF_INET = 2; AF_INET6 = 10; AF_NETLINK = 16;
    NETLINK_ROUTE = 0; NETLINK_SOCK_DIAG = 4; NETLINK_GENERIC = 16;
    SOCK_RAW = 3; SOCK_PACKET = 10;
    MMAP_PAGE_ZERO = 0x10_0000; READ_IMPLIES_EXEC = 0x40_0000;
    PER_LINUX = 0; PERSONALITY_QUERY = 0xffff_ffff;
    MFD_EXEC = 0x10; PR_SET_MM = 35; RLIMIT_CORE = 4;
    S_ISUID = 0o4000; S_ISGID = 0o2000;
    F_SETLEASE = 1024; F_SET_RW_HINT = 1036; F_SET_FILE_RW_HINT = 1038;
    POSIX_FADV_DONTNEED = 4; MADV_COLD = 20; MADV_PAGEOUT = 21;
}
/// `prlimit64`'s pid for the caller itself, what glibc's `setrlimit` and
/// `getrlimit` pass.
const PID_SELF: Named = Named {
    value: 0,
    name: "0",
};
/// `SOCK_TYPE_MASK`: the kernel strips `SOCK_NONBLOCK | SOCK_CLOEXEC` (and
/// refuses other bits) before using the type, so the filter looks at the
/// same four bits.
const SOCK_TYPE_MASK: u32 = 0xf;
/// Namespace flags `unshare` accepts. `clone` takes all but `CLONE_NEWTIME`,
/// whose bit is part of the exit signal (`CSIGNAL`) for `clone`.
const NS_FLAGS: [Named; 8] = [
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
    CLONE_NEWTIME,
];
/// `BPF_MAXINSNS`: the longest program the kernel accepts.
pub const MAX_INSNS: usize = 4096;

#[path = "seccomp_compile.rs"]
mod compile;
#[path = "seccomp_emit.rs"]
mod emit;
#[path = "seccomp_prologue.rs"]
mod prologue;
#[path = "seccomp_tables.rs"]
mod tables;
use compile::{arch, syscall_nr};
pub use compile::{build_program, install};
#[cfg(test)]
use prologue::{BPF_JMP_JEQ_K, BPF_LD_W_ABS, DATA_ARCH, jump, ret_errno, stmt};
use tables::{
    DEFAULT_ALWAYS, REFUSED_FCNTLS, REFUSED_IOCTLS, STRICT_ALWAYS, WHY_CLONE3, WHY_CORE,
    WHY_DONTNEED, WHY_FAMILY, WHY_NETLINK, WHY_NS, WHY_OPENAT2, WHY_PAGEOUT, WHY_PRLIMIT,
    WHY_SETGID_CREATE, WHY_SETID, WHY_SETUID_CREATE, WHY_UNIX, WHY_WINSZ,
};

fn deny(syscall: &'static str, when: Vec<ArgCond>, tier: Tier, reason: &'static str) -> Rule {
    Rule {
        syscall,
        when,
        errno: libc::EPERM,
        tier,
        reason,
    }
}

fn arg(index: u8, name: &'static str, test: ArgTest) -> ArgCond {
    ArgCond { index, name, test }
}

fn type_is(value: Named) -> ArgCond {
    arg(
        1,
        "type",
        ArgTest::MaskedEq {
            mask: SOCK_TYPE_MASK,
            value,
        },
    )
}

fn expand(table: &[(&[&'static str], &'static str)], tier: Tier) -> impl Iterator<Item = Rule> {
    let rules = table
        .iter()
        .flat_map(move |(names, why)| names.iter().map(move |s| (s, why)));
    rules.map(move |(s, why)| deny(s, Vec::new(), tier, why))
}

/// The decided rule set for `opts` on the running architecture (syscalls
/// that do not exist here, such as `iopl` on aarch64, are left out).
pub fn rules(opts: &SeccompOptions) -> Vec<Rule> {
    let mut r = default_rules();
    if opts.deny_unix {
        // Only socket(): a socketpair() is born connected to itself and can
        // reach no daemon, while asyncio, libuv (node's child stdio) and
        // others need one; see docs/seccomp.md.
        let unix = vec![arg(0, "domain", ArgTest::Eq(AF_UNIX))];
        r.push(deny("socket", unix, Tier::DenyUnix, WHY_UNIX));
    }
    if opts.strict {
        r.extend(strict_rules());
    }
    if opts.host_terminal {
        // The kernel stores the size in the terminal, which outlives the
        // run, and signals the terminal's foreground group: the launcher's
        // job on the host. Only in these runs: with a pty of its own the
        // agent's terminal programs (tmux, script) size their own ptys.
        let cmd = vec![arg(1, "cmd", ArgTest::Eq(TIOCSWINSZ))];
        r.push(deny("ioctl", cmd, Tier::HostTerminal, WHY_WINSZ));
    }
    r.retain(|rule| arch().is_none() || syscall_nr(rule.syscall).is_some());
    r
}

// The rule functions read as tables, one rule per line; rustfmt would
// spread each call over five lines.
#[rustfmt::skip]
fn default_rules() -> Vec<Rule> {
    use ArgTest::{Eq, HasBits, Ne, NotIn};
    use Tier::Default as D;
    let mut r = Vec::new();
    // ptrace stays open by default: the agent may debug its own processes
    // (gdb, strace). Landlock refuses tracing outside the agent's domain
    // (the init), and the supervisor is not in the agent's PID namespace.
    r.extend(expand(DEFAULT_ALWAYS, D));
    for flag in NS_FLAGS {
        r.push(deny("unshare", vec![arg(0, "flags", HasBits(flag))], D, WHY_NS));
    }
    for flag in NS_FLAGS.into_iter().filter(|f| *f != CLONE_NEWTIME) {
        r.push(deny("clone", vec![arg(0, "flags", HasBits(flag))], D, WHY_NS));
    }
    r.push(Rule { errno: libc::ENOSYS, ..deny("clone3", Vec::new(), D, WHY_CLONE3) });
    r.push(Rule { errno: libc::ENOSYS, ..deny("openat2", Vec::new(), D, WHY_OPENAT2) });
    for (cmd, why) in REFUSED_IOCTLS {
        r.push(deny("ioctl", vec![arg(1, "cmd", Eq(cmd))], D, why));
    }
    // State a sandbox process could leave on, or hold over, a host inode
    // it owns or only reads: the owner is checked, the mount is not
    // (docs/seccomp.md, "Leases and locks").
    for (cmd, why) in REFUSED_FCNTLS {
        r.push(deny("fcntl", vec![arg(1, "cmd", Eq(cmd))], D, why));
    }
    let dontneed = vec![arg(3, "advice", Eq(POSIX_FADV_DONTNEED))];
    r.push(deny("fadvise64", dontneed, D, WHY_DONTNEED));
    for advice in [MADV_COLD, MADV_PAGEOUT] {
        r.push(deny("madvise", vec![arg(2, "advice", Eq(advice))], D, WHY_PAGEOUT));
    }
    let families = vec![AF_UNIX, AF_INET, AF_INET6, AF_NETLINK];
    r.push(deny("socket", vec![arg(0, "domain", NotIn(families))], D, WHY_FAMILY));
    for family in [AF_INET, AF_INET6] {
        let why = "raw IP sockets craft packets that bypass the connect filters";
        r.push(deny("socket", vec![arg(0, "domain", Eq(family)), type_is(SOCK_RAW)], D, why));
    }
    let why = "legacy packet sockets: the kernel turns (AF_INET, SOCK_PACKET) into AF_PACKET";
    r.push(deny("socket", vec![type_is(SOCK_PACKET)], D, why));
    // Netlink is spoken for the run's own network namespace (getifaddrs,
    // ip, ss). Other protocols reach the host: the kernel broadcasts every
    // device's uevent to each namespace the initial user namespace owns,
    // and a root run's is one (adversarial round 11).
    let spoken = NotIn(vec![NETLINK_ROUTE, NETLINK_SOCK_DIAG, NETLINK_GENERIC]);
    let netlink = vec![arg(0, "domain", Eq(AF_NETLINK)), arg(2, "protocol", spoken)];
    r.push(deny("socket", netlink, D, WHY_NETLINK));
    for flag in [MMAP_PAGE_ZERO, READ_IMPLIES_EXEC] {
        let when = vec![arg(0, "persona", HasBits(flag)), arg(0, "persona", Ne(PERSONALITY_QUERY))];
        let why = "weakens exploit mitigations (mapped page zero, executable data); query allowed";
        r.push(deny("personality", when, D, why));
    }
    // The init leaves RLIMIT_CORE at 1 (init.rs): the kernel's own marker
    // that refuses a core_pattern pipe helper. Lowering it to 0 would run
    // that helper again, so the limit cannot be changed at all; reading it
    // (prlimit64 with no new limit, as glibc's getrlimit does) stays allowed.
    let core = || arg(0, "resource", Eq(RLIMIT_CORE));
    r.push(deny("setrlimit", vec![core()], D, WHY_CORE));
    let core = arg(1, "resource", Eq(RLIMIT_CORE));
    r.push(deny("prlimit64", vec![core, arg(2, "new_limit", ArgTest::NotNull)], D, WHY_CORE));
    // Another process's limits: the kernel asks only for the same uid, and
    // under --user root or in a user namespace the init has the agent's
    // (RLIMIT_CPU 0 killed it; adversarial round 23b). Limits are
    // per-process, so no thread needs a tid here; reads stay allowed.
    let other = arg(0, "pid", Ne(PID_SELF));
    r.push(deny("prlimit64", vec![other, arg(2, "new_limit", ArgTest::NotNull)], D, WHY_PRLIMIT));
    r.extend(privilege_bit_rules());
    r
}

/// No file the agent leaves in a root may run as its uid or gid for
/// whoever executes it after the run (docs/seccomp.md, "Privilege bits").
/// The chmod family is the only way to put S_ISUID on a file with content:
/// every write, truncate or allocation without CAP_FSETID clears it. A
/// creation mode could still leave it on an empty file, which keeps it
/// when a process with CAP_FSETID later writes there. `mkdir` drops both
/// bits itself.
#[rustfmt::skip]
fn privilege_bit_rules() -> impl Iterator<Item = Rule> {
    let calls = [("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2)];
    let chmods = calls.into_iter().flat_map(|(syscall, index)| {
        [S_ISUID, S_ISGID].map(|bit| {
            deny(syscall, vec![arg(index, "mode", ArgTest::HasBits(bit))], Tier::Default, WHY_SETID)
        })
    });
    // S_ISGID survives writes while group-execute is off, and a POSIX ACL
    // (setxattr, which the lab's own tools need) then adds group-execute
    // without chmod; S_ISUID stays on a file nothing writes (round 8): so
    // no creation mode may carry either. openat2's mode is in a struct; it
    // gets ENOSYS (the prologue) and callers fall back here.
    let creates = [("open", 2), ("creat", 1), ("mknod", 1), ("openat", 3), ("mknodat", 2)];
    let creates = creates.into_iter().flat_map(|(syscall, index)| {
        [(S_ISUID, WHY_SETUID_CREATE), (S_ISGID, WHY_SETGID_CREATE)].map(|(bit, why)| {
            deny(syscall, vec![arg(index, "mode", ArgTest::HasBits(bit))], Tier::Default, why)
        })
    });
    chmods.chain(creates)
}

#[rustfmt::skip]
fn strict_rules() -> Vec<Rule> {
    use ArgTest::{Eq, HasBits, NotIn};
    use Tier::Strict as S;
    let mut r: Vec<Rule> = expand(STRICT_ALWAYS, S).collect();
    let persona = NotIn(vec![PER_LINUX, PERSONALITY_QUERY]);
    let why = "no execution-domain changes (setarch, gdb's ASLR switch fail)";
    r.push(deny("personality", vec![arg(0, "persona", persona)], S, why));
    let why = "explicitly executable memory files: a step to execution no path rule sees";
    r.push(deny("memfd_create", vec![arg(1, "flags", HasBits(MFD_EXEC))], S, why));
    let why = "netlink reaches kernel subsystems (routing, audit, netfilter, uevents)";
    r.push(deny("socket", vec![arg(0, "domain", Eq(AF_NETLINK))], S, why));
    let why = "rewrites the process's memory-map descriptors (e.g. forges /proc/self/exe)";
    r.push(deny("prctl", vec![arg(0, "option", Eq(PR_SET_MM))], S, why));
    r
}

/// The rule of any tier that refuses `syscall` with these arguments (by
/// index; a rule testing one past the end does not hold), if one does: how the capture tells the filter's EPERM from
/// the kernel's own for a call refused for its arguments or in some runs
/// only. Over every tier, since the capture does not know the run's
/// options: only a `Tier::Default` rule (every run has it) proves the
/// filter refused.
pub fn refusing_rule(syscall: &str, args: &[u64]) -> Option<Rule> {
    let all = rules(&SeccompOptions {
        strict: true,
        deny_unix: true,
        host_terminal: true,
    });
    let holds = |c: &ArgCond| {
        let Some(&arg) = args.get(usize::from(c.index)) else {
            return false;
        };
        let low = arg as u32;
        match &c.test {
            ArgTest::Eq(n) => low == n.value,
            ArgTest::Ne(n) => low != n.value,
            ArgTest::HasBits(n) => low & n.value == n.value,
            ArgTest::MaskedEq { mask, value } => low & mask == value.value,
            ArgTest::NotIn(ns) => ns.iter().all(|n| low != n.value),
            ArgTest::NotNull => arg != 0,
        }
    };
    all.into_iter()
        .find(|r| r.syscall == syscall && r.when.iter().all(holds))
}

fn errno_name(errno: i32) -> String {
    match errno {
        libc::EPERM => "EPERM".into(),
        libc::ENOSYS => "ENOSYS".into(),
        n => format!("errno {n}"),
    }
}

impl fmt::Display for ArgCond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.name;
        match &self.test {
            ArgTest::Eq(v) => write!(f, "{n} == {}", v.name),
            ArgTest::Ne(v) => write!(f, "{n} != {}", v.name),
            ArgTest::HasBits(v) => write!(f, "{n} has {}", v.name),
            ArgTest::MaskedEq { mask, value } => write!(f, "{n} & {mask:#x} == {}", value.name),
            ArgTest::NotIn(vs) => {
                let names: Vec<_> = vs.iter().map(|v| v.name).collect();
                write!(f, "{n} not in {{{}}}", names.join(", "))
            }
            ArgTest::NotNull => write!(f, "{n} != NULL"),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.syscall)?;
        if !self.when.is_empty() {
            let conds: Vec<_> = self.when.iter().map(ToString::to_string).collect();
            write!(f, " if {}", conds.join(" and "))?;
        }
        write!(f, " -> {}", errno_name(self.errno))
    }
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "seccomp_emit_tests.rs"]
mod emit_tests;
