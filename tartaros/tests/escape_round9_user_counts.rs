//! The user's inotify instances taken by an ordinary user's run
//! (adversarial round 9). The kernel counts inotify instances and watches
//! per uid in every user namespace up to the host's, so the agent of an
//! ordinary user's run, which is that user, shared the host's 128
//! instances with the user's own processes: it took all of them, and the
//! user's editor or file watcher on the host got EMFILE until the run
//! ended. Proved from the host side: an `inotify_init1` by the same uid
//! outside the sandbox while the agent holds every instance it could get.

mod common;
use std::path::Path;

use common::*;

const HOLD: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = 0
while held < 100000:
    if libc.inotify_init1(0) < 0:
        break
    held += 1
print('held', held, flush=True)
os.execvp('sleep', ['sleep', sys.argv[1]])
"#;

const HOST_TRY: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = libc.inotify_init1(0)
print('host', r >= 0 or ctypes.get_errno())
"#;

fn host_limit(name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/sys/user/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Starts `agent` (ending in `sleep marker`) in an ordinary run of
/// `user`, and runs `host_code` as `user` outside while the agent holds
/// what it took. The run's output, then the host process's.
fn while_holding(
    user: u32,
    agent: &str,
    marker: &str,
    host_code: &str,
) -> (std::process::Output, std::process::Output) {
    let run = tartaros_as(
        user,
        &["run", "--", "/usr/bin/python3", "-c", agent, marker],
        Path::new("/"),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut run = KillOnDrop(Some(run));
    assert!(
        eventually(20, || !processes_with(marker).is_empty()),
        "the agent never started"
    );
    let host = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            host_code,
        ])
        .output()
        .unwrap();
    let out = run.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    (out, host)
}

#[test]
fn an_ordinary_users_run_leaves_the_user_inotify_instances() {
    if !can_run("an_ordinary_users_run_leaves_the_user_inotify_instances") {
        return;
    }
    let (out, host) = while_holding(4397, HOLD, "6.1931", HOST_TRY);
    expect(&host, "host", "True");
    // The run got a bounded share, not nothing.
    let held: u64 = stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix("held "))
        .unwrap()
        .parse()
        .unwrap();
    let limit = host_limit("max_inotify_instances");
    assert!(held > 0 && held < limit, "held {held} of {limit}");
}

/// Pending signals are counted per uid the same way (up to the host's
/// `RLIMIT_SIGPENDING`, 96,369 here): an agent that queued real-time
/// signals to itself until EAGAIN left the user's host processes none to
/// queue (`sigqueue` EAGAIN) until the run ended.
const QUEUE: &str = r#"
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
class sigval(ctypes.Union):
    _fields_ = [('sival_int', ctypes.c_int), ('sival_ptr', ctypes.c_void_p)]
queued = 0
while queued < 1000000:
    if libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), sigval(0)) < 0:
        break
    queued += 1
print('queued', queued, flush=True)
# Blocked and pending signals survive the exec.
os.execvp('sleep', ['sleep', sys.argv[1]])
"#;

const HOST_QUEUE: &str = r#"
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
class sigval(ctypes.Union):
    _fields_ = [('sival_int', ctypes.c_int), ('sival_ptr', ctypes.c_void_p)]
r = libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), sigval(0))
print('host', r == 0 or ctypes.get_errno())
"#;

#[test]
fn an_ordinary_users_run_leaves_the_user_pending_signals() {
    if !can_run("an_ordinary_users_run_leaves_the_user_pending_signals") {
        return;
    }
    const USER: u32 = 4398;
    let (out, host) = while_holding(USER, QUEUE, "6.2137", HOST_QUEUE);
    expect(&host, "host", "True");
    let queued: u64 = stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix("queued "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(queued > 0, "{}", stdout(&out));
}
