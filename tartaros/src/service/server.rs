//! The service's listener: a unix socket that every user may connect to
//! (authentication is the worker's, from the kernel's peer credentials),
//! and one worker process per connection, within the bounds of
//! [`super::pending`] for workers still reading their request and of
//! [`super::running`] for runs in progress per caller (a connection over
//! them gets a one-line refusal from the service itself, and the service
//! goes on serving the others). Workers die with the service
//! (`PR_SET_PDEATHSIG`), and so, through their own death signals and
//! janitors, do their sandboxes: no sandbox outlives the service
//! unsupervised.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;

use super::frame::{self, Message};
use super::pending::{Pending, STARTED_FD_ENV};
use super::running::Running;
use crate::exit;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("failed to prepare {path}: {source}; run `tartaros service` as root")]
    Prepare {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "failed to listen on {path}: {source}; is another service running? (remove a stale socket first)"
    )]
    Listen {
        path: String,
        source: std::io::Error,
    },
}

/// The listening socket systemd passed (socket activation: `LISTEN_PID`
/// is us and `LISTEN_FDS` is 1, the socket on fd 3).
fn activated() -> Option<UnixListener> {
    let pid = std::env::var("LISTEN_PID").ok()?.parse::<u32>().ok()?;
    let fds = std::env::var("LISTEN_FDS").ok()?.parse::<u32>().ok()?;
    if pid != std::process::id() || fds != 1 {
        return None;
    }
    use std::os::fd::FromRawFd;
    // SAFETY: systemd passed us fd 3 as our listening socket.
    Some(unsafe { UnixListener::from_raw_fd(3) })
}

/// Serves until killed. Returns only on a setup failure. Must be called
/// while the process is single-threaded (it forks the janitor of the runs'
/// parent cgroup).
pub fn serve(socket: &Path, runs_per_user: usize) -> Result<(), ServerError> {
    let running = Running::new(runs_per_user);
    if let Some(listener) = activated() {
        // SAFETY: F_SETFD only changes the flags of our socket.
        unsafe { libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC) };
        return accept_loop(listener, socket, super::programs::start(), running);
    }
    let prepare = |source| ServerError::Prepare {
        path: socket.display().to_string(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(prepare)?;
    }
    // A socket left by a service that died; a live one answers connects.
    if std::os::unix::net::UnixStream::connect(socket).is_err() {
        let _ = std::fs::remove_file(socket);
    }
    let listener = UnixListener::bind(socket).map_err(|source| ServerError::Listen {
        path: socket.display().to_string(),
        source,
    })?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).map_err(prepare)?;
    accept_loop(listener, socket, super::programs::start(), running)
}

fn accept_loop(
    listener: UnixListener,
    socket: &Path,
    programs: Option<super::programs::Programs>,
    mut running: Running,
) -> Result<(), ServerError> {
    let prepare = |source| ServerError::Prepare {
        path: socket.display().to_string(),
        source,
    };
    // Workers are reaped by the kernel: the service never waits for them.
    // SAFETY: setting SIGCHLD to SIG_IGN takes no memory.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    eprintln!("tartaros: service listening on {}", socket.display());
    let exe = std::env::current_exe().map_err(prepare)?;
    let mut pending = Pending::default();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let Some((uid, started_read, started_write)) = admit(&conn, &mut pending, &mut running)
        else {
            continue;
        };
        // The maps the worker inherits, a ring ready for it, and the
        // manifest naming them.
        let given = programs.as_ref().map(|p| p.for_worker());
        let fd = conn.as_raw_fd();
        let started_fd = started_write.as_raw_fd();
        let mut command = std::process::Command::new(&exe);
        command
            .arg(super::WORKER_ARG)
            .env_clear()
            .env(STARTED_FD_ENV, started_fd.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        let shared_fds: Vec<i32> = match &given {
            Some(given) => {
                command.env(crate::ebpf::shared::MANIFEST_ENV, &given.manifest);
                given.fds.clone()
            }
            None => Vec::new(),
        };
        // SAFETY: between fork and exec only async-signal-safe calls: the
        // connection onto fd 3, the maps' descriptors and the "started"
        // pipe kept open across the exec (fcntl on the child's own table),
        // and the death signal.
        unsafe {
            command.pre_exec(move || {
                // dup2 onto itself would keep close-on-exec.
                let placed = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, 3)
                };
                if placed < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for kept in shared_fds.iter().chain([&started_fd]) {
                    if libc::fcntl(*kept, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let spawned = command.spawn();
        // The worker holds its end now; the service keeps only the read end.
        drop(started_write);
        match spawned {
            Ok(child) => {
                pending.add(uid, started_read);
                running.add(uid, child.id());
                if let (Some(p), Some(given)) = (programs.as_ref(), given) {
                    p.started(child.id(), given);
                }
            }
            Err(e) => {
                eprintln!("tartaros: service: failed to start a worker: {e}");
                if let (Some(p), Some(given)) = (programs.as_ref(), given) {
                    p.unused(given);
                }
            }
        }
        // The worker holds the connection now; ours closes here.
        drop(conn);
    }
    Ok(())
}

/// The caller's uid and the two ends of the "started" pipe for a worker of
/// this connection, or `None` when the connection was refused here (too
/// many workers still reading their request or runs in progress, or no
/// peer credentials).
fn admit(
    conn: &UnixStream,
    pending: &mut Pending,
    running: &mut Running,
) -> Option<(u32, OwnedFd, OwnedFd)> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let refuse = |message: String| {
        // Never blocks the accept loop: the frame is small and the
        // connection new, and a client that cannot take it loses it.
        let _ = conn.set_nonblocking(true);
        if let Ok(bytes) = frame::encode(&Message::Refused {
            code: exit::START_FAILURE,
            message,
        }) {
            let _ = (&mut &*conn).write_all(&bytes);
        }
    };
    let uid = match getsockopt(conn, PeerCredentials) {
        Ok(cred) => cred.uid(),
        Err(e) => {
            refuse(format!("failed to read the caller's credentials: {e}"));
            return None;
        }
    };
    if let Err(message) = pending.admit(uid).and_then(|()| running.admit(uid)) {
        refuse(message);
        return None;
    }
    match super::pending::channel() {
        Ok((read, write)) => Some((uid, read, write)),
        Err(e) => {
            eprintln!("tartaros: service: failed to start a worker: {e}");
            refuse(format!(
                "failed to start a worker: {e}; see the service's own log"
            ));
            None
        }
    }
}
