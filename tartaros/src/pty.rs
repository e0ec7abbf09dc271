//! The agent's own pseudo-terminal, relayed by the supervisor.
//!
//! When stdin and stdout are a terminal (or on `--tty`) the sandbox init
//! opens a pty in its own mount namespace, after the mount plan, so the pty
//! comes from the sandbox's devpts when it has a private /dev (and from the
//! host's otherwise). It sends the master to the supervisor over a socket
//! pair (fd [`PTY_FD`], SCM_RIGHTS) and makes the slave the agent's
//! controlling terminal and stdio; the launcher's terminal is put in raw
//! mode and bytes are copied both ways. So job control (Ctrl-Z, `fg`,
//! `bg`), Ctrl-C and window size act on the agent's pty only, and the agent
//! holds no descriptor of the launcher's terminal (TIOCSTI is refused by
//! seccomp as well).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::termios::{self, SetArg, Termios};

/// The fd number on which the init finds the pty's slave side.
pub const PTY_FD: RawFd = 6;

#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("failed to open a pseudo-terminal for the agent: {0}; run with --no-tty")]
    Open(nix::Error),
    #[error("failed to pass the agent's pseudo-terminal to the supervisor: {0}; run with --no-tty")]
    Pass(nix::Error),
    #[error(
        "failed to start a thread relaying the agent's terminal: {0}{hint}",
        hint = crate::process_limit::thread_hint(.0)
    )]
    Thread(std::io::Error),
    #[error("failed to make the pseudo-terminal the agent's terminal ({what}): {source}")]
    Attach {
        what: &'static str,
        source: nix::Error,
    },
}

/// The supervisor's end of the socket pair on which the init sends the
/// master, and the end the init inherits on [`PTY_FD`].
pub struct Channel {
    pub ours: OwnedFd,
    pub theirs: OwnedFd,
}

pub fn channel() -> Result<Channel, PtyError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(PtyError::Pass)?;
    Ok(Channel { ours, theirs })
}

/// In the init, after the mounts: opens a pty (from whatever devpts
/// /dev/ptmx now names), gives the slave to `owner`, sends the master to the
/// supervisor on [`PTY_FD`], and leaves the slave on [`PTY_FD`] for
/// [`attach_in_agent`].
pub fn open_in_sandbox(owner: crate::credentials::Identity) -> Result<(), PtyError> {
    use nix::fcntl::OFlag;
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .map_err(PtyError::Open)?;
    nix::pty::grantpt(&master).map_err(PtyError::Open)?;
    nix::pty::unlockpt(&master).map_err(PtyError::Open)?;
    let name = nix::pty::ptsname_r(&master).map_err(PtyError::Open)?;
    let slave = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(PtyError::Open)?;
    // As login does: the terminal belongs to the user at it.
    let _ = nix::unistd::fchown(
        slave,
        Some(nix::unistd::Uid::from_raw(owner.uid)),
        Some(nix::unistd::Gid::from_raw(owner.gid)),
    );
    let _ = nix::sys::stat::fchmod(slave, nix::sys::stat::Mode::from_bits_truncate(0o620));
    let fds = [master.as_raw_fd()];
    let sent = sendmsg::<()>(
        PTY_FD,
        &[std::io::IoSlice::new(b"m")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    );
    drop(master);
    if let Err(e) = sent {
        let _ = nix::unistd::close(slave);
        return Err(PtyError::Pass(e));
    }
    // SAFETY: dup2 onto PTY_FD (the socket, no longer needed) and closing
    // the original slave number touch only descriptors this init owns.
    let moved = unsafe { libc::dup2(slave, PTY_FD) };
    let _ = nix::unistd::close(slave);
    if moved < 0 {
        return Err(PtyError::Pass(nix::errno::Errno::last()));
    }
    set_cloexec(PTY_FD);
    Ok(())
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: F_SETFD only changes the flags of a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// In the supervisor: the master the init sent, sized like the launcher's
/// terminal; `None` when the init ended before sending one.
pub fn receive_master(ours: &OwnedFd) -> Result<Option<OwnedFd>, PtyError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::FromRawFd;
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(PtyError::Pass)?,
        }
    };
    for cmsg in msg.cmsgs().map_err(PtyError::Pass)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(&fd) = fds.first()
        {
            // SAFETY: the kernel installed this descriptor for us alone.
            let master = unsafe { OwnedFd::from_raw_fd(fd) };
            copy_window_size(std::io::stdin().as_fd(), master.as_fd());
            return Ok(Some(master));
        }
    }
    Ok(None)
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
    output: Output,
    winch: Option<tokio::task::JoinHandle<()>>,
}

/// Who copies the agent's output: a thread of ours, or (through the
/// service) the caller's own helper process, whose socket reaches end of
/// file when it is done (pty_helper.rs).
enum Output {
    Thread(std::thread::JoinHandle<()>),
    Helper(OwnedFd),
}

impl Output {
    fn is_finished(&self) -> bool {
        match self {
            Self::Thread(thread) => thread.is_finished(),
            Self::Helper(done) => crate::pty_helper::finished(done),
        }
    }
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
        let dup = |master: &OwnedFd| {
            master.try_clone().map_err(|e| PtyError::Attach {
                what: "dup the master",
                source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })
        };
        let terminal_in = saved.is_some();
        let output = match crate::pty_helper::hand_over(&master) {
            Some(done) => Output::Helper(done),
            None => {
                // Blocking threads: the launcher's stdin must not be made
                // non-blocking (that flag is shared with the launcher's
                // shell). The input thread is left blocked in read when
                // the run ends; the process exits soon after. A service
                // run without its helper copies with the caller's
                // identity, never root's (`caller::become_for_good`).
                let input = dup(&master)?;
                // A thread that cannot start (the process limit) fails the
                // start, with the launcher's terminal given back.
                let restore = |e| {
                    if let Some(saved) = &saved {
                        let _ = termios::tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, saved);
                    }
                    PtyError::Thread(e)
                };
                std::thread::Builder::new()
                    .spawn(move || {
                        if crate::caller::become_for_good() {
                            relay_input(input, terminal_in);
                        }
                    })
                    .map_err(restore)?;
                let output_master = dup(&master)?;
                Output::Thread(
                    std::thread::Builder::new()
                        .spawn(move || {
                            if crate::caller::become_for_good() {
                                relay_output(output_master);
                            }
                        })
                        .map_err(restore)?,
                )
            }
        };
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
    pub fn finish(mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while !self.output.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::io::stdout().flush();
        self.restore();
    }

    fn restore(&mut self) {
        if let Some(winch) = self.winch.take() {
            winch.abort();
        }
        if let Some(saved) = self.saved.take() {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &saved);
        }
    }
}

impl Drop for Relay {
    /// Every way out of a run gives the terminal back (not only `finish`).
    fn drop(&mut self) {
        self.restore();
    }
}

pub(crate) fn relay_input(master: OwnedFd, terminal_in: bool) {
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

pub(crate) fn relay_output(master: OwnedFd) {
    let mut master = std::fs::File::from(master);
    // Straight to fd 1, unbuffered: nothing of the agent's may be left in
    // a buffer that another (root) thread flushes.
    // SAFETY: fd 1 stays open for the whole run; ManuallyDrop never
    // closes it.
    let mut stdout = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(1)
    });
    let mut buf = [0u8; 16384];
    loop {
        match master.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: every slave descriptor is closed; the agent is gone.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stdout.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
