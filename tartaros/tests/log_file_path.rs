//! The path a user gives `--log` must still name the supervisor's log
//! after the run. The log's own name and every real directory above it
//! are mount points in the agent's namespace (it cannot unlink, rename or
//! replace them); a symlink on the way is not: an agent that could write
//! where the link lives re-pointed it, put its own file at the name the
//! user gave, and `log verify` of that name read the agent's file while
//! the supervisor's log sat elsewhere. Such a `--log` is refused, like a
//! root or deny through a symlink.
//! Needs root; skips with a reason otherwise (fails under CI=true).

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;

use common::*;

/// The agent: re-points `lnk` at a directory of its own and writes a file
/// where the user will look for the log.
const REPLACE_LINK: &str = r#"
import os, sys
w = sys.argv[1]
open(w + "/ran", "w").write("agent ran\n")
try:
    os.unlink(w + "/lnk")
    os.mkdir(w + "/lnk")
    open(w + "/lnk/effects.jsonl", "w").write("forged\n")
    print("replaced")
except OSError as e:
    print("refused", e)
"#;

fn head_printed(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .find_map(|l| l.split("effect log sealed, head ").nth(1))
        .map(|h| h.trim().to_string())
}

/// Runs the agent with `root` writable and `--log given`; returns the run.
fn attack(root: &Dir, given: &str) -> std::process::Output {
    let r = root.path().to_str().unwrap();
    tartaros(
        &[
            "run",
            "--write",
            r,
            "--log",
            given,
            "--",
            "python3",
            "-c",
            REPLACE_LINK,
            r,
        ],
        root.path(),
    )
}

/// After the run, the name the user gave holds the log whose head the run
/// printed, or the run was refused before the agent ran.
fn assert_the_name_holds_the_log(root: &Dir, given: &Path, out: &std::process::Output) {
    let err = stderr(out);
    if out.status.code() == Some(78) {
        assert!(!root.join("ran").exists(), "refused, but the agent ran");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("symlink"), "{err}");
        assert!(
            !root.join("real/effects.jsonl").exists(),
            "a refused run left a log behind"
        );
        return;
    }
    let head = head_printed(&err).unwrap_or_else(|| panic!("no head printed: {err}"));
    let verify = tartaros(
        &["log", "verify", "--head", &head, given.to_str().unwrap()],
        Path::new("/"),
    );
    assert_eq!(
        verify.status.code(),
        Some(0),
        "the name the user gave is not the run's log: {}\nrun: {}{err}",
        stdout(&verify),
        stdout(out),
    );
}

#[test]
fn a_log_named_through_a_link_in_a_root_is_refused() {
    if !can_run("log_link_in_root") {
        return;
    }
    let root = Dir::open_to_all();
    std::fs::create_dir(root.join("real")).unwrap();
    chown(&root.join("real"), NOBODY);
    symlink("real", root.join("lnk")).unwrap();
    let given = root.join("lnk/effects.jsonl");
    let out = attack(&root, given.to_str().unwrap());
    assert_the_name_holds_the_log(&root, &given, &out);
}

#[test]
fn a_relative_log_through_a_link_in_a_root_is_refused() {
    if !can_run("log_relative_link_in_root") {
        return;
    }
    let root = Dir::open_to_all();
    std::fs::create_dir(root.join("real")).unwrap();
    chown(&root.join("real"), NOBODY);
    symlink(root.join("real"), root.join("lnk")).unwrap();
    // `x/..` folds lexically; the link is still on the way.
    std::fs::create_dir(root.join("x")).unwrap();
    let out = attack(&root, "x/../lnk/effects.jsonl");
    assert_the_name_holds_the_log(&root, &root.join("lnk/effects.jsonl"), &out);
}

#[test]
fn a_log_in_real_directories_of_a_root_stays_the_runs() {
    if !can_run("log_in_root_directories") {
        return;
    }
    let root = Dir::open_to_all();
    // The agent's link is made by the agent here, and the log's path has
    // none: the log is the run's, and the agent's attempts fail.
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    chown(&root.join("a"), NOBODY);
    chown(&root.join("a/b"), NOBODY);
    let given = root.join("a/b/effects.jsonl");
    let r = root.path().to_str().unwrap();
    let code = format!(
        "import os\n\
         for f in [lambda: os.rename('{r}/a', '{r}/z'), lambda: os.rename('{r}/a/b', '{r}/a/c'),\n\
                   lambda: os.unlink('{r}/a/b/effects.jsonl'), lambda: os.rmdir('{r}/a/b'),\n\
                   lambda: os.rename('{r}/ran', '{r}/a/b/effects.jsonl')]:\n\
             try:\n\
                 f(); print('moved')\n\
             except OSError as e:\n\
                 print('refused', e.errno)\n"
    );
    std::fs::write(root.join("ran"), "x").unwrap();
    chown(&root.join("ran"), NOBODY);
    let out = tartaros(
        &[
            "run",
            "--write",
            r,
            "--log",
            given.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        root.path(),
    );
    assert!(!stdout(&out).contains("moved"), "{}", stdout(&out));
    let head = head_printed(&stderr(&out)).expect("a head");
    let verify = tartaros(
        &["log", "verify", "--head", &head, given.to_str().unwrap()],
        Path::new("/"),
    );
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
