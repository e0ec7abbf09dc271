//! Adversarial round 24b, the status channel: `--status-fd 9 9>/dev/tty`
//! while stdout is that terminal (`/dev/pts/N`). The check that refuses a
//! status descriptor the agent also writes compared inodes, and `/dev/tty`
//! is another inode than `/dev/pts/N` for one terminal: the agent printed
//! a forged `{"event":"exited","code":0}` line into the status stream
//! ahead of the real one. A character device is now its device number
//! (the terminal behind `/dev/tty`), and the run is refused (78) before
//! anything runs.

mod common;

use std::io::Read as _;
use std::process::Command;

use common::*;

#[test]
fn a_status_channel_on_the_agents_terminal_by_another_name_is_refused() {
    if !can_run("status_fd_round24_tty") {
        return;
    }
    let work = Dir::new();
    let marker = work.join("ran");
    let pair = nix::pty::openpty(None, None).expect("openpty");
    let script = format!(
        "exec {} run -q --status-fd 9 -- touch {} 9>/dev/tty",
        bin(),
        marker.display()
    );
    let mut command = Command::new("sh");
    command.args(["-c", &script]).current_dir("/");
    on_terminal(&mut command, pair.slave);
    let mut child = command.spawn().expect("spawn sh");
    drop(command);
    let status = child.wait().expect("wait");
    let mut master = std::fs::File::from(pair.master);
    // SAFETY: O_NONBLOCK on our own master: read what is there, then stop.
    unsafe {
        use std::os::fd::AsRawFd as _;
        libc::fcntl(master.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
    }
    let mut seen = Vec::new();
    let _ = master.read_to_end(&mut seen);
    let seen = String::from_utf8_lossy(&seen);
    assert_eq!(status.code(), Some(78), "terminal: {seen}");
    assert!(
        seen.contains("same file as standard stream"),
        "terminal: {seen}"
    );
    assert!(!marker.exists(), "the agent ran");
}
