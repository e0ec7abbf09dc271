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
    let outer = nested_scripts(&root);
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), &outer]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let execs = execs_marked(&records, "thread-");
    assert_eq!(execs.len(), 10, "{records:#?}");
    assert_scripts_named(&execs, &outer);
}
