//! The start-up walk of read-denied directories for files with other hard
//! links (adversarial round 9) runs in the service's root worker. Walked
//! as root, a caller's `--read-deny` of a directory it cannot list told it,
//! in the warning, the names of the files there that have other links:
//! the service must not show a caller what it could not see itself.
//! Proved from the caller's side of the service: its stderr.

mod common;
#[path = "support/service.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;

use common::*;
use support::Service;

const CALLER: u32 = 47_000 + 141;

#[test]
fn a_callers_denied_directory_is_walked_with_the_callers_access() {
    if !can_run("a_callers_denied_directory_is_walked_with_the_callers_access") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CALLER);
    // Root's, and closed to the caller; one file there has another name.
    let private = tempfile::Builder::new()
        .prefix("tt-private-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = private.path().join("payroll-2027-layoffs.xlsx");
    std::fs::write(&secret, "x").unwrap();
    std::fs::hard_link(&secret, private.path().join("again")).unwrap();

    let out = service.run(
        CALLER,
        &[
            "run",
            "--read-deny",
            private.path().to_str().unwrap(),
            "--",
            "true",
        ],
        work.path(),
    );
    let err = stderr(&out);
    assert!(!err.contains("payroll"), "the caller learnt a name: {err}");
    assert!(!err.contains("again"), "the caller learnt a name: {err}");

    // The walk still works where the caller can list: the same directory
    // opened to it names its linked file.
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = service.run(
        CALLER,
        &[
            "run",
            "--read-deny",
            private.path().to_str().unwrap(),
            "--",
            "true",
        ],
        work.path(),
    );
    assert!(
        stderr(&out).contains("has 2 hard links"),
        "{}",
        stderr(&out)
    );
    drop(service);
}
