//! Every run's agent is in network, IPC, UTS, mount, PID and cgroup
//! namespaces of its own: none is the host's, none is another run's, also
//! when the init's template made the network, IPC and UTS namespaces ahead
//! of the request (zygote.rs). Read from the host, in `/proc/<pid>/ns`.

mod common;
use std::time::Duration;

use common::*;

const KINDS: [&str; 6] = ["net", "ipc", "uts", "mnt", "pid_for_children", "cgroup"];

fn namespaces(pid: i32) -> Vec<String> {
    KINDS
        .iter()
        .map(|kind| {
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_else(|e| panic!("ns/{kind} of {pid}: {e}"))
        })
        .collect()
}

fn marker(name: &str) -> String {
    format!("1000.{}{}", std::process::id(), name.len())
}

#[test]
fn concurrent_runs_have_namespaces_of_their_own() {
    if !can_run("namespaces_own") {
        return;
    }
    let work = Dir::new();
    let host = namespaces(std::process::id() as i32);
    let variants: [&[&str]; 2] = [
        &[],
        &["--isolate-pids", "--isolate-proc", "--seccomp-strict"],
    ];
    let mut runs = Vec::new();
    let mut markers = Vec::new();
    for (i, flags) in variants.iter().enumerate() {
        for j in 0..2 {
            let m = marker(&"x".repeat(1 + i * 2 + j));
            let mut args = vec!["run"];
            args.extend_from_slice(flags);
            args.extend(["--", "sleep", m.as_str()]);
            runs.push(spawn_quiet(&args, work.path()));
            markers.push(m);
        }
    }
    let mut seen: Vec<Vec<String>> = Vec::new();
    for m in &markers {
        assert!(
            eventually(10, || processes_with(m).len() == 1),
            "the agent {m} did not start"
        );
        let agent = namespaces(processes_with(m)[0]);
        for (k, kind) in KINDS.iter().enumerate() {
            assert_ne!(agent[k], host[k], "{kind}: the host's");
            for other in &seen {
                assert_ne!(agent[k], other[k], "{kind}: another run's");
            }
        }
        seen.push(agent);
    }
    for mut run in runs {
        let mut child = run.take();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while child.try_wait().expect("wait").is_none() {
            assert!(std::time::Instant::now() < deadline, "a run did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
