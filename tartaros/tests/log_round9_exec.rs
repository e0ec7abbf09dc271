//! Adversarial round 9 on exec records: a `#!` script in a `memfd`, run
//! with `execveat(fd, "", AT_EMPTY_PATH)`. The kernel hands the
//! interpreter `/dev/fd/N`, which names nothing once the process is
//! gone, and reports no open of the memfd (it is on no marked
//! filesystem). The record must say the script has no name
//! (`script_unnamed`): it said only `path: /dev/fd/N`, `binary: dash`,
//! because the interpreter's own open on the root's filesystem made the
//! supervisor skip the check. The same for a script in the sandbox's
//! private `/dev/shm`, which no mark covers, where `path` is only the
//! agent's string. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;

const AGENT: &str = r##"
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char name[] = "innocent.sh";
    int fd = memfd_create(name, 0);
    char body[] = "#!/bin/sh\necho ran-from-memfd\n";
    if (fd < 0 || write(fd, body, strlen(body)) != (ssize_t)strlen(body)) return 10;
    pid_t p = fork();
    if (p == 0) {
        char *const args[] = {"x", "memfd-marker", 0};
        char *const env[] = {0};
        char empty[] = "";
        syscall(SYS_execveat, fd, empty, args, env, AT_EMPTY_PATH);
        _exit(99);
    }
    int st;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) return 11;
    /* The sandbox's private /dev/shm: writable, and on no marked
     * filesystem. */
    char shm[] = "/dev/shm/r9.sh";
    int s = open(shm, O_CREAT | O_WRONLY | O_TRUNC, 0755);
    if (s < 0 || write(s, body, strlen(body)) != (ssize_t)strlen(body) || close(s)) return 12;
    p = fork();
    if (p == 0) {
        execl(shm, "r9", "shm-marker", (char *)0);
        _exit(99);
    }
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 13;
}
"##;

#[test]
fn a_memfd_script_run_by_descriptor_is_marked_as_unnamed() {
    if !usable("round9_memfd_script") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    assert!(stdout(&out).contains("ran-from-memfd"), "{}", stdout(&out));
    for (marker, at) in [
        ("memfd-marker", "/dev/fd/"),
        ("shm-marker", "/dev/shm/r9.sh"),
    ] {
        let exec = records
            .iter()
            .find(|r| {
                r["kind"] == "exec"
                    && allowed(r)
                    && r["target"]["argv"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|v| v == marker))
            })
            .unwrap_or_else(|| panic!("no exec record of {marker}: {records:#?}"));
        let path = field(exec, "path").unwrap_or_default();
        assert!(path.starts_with(at), "{exec}");
        assert!(
            exec["target"]["script_unnamed"] == true || field(exec, "script").is_some(),
            "a script ran and the record does not say so: {exec}"
        );
    }
    // A program is not taken for a script.
    for r in records.iter().filter(|r| r["kind"] == "exec") {
        if field(r, "path") == field(r, "binary") {
            assert!(r["target"].get("script_unnamed").is_none(), "{r}");
        }
    }
}
