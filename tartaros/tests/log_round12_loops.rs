//! Round 12 on the log: two routine loops that round 11's branch logged
//! as `incomplete` (a run then exits 122) or with an effect the capture
//! did see logged as `uncaptured`.
//!
//! - A lock file written and renamed over its target, in one thread and
//!   in a process per round (git's `config.lock`, 4 times per `git
//!   init`): the kernel merged the thread's notifications of different
//!   files of the same name, so the writes of a later lock file were
//!   queued before the earlier file's rename and stayed at `config.lock`,
//!   `not_found` (verify incomplete).
//! - One name created and removed many times, with the name in a page the
//!   capture cannot read at the first call: the create records took the
//!   notifications by name, the first one (held without a name) found all
//!   of them claimed, and the last notification was logged `uncaptured`.
//!
//! Both runs must verify `ok`, and every record must be the call's own,
//! named as the file was. Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const ROUNDS: usize = 20;

const LOCKS: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int cycle(int i) {
    char line[32];
    int fd = open("config.lock", O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return 1;
    int n = snprintf(line, sizeof line, "[core] %d\n", i);
    if (write(fd, line, n) != n || write(fd, "\n", 1) != 1) return 2;
    if (close(fd)) return 3;
    return rename("config.lock", "config") ? 4 : 0;
}

int main(int argc, char **argv) {
    int rounds = atoi(argv[2]);
    if (chdir(argv[1])) return 9;
    /* One thread, as `git init` writes its config. */
    for (int i = 0; i < rounds; i++)
        if (cycle(i)) return 10;
    /* A process per round, as one git command after another. */
    for (int i = 0; i < rounds; i++) {
        pid_t pid = fork();
        if (pid < 0) return 11;
        if (pid == 0) _exit(cycle(rounds + i));
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            return 12;
    }
    return 0;
}
"#;

#[test]
fn a_lock_file_written_and_renamed_in_a_loop_verifies_ok() {
    if !usable("round12_locks") {
        return;
    }
    for run in 0..3 {
        let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
        let agent = compile(&bin, "locks", LOCKS);
        let dir = root.path().to_str().unwrap();
        let rounds = ROUNDS.to_string();
        let (out, records, code, line) =
            run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir, &rounds]);
        let lock = format!("{dir}/config.lock");
        let config = format!("{dir}/config");
        let mut wrong = Vec::new();
        for r in &records {
            if r["target"]["not_found"] == true || r["target"]["uncaptured"] == true {
                wrong.push(format!("{r}"));
            }
        }
        let of =
            |kind: &str| -> Vec<&Value> { records.iter().filter(|r| r["kind"] == kind).collect() };
        let creates: Vec<&Value> = of("create")
            .into_iter()
            .filter(|r| allowed(r) && field(r, "path") == Some(lock.as_str()))
            .collect();
        let renames: Vec<&Value> = of("rename")
            .into_iter()
            .filter(|r| field(r, "from") == Some(lock.as_str()))
            .collect();
        if creates.len() != 2 * ROUNDS
            || creates
                .iter()
                .any(|r| field(r, "path_source") != Some("kernel"))
        {
            wrong.push(format!(
                "{} kernel-named creates of config.lock: {creates:?}",
                creates.len()
            ));
        }
        if renames.len() != 2 * ROUNDS
            || renames.iter().any(|r| {
                field(r, "to") != Some(config.as_str()) || field(r, "path_source") != Some("kernel")
            })
        {
            wrong.push(format!(
                "{} renames of config.lock: {renames:?}",
                renames.len()
            ));
        }
        // The writes: one record per writing process and file, named by
        // a name the file had (the lock's, or the name it was renamed to).
        let writes = of("write");
        let named: Vec<&&Value> = writes
            .iter()
            .filter(|r| matches!(field(r, "path"), Some(p) if p == lock || p == config))
            .collect();
        if named.len() != writes.len() || writes.len() < 1 + ROUNDS {
            wrong.push(format!("write records: {writes:?}"));
        }
        // One record per writing process and file: the first process's
        // 20 files (all named `config` once renamed), and one per child.
        let mut by_pid: std::collections::BTreeMap<u64, usize> = Default::default();
        for r in &named {
            *by_pid.entry(r["pid"].as_u64().unwrap_or(0)).or_default() += 1;
        }
        let first = by_pid.values().filter(|n| **n == ROUNDS).count();
        let children = by_pid.values().filter(|n| **n == 1).count();
        if first != 1 || children != ROUNDS {
            wrong.push(format!("write records per process: {by_pid:?}"));
        }
        assert!(
            wrong.is_empty() && code == Some(0),
            "run {run}: verify {code:?} ({line}); {} wrong:\n{}\nstderr: {}",
            wrong.len(),
            wrong.join("\n"),
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    }
}

