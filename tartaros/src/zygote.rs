//! The init's template: a process forked by the CLI while it is still
//! single-threaded (as the janitor is) that, asked once, clones the sandbox
//! init as the supervisor's own child (`CLONE_PARENT`) straight into the
//! run's cgroup and namespaces, and runs the init's code there directly.
//!
//! Without it the supervisor, multithreaded by then, can only clone a child
//! that execs our binary again (`spawn::spawn_init`): loading and
//! relocating the 9 MB binary and starting its runtime cost ~1.1 ms of CPU
//! on every run's critical path (the 2-core VM, `perf stat` of the bare
//! exec). The exec path stays as the fallback when there is no template.
//!
//! The template keeps nothing but its socket: it closes every other
//! descriptor at once, so neither it nor the init it makes holds a map, a
//! connection or a terminal the supervisor had or gets later. The init gets
//! exactly the descriptors the request carries, on the numbers the exec
//! path gives them.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use nix::unistd::{ForkResult, Pid};

use crate::spawn::{GATEWAY_FD, InitFds, InitProcess, Namespaces, PLAN_FD, REPORT_FD};

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error(
        "failed to start the init's template process: {0}{hint}",
        hint = crate::process_limit::hint(*.0)
    )]
    Fork(nix::Error),
    #[error("failed to ask the init's template process for the init: {0}")]
    Request(nix::Error),
    #[error(
        "failed to start the sandbox init (clone3): {0}; {hint}",
        hint = crate::process_limit::clone_hint(*.0)
    )]
    Clone(nix::Error),
}

/// Where the template keeps its socket (everything else is closed).
const SOCKET_FD: RawFd = 3;
/// Request bits: which namespaces, and which optional descriptors follow
/// the six fixed ones (stdin, stdout, stderr, plan, report, gateway).
const NET: u64 = 1;
const USER: u64 = 2;
const CGROUP: u64 = 4;
const GATE: u64 = 8;
const PTY: u64 = 16;
const FIXED_FDS: usize = 6;
const MAX_FDS: usize = FIXED_FDS + 3;

/// The supervisor's end: one request, then it is used up.
pub struct Zygote {
    sock: Option<OwnedFd>,
    pid: Pid,
}

