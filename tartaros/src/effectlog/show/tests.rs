use serde_json::json;

use super::*;
use crate::effectlog::LogWriter;
use crate::effectlog::testutil::{effect, genesis, write_sample};

fn run(path: &Path, opts: &ShowOptions) -> String {
    let mut out = Vec::new();
    show(path, opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn timeline_has_one_line_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write_sample(&path);
    let out = run(&path, &ShowOptions::default());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 9, "{out}");
    assert!(
        lines[0].contains("genesis") && lines[0].contains("6.18.0-test"),
        "{out}"
    );
    assert!(lines[0].contains("degraded [unix-socket-policy]"), "{out}");
    assert_eq!(
        lines[5],
        "    +5.000ms      11 open     /etc/shadow  denied (EACCES)"
    );
    assert_eq!(
        lines[4],
        "    +4.000ms      11 open     path=/work/x flags=O_RDONLY  allowed"
    );
    assert!(
        lines[8].contains("seal") && lines[8].contains("exit code 0"),
        "{out}"
    );
    assert!(lines[8].contains("cgroup empty"), "{out}");
}

#[test]
fn filters_combine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write_sample(&path);
    let denied = run(
        &path,
        &ShowOptions {
            denied: true,
            ..Default::default()
        },
    );
    assert_eq!(denied.lines().count(), 1, "{denied}");
    assert!(denied.contains("/etc/shadow"));
    let execs = run(
        &path,
        &ShowOptions {
            kind: Some("exec".into()),
            ..Default::default()
        },
    );
    assert_eq!(execs.lines().count(), 2, "{execs}");
    let pid11 = run(
        &path,
        &ShowOptions {
            pid: Some(11),
            kind: Some("exit".into()),
            ..Default::default()
        },
    );
    assert_eq!(pid11.lines().count(), 1, "{pid11}");
    assert!(
        pid11.contains("code=1") || pid11.contains(" 1  allowed"),
        "{pid11}"
    );
}

#[test]
fn tree_nests_children_under_their_parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write_sample(&path);
    let out = run(
        &path,
        &ShowOptions {
            tree: true,
            ..Default::default()
        },
    );
    assert_eq!(
        out,
        "10 (parent 1): /bin/sh -c cat x [exit code 0]\n  11: /bin/cat x [exit code 1]\n"
    );
    let sub = run(
        &path,
        &ShowOptions {
            tree: true,
            pid: Some(11),
            ..Default::default()
        },
    );
    assert_eq!(sub, "11 (parent 10): /bin/cat x [exit code 1]\n");
}

#[test]
fn tree_handles_pid_reuse_and_missing_exits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    w.effect("fork", effect(5, 1, 1, json!({"child": 6}), None))
        .unwrap();
    w.effect("exit", effect(6, 5, 2, json!({"signal": 9}), None))
        .unwrap();
    w.effect("fork", effect(5, 1, 3, json!({"child": 6}), None))
        .unwrap();
    w.effect("exec", effect(6, 5, 4, json!({"path": "/bin/x"}), Some(1)))
        .unwrap();
    drop(w);
    let out = run(
        &path,
        &ShowOptions {
            tree: true,
            ..Default::default()
        },
    );
    assert_eq!(
        out,
        "5 (parent 1): (no exec) [no exit recorded]\n  6: (no exec) [killed by signal 9]\n  6: /bin/x (denied (EPERM)) [no exit recorded]\n"
    );
}

#[test]
fn hostile_names_cannot_drive_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    w.effect(
        "create",
        effect(5, 1, 1, json!({"path": "/w/\u{1b}[2J\u{202e}x\n"}), None),
    )
    .unwrap();
    drop(w);
    let out = run(&path, &ShowOptions::default());
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{202e}'),
        "{out:?}"
    );
    assert_eq!(out.lines().count(), 2, "{out:?}");
    assert!(out.contains(r"/w/\u{1b}[2J\u{202e}x\n"), "{out}");
}

#[test]
fn damaged_lines_are_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write_sample(&path);
    let mut data = std::fs::read(&path).unwrap();
    data.extend_from_slice(b"{not json\n");
    std::fs::write(&path, data).unwrap();
    let out = run(&path, &ShowOptions::default());
    assert!(out.ends_with("line 10: (not a readable record)\n"), "{out}");
}

#[test]
fn errno_names() {
    assert_eq!(errno_name(13), "EACCES");
    assert_eq!(errno_name(1), "EPERM");
    assert_eq!(errno_name(111), "ECONNREFUSED");
    assert_eq!(errno_name(99999), "errno 99999");
}
