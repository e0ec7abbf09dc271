//! Runs in progress, per caller.
//!
//! A worker lives as long as its run, and every run the service holds
//! takes one of the [`MAX_RUNS`] entries of the shared eBPF maps (a run
//! that finds none cannot start). Without a bound per caller, one user
//! starting `sleep` runs would keep every other user out of the service.
//! So the service counts its workers per caller uid (each seen through a
//! pidfd, which becomes readable when the worker exits; the kernel reaps
//! them) and refuses a connection over [`Running::per_user`] for that uid,
//! or over [`MAX_RUNS`] in all, with a one-line error, before it starts a
//! worker.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use tartaros_common::MAX_RUNS;

/// The default bound per caller: a quarter of the maps' entries, so that
/// at least four users always fit.
pub const DEFAULT_PER_USER: u16 = (MAX_RUNS / 4) as u16;

/// The service's workers, by caller uid.
pub struct Running {
    per_user: usize,
    workers: Vec<(u32, OwnedFd)>,
}

impl Running {
    pub fn new(per_user: usize) -> Self {
        Self {
            per_user,
            workers: Vec::new(),
        }
    }

    /// Whether another run may start for `uid`; the one-line refusal if
    /// not. Forgets first the workers that have exited.
    pub fn admit(&mut self, uid: u32) -> Result<(), String> {
        self.workers
            .retain(|(_, pidfd)| !crate::service::pending::is_readable(pidfd));
        match over(self.workers.iter().map(|(uid, _)| *uid), uid, self.per_user) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// The worker `pid` of `uid` was started. A worker that cannot be
    /// watched (it has exited already) is not counted.
    pub fn add(&mut self, uid: u32, pid: u32) {
        if let Some(pidfd) = pidfd_open(pid) {
            self.workers.push((uid, pidfd));
        }
    }
}

/// The refusal for `uid` when the runs in progress (their callers' uids)
/// leave no room for it under `per_user`, or `None`.
fn over(running: impl Iterator<Item = u32>, uid: u32, per_user: usize) -> Option<String> {
    let (mut all, mut mine) = (0usize, 0usize);
    for other in running {
        all += 1;
        mine += usize::from(other == uid);
    }
    if mine >= per_user {
        return Some(format!(
            "the service is busy: uid {uid} has {mine} runs in progress (at most {per_user} per user, `tartaros service --max-runs-per-user`); end some of them and retry"
        ));
    }
    if all >= MAX_RUNS as usize {
        return Some(format!(
            "the service is busy: {all} runs in progress (at most {MAX_RUNS} in all); retry when some have ended"
        ));
    }
    None
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes no pointers; the result is checked. Its
    // descriptor is close-on-exec always (no flag for it).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_uid_is_refused_at_its_share_and_the_others_still_get_in() {
        let mine = [1000u32; 3];
        let refusal = over(mine.iter().copied(), 1000, 3).unwrap_or_default();
        assert!(refusal.contains("uid 1000 has 3 runs"), "{refusal}");
        assert!(refusal.contains("at most 3 per user"), "{refusal}");
        assert!(!refusal.contains('\n'));
        assert_eq!(over(mine.iter().copied(), 1001, 3), None);
        assert_eq!(over(mine[1..].iter().copied(), 1000, 3), None);
    }

    #[test]
    fn everyone_is_refused_once_the_maps_are_full() {
        let all: Vec<u32> = (0..MAX_RUNS).map(|i| 2000 + i % 8).collect();
        let refusal = over(all.iter().copied(), 3000, DEFAULT_PER_USER.into()).unwrap_or_default();
        assert!(refusal.contains("at most 1024 in all"), "{refusal}");
        assert_eq!(
            over(all[1..].iter().copied(), 3000, DEFAULT_PER_USER.into()),
            None
        );
    }

    #[test]
    fn a_run_stops_counting_when_its_worker_exits() {
        let mut running = Running::new(1);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        running.add(7, child.id());
        assert!(running.admit(7).is_err());
        assert!(running.admit(8).is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(running.admit(7).is_ok());
    }
}
