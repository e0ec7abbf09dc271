//! Names for the numbers in records (open flags, modes, signals, errnos) and
//! the one decision every reader shares: was a denied effect a *refusal* by
//! the sandbox's policy, or an ordinary *failure* the agent would have met
//! anywhere (EEXIST, ENOENT, EXDEV...)?

use serde_json::{Map, Value};

/// File effect kinds (the `file` group of `--kind`): `open`, then every
/// kind that changes a file.
pub(crate) const FILE_KINDS: &[&str] = &[
    "open", "create", "write", "unlink", "rename", "chmod", "truncate", "mkdir", "rmdir", "link",
    "symlink", "chown", "mknod", "xattr", "utime", "setflags", "attrib",
];
/// The kinds that change a file (all file kinds but `open`).
pub(crate) const CHANGE_KINDS: &[&str] = FILE_KINDS.split_at(1).1;
/// Network effect kinds (the `net` group).
pub(crate) const NET_KINDS: &[&str] = &["connect", "sendto", "bind", "proxy", "broker"];
/// Process kinds (the `proc` group).
pub(crate) const PROC_KINDS: &[&str] = &["exec", "fork", "exit", "signal"];

/// What a reviewer should make of a record's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    /// The sandbox refused it.
    Refused(Mechanism),
    /// It failed for an ordinary reason (the sandbox allowed the attempt).
    Failed,
}

/// Which wall refused an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Mechanism {
    Filesystem,
    Network,
    Signal,
    Syscall,
}

impl Mechanism {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mechanism::Filesystem => "filesystem",
            Mechanism::Network => "network",
            Mechanism::Signal => "signal",
            Mechanism::Syscall => "syscall",
        }
    }

    pub(crate) const ALL: [Mechanism; 4] = [
        Mechanism::Filesystem,
        Mechanism::Network,
        Mechanism::Signal,
        Mechanism::Syscall,
    ];
}

const EPERM: u64 = 1;
const EACCES: u64 = 13;
const EROFS: u64 = 30;

/// The refusal-or-failure decision. A record may say which mechanism
/// refused it (`refused_by` / `mechanism`, on the record or in `target`);
/// otherwise the errno decides: EACCES and EPERM are what Landlock,
/// seccomp, the cgroup connect filter and the signal scoping return, EROFS
/// what the read-only base mount returns; a denial without an errno is a
/// proxy or broker refusal. Every other errno is an ordinary failure.
pub(crate) fn outcome(rec: &Map<String, Value>) -> Outcome {
    if rec.get("decision").and_then(Value::as_str) != Some("denied") {
        return Outcome::Allowed;
    }
    let kind = rec.get("kind").and_then(Value::as_str).unwrap_or("");
    if let Some(by) = marker(rec) {
        return Outcome::Refused(mechanism_named(by).unwrap_or_else(|| mechanism_of(kind)));
    }
    let errno = rec.get("errno").and_then(Value::as_u64).unwrap_or(0);
    let mechanism = mechanism_of(kind);
    match errno {
        0 | EPERM | EACCES => Outcome::Refused(mechanism),
        EROFS if mechanism == Mechanism::Filesystem => Outcome::Refused(mechanism),
        // A unix socket's name is a file: the read-only base mount refused
        // to make it (round 23 counted it an ordinary failure).
        EROFS if kind == "bind" => Outcome::Refused(Mechanism::Filesystem),
        _ => Outcome::Failed,
    }
}

fn marker(rec: &Map<String, Value>) -> Option<&str> {
    let target = rec.get("target").and_then(Value::as_object);
    ["refused_by", "mechanism"].iter().find_map(|k| {
        rec.get(*k)
            .or_else(|| target.and_then(|t| t.get(*k)))
            .and_then(Value::as_str)
    })
}

fn mechanism_named(name: &str) -> Option<Mechanism> {
    Some(match name {
        "landlock" | "mount" | "filesystem" => Mechanism::Filesystem,
        "ebpf" | "connect-filter" | "proxy" | "broker" | "network" => Mechanism::Network,
        "signal" | "scope" => Mechanism::Signal,
        "seccomp" | "syscall" => Mechanism::Syscall,
        _ => return None,
    })
}

