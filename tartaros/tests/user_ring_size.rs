//! A service run's eBPF ring buffer is kernel memory the service pays for
//! (charged to its cgroup, never to the caller's limits), allocated whole
//! when the run starts. `--log-buffer 1G` let any ordinary user have root
//! pin a gigabyte per run, up to `--max-runs-per-user` (256) runs at once;
//! through the service a run gets at most the default ring, which the
//! bound on runs already counts.

mod common;
#[path = "support/service.rs"]
mod harness;

use common::*;
use harness::Service;

const JUNO: u32 = 47_000 + 197;

#[test]
fn a_caller_cannot_make_the_service_pin_a_gigabyte_ring() {
    if !can_run("service_ring_size") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(JUNO);
    let log = work.join("big.jsonl");
    let out = service.run(
        JUNO,
        &[
            "run",
            "-q",
            "--log",
            log.to_str().unwrap(),
            "--log-buffer",
            "1G",
            "--",
            "true",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(stderr(&out).contains("--log-buffer"), "{}", stderr(&out));
    // The default, and smaller ones, still work.
    let log = work.join("small.jsonl");
    let out = service.run(
        JUNO,
        &[
            "run",
            "-q",
            "--log",
            log.to_str().unwrap(),
            "--log-buffer",
            "1M",
            "--",
            "true",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
