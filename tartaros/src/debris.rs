//! Leftover run cgroups. The janitor removes a run's cgroups when the
//! supervisor dies; if both are SIGKILLed together, the cgroups stay. Every
//! run sweeps its own parent cgroups (one `readdir` per hierarchy: cheap),
//! and `tartaros doctor --clean` sweeps every hierarchy.
//!
//! Only ours, and never a live run's: a run cgroup is named
//! `tartaros-<supervisor pid>-<nanoseconds>` (see the supervisor), so the
//! name says which process owns it. It is debris only when that process is
//! gone, or when the pid now belongs to a process that started after the
//! cgroup was created (the pid was reused), and no process is left in it.
//! When in doubt, it is kept.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long removing one leftover may wait for its processes to die.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Slack between the clock a cgroup's mtime is stamped with and the
/// process start time computed from boot time and clock ticks (whole
/// seconds): a process that started up to this much *after* the cgroup
/// was created is still taken as its creator.
const CLOCK_SLACK: Duration = Duration::from_secs(2);

/// The supervisor pid a run cgroup's name carries, if the name is exactly
/// `tartaros-<pid>-<digits>`.
pub fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("tartaros-")?;
    let (pid, nanos) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(nanos) {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

/// What is known about the pid a cgroup names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// No such process.
    Gone,
    /// A process with that pid, started at this wall-clock time (`None`:
    /// unknown).
    Running(Option<SystemTime>),
}

/// Whether a run cgroup created at `created` whose owner is `owner` is
/// debris. Pure: the caller reads the facts.
pub fn is_debris(owner: Owner, created: SystemTime) -> bool {
    match owner {
        Owner::Gone => true,
        Owner::Running(Some(started)) => started > created + CLOCK_SLACK,
        // Unknown start time: keep it.
        Owner::Running(None) => false,
    }
}

/// The start time of process `pid` from `/proc/<pid>/stat` (field 22,
/// clock ticks after boot) and `/proc/stat`'s `btime`.
fn owner(pid: i32) -> Owner {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Owner::Gone;
    };
    Owner::Running(start_time(&stat))
}

fn start_time(stat: &str) -> Option<SystemTime> {
    // The command name may contain spaces and parentheses: fields are
    // counted after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    let since_boot = Duration::from_millis(ticks.checked_mul(1000)? / hz);
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(btime) + since_boot)
}

/// Whether any process is still in the cgroup at `path` (v2: itself or
/// below; v1: its own list). A dead run's cgroup is empty: the sandbox
/// init dies with its supervisor and takes its PID namespace along. A
/// populated one may be a live run whose supervisor we cannot see (another
/// PID namespace sharing this cgroup tree), so it is never touched.
fn has_members(path: &Path) -> bool {
    if path.join("cgroup.events").exists() {
        return crate::cgroup::is_populated(path);
    }
    std::fs::read_to_string(path.join("cgroup.procs")).map_or(true, |l| !l.trim().is_empty())
}

/// Removes every leftover run cgroup directly under `parent`;
/// returns the removed paths.
pub fn sweep(parent: &Path) -> Vec<PathBuf> {
    leftovers(parent, true)
}

/// The leftover run cgroups directly under `parent`, removed if `remove`.
fn leftovers(parent: &Path, remove: bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        let path = entry.path();
        let Ok(created) = std::fs::symlink_metadata(&path).and_then(|m| m.modified()) else {
            continue;
        };
        if !is_debris(owner(pid), created) || has_members(&path) {
            continue;
        }
        if !remove {
            found.push(path);
            continue;
        }
        let gone = if path.join("cgroup.events").exists() {
            crate::cgroup::kill_and_remove(&path, REMOVE_TIMEOUT).is_ok()
        } else {
            crate::cgroup::remove_v1(&path, REMOVE_TIMEOUT);
            !path.exists()
        };
        if gone {
            found.push(path);
        }
    }
    found
}

