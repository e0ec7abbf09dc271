//! Adversarial round 8 on the log: attacks that left a record naming
//! something other than what the kernel changed. Needs root and gcc
//! (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

/// Writes a file, gives it a second name, removes the first and writes
/// on through the descriptor: the file lives on, under the new name only.
/// Twice: a file the agent creates, and one of the tree it opens.
const RELINKER: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

static int relink(const char *from, const char *to, int flags) {
    int fd = open(from, flags, 0644);
    if (fd < 0 || write(fd, "before;", 7) != 7) return 1;
    if (link(from, to) || unlink(from)) return 2;
    if (write(fd, "after;", 6) != 6) return 3;
    return 0;
}

int main(int argc, char **argv) {
    if (chdir(argv[1])) return 9;
    if (relink("fresh", "fresh.kept", O_CREAT | O_WRONLY | O_EXCL)) return 10;
    if (relink("old", "old.kept", O_WRONLY | O_APPEND)) return 11;
    return 0;
}
"#;

/// The documented open case of round 7 (`link x y; unlink x`, writes
/// through the descriptor): the writes were logged at `x` with `deleted:
/// true` and the summary listed them as gone, while the tree holds what
/// was written under `y`.
#[test]
fn writes_through_a_name_removed_after_a_link_are_named_where_the_file_is() {
    if !usable("relinked_writes") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "relinker", RELINKER);
    let dir = root.path().to_str().unwrap();
    root.file("old", "old;");
    chown(&root.join("old"), NOBODY);
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    assert_eq!(
        std::fs::read(root.join("fresh.kept")).unwrap(),
        b"before;after;"
    );
    assert_eq!(
        std::fs::read(root.join("old.kept")).unwrap(),
        b"old;before;after;"
    );
    let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
    for (gone, kept) in [("fresh", "fresh.kept"), ("old", "old.kept")] {
        let (gone, kept) = (format!("{dir}/{gone}"), format!("{dir}/{kept}"));
        // No write is said to have gone to a file the tree lost.
        assert!(
            writes
                .iter()
                .all(|w| field(w, "path") != Some(gone.as_str())),
            "{gone}: {writes:#?}"
        );
        let at: Vec<&&Value> = writes
            .iter()
            .filter(|w| field(w, "path") == Some(kept.as_str()))
            .collect();
        assert!(!at.is_empty(), "no write at {kept}: {writes:#?}");
        for w in &at {
            assert!(w["target"].get("deleted").is_none(), "{w}");
            assert_eq!(field(w, "written_as"), Some(gone.as_str()), "{w}");
            assert_eq!(w["target"]["path_source"], "kernel", "{w}");
        }
        let sealed = seal(&records)["files"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["path"] == kept.as_str()))
            .and_then(|f| f["sha256"].as_str())
            .map(str::to_string);
        assert_eq!(
            sealed,
            Some(sha256_hex(&std::fs::read(&kept).unwrap())),
            "{kept}"
        );
    }
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    // The new names hold the writes; the old names were removed (a true
    // deletion of the name, shown as such).
    for kept in ["fresh.kept", "old.kept"] {
        let line = summary
            .lines()
            .find(|l| l.contains(&format!("{dir}/{kept} ")))
            .unwrap_or_else(|| panic!("no line for {kept}:\n{summary}"));
        assert!(line.contains("write"), "{line}");
        assert!(!line.trim_start().starts_with("deleted"), "{line}");
    }
    let old = summary
        .lines()
        .find(|l| l.contains(&format!("{dir}/old ")))
        .unwrap_or_else(|| panic!("no line for old:\n{summary}"));
    assert!(old.trim_start().starts_with("deleted"), "{old}");
}