impl Zygote {
    /// Forks the template. Must be called while the process has a single
    /// thread (before the tokio runtime starts): the child runs Rust code.
    pub fn fork() -> Result<Self, ZygoteError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(ZygoteError::Fork)?;
        let supervisor = nix::unistd::getpid();
        // SAFETY: the process is single-threaded here (the caller's contract).
        match unsafe { nix::unistd::fork() }.map_err(ZygoteError::Fork)? {
            ForkResult::Child => {
                drop(ours);
                serve(theirs, supervisor)
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                Ok(Self {
                    sock: Some(ours),
                    pid: child,
                })
            }
        }
    }

    /// Has the init cloned, as `spawn::spawn_init` would start it, and
    /// returns it. [`ZygoteError::Request`]: the template is gone (the
    /// caller may exec instead); [`ZygoteError::Clone`]: the kernel refused.
    pub fn spawn(
        mut self,
        cgroup_fd: Option<RawFd>,
        namespaces: Namespaces,
        fds: InitFds<'_>,
    ) -> Result<InitProcess, ZygoteError> {
        let sock = self
            .sock
            .take()
            .ok_or(ZygoteError::Request(nix::errno::Errno::EBADF))?;
        let mut bits = 0;
        let mut sent: Vec<RawFd> = vec![
            0,
            1,
            2,
            fds.plan.as_raw_fd(),
            fds.report.as_raw_fd(),
            fds.gateway.as_raw_fd(),
        ];
        for (bit, fd) in [
            (CGROUP, cgroup_fd),
            (GATE, fds.gate.map(|g| g.as_raw_fd())),
            (PTY, fds.pty.map(|p| p.as_raw_fd())),
        ] {
            if let Some(fd) = fd {
                bits |= bit;
                sent.push(fd);
            }
        }
        if namespaces.network {
            bits |= NET;
        }
        if namespaces.user {
            bits |= USER;
        }
        let request = bits.to_le_bytes();
        sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&request)],
            &[ControlMessage::ScmRights(&sent)],
            MsgFlags::empty(),
            None,
        )
        .map_err(ZygoteError::Request)?;
        let mut reply = [0u8; 8];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut reply)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(ZygoteError::Request)?;
        let mut pidfd = None;
        for cmsg in msg.cmsgs().map_err(ZygoteError::Request)? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                for fd in received {
                    // SAFETY: a descriptor the kernel just gave us.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    pidfd.get_or_insert(owned);
                }
            }
        }
        if msg.bytes != reply.len() {
            return Err(ZygoteError::Request(nix::errno::Errno::EPIPE));
        }
        let pid = i64::from_le_bytes(reply);
        match (pid, pidfd) {
            (pid, Some(pidfd)) if pid > 0 => Ok(InitProcess {
                pid: pid as i32,
                pidfd,
            }),
            (pid, _) if pid < 0 => Err(ZygoteError::Clone(nix::errno::Errno::from_raw(
                i32::try_from(-pid).unwrap_or(libc::EINVAL),
            ))),
            _ => Err(ZygoteError::Request(nix::errno::Errno::EPROTO)),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // The template exits once it has answered, or at EOF: reap it.
        drop(self.sock.take());
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// The template: waits for one request, clones the init, answers, exits.
fn serve(sock: OwnedFd, supervisor: Pid) -> ! {
    // SAFETY: prctl takes plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if nix::unistd::getppid() != supervisor {
        // SAFETY: leave without running the parent's atexit state.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: descriptor calls only; the socket ends up on SOCKET_FD and
    // every other descriptor, stdio included, is closed.
    unsafe {
        if sock.as_raw_fd() != SOCKET_FD && libc::dup2(sock.as_raw_fd(), SOCKET_FD) < 0 {
            libc::_exit(0);
        }
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
        for fd in 0..SOCKET_FD {
            libc::close(fd);
        }
    }
    std::mem::forget(sock);
    // The init's network, IPC and UTS namespaces, made now, on whichever
    // CPU is free, while the supervisor decides the run: their creation
    // (a network namespace's loopback and per-namespace sysctls, the IPC
    // namespace's mqueue mount) was ~0.7 ms of the init's clone3 on every
    // run's critical path. Only root may; otherwise the clone makes them,
    // as before. The mount namespace stays the clone's: it copies the
    // host's mounts as they are then, after the supervisor made its own.
    use nix::sched::CloneFlags;
    let premade = nix::sched::unshare(
        CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS,
    )
    .is_ok();
    if !crate::proc_title::retitle(b"tartaros-init\0") {
        // Unscrubbed, the init would show them: no template, so the
        // supervisor's request fails and it execs the init instead.
        // SAFETY: leave without running the parent's atexit state.
        unsafe { libc::_exit(0) };
    }
    let mut request = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut request)];
    let mut received = Vec::with_capacity(MAX_FDS);
    let bytes = match recvmsg::<()>(SOCKET_FD, &mut iov, Some(&mut space), MsgFlags::empty()) {
        Ok(msg) => {
            for cmsg in msg.cmsgs().into_iter().flatten() {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    received.extend(fds);
                }
            }
            msg.bytes
        }
        Err(_) => 0,
    };
    let bits = u64::from_le_bytes(request);
    let optional = [CGROUP, GATE, PTY]
        .iter()
        .filter(|b| bits & **b != 0)
        .count();
    if bytes != request.len() || received.len() != FIXED_FDS + optional {
        // EOF (the run never started) or a request we did not send.
        // SAFETY: leave without running the parent's atexit state.
        unsafe { libc::_exit(0) };
    }
    let mut optional = received[FIXED_FDS..].iter().copied();
    let mut next_if = |bit: u64| (bits & bit != 0).then(|| optional.next()).flatten();
    let cgroup = next_if(CGROUP);
    let gate = next_if(GATE);
    let pty = next_if(PTY);
    let namespaces = fresh_namespaces(bits, premade);
    let mut pidfd: RawFd = -1;
    // SAFETY: this process is single-threaded, so the child may run Rust
    // code; CLONE_PARENT makes it the supervisor's child, as the exec path's
    // init is.
    let rc = unsafe {
        crate::spawn::clone_init(cgroup, namespaces, libc::CLONE_PARENT as u64, &mut pidfd)
    };
    if rc == 0 {
        become_init(&received[..FIXED_FDS], gate, pty);
    }
    let reply = if rc < 0 {
        -i64::from(nix::errno::Errno::last_raw())
    } else {
        rc
    };
    let passed = [pidfd];
    let rights = [ControlMessage::ScmRights(&passed)];
    let cmsgs: &[ControlMessage] = if rc > 0 { &rights } else { &[] };
    let _ = sendmsg::<()>(
        SOCKET_FD,
        &[IoSlice::new(&reply.to_le_bytes())],
        cmsgs,
        MsgFlags::empty(),
        None,
    );
    // SAFETY: leave without running the parent's atexit state.
    unsafe { libc::_exit(0) }
}

