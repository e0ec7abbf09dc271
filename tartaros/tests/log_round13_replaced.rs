//! Round 13 on the log: two shapes where the `write` or `rename` records
//! did not say what happened.
//!
//! - A file replaced by a rename (`write a; write b; rename b a`): the
//!   kernel sends no removal of the old `a`, and its writes were logged
//!   as a `write` of `a` without `deleted`, i.e. as writes to the file
//!   now at `a`, which is `b`'s. The same with the rename made by another
//!   process than the writer, and with `RENAME_EXCHANGE` (both files'
//!   writes were named `a`).
//! - A rename loop of one file in one thread (`rename x y; rename y x`,
//!   500 times): fanotify merges a thread's identical notifications still
//!   queued, so there are fewer `FAN_RENAME` notifications than rename
//!   records. A record with no fresh notification took the first claimed
//!   one with its new name: after `rename w x`, 499 of 500 `y -> x`
//!   records said `w -> x` (`path_source: kernel`, verify `ok`); and the
//!   write counts, moved in the notifications' order, could end at `y`
//!   while the file was at `x` (`not_found`, verify incomplete). Every
//!   rename record must name its own call, and the log verify `ok`.
//!
//! Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const REPLACE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int put(const char *name, const char *text) {
    int fd = open(name, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return 1;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) return 2;
    return close(fd) ? 3 : 0;
}

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    /* Sizes tell the files apart: `a` 4 bytes, `b` 8. */
    if (put("a", "AAAA") || put("b", "BBBBBBBB")) return 10;
    if (!strcmp(argv[2], "same")) {
        if (rename("b", "a")) return 11;
    } else if (!strcmp(argv[2], "other")) {
        /* The writer lives on while another process renames. */
        pid_t pid = fork();
        if (pid < 0) return 12;
        if (pid == 0) _exit(rename("b", "a") ? 1 : 0);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            return 13;
    } else if (!strcmp(argv[2], "exchange")) {
        if (renameat2(AT_FDCWD, "a", AT_FDCWD, "b", RENAME_EXCHANGE)) return 14;
    } else {
        return 15;
    }
    return 0;
}
"#;

