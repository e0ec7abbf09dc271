//! Through the service, the pty relay's copying (the caller's stdin to the
//! agent's pty, the pty to the caller's stdout) runs in a process of the
//! caller's, not in the root worker.
//!
//! Done by root, the agent's bytes reached the caller's descriptor with
//! root's credentials (a socket's `SCM_CREDENTIALS`, write-time
//! capability checks). Threads of the worker that take the caller's
//! identity fix that, but the caller may then signal them, and a stop of
//! one stops the whole root worker (with whatever shared lock it holds).
//! So the worker forks this helper while still single-threaded, with the
//! caller's stdio on 0 and 1; it takes the caller's whole identity, waits
//! for the master on a socket, copies both ways, and closes the socket
//! when the agent's output has ended. The caller may signal it: that stops
//! only its own copying.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// The worker's end of the helper's socket, until the pty relay takes it.
static HELPER: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// In the service worker, single-threaded, after the caller's stdio is on
/// 0 to 2 and the caller is set: forks the helper.
pub fn start() -> Result<(), String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("failed to make the pty helper's socket: {e}"))?;
    // SAFETY: single-threaded here; the child runs only `serve`.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(format!("failed to start the pty helper: {e}")),
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            if let Ok(mut helper) = HELPER.lock() {
                *helper = Some(ours);
            }
            Ok(())
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ours);
            close_all_but(&[0, 1, theirs.as_raw_fd()]);
            if crate::caller::become_for_good() {
                serve(theirs);
            }
            // SAFETY: leave without the worker's state.
            unsafe { libc::_exit(0) }
        }
    }
}

/// In the supervisor: hands `master` to the helper, if this run has one,
/// and returns the socket that reaches end of file once the agent's output
/// is copied.
pub fn hand_over(master: &OwnedFd) -> Option<OwnedFd> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let socket = HELPER.lock().ok()?.take()?;
    let fds = [master.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[std::io::IoSlice::new(b"m")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .ok()?;
    Some(socket)
}

/// Whether the helper behind `done` has finished copying the output.
pub fn finished(done: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: done.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready != 0
}

/// The helper: waits for the master, copies, and leaves when the output
/// has ended (the input thread is left blocked in read).
fn serve(socket: OwnedFd) {
    let Some(master) = receive(&socket) else {
        return;
    };
    let Ok(input) = master.try_clone() else {
        return;
    };
    let terminal_in = nix::sys::termios::tcgetattr(std::io::stdin()).is_ok();
    // Without a thread (the process limit) the agent still gets its
    // output copied; its input is lost, which beats a panic.
    let _ = std::thread::Builder::new().spawn(move || crate::pty::relay_input(input, terminal_in));
    crate::pty::relay_output(master);
}

fn receive(socket: &OwnedFd) -> Option<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.ok()?,
        }
    };
    msg.cmsgs().ok()?.find_map(|cmsg| match cmsg {
        // SAFETY: the kernel installed this descriptor for us alone.
        ControlMessageOwned::ScmRights(fds) => {
            fds.first().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        }
        _ => None,
    })
}

/// Closes every descriptor of this (forked) process but `keep`.
pub(crate) fn close_all_but(keep: &[RawFd]) {
    let mut keep = keep.to_vec();
    keep.sort_unstable();
    let mut from: libc::c_uint = 0;
    for fd in keep
        .into_iter()
        .filter_map(|fd| libc::c_uint::try_from(fd).ok())
    {
        if fd > from {
            // SAFETY: closes descriptors of this process only.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}
