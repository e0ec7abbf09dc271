//! The sandbox's network namespace: loopback up, and listeners that the
//! supervisor owns but that live inside the namespace (a socket stays in the
//! namespace it was created in), so the agent reaches `127.0.0.1:<port>`
//! with no helper process inside the sandbox.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("failed to bring the loopback interface up: {0}")]
    Loopback(nix::Error),
    #[error("failed to enter the sandbox's network namespace: {0}")]
    Enter(std::io::Error),
    #[error("failed to listen on {addr} inside the sandbox: {source}; choose another port")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("failed to run the namespace thread")]
    Thread,
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

/// Creates TCP listeners inside the network namespace of process `pid`;
/// `None` for an address that cannot be bound there when `optional`.
/// The work happens on a short-lived dedicated thread, because `setns`
/// changes the namespace of the calling thread only and the supervisor's
/// other threads must stay in the host namespace.
pub fn listen_in_namespace_of(
    pid: i32,
    addrs: &[(SocketAddr, bool)],
) -> Result<Vec<Option<TcpListener>>, NetworkError> {
    let ns_path = format!("/proc/{pid}/ns/net");
    let addrs = addrs.to_vec();
    std::thread::spawn(move || -> Result<Vec<Option<TcpListener>>, NetworkError> {
        let ns = std::fs::File::open(&ns_path).map_err(NetworkError::Enter)?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| NetworkError::Enter(std::io::Error::from_raw_os_error(e as i32)))?;
        loopback_up()?;
        addrs
            .iter()
            .map(|(addr, optional)| {
                let bound =
                    TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l));
                match bound {
                    Ok(listener) => Ok(Some(listener)),
                    Err(_) if *optional => Ok(None),
                    Err(source) => Err(NetworkError::Bind {
                        addr: *addr,
                        source,
                    }),
                }
            })
            .collect()
    })
    .join()
    .map_err(|_| NetworkError::Thread)?
}
