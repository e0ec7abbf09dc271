//! The launcher's job control reaches the agent (adversarial round 23b).
//!
//! The agent runs in a session of its own (`setsid` in the init), so the
//! launcher's terminal no longer stops it: on Ctrl-Z, or a read from the
//! background, the kernel stopped the supervisor (SIGTSTP, SIGTTIN) while
//! the agent ran on past its `--timeout` and read what the user typed next
//! at the shell, passwords included. Two parts put it back under the job:
//!
//! - A terminal stream of a run without a pty of its own is relayed
//!   (stdio_relay.rs) and read here, by a process of the launcher's job,
//!   only while that job is in the terminal's foreground: a background job
//!   reads nothing (the agent waits on its pipe, as a background reader
//!   would wait stopped), and a stopped one reads nothing either.
//! - The supervisor freezes the run's cgroup before it stops itself on
//!   SIGTSTP, SIGTTIN or SIGTTOU, and thaws it once continued, so a
//!   stopped job stops the agent too. The `--timeout` is wall-clock time:
//!   it does not fire while the supervisor is stopped (nor does anything
//!   of the agent run then); on SIGCONT a deadline that passed meanwhile
//!   ends the run at once.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

/// How often a background job looks again whether it is in the
/// foreground: `fg` sends no signal the relay could wait for.
const POLL: Duration = Duration::from_millis(100);

/// Whether this process's job is the foreground of the terminal on `fd`.
/// A terminal that is not our controlling one (a VT given as `< /dev/tty20`)
/// has no job control for us: a read there never stops us, so it is read.
fn in_foreground(fd: RawFd) -> bool {
    // SAFETY: `fd` is a standard stream this process keeps open until exit.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    match nix::unistd::tcgetpgrp(fd) {
        Ok(group) => group == nix::unistd::getpgrp(),
        Err(_) => true,
    }
}

/// Whether `fd` has input within one [`POLL`].
fn readable(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call.
    let rc = unsafe { libc::poll(&mut poll, 1, POLL.as_millis() as libc::c_int) };
    rc > 0
}

/// Copies the launcher's terminal on `from` to the agent's pipe `to`,
/// reading only while the job is in the foreground. A read that races a
/// move to the background gets SIGTTIN and stops this process, as any
/// job's read would. Ends at end of file (Ctrl-D), a hangup, or once no
/// process of the run reads the pipe.
pub fn copy_terminal_in(from: RawFd, to: OwnedFd) {
    // SAFETY: `from` is a standard stream this process keeps open until
    // exit; ManuallyDrop never closes it.
    let mut terminal =
        std::mem::ManuallyDrop::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(from) });
    let mut to = File::from(to);
    let mut buf = vec![0u8; 4096];
    loop {
        if !in_foreground(from) {
            std::thread::sleep(POLL);
            continue;
        }
        if !readable(from) || !in_foreground(from) {
            continue;
        }
        match terminal.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// In the supervisor, for the run's lifetime: on a job-control stop,
/// freezes the run's cgroup (v2 `cgroup.freeze`), stops this process, and
/// thaws the cgroup once it is continued. Returns `None` where the signals
/// cannot be caught; the default stop then applies, as before.
pub fn follow_stops(cgroup: Option<PathBuf>) -> Option<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut streams = Vec::new();
    for sig in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
        streams.push(signal(SignalKind::from_raw(sig)).ok()?);
    }
    Some(tokio::spawn(async move {
        let [tstp, ttin, ttou] = &mut streams[..] else {
            return;
        };
        loop {
            tokio::select! {
                Some(()) = tstp.recv() => {}
                Some(()) = ttin.recv() => {}
                Some(()) = ttou.recv() => {}
                else => return,
            }
            stop_with_the_run(cgroup.as_deref());
        }
    }))
}

/// Freezes the run, stops this whole process as the default action of a
/// job-control signal would, then thaws.
fn stop_with_the_run(cgroup: Option<&std::path::Path>) {
    let freeze = |value: &str| {
        if let Some(dir) = cgroup {
            let _ = std::fs::write(dir.join("cgroup.freeze"), value);
        }
    };
    freeze("1");
    // SIGSTOP: the caught signal would only come back to our handler.
    // SAFETY: kill of our own process with a signal that takes no handler.
    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
    // Here once continued (SIGCONT).
    freeze("0");
}
