//! Adversarial round 10 on names: a notification names its entry by the
//! directory's handle, which the supervisor turns into a path when it
//! reads it, and a directory may have moved since. The agent writes
//! `dI/f` (read and named by the supervisor), then renames an unrelated
//! directory, moves the file to `eI/f`, renames `dI` to `gI` and writes
//! again. `gI/f` never existed; no record may name it, the rename record
//! must say `dI/f -> eI/f`, and the writes be `eI/f`'s, sealed there.
//! Names with a newline and a byte that is not UTF-8 too. Needs root and
//! gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const ROUNDS: usize = 8;

/// The two tests run one after the other: the second's `mv p q; mv q p`
/// loop, seen by the first run's supervisor as a host's renames on the
/// same filesystem, makes it empty its handle-path cache (a merged order
/// is possible), and the first run's files named before are then named
/// as the disk is (`gI/f`): left open, docs/ebpf.md.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    int rounds = atoi(argv[2]);
    for (int i = 0; i < rounds; i++) {
        char d[64], df[64], e[64], ef[64], g[64], za[64], zb[64];
        /* Odd names: a newline, and a byte that is not UTF-8. */
        snprintf(d, sizeof d, "d\n%d\xff", i);
        snprintf(df, sizeof df, "%s/f", d);
        snprintf(e, sizeof e, "e%d", i);
        snprintf(ef, sizeof ef, "%s/f", e);
        snprintf(g, sizeof g, "g%d", i);
        snprintf(za, sizeof za, "z%d", i);
        snprintf(zb, sizeof zb, "z%d.moved", i);
        if (mkdir(d, 0755) || mkdir(e, 0755) || mkdir(za, 0755)) return 1;
        int fd = open(df, O_CREAT | O_WRONLY | O_EXCL, 0644);
        if (fd < 0 || write(fd, "first;", 6) != 6) return 2;
        /* Until the host has seen a record naming dI/f (the supervisor
           read and named it), at most 30 s. A fixed 400 ms was too short
           on a loaded CI host: a handle first looked up after the renames
           is named as the disk is then (left open, docs/ebpf.md). */
        char ready[64];
        snprintf(ready, sizeof ready, "ready%d", i);
        for (int t = 0; t < 3000 && access(ready, F_OK); t++) usleep(10000);
        if (rename(za, zb)) return 3;
        if (rename(df, ef) || rename(d, g)) return 4;
        if (write(fd, "second;", 7) != 7) return 5;
    }
    return 0;
}
"#;

fn escaped_d(i: usize) -> String {
    // How the log shows `d\n<i>\xff`: the newline as it is (JSON
    // escapes it), the byte that is not UTF-8 as `\xff`.
    format!("d\n{i}\\xff")
}

