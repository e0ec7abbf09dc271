//! One service worker per connection: a fresh, single-threaded exec of our
//! binary (so it may fork the janitor and run Rust code after fork), with
//! the connection on fd 3.
//!
//! Stages: who is calling (the kernel's peer credentials, never the
//! request's word); the request, bounded in size and time, with the
//! caller's stdin, stdout and stderr; the caller's working directory,
//! entered with the caller's file access; a relay process for the
//! launcher's signals; then the ordinary `tartaros run` path, with the
//! caller as the agent's identity and [`as_caller`] around everything
//! created on the caller's behalf. The exit status goes back last.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

use super::frame::{self, MAX_FRAME, Message, Request};
use super::pending::Started;
use crate::caller::{Caller, as_caller};
use crate::exit::{self, Refusal};

/// How long a client may take to send its whole request, from the
/// worker's start: an absolute deadline, not one per read, so that a
/// request trickled in a byte at a time is cut off too.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Past the deadline by this much, a worker still without its request
/// ends by SIGALRM: a stall the deadline did not foresee must not keep a
/// root process (and a pending slot of the caller's) for ever.
const REQUEST_BACKSTOP: Duration = Duration::from_secs(5);

/// Runs the worker; never returns.
pub fn main() -> ! {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    // SAFETY: alarm takes a plain integer; SIGALRM's default action ends
    // the process, and `serve` cancels it once the request is in.
    unsafe { libc::alarm((REQUEST_TIMEOUT + REQUEST_BACKSTOP).as_secs() as libc::c_uint) };
    let started = Started::from_env();
    // SAFETY: the service placed the connection on fd 3 for us alone.
    let conn = unsafe { UnixStream::from_raw_fd(3) };
    set_cloexec(3);
    // The service's eBPF maps: this run registers in them instead of
    // loading its own programs. Without them it loads its own.
    if let Err(e) = crate::ebpf::shared::adopt_from_env() {
        eprintln!("tartaros: service worker: warning: {e}; loading the eBPF programs for this run");
    }
    let code = match serve(&conn, deadline, started) {
        Ok(code) => {
            let _ = send(&conn, &Message::Exit(code));
            code
        }
        Err(refusal) => {
            let _ = send(
                &conn,
                &Message::Refused {
                    code: refusal.code,
                    message: refusal.message.clone(),
                },
            );
            refusal.code
        }
    };
    std::process::exit(code)
}

fn refuse(message: impl std::fmt::Display) -> Refusal {
    Refusal::new(exit::REFUSED, message)
}

fn serve(conn: &UnixStream, deadline: Instant, started: Started) -> Result<i32, Refusal> {
    let caller = peer(conn)?;
    let (request, stdio) = receive(conn, deadline)?;
    conn.set_read_timeout(None)
        .map_err(|e| refuse(format!("failed to clear a timeout: {e}")))?;
    // SAFETY: alarm(0) only cancels the backstop set in `main`.
    unsafe { libc::alarm(0) };
    // No longer pending: the request is in.
    started.report();
    if request.version != frame::VERSION {
        return Err(refuse(format!(
            "the service speaks version {} and this tartaros {}; use the same version of both",
            frame::VERSION,
            request.version
        )));
    }
    crate::caller::set(caller);
    as_caller(|| std::env::set_current_dir(&request.cwd)).map_err(|e| {
        refuse(format!(
            "failed to enter the working directory {:?}: {e}",
            request.cwd
        ))
    })?;
    start_signal_relay(conn)?;
    let mut stdio = stdio;
    let status = if stdio.len() == 4 { stdio.pop() } else { None };
    for (fd, target) in stdio.iter().zip(0..) {
        // SAFETY: dup2 onto the standard descriptors, which we own.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(refuse("failed to take the caller's stdio"));
        }
    }
    drop(stdio);
    // The request's environment is the launcher's, as for a direct run:
    // the agent's whole, and this root process's but for what makes glibc
    // open or load files it names (`caller::UNSAFE_FOR_ROOT`).
    for (key, _) in std::env::vars_os() {
        // SAFETY: single-threaded here (the relay is a process).
        unsafe { std::env::remove_var(key) };
    }
    let env: Vec<(String, String)> = request
        .env
        .iter()
        .filter(|(key, value)| {
            !key.is_empty() && !key.contains('=') && !key.contains('\0') && !value.contains('\0')
        })
        .cloned()
        .collect();
    for (key, value) in &env {
        if !crate::caller::UNSAFE_FOR_ROOT.contains(&key.as_str()) {
            // SAFETY: single-threaded here.
            unsafe { std::env::set_var(key, value) };
        }
    }
    crate::caller::set_environment(env);
    // While single-threaded, with the caller's stdio in place: the process
    // that will copy a pty's bytes to and from it as the caller.
    if wants_pty(&request.args) {
        crate::pty_helper::start().map_err(refuse)?;
    }
    let mut args: Vec<std::ffi::OsString> = vec!["tartaros".into(), "run".into()];
    args.extend(
        status_fd_renumbered(&request.args, status)?
            .into_iter()
            .map(Into::into),
    );
    Ok(crate::cli::main(args))
}

