//! Adversarial round 9 on exec records: an exec that fails after the
//! kernel opened its script (the `#!` line names no file: ENOENT), then
//! an exec of a script with an argument too long (E2BIG, also after the
//! open), then an exec of a plain program by the same process. The kernel reported
//! the script's open; the program's record must not take it for its own
//! script. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;

const AGENT: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char *const env[] = {0};
    pid_t pid = fork();
    if (pid == 0) {
        char *const bad[] = {"x", "failed-first", 0};
        execve(argv[1], bad, env);
        /* A good script with one argument over MAX_ARG_STRLEN: E2BIG
           once the kernel has opened the file. */
        char *huge = malloc(200000);
        memset(huge, 'a', 199999);
        huge[199999] = 0;
        char *const big[] = {"x", huge, 0};
        execve(argv[2], big, env);
        char *const prog[] = {"true", "program-after", 0};
        execve("/usr/bin/true", prog, env);
        _exit(99);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 10;
}
"#;

#[test]
fn a_failed_script_exec_is_not_the_next_program_s_script() {
    if !usable("exec_failed_then_program") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let bad = root.file("evil.sh", "#!/nonexistent/interpreter\n");
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let good = nested_scripts(&root);
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), bad.to_str().unwrap(), &good],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    // Both failures are in the log (each forgets its thread's opens).
    for errno in [2, 7] {
        assert!(
            records
                .iter()
                .any(|r| r["kind"] == "exec" && r["decision"] == "denied" && r["errno"] == errno),
            "no failed exec with errno {errno}: {records:#?}"
        );
    }
    let program = execs_marked(&records, "program-after");
    assert_eq!(program.len(), 1, "{records:#?}");
    let p = program[0];
    assert_eq!(p["target"].get("script"), None, "{p}");
    assert_eq!(p["target"].get("scripts"), None, "{p}");
}