/// The mechanism that guards a kind of effect.
pub(crate) fn mechanism_of(kind: &str) -> Mechanism {
    if FILE_KINDS.contains(&kind) || kind == "exec" {
        Mechanism::Filesystem
    } else if NET_KINDS.contains(&kind) {
        Mechanism::Network
    } else if kind == "signal" {
        Mechanism::Signal
    } else {
        Mechanism::Syscall
    }
}

/// `O_WRONLY|O_CREAT|O_TRUNC` for 577; unknown bits as hex.
pub(crate) fn open_flags(flags: u64) -> String {
    const NAMED: &[(u64, &str)] = &[
        (0o100, "O_CREAT"),
        (0o200, "O_EXCL"),
        (0o400, "O_NOCTTY"),
        (0o1000, "O_TRUNC"),
        (0o2000, "O_APPEND"),
        (0o4000, "O_NONBLOCK"),
        (0o4010000, "O_SYNC"),
        (0o10000, "O_DSYNC"),
        (0o20000, "O_ASYNC"),
        (0o40000, "O_DIRECT"),
        (0o100000, "O_LARGEFILE"),
        (0o20200000, "O_TMPFILE"),
        (0o200000, "O_DIRECTORY"),
        (0o400000, "O_NOFOLLOW"),
        (0o1000000, "O_NOATIME"),
        (0o2000000, "O_CLOEXEC"),
        (0o10000000, "O_PATH"),
    ];
    let mut names = vec![
        match flags & 0o3 {
            0 => "O_RDONLY",
            1 => "O_WRONLY",
            2 => "O_RDWR",
            _ => "O_ACCMODE",
        }
        .to_string(),
    ];
    let mut rest = flags & !0o3;
    for &(bits, name) in NAMED {
        if rest & bits == bits {
            names.push(name.to_string());
            rest &= !bits;
        }
    }
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    names.join("|")
}

/// Whether open flags give write access or change the file.
pub(crate) fn opens_for_write(flags: u64) -> bool {
    flags & 0o3 != 0 || flags & (0o100 | 0o1000 | 0o2000) != 0
}

/// What an `open` or `create` record did, from its flags: a `create`
/// without `O_EXCL` may have opened a file that existed (an append to a
/// log is `O_WRONLY|O_CREAT|O_APPEND`), so only `O_EXCL` (or no flags:
/// mknod, creat) makes it a certain creation.
pub(crate) fn open_action(kind: &str, flags: Option<u64>) -> &'static str {
    match flags {
        None if kind == "create" => "create",
        None => "open",
        Some(f) if f & 0o100 != 0 && f & 0o200 != 0 => "create",
        Some(f) if f & 0o2000 != 0 => "append",
        Some(f) if f & 0o1000 != 0 => "overwrite",
        Some(f) if opens_for_write(f) => "write",
        Some(_) => "read",
    }
}

/// `0755`, `04755`.
pub(crate) fn mode(mode: u64) -> String {
    format!("0{:03o}", mode & 0o7777)
}

/// `SIGKILL`, `SIGRTMIN+3`; `0` (an existence probe) and unknown numbers as
/// digits.
pub(crate) fn signal(n: i64) -> String {
    if let Ok(raw) = i32::try_from(n)
        && let Ok(sig) = nix::sys::signal::Signal::try_from(raw)
    {
        return sig.as_str().to_string();
    }
    match n {
        34..=64 => format!("SIGRTMIN+{}", n - 34),
        _ => n.to_string(),
    }
}

/// `EACCES`; unknown numbers as `errno N`.
pub(crate) fn errno(errno: u64) -> String {
    match i32::try_from(errno).map(nix::errno::Errno::from_raw) {
        Ok(e) if e != nix::errno::Errno::UnknownErrno => format!("{e:?}"),
        _ => format!("errno {errno}"),
    }
}

