//! The effect log cannot fill the host's disk (adversarial round 7). An
//! agent makes records as fast as the writer takes them: 2.4 million
//! refused opens in 5 s made a 74 MB log here, and nothing bounded the
//! file, which lives on the host's disk wherever `--log` points (the
//! agent needs no writable root there). The log now stops at half the
//! free space its filesystem had at the start, the way it stops when that
//! filesystem fills: later records are dropped and counted, a `log-full`
//! gap and the seal fit in the reserve, `verify` says incomplete and the
//! run exits 122. Checked from the host: the file's size, the free space
//! left, the verdict and the exit status.

mod common;
use std::path::Path;
use std::process::Command;

use common::*;

/// Refused write opens outside every root, each one record, for `secs`.
const FLOOD: &str = r#"
import os, sys, time
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(1000):
        try:
            os.open('/nonexistent-tt/x', os.O_WRONLY | os.O_CREAT)
        except OSError:
            pass
    n += 1000
print('tried', n)
"#;

#[test]
fn a_flood_of_records_stops_at_half_the_free_space_of_the_logs_disk() {
    if !can_run("a_flood_of_records_stops_at_half_the_free_space_of_the_logs_disk") {
        return;
    }
    let disk = Tmpfs::mount("48m");
    let at_start = disk.free();
    let log = disk.path().join("effects.jsonl");
    let work = Dir::new();
    let out = tartaros(
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            FLOOD,
            "8",
        ],
        work.path(),
    );
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("tried"), "{said}");
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        size <= at_start / 2,
        "the log grew to {size} bytes of {at_start} free: {said}"
    );
    assert!(
        disk.free() >= at_start / 2 - (1 << 20),
        "the host's half was taken: {} of {at_start} left: {said}",
        disk.free()
    );
    assert!(
        stderr(&out).contains("it reached its size limit"),
        "the run did not say why: {said}"
    );
    assert_eq!(
        out.status.code(),
        Some(tartaros::exit::LOG_INCOMPLETE),
        "{said}"
    );
    let verify = Command::new(bin())
        .args(["log", "verify"])
        .arg(&log)
        .current_dir(Path::new("/"))
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(3), "{}", stdout(&verify));
    let records = records(&log);
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "gap" && r["lost_kind"] == "log-full"),
        "no log-full gap"
    );
    assert_eq!(records.last().unwrap()["kind"], "seal");
}
