//! Standard streams that are host files reach the sandbox through pipes.
//!
//! A launcher's `> out.txt` or `< in.txt` is a descriptor of a file on the
//! host's read-write mount, opened outside the sandbox. Handed to the agent
//! as is, it let the agent change that file's metadata outside every root:
//! `fchmod`, `fchown` to its own groups, `futimens`, `fsetxattr`,
//! `FS_IOC_SETFLAGS`, and the same by path through `/proc/self/fd/1` (the
//! magic link leads to the host's mount, where the read-only base does not
//! apply; Landlock has no right for any of them). A `dup` defeats any
//! per-descriptor filter, so the file must not reach the sandbox at all.
//!
//! [`relay_host_files`] runs first in `main`, while the process is still
//! single-threaded: when a standard stream is such a file (see
//! `is_host_file`), it forks; the child carries on as `tartaros` with a
//! pipe on that stream, and the parent, which keeps the files, copies
//! between them and the pipes, passes termination signals on, and exits
//! as the child did once the outputs are drained. Sockets are relayed too.
//! So are terminals when the run gets no pty of its own (see `relayed`).
//! Pipes are passed as before (a pipe gets an open file description of the
//! agent's own in the init, and a standard device such as /dev/null the
//! sandbox's: stdio_own.rs).

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// Why the relay could not start. Exits 125 with one line: the run
/// cannot go on without it (the stream must not reach the agent), and
/// refusing it later as a denied path (78) blamed the file for the
/// launcher's process limit (adversarial round 22).
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("failed to make a pipe to relay standard stream {fd}: {source}")]
    Pipe { fd: RawFd, source: nix::Error },
    #[error("failed to start the relay of the standard streams (fork): {0}{hint}", hint = crate::process_limit::hint(*.0))]
    Fork(nix::Error),
    #[error(
        "failed to start a thread relaying the standard streams: {source}{hint}",
        hint = crate::process_limit::thread_hint(source)
    )]
    Thread { source: std::io::Error },
}

/// Says why the relay failed and exits as a failed start.
fn fail(error: RelayError) -> ! {
    eprintln!("tartaros: {error}");
    std::process::exit(crate::exit::START_FAILURE)
}

/// How long the outputs may still drain once the child is gone: a process
/// that kept a copy of the pipe (none should) cannot hold the exit forever.
const DRAIN: Duration = Duration::from_secs(5);

/// Signals the parent passes on to the child when another process sent
/// them; one from the terminal reached the child's process group already.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// What a standard stream is, as `fstat`, `isatty` and its
/// `/proc/self/fd` link tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Directory,
    /// A regular file or a block device.
    File,
    /// A named FIFO (`> /tmp/fifo`).
    Fifo,
    /// An anonymous pipe: it lives on no mount.
    Pipe,
    /// A character device that is a terminal (stdio_tty.rs reopens it).
    Terminal,
    /// A device the sandbox's /dev has of its own (`< /dev/null`): the
    /// init replaces it (stdio_own.rs).
    StandardDevice,
    /// Any other character device.
    Device,
    /// A socket (a harness's socketpair, socat's).
    Socket,
    /// What could not be told.
    Other,
}

fn stream(fd: RawFd) -> Stream {
    let Ok(st) = nix::sys::stat::fstat(fd) else {
        return Stream::Other;
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Stream::Directory,
        libc::S_IFREG | libc::S_IFBLK => Stream::File,
        libc::S_IFIFO => {
            let name = std::fs::read_link(format!("/proc/self/fd/{fd}"));
            if name.is_ok_and(|n| n.to_string_lossy().starts_with("pipe:")) {
                Stream::Pipe
            } else {
                Stream::Fifo
            }
        }
        // SAFETY: isatty only inspects the descriptor.
        libc::S_IFCHR if unsafe { libc::isatty(fd) } == 1 => Stream::Terminal,
        libc::S_IFCHR if crate::stdio_own::standard_device(st.st_rdev).is_some() => {
            Stream::StandardDevice
        }
        libc::S_IFCHR => Stream::Device,
        libc::S_IFSOCK => Stream::Socket,
        _ => Stream::Other,
    }
}

/// Whether `fd` is a file of a filesystem the sandbox must not get.
fn is_host_file(fd: RawFd, paths: &PathFlags) -> bool {
    let name = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    relayed(stream(fd), name.as_deref(), paths)
}

