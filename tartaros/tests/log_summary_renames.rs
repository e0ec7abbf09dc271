//! `renameat2` flags that leave both names in place: `RENAME_EXCHANGE`
//! swaps two files, `RENAME_WHITEOUT` leaves a character device (0, 0) at
//! the old name. The summary's "files changed" must say what the tree
//! holds afterwards, as seen from the host, not a plain move. Needs root
//! and gcc (fails under CI=true without).

mod common;

use std::os::unix::fs::FileTypeExt;

use common::logged::*;
use common::*;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    if (renameat2(AT_FDCWD, "a", AT_FDCWD, "b", RENAME_EXCHANGE)) return 10;
    if (renameat2(AT_FDCWD, "c", AT_FDCWD, "d", RENAME_WHITEOUT)) return 11;
    return 0;
}
"#;

#[test]
fn exchanged_and_whiteout_renames_are_summarized_as_the_tree_is() {
    if !usable("summary_renames") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let a = root.file("a", "host-a\n");
    let b = root.file("b", "host-b\n");
    let c = root.file("c", "host-c\n");
    let d = root.path().join("d");
    let (out, _) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), root.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    // The tree, from the host.
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "host-b\n");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "host-a\n");
    assert!(
        std::fs::symlink_metadata(&c)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert_eq!(std::fs::read_to_string(&d).unwrap(), "host-c\n");
    let log = logs.join("effects.jsonl");
    let summary = tartaros(&["log", "summary", log.to_str().unwrap()], root.path());
    let text = stdout(&summary);
    let (a, b, c, d) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
        d.to_str().unwrap(),
    );
    // Both names of the exchange are there, each with what it now holds.
    let line_a = file_line(&text, a).unwrap_or_else(|| panic!("no line for {a}:\n{text}"));
    assert!(line_a.starts_with("  exchanged"), "{line_a}");
    assert!(line_a.contains(&format!("{b} -> {a}")), "{line_a}");
    let line_b = file_line(&text, b).unwrap_or_else(|| panic!("no line for {b}:\n{text}"));
    assert!(line_b.contains(&format!("{a} -> {b}")), "{line_b}");
    // The whiteout left a device at the old name.
    let line_c = file_line(&text, c).unwrap_or_else(|| panic!("no line for {c}:\n{text}"));
    assert!(line_c.starts_with("  created"), "{line_c}");
    assert!(line_c.contains("whiteout"), "{line_c}");
    let line_d = text.lines().find(|l| l.contains(&format!("{c} -> {d}")));
    assert!(line_d.is_some(), "{text}");
}
