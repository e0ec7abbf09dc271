//! Writes to a file with no name: an `O_TMPFILE` (which the kernel names
//! `#<inode>` in its directory) and a file unlinked while open. The `write`
//! record must not present such a file as one of the tree's, and the
//! summary must not list it as a file the run left modified. Needs root
//! and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    int t = open(".", O_TMPFILE | O_WRONLY, 0644);
    if (t < 0 || write(t, "tmp", 3) != 3) return 10;
    int u = open("gone", O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (u < 0 || unlink("gone") || write(u, "gone", 4) != 4) return 11;
    int k = open("kept", O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (k < 0 || write(k, "kept", 4) != 4) return 12;
    return 0;
}
"#;

fn writes(records: &[Value], pred: impl Fn(&str) -> bool) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "write" && r["target"]["path"].as_str().is_some_and(&pred))
        .collect()
}

#[test]
fn writes_to_files_without_a_name_are_marked_deleted() {
    if !usable("unlinked_writes") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let tmp_prefix = format!("{dir}/#");
    let tmp = writes(&records, |p| p.starts_with(&tmp_prefix));
    assert_eq!(tmp.len(), 1, "{records:#?}");
    let tmp_path = tmp[0]["target"]["path"].as_str().unwrap().to_string();
    assert!(
        !std::path::Path::new(&tmp_path).exists(),
        "the tree has no {tmp_path}"
    );
    assert_eq!(tmp[0]["target"]["deleted"], true, "{}", tmp[0]);
    let gone = writes(&records, |p| p == format!("{dir}/gone"));
    assert_eq!(gone.len(), 1, "{records:#?}");
    assert_eq!(gone[0]["target"]["deleted"], true, "{}", gone[0]);
    let kept = writes(&records, |p| p == format!("{dir}/kept"));
    assert_eq!(kept.len(), 1, "{records:#?}");
    assert!(kept[0]["target"].get("deleted").is_none(), "{}", kept[0]);
    // The summary does not list the nameless file as left modified.
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    let line = summary
        .lines()
        .find(|l| l.contains(&tmp_path))
        .unwrap_or_else(|| panic!("no line for {tmp_path}:\n{summary}"));
    assert!(line.trim_start().starts_with("deleted"), "{line}");
}
