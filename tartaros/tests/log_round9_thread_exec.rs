//! Adversarial round 9 on exec records: a nested `#!` script run by a
//! thread that is not its process's leader. The kernel queues the exec
//! opens under the thread's own id, which is gone once the exec has
//! made it the leader (`de_thread`), and the exec record names only the
//! process. The record must still name the script the kernel ran.
//! Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;

const AGENT: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static char *script;
static char marker[32];

static void *run(void *arg) {
    char *const args[] = {"x", marker, 0};
    char *const env[] = {0};
    execve(script, args, env);
    _exit(99);
}

int main(int argc, char **argv) {
    script = argv[1];
    for (int i = 0; i < 10; i++) {
        if (fork() == 0) {
            snprintf(marker, sizeof marker, "thread-%d", i);
            pthread_t th;
            if (pthread_create(&th, NULL, run, NULL)) _exit(98);
            pthread_join(th, NULL);
            _exit(97);
        }
        int st;
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) return 10;
    }
    return 0;
}
"#;

#[test]
fn a_script_run_by_a_non_leader_thread_is_named() {
    if !usable("exec_script_thread") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    for (name, body) in [
        ("inner.sh", "#!/bin/sh\nexit 0\n".to_string()),
        ("outer.sh", format!("#!{dir}/inner.sh\nexit 0\n")),
    ] {
        let path = root.file(name, &body);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    chown(root.path(), NOBODY);
    let outer = format!("{dir}/outer.sh");
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), &outer]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let execs: Vec<_> = records
        .iter()
        .filter(|r| {
            r["kind"] == "exec"
                && allowed(r)
                && r["target"]["argv"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|v| v.as_str().is_some_and(|s| s.starts_with("thread-")))
                })
        })
        .collect();
    assert_eq!(execs.len(), 10, "{records:#?}");
    let unnamed: Vec<_> = execs
        .iter()
        .filter(|e| field(e, "script") != Some(outer.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "{} of {} execs by a thread not named: {unnamed:#?}",
        unnamed.len(),
        execs.len()
    );
}