/// Whether a stream of this kind, named `name`, is relayed: a regular
/// file, a block device, or a named FIFO (an anonymous pipe lives on no
/// mount and is passed as it is) outside the `--write` roots or under a
/// path the mount plan changes inside them, any directory (an `fchdir`
/// onto the host's mount, from where `..` leaves a root), and any
/// character device but a terminal. A file inside a root is passed as it
/// is: its metadata is the agent's to change anyway, and the effect log
/// names the writes through it. A file under a deny, a `--tmpfs` or a
/// `--bind` target is not: the descriptor is on the host's mount, so
/// reopening `/proc/self/fd/0` for writing rewrote a write-denied file,
/// and reopening a `>> .env` for reading showed a read-denied one. A
/// device node is on the host's read-write /dev (or wherever it was made):
/// passed, a root run's agent `fchmod`ed, `futimens`ed and `fsetxattr`ed
/// the host's /dev/null through it (adversarial round 14). One the
/// sandbox's /dev has (null, zero, full, random, urandom) is passed to the
/// init, which replaces it with its own read-only bind (stdio_own.rs: no
/// relay process for the common `< /dev/null`, and `/dev/full` stays full);
/// any other is relayed wherever it lies. A socket is relayed too: it
/// cannot be reopened by path, and passed, its open file description,
/// options and state were the launcher's (the agent left `O_NONBLOCK`,
/// `O_APPEND`, a 4 KiB `SO_SNDBUF`, `SO_LINGER` on the launcher's socket
/// after the run, shut it down under the launcher's next write, and sent
/// it descriptors with `SCM_RIGHTS`; adversarial round 14). A terminal
/// is relayed when the run gets no pty of its own (`paths.terminals`):
/// the launcher's terminal in the agent's hands, even reopened read-only
/// (stdio_tty.rs), let it read the shell's input while the job was
/// stopped or in the background (its own session: no SIGTTIN), take a
/// VT as its controlling terminal (hung up for the host when it exited),
/// set TOSTOP (the user's background jobs stopped for good) and, where
/// the init could not reopen it (`< /dev/tty`, another user's pts), set
/// `O_NONBLOCK` on the launcher's description or `fchmod` the host node
/// (adversarial round 23b). The relay reads the terminal as a member of
/// the launcher's job, so job control applies to it (job_control.rs).
fn relayed(stream: Stream, name: Option<&Path>, paths: &PathFlags) -> bool {
    let in_root = name.is_some_and(|n| {
        n.is_absolute()
            && paths.roots.iter().any(|r| n.starts_with(r))
            && !paths.covers.iter().any(|c| n.starts_with(c))
    });
    match stream {
        Stream::Directory | Stream::Device | Stream::Socket => true,
        Stream::File | Stream::Fifo => !in_root,
        Stream::Terminal => paths.terminals,
        Stream::Pipe | Stream::StandardDevice | Stream::Other => false,
    }
}

/// The path flags of the command line (before `--`), resolved: the
/// `--write` roots, and the paths whose view the mount plan changes under
/// them (`--read-deny`, `--write-deny`, `--tmpfs`, the target of
/// `--bind SRC DST`). Paths from a config file are not seen: a stream in
/// a root given only there is relayed too (safe, only less well logged),
/// and one under a deny given only there is passed (docs/architecture.md).
#[derive(Debug, Default, PartialEq)]
struct PathFlags {
    roots: Vec<PathBuf>,
    covers: Vec<PathBuf>,
    /// `--tty` (`Some(true)`) or `--no-tty` (`Some(false)`).
    tty: Option<bool>,
    /// Terminals are relayed: the run gets no pty of its own.
    terminals: bool,
}

fn path_flags(args: &[OsString]) -> PathFlags {
    let cwd = std::env::current_dir().unwrap_or_default();
    let resolve = |path: &OsString| {
        let path = cwd.join(path);
        std::fs::canonicalize(&path).unwrap_or(path)
    };
    let mut flags = PathFlags::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let Some(text) = arg.to_str() else { continue };
        if text == "--" {
            break;
        }
        let (name, inline) = match text.split_once('=') {
            Some((name, value)) => (name, Some(OsString::from(value))),
            None => (text, None),
        };
        let into = match name {
            "--tty" => {
                flags.tty = Some(true);
                continue;
            }
            "--no-tty" => {
                flags.tty = Some(false);
                continue;
            }
            "--write" => &mut flags.roots,
            "--read-deny" | "--write-deny" | "--tmpfs" => &mut flags.covers,
            // `--bind SRC DST`: the target is what the agent sees covered.
            "--bind" => {
                if inline.is_none() {
                    iter.next();
                }
                flags.covers.extend(iter.next().map(resolve));
                continue;
            }
            _ => continue,
        };
        into.extend(inline.as_ref().or_else(|| iter.next()).map(resolve));
    }
    flags
}

