//! What this host can enforce, read once per run. Which guarantees that
//! covers is decided in `guarantee.rs`, from these facts alone.

use std::path::PathBuf;

/// The host's abilities, probed once per run (cheap: a few syscalls and
/// file reads).
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub landlock_abi: Option<i32>,
    pub seccomp: bool,
    pub user_namespaces: bool,
    pub cgroup_v2: Option<PathBuf>,
    /// Whether we may create a child of our own v2 cgroup (root, or a
    /// delegated subtree such as a systemd user slice).
    pub cgroup_v2_writable: bool,
    pub cgroup_kill: bool,
    pub root: bool,
    pub kernel: String,
    /// The `pids` and `memory` controllers found, and whether each is in
    /// the v2 tree (`true`) or a v1 hierarchy (`false`).
    pub controllers: Vec<(String, bool)>,
    /// The host's per-user limits (`user_counts::host`).
    pub user_counts: Option<crate::user_counts::UserCounts>,
}

impl Host {
    pub fn probe() -> Self {
        let cgroup_v2 = crate::cgroup::v2_mount();
        let cgroup_v2_writable = crate::cgroup::own_v2_dir()
            .is_some_and(|dir| nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok());
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        // cgroup.kill exists in every non-root cgroup since Linux 5.14.
        let cgroup_kill = cgroup_v2.is_some() && kernel_at_least(&kernel, 5, 14);
        Self {
            landlock_abi: crate::landlock::host_abi(),
            // SAFETY: PR_GET_SECCOMP takes no memory.
            seccomp: unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0,
            user_namespaces: std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0),
            cgroup_v2,
            cgroup_v2_writable,
            cgroup_kill,
            root: nix::unistd::geteuid().is_root(),
            kernel,
            controllers: ["pids", "memory"]
                .into_iter()
                .filter_map(|name| {
                    let found = crate::cgroup::find_controller(name)?;
                    Some((name.to_string(), found == crate::cgroup::Controller::V2))
                })
                .collect(),
            user_counts: crate::user_counts::host(),
        }
    }
}

/// What keeps the host's unix sockets away from an agent without the eBPF
/// unix policy (no root): said by `doctor` and in the log's genesis.
pub const UNIX_WITHOUT_BPF: &str = "without root (no eBPF unix policy) only the host's unix sockets listening at the start are hidden; sockets bound later, or listed only in another network namespace, stay reachable by path; run as root (or through tartaros service), or pass --deny-unix to refuse every unix socket";

/// Whether a kernel release string (`6.18.44-...`) is at least `major.minor`.
pub fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least("6.18.44-fc-v669", 5, 14));
        assert!(!kernel_at_least("5.10.0", 5, 14));
        assert!(kernel_at_least("5.14", 5, 14));
    }
}