/// The name lives in a page that nothing touches before the first
/// `open`: a file mapping with `MADV_RANDOM` (no fault-around maps it
/// early). The capture reads the name at the syscall's entry and cannot
/// fault the page in, so the first create's record has no name of its own
/// and waits to be paired by position; the agent then pauses (100 ms, less
/// than the join's 200 ms hold) so that the next records come in a later
/// read, with notifications read after the held record's call ended.
const SAME_NAME: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rounds = atoi(argv[2]);
    int nf = open(argv[3], O_RDONLY);
    if (nf < 0) return 8;
    char *name = mmap(0, 4096, PROT_READ, MAP_PRIVATE, nf, 0);
    if (name == MAP_FAILED || madvise(name, 4096, MADV_RANDOM) || close(nf)) return 8;
    if (chdir(argv[1])) return 9;
    for (int i = 0; i < rounds; i++) {
        int fd = open(name, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        /* The first record alone in a read of the ring: held, it is
           settled only after the next records were paired. */
        if (i == 0) usleep(100000);
        if (fd < 0 || close(fd) || unlink(name)) return 10;
    }
    return 0;
}
"#;

#[test]
fn every_create_of_one_name_in_a_loop_is_its_own_and_named() {
    if !usable("round12_same_name") {
        return;
    }
    const LOOP: usize = 2000;
    for run in 0..3 {
        let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
        let agent = compile(&bin, "same_name", SAME_NAME);
        let name = bin.file("name", "same-name.tmp\0");
        chown(&name, NOBODY);
        let dir = root.path().to_str().unwrap();
        let rounds = LOOP.to_string();
        let (out, records, code, line) = run_logged_verdict(
            &root,
            &logs,
            &[
                agent.to_str().unwrap(),
                dir,
                &rounds,
                name.to_str().unwrap(),
            ],
        );
        let unread = records
            .iter()
            .filter(|r| r["kind"] == "create" && r["target"]["path_unreadable"] == true)
            .count();
        eprintln!("run {run}: {unread} create record(s) with a name the capture could not read");
        assert_eq!(
            unread, 1,
            "the first name must be unreadable to the capture"
        );
        let mut wrong = Vec::new();
        let kinds = |kind: &str| records.iter().filter(|r| r["kind"] == kind).count();
        for r in &records {
            let kind = r["kind"].as_str().unwrap_or_default();
            if !matches!(kind, "create" | "unlink") {
                continue;
            }
            if r["target"]["uncaptured"] == true {
                wrong.push(format!("uncaptured: {r}"));
            } else if field(r, "path_source") != Some("kernel") {
                wrong.push(format!("not named by the kernel: {r}"));
            }
        }
        let names: std::collections::BTreeSet<&str> = records
            .iter()
            .filter(|r| r["kind"] == "create" || r["kind"] == "unlink")
            .filter_map(|r| field(r, "path"))
            .collect();
        let expected = format!("{dir}/same-name.tmp");
        if names.iter().any(|p| *p != expected) {
            wrong.push(format!("names: {names:?}"));
        }
        let (creates, unlinks) = (kinds("create"), kinds("unlink"));
        assert!(
            wrong.is_empty() && code == Some(0) && creates == LOOP && unlinks == LOOP,
            "run {run}: verify {code:?} ({line}); {creates} creates, {unlinks} unlinks; {} wrong:\n{}",
            wrong.len(),
            wrong
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
        );
        assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    }
}