/// The parents a run of this process creates its cgroups in: its own v2
/// cgroup and its own cgroup in the v1 pids and memory hierarchies.
pub fn own_parents() -> Vec<PathBuf> {
    let mut parents: Vec<PathBuf> = crate::cgroup::own_v2_dir().into_iter().collect();
    let own = crate::cgroup::own_cgroups();
    for controller in ["pids", "memory"] {
        if let Some(crate::cgroup::Controller::V1(mount)) =
            crate::cgroup::find_controller(controller)
        {
            let path = crate::cgroup::own_v1_path(&own, controller).unwrap_or_default();
            parents.push(mount.join(path));
        }
    }
    parents.sort();
    parents.dedup();
    parents
}

/// The cheap sweep at the start of a run.
pub fn sweep_own() -> Vec<PathBuf> {
    own_parents().iter().flat_map(|p| sweep(p)).collect()
}

/// Every cgroup directory of the v2 tree and of the v1 pids and memory
/// hierarchies, down to `depth` levels, skipping run cgroups themselves
/// (nothing of ours lives inside one).
pub fn all_parents(depth: usize) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = crate::cgroup::v2_mount().into_iter().collect();
    for controller in ["pids", "memory"] {
        if let Some(crate::cgroup::Controller::V1(mount)) =
            crate::cgroup::find_controller(controller)
        {
            roots.push(mount);
        }
    }
    let mut out = Vec::new();
    let mut stack: Vec<(PathBuf, usize)> = roots.into_iter().map(|r| (r, 0)).collect();
    while let Some((dir, level)) = stack.pop() {
        if level < depth
            && let Ok(entries) = std::fs::read_dir(&dir)
        {
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                let ours = entry.file_name().to_str().and_then(owner_pid).is_some();
                if is_dir && !ours {
                    stack.push((entry.path(), level + 1));
                }
            }
        }
        out.push(dir);
    }
    out.sort();
    out.dedup();
    out
}

/// `tartaros doctor --clean`: sweeps every hierarchy; returns what it
/// removed.
pub fn sweep_all() -> Vec<PathBuf> {
    all_parents(SEARCH_DEPTH)
        .iter()
        .flat_map(|p| sweep(p))
        .collect()
}

/// `tartaros doctor`: the leftovers a `--clean` would remove.
pub fn find_all() -> Vec<PathBuf> {
    all_parents(SEARCH_DEPTH)
        .iter()
        .flat_map(|p| leftovers(p, false))
        .collect()
}

/// How deep `doctor` looks for leftovers in each hierarchy.
const SEARCH_DEPTH: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_run_names_have_an_owner() {
        assert_eq!(owner_pid("tartaros-123-456789"), Some(123));
        for name in [
            "tartaros-lab",
            "tartaros-test-1-2",
            "tartaros-123",
            "tartaros--1",
            "tartaros-0-1",
            "tartaros-12a-3",
            "tartaros-1-2-3",
            "xtartaros-1-2",
            "tartaros-99999999999-1",
        ] {
            assert_eq!(owner_pid(name), None, "{name}");
        }
    }

    #[test]
    fn a_live_owner_keeps_its_cgroup_and_a_reused_pid_does_not() {
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(is_debris(Owner::Gone, created));
        // The supervisor started before it created the cgroup: a live run.
        let before = created - Duration::from_secs(30);
        assert!(!is_debris(Owner::Running(Some(before)), created));
        // Within the clock slack: still taken as the creator.
        let just_after = created + Duration::from_secs(1);
        assert!(!is_debris(Owner::Running(Some(just_after)), created));
        // The pid belongs to a process that started later: reused.
        let later = created + Duration::from_secs(60);
        assert!(is_debris(Owner::Running(Some(later)), created));
        // Unknown start: kept.
        assert!(!is_debris(Owner::Running(None), created));
    }

    #[test]
    fn this_process_started_in_the_past() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let started = start_time(&stat).unwrap();
        assert!(started <= SystemTime::now() + CLOCK_SLACK);
        assert_eq!(owner(i32::MAX), Owner::Gone);
    }
}
