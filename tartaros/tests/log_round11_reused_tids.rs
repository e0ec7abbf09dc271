//! Adversarial round 11: a tid the sandbox had, reused by the host. The
//! agent wraps the host's pids (`pid_max` + 2,000 forks); a host process
//! that gets the tid of a sandbox thread whose process had exited, and
//! changes a file on the roots' filesystem, was placed as the sandbox's
//! (the tid was known): the host's files became `create` and `write`
//! records of the run (6 to 11 a run beside another checkout's cargo
//! build, verify `ok`). Here the host is a shell making and removing
//! files next to the root with a new process each time. No record may
//! name a file outside the root. Needs root and gcc (fails under CI=true
//! without).

mod common;

use common::logged::*;
use common::*;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = atol(argv[1]);
    for (long i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) _exit(0);
        if (p < 0) return 2;
        waitpid(p, NULL, 0);
    }
    return 0;
}
"#;

#[test]
fn a_host_process_with_a_reused_tid_is_not_the_sandbox() {
    if !usable("round11_reused_tids") {
        return;
    }
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if pid_max > 65_536 {
        skip(
            "round11_reused_tids",
            "pid_max is too large to wrap in a test",
        );
        return;
    }
    let (root, bin, logs, host) = (Dir::new(), Dir::open_to_all(), Dir::new(), Dir::new());
    let agent = compile(&bin, "wrapper", AGENT);
    // The host: a new `touch` and `rm` process per file, on the root's
    // filesystem, until the run ends.
    let script = format!(
        "cd {} && i=0; while [ ! -e stop ]; do i=$((i+1)); touch h$i; rm -f h$((i-1)); done",
        host.path().display()
    );
    let mut churn = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let forks = (pid_max + 2_000).to_string();
    let (out, records, code, line) =
        run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), &forks]);
    std::fs::write(host.join("stop"), b"").unwrap();
    churn.wait().unwrap();
    if seal(&records)["lost"] != 0 {
        eprintln!("events were lost (a loaded host): reuse not tested ({line})");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let dir = root.path().to_str().unwrap();
    let host_dir = host.path().to_str().unwrap();
    let outside: Vec<String> = records
        .iter()
        .filter(|r| {
            ["path", "from", "to"].iter().any(|k| {
                field(r, k).is_some_and(|p| p.starts_with(host_dir) && !p.starts_with(dir))
            })
        })
        .map(|r| r.to_string())
        .collect();
    assert!(
        outside.is_empty(),
        "{} records of the host's files (verify {code:?}: {line}); first: {}",
        outside.len(),
        outside[0]
    );
}
