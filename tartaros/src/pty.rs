//! The agent's own pseudo-terminal, relayed by the supervisor.
//!
//! When stdin is a terminal (or on `--tty`) the supervisor opens a pty pair,
//! hands the slave to the sandbox init (fd [`PTY_FD`]), which makes it the
//! agent's controlling terminal and stdio; the launcher's terminal is put in
//! raw mode and bytes are copied both ways. So job control (Ctrl-Z, `fg`,
//! `bg`), Ctrl-C and window size act on the agent's pty only, and the agent
//! holds no descriptor of the launcher's terminal (TIOCSTI is refused by
//! seccomp as well).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::termios::{self, SetArg, Termios};

/// The fd number on which the init finds the pty's slave side.
pub const PTY_FD: RawFd = 5;

#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("failed to open a pseudo-terminal for the agent: {0}; run with --no-tty")]
    Open(nix::Error),
    #[error("failed to make the pseudo-terminal the agent's terminal ({what}): {source}")]
    Attach {
        what: &'static str,
        source: nix::Error,
    },
}

/// The pty pair, sized like the launcher's terminal when there is one.
pub struct Pair {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

pub fn open() -> Result<Pair, PtyError> {
    let size = window_size(std::io::stdin().as_fd());
    let pair = nix::pty::openpty(size.as_ref(), None).map_err(PtyError::Open)?;
    for fd in [&pair.master, &pair.slave] {
        // SAFETY: F_SETFD only changes the flags of a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(Pair {
        master: pair.master,
        slave: pair.slave,
    })
}

fn window_size(fd: BorrowedFd<'_>) -> Option<nix::pty::Winsize> {
    let mut size = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
    (rc == 0).then_some(size)
}

fn copy_window_size(from: BorrowedFd<'_>, to: BorrowedFd<'_>) {
    if let Some(size) = window_size(from) {
        // SAFETY: TIOCSWINSZ reads one winsize from `size`; the kernel then
        // signals SIGWINCH to the pty's foreground process group.
        unsafe { libc::ioctl(to.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    }
}

/// In the agent child, after `setsid`: makes `PTY_FD` the controlling
/// terminal and stdin, stdout and stderr.
pub fn attach_in_agent() -> Result<(), PtyError> {
    // SAFETY: TIOCSCTTY takes an integer argument and no memory.
    if unsafe { libc::ioctl(PTY_FD, libc::TIOCSCTTY, 0) } != 0 {
        return Err(PtyError::Attach {
            what: "TIOCSCTTY",
            source: nix::errno::Errno::last(),
        });
    }
    for target in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors of this process only.
        if unsafe { libc::dup2(PTY_FD, target) } < 0 {
            return Err(PtyError::Attach {
                what: "dup2",
                source: nix::errno::Errno::last(),
            });
        }
    }
    // SAFETY: PTY_FD was ours and is now duplicated on 0, 1 and 2.
    unsafe { libc::close(PTY_FD) };
    Ok(())
}

/// The running relay between the launcher's terminal and the agent's pty.
pub struct Relay {
    saved: Option<Termios>,
    output: std::thread::JoinHandle<()>,
    winch: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    /// Starts copying stdin to the pty and the pty to stdout; puts a
    /// terminal stdin in raw mode (so Ctrl-Z and Ctrl-C reach the pty's line
    /// discipline, not the launcher's) and follows its window size.
    /// Must be called inside the tokio runtime.
    pub fn start(master: OwnedFd) -> Result<Self, PtyError> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok();
        if let Some(saved) = &saved {
            let mut raw = saved.clone();
            termios::cfmakeraw(&mut raw);
            let _ = termios::tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw);
        }
        let input = master.try_clone().map_err(|e| PtyError::Attach {
            what: "dup the master",
            source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        let terminal_in = saved.is_some();
        // Blocking threads: the launcher's stdin must not be made
        // non-blocking (that flag is shared with the launcher's shell).
        // The input thread is left blocked in read when the run ends; the
        // process exits soon after.
        std::thread::spawn(move || relay_input(input, terminal_in));
        let output_master = master.try_clone().map_err(|e| PtyError::Attach {
            what: "dup the master",
            source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        let output = std::thread::spawn(move || relay_output(output_master));
        let winch =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()) {
                Ok(mut stream) => Some(tokio::spawn(async move {
                    while stream.recv().await.is_some() {
                        copy_window_size(std::io::stdin().as_fd(), master.as_fd());
                    }
                })),
                Err(_) => None,
            };
        Ok(Self {
            saved,
            output,
            winch,
        })
    }

    /// Waits (bounded) until the agent's last output is copied, then gives
    /// the launcher its terminal back as it was.
    pub fn finish(self, timeout: Duration) {
        if let Some(winch) = self.winch {
            winch.abort();
        }
        let deadline = std::time::Instant::now() + timeout;
        while !self.output.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::io::stdout().flush();
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, saved);
        }
    }
}

fn relay_input(master: OwnedFd, terminal_in: bool) {
    let mut master = std::fs::File::from(master);
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 4096];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => {
                // A pipe ended: the pty's end-of-file character.
                if !terminal_in {
                    let _ = master.write_all(&[4]);
                }
                return;
            }
            Ok(n) => {
                if master.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn relay_output(master: OwnedFd) {
    let mut master = std::fs::File::from(master);
    let mut stdout = std::io::stdout();
    let mut buf = [0u8; 16384];
    loop {
        match master.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: every slave descriptor is closed; the agent is gone.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
