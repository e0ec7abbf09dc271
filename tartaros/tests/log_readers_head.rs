//! Session 33 (round 24b's leftover): `show`, `summary` and `report` took
//! no head, so a genuine log of another run put at the name after the seal
//! read as `ok` in every reader; only `verify --head` caught it. Each
//! reader now takes `--head` (the head the run printed) and calls any
//! other seal tampered (exit 1), as `verify --head` does.
//! Needs root; skips with a reason otherwise (fails under CI=true).

mod common;

use std::path::Path;

use common::*;

/// Runs an agent that writes `name` with `--log log`; returns the head the
/// run printed.
fn logged_run(work: &Dir, log: &Path, name: &str) -> String {
    let out = logged_agent(work, log, &format!("open({name:?}, 'w').write('x')"));
    assert!(out.status.success(), "run: {}", stderr(&out));
    stderr(&out)
        .lines()
        .find_map(|l| l.split("effect log sealed, head ").nth(1))
        .map(|h| h.trim().to_string())
        .expect("the run printed its head")
}

#[test]
fn every_reader_given_the_head_refuses_another_runs_log() {
    if !can_run("log_readers_head") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let first = logs.join("first.jsonl");
    let second = logs.join("second.jsonl");
    let head = logged_run(&work, &first, "one.txt");
    let other = logged_run(&work, &second, "two.txt");
    assert_ne!(head, other);
    let html = logs.join("report.html");
    let log = first.to_str().unwrap();
    let readers = |log: &str, head: &str| -> Vec<(&'static str, std::process::Output)> {
        let out = html.to_str().unwrap();
        vec![
            (
                "show",
                tartaros(&["log", "show", "--head", head, log], logs.path()),
            ),
            (
                "summary",
                tartaros(&["log", "summary", "--head", head, log], logs.path()),
            ),
            (
                "report",
                tartaros(
                    &["log", "report", "--head", head, "-o", out, log],
                    logs.path(),
                ),
            ),
        ]
    };
    for (reader, out) in readers(log, &head) {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{reader} with its own head: {}",
            stderr(&out)
        );
    }
    // The second run's genuine log put at the first one's name.
    std::fs::rename(&second, &first).unwrap();
    for (reader, out) in readers(log, &head) {
        assert_eq!(
            out.status.code(),
            Some(1),
            "{reader} vouched for another run's log: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let shown = readers(log, &head).remove(0).1;
    assert!(
        stdout(&shown).contains("not the expected"),
        "show does not say why: {}",
        stdout(&shown)
    );
    let summary = tartaros(
        &["log", "summary", "--json", "--head", &head, log],
        logs.path(),
    );
    assert!(
        stdout(&summary).contains("not the expected"),
        "the summary does not say why: {}",
        stdout(&summary)
    );
    let report = std::fs::read_to_string(&html).unwrap();
    assert!(
        report.contains("not the expected"),
        "the report does not say why"
    );
}
