//! Adversarial round 25b's F1 and F2. F1: a file deeper than the capture's walk of
//! its name (1,024 bytes or 128 components) changed through a shared
//! mapping, its descriptor closed at once. The kernel named only the end
//! of the path; the record fell back to the agent's relative name joined
//! to the modelled cwd, which was the `chdir` string cut at 255 bytes: a
//! decoy file nobody opened, with no `path_source`, and `verify` ok. Now
//! such a name is the agent's claim unless it leads to the kernel's inode
//! and ends in the names the kernel read; an allowed change named only by
//! a claim makes the log `incomplete`. F2: a file the host hard-linked
//! into a root, written and its name there removed, was `deleted: true`
//! in its `write` record while the other link kept what was written; it is
//! `still_linked` now. Each test checks the tree from the host side. Needs
//! root (fails under CI=true without).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

/// Changes `f` in directory `sys.argv[2]` through a shared mapping,
/// closing the descriptor before the change so that only the kernel's
/// walk and the claim can name the file. The cwd is reached by one
/// `chdir` of the whole string (`sys.argv[3] == "whole"`), or one name
/// at a time, each relative to a cwd the model knows.
const MAP_WRITE: &str = r#"
import mmap
if sys.argv[3] == "whole":
    os.chdir(sys.argv[2])
else:
    os.chdir("/")
    for name in sys.argv[2].strip("/").split("/"):
        os.chdir(name)
fd = os.open("f", os.O_RDWR)
m = mmap.mmap(fd, 8)
os.close(fd)
m[:8] = b"EVILEVIL"
m.flush()
"#;

/// Makes `dir` and its parents, owned by the agent.
fn tree(base: &Path, rel: &str, contents: &str) -> PathBuf {
    let dir = base.join(rel);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("f"), contents).unwrap();
    let mut at = dir.clone();
    while at != base {
        chown(&at, NOBODY);
        at.pop();
    }
    chown(&dir.join("f"), NOBODY);
    dir
}

fn run(work: &Dir, log: &Path, cwd: &Path, how: &str) -> std::process::Output {
    let w = work.path().to_str().unwrap();
    let log = log.to_str().unwrap();
    let args = ["run", "--write", w, "--log", log, "--", "python3", "-c"];
    let code = format!("{ATTEMPT}{MAP_WRITE}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend([code.as_str(), w, cwd.to_str().unwrap(), how]);
    let out = tartaros(&all, work.path());
    assert!(
        out.status.success(),
        "run: {}{}",
        stdout(&out),
        stderr(&out)
    );
    out
}

fn opens_for_writing(log: &Path) -> Vec<Value> {
    records(log)
        .into_iter()
        .filter(|r| r["kind"] == "open" && r["decision"] == "allowed")
        .filter(|r| r["target"]["flags"].as_u64().is_some_and(|f| f & 3 == 2))
        .collect()
}

#[test]
fn a_cut_cwd_string_does_not_name_a_decoy() {
    if !can_run("log_round25_names") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let long = vec!["p".repeat(200); 5].join("/");
    let real = tree(work.path(), &long, "AAAAAAAA");
    // Where the chdir string cut at 255 bytes points.
    let cut: String = real.to_str().unwrap().chars().take(255).collect();
    let rel = cut.strip_prefix(work.path().to_str().unwrap()).unwrap();
    let decoy = tree(work.path(), rel.trim_start_matches('/'), "DECOYDEC");
    let log = logs.join("deep.jsonl");
    run(&work, &log, &real, "whole");
    assert_eq!(std::fs::read(real.join("f")).unwrap(), b"EVILEVIL");
    assert_eq!(std::fs::read(decoy.join("f")).unwrap(), b"DECOYDEC");
    let decoy_f = decoy.join("f");
    for r in opens_for_writing(&log) {
        let t = &r["target"];
        if t["path"] == decoy_f.to_str().unwrap() {
            assert_eq!(
                t["path_source"], "agent",
                "the decoy named as the file: {r}"
            );
            assert_eq!(t["path_unresolved"], true, "{r}");
        }
    }
    let (code, said) = verify_log(&log);
    assert_eq!(code, 3, "a change named only by a claim verified: {said}");
    assert!(said.contains("no lookup confirmed"), "{said}");
}

#[test]
fn a_deep_file_whose_claim_leads_to_it_is_named() {
    if !can_run("log_round25_names") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    // 150 levels: deeper than the walk's 128 components, short enough
    // for one chdir.
    let deep = vec!["a"; 150].join("/");
    let real = tree(work.path(), &deep, "AAAAAAAA");
    let log = logs.join("deep.jsonl");
    run(&work, &log, &real, "steps");
    assert_eq!(std::fs::read(real.join("f")).unwrap(), b"EVILEVIL");
    let opens = opens_for_writing(&log);
    let want = real.join("f");
    let named = opens
        .iter()
        .find(|r| r["target"]["path"] == want.to_str().unwrap())
        .unwrap_or_else(|| panic!("no open names the file: {opens:?}"));
    let t = &named["target"];
    assert_eq!(t["kernel_path_incomplete"], "too deep", "{named}");
    assert_eq!(t["path_source"], "proc", "{named}");
    assert_eq!(t["resolved_from"], "check", "{named}");
    let (code, said) = verify_log(&log);
    assert_eq!(code, 0, "{said}");
}

#[test]
fn a_write_kept_by_a_link_outside_the_root_is_not_called_deleted() {
    if !can_run("log_round25_names") {
        return;
    }
    let base = Dir::new();
    std::fs::set_permissions(
        base.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let work = base.join("w");
    let outside = base.join("outside");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&outside).unwrap();
    chown(&work, NOBODY);
    std::fs::write(outside.join("h"), "HOSTDATA\n").unwrap();
    chown(&outside.join("h"), NOBODY);
    std::fs::hard_link(outside.join("h"), work.join("hl")).unwrap();
    let logs = Dir::new();
    let log = logs.join("linked.jsonl");
    let w = work.to_str().unwrap();
    let hl = work.join("hl");
    let script = format!("echo EVIL >> {0}; rm {0}", hl.display());
    let out = tartaros(
        &[
            "run",
            "--write",
            w,
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        logs.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(outside.join("h")).unwrap(),
        "HOSTDATA\nEVIL\n"
    );
    assert!(!hl.exists());
    let writes: Vec<Value> = records(&log)
        .into_iter()
        .filter(|r| r["kind"] == "write" && r["target"]["path"] == hl.to_str().unwrap())
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let t = &writes[0]["target"];
    assert_eq!(t["still_linked"], true, "{t}");
    assert!(
        t.get("deleted").is_none(),
        "a file that lives on called deleted: {t}"
    );
}
