//! What this host can enforce, and which of the policy's guarantees that
//! covers. `--strict` refuses a run with any guarantee missing; otherwise
//! each missing one is a warning (and a `degraded` entry in the log).

use std::path::PathBuf;

use crate::policy::Policy;

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
        }
    }
}

/// Whether the run attaches eBPF programs (see [`guarantees`]): for the
/// log, for transparent interception, and, whenever we are root, for the
/// unix socket policy.
pub fn wants_bpf(policy: &Policy, capture: bool, root: bool) -> bool {
    capture || !policy.allow_domains.is_empty() || (root && !policy.deny_unix)
}

/// What keeps the host's unix sockets away from an agent without the eBPF
/// unix policy (no root): said by `doctor` and in the log's genesis.
pub const UNIX_WITHOUT_BPF: &str = "without root (no eBPF unix policy) only the host's unix sockets listening at the start are hidden; sockets bound later, or listed only in another network namespace, stay reachable by path; run as root, or pass --deny-unix to refuse every unix socket";

/// Whether a kernel release string (`6.18.44-...`) is at least `major.minor`.
pub fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

/// One promise the run makes, and whether this host keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guarantee {
    pub name: &'static str,
    pub installed: bool,
    /// Why it is missing and how to get it.
    pub reason: String,
}

/// Decides which guarantees `policy` requests and which `host` can install.
pub fn guarantees(policy: &Policy, host: &Host, capture: bool) -> Vec<Guarantee> {
    let mut out = Vec::new();
    let mut add = |name, installed: bool, reason: &str| {
        out.push(Guarantee {
            name,
            installed,
            reason: if installed {
                String::new()
            } else {
                reason.to_string()
            },
        })
    };
    add(
        "namespaces",
        host.root || host.user_namespaces,
        "PID, mount, IPC, UTS and network namespaces need root or unprivileged user namespaces (sysctl user.max_user_namespaces > 0)",
    );
    let cgroup = host.cgroup_v2.is_some() && host.cgroup_v2_writable;
    add(
        "cgroup",
        cgroup,
        "no writable cgroup v2 directory (run as root, or delegate a cgroup subtree to this user, e.g. systemd-run --user --scope -p Delegate=yes); without it the PID namespace still ends every process with the run",
    );
    add(
        "landlock-filesystem",
        host.landlock_abi
            .is_some_and(|abi| abi >= crate::landlock::MIN_FULL_ABI),
        "Landlock ABI 3 or newer is needed to confine writes (Linux 6.2+ with lsm=landlock)",
    );
    let scoped = host.landlock_abi.is_some_and(|abi| abi >= 6);
    add(
        "landlock-scope",
        scoped,
        "Landlock ABI 6 (Linux 6.12+) is needed to keep signals and abstract unix sockets inside the sandbox",
    );
    add(
        "seccomp",
        host.seccomp,
        "seccomp filtering is not available in this kernel",
    );
    if policy.has_network_grant() {
        add(
            "gateways",
            host.root,
            "--port, --allow-domain and [broker] listen inside the sandbox's network namespace, which needs root",
        );
    }
    if policy.max_processes.is_some() {
        add(
            "max-procs",
            cgroup
                && crate::cgroup::find_controller("pids")
                    .is_some_and(|c| host.root || c == crate::cgroup::Controller::V2),
            "no pids cgroup controller (v2 or v1) is available to enforce --max-procs",
        );
    }
    if policy.max_memory.is_some() {
        add(
            "max-memory",
            cgroup
                && crate::cgroup::find_controller("memory")
                    .is_some_and(|c| host.root || c == crate::cgroup::Controller::V2),
            "no memory cgroup controller (v2 or v1) is available to enforce --max-memory",
        );
    }
    let denies = !policy.read_denies.is_empty() || !policy.write_denies.is_empty();
    if denies {
        add(
            "deny-mounts",
            host.root || host.user_namespaces,
            "read and write denies need a private mount namespace (root or user namespaces)",
        );
    }
    // eBPF needs CAP_BPF (root here) and the run's own cgroup. It is
    // attached when it adds something the namespaces do not give: the
    // record of every attempt (--log), transparent interception
    // (--allow-domain), and, whenever we are root, the unix socket policy:
    // pathname sockets are not namespaced, so only a check at connect
    // keeps every host socket outside the roots away, whenever it appears.
    let bpf = host.root && cgroup;
    if !host.root && !policy.deny_unix {
        add("unix-socket-policy", false, UNIX_WITHOUT_BPF);
    }
    if !wants_bpf(policy, capture, host.root) {
        return out;
    }
    add(
        "connect-filter",
        bpf,
        "the eBPF connect filter needs root (CAP_BPF) and the run's cgroup; the private network namespace still has no way out but the gateways",
    );
    if !policy.deny_unix && host.root {
        add(
            "unix-socket-policy",
            bpf && kernel_at_least(&host.kernel, 6, 7),
            "keeping unix sockets outside the writable roots unreachable needs root and Linux 6.7+ (cgroup connect_unix); pass --deny-unix to refuse every unix socket instead",
        );
    }
    if capture {
        add(
            "ebpf-capture",
            bpf,
            "capturing the agent's execs, file changes and connects for the log needs root (CAP_BPF) and the run's cgroup",
        );
    }
    out
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

    #[test]
    fn the_unix_policy_is_attached_whenever_root_and_said_missing_otherwise() {
        let root = Host {
            root: true,
            cgroup_v2: Some("/sys/fs/cgroup".into()),
            cgroup_v2_writable: true,
            kernel: "6.18.0".into(),
            ..Default::default()
        };
        let policy = Policy::default();
        assert!(wants_bpf(&policy, false, true));
        let g = guarantees(&policy, &root, false);
        assert!(
            g.iter()
                .any(|g| g.name == "unix-socket-policy" && g.installed)
        );
        let user = Host {
            root: false,
            user_namespaces: true,
            ..root.clone()
        };
        assert!(!wants_bpf(&policy, false, false));
        let g = guarantees(&policy, &user, false);
        let unix = g.iter().find(|g| g.name == "unix-socket-policy").unwrap();
        assert!(!unix.installed && unix.reason.contains("listening at the start"));
        let deny_unix = Policy {
            deny_unix: true,
            ..Default::default()
        };
        assert!(!wants_bpf(&deny_unix, false, true));
        assert!(
            !guarantees(&deny_unix, &user, false)
                .iter()
                .any(|g| g.name == "unix-socket-policy")
        );
    }

    #[test]
    fn missing_landlock_is_a_missing_guarantee() {
        let host = Host {
            root: true,
            seccomp: true,
            cgroup_v2: Some("/sys/fs/cgroup".into()),
            cgroup_v2_writable: true,
            landlock_abi: Some(2),
            ..Default::default()
        };
        let g = guarantees(&Policy::default(), &host, false);
        let fs = g.iter().find(|g| g.name == "landlock-filesystem").unwrap();
        assert!(!fs.installed);
        assert!(fs.reason.contains("ABI 3"));
        assert!(g.iter().find(|g| g.name == "seccomp").unwrap().installed);
    }
}
