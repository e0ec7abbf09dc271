//! Calls the seccomp filter refuses for their arguments only (a user or
//! mount namespace, raw and packet sockets, a core-size limit, an unsafe
//! personality) or under `--seccomp-strict` only (`ptrace`, `chroot`) are
//! escape attempts a reviewer must see. Each is made by
//! a real agent under `tartaros run --log`; the test checks the kernel's
//! verdict from the agent's exit code and the `syscall` record in the log.
//! Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    struct rlimit big = {RLIM_INFINITY, RLIM_INFINITY};
    if (syscall(SYS_unshare, CLONE_NEWUSER | CLONE_NEWNS) != -1 || errno != EPERM) return 10;
    if (syscall(SYS_clone, CLONE_NEWUSER | 17, 0, 0, 0, 0) != -1 || errno != EPERM) return 11;
    if (syscall(SYS_socket, AF_PACKET, SOCK_RAW, 0) != -1 || errno != EPERM) return 12;
    if (syscall(SYS_socket, AF_INET, SOCK_RAW | SOCK_CLOEXEC, 1) != -1 || errno != EPERM) return 13;
    if (syscall(SYS_setrlimit, RLIMIT_CORE, &big) != -1 || errno != EPERM) return 14;
    if (syscall(SYS_prlimit64, 0, RLIMIT_CORE, &big, 0) != -1 || errno != EPERM) return 15;
    if (syscall(SYS_personality, READ_IMPLIES_EXEC) != -1 || errno != EPERM) return 16;
    /* Allowed by the filter: no record. The kernel's own EPERM (a hard
       limit raised without CAP_SYS_RESOURCE) is not the filter's. */
    if (syscall(SYS_unshare, CLONE_FILES) != 0) return 17;
    if (syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0) < 0) return 18;
    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &big, 0) != -1 || errno != EPERM) return 19;
    return 0;
}
"#;

/// The `syscall` records of `name`.
fn attempts<'a>(records: &'a [Value], name: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "syscall" && r["target"]["syscall"] == name)
        .collect()
}

#[test]
fn calls_refused_for_their_arguments_are_recorded() {
    if !usable("seccomp_args") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    for (name, count, key, value) in [
        ("unshare", 1, "flags", 0x1002_0000u64),
        ("clone", 1, "flags", 0x1000_0011),
        ("setrlimit", 1, "resource", 4),
        ("prlimit64", 1, "resource", 4),
        ("personality", 1, "persona", 0x40_0000),
    ] {
        let found = attempts(&records, name);
        assert_eq!(found.len(), count, "{name}: {found:#?}");
        let r = found[0];
        assert_eq!(r["decision"], "denied", "{r}");
        assert_eq!(r["errno"], 1, "{r}");
        assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
        assert_eq!(r["target"][key], value, "{r}");
    }
    let sockets = attempts(&records, "socket");
    assert_eq!(sockets.len(), 2, "{sockets:#?}");
    assert_eq!(
        sockets[0]["target"]["domain"], 17,
        "AF_PACKET: {}",
        sockets[0]
    );
    assert_eq!(sockets[1]["target"]["domain"], 2, "AF_INET: {}", sockets[1]);
    assert_eq!(sockets[1]["target"]["type"], 0x8_0003, "{}", sockets[1]);
    assert!(
        sockets
            .iter()
            .all(|s| s["target"]["refused_by"] == "seccomp"),
        "{sockets:#?}"
    );
}

const STRICT_AGENT: &str = r#"
#include <errno.h>
#include <sys/ptrace.h>
#include <unistd.h>

int main(void) {
    if (ptrace(PTRACE_TRACEME, 0, 0, 0) != -1 || errno != EPERM) return 10;
    if (chroot("/") != -1 || errno != EPERM) return 11;
    return 0;
}
"#;

#[test]
fn calls_refused_only_by_the_strict_filter_are_recorded() {
    if !usable("seccomp_strict_always") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", STRICT_AGENT);
    let log = logs.join("effects.jsonl");
    let out = tartaros(
        &[
            "run",
            "--seccomp-strict",
            "--write",
            root.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            agent.to_str().unwrap(),
        ],
        root.path(),
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for name in ["ptrace", "chroot"] {
        let found = attempts(&records, name);
        assert_eq!(found.len(), 1, "{name}: {found:#?}");
        assert_eq!(found[0]["decision"], "denied", "{}", found[0]);
        assert_eq!(found[0]["errno"], 1, "{}", found[0]);
    }
}
