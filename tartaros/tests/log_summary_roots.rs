//! `log summary` lists every change in a writable root, wherever the root
//! is. It leaves out `/dev`, `/proc` and `/sys` (`> /dev/null` is no change
//! to the tree), and it left out a root there too: with `--write
//! /dev/shm/work`, a file the agent made and deleted was in no line of
//! "files changed", and one it made and kept showed as `seal-only` (a
//! change "the capture did not see") with none of its actions.
//! Needs root and a tmpfs at /dev/shm; skips with a reason otherwise
//! (fails under CI=true).

mod common;

use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

/// Removes the directory on drop.
struct ShmDir(std::path::PathBuf);

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn changes_in_a_root_under_dev_are_summarized() {
    if !can_run("summary_root_under_dev") {
        return;
    }
    if !Path::new("/dev/shm").is_dir() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI needs /dev/shm"
        );
        eprintln!("skipping summary_root_under_dev: no /dev/shm");
        return;
    }
    let root = ShmDir(
        tempfile::Builder::new()
            .prefix("tt-sum-")
            .tempdir_in("/dev/shm")
            .unwrap()
            .keep(),
    );
    chown(&root.0, NOBODY);
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let r = root.0.to_str().unwrap();
    let script = format!(
        "echo evil > {r}/payload.sh && chmod 755 {r}/payload.sh && \
         echo gone > {r}/dropped && rm {r}/dropped"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = tartaros(
        &["log", "summary", "--json", log.to_str().unwrap()],
        Path::new("/"),
    );
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let json: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let files = json["files"].as_array().unwrap();
    let entry = |name: &str| {
        let path = format!("{r}/{name}");
        files
            .iter()
            .find(|f| f["path"] == path.as_str())
            .unwrap_or_else(|| panic!("{path} is not among the files changed: {files:#?}"))
    };
    let payload = entry("payload.sh");
    assert_ne!(payload["change"], "seal-only", "{payload}");
    let actions: Vec<&str> = payload["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(actions.contains(&"chmod 0755"), "{payload}");
    assert_eq!(entry("dropped")["change"], "deleted");
}