/// Whether the run may give the agent a pty (stdin and stdout terminals,
/// or `--tty`), so that it needs the pty helper; a run that does without
/// one copies on threads that take the caller's identity.
fn wants_pty(args: &[String]) -> bool {
    let flags = args.iter().take_while(|a| *a != "--");
    if flags.clone().any(|a| a == "--no-tty") {
        return false;
    }
    // SAFETY: isatty only inspects the descriptors.
    let terminals = unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 };
    terminals || flags.clone().any(|a| a == "--tty")
}

/// The client's `--status-fd N` names its own descriptor: the one it sent
/// is kept here (as a number this process does not otherwise use) and the
/// argument rewritten to it. Without a descriptor, the flag is refused.
fn status_fd_renumbered(args: &[String], status: Option<OwnedFd>) -> Result<Vec<String>, Refusal> {
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    let mut status = status;
    let take = |status: &mut Option<OwnedFd>| -> Result<String, Refusal> {
        let fd = status
            .take()
            .ok_or_else(|| refuse("--status-fd names a descriptor the client did not send"))?;
        // Before the pipe hides it: the caller's file must not be one the
        // agent writes as well.
        crate::status::check_own_file(fd.as_raw_fd()).map_err(refuse)?;
        // And what it is, for the check against the writable roots once
        // the policy is known (cli.rs).
        crate::status_guard::remember_caller_status(fd.as_raw_fd());
        let fd = status_through_caller(fd)?;
        // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we then own; the
        // status channel takes it over for the whole run.
        let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
        if new < 0 {
            return Err(refuse("failed to keep the --status-fd descriptor"));
        }
        Ok(new.to_string())
    };
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(iter.cloned());
            break;
        }
        if arg == "--status-fd" {
            out.push(arg.clone());
            iter.next();
            out.push(take(&mut status)?);
        } else if arg.starts_with("--status-fd=") {
            out.push(format!("--status-fd={}", take(&mut status)?));
        } else {
            out.push(arg.clone());
        }
    }
    Ok(out)
}

/// The caller's `--status-fd` descriptor behind a pipe: a process with the
/// caller's whole identity (`caller::become_for_good`) copies the lines to
/// it, so root never writes to a descriptor of the caller's (a socket
/// there got root's credentials). Returns the pipe's write end. Forked
/// while single-threaded; it ends at the pipe's end of file, when the
/// worker (and the janitor it forks) are gone.
fn status_through_caller(fd: OwnedFd) -> Result<OwnedFd, Refusal> {
    let worker = nix::unistd::getpid();
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| refuse(format!("failed to make the --status-fd pipe: {e}")))?;
    // SAFETY: single-threaded here; the child runs only the copy below.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(refuse(format!(
            "failed to start the --status-fd relay: {e}"
        ))),
        Ok(nix::unistd::ForkResult::Parent { .. }) => Ok(write),
        Ok(nix::unistd::ForkResult::Child) => {
            drop(write);
            crate::pty_helper::close_all_but(&[read.as_raw_fd(), fd.as_raw_fd()]);
            if crate::caller::become_for_good() {
                drain_after_worker(worker);
                let mut from = std::fs::File::from(read);
                let mut to = std::fs::File::from(fd);
                let mut buf = [0u8; 4096];
                loop {
                    // The worker's death interrupts a read (SIGUSR1): the
                    // lines still in the pipe are read all the same.
                    let n = match std::io::Read::read(&mut from, &mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
            // SAFETY: leave without the worker's state.
            unsafe { libc::_exit(0) }
        }
    }
}

/// How long the status relay may still write once the worker is gone.
const STATUS_DRAIN: libc::c_uint = 5;

/// Bounds the status relay's life by the worker's: a write may block
/// while the worker runs (as the worker's own write used to), but once it
/// is gone the relay has [`STATUS_DRAIN`] seconds left, then SIGALRM ends
/// it. A caller whose status pipe is full and never read, its read end
/// held open, would otherwise keep one blocked process per run for ever.
/// Set after the identity change, which clears the parent-death signal.
fn drain_after_worker(worker: nix::unistd::Pid) {
    extern "C" fn worker_gone(_: libc::c_int) {
        // SAFETY: alarm is async-signal-safe and takes a plain integer.
        unsafe { libc::alarm(STATUS_DRAIN) };
    }
    // SAFETY: a zeroed sigaction with a handler that only calls alarm; no
    // SA_RESTART, so a blocked write returns to be retried, then the alarm
    // ends the process.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = worker_gone as *const () as libc::sighandler_t;
        libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1);
    }
    if nix::unistd::getppid() != worker {
        worker_gone(libc::SIGUSR1);
    }
}

