//! The sandbox's network namespace: loopback up, and listeners that the
//! supervisor owns but that live inside the namespace (a socket stays in the
//! namespace it was created in), so the agent reaches `127.0.0.1:<port>`
//! with no helper process inside the sandbox. The init creates them (it is
//! root in the namespace, also for an ordinary user's run in a user
//! namespace) and passes them to the supervisor over a unix socket.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("failed to bring the loopback interface up: {0}")]
    Loopback(nix::Error),
    #[error("failed to listen on {addr} inside the sandbox: {source}; choose another port")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("failed to size the buffers of the listener on {addr} inside the sandbox: {source}")]
    Buffers {
        addr: SocketAddr,
        source: nix::Error,
    },
    #[error("failed to pass the gateways' listeners from the sandbox: {0}")]
    Pass(nix::Error),
    #[error("failed to pass the gateways' listeners from the sandbox: a malformed message")]
    Malformed,
    #[error("failed to make a gateway listener non-blocking: {0}")]
    Nonblocking(std::io::Error),
}

/// Brings `lo` up in the calling thread's network namespace (a new
/// namespace starts with it down, and 127.0.0.1 only exists once it is up).
pub fn loopback_up() -> Result<(), NetworkError> {
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(NetworkError::Loopback)?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) < 0 {
            return Err(NetworkError::Loopback(nix::errno::Errno::last()));
        }
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) < 0 {
            return Err(NetworkError::Loopback(nix::errno::Errno::last()));
        }
    }
    Ok(())
}

/// One listener a gateway needs inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenSpec {
    pub addr: SocketAddr,
    /// Skipped (not an error) where it cannot be bound, e.g. `::1` on a
    /// kernel without IPv6.
    pub optional: bool,
}

/// Creates the listeners in the calling process's network namespace. The
/// sandbox init calls it: it is root in the namespace (also in a user
/// namespace, for an ordinary user), and a socket stays in the namespace it
/// was created in, so the supervisor serves them from the host side.
pub fn listen_all(specs: &[ListenSpec]) -> Result<Vec<Option<TcpListener>>, NetworkError> {
    specs
        .iter()
        .map(|spec| match TcpListener::bind(spec.addr) {
            Ok(listener) => fixed_buffers(&listener)
                .map(|()| Some(listener))
                .map_err(|source| NetworkError::Buffers {
                    addr: spec.addr,
                    source,
                }),
            Err(_) if spec.optional => Ok(None),
            Err(source) => Err(NetworkError::Bind {
                addr: spec.addr,
                source,
            }),
        })
        .collect()
}

/// Send and receive buffer of the gateways' sockets inside the sandbox
/// (the kernel doubles it for its bookkeeping). Those sockets are the
/// supervisor's, accepted outside the run's memory cgroup, and TCP memory
/// is one budget for the whole host: autotuned, each one buffered up to
/// `tcp_wmem`'s 4 MiB of what a host service streamed to an agent that
/// never read (372 MiB for 100 connections of a `--port` relay), and the
/// gateways accept hundreds. 128 KiB keeps loopback transfers fast.
pub const GATEWAY_SOCKET_BUFFER: usize = 128 << 10;

/// Fixes the buffers of a listener; the connections it accepts inherit
/// them, with autotuning off (the kernel's lock bits are copied too).
fn fixed_buffers(listener: &TcpListener) -> Result<(), nix::Error> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(listener, sockopt::SndBuf, &GATEWAY_SOCKET_BUFFER)?;
    setsockopt(listener, sockopt::RcvBuf, &GATEWAY_SOCKET_BUFFER)
}

/// Sends the listeners over `channel` (a unix seqpacket socket) in
/// messages of [`PER_MESSAGE`] specs at most: a byte per spec (1 present,
/// 0 skipped), the present ones as SCM_RIGHTS. Split because one message
/// carries a bounded number of descriptors (the receiver's control buffer,
/// the kernel's SCM_MAX_FD): two listeners a `--port`, 33 ports failed to
/// start in one message (adversarial round 22).
pub fn send_listeners(
    channel: RawFd,
    listeners: &[Option<TcpListener>],
) -> Result<(), NetworkError> {
    for chunk in listeners.chunks(PER_MESSAGE) {
        let present: Vec<u8> = chunk.iter().map(|l| u8::from(l.is_some())).collect();
        let fds: Vec<RawFd> = chunk.iter().flatten().map(AsRawFd::as_raw_fd).collect();
        let iov = [std::io::IoSlice::new(&present)];
        let rights = [ControlMessage::ScmRights(&fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        sendmsg::<()>(channel, &iov, cmsgs, MsgFlags::empty(), None).map_err(NetworkError::Pass)?;
    }
    Ok(())
}

/// Receives what [`send_listeners`] sent for `count` specs; `None` for the
/// skipped ones. Fails closed on a short or malformed message.
pub fn receive_listeners(
    channel: RawFd,
    count: usize,
) -> Result<Vec<Option<TcpListener>>, NetworkError> {
    let mut listeners = Vec::with_capacity(count);
    while listeners.len() < count {
        let expected = (count - listeners.len()).min(PER_MESSAGE);
        listeners.extend(receive_message(channel, expected)?);
    }
    for listener in listeners.iter().flatten() {
        listener
            .set_nonblocking(true)
            .map_err(NetworkError::Nonblocking)?;
    }
    Ok(listeners)
}

/// One message of [`send_listeners`], for `expected` specs.
fn receive_message(
    channel: RawFd,
    expected: usize,
) -> Result<Vec<Option<TcpListener>>, NetworkError> {
    // One byte more than expected, so a longer message shows as one.
    let mut present = vec![0u8; expected + 1];
    let mut space = nix::cmsg_space!([RawFd; PER_MESSAGE]);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let (received, truncated) = {
        let mut iov = [std::io::IoSliceMut::new(&mut present)];
        let msg = recvmsg::<()>(
            channel,
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(NetworkError::Pass)?;
        for cmsg in msg.cmsgs().map_err(NetworkError::Pass)? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel installed these descriptors for us alone.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        let flags = msg.flags;
        (
            msg.bytes,
            flags.intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC),
        )
    };
    if received != expected || truncated {
        return Err(NetworkError::Malformed);
    }
    let mut fds = fds.into_iter();
    let listeners: Vec<Option<TcpListener>> = present[..expected]
        .iter()
        .map(|p| match p {
            1 => fds
                .next()
                .map(TcpListener::from)
                .ok_or(NetworkError::Malformed)
                .map(Some),
            0 => Ok(None),
            _ => Err(NetworkError::Malformed),
        })
        .collect::<Result<_, _>>()?;
    if fds.next().is_some() {
        return Err(NetworkError::Malformed);
    }
    Ok(listeners)
}

/// At most this many listeners pass from the init to the supervisor in one
/// message (well under the kernel's SCM_MAX_FD of 253).
pub const PER_MESSAGE: usize = 32;
