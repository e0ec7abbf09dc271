//! Adversarial round 9: pid reuse in the readers. The host's pids wrap
//! (`pid_max`, 32,768 here), so an agent that forks that many times gets
//! the pid of one of its earlier processes. `log summary` counted a
//! refusal once per pid, so a later process's refusal was added to an
//! earlier one's (`×2 by P /bin/cat`): an agent could file its own
//! refusals under an innocent program. Needs root and gcc (fails under
//! CI=true without); skipped where pid_max is too large to wrap quickly.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

/// 200 processes run `cat KEY` (refused: a read-denied directory), then
/// `argv[2]` children each try to open KEY themselves and exit.
const AGENT: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *key = argv[1];
    long n = atol(argv[2]);
    for (int i = 0; i < 200; i++) {
        pid_t p = fork();
        if (p == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 2);
            execl("/bin/cat", "cat", key, (char *)NULL);
            _exit(127);
        }
        waitpid(p, NULL, 0);
    }
    for (long i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) _exit(open(key, O_RDONLY) < 0 ? 0 : 1);
        if (p < 0) return 2;
        waitpid(p, NULL, 0);
    }
    return 0;
}
"#;

#[test]
fn a_reused_pid_does_not_file_a_refusal_under_another_program() {
    if !usable("round9_pid_reuse") {
        return;
    }
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if pid_max > 65_536 {
        skip("round9_pid_reuse", "pid_max is too large to wrap in a test");
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    let agent = compile(&bin, "agent", AGENT);
    let key = secret.join("key");
    let forks = (pid_max + 4_000).to_string();
    let argv = [
        agent.to_str().unwrap(),
        key.to_str().unwrap(),
        forks.as_str(),
    ];
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let mut args = vec![
        "run",
        "-q",
        "--write",
        r,
        "--read-deny",
        secret.path().to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(&argv);
    let out = tartaros(&args, root.path());
    assert!(out.status.success(), "run: {}", stderr(&out));
    let records = records(&log);
    // The pids the cats had, and whether a later process got one of them.
    let cats: std::collections::HashSet<u64> = records
        .iter()
        .filter(|r| r["kind"] == "exec" && allowed(r) && field(r, "path") == Some("/bin/cat"))
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    assert_eq!(cats.len(), 200, "cat execs");
    let last_cat = records
        .iter()
        .rposition(|r| r["kind"] == "exec" && field(r, "path") == Some("/bin/cat"))
        .unwrap();
    let reused = records[last_cat..]
        .iter()
        .filter(|r| r["kind"] == "fork")
        .filter_map(|r| r["target"]["child"].as_u64())
        .filter(|c| cats.contains(c))
        .count();
    assert!(reused > 0, "no pid of a cat was reused in {forks} forks");
    let summary = tartaros(
        &["log", "summary", "--json", log.to_str().unwrap()],
        root.path(),
    );
    let json: Value = serde_json::from_str(&stdout(&summary)).expect("summary JSON");
    let refusals = json["refusals"].as_array().expect("refusals");
    let by_cat: Vec<&Value> = refusals
        .iter()
        .filter(|r| {
            r["command"]
                .as_str()
                .is_some_and(|c| c.contains("/bin/cat"))
        })
        .filter(|r| r["target"].as_str().is_some_and(|t| t.contains("/key")))
        .collect();
    assert_eq!(by_cat.len(), 200, "{by_cat:#?}");
    for r in by_cat {
        assert_eq!(
            r["count"], 1,
            "a refusal of another process counted as cat's: {r}"
        );
    }
}
