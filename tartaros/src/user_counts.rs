//! The share of the launcher's per-user kernel counts an ordinary user's
//! run may take: inotify instances and watches.
//!
//! The kernel counts them per uid in every user namespace from the
//! caller's up to the host's, each against that namespace's limit. The
//! agent of an ordinary user's run is that user, so without a limit of its
//! own it shared the host's (128 instances here) with the user's own
//! processes: it took them all, and the user's editor or file watcher got
//! EMFILE until the run ended. The init, root of the run's user namespace,
//! sets that namespace's limits to a share of the host's before anything
//! of the agent runs; the agent's own namespace is below it, so every
//! instance it makes counts against the share. Root runs have no user
//! namespace, so this does not bound them (docs/architecture.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum UserCountsError {
    #[error("failed to set {name} of the sandbox's user namespace to {value}: {source}")]
    Write {
        name: &'static str,
        value: u64,
        source: std::io::Error,
    },
}

/// A run's limits, from the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCounts {
    pub inotify_instances: u64,
    pub inotify_watches: u64,
}

/// What a run may take of the host's limit: a quarter, so one run leaves
/// the user most of them, and a few runs at once still leave some.
const SHARE: u64 = 4;

/// The host's limits of the initial user namespace, if readable.
pub fn host() -> Option<(u64, u64)> {
    let read = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/user/{name}"))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some((read("max_inotify_instances")?, read("max_inotify_watches")?))
}

/// The limits of a run, given the host's `(instances, watches)`.
pub fn of(host: (u64, u64)) -> UserCounts {
    UserCounts {
        inotify_instances: (host.0 / SHARE).max(1),
        inotify_watches: (host.1 / SHARE).max(1),
    }
}

/// Sets `counts` in the caller's user namespace (the sysctls under
/// /proc/sys/user act on the writer's), which must be the run's.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_gets_a_quarter_of_the_hosts_counts_and_never_none() {
        assert_eq!(
            of((128, 192_546)),
            UserCounts {
                inotify_instances: 32,
                inotify_watches: 48_136
            }
        );
        assert_eq!(of((2, 3)).inotify_instances, 1);
    }
}
