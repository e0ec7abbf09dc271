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
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
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
        if !crate::stdio_relay::forward_once(&mut *terminal, &mut to, &mut buf) {
            return;
        }
    }
}

/// The run's `cgroup.freeze`, open for the signal handler; -1 for none.
static FREEZE: AtomicI32 = AtomicI32::new(-1);

/// The job-control signals the supervisor follows.
const STOPS: [libc::c_int; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// In the supervisor, for the run's lifetime: on a job-control stop,
/// freezes the run's cgroup (v2 `cgroup.freeze`), stops this process, and
/// thaws the cgroup once it is continued. A plain signal handler, not a
/// runtime task: the runtime has one thread, and a `tcsetattr` from the
/// background on it is restarted after every caught SIGTTOU, so a task
/// would never get to run. A signal the launcher left ignored stays
/// ignored. Dropping the guard puts the default actions back.
pub fn follow_stops(cgroup: Option<&std::path::Path>) -> Stops {
    let freeze = cgroup.and_then(|dir| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.freeze"))
            .ok()
    });
    let freeze = freeze.map(OwnedFd::from);
    FREEZE.store(
        freeze.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
        Ordering::SeqCst,
    );
    let mut caught = Vec::new();
    for sig in STOPS {
        // SAFETY: an all-zero sigaction is a valid value of the C struct.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: an all-zero sigaction is a valid value of the C struct.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current action into `old`; changes nothing.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0
            || old.sa_sigaction == libc::SIG_IGN
        {
            continue;
        }
        // SAFETY: `on_stop` makes only async-signal-safe calls.
        if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } == 0 {
            caught.push(sig);
        }
    }
    Stops { caught, freeze }
}

/// The handlers [`follow_stops`] installed.
pub struct Stops {
    caught: Vec<libc::c_int>,
    freeze: Option<OwnedFd>,
}

impl Drop for Stops {
    fn drop(&mut self) {
        for sig in &self.caught {
            // SAFETY: SIG_DFL installs no handler.
            unsafe { libc::signal(*sig, libc::SIG_DFL) };
        }
        // No handler can use the descriptor once it is closed below.
        FREEZE.store(-1, Ordering::SeqCst);
        drop(self.freeze.take());
    }
}

/// Freezes the run, stops this whole process by the signal's default
/// action (so the shell reports it as `sig`, and a signal to an orphaned
/// process group stops nothing, as the kernel wants), and thaws the run
/// once continued (SIGCONT).
extern "C" fn on_stop(sig: libc::c_int) {
    // SAFETY: errno is thread-local; we put back what the interrupted
    // code saw.
    let errno = unsafe { *libc::__errno_location() };
    let fd = FREEZE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: pwrite of two bytes from a static buffer (async-signal-safe).
        unsafe { libc::pwrite(fd, b"1\n".as_ptr().cast(), 2, 0) };
    }
    // SAFETY: sigaction, sigprocmask and raise are async-signal-safe; the
    // structs are zeroed C values filled in before use. The signal is
    // blocked while its handler runs: unblocked, the raise stops us here,
    // before the thaw; the handler is back before we return.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        let mut ours: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &action, &mut ours);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        libc::sigaction(sig, &ours, std::ptr::null_mut());
    }
    if fd >= 0 {
        // SAFETY: as above.
        unsafe { libc::pwrite(fd, b"0\n".as_ptr().cast(), 2, 0) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}