/// Reads the log as the supervisor writes it and, once a record names
/// round I's `dI/f`, makes `readyI` in the root for the agent.
fn say_ready_when_named(log: &std::path::Path, dir: &str, done: &std::sync::atomic::AtomicBool) {
    let mut next = 0;
    while next < ROUNDS && !done.load(std::sync::atomic::Ordering::Relaxed) {
        let df = format!("{dir}/{}/f", escaped_d(next));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let named = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|r| {
                ["path", "from", "to"]
                    .iter()
                    .any(|k| r["target"][k] == df.as_str())
            });
        if named {
            std::fs::write(format!("{dir}/ready{next}"), b"").unwrap();
            next += 1;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn a_directory_renamed_after_its_file_was_named_does_not_rename_the_file_s_past() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    if !usable("round10_names") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    let rounds = ROUNDS.to_string();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (log, dir, done) = (logs.join("effects.jsonl"), dir.to_string(), done.clone());
        std::thread::spawn(move || say_ready_when_named(&log, &dir, &done))
    };
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir, &rounds]);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let mut wrong = Vec::new();
    for i in 0..ROUNDS {
        let never = format!("{dir}/g{i}/f");
        for r in &records {
            let t = &r["target"];
            if ["path", "from", "to"]
                .iter()
                .any(|k| t[k] == never.as_str())
            {
                wrong.push(format!("{never} never existed: {r}"));
            }
        }
        let ef = format!("{dir}/e{i}/f");
        let df = format!("{dir}/{}/f", escaped_d(i));
        let renames: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == "rename" && field(r, "to") == Some(ef.as_str()))
            .collect();
        if renames.len() != 1 || field(renames[0], "from") != Some(df.as_str()) {
            wrong.push(format!("rename to {ef}: {renames:?}"));
        }
        let writes = records
            .iter()
            .filter(|r| r["kind"] == "write" && field(r, "path") == Some(ef.as_str()))
            .count();
        if writes == 0 {
            wrong.push(format!("no write record of {ef}"));
        }
        assert_eq!(std::fs::read(&ef).unwrap(), b"first;second;");
        if let Some(m) = seal_mismatch(&records, &ef) {
            wrong.push(format!("{ef} {m}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} problems:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The kernel merges a rename with an identical one still queued, so `mv p
/// q; mv q p` in a loop reaches the supervisor in an order that need not
/// end where the disk does. Paths cached for the directories below `p`
/// must not follow that order: files made there afterwards are named
/// where they are, and sealed.
const SWAPPER: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char name[64];
    if (chdir(argv[1]) || mkdir("p", 0755)) return 9;
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "p/d%d", i);
        if (mkdir(name, 0755)) return 1;
        snprintf(name, sizeof name, "p/d%d/f", i);
        int fd = open(name, O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || write(fd, "x", 1) != 1 || close(fd)) return 2;
    }
    usleep(300000);
    for (int i = 0; i < 3000; i++)
        if (rename("p", "q") || rename("q", "p")) return 3;
    usleep(300000);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "p/d%d/new", i);
        int fd = open(name, O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || write(fd, "made after", 10) != 10 || close(fd)) return 4;
    }
    return 0;
}
"#;

#[test]
fn files_made_after_a_rename_loop_are_named_where_they_are() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    if !usable("round10_names_swap") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "swapper", SWAPPER);
    let dir = root.path().to_str().unwrap();
    let (out, records, code, line) =
        run_logged_verdict(&root, &logs, &[agent.to_str().unwrap(), dir]);
    // Round 11: the loop's renames are merged by the kernel, and the
    // stream may end at `q` while the disk is at `p`: the `write` records
    // of the files written before the loop said `q/dI/f` with `deleted:
    // true` in 2 of 5 runs of round 10's binary (verify ok). They now say
    // `not_found` and the log is incomplete; nothing else may make it so.
    let not_found = records
        .iter()
        .filter(|r| r["kind"] == "write" && r["target"]["not_found"] == true)
        .count();
    let deleted = records
        .iter()
        .filter(|r| r["kind"] == "write" && r["target"]["deleted"] == true)
        .count();
    assert_eq!(deleted, 0, "no file was deleted");
    let expected = if not_found == 0 { (0, 0) } else { (3, 122) };
    assert_eq!(
        (code, out.status.code()),
        (Some(expected.0), Some(expected.1)),
        "verify: {line}\nagent: {}",
        stderr(&out)
    );
    let sealed: Vec<Value> = seal(&records)["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let text: Vec<String> = records.iter().map(Value::to_string).collect();
    let mut wrong = Vec::new();
    for i in 0..50 {
        let new = format!("{dir}/p/d{i}/new");
        let created = records
            .iter()
            .any(|r| r["kind"] == "create" && field(r, "path") == Some(new.as_str()));
        if !created {
            wrong.push(format!("no create record of {new}"));
        }
        if !sealed.iter().any(|f| f["path"] == new.as_str()) {
            wrong.push(format!("{new} not sealed"));
        }
        let never = format!("{dir}/q/d{i}/new");
        if text.iter().any(|r| r.contains(&never)) {
            wrong.push(format!("{never} never existed"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} problems:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
