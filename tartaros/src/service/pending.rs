//! Workers that have not started a run yet: still reading their request.
//!
//! Every connection costs the host a root process before the caller has
//! said anything, and that process is not counted against any of the
//! caller's own limits (it lives in the service's cgroup, as root). So the
//! service keeps at most [`MAX_PENDING_PER_UID`] such workers per caller
//! uid and [`MAX_PENDING`] in all, and refuses further connections with a
//! one-line error until some of them have started or ended. A worker stays
//! pending for at most its request deadline (`worker::REQUEST_TIMEOUT`);
//! an honest client is pending for the few milliseconds its request takes.
//!
//! How the service knows: each worker inherits the write end of a pipe
//! (named by [`STARTED_FD_ENV`]) and writes one byte once it holds a whole,
//! well-formed request; its exit closes the pipe. Either makes the read end
//! the service keeps readable, and the worker is no longer pending.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Workers reading their request, at most, for all callers together: the
/// host's bound (each is a root process of a few MiB).
pub const MAX_PENDING: usize = 64;
/// Workers reading their request, at most, for one caller uid: a quarter
/// of [`MAX_PENDING`], so that one user alone cannot keep the others out.
pub const MAX_PENDING_PER_UID: usize = 16;
/// The variable naming the worker's end of its "started" pipe.
pub const STARTED_FD_ENV: &str = "TARTAROS_SERVICE_STARTED_FD";

/// The service's side: the callers' pending workers.
#[derive(Default)]
pub struct Pending {
    workers: Vec<(u32, OwnedFd)>,
}

impl Pending {
    /// Whether another worker may start for `uid`; the one-line refusal if
    /// not. Forgets first the workers that have started or exited.
    pub fn admit(&mut self, uid: u32) -> Result<(), String> {
        self.workers.retain(|(_, started)| !is_readable(started));
        match busy(self.workers.iter().map(|(uid, _)| *uid), uid) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// The worker of `uid` whose pipe's read end is `started` was started.
    pub fn add(&mut self, uid: u32, started: OwnedFd) {
        self.workers.push((uid, started));
    }
}

/// The refusal for `uid` when `pending` (the uids of the pending workers)
/// leaves no room for it, or `None`.
fn busy(pending: impl Iterator<Item = u32>, uid: u32) -> Option<String> {
    let (mut all, mut mine) = (0usize, 0usize);
    for other in pending {
        all += 1;
        mine += usize::from(other == uid);
    }
    let seconds = super::worker::REQUEST_TIMEOUT.as_secs();
    if mine >= MAX_PENDING_PER_UID {
        return Some(format!(
            "the service is busy: {mine} connections of uid {uid} have not sent their request yet (at most {MAX_PENDING_PER_UID} per user); end the connections that do not send one, or retry in {seconds} seconds"
        ));
    }
    if all >= MAX_PENDING {
        return Some(format!(
            "the service is busy: {all} connections have not sent their request yet (at most {MAX_PENDING} in all); retry in {seconds} seconds"
        ));
    }
    None
}

/// A new "started" pipe: the service's read end and the worker's write
/// end, both close-on-exec (the service clears the flag for its worker
/// alone). The write end is numbered 4 or above: fds 0 to 3 of the worker
/// are its stdio and connection, overwritten before the exec.
pub fn channel() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    if write.as_raw_fd() > 3 {
        return Ok((read, write));
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that we then own.
    let moved = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 4) };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor, owned by nothing else.
    Ok((read, unsafe { OwnedFd::from_raw_fd(moved) }))
}

/// The worker's side: its end of the pipe, taken from the environment the
/// service gave it (none when it was started otherwise).
pub struct Started(Option<OwnedFd>);

impl Started {
    /// Takes the descriptor named by [`STARTED_FD_ENV`], close-on-exec from
    /// now on so that nothing the run executes holds it.
    pub fn from_env() -> Self {
        let fd = std::env::var(STARTED_FD_ENV)
            .ok()
            .and_then(|v| v.parse::<RawFd>().ok())
            .filter(|fd| *fd > 3);
        let Some(fd) = fd else {
            return Self(None);
        };
        // SAFETY: F_SETFD only changes the flags of a descriptor number; an
        // unused number fails with EBADF and is then not taken.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            return Self(None);
        }
        // SAFETY: the service placed this descriptor for this process alone.
        Self(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Tells the service that the request is in: this worker no longer
    /// counts against the caller's pending workers.
    pub fn report(self) {
        if let Some(fd) = self.0 {
            let _ = nix::unistd::write(&fd, &[1]);
        }
    }
}

/// Whether `fd` has something to read or its other end is closed.
pub(crate) fn is_readable(fd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&raw mut poll, 1, 0) };
    n > 0 && poll.revents != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_uid_is_refused_at_its_share_and_the_others_still_get_in() {
        let full = [1000; MAX_PENDING_PER_UID];
        let refusal = busy(full.iter().copied(), 1000).unwrap_or_default();
        assert!(refusal.contains("uid 1000"), "{refusal}");
        assert!(refusal.contains("at most 16 per user"), "{refusal}");
        assert!(!refusal.contains('\n'));
        assert_eq!(busy(full.iter().copied(), 1001), None);
        assert_eq!(busy(full[1..].iter().copied(), 1000), None);
    }

    #[test]
    fn everyone_is_refused_once_the_total_is_reached() {
        let all: Vec<u32> = (0..MAX_PENDING as u32).map(|i| 2000 + i % 8).collect();
        let refusal = busy(all.iter().copied(), 3000).unwrap_or_default();
        assert!(refusal.contains("at most 64 in all"), "{refusal}");
        assert_eq!(busy(all[1..].iter().copied(), 3000), None);
    }

    #[test]
    fn a_worker_stops_being_pending_when_it_reports_or_exits() {
        let mut pending = Pending::default();
        let mut ends = Vec::new();
        for _ in 0..MAX_PENDING_PER_UID {
            let (read, write) = channel().unwrap();
            assert!(write.as_raw_fd() > 3);
            pending.add(7, read);
            ends.push(write);
        }
        assert!(pending.admit(7).is_err());
        // One reports its request in, another exits (its end closes).
        let first = ends.remove(0);
        Started(Some(first)).report();
        assert!(pending.admit(7).is_ok());
        let (read, write) = channel().unwrap();
        pending.add(7, read);
        assert!(pending.admit(7).is_err());
        drop(write);
        assert!(pending.admit(7).is_ok());
    }
}
