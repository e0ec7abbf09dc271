//! A signal sent through a pidfd names the process the kernel signalled,
//! not the one the descriptor's number holds when the record is read: the
//! agent kills one child through fd 10, then puts a pidfd of another child
//! at fd 10 and keeps it there. The truth is seen from the host side: the
//! first child's exit record says it died of the signal, the second lived.
//! Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t sleeper(const char *arg) {
    pid_t p = fork();
    if (p == 0) { execl("/bin/sleep", "sleep", arg, (char *)0); _exit(127); }
    /* Until it runs sleep, so that the log has its exec. */
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", p);
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen(path, "r");
        if (f) { fgets(comm, sizeof comm, f); fclose(f); }
        if (!strncmp(comm, "sleep", 5)) break;
        usleep(1000);
    }
    return p;
}

int main(void) {
    pid_t victim = sleeper("101"), bystander = sleeper("102");
    int v = syscall(SYS_pidfd_open, victim, 0), b = syscall(SYS_pidfd_open, bystander, 0);
    if (v < 0 || b < 0 || dup2(v, 10) != 10) return 2;
    if (syscall(SYS_pidfd_send_signal, 10, SIGTERM, NULL, 0) != 0) return 3;
    /* The call is over; the descriptor now names the bystander, long
       enough for any reader of /proc to see it. */
    if (dup2(b, 10) != 10) return 4;
    int status;
    waitpid(victim, &status, 0);
    usleep(400000);
    /* A control: a signal through a descriptor that stays put, to a
       process that is still there, is named. */
    if (syscall(SYS_pidfd_send_signal, 10, SIGCONT, NULL, 0) != 0) return 5;
    usleep(400000);
    kill(bystander, SIGKILL);
    waitpid(bystander, &status, 0);
    return 0;
}
"#;

/// The host pid of the `sleep ARG` the log saw start.
fn sleeper_pid(log: &[Value], arg: &str) -> u64 {
    log.iter()
        .find(|r| r["kind"] == "exec" && r["target"]["argv"] == serde_json::json!(["sleep", arg]))
        .and_then(|r| r["pid"].as_u64())
        .unwrap_or_else(|| panic!("no exec of sleep {arg} in {log:#?}"))
}

#[test]
fn a_pidfd_signal_names_the_process_the_kernel_signalled() {
    if !usable("log_pidfd_target") {
        return;
    }
    let bin = Dir::open_to_all();
    let exe = compile(&bin, "pidfd_swap", AGENT);
    let work = owned_dir(NOBODY);
    let logs = Dir::new();
    let (out, log) = run_logged(&work, &logs, &[exe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let victim = sleeper_pid(&log, "101");
    let bystander = sleeper_pid(&log, "102");
    // The host side: the victim died of SIGTERM, the bystander of SIGKILL.
    let died_of = |pid: u64| {
        log.iter()
            .find(|r| r["kind"] == "exit" && r["pid"] == pid)
            .map(|r| r["target"].clone())
            .unwrap_or_else(|| panic!("no exit of {pid}"))
    };
    assert_eq!(died_of(victim)["signal"], 15, "{}", died_of(victim));
    let sent: Vec<&Value> = log
        .iter()
        .filter(|r| r["kind"] == "signal" && r["target"]["call"] == "pidfd_send_signal")
        .collect();
    assert_eq!(sent.len(), 2, "{sent:#?}");
    let t = &sent[0]["target"];
    assert_ne!(
        t["to_host_pid"].as_u64(),
        Some(bystander),
        "the record names the process the fd held afterwards: {t}"
    );
    assert!(
        t["to_host_pid"].as_u64() == Some(victim) || t["to_unresolved"] == true,
        "{t}"
    );
    assert_eq!(t["signal"], 15, "{t}");
    let control = &sent[1]["target"];
    assert_eq!(
        (control["to_host_pid"].as_u64(), &control["signal"]),
        (Some(bystander), &serde_json::json!(18)),
        "{control}"
    );
    assert_eq!(control["outside"], false, "{control}");
    assert!(control.get("target_unverified").is_none(), "{control}");
}
