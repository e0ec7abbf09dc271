//! Attacks of adversarial round 9 that held against the code as it was;
//! kept because no other test tries these techniques.

mod common;
use std::path::Path;

use common::*;

/// The agent makes itself a child subreaper, so that orphans come to it
/// rather than to the init, and leaves a grandchild in its own session
/// that ignores SIGHUP and SIGTERM, then exits at once.
const SUBREAPER: &str = r#"
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36
print('subreaper', libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
# Closed on exec: EOF once the grandchild is `sleep`.
ready, exec_done = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for fd in (0, 1, 2, ready):
            os.close(fd)
        os.execvp('sleep', ['sleep', sys.argv[1]])
    os._exit(0)
os.close(exec_done)
os.wait()
os.read(ready, 1)
print('left')
"#;

fn assert_nothing_outlives(out: &std::process::Output, marker: &str) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    expect(out, "subreaper", "0");
    assert!(stdout(out).contains("left"), "{}", stdout(out));
    assert!(
        eventually(5, || processes_with(marker).is_empty()),
        "a process of the run outlived it: {:?}",
        processes_with(marker)
    );
}

#[test]
fn a_subreapers_orphan_does_not_outlive_a_root_run() {
    if !can_run("a_subreapers_orphan_does_not_outlive_a_root_run") {
        return;
    }
    let out = tartaros(
        &["run", "--", "python3", "-c", SUBREAPER, "47.9131"],
        Path::new("/"),
    );
    assert_nothing_outlives(&out, "47.9131");
}

#[test]
fn a_subreapers_orphan_does_not_outlive_an_ordinary_users_run() {
    if !can_run("a_subreapers_orphan_does_not_outlive_an_ordinary_users_run") {
        return;
    }
    let out = run_as(
        4394,
        &["run", "--", "python3", "-c", SUBREAPER, "47.9137"],
        Path::new("/"),
    );
    assert_nothing_outlives(&out, "47.9137");
}

/// In an ordinary user's run the init and the agent have the same uid:
/// only the init's user namespace and its dumpable flag keep the agent out
/// of its memory, descriptors and root (the init is privileged in the
/// mount namespace, so its memory would be a way to undo the mount plan).
const INIT: &str = r#"
import os, signal
def attempt(label, call):
    try:
        call()
        print(label, 'done')
    except OSError as e:
        print(label, e.errno)
attempt('mem', lambda: os.close(os.open('/proc/1/mem', os.O_RDWR)))
attempt('root', lambda: os.readlink('/proc/1/root'))
attempt('cwd', lambda: os.listdir('/proc/1/cwd/'))
attempt('fd', lambda: os.close(os.open('/proc/1/fd/0', os.O_RDONLY)))
attempt('environ', lambda: open('/proc/1/environ').read())
attempt('oom', lambda: open('/proc/1/oom_score_adj', 'w').write('1000'))
attempt('comm', lambda: open('/proc/1/comm', 'w').write('x'))
attempt('stop', lambda: os.kill(1, signal.SIGSTOP))
"#;

#[test]
fn an_ordinary_users_agent_cannot_reach_into_its_init() {
    if !can_run("an_ordinary_users_agent_cannot_reach_into_its_init") {
        return;
    }
    let started = std::time::Instant::now();
    let out = run_as(4395, &["run", "--", "python3", "-c", INIT], Path::new("/"));
    // The init was not stopped: the run ended as soon as the agent did.
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let eacces = libc::EACCES.to_string();
    for label in ["mem", "root", "cwd", "fd", "environ", "oom", "comm"] {
        expect(&out, label, &eacces);
    }
    expect(&out, "stop", &libc::EPERM.to_string());
}
