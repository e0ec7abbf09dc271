//! Whether a caller is itself a sandboxed agent. The service must not be
//! the way out of a sandbox: an agent whose run could not hide the socket
//! for good (the user-namespace path hides the sockets listening at its
//! start by a bind over each; a service started or restarted later is a
//! new, visible socket) would otherwise ask for a fresh run with any
//! policy its user may have, `--write $HOME` included.
//!
//! Decided from the kernel: the caller's process (its pidfd, checked alive
//! after the reads, so a recycled pid cannot answer for it) is refused
//! when it is in another user namespace than the service's or in a
//! TartarOS run's cgroup.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the peer as of its connect.
const SO_PEERPIDFD: libc::c_int = 77;

/// What the caller's process is, as far as the decision goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `/proc/<pid>/ns/user` of the caller and of the service.
    pub user_ns: Option<String>,
    pub own_user_ns: Option<String>,
    /// `/proc/<pid>/cgroup`.
    pub cgroup: Option<String>,
    /// Its resource limits, umask, nice value and CPUs (caller_attrs.rs),
    /// or why they could not be read.
    pub attributes: Result<crate::caller_attrs::Attributes, String>,
}

/// Why the caller is refused, if it is: pure, over the facts.
pub fn refusal(facts: &Facts) -> Option<&'static str> {
    match (&facts.user_ns, &facts.own_user_ns) {
        (Some(theirs), Some(ours)) if theirs != ours => {
            return Some(
                "the caller runs in another user namespace (inside a sandbox?); the service serves only callers on the host: run tartaros outside the sandbox",
            );
        }
        (None, _) | (_, None) => {
            return Some("failed to read the caller's user namespace; try again");
        }
        _ => {}
    }
    let cgroup = facts.cgroup.as_deref()?;
    let in_run = cgroup.lines().any(|line| {
        line.rsplit(':')
            .next()
            .is_some_and(|path| path.split('/').any(|part| part.starts_with("tartaros-")))
    });
    in_run.then_some(
        "the caller runs inside a TartarOS sandbox; the service serves only callers on the host: run tartaros outside the sandbox",
    )
}

/// The facts of the peer of `conn` (pid `pid` per `SO_PEERCRED`), or
/// `None` when its process is gone (or its pid was reused meanwhile).
pub fn facts_of(conn: &UnixStream, pid: i32) -> Option<Facts> {
    if pid <= 0 {
        return None;
    }
    // Without SO_PEERPIDFD (before Linux 6.5), a pidfd opened now: the
    // reads then hold the process that had the pid when it was opened.
    let pidfd = peer_pidfd(conn).or_else(|| pidfd_open(pid));
    let read = |what: &str| -> Option<String> {
        std::fs::read_link(format!("/proc/{pid}/{what}"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    };
    let facts = Facts {
        user_ns: read("ns/user"),
        own_user_ns: std::fs::read_link("/proc/self/ns/user")
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
        cgroup: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok(),
        attributes: crate::caller_attrs::read(pid).map_err(|e| e.to_string()),
    };
    // Read while the caller lived: the pid named it, not a newer process.
    match pidfd {
        Some(fd) => alive(&fd).then_some(facts),
        None => Some(facts),
    }
}

fn peer_pidfd(conn: &UnixStream) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket; the kernel writes one int into `fd`.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success `fd` is a new descriptor that nothing else owns.
    (rc == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes no pointers; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: on success `fd` is a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(ns: &str, cgroup: &str) -> Facts {
        Facts {
            user_ns: Some(ns.into()),
            own_user_ns: Some("user:[4026531837]".into()),
            cgroup: Some(cgroup.into()),
            attributes: Err("not read".into()),
        }
    }

    #[test]
    fn sandboxed_callers_are_refused_and_host_callers_are_not() {
        let host = facts(
            "user:[4026531837]",
            "0::/user.slice/user-1000.slice/session-2.scope\n",
        );
        assert_eq!(refusal(&host), None);
        let userns = facts("user:[4026532999]", "0::/user.slice\n");
        assert!(refusal(&userns).unwrap().contains("another user namespace"));
        let run = facts("user:[4026531837]", "0::/process_api/tartaros-4242/agent\n");
        assert!(refusal(&run).unwrap().contains("inside a TartarOS sandbox"));
        let v1 = facts(
            "user:[4026531837]",
            "12:pids:/tartaros-77\n0::/user.slice\n",
        );
        assert!(refusal(&v1).is_some());
        let unknown = Facts {
            user_ns: None,
            ..host
        };
        assert!(refusal(&unknown).is_some(), "fails closed");
    }
}
