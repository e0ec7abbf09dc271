//! `tartaros run` by an ordinary user, when the service is there: the run
//! is handed to the service with this process's stdio, the launcher's
//! signals are passed on, and the service's exit status becomes ours.
//! Without the service, the run goes the user-namespace way (with its
//! degradations, or a refusal under `--strict`).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use super::frame::{self, Message, Request};
use crate::exit;

/// Hands `tartaros run ARGS` to the service and returns the exit status,
/// or `None` when this run does not go through the service (root, another
/// command, or no service listening).
pub fn delegate(args: &[OsString]) -> Option<i32> {
    if args.get(1).and_then(|a| a.to_str()) != Some("run") || nix::unistd::geteuid().is_root() {
        return None;
    }
    let socket = super::socket_path();
    if !socket.exists() {
        return None;
    }
    let conn = match UnixStream::connect(&socket) {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!(
                "tartaros: warning: the service at {} does not answer ({e}); running without it",
                socket.display()
            );
            return None;
        }
    };
    Some(run(&conn, args))
}

fn run(conn: &UnixStream, args: &[OsString]) -> i32 {
    let fail = |message: String| {
        crate::warn::say(format_args!("{message}"));
        exit::START_FAILURE
    };
    let mut run_args = Vec::new();
    for arg in &args[2..] {
        match arg.to_str() {
            Some(a) => run_args.push(a.to_string()),
            None => {
                eprintln!(
                    "tartaros: an argument is not valid UTF-8; the service takes UTF-8 arguments only"
                );
                return exit::REFUSED;
            }
        }
    }
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd.to_string_lossy().into_owned(),
        Err(e) => return fail(format!("failed to read the working directory: {e}")),
    };
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let request = Request {
        version: frame::VERSION,
        args: run_args,
        cwd,
        env,
    };
    let bytes = match frame::encode(&request) {
        Ok(bytes) => bytes,
        Err(e) => return fail(format!("failed to send the run to the service: {e}")),
    };
    // The first four bytes carry our stdin, stdout and stderr, and the
    // `--status-fd` descriptor when there is one (the worker renumbers it).
    let mut fds = vec![0, 1, 2];
    if let Some(status) = crate::cli_extra::status_fd_in(args) {
        // Here, not in the worker: our streams are the relay's pipes by
        // now, and only this process recorded the files they replaced
        // (`>> out.txt 9>> out.txt`).
        if let Err(e) = crate::status::check_own_file(status) {
            eprintln!("tartaros: {e}");
            return exit::REFUSED;
        }
        fds.push(status);
    }
    let rights = [ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(&bytes[..4])];
    let sent = sendmsg::<()>(conn.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None)
        .map_err(std::io::Error::from)
        .and_then(|_| (&mut &*conn).write_all(&bytes[4..]));
    if let Err(e) = sent {
        // A busy service refuses before reading anything and closes: its
        // one line, if it sent one, says more than the broken pipe. (A
        // bound on the wait, should the connection still be open.)
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(1)));
        if let Ok(Message::Refused { code, message }) = frame::read::<Message>(&mut &*conn) {
            return refused(args, code, &message);
        }
        return fail(format!("failed to send the run to the service: {e}"));
    }
    // The worker puts a terminal stdin in raw mode (the pty relay) and
    // gives it back at the end; a worker that dies (killed, the service
    // restarted) cannot, and this process outlives it.
    let terminal = nix::sys::termios::tcgetattr(std::io::stdin().as_fd()).ok();
    if let Err(e) = forward_signals(conn) {
        // Our end closes: the worker's relay ends the run.
        return fail(e);
    }
    let mut reader = conn;
    loop {
        match frame::read::<Message>(&mut reader) {
            Ok(Message::Exit(code)) => return code,
            Ok(Message::Refused { code, message }) => return refused(args, code, &message),
            Ok(Message::Signal(_)) => {}
            Err(e) => {
                if let Some(saved) = &terminal {
                    let _ = nix::sys::termios::tcsetattr(
                        std::io::stdin().as_fd(),
                        nix::sys::termios::SetArg::TCSANOW,
                        saved,
                    );
                }
                return fail(format!(
                    "the service ended the run without an exit status ({e}); see the service's own log"
                ));
            }
        }
    }
}

/// The service refused the run before it reached `tartaros run` (busy, a
/// bad request, a sandboxed caller): says so on stderr and, as a run of
/// our own would, on the `--status-fd` channel, so that a harness gets its
/// one `refused` or `failed` line instead of an end of file.
fn refused(args: &[OsString], code: i32, message: &str) -> i32 {
    let message = frame::one_line(message);
    crate::warn::say(format_args!("{message}"));
    if let Some(fd) = crate::cli_extra::status_fd_in(args)
        && let Ok(channel) = crate::status::StatusChannel::adopt(fd)
    {
        crate::cli_extra::report_end(Some(&channel), code, &message);
    }
    code
}

/// Passes SIGINT, SIGTERM, SIGHUP and SIGQUIT to the service's worker,
/// which forwards them to the agent as a direct run would.
fn forward_signals(conn: &UnixStream) -> Result<(), String> {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(sig);
    }
    if set.thread_block().is_err() {
        return Ok(());
    }
    let Ok(writer) = conn.try_clone() else {
        return Ok(());
    };
    let spawned = std::thread::Builder::new().spawn(move || {
        while let Ok(sig) = set.wait() {
            let Ok(bytes) = frame::encode(&Message::Signal(sig as i32)) else {
                continue;
            };
            if (&writer).write_all(&bytes).is_err() {
                break;
            }
        }
    });
    // A thread counts against RLIMIT_NPROC like a process: at the limit,
    // say so in one line rather than panic.
    spawned.map(drop).map_err(|e| match e.raw_os_error() {
        Some(libc::EAGAIN) => format!(
            "failed to start a thread: your process limit (RLIMIT_NPROC, ulimit -u) is reached: {e}"
        ),
        _ => format!("failed to start a thread: {e}"),
    })
}
