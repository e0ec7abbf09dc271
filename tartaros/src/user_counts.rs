//! The share of the launcher's per-user kernel counts an ordinary user's
//! run may take: inotify instances and watches, pending signals and
//! POSIX message-queue bytes.
//!
//! The kernel counts them per uid in every user namespace from the
//! caller's up to the host's, each against that namespace's limit. The
//! agent of an ordinary user's run is that user, so without a limit of its
//! own it shared the host's (128 instances here) with the user's own
//! processes: it took them all, and the user's editor or file watcher got
//! EMFILE until the run ended; queued real-time signals left the user's
//! processes none to queue (EAGAIN). The init, root of the run's user
//! namespace, sets that namespace's inotify limits to a share of the
//! host's before anything of the agent runs (the agent's own namespace is
//! below it, so every instance it makes counts against the share), and
//! the agent's `RLIMIT_SIGPENDING` and `RLIMIT_MSGQUEUE`, which bound the
//! counts of its own namespace, to a share of the launcher's. Root runs
//! have no user namespace, so this does not bound them
//! (docs/architecture.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum UserCountsError {
    #[error("failed to set {name} of the sandbox's user namespace to {value}: {source}")]
    Write {
        name: &'static str,
        value: u64,
        source: std::io::Error,
    },
    #[error("failed to limit the agent's {name} to {value}: {source}")]
    Limit {
        name: &'static str,
        value: u64,
        source: nix::Error,
    },
}

/// Per-user limits: the host's, or a run's share of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCounts {
    pub inotify_instances: u64,
    pub inotify_watches: u64,
    pub pending_signals: u64,
    pub queue_bytes: u64,
}

/// What a run may take of the host's limit: a quarter, so one run leaves
/// the user most of them, and a few runs at once still leave some.
const SHARE: u64 = 4;

/// The host's inotify limits (of the initial user namespace) and the
/// launcher's signal and message-queue limits, which the agent inherits.
pub fn host() -> Option<UserCounts> {
    use nix::sys::resource::{Resource, getrlimit};
    let read = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/user/{name}"))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some(UserCounts {
        inotify_instances: read("max_inotify_instances")?,
        inotify_watches: read("max_inotify_watches")?,
        pending_signals: getrlimit(Resource::RLIMIT_SIGPENDING).ok()?.0,
        queue_bytes: getrlimit(Resource::RLIMIT_MSGQUEUE).ok()?.0,
    })
}

/// A run's share of `host`.
pub fn of(host: UserCounts) -> UserCounts {
    let share = |n: u64| (n / SHARE).max(1);
    UserCounts {
        inotify_instances: share(host.inotify_instances),
        inotify_watches: share(host.inotify_watches),
        pending_signals: share(host.pending_signals),
        queue_bytes: share(host.queue_bytes),
    }
}

/// Sets the inotify limits of `counts` in the caller's user namespace
/// (the sysctls under /proc/sys/user act on the writer's), which must be
/// the run's.
pub fn apply(counts: &UserCounts) -> Result<(), UserCountsError> {
    for (name, value) in [
        ("max_inotify_instances", counts.inotify_instances),
        ("max_inotify_watches", counts.inotify_watches),
    ] {
        std::fs::write(format!("/proc/sys/user/{name}"), value.to_string()).map_err(|source| {
            UserCountsError::Write {
                name,
                value,
                source,
            }
        })?;
    }
    Ok(())
}

/// Sets the signal and message-queue limits of `counts` as the caller's
/// own, soft and hard (it has no capability to raise them again): in the
/// agent's user namespace, where the kernel counts them for its uid.
pub fn limit_agent(counts: &UserCounts) -> Result<(), UserCountsError> {
    use nix::sys::resource::{Resource, setrlimit};
    for (name, resource, value) in [
        (
            "RLIMIT_SIGPENDING",
            Resource::RLIMIT_SIGPENDING,
            counts.pending_signals,
        ),
        (
            "RLIMIT_MSGQUEUE",
            Resource::RLIMIT_MSGQUEUE,
            counts.queue_bytes,
        ),
    ] {
        setrlimit(resource, value, value).map_err(|source| UserCountsError::Limit {
            name,
            value,
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gets_a_quarter_of_the_hosts_counts_and_never_none() {
        let host = UserCounts {
            inotify_instances: 128,
            inotify_watches: 192_546,
            pending_signals: 96_369,
            queue_bytes: 819_200,
        };
        assert_eq!(
            of(host),
            UserCounts {
                inotify_instances: 32,
                inotify_watches: 48_136,
                pending_signals: 24_092,
                queue_bytes: 204_800,
            }
        );
        let tiny = UserCounts {
            inotify_instances: 2,
            ..host
        };
        assert_eq!(of(tiny).inotify_instances, 1);
    }
}
