//! Adversarial round 9 on the log's readers: renames whose destination
//! held something. A rename replaces what was at its new name (a file, or
//! an empty directory with a history of deleted files), and `log summary`
//! must still name every tree file the run removed, as the host sees the
//! tree afterwards. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;

/// The summary line whose entry is `path` (`change [from ->] path ...`).
fn entry<'a>(summary: &'a str, path: &str) -> Option<&'a str> {
    summary.lines().find(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let at = if words.get(2) == Some(&"->") { 3 } else { 1 };
        words.get(at) == Some(&path)
    })
}

/// `mv x b; mv a b` destroys the tree's `x` (its last name was `b`), and
/// `rm e/f; rmdir e; mkdir n; mv n e` hides the removal of `e/f` under a
/// directory renamed over `e`: the summary had no line naming either.
#[test]
fn files_removed_by_a_rename_over_their_name_stay_in_the_summary() {
    if !usable("rename_over") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let dir = root.path().to_str().unwrap().to_string();
    root.file("x", "host-x\n");
    root.file("a", "host-a\n");
    root.file("e/f", "host-f\n");
    let script = "mv x b && mv a b && rm e/f && rmdir e && mkdir n && mv n e";
    let (out, _) = run_logged(
        &root,
        &logs,
        &["sh", "-c", &format!("cd {dir} && {script}")],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    // The tree, from the host.
    for gone in ["x", "a", "e/f"] {
        assert!(!root.join(gone).exists(), "{gone} is still there");
    }
    assert_eq!(std::fs::read_to_string(root.join("b")).unwrap(), "host-a\n");
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    for gone in ["x", "e/f"] {
        let path = format!("{dir}/{gone}");
        let line =
            entry(&summary, &path).unwrap_or_else(|| panic!("no line for {path}:\n{summary}"));
        assert!(line.trim_start().starts_with("deleted"), "{line}");
    }
    // The name that now holds another file says what it held was replaced.
    let b = format!("{dir}/b");
    let line = entry(&summary, &b).unwrap_or_else(|| panic!("no line for {b}:\n{summary}"));
    assert!(line.contains(&format!("{dir}/a -> {b}")), "{line}");
    assert!(line.contains("replaced"), "{line}");
}
