//! The launcher's CPU and I/O priority are not the agent's (adversarial
//! round 7). Scheduling policy, nice value and I/O class survive `fork`
//! and `execve`, and no cgroup limit of a run holds a real-time task: a
//! `tartaros run` started under `chrt -f 5` ran its agent `SCHED_FIFO`,
//! where one busy loop per CPU starves every ordinary task of the host.
//! Checked from the host: the agent's policy, nice value, I/O class and
//! limits in its /proc, after it tried to raise them itself.

mod common;
use std::process::{Command, Stdio};

use common::*;

/// Tries real-time scheduling and a lower nice value, then becomes a
/// `sleep` the host can find by its argument.
const AGENT: &str = r#"
import os, sys
for name, call in (('fifo', lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))),
                   ('nice', lambda: os.setpriority(os.PRIO_PROCESS, 0, -1))):
    try:
        call(); print(name, 'OK', flush=True)
    except OSError as e:
        print(name, e.errno, flush=True)
os.execvp('sleep', ['sleep', sys.argv[1]])
"#;

/// `/proc/<pid>/stat` fields after the command name: (nice, policy).
fn nice_and_policy(pid: i32) -> (i64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // Field 19 is nice and 41 the policy; `rest` starts at field 3.
    (rest[16].parse().unwrap(), rest[38].parse().unwrap())
}

fn limit(pid: i32, name: &str) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
    line[name.len()..]
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn io_class(pid: i32) -> i64 {
    // SAFETY: ioprio_get(IOPRIO_WHO_PROCESS, pid) takes two integers.
    let prio = unsafe { libc::syscall(libc::SYS_ioprio_get, 1, pid) };
    assert!(prio >= 0, "ioprio_get: {}", std::io::Error::last_os_error());
    prio >> 13
}

#[test]
fn a_real_time_launcher_does_not_make_a_real_time_agent() {
    if !can_run("a_real_time_launcher_does_not_make_a_real_time_agent") {
        return;
    }
    let work = Dir::new();
    let marker = format!("3000.{}", std::process::id());
    // chrt -f 5, nice -5, the real-time I/O class: what a launcher with
    // CAP_SYS_NICE (or an RT harness) hands its children.
    let child = Command::new("chrt")
        .args([
            "-f", "5", "nice", "-n", "-5", "ionice", "-c", "1", "-n", "4",
        ])
        .arg(bin())
        .args(["run", "-q", "--", "python3", "-c", AGENT, &marker])
        .current_dir(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chrt");
    let mut run = KillOnDrop(Some(child));
    let mut pids = Vec::new();
    let found = eventually(20, || {
        pids = processes_with(&marker);
        !pids.is_empty()
    });
    assert!(found, "the agent's sleep never started");
    let pid = pids[0];
    let (nice, policy) = nice_and_policy(pid);
    let (rtprio, max_nice) = (
        limit(pid, "Max realtime priority"),
        limit(pid, "Max nice priority"),
    );
    let io = io_class(pid);
    let out = {
        let child = run.take();
        // SAFETY: kill takes two integers; the supervisor is our child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait_with_output().unwrap()
    };
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(policy, 0, "the agent is not SCHED_OTHER: {said}");
    assert_eq!(nice, 0, "the agent kept the launcher's nice value: {said}");
    assert_ne!(io, 1, "the agent kept the real-time I/O class: {said}");
    assert_eq!(rtprio, "0 0", "RLIMIT_RTPRIO: {said}");
    assert_eq!(max_nice, "0 0", "RLIMIT_NICE: {said}");
    assert!(
        stdout(&out).contains(&format!("fifo {}", libc::EPERM)),
        "{said}"
    );
    assert!(
        stdout(&out).contains(&format!("nice {}", libc::EACCES)),
        "{said}"
    );
}
