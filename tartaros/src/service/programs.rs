//! The eBPF programs the service loads once for all its runs
//! ([`crate::ebpf::shared`]), and the parent cgroup they are attached to:
//! `<the service's own cgroup>/tartaros-<service pid>-<nanoseconds>`, named
//! like a run cgroup so that a sweep for debris (`crate::debris`) knows
//! whose it is. A janitor removes it (and whatever is left below it) when
//! the service ends, however it ends.
//!
//! Ring buffers: putting one into the maps waits for an RCU grace period
//! (docs/ebpf.md, "Rings"), so a keeper thread keeps [`SPARES`] rings of
//! the default size in place for the next workers, and takes a worker's
//! ring out again once that worker has exited (seen on its pidfd): no
//! run's start or end waits for a grace period. An idle service holds
//! those rings (8 MiB each). The keeper also forgets the runs whose cgroup
//! is gone (a killed worker's), off the accept path.

use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::ebpf::shared::{self, Manifest, SharedPrograms, Spare};
use crate::janitor::Janitor;

/// Rings kept ready for the next runs.
const SPARES: usize = 2;
/// How often the keeper looks at exited workers, gone runs and the spares.
const KEEPER_PERIOD: Duration = Duration::from_millis(50);

/// The service's programs, with its spare rings and the workers that
/// hold one.
pub struct Programs {
    shared: Arc<Mutex<SharedPrograms>>,
    pool: Arc<Mutex<Pool>>,
    manifest: Manifest,
}

#[derive(Default)]
struct Pool {
    spares: Vec<Spare>,
    /// A worker's pidfd and the key of the ring it was given.
    holders: Vec<(OwnedFd, u64)>,
}

/// What one worker is given.
pub struct ForWorker {
    /// The manifest, as JSON, for [`shared::MANIFEST_ENV`].
    pub manifest: String,
    /// The descriptors it must inherit (the maps and its ring).
    pub fds: Vec<RawFd>,
    spare: Option<Spare>,
}

impl Programs {
    /// What the next worker is given: the maps, and a spare ring if one is
    /// ready.
    pub fn for_worker(&self) -> ForWorker {
        let spare = lock(&self.pool).spares.pop();
        let mut manifest = self.manifest.clone();
        manifest.spare = spare.as_ref().map(|s| (s.key, s.fd.as_raw_fd(), s.bytes));
        let mut fds: Vec<RawFd> = manifest.maps.iter().map(|(_, fd)| *fd).collect();
        fds.extend(spare.as_ref().map(|s| s.fd.as_raw_fd()));
        ForWorker {
            manifest: serde_json::to_string(&manifest).unwrap_or_default(),
            fds,
            spare,
        }
    }

