//! Adversarial round 22, the status channel: (1) a writable root that is
//! the status file itself (`--write status.jsonl --status-fd 9
//! 9>>status.jsonl`): the check looked for roots among the file's
//! directories only, and the agent appended a forged `exited` line;
//! (2) a status descriptor that cannot be written (`O_PATH`, read-only):
//! accepted, every line was lost while the run exited 0. Both are refused
//! (78) before anything runs.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};

use common::*;

/// `tartaros run ARGS --status-fd 9 -- sh -c 'touch MARKER'`, with `fd`
/// put on 9 in the launcher.
fn run_with_status(fd: &OwnedFd, args: &[&str], marker: &std::path::Path) -> std::process::Output {
    let mut command = Command::new(bin());
    command
        .args(["run", "-q"])
        .args(args)
        .args(["--status-fd", "9", "--", "sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on_fd9(&mut command, fd.as_raw_fd());
    command.output().unwrap()
}

#[test]
fn a_writable_root_that_is_the_status_file_is_refused() {
    if !can_run("status_fd_round22_file_root") {
        return;
    }
    let (dir, work) = (Dir::new(), Dir::new());
    chown(work.path(), NOBODY);
    let status = dir.join("status.jsonl");
    std::fs::write(&status, "").unwrap();
    chown(&status, NOBODY);
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .append(true)
        .open(&status)
        .unwrap()
        .into();
    let marker = work.join("ran");
    let out = run_with_status(
        &fd,
        &[
            "--write",
            status.to_str().unwrap(),
            "--write",
            work.path().to_str().unwrap(),
        ],
        &marker,
    );
    assert_eq!(out.status.code(), Some(78), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("inside the writable root"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists(), "the agent ran");
    let lines = std::fs::read_to_string(&status).unwrap();
    assert!(!lines.contains("\"started\""), "{lines}");
}

#[test]
fn a_status_descriptor_that_cannot_be_written_is_refused() {
    if !can_run("status_fd_round22_unwritable") {
        return;
    }
    let (dir, work) = (Dir::new(), Dir::new());
    chown(work.path(), NOBODY);
    let status = dir.join("status.jsonl");
    std::fs::write(&status, "").unwrap();
    let marker = work.join("ran");
    let raw = nix::fcntl::open(
        &status,
        nix::fcntl::OFlag::O_PATH,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    // SAFETY: a descriptor just opened, owned from here on.
    let o_path = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let read_only: OwnedFd = std::fs::File::open(&status).unwrap().into();
    let (pipe_read, _pipe_write) = nix::unistd::pipe().unwrap();
    for (what, fd) in [
        ("O_PATH", &o_path),
        ("read-only", &read_only),
        ("a pipe's read end", &pipe_read),
    ] {
        let out = run_with_status(fd, &["--write", work.path().to_str().unwrap()], &marker);
        assert_eq!(out.status.code(), Some(78), "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no status line can be written"),
            "{what}: {}",
            stderr(&out)
        );
        assert!(!marker.exists(), "{what}: the agent ran");
    }
    // A writable descriptor to the same file works.
    let append: OwnedFd = std::fs::OpenOptions::new()
        .append(true)
        .open(&status)
        .unwrap()
        .into();
    let out = run_with_status(
        &append,
        &["--write", work.path().to_str().unwrap()],
        &marker,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = std::fs::read_to_string(&status).unwrap();
    assert!(lines.contains("\"event\":\"exited\""), "{lines}");
}
