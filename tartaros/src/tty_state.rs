//! The launcher's terminals, put back as they were found when the run
//! ends.
//!
//! Without a pty of its own (stdin not a terminal, or `--no-tty`), the
//! agent is handed the launcher's terminal as a standard stream (through
//! a read-only bind, stdio_tty.rs). Its state belongs to the terminal, not
//! to the descriptor, and outlived the run: `TIOCEXCL` made every later
//! open without CAP_SYS_ADMIN fail with EBUSY (the user's next `sudo` or
//! `ssh` prompt could not open `/dev/tty`), `tcsetattr` left echo off, and
//! `tcflow(TCOOFF)` left output stopped. Seccomp cannot tell the
//! launcher's terminal from the agent's own pty, where programs need
//! these calls, so the supervisor saves each terminal stream before the
//! init exists and restores it once the sandbox is empty: modes, the
//! exclusive flag, and output flow. The window size is not restored: the
//! user may have resized the window during the run; instead the agent may
//! not set it in such a run (seccomp's `Tier::HostTerminal`), since the
//! kernel also signals the launcher's job (SIGWINCH) when it changes.
//!
//! Since adversarial round 23b the CLI relays the terminal streams of a
//! run without a pty (stdio_relay.rs, job_control.rs), so the agent holds
//! none; this restore stays for a terminal a service client passes
//! without relaying it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::sys::termios::{self, FlowArg, SetArg, Termios};

/// One terminal as the run found it.
struct Terminal {
    fd: OwnedFd,
    modes: Termios,
    exclusive: Option<bool>,
}

/// The terminals among the standard streams, as they were.
#[derive(Default)]
pub struct Saved(Vec<Terminal>);

/// Saves every standard stream that is a terminal (each terminal once).
pub fn save() -> Saved {
    let mut saved: Vec<Terminal> = Vec::new();
    let mut seen = Vec::new();
    for fd in 0..3 {
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            continue;
        };
        if !nix::unistd::isatty(fd).unwrap_or(false) || seen.contains(&st.st_rdev) {
            continue;
        }
        let Ok(fd) = nix::unistd::dup(fd) else {
            continue;
        };
        // SAFETY: `dup` returned a new descriptor that nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let Ok(modes) = termios::tcgetattr(fd.as_fd()) else {
            continue;
        };
        seen.push(st.st_rdev);
        let exclusive = exclusive(&fd);
        saved.push(Terminal {
            fd,
            modes,
            exclusive,
        });
    }
    Saved(saved)
}

/// `TIOCGEXCL` (Linux 3.8); `None` where the kernel cannot say.
fn exclusive(fd: &OwnedFd) -> Option<bool> {
    let mut value: libc::c_int = 0;
    // SAFETY: TIOCGEXCL writes one int into `value`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGEXCL, &mut value) };
    (rc == 0).then_some(value != 0)
}

impl Saved {
    /// No standard stream is a terminal.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Puts every saved terminal back. Call once no process of the run is
    /// left, so nothing can change it again; errors are ignored (the
    /// launcher may have closed its terminal meanwhile).
    pub fn restore(self) {
        for terminal in self.0 {
            let fd = terminal.fd.as_fd();
            // First: a `tcsetattr` that drains would wait on stopped output.
            let _ = termios::tcflow(fd, FlowArg::TCOON);
            let _ = termios::tcsetattr(fd, SetArg::TCSANOW, &terminal.modes);
            let request = match terminal.exclusive {
                Some(true) => libc::TIOCEXCL,
                _ => libc::TIOCNXCL,
            };
            // SAFETY: TIOCEXCL and TIOCNXCL take no argument.
            unsafe { libc::ioctl(terminal.fd.as_raw_fd(), request) };
        }
    }
}
