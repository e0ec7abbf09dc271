//! Adversarial round 11, the routine case: a shell script that makes a
//! directory with a file, renames the directory and removes it (30
//! times), commits with git, and moves 50 fresh build directories before
//! removing the tree. Round 10's binary named up to 62 of its creates and
//! mkdirs by the directory's later name (`eI/sub/f` for a file made as
//! `dI/sub/f`) with `verify` `ok`; round 11's first fixes made the log
//! `incomplete` in 4 of 4 release runs (13 to 21 `write` records
//! `not_found`: the counts moved to `eI/sub/f`, and the removal there was
//! not named, the directory's handle forgotten and dead), and a debug
//! build added `file-name-position` gaps (a lookup that a rename of the
//! next read preceded). Every run must verify `ok` and name every file as
//! it was. Needs root.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const RUNS: usize = 3;
const FIRST: usize = 30;
const BUILDS: usize = 50;

const SCRIPT: &str = r#"set -e
for i in $(seq 30); do mkdir -p d$i/sub; echo x > d$i/sub/f; mv d$i e$i; rm -r e$i; done
git init -q . && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m one
for i in $(seq 10); do echo $i > file$i; git add file$i; git -c user.email=a@b -c user.name=a commit -q -m c$i; done
mkdir -p build/tmp && for i in $(seq 50); do mkdir build/tmp/x$i; echo y > build/tmp/x$i/o; mv build/tmp/x$i build/o$i; done; rm -rf build
"#;

/// Whether `path` (below `dir`) is a name a file of the script had only
/// after its directory's rename: `eI/...` or `build/oI/...`.
fn later_name(dir: &str, path: &str) -> bool {
    let Some(rest) = path.strip_prefix(dir).and_then(|p| p.strip_prefix('/')) else {
        return false;
    };
    let numbered = |s: &str, prefix: &str| {
        s.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut parts = rest.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(first), _, _) if numbered(first, "e") => true,
        (Some("build"), Some(second), Some(_)) => numbered(second, "o"),
        _ => false,
    }
}

#[test]
fn a_routine_script_s_log_is_ok_and_names_every_file_as_it_was() {
    if !can_run("round11_routine") || !std::path::Path::new("/usr/bin/git").exists() {
        return;
    }
    for run in 0..RUNS {
        let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
        let script = bin.file("s1.sh", SCRIPT);
        let dir = root.path().to_str().unwrap();
        let (out, records, code, line) =
            run_logged_verdict(&root, &logs, &["sh", script.to_str().unwrap()]);
        let mut wrong = Vec::new();
        for r in &records {
            let kind = r["kind"].as_str().unwrap_or_default();
            let path = field(r, "path").unwrap_or_default();
            if matches!(kind, "create" | "mkdir" | "write") && later_name(dir, path) {
                wrong.push(format!("named by a later name: {r}"));
            }
            if r["target"]["not_found"] == true {
                wrong.push(format!("not found: {r}"));
            }
        }
        // Each file's writes: one record, named as it was made, deleted.
        let made = (1..=FIRST)
            .map(|i| format!("{dir}/d{i}/sub/f"))
            .chain((1..=BUILDS).map(|i| format!("{dir}/build/tmp/x{i}/o")));
        for path in made {
            let writes: Vec<&Value> = records
                .iter()
                .filter(|r| r["kind"] == "write" && field(r, "path") == Some(path.as_str()))
                .collect();
            if writes.iter().any(|w| w["target"]["deleted"] != true) {
                wrong.push(format!("{path}: not said deleted: {writes:?}"));
            }
        }
        let gaps: Vec<&Value> = records.iter().filter(|r| r["kind"] == "gap").collect();
        assert!(
            wrong.is_empty() && code == Some(0),
            "run {run}: verify {code:?} ({line}); gaps {gaps:?}; {} wrong:\n{}\nstderr: {}",
            wrong.len(),
            wrong.join("\n"),
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    }
}

#[test]
fn later_names_are_told_apart() {
    assert!(later_name("/r", "/r/e12/sub/f"));
    assert!(later_name("/r", "/r/e3"));
    assert!(later_name("/r", "/r/build/o7/o"));
    assert!(!later_name("/r", "/r/build/o7"));
    assert!(!later_name("/r", "/r/d12/sub/f"));
    assert!(!later_name("/r", "/r/build/tmp/x7/o"));
    assert!(!later_name("/r", "/r/.git/objects/e0/x"));
    assert!(!later_name("/r", "/r/exe"));
}