/// The namespaces the init's clone must make, given the request's bits
/// and whether this process made fresh network, IPC and UTS namespaces of
/// its own, which the init then inherits. A run in a user namespace gets
/// namespaces that its new user namespace owns (root inside configures
/// loopback and the IPC limits), so ours are not used for it.
fn fresh_namespaces(bits: u64, premade: bool) -> Namespaces {
    let user = bits & USER != 0;
    Namespaces {
        network: bits & NET != 0,
        user,
        premade: premade && !user,
    }
}

/// The init's first steps, those the exec path's child takes before its
/// exec: the start gate (user namespace), its descriptors in place and
/// nothing else open, death with the supervisor, a session of its own.
fn become_init(fixed: &[RawFd], gate: Option<RawFd>, pty: Option<RawFd>) -> ! {
    let fail = || -> ! {
        // SAFETY: leave without running the parent's atexit state.
        unsafe { libc::_exit(crate::exit::START_FAILURE) }
    };
    if let Some(gate) = gate {
        let mut byte = [0u8];
        loop {
            // SAFETY: a read into a local buffer of one byte.
            let n = unsafe { libc::read(gate, byte.as_mut_ptr().cast(), 1) };
            if n == 1 {
                break;
            }
            if n == 0 || nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                fail();
            }
        }
    }
    let targets = [0, 1, 2, PLAN_FD, REPORT_FD, GATEWAY_FD];
    let mut moves: Vec<(RawFd, RawFd)> = fixed.iter().copied().zip(targets).collect();
    if let Some(pty) = pty {
        moves.push((pty, crate::pty::PTY_FD));
    }
    // SAFETY: descriptor calls only. Every source is first copied above
    // the targets, so that no dup2 replaces a source not yet placed.
    unsafe {
        let mut high = Vec::with_capacity(moves.len());
        for (source, target) in &moves {
            let copy = libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, 100);
            if copy < 0 {
                fail();
            }
            high.push((copy, *target));
        }
        for (copy, target) in &high {
            if libc::dup2(*copy, *target) < 0 {
                fail();
            }
        }
        let last = high.iter().map(|(_, t)| *t).max().unwrap_or(2);
        libc::syscall(libc::SYS_close_range, (last + 1) as u32, u32::MAX, 0u32);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 || libc::setsid() < 0 {
            fail();
        }
        // What `ps` shows for it (the exec path's init is named by its argv).
        libc::prctl(libc::PR_SET_NAME, c"tartaros-init".as_ptr(), 0, 0, 0);
    }
    // No getppid check here: in its new PID namespace the parent is 0. A
    // supervisor that died before the prctl leaves the plan pipe at EOF,
    // and the init exits on that.
    crate::init::main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_premade_namespaces_serve_only_a_run_without_a_user_namespace() {
        let ns = |bits, premade| {
            let n = fresh_namespaces(bits, premade);
            (n.network, n.user, n.premade)
        };
        assert_eq!(ns(NET, true), (true, false, true));
        assert_eq!(ns(NET, false), (true, false, false));
        assert_eq!(ns(NET | USER, true), (true, true, false));
        assert_eq!(ns(NET | USER, false), (true, true, false));
    }
}