/// A log string for a terminal: escaped, long runs of spaces counted
/// (`[1100 spaces]`, so padding cannot push the rest of an argument out of
/// sight), cut after `max` characters with a visible `…[+N bytes]`.
pub(crate) fn text(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    let (mut shown, mut spaces) = (0usize, 0usize);
    let mut chars = s.char_indices();
    loop {
        let next = chars.next();
        if let Some((_, ' ')) = next {
            spaces += 1;
            continue;
        }
        if spaces >= 8 {
            out.push_str(&format!("[{spaces} spaces]"));
            shown += 1;
        } else {
            out.extend(std::iter::repeat_n(' ', spaces));
            shown += spaces;
        }
        spaces = 0;
        let Some((at, c)) = next else {
            return out;
        };
        if shown >= max {
            out.push_str(&format!("…[+{} bytes]", s.len() - at));
            return out;
        }
        crate::effectlog::escape::push_escaped(&mut out, c);
        shown += 1;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_group_names_only_kinds_the_writer_knows() {
        for kind in FILE_KINDS.iter().chain(NET_KINDS).chain(PROC_KINDS) {
            assert!(crate::effectlog::EFFECT_KINDS.contains(kind), "{kind}");
        }
        assert!(!CHANGE_KINDS.contains(&"open"));
    }

    fn rec(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn flags_modes_signals_errnos_have_names() {
        assert_eq!(open_flags(0), "O_RDONLY");
        assert_eq!(open_flags(577), "O_WRONLY|O_CREAT|O_TRUNC");
        assert_eq!(
            open_flags(0o2101 | 0o2000000),
            "O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC"
        );
        assert_eq!(open_flags(0o4010002), "O_RDWR|O_SYNC");
        assert_eq!(open_flags(0o20200002), "O_RDWR|O_TMPFILE");
        assert_eq!(open_flags(0x4000_0000), "O_RDONLY|0x40000000");
        assert_eq!(mode(493), "0755");
        assert_eq!(mode(0o4755), "04755");
        assert_eq!(mode(0o644), "0644");
        assert_eq!(signal(9), "SIGKILL");
        assert_eq!(signal(15), "SIGTERM");
        assert_eq!(signal(0), "0");
        assert_eq!(signal(36), "SIGRTMIN+2");
        assert_eq!(errno(13), "EACCES");
        assert_eq!(errno(18), "EXDEV");
        assert_eq!(errno(99999), "errno 99999");
    }

    #[test]
    fn an_append_is_not_a_create() {
        assert_eq!(open_action("create", Some(0o2101)), "append");
        assert_eq!(open_action("create", Some(0o301)), "create");
        assert_eq!(open_action("create", Some(577)), "overwrite");
        assert_eq!(open_action("create", None), "create");
        assert_eq!(open_action("open", Some(0)), "read");
        assert_eq!(open_action("open", Some(2)), "write");
    }

    #[test]
    fn refusals_are_told_from_failures() {
        let denied = |kind: &str, errno: u64| {
            outcome(&rec(
                json!({"kind": kind, "decision": "denied", "errno": errno, "target": {}}),
            ))
        };
        assert_eq!(denied("open", 13), Outcome::Refused(Mechanism::Filesystem));
        assert_eq!(
            denied("unlink", 30),
            Outcome::Refused(Mechanism::Filesystem)
        );
        assert_eq!(denied("connect", 1), Outcome::Refused(Mechanism::Network));
        assert_eq!(denied("proxy", 0), Outcome::Refused(Mechanism::Network));
        assert_eq!(denied("signal", 1), Outcome::Refused(Mechanism::Signal));
        assert_eq!(
            denied("io_uring_setup", 1),
            Outcome::Refused(Mechanism::Syscall)
        );
        for errno in [17, 2, 18, 39, 16, 111] {
            assert_eq!(denied("mkdir", errno), Outcome::Failed, "{errno}");
        }
        assert_eq!(denied("connect", 111), Outcome::Failed);
        // A unix socket's file outside the roots (round 23).
        assert_eq!(denied("bind", 30), Outcome::Refused(Mechanism::Filesystem));
        let marked = rec(json!({"kind": "chmod", "decision": "denied", "errno": 1,
            "target": {"refused_by": "seccomp"}}));
        assert_eq!(outcome(&marked), Outcome::Refused(Mechanism::Syscall));
        let allowed = rec(json!({"kind": "open", "decision": "allowed", "errno": 0}));
        assert_eq!(outcome(&allowed), Outcome::Allowed);
    }
}