/// The caller, from the kernel: `SO_PEERCRED` and `SO_PEERGROUPS` as of the
/// moment it connected.
fn peer(conn: &UnixStream) -> Result<Caller, Refusal> {
    let fd = conn.as_raw_fd();
    // SAFETY: ucred is plain data; getsockopt fills at most its size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, buffer and length.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(refuse("failed to read the caller's credentials"));
    }
    let facts = super::sandboxed::facts_of(conn, cred.pid)
        .ok_or_else(|| refuse("the caller exited before it could be checked"))?;
    if let Some(why) = super::sandboxed::refusal(&facts) {
        return Err(refuse(why));
    }
    // Its limits, umask, nice value and CPUs, for the agent to take on.
    crate::caller::set_attributes(facts.attributes.map_err(refuse)?);
    let mut groups = vec![0 as libc::gid_t; crate::caller::MAX_GROUPS];
    let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: a valid socket, buffer and length.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(refuse(
            "failed to read the caller's groups (more than 256?)",
        ));
    }
    groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    Ok(Caller {
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

/// The refusal of a request that did not arrive whole by the deadline.
fn too_slow() -> Refusal {
    refuse(format!(
        "the request did not arrive within {} seconds; send it whole at once",
        REQUEST_TIMEOUT.as_secs()
    ))
}

/// Bounds the next read on `conn` by what is left until `deadline`: a
/// read waits at most that long, so the reads of one request together do.
fn bound_read(conn: &UnixStream, deadline: Instant) -> Result<(), Refusal> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(too_slow());
    }
    conn.set_read_timeout(Some(left))
        .map_err(|e| refuse(format!("failed to set a timeout: {e}")))
}

/// The request frame and the three descriptors sent with its first bytes,
/// all by `deadline`.
fn receive(conn: &UnixStream, deadline: Instant) -> Result<(Request, Vec<OwnedFd>), Refusal> {
    let bad = |what: &str| refuse(format!("a malformed request: {what}"));
    // One recvmsg for the head: the kernel counts its timeout down over
    // the waits of a MSG_WAITALL read.
    bound_read(conn, deadline)?;
    let mut head = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let (got, truncated) = {
        let mut iov = [std::io::IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_WAITALL,
        )
        .map_err(|e| match e {
            nix::errno::Errno::EAGAIN => too_slow(),
            e => refuse(format!("failed to read the request: {e}")),
        })?;
        let cmsgs = msg
            .cmsgs()
            .map_err(|e| refuse(format!("failed to read the request: {e}")))?;
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel installed these descriptors for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC))
    };
    if got != 4 {
        return Err(if Instant::now() >= deadline {
            too_slow()
        } else {
            bad("it ended early")
        });
    }
    if truncated || !(3..=4).contains(&fds.len()) {
        return Err(bad(
            "stdin, stdout and stderr (and the --status-fd) must come with it",
        ));
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(bad("it is too large"));
    }
    let mut body = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        bound_read(conn, deadline)?;
        match std::io::Read::read(&mut &*conn, &mut body[filled..]) {
            Ok(0) => return Err(bad("it ended early")),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(too_slow());
            }
            Err(e) => return Err(refuse(format!("failed to read the request: {e}"))),
        }
    }
    let request: Request = serde_json::from_slice(&body).map_err(|e| bad(&format!("{e}")))?;
    Ok((request, fds))
}

/// A small process that turns the launcher's forwarded signals into
/// signals to this worker (whose supervisor forwards them to the agent),
/// and the launcher's death into ours: a killed `tartaros run` ends its
/// sandbox. Forked while single-threaded; dies with the worker.
fn start_signal_relay(conn: &UnixStream) -> Result<(), Refusal> {
    let worker = nix::unistd::getpid();
    // SAFETY: single-threaded here; the child runs only the loop below.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(refuse(format!("failed to start the signal relay: {e}"))),
        Ok(nix::unistd::ForkResult::Parent { .. }) => Ok(()),
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: PR_SET_PDEATHSIG takes plain integers.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if nix::unistd::getppid() != worker {
                // SAFETY: leave without the parent's state.
                unsafe { libc::_exit(0) };
            }
            let mut reader = conn;
            loop {
                match frame::read::<Message>(&mut reader) {
                    Ok(Message::Signal(sig)) => {
                        if let Ok(sig) = nix::sys::signal::Signal::try_from(sig)
                            && matches!(
                                sig,
                                nix::sys::signal::Signal::SIGINT
                                    | nix::sys::signal::Signal::SIGTERM
                                    | nix::sys::signal::Signal::SIGHUP
                                    | nix::sys::signal::Signal::SIGQUIT
                            )
                        {
                            let _ = nix::sys::signal::kill(worker, sig);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        // The launcher is gone: so is the run.
                        let _ = nix::sys::signal::kill(worker, nix::sys::signal::Signal::SIGKILL);
                        // SAFETY: leave without the parent's state.
                        unsafe { libc::_exit(0) };
                    }
                }
            }
        }
    }
}

fn send(conn: &UnixStream, message: &Message) -> std::io::Result<()> {
    let bytes = frame::encode(message).map_err(std::io::Error::other)?;
    (&mut &*conn).write_all(&bytes)
}

fn set_cloexec(fd: i32) {
    // SAFETY: F_SETFD on a descriptor we own only changes its flags.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}