/// Refuses a standard stream that the relay passed but the whole policy
/// would have relayed: a file under a deny, `--tmpfs` or `--bind` target
/// given only in a config file, which the relay (running before the file
/// is read) did not see. Passed on, its descriptor would reach the file
/// through the host's mount, past that deny. (A relay whose fork, pipe or
/// thread failed ended the run already, as a failed start.)
pub fn check_passed_streams(policy: &crate::policy::Policy) -> Result<(), String> {
    let paths = PathFlags {
        roots: policy.writable_roots.clone(),
        covers: (policy.read_denies.iter())
            .chain(&policy.write_denies)
            .chain(&policy.tmpfs)
            .chain(policy.binds.iter().map(|b| &b.target))
            .cloned()
            .collect(),
        // A terminal still here is one the run's pty replaces, or one a
        // service client passed on its own (stdio_tty.rs reopens it).
        ..PathFlags::default()
    };
    // A socket the service's caller passed is its own (the CLI relays its
    // streams before it calls, so this is a client of the protocol that
    // chose to): the agent can change only what the caller can.
    let refused = |fd: &RawFd| is_host_file(*fd, &paths) && stream(*fd) != Stream::Socket;
    match (0..3).find(refused) {
        None => Ok(()),
        Some(fd) => {
            let name = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
            Err(format!(
                "standard stream {fd} is {}, a device or under a path the policy denies or \
                 covers; give that path on the command line (the stream is then relayed) or \
                 redirect through a pipe",
                name.display()
            ))
        }
    }
}

fn same_file(a: RawFd, b: RawFd) -> bool {
    match (nix::sys::stat::fstat(a), nix::sys::stat::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), nix::Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
}

/// One stream to copy in the parent.
enum Copy {
    /// From the pipe's read end to the host file (stdout, stderr).
    Out { from: OwnedFd, to: RawFd },
    /// From the host file to the pipe's write end (stdin).
    In { from: RawFd, to: OwnedFd },
}

/// Relays the standard streams that are host files, if any: returns in
/// the child (and when there is nothing to relay, or the fork failed, in
/// the only process); the parent never returns. Must run before any thread
/// exists.
pub fn relay_host_files(args: &[OsString]) {
    let mut paths = path_flags(args);
    // As `HarnessArgs::wants_pty` decides: with a pty of its own, the
    // agent gets none of the launcher's streams that are terminals.
    let at_terminal = (0..2).all(|fd| stream(fd) == Stream::Terminal);
    paths.terminals = !paths.tty.unwrap_or(at_terminal);
    let host: Vec<RawFd> = (0..3).filter(|fd| is_host_file(*fd, &paths)).collect();
    if host.is_empty() {
        return;
    }
    // The child's ends, by stream number, and the parent's copies.
    let mut ends: Vec<(RawFd, OwnedFd)> = Vec::new();
    let mut copies: Vec<Copy> = Vec::new();
    let mut shared_out: Option<OwnedFd> = None;
    for fd in host {
        if fd == 2 && shared_out.is_some() && same_file(1, 2) {
            // `> f 2>&1`: one pipe keeps the order of the two streams.
            if let Some(w) = shared_out.as_ref().and_then(|w| w.try_clone().ok()) {
                ends.push((2, w));
                continue;
            }
        }
        let (r, w) = pipe().unwrap_or_else(|source| fail(RelayError::Pipe { fd, source }));
        if fd == 0 {
            ends.push((0, r));
            copies.push(Copy::In { from: 0, to: w });
        } else {
            if fd == 1 {
                shared_out = w.try_clone().ok();
            }
            ends.push((fd, w));
            copies.push(Copy::Out { from: r, to: fd });
        }
    }
    drop(shared_out);
    // The child waits at this gate until the parent's copying threads
    // exist: a thread that cannot start (the process limit) then ends the
    // run before it began, not after the child reported a failure of its
    // own on the status channel and the relay died of a panic.
    let (gate, open_gate) =
        pipe().unwrap_or_else(|source| fail(RelayError::Pipe { fd: 0, source }));
    let relay = nix::unistd::getpid();
    // SAFETY: single-threaded here (the caller's contract), so the child
    // may run Rust code.
    match unsafe { nix::unistd::fork() } {
        Err(e) => fail(RelayError::Fork(e)),
        Ok(nix::unistd::ForkResult::Child) => {
            // The launcher knows the relay's pid as the supervisor's: a
            // SIGKILL of it must end the run as it ends a supervisor's
            // (the sandbox dies with us), not leave us running unseen.
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if nix::unistd::getppid() != relay {
                // It died before the death signal was armed.
                std::process::exit(128 + libc::SIGKILL);
            }
            drop(open_gate);
            let mut byte = [0u8; 1];
            if !matches!(File::from(gate).read(&mut byte), Ok(1)) {
                // The parent could not relay and said why.
                std::process::exit(crate::exit::START_FAILURE);
            }
            for (fd, end) in &ends {
                // SAFETY: dup2 onto a standard stream number; `end` stays
                // open until after the call.
                unsafe { libc::dup2(end.as_raw_fd(), *fd) };
            }
            // `ends` and `copies` close here: the parent's ends are not ours.
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(ends);
            drop(gate);
            std::process::exit(serve(child, copies, open_gate))
        }
    }
}

