//! The user's terminal after a service run that ended badly: the worker
//! (root) puts the caller's terminal in raw mode for the pty relay and
//! gives it back at the end; a worker that dies (killed, the service
//! restarted) cannot. The client, the user's own process, outlives it and
//! must give the terminal back as it found it.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::*;
use harness::Service;

const IDA: u32 = 47_000 + 195;

/// Whether the terminal behind `fd` is in canonical (cooked) mode.
fn canonical(fd: &impl AsRawFd) -> bool {
    // SAFETY: tcgetattr fills a termios we own.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we own.
    let rc = unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) };
    rc == 0 && t.c_lflag & libc::ICANON != 0
}

/// The service's workers (its children running as workers).
fn workers_of(service: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(service)
            && String::from_utf8_lossy(&cmdline).contains("__tartaros_service_worker")
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_killed_worker_leaves_the_callers_terminal_as_it_was() {
    if !can_run("terminal_after_worker_death") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(IDA);
    let pair = nix::pty::openpty(None, None).expect("openpty");
    let slave_name = std::fs::read_link(format!("/proc/self/fd/{}", pair.slave.as_raw_fd()))
        .expect("slave name");
    std::os::unix::fs::chown(&slave_name, Some(IDA), Some(IDA)).unwrap();
    assert!(canonical(&pair.master), "the test's terminal starts cooked");
    let mut command = Command::new("setpriv");
    command
        .args([&format!("--reuid={IDA}"), &format!("--regid={IDA}")])
        .args(["--clear-groups", bin(), "run", "--tty", "--", "sleep", "60"])
        .current_dir(work.path())
        .env("TARTAROS_SERVICE", &service.socket)
        .env_remove("SUDO_UID")
        .stdin(Stdio::from(pair.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pair.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pair.slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the slave (fd 0)
    // becomes the controlling terminal of the client's session.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut client = KillOnDrop(Some(command.spawn().expect("setpriv")));
    assert!(
        eventually(10, || !canonical(&pair.master)),
        "the run never put the terminal in raw mode: {}",
        service.errors()
    );
    let workers = workers_of(service.pid);
    assert_eq!(workers.len(), 1, "{workers:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(workers[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut child = client.take();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(125), "the client's end: {status:?}");
    assert!(
        canonical(&pair.master),
        "the caller's terminal was left in raw mode"
    );
}
