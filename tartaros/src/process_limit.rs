//! What to say when a fork, `clone3` or thread fails with EAGAIN: the
//! launcher ran into its process limit (a pids cgroup's `pids.max`, or
//! `ulimit -u`), not into an old kernel (adversarial round 22: a launcher
//! in a cgroup of `pids.max=4` was told the kernel must be 5.7 or newer).

use std::path::{Path, PathBuf};

/// The hint after a failed `clone3` of the sandbox init: the process
/// limit for EAGAIN, else the kernel the call needs.
pub fn clone_hint(errno: nix::Error) -> String {
    if errno == nix::errno::Errno::EAGAIN {
        reached()
    } else {
        "the kernel must be 5.7 or newer with cgroup v2".to_owned()
    }
}

/// The hint after a fork or thread that failed with `errno`: the process
/// limit for EAGAIN, else nothing to add.
pub fn hint(errno: nix::Error) -> String {
    if errno == nix::errno::Errno::EAGAIN {
        format!("; {}", reached())
    } else {
        String::new()
    }
}

/// The same where the launcher's cgroup cannot be read (the sandbox init,
/// in its own cgroup namespace and mount tree).
pub fn plain_hint(errno: nix::Error) -> String {
    if errno == nix::errno::Errno::EAGAIN {
        format!("; {UNNAMED}")
    } else {
        String::new()
    }
}

const UNNAMED: &str =
    "the process limit was reached (EAGAIN): raise pids.max of the launcher's cgroup or ulimit -u";

/// The same for a thread that `std::thread::Builder::spawn` failed to start.
pub fn thread_hint(error: &std::io::Error) -> String {
    hint(nix::errno::Errno::from_raw(
        error.raw_os_error().unwrap_or(0),
    ))
}

/// Names the limit that was reached, as far as it can be read.
pub fn reached() -> String {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    match lowest_pids_max(&cgroup) {
        Some((max, file)) => format!(
            "the launcher's cgroup allows {max} processes ({}); raise it (or start \
             tartaros outside that cgroup)",
            file.display()
        ),
        None => UNNAMED.to_owned(),
    }
}

/// The lowest numeric `pids.max` of the launcher's pids cgroup and its
/// ancestors (a limit set on a parent applies too), with its file.
fn lowest_pids_max(proc_cgroup: &str) -> Option<(u64, PathBuf)> {
    candidates(proc_cgroup)
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).ok()?;
            Some((text.trim().parse::<u64>().ok()?, file))
        })
        .min_by_key(|(max, _)| *max)
}

/// The `pids.max` files that may limit us: the v1 `pids` hierarchy's, and
/// the v2 one's, from our cgroup up to the top.
fn candidates(proc_cgroup: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = match (fields.next(), fields.next(), fields.next()) {
            (Some(id), Some(c), Some(p)) => (id, c, p),
            _ => continue,
        };
        let mounts: &[&str] = if controllers.split(',').any(|c| c == "pids") {
            &["/sys/fs/cgroup/pids"]
        } else if controllers.is_empty() {
            &["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        } else {
            continue;
        };
        for mount in mounts {
            let mut dir = Path::new(mount).join(path.trim_start_matches('/'));
            loop {
                files.push(dir.join("pids.max"));
                if Path::new(mount) == dir || !dir.pop() {
                    break;
                }
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eagain_names_the_process_limit_and_other_errors_the_kernel() {
        let eagain = clone_hint(nix::errno::Errno::EAGAIN);
        assert!(eagain.contains("processes") || eagain.contains("process limit"));
        assert!(!eagain.contains("kernel"));
        assert!(clone_hint(nix::errno::Errno::ENOSYS).contains("5.7"));
        assert_eq!(hint(nix::errno::Errno::EPERM), "");
    }

    #[test]
    fn both_hierarchies_are_searched_up_to_their_top() {
        let files = candidates("12:pids:/a/b\n0::/c\n3:memory:/m\n");
        let has = |p: &str| files.contains(&PathBuf::from(p));
        assert!(has("/sys/fs/cgroup/pids/a/b/pids.max"));
        assert!(has("/sys/fs/cgroup/pids/a/pids.max"));
        assert!(has("/sys/fs/cgroup/pids/pids.max"));
        assert!(has("/sys/fs/cgroup/c/pids.max"));
        assert!(!files.iter().any(|f| f.starts_with("/sys/fs/cgroup/m")));
    }
}
