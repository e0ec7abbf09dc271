//! Adversarial round 18 (F5): a live log in a tree that a second run
//! writes. The run hides its log from its own agent, but a second run on
//! the same tree (its agent the default `nobody`, no other right) renamed
//! the live log away and put an older, genuine log at its name; the
//! supervisor went on writing into the renamed inode, the first agent's
//! `rm important` was in no record at the name, and `log verify` said `ok`
//! (3 of 3). The live log is now append-only (`append_only.rs`): nobody,
//! root included, renames, replaces, links or truncates it until the seal,
//! which lets it go so that its owner can remove it.
//! Needs root; skips with a reason otherwise (fails under CI=true).

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `FS_IOC_GETFLAGS` of `path`.
fn inode_flags(path: &Path) -> i32 {
    let f = std::fs::File::open(path).expect("open the log");
    let mut flags: i32 = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int into `flags`, which we own.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    assert_eq!(r, 0, "FS_IOC_GETFLAGS: {}", std::io::Error::last_os_error());
    flags
}

const FS_APPEND_FL: i32 = 0x20;

#[test]
fn another_run_cannot_swap_a_live_log() {
    if !can_run("log_live_swap") {
        return;
    }
    let tree = Dir::new();
    let t = tree.path().to_str().unwrap().to_string();
    std::fs::write(tree.join("important"), "keep\n").unwrap();
    chown(&tree.join("important"), NOBODY);
    // An older, genuine log of this tree: what the attacker puts in place.
    let old = tree.join("old.jsonl");
    let out = tartaros(
        &[
            "run",
            "--write",
            &t,
            "--log",
            old.to_str().unwrap(),
            "--",
            "true",
        ],
        tree.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let log = tree.join("effB.jsonl");
    let b = Command::new(bin())
        .args(["run", "--write", &t, "--log", log.to_str().unwrap(), "--"])
        .args(["sh", "-c", "sleep 2; rm important"])
        .current_dir(tree.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start run B");
    let start = Instant::now();
    while !log.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "no log");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Run A's agent, on the same tree, tries every way to replace it.
    let a = tartaros(
        &[
            "run",
            "--write",
            &t,
            "--",
            "sh",
            "-c",
            "mv effB.jsonl .real && echo RENAMED; cp old.jsonl x && mv x effB.jsonl && echo REPLACED; \
             ln effB.jsonl hl && echo LINKED; rm -f effB.jsonl && echo REMOVED; true",
        ],
        tree.path(),
    );
    let said = stdout(&a);
    for done in ["RENAMED", "REPLACED", "LINKED", "REMOVED"] {
        assert!(
            !said.contains(done),
            "run A's agent {done} the live log: {said}"
        );
    }
    // Root on the host cannot either while the run lives.
    let moved = std::fs::rename(&log, tree.join(".root-moved"));
    assert_eq!(
        moved.as_ref().err().and_then(std::io::Error::raw_os_error),
        Some(libc::EPERM),
        "root renamed the live log: {moved:?}"
    );
    assert_ne!(
        inode_flags(&log) & FS_APPEND_FL,
        0,
        "live log not append-only"
    );
    let b = b.wait_with_output().expect("wait for run B");
    let b_err = String::from_utf8_lossy(&b.stderr).to_string();
    assert!(b.status.success(), "run B: {b_err}");
    let head = b_err
        .lines()
        .find_map(|l| l.split("effect log sealed, head ").nth(1))
        .map(|h| h.trim().to_string())
        .expect("run B printed its head");
    let verify = tartaros(
        &["log", "verify", "--head", &head, log.to_str().unwrap()],
        Path::new("/"),
    );
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("\"kind\":\"unlink\"") && l.contains("important")),
        "B's rm is in the log at its name"
    );
    assert!(!tree.join("important").exists());
    // Sealed: the owner may remove it again.
    assert_eq!(
        inode_flags(&log) & FS_APPEND_FL,
        0,
        "sealed log still append-only"
    );
    std::fs::remove_file(&log).expect("remove the sealed log");
}

/// A supervisor killed before its seal: its janitor lets the log go, so
/// that the unsealed log can be removed like any other file.
#[test]
fn a_killed_supervisors_janitor_lets_the_log_go() {
    if !can_run("log_live_swap") {
        return;
    }
    let tree = Dir::new();
    let t = tree.path().to_str().unwrap().to_string();
    let log = tree.join("effects.jsonl");
    let mut run = Command::new(bin())
        .args(["run", "--write", &t, "--log", log.to_str().unwrap(), "--"])
        .args(["sleep", "30"])
        .current_dir(tree.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the run");
    let start = Instant::now();
    while !(log.exists() && inode_flags(&log) & FS_APPEND_FL != 0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no append-only log"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    run.kill().expect("SIGKILL the supervisor");
    run.wait().expect("reap the supervisor");
    let start = Instant::now();
    while inode_flags(&log) & FS_APPEND_FL != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the janitor left the unsealed log append-only"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&log).expect("remove the unsealed log");
}

/// Round 20: the janitor read the supervisor's "log" line only after the
/// supervisor had died (a busy host: the janitor was not scheduled in
/// time), could no longer reopen the log through `/proc/<supervisor>/fd`,
/// and the unsealed log stayed append-only (1 of 30 random kills). The
/// janitor is stopped here before it can read the line, so the line is
/// read after the death every time; the log must still be let go.
#[test]
fn a_janitor_that_learns_of_the_log_after_the_death_still_lets_it_go() {
    if !can_run("log_live_swap") {
        return;
    }
    let tree = Dir::new();
    let t = tree.path().to_str().unwrap().to_string();
    let log = tree.join("effects.jsonl");
    let mut run = Command::new(bin())
        .args(["run", "--write", &t, "--log", log.to_str().unwrap(), "--"])
        .args(["sleep", "30"])
        .current_dir(tree.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the run");
    let supervisor = run.id();
    // The janitor is the supervisor's first child.
    let start = Instant::now();
    let janitor = loop {
        let children =
            std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
                .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            break pid.parse::<i32>().unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no janitor");
        std::hint::spin_loop();
    };
    let janitor = nix::unistd::Pid::from_raw(janitor);
    nix::sys::signal::kill(janitor, nix::sys::signal::Signal::SIGSTOP).expect("stop the janitor");
    let start = Instant::now();
    while !(log.exists() && inode_flags(&log) & FS_APPEND_FL != 0) {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = nix::sys::signal::kill(janitor, nix::sys::signal::Signal::SIGCONT);
            panic!("no append-only log");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    run.kill().expect("SIGKILL the supervisor");
    run.wait().expect("reap the supervisor");
    nix::sys::signal::kill(janitor, nix::sys::signal::Signal::SIGCONT).expect("continue");
    let start = Instant::now();
    while inode_flags(&log) & FS_APPEND_FL != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the janitor left the unsealed log append-only"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&log).expect("remove the unsealed log");
}
