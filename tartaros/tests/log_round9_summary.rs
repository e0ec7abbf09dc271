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

/// A file given a second name, removed under the first while open and
/// written on; then a symlink, a directory and a file made at the names
/// it left. The writes' record (written at the writer's exit) names the
/// link with the removed name as `written_as`, and the summary folded
/// whatever entry that name had into the link's: the symlink, the
/// directory and the file were on no line.
const REUSER: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static int relink(const char *from, const char *to) {
    int fd = open(from, O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (fd < 0 || write(fd, "before;", 7) != 7) return 1;
    if (link(from, to) || unlink(from)) return 2;
    return write(fd, "after;", 6) == 6 ? 0 : 3;
}

int main(int argc, char **argv) {
    /* On the stack: the capture reads names the kernel has faulted in. */
    char s[] = "s", sk[] = "s.kept", d[] = "d", dk[] = "d.kept", f[] = "f", fk[] = "f.kept";
    char passwd[] = "/etc/passwd";
    if (chdir(argv[1])) return 9;
    if (relink(s, sk) || symlink(passwd, s)) return 10;
    if (relink(d, dk) || mkdir(d, 0755)) return 11;
    if (relink(f, fk)) return 12;
    int fd = open(f, O_CREAT | O_WRONLY | O_EXCL, 0644);
    if (fd < 0 || write(fd, "new", 3) != 3) return 13;
    return 0;
}
"#;

#[test]
fn a_name_made_again_after_its_file_was_relinked_keeps_its_summary_line() {
    if !usable("reused_relinked_name") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "reuser", REUSER);
    let dir = root.path().to_str().unwrap().to_string();
    let (out, _) = run_logged(&root, &logs, &[agent.to_str().unwrap(), &dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    // The tree, from the host.
    let s = root.join("s");
    assert!(
        std::fs::symlink_metadata(&s)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(root.join("d").is_dir());
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"new");
    let log = logs.join("effects.jsonl");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        root.path(),
    ));
    for (name, action) in [("s", "symlink"), ("d", "mkdir"), ("f", "create")] {
        let path = format!("{dir}/{name}");
        let line =
            entry(&summary, &path).unwrap_or_else(|| panic!("no line for {path}:\n{summary}"));
        assert!(line.trim_start().starts_with("created"), "{line}");
        assert!(line.contains(action), "{line}");
        let kept = format!("{dir}/{name}.kept");
        let line =
            entry(&summary, &kept).unwrap_or_else(|| panic!("no line for {kept}:\n{summary}"));
        assert!(line.contains("write"), "{line}");
    }
}