    /// The worker `pid` was started with `given`: its ring is taken out
    /// when it exits.
    pub fn started(&self, pid: u32, given: ForWorker) {
        let Some(spare) = given.spare else { return };
        // SAFETY: pidfd_open takes no pointers; the result is checked.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            // Cannot watch it: the ring stays until the service ends.
            return;
        }
        // SAFETY: a new descriptor we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        lock(&self.pool).holders.push((pidfd, spare.key));
    }

    /// `given` went to no worker: its ring is kept for the next.
    pub fn unused(&self, given: ForWorker) {
        if let Some(spare) = given.spare {
            lock(&self.pool).spares.push(spare);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Loads and attaches the programs, or says on stderr why runs will load
/// their own (each then pays a verifier pass, as a root run does). Must be
/// called while the process is single-threaded (it forks the janitor).
pub fn start() -> Option<Programs> {
    match try_start() {
        Ok((programs, warnings)) => {
            for w in warnings {
                eprintln!("tartaros: service: warning: {w}");
            }
            let manifest = programs.manifest().clone();
            // The worker's connection goes onto fd 3 and its stdio onto
            // 0-2 before the exec: a map there would be overwritten.
            if manifest.maps.iter().any(|(_, fd)| *fd <= 3) {
                eprintln!(
                    "tartaros: service: warning: a map descriptor is 3 or lower (was stdin closed?); every run loads its own eBPF programs"
                );
                return None;
            }
            let events = programs.events();
            let programs = Programs {
                shared: Arc::new(Mutex::new(programs)),
                pool: Arc::new(Mutex::new(Pool::default())),
                manifest,
            };
            if let Some(events) = events {
                let (shared, pool) = (programs.shared.clone(), programs.pool.clone());
                let keeper = std::thread::Builder::new()
                    .name("ring-keeper".into())
                    .spawn(move || keep(&shared, &pool, &events));
                if let Err(e) = keeper {
                    eprintln!(
                        "tartaros: service: warning: no spare rings ({e}); each --log run places its own"
                    );
                }
            }
            Some(programs)
        }
        Err(e) => {
            eprintln!("tartaros: service: warning: {e}; every run loads its own eBPF programs");
            None
        }
    }
}

/// The keeper: takes out the rings of exited workers and keeps the
/// spares topped up. Never returns.
fn keep(shared: &Mutex<SharedPrograms>, pool: &Mutex<Pool>, events: &OwnedFd) {
    loop {
        let exited: Vec<u64> = {
            let mut pool = lock(pool);
            let (gone, live): (Vec<_>, Vec<_>) = pool
                .holders
                .drain(..)
                .partition(|(pidfd, _)| has_exited(pidfd));
            pool.holders = live;
            gone.into_iter().map(|(_, key)| key).collect()
        };
        for key in exited {
            lock(shared).forget_runs_of(key);
            shared::remove_ring(events, key);
        }
        // Runs whose worker was killed before it could leave.
        lock(shared).sweep();
        while lock(pool).spares.len() < SPARES {
            match shared::make_spare(events, crate::ebpf::DEFAULT_RING_BYTES) {
                // See `start`: fds 0-3 are the worker's stdio and connection.
                Ok(spare) if spare.fd.as_raw_fd() <= 3 => {
                    shared::remove_ring(events, spare.key);
                    break;
                }
                Ok(spare) => lock(pool).spares.push(spare),
                Err(_) => break,
            }
        }
        std::thread::sleep(KEEPER_PERIOD);
    }
}

/// Whether the process behind `pidfd` has exited (it is readable then).
fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&raw mut poll, 1, 0) };
    n > 0 && poll.revents != 0
}

fn try_start() -> Result<(SharedPrograms, Vec<String>), String> {
    let own = crate::cgroup::own_v2_dir()
        .ok_or("failed to find the service's cgroup v2 directory (no cgroup2 mount)")?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let parent: PathBuf = own.join(format!("tartaros-{}-{nanos}", std::process::id()));
    let mut janitor = Janitor::fork().map_err(|e| e.to_string())?;
    std::fs::create_dir(&parent).map_err(|e| {
        format!(
            "failed to create the runs' cgroup {}: {e}",
            parent.display()
        )
    })?;
    janitor.cgroup(&parent);
    // The janitor lives as long as the service: its pipe closes with us.
    std::mem::forget(janitor);
    delegate_controllers(&parent);
    SharedPrograms::start(&parent).map_err(|e| {
        let _ = std::fs::remove_dir(&parent);
        format!("failed to load the shared eBPF programs: {e}")
    })
}

/// Enables for the runs every controller the parent has, so that run
/// cgroups can hold limits in v2 as they could directly under the
/// service's cgroup. Best effort: without it limits fall back as before.
fn delegate_controllers(parent: &std::path::Path) {
    let Ok(available) = std::fs::read_to_string(parent.join("cgroup.controllers")) else {
        return;
    };
    let wanted: Vec<String> = available
        .split_whitespace()
        .map(|c| format!("+{c}"))
        .collect();
    if !wanted.is_empty() {
        let _ = std::fs::write(parent.join("cgroup.subtree_control"), wanted.join(" "));
    }
}