/// The parent: copies, forwards signals, and returns the exit code (or
/// re-raises the signal the child died of).
fn serve(child: nix::unistd::Pid, copies: Vec<Copy>, open_gate: OwnedFd) -> i32 {
    let mut waited = nix::sys::signal::SigSet::empty();
    waited.add(nix::sys::signal::Signal::SIGCHLD);
    for sig in FORWARDED {
        if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
            waited.add(s);
        }
    }
    // Blocked before any copying thread exists, so every thread inherits it
    // and only `sigwaitinfo` below takes these signals.
    let _ = waited.thread_block();
    let (done, outputs_done) = mpsc::channel::<()>();
    let mut outputs = 0;
    for copy in copies {
        let spawned = match copy {
            Copy::Out { from, to } => {
                outputs += 1;
                let done = done.clone();
                std::thread::Builder::new().spawn(move || {
                    copy_out(from, to);
                    let _ = done.send(());
                })
            }
            // Not waited for: it ends at the file's end, or at EPIPE once
            // no process of the run reads.
            Copy::In { from, to } => std::thread::Builder::new().spawn(move || {
                // A terminal is read only while the job is in the
                // foreground (job_control.rs).
                if stream(from) == Stream::Terminal {
                    crate::job_control::copy_terminal_in(from, to);
                } else {
                    copy_in(from, to);
                }
            }),
        };
        if let Err(source) = spawned {
            // The child waits at the gate: closing it ends the child.
            drop(open_gate);
            let _ = nix::sys::wait::waitpid(child, None);
            fail(RelayError::Thread { source });
        }
    }
    drop(done);
    let _ = nix::unistd::write(&open_gate, &[1]);
    drop(open_gate);
    let status = wait_forwarding(child, &waited);
    let deadline = std::time::Instant::now() + DRAIN;
    for _ in 0..outputs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if outputs_done.recv_timeout(left).is_err() {
            break;
        }
    }
    match status {
        nix::sys::wait::WaitStatus::Exited(_, code) => code,
        nix::sys::wait::WaitStatus::Signaled(_, sig, _) => {
            let _ = nix::sys::signal::SigSet::all().thread_unblock();
            // SAFETY: SIG_DFL installs no handler.
            unsafe { libc::signal(sig as libc::c_int, libc::SIG_DFL) };
            let _ = nix::sys::signal::raise(sig);
            128 + sig as i32
        }
        _ => 125,
    }
}

/// Waits for the child, passing on the signals another process sent us.
fn wait_forwarding(
    child: nix::unistd::Pid,
    waited: &nix::sys::signal::SigSet,
) -> nix::sys::wait::WaitStatus {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return s,
            Ok(_) => continue,
            Err(_) => return WaitStatus::Exited(child, 125),
        }
        // SAFETY: an all-zero siginfo_t is a valid value of the C struct.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `waited` is a valid set and `info` a writable siginfo_t.
        let sig = unsafe { libc::sigwaitinfo(waited.as_ref(), &mut info) };
        if sig <= 0 || sig == libc::SIGCHLD {
            continue;
        }
        // From the terminal (SI_KERNEL) the child's group got it too.
        if info.si_code == libc::SI_USER || info.si_code == libc::SI_QUEUE {
            // SAFETY: plain kill of our own child.
            unsafe { libc::kill(child.as_raw(), sig) };
        }
    }
}