#[test]
fn a_file_replaced_by_a_rename_is_not_logged_as_the_file_now_at_its_name() {
    if !usable("round13_replaced") {
        return;
    }
    let mut failed = Vec::new();
    for mode in ["same", "other", "exchange"] {
        for run in 0..2 {
            let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
            let agent = compile(&bin, "replace", REPLACE);
            let dir = root.path().to_str().unwrap();
            let (out, records, code, line) =
                run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir, mode]);
            assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
            let (a, b) = (format!("{dir}/a"), format!("{dir}/b"));
            let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
            let mut wrong = Vec::new();
            if code != Some(0) {
                wrong.push(format!("verify {code:?}: {line}"));
            }
            if writes.len() != 2 {
                wrong.push(format!("{} write records", writes.len()));
            }
            let deleted = |r: &Value| r["target"]["deleted"] == true;
            let size = |r: &Value| r["target"]["size"].as_u64();
            match mode {
                // The old `a` is gone: its record says so; `b`'s record
                // names `a`, with `b`'s size.
                "same" | "other" => {
                    let gone = writes.iter().filter(|r| deleted(r)).count();
                    let live: Vec<&&Value> = writes.iter().filter(|r| !deleted(r)).collect();
                    if gone != 1
                        || live.len() != 1
                        || field(live[0], "path") != Some(a.as_str())
                        || size(live[0]) != Some(8)
                        || live[0]["target"]["not_found"] == true
                    {
                        wrong.push(format!("{gone} deleted, live: {live:?}"));
                    }
                }
                // Each file's record names where it is now: `a`'s file
                // (4 bytes) at `b`, `b`'s (8 bytes) at `a`.
                _ => {
                    for (now, written, bytes) in [(&a, &b, 8), (&b, &a, 4)] {
                        let own = writes.iter().filter(|r| {
                            field(r, "path") == Some(now.as_str())
                                && (size(r) == Some(bytes)
                                    || field(r, "written_as") == Some(written.as_str()))
                        });
                        if own.count() != 1 || writes.iter().any(|r| deleted(r)) {
                            wrong.push(format!("the file written as {written}, now at {now}"));
                        }
                    }
                }
            }
            // The summary must not call the name `a` deleted: it holds
            // `b`'s file.
            let log = logs.join("effects.jsonl");
            let summary = tartaros(&["log", "summary", log.to_str().unwrap()], root.path());
            let text = stdout(&summary);
            match file_line(&text, &a) {
                Some(l) if !l.trim_start().starts_with("deleted") => {}
                l => wrong.push(format!("summary of a: {l:?}")),
            }
            if !wrong.is_empty() {
                let all: Vec<String> = writes.iter().map(|r| r["target"].to_string()).collect();
                failed.push(format!(
                    "{mode} run {run}: {}\n  writes: {}\n  summary:\n{text}",
                    wrong.join("; "),
                    all.join("\n          ")
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

const LOOP: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rounds = atoi(argv[2]);
    if (chdir(argv[1])) return 9;
    int fd = open("w", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x\n", 2) != 2 || close(fd)) return 10;
    /* An earlier rename to `x`: a merged `y -> x` must not take it. */
    if (rename("w", "x")) return 11;
    for (int i = 0; i < rounds; i++)
        if (rename("x", "y") || rename("y", "x")) return 11;
    return 0;
}
"#;

#[test]
fn every_rename_of_a_rename_loop_is_named_by_the_kernel() {
    if !usable("round13_rename_loop") {
        return;
    }
    const ROUNDS: usize = 500;
    let mut failed = Vec::new();
    for run in 0..5 {
        let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
        let agent = compile(&bin, "loop", LOOP);
        let dir = root.path().to_str().unwrap();
        let rounds = ROUNDS.to_string();
        let (out, records, code, line) =
            run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir, &rounds]);
        let (w, x, y) = (format!("{dir}/w"), format!("{dir}/x"), format!("{dir}/y"));
        let renames: Vec<&Value> = records.iter().filter(|r| r["kind"] == "rename").collect();
        let mut wrong: Vec<String> = Vec::new();
        let (mut wx, mut xy, mut yx) = (0, 0, 0);
        for r in &renames {
            let (from, to) = (field(r, "from"), field(r, "to"));
            if r["target"]["uncaptured"] == true {
                wrong.push(format!("uncaptured: {}", r["target"]));
            } else if field(r, "path_source") != Some("kernel") {
                wrong.push(format!("not named by the kernel: {}", r["target"]));
            } else if from == Some(w.as_str()) && to == Some(x.as_str()) {
                wx += 1;
            } else if from == Some(x.as_str()) && to == Some(y.as_str()) {
                xy += 1;
            } else if from == Some(y.as_str()) && to == Some(x.as_str()) {
                yx += 1;
            } else {
                wrong.push(format!("other names: {}", r["target"]));
            }
        }
        for r in &records {
            if r["kind"] != "rename" && r["target"]["not_found"] == true {
                wrong.push(format!("{}: {}", r["kind"], r["target"]));
            }
        }
        // The file's writes are named where it is, and the seal has it.
        let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
        if writes.len() != 1 || field(writes[0], "path") != Some(x.as_str()) {
            let all: Vec<String> = writes.iter().map(|r| r["target"].to_string()).collect();
            wrong.push(format!("write records: {}", all.join(", ")));
        }
        if let Some(seal) = seal_mismatch(&records, &x) {
            wrong.push(format!("seal of x: {seal}"));
        }
        let gaps = records.iter().filter(|r| r["kind"] == "gap").count();
        if code != Some(0)
            || out.status.code() != Some(0)
            || wx != 1
            || xy != ROUNDS
            || yx != ROUNDS
            || gaps != 0
        {
            wrong.insert(
                0,
                format!(
                    "run {:?}, verify {code:?} ({line}); {wx} w->x, {xy} x->y, {yx} y->x, {} rename records, {gaps} gaps",
                    out.status.code(),
                    renames.len()
                ),
            );
        }
        if !wrong.is_empty() {
            let shown: Vec<String> = wrong.iter().take(12).cloned().collect();
            failed.push(format!(
                "run {run}: {} wrong:\n  {}\n  run stderr: {}",
                wrong.len(),
                shown.join("\n  "),
                stderr(&out)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
