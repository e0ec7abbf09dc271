//! File leases (adversarial round 7). `fcntl(F_SETLEASE)` needs only
//! that the caller owns the file, not that it may write it: through the
//! read-only base an agent took a read lease on a file of its uid outside
//! every root (under sudo: any file of the user's), and each host process
//! that then opened the file for writing hung until the agent let go or
//! `lease-break-time` (45 s) ran out: `echo x >> f` on the host took 4 s
//! while the agent held its lease for 6. No coding tool takes leases
//! (Samba and NFS servers do), so the filter refuses the command. Checked
//! from the host: how long a write open of the file takes, and the record.

mod common;
use std::time::{Duration, Instant};

use common::*;

/// Ignores the lease-break signal, tries the lease, says so, and holds
/// the descriptor for three seconds.
const HOLD: &str = r#"
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)
    print('lease OK', flush=True)
except OSError as e:
    print('lease', e.errno, flush=True)
time.sleep(3)
"#;

#[test]
fn an_agent_cannot_stall_host_writers_of_its_files_with_a_lease() {
    if !can_run("an_agent_cannot_stall_host_writers_of_its_files_with_a_lease") {
        return;
    }
    // Owned by the agent (nobody) and outside every root.
    let outside = Dir::new();
    let file = outside.file("notes.txt", "notes\n");
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let mut run = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args(["run", "-q", "--write"])
            .arg(work.path())
            .arg("--log")
            .arg(&log)
            .args(["--", "python3", "-c", HOLD])
            .arg(&file)
            .current_dir(work.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tartaros"),
    ));
    // Once the agent has had time to take its lease, as a host editor
    // saving the file would.
    std::thread::sleep(Duration::from_millis(1500));
    let started = Instant::now();
    let opened = std::fs::OpenOptions::new().append(true).open(&file);
    let took = started.elapsed();
    let out = run.take().wait_with_output().unwrap();
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(opened.is_ok(), "{opened:?}");
    assert!(
        took < Duration::from_millis(1000),
        "the host's write open waited {took:?} on the agent's lease: {said}"
    );
    assert!(
        stdout(&out).contains(&format!("lease {}", libc::EPERM)),
        "{said}"
    );
    let records = records(&log);
    let refused = records
        .iter()
        .find(|r| r["kind"] == "syscall" && r["target"]["syscall"] == "fcntl")
        .unwrap_or_else(|| panic!("no fcntl record: {records:#?}"));
    assert_eq!(refused["target"]["cmd"], 1024, "{refused}");
    assert_eq!(refused["target"]["refused_by"], "seccomp", "{refused}");
    assert_eq!(refused["errno"], libc::EPERM, "{refused}");
}
