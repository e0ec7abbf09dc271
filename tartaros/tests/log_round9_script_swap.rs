//! Adversarial round 9 on exec records: a `#!` script swapped between
//! the kernel's open (which reads the `#!` line) and the interpreter's
//! open of it by name. The agent waits until its child is the
//! interpreter (`/proc/<pid>/exe` is `/bin/sh`), then renames another script over
//! the name: the interpreter runs that one (within 8 tries here). The
//! exec record names the file the kernel opened, by its name then, and
//! nothing records which file the interpreter read (successful
//! read-only opens are not captured): left open, docs/effect-log.md,
//! "Adversarial round 9". What the log does hold, and this test keeps:
//! the kernel-named rename over the script and the swapped-in script's
//! own effects under the child's pid. Needs root and gcc (fails under
//! CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r##"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int put(const char *name, const char *body) {
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (fd < 0) return -1;
    ssize_t n = write(fd, body, strlen(body));
    close(fd);
    return n == (ssize_t)strlen(body) ? 0 : -1;
}

int main(int argc, char **argv) {
    /* Names on the stack: a string on a page not yet faulted in cannot
       be read by the capture at the call's entry. */
    char run_tmp[] = "run.tmp", run[] = "run.sh", evil_tmp[] = "evil.tmp";
    char benign_ran[] = "benign-ran", evil_ran[] = "evil-ran";
    char *const env[] = {0};
    if (chdir(argv[1])) return 9;
    for (int k = 0; k < 200; k++) {
        if (put(run_tmp, "#!/bin/sh\n: > benign-ran\n") || rename(run_tmp, run)) return 10;
        if (put(evil_tmp, "#!/bin/sh\n: > evil-ran\n")) return 11;
        pid_t pid = fork();
        if (pid == 0) {
            char path[] = "./run.sh", marker[32];
            snprintf(marker, sizeof marker, "swap-%d.", k);
            char *const args[] = {"x", marker, 0};
            execve(path, args, env);
            _exit(99);
        }
        /* The child is the interpreter: the kernel has opened run.sh. */
        char exe[64], now[256];
        snprintf(exe, sizeof exe, "/proc/%d/exe", pid);
        for (;;) {
            ssize_t n = readlink(exe, now, sizeof now - 1);
            if (n < 0) break;
            now[n] = 0;
            if (strcmp(now, argv[2]) == 0) break;
        }
        if (rename(evil_tmp, run)) return 12;
        int st;
        waitpid(pid, &st, 0);
        if (access(evil_ran, F_OK) == 0) {
            printf("%d\n", k);
            return 0;
        }
        unlink(benign_ran);
    }
    return 20;
}
"##;

#[test]
fn a_script_swapped_before_the_interpreter_reads_it_leaves_the_swap_in_the_log() {
    if !usable("exec_script_swap") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    chown(root.path(), NOBODY);
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let (out, records) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), dir, sh.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let k = stdout(&out).trim().to_string();
    eprintln!("swapped on attempt {k}");
    let marker = format!("swap-{k}.");
    let exec = *execs_marked(&records, &marker)
        .first()
        .unwrap_or_else(|| panic!("no exec of {marker}: {records:#?}"));
    let script = format!("{dir}/run.sh");
    // The kernel's open: the name, which held the benign script then.
    assert_eq!(field(exec, "script"), Some(script.as_str()), "{exec}");
    let child = exec["pid"].clone();
    // What the swapped-in script did, under the child's pid.
    let evil = format!("{dir}/evil-ran");
    let created = records
        .iter()
        .find(|r| r["pid"] == child && field(r, "path") == Some(evil.as_str()))
        .unwrap_or_else(|| panic!("no effect of the swapped-in script: {records:#?}"));
    assert!(allowed(created), "{created}");
    // The rename over the script before that, named by the kernel. The
    // exec record is written at `sched_process_exec`, after the kernel's
    // open and after `/proc/<pid>/exe` changed: the rename lands before
    // or after it in the log, so its order says nothing of which file
    // the interpreter read.
    let evil_tmp = format!("{dir}/evil.tmp");
    let seq = |r: &Value| r["seq"].as_u64().unwrap();
    let swap = records
        .iter()
        .rev()
        .find(|r| {
            r["kind"] == "rename"
                && seq(r) < seq(created)
                && field(r, "to") == Some(script.as_str())
                && field(r, "from") == Some(evil_tmp.as_str())
        })
        .unwrap_or_else(|| panic!("no rename over {script}: {records:#?}"));
    assert_eq!(field(swap, "path_source"), Some("kernel"), "{swap}");
    let order = if seq(swap) > seq(exec) {
        "after"
    } else {
        "before"
    };
    eprintln!("the swap is {order} the exec record");
}
