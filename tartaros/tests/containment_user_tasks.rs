//! An ordinary user's run on the user-namespace path (no service, no
//! delegated cgroup) has no pids cgroup: before, nothing bounded its
//! tasks, so one fork bomb took every pid of the host (pid_max is shared)
//! and no process of anyone could fork. The agent's own user namespace
//! bounds them instead: RLIMIT_NPROC counts the tasks of a uid per user
//! namespace, and only the run's tasks live in the agent's.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// A uid with no passwd entry: nothing to create or remove on the host.
const TEST_UID: u32 = 47_000 + 611;

/// Starts `want` threads (as many as it can), says how many on stdout,
/// then holds them until `release` exists.
const HOLDER: &str = r#"
import os, sys, threading, time
threading.stack_size(65536)
want, ready, release = int(sys.argv[1]), sys.argv[2], sys.argv[3]
done = threading.Event()
n = 0
try:
    for _ in range(want):
        threading.Thread(target=done.wait, daemon=True).start()
        n += 1
except RuntimeError:
    pass
print('threads', n, flush=True)
open(ready, 'w').write(str(n))
while not os.path.exists(release):
    time.sleep(0.05)
done.set()
"#;

/// The tasks the host's kernel counts for the processes whose command line
/// holds `marker` (each thread takes a pid of the host's pid_max).
fn host_tasks_of(marker: &str) -> usize {
    let mut tasks = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(marker)
            && !String::from_utf8_lossy(&cmdline).contains("tartaros")
        {
            tasks += std::fs::read_dir(entry.path().join("task"))
                .map(|d| d.count())
                .unwrap_or(0);
        }
    }
    tasks
}

/// Runs the holder as TEST_UID on the user-namespace path with `flags`,
/// and returns (tasks the host counted for the agent, the agent's report).
fn hold_threads(flags: &[&str], want: usize) -> (usize, String) {
    let work = owned_dir(TEST_UID);
    let script = work.join("holder.py");
    std::fs::write(&script, HOLDER).unwrap();
    chown(&script, TEST_UID);
    let ready = work.join("ready");
    let release = work.join("release");
    let want = want.to_string();
    let mut args = vec!["run", "--write", work.path().to_str().unwrap()];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "--",
        "/usr/bin/python3",
        script.to_str().unwrap(),
        &want,
        ready.to_str().unwrap(),
        release.to_str().unwrap(),
    ]);
    let mut command = tartaros_as(TEST_UID, &args, work.path());
    // No service: this is the path an ordinary user takes without one.
    command.env("TARTAROS_SERVICE", work.join("no-service.sock"));
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = KillOnDrop(Some(command.spawn().expect("spawn")));
    let started = eventually(60, || {
        ready.exists()
            || child
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    std::thread::sleep(Duration::from_millis(200));
    let counted = host_tasks_of(script.to_str().unwrap());
    std::fs::write(&release, "").unwrap();
    let out = child.take().wait_with_output().expect("wait");
    assert!(
        started,
        "the holder never got going: {}{}",
        stdout(&out),
        stderr(&out)
    );
    (counted, format!("{}{}", stdout(&out), stderr(&out)))
}

/// Root, and the python3 the holder runs as the test user (not a root-only
/// shim on PATH).
fn ready(test: &str) -> bool {
    if !can_run(test) {
        return false;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip(test, "no /usr/bin/python3");
        return false;
    }
    true
}

#[test]
fn an_ordinary_users_run_without_a_cgroup_holds_max_procs() {
    if !ready("containment_user_tasks") {
        return;
    }
    let (counted, report) = hold_threads(&["--max-procs", "40"], 200);
    assert!(
        counted > 0 && counted <= 40,
        "the host counted {counted} tasks of the agent under --max-procs 40: {report}"
    );
}

#[test]
fn an_ordinary_users_run_without_a_cgroup_has_the_default_task_bound() {
    if !ready("containment_user_tasks") {
        return;
    }
    // limits::defaults: 4096 tasks here, more only with more than 64 CPUs.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bound = 4096.max(64 * cpus);
    let want = bound + 200;
    let (counted, report) = hold_threads(&[], want);
    assert!(
        counted > 0 && counted <= bound,
        "the host counted {counted} tasks of one agent, above the default {bound}: {report}"
    );
}
