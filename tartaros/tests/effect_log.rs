//! The effect log contracts of DESIGN.md section 6 that hold for every run.

mod common;
use std::process::{Command, Stdio};

use common::*;

fn verify(log: &std::path::Path) -> (i32, String) {
    let out = tartaros(
        &["log", "verify", log.to_str().unwrap()],
        std::path::Path::new("/"),
    );
    (out.status.code().unwrap_or(-1), stdout(&out))
}

#[test]
fn the_agent_cannot_open_truncate_rename_or_delete_the_log() {
    if !can_run("log_protected") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let l = log.display();
    let code = format!(
        "{ATTEMPT}
attempt('read', lambda: open('{l}').read())
attempt('append', lambda: open('{l}', 'a').write('forged'))
attempt('truncate', lambda: os.truncate('{l}', 0))
attempt('rename', lambda: os.rename('{l}', '{l}.old'))
attempt('unlink', lambda: os.unlink('{l}'))
attempt('control', lambda: open('{}/other', 'w').write('x'))",
        work.path().display()
    );
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "read", "EACCES");
    expect(&out, "append", "EACCES");
    // The log is hidden under /dev/null on a nodev mount: truncate(2) of
    // a device node is EINVAL, before any permission check.
    expect(&out, "truncate", "EINVAL");
    expect(&out, "rename", "EBUSY");
    expect(&out, "unlink", "EBUSY");
    expect(&out, "control", "OK");
    assert_eq!(verify(&log).0, 0, "{}", verify(&log).1);
}

#[test]
fn a_killed_supervisor_leaves_a_log_that_verifies_as_unsealed() {
    if !can_run("log_unsealed") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let marker = format!("1000.{}77", std::process::id());
    let mut supervisor = KillOnDrop(Some(
        Command::new(bin())
            .args([
                "run",
                "--log",
                log.to_str().unwrap(),
                "--",
                "sleep",
                &marker,
            ])
            .current_dir(work.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    assert!(
        eventually(5, || !processes_with(&marker).is_empty()),
        "agent did not start"
    );
    let mut child = supervisor.take();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(5, || processes_with(&marker).is_empty()),
        "sandbox survived"
    );
    let (code, message) = verify(&log);
    assert_eq!(code, 2, "{message}");
    assert!(message.contains("unsealed"), "{message}");
}

#[test]
fn a_normal_run_seals_the_log_with_the_exit_status() {
    if !can_run("log_sealed") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let out = tartaros(
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 7",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(7));
    let (code, message) = verify(&log);
    assert_eq!(code, 0, "{message}");
    let text = std::fs::read_to_string(&log).unwrap();
    let seal = text.lines().last().unwrap();
    assert!(
        seal.contains("\"kind\":\"seal\"") && seal.contains("\"exit_status\":{\"code\":7}"),
        "{seal}"
    );
    assert!(seal.contains("\"cgroup_empty\":true"), "{seal}");
}
