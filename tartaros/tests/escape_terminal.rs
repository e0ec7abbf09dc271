//! The launcher's terminal, handed to the agent as a standard stream when
//! the run has no pty of its own (`tartaros run -- cmd > out.txt` at a
//! prompt leaves stdin and stderr the terminal), must be as the launcher
//! left it once the run is over. Proved from the host side: the
//! terminal's modes, whether an ordinary user can still open it, and
//! whether output still flows, read through descriptors the test keeps.
//! Fails on the binary before its fix (0654350).

mod common;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::*;

/// The agent set the terminal exclusive (`TIOCEXCL`: every later open
/// without CAP_SYS_ADMIN fails with EBUSY, so the user's next `sudo`,
/// `ssh` password prompt or `vim` could not open `/dev/tty`), turned its
/// echo off and stopped its output (`tcflow(TCOOFF)`); all three outlived
/// the run. The supervisor now puts each terminal it was handed back as it
/// found it when the sandbox is empty.
#[test]
fn the_launchers_terminal_is_left_as_it_was_found() {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    if !can_run("the_launchers_terminal_is_left_as_it_was_found") {
        return;
    }
    let work = Dir::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let name = nix::unistd::ttyname(&pty.slave).unwrap();
    // The agent's user owns the terminal, as the user running sudo does.
    chown(&name, NOBODY);
    let slave = std::fs::File::from(pty.slave);
    let before = tcgetattr(&slave).unwrap();
    assert!(before.local_flags.contains(LocalFlags::ECHO));
    let code = "
import fcntl, termios, sys
print('agent', flush=True)
fcntl.ioctl(2, termios.TIOCEXCL)
attrs = termios.tcgetattr(2)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(2, termios.TCSANOW, attrs)
termios.tcflow(2, termios.TCOOFF)
";
    let w = work.path().to_str().unwrap();
    let out = Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", code])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(slave.try_clone().unwrap())
        .output()
        .unwrap();
    assert!(stdout(&out).contains("agent"), "the agent did not run");

    let after = tcgetattr(&slave).unwrap();
    let opened = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3<> {}", name.display()))
        .uid(NOBODY)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
    }
    // Non-blocking: on a stopped terminal a write would wait forever.
    let _ = (&slave).write_all(b"after the run\n");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut seen = vec![0u8; 8192];
    let n = master.read(&mut seen).unwrap_or(0);
    let seen = String::from_utf8_lossy(&seen[..n]).into_owned();
    assert!(
        opened.status.success(),
        "the terminal stayed exclusive: {}",
        stderr(&opened)
    );
    assert!(
        after.local_flags.contains(LocalFlags::ECHO),
        "the terminal's echo stayed off"
    );
    assert!(
        seen.contains("after the run"),
        "the terminal's output stayed stopped: {seen:?}"
    );
}
