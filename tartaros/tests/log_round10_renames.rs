//! Adversarial round 10 on the seal: names changed only by a rename. The
//! seal lists the files a run changed so that a reviewer can check the
//! tree on disk against the log; a rename changes what a name holds as
//! surely as a write does. `mv a b` of two files the run never wrote, a
//! directory of untouched files renamed, an exchange of two untouched
//! files, and an untouched file moved over another in a second directory:
//! every name that now holds another file must be in the seal with the
//! hash the host reads. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    /* Over a file that held something else. */
    if (rename("a", "b")) return 1;
    /* A directory of files the run never opened. */
    if (rename("d", "n")) return 2;
    /* Two untouched files swap contents. */
    if (renameat2(AT_FDCWD, "c", AT_FDCWD, "e", RENAME_EXCHANGE)) return 3;
    /* Across directories, over a file. */
    if (rename("s1/p", "s2/p")) return 4;
    /* A directory moved over an empty one, then renamed again. */
    if (rename("t", "u") || rename("u", "v")) return 5;
    return 0;
}
"#;

/// Every name the agent's renames filled, as the host sees it afterwards.
const FILLED: [&str; 7] = ["b", "n/f", "n/g/h", "c", "e", "s2/p", "v/k"];

#[test]
fn names_filled_by_a_rename_alone_are_sealed_with_the_host_s_hash() {
    if !usable("round10_renames") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    for (name, content) in [
        ("a", "host-a\n"),
        ("b", "host-b\n"),
        ("c", "host-c\n"),
        ("e", "host-e\n"),
        ("d/f", "host-d-f\n"),
        ("d/g/h", "host-d-g-h\n"),
        ("s1/p", "host-s1-p\n"),
        ("s2/p", "host-s2-p\n"),
        ("t/k", "host-t-k\n"),
    ] {
        root.file(name, content);
    }
    std::fs::create_dir(root.join("u")).unwrap();
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    assert_eq!(std::fs::read_to_string(root.join("b")).unwrap(), "host-a\n");
    assert_eq!(std::fs::read_to_string(root.join("c")).unwrap(), "host-e\n");
    let sealed: Vec<Value> = seal(&records)["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut missing = Vec::new();
    for name in FILLED {
        let path = format!("{dir}/{name}");
        if let Some(m) = seal_mismatch(&records, &path) {
            missing.push(format!("{name}: {m}"));
        }
    }
    assert!(
        missing.is_empty(),
        "names a rename filled, not sealed as the host reads them:\n{}\nseal: {sealed:#?}",
        missing.join("\n")
    );
    // Names left empty are not listed as if they held a file.
    for gone in ["a", "d/f", "s1/p", "t/k", "u/k"] {
        let path = format!("{dir}/{gone}");
        assert!(
            sealed.iter().all(|f| f["path"] != path.as_str()),
            "{path} is gone but sealed"
        );
    }
}