fn copy_out(from: OwnedFd, to: RawFd) {
    let mut from = File::from(from);
    // SAFETY: `to` is a standard stream this process keeps open until exit;
    // ManuallyDrop never closes it.
    let mut to = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(to) });
    let mut buf = vec![0u8; 64 * 1024];
    let mut writable = true;
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            // A file that can no longer be written (ENOSPC, EFBIG): keep
            // reading, so the run is not blocked on a full pipe.
            Ok(n) if writable => writable = to.write_all(&buf[..n]).is_ok(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn copy_in(from: RawFd, to: OwnedFd) {
    // SAFETY: as in `copy_out`.
    let mut from = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(from) });
    let mut to = File::from(to);
    // Reads and writes, not `std::io::copy`: it splices into the pipe, and
    // a splice from a socket or a device holds the pipe's lock while it
    // waits for input, so the init's reopen of the pipe (stdio_own.rs)
    // waited as long (a harness's socketpair on stdin hung the run).
    let mut buf = vec![0u8; 64 * 1024];
    while forward_once(&mut *from, &mut to, &mut buf) {}
}

/// One read of `from` written whole to `to`; false once the copy is over
/// (end of input, a read error, or no reader left on `to`).
pub(crate) fn forward_once(from: &mut impl Read, to: &mut impl Write, buf: &mut [u8]) -> bool {
    match from.read(buf) {
        Ok(0) => false,
        Ok(n) => to.write_all(&buf[..n]).is_ok(),
        Err(e) => e.kind() == std::io::ErrorKind::Interrupted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> PathFlags {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        path_flags(&args)
    }

    #[test]
    fn covers_are_the_denies_tmpfs_and_bind_targets_before_the_command() {
        let got = flags(&[
            "tartaros",
            "run",
            "--write",
            "/w",
            "--write-deny=/w/.git",
            "--read-deny",
            "/w/.env",
            "--tmpfs",
            "/w/cache",
            "--bind",
            "/src",
            "/w/dst",
            "--bind=/s2",
            "/w/d2",
            "--strict",
            "--",
            "--write-deny",
            "/w/x",
        ]);
        let paths = |list: &[&str]| list.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(got.roots, paths(&["/w"]));
        assert_eq!(
            got.covers,
            paths(&["/w/.git", "/w/.env", "/w/cache", "/w/dst", "/w/d2"])
        );
    }

    #[test]
    fn tty_flags_are_read_before_the_command_only() {
        assert_eq!(flags(&["tartaros", "run", "--", "--tty"]).tty, None);
        assert_eq!(
            flags(&["tartaros", "run", "--tty", "--", "x"]).tty,
            Some(true)
        );
        assert_eq!(
            flags(&["tartaros", "run", "--no-tty", "--", "--tty"]).tty,
            Some(false)
        );
    }

    #[test]
    fn devices_and_directories_are_relayed_wherever_they_lie_standard_devices_and_pipes_never() {
        let paths = flags(&["tartaros", "run", "--write", "/w", "--write-deny", "/w/d"]);
        let inside = Some(Path::new("/w/x"));
        let outside = Some(Path::new("/dev/null"));
        for name in [inside, outside, None] {
            assert!(relayed(Stream::Device, name, &paths), "{name:?}");
            assert!(relayed(Stream::Socket, name, &paths), "{name:?}");
            assert!(relayed(Stream::Directory, name, &paths), "{name:?}");
            assert!(!relayed(Stream::Terminal, name, &paths), "{name:?}");
            let without_pty = PathFlags {
                terminals: true,
                ..flags(&["tartaros", "run"])
            };
            assert!(relayed(Stream::Terminal, name, &without_pty), "{name:?}");
            assert!(!relayed(Stream::StandardDevice, name, &paths), "{name:?}");
            assert!(!relayed(Stream::Pipe, name, &paths), "{name:?}");
            assert!(!relayed(Stream::Other, name, &paths), "{name:?}");
        }
        for kind in [Stream::File, Stream::Fifo] {
            assert!(!relayed(kind, inside, &paths), "{kind:?}");
            assert!(relayed(kind, outside, &paths), "{kind:?}");
            assert!(relayed(kind, Some(Path::new("/w/d/f")), &paths), "{kind:?}");
            assert!(relayed(kind, None, &paths), "{kind:?}");
        }
    }
}
