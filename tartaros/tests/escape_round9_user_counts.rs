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

#[test]
fn an_ordinary_users_run_leaves_the_user_inotify_instances() {
    if !can_run("an_ordinary_users_run_leaves_the_user_inotify_instances") {
        return;
    }
    const USER: u32 = 4397;
    let run = tartaros_as(
        USER,
        &["run", "--", "/usr/bin/python3", "-c", HOLD, "6.1931"],
        Path::new("/"),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut run = KillOnDrop(Some(run));
    assert!(
        eventually(20, || !processes_with("6.1931").is_empty()),
        "the agent never started"
    );
    let host = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={USER}"),
            &format!("--regid={USER}"),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            HOST_TRY,
        ])
        .output()
        .unwrap();
    let out = run.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
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
