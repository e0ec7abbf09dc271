//! Placeholders (`--materialize`) of a service run are removed at its end
//! with the caller's rights, not root's: the marker names paths, and what
//! lies at them by then is not necessarily what the run made.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use harness::Service;

const GUS: u32 = 47_000 + 191;
const HANA: u32 = 47_000 + 192;

/// In a shared sticky directory (like /var/tmp) the caller's run makes
/// the placeholder `a/b`; meanwhile the caller removes both from the host
/// (they are its own) and another user makes `a` there. Root's cleanup
/// at the end removed that user's directory, which the caller could not:
/// the sticky bit protects it from everyone but its owner and root.
#[test]
fn a_placeholder_swapped_for_another_users_directory_is_not_removed_by_root() {
    if !can_run("placeholder_removal_identity") {
        return;
    }
    let service = Service::start();
    let shared = Dir::new();
    chown(shared.path(), 0);
    std::fs::set_permissions(shared.path(), PermissionsExt::from_mode(0o1777)).unwrap();
    let w = shared.path().to_str().unwrap().to_string();
    let deny = format!("{w}/a/b");
    // The agent says it runs: the placeholder exists from early in the
    // start, and removing it before the init has mounted the deny over it
    // fails the start (125; seen in a loaded CI run).
    let wait = format!("touch {w}/started; while [ ! -e {w}/go ]; do sleep 0.05; done");
    let mut run = service.spawn_quiet(
        GUS,
        &[
            "run",
            "--write",
            &w,
            "--read-deny",
            &deny,
            "--materialize",
            "--",
            "sh",
            "-c",
            &wait,
        ],
        shared.path(),
    );
    let b = shared.join("a/b");
    let started = shared.join("started");
    assert!(
        eventually(10, || started.exists() && b.is_dir()),
        "the placeholder was not made: {}",
        service.errors()
    );
    // The caller, on the host: its own directories, its to remove.
    let out = std::process::Command::new("setpriv")
        .args([&format!("--reuid={GUS}"), &format!("--regid={GUS}")])
        .args(["--clear-groups", "rmdir"])
        .arg(&b)
        .arg(shared.join("a"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Another user's directory takes the name.
    let a = shared.join("a");
    std::fs::create_dir(&a).unwrap();
    std::os::unix::fs::chown(&a, Some(HANA), Some(HANA)).unwrap();
    std::fs::write(shared.join("go"), "").unwrap();
    let status = run.take().wait().unwrap();
    assert!(status.success(), "the run failed: {status:?}");
    let meta = std::fs::metadata(&a);
    assert!(
        meta.as_ref().is_ok_and(|m| m.is_dir() && m.uid() == HANA),
        "root removed another user's directory for the caller: {meta:?}"
    );
}

/// The caller's own placeholders still go at the end of its run.
#[test]
fn a_service_runs_own_placeholders_are_removed_at_its_end() {
    if !can_run("placeholder_removed") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(GUS + 2);
    let w = work.path().to_str().unwrap().to_string();
    let deny = format!("{w}/x/y");
    let out = service.run(
        GUS + 2,
        &[
            "run",
            "--write",
            &w,
            "--read-deny",
            &deny,
            "--materialize",
            "--",
            "true",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!work.join("x").exists(), "the placeholder was left behind");
}
