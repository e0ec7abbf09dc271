//! The guarantee ledger: every promise a run makes, whether this host keeps
//! it, and the one place where "cannot install X" becomes a refusal or a
//! warning plus a `degraded` entry in the log's genesis.
//!
//! [`requested`] decides (pure, from the policy and the host facts) which
//! guarantees a run asks for and which the host can install; the run's
//! stages call [`Ledger::lose`] when one fails while it is carried out.

use crate::exit::{self, Refusal};
use crate::host_facts::{Host, kernel_at_least};
use crate::policy::Policy;

/// One promise a run can make. Its name is what the genesis and the
/// warnings call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guarantee {
    Namespaces,
    Cgroup,
    LandlockFilesystem,
    LandlockScope,
    Seccomp,
    Gateways,
    MaxProcs,
    MaxMemory,
    DenyMounts,
    ConnectFilter,
    UnixSocketPolicy,
    EbpfCapture,
    TransparentInterception,
}

impl Guarantee {
    pub fn name(self) -> &'static str {
        match self {
            Self::Namespaces => "namespaces",
            Self::Cgroup => "cgroup",
            Self::LandlockFilesystem => "landlock-filesystem",
            Self::LandlockScope => "landlock-scope",
            Self::Seccomp => "seccomp",
            Self::Gateways => "gateways",
            Self::MaxProcs => "max-procs",
            Self::MaxMemory => "max-memory",
            Self::DenyMounts => "deny-mounts",
            Self::ConnectFilter => "connect-filter",
            Self::UnixSocketPolicy => "unix-socket-policy",
            Self::EbpfCapture => "ebpf-capture",
            Self::TransparentInterception => "transparent-interception",
        }
    }

    /// Requirements no run may go without, `--strict` or not: without the
    /// namespaces there is no sandbox at all.
    fn always_hard(self) -> bool {
        matches!(self, Self::Namespaces)
    }
}

/// A guarantee and whether it holds; `reason` says why not and how to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub guarantee: Guarantee,
    pub installed: bool,
    pub reason: String,
}

/// The guarantees of one run. Best effort unless the run is strict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    entries: Vec<Entry>,
    strict: bool,
    /// Warnings not yet printed, in the order they arose.
    warnings: Vec<String>,
}

impl Ledger {
    pub fn new(strict: bool) -> Self {
        Self {
            strict,
            ..Self::default()
        }
    }

    /// Records that the run asks for `guarantee` and whether the host can
    /// install it (`Err(reason)` if not). A missing one is settled at once.
    pub fn request(
        &mut self,
        guarantee: Guarantee,
        can: Result<(), String>,
    ) -> Result<(), Refusal> {
        self.entries.push(Entry {
            guarantee,
            installed: true,
            reason: String::new(),
        });
        match can {
            Ok(()) => Ok(()),
            Err(why) => self.lose(guarantee, why),
        }
    }

    /// The one place a guarantee that cannot be installed is judged: a
    /// hard requirement refuses the run (exit 78); a best-effort one is
    /// marked degraded (the genesis lists it) with a warning. Losing a
    /// guarantee the run did not ask for does nothing.
    pub fn lose(
        &mut self,
        guarantee: Guarantee,
        why: impl std::fmt::Display,
    ) -> Result<(), Refusal> {
        let why = why.to_string();
        if self.strict || guarantee.always_hard() {
            return Err(Refusal::new(
                exit::REFUSED,
                format!("cannot install {}: {why}", guarantee.name()),
            ));
        }
        let Some(entry) = self
            .entries
            .iter_mut()
            .find(|e| e.guarantee == guarantee && e.installed)
        else {
            return Ok(());
        };
        entry.installed = false;
        entry.reason.clone_from(&why);
        self.warnings
            .push(format!("{} not installed: {why}", guarantee.name()));
        Ok(())
    }

    /// A warning about the run that is not a guarantee of its own.
    pub fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }

    pub fn installed(&self, guarantee: Guarantee) -> bool {
        self.entries
            .iter()
            .any(|e| e.guarantee == guarantee && e.installed)
    }

    pub fn requested(&self, guarantee: Guarantee) -> bool {
        self.entries.iter().any(|e| e.guarantee == guarantee)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Names for the genesis: installed (`true`) or degraded (`false`).
    pub fn names(&self, installed: bool) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| e.installed == installed)
            .map(|e| e.guarantee.name().to_string())
            .collect()
    }

    /// The warnings gathered since the last call, to print.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// Prints the ledger's pending warnings on stderr (`--quiet` silences
/// them).
pub fn print_warnings(ledger: &mut Ledger) {
    for warning in ledger.take_warnings() {
        crate::tt_warn!("{warning}");
    }
}

/// Whether the run attaches eBPF programs: for the record of every attempt
/// (`--log`), transparent interception (`--allow-domain`) and, whenever we
/// are root, the unix socket policy: pathname sockets are not namespaced,
/// so only a check at connect keeps every host socket outside the roots
/// away, whenever it appears.
pub fn wants_bpf(policy: &Policy, capture: bool, root: bool) -> bool {
    capture || !policy.allow_domains.is_empty() || (root && !policy.deny_unix)
}

/// Whether the agent's tasks are bounded without a pids cgroup: an
/// unprivileged run puts the agent in a user namespace of its own, where
/// RLIMIT_NPROC counts only the run's tasks (the kernel counts a uid's tasks
/// per user namespace, and no cap of the agent's lifts the limit). Root runs
/// have no such namespace: there the uid's count is host-wide.
pub fn tasks_by_rlimit(host: &Host) -> bool {
    !host.root && host.user_namespaces
}

/// Decides which guarantees `policy` requests and which `host` can install,
/// and settles the missing ones (refusal or degraded). Pure.
pub fn requested(policy: &Policy, host: &Host, capture: bool) -> Result<Ledger, Refusal> {
    let mut ledger = Ledger::new(policy.strict);
    let check = |ok: bool, why: &str| if ok { Ok(()) } else { Err(why.to_string()) };
    ledger.request(
        Guarantee::Namespaces,
        check(
            host.root || host.user_namespaces,
            "PID, mount, IPC, UTS and network namespaces need root or unprivileged user namespaces (sysctl user.max_user_namespaces > 0)",
        ),
    )?;
    let cgroup = host.cgroup_v2.is_some() && host.cgroup_v2_writable;
    ledger.request(
        Guarantee::Cgroup,
        check(
            cgroup,
            "no writable cgroup v2 directory (run as root, or delegate a cgroup subtree to this user, e.g. systemd-run --user --scope -p Delegate=yes); without it the PID namespace still ends every process with the run",
        ),
    )?;
    ledger.request(
        Guarantee::LandlockFilesystem,
        check(
            host.landlock_abi
                .is_some_and(|abi| abi >= crate::landlock::MIN_FULL_ABI),
            "Landlock ABI 3 or newer is needed to confine writes (Linux 6.2+ with lsm=landlock)",
        ),
    )?;
    ledger.request(
        Guarantee::LandlockScope,
        check(
            host.landlock_abi.is_some_and(|abi| abi >= 6),
            "Landlock ABI 6 (Linux 6.12+) is needed to keep signals and abstract unix sockets inside the sandbox",
        ),
    )?;
    ledger.request(
        Guarantee::Seccomp,
        check(
            host.seccomp,
            "seccomp filtering is not available in this kernel",
        ),
    )?;
    if policy.has_network_grant() {
        ledger.request(
            Guarantee::Gateways,
            check(
                host.root || host.user_namespaces,
                "--port, --allow-domain and [broker] listen inside the sandbox's network namespace, which needs root or unprivileged user namespaces",
            ),
        )?;
    }
    let controller = |name: &str| {
        cgroup
            && host
                .controllers
                .iter()
                .any(|(c, v2)| c == name && (host.root || *v2))
    };
    if policy.max_processes.is_some() {
        ledger.request(
            Guarantee::MaxProcs,
            check(
                controller("pids") || tasks_by_rlimit(host),
                "no pids cgroup controller (v2 or v1) is available to enforce --max-procs",
            ),
        )?;
    }
    if policy.max_memory.is_some() {
        ledger.request(
            Guarantee::MaxMemory,
            check(
                controller("memory"),
                "no memory cgroup controller (v2 or v1) is available to enforce --max-memory",
            ),
        )?;
    }
    if !policy.read_denies.is_empty() || !policy.write_denies.is_empty() {
        ledger.request(
            Guarantee::DenyMounts,
            check(
                host.root || host.user_namespaces,
                "read and write denies need a private mount namespace (root or user namespaces)",
            ),
        )?;
    }
    if !host.root && !policy.deny_unix {
        ledger.request(
            Guarantee::UnixSocketPolicy,
            Err(crate::host_facts::UNIX_WITHOUT_BPF.to_string()),
        )?;
    }
    if !wants_bpf(policy, capture, host.root) {
        return Ok(ledger);
    }
    // eBPF needs CAP_BPF (root here) and the run's own cgroup. The connect
    // filter records every attempt (--log) and sends TCP to the
    // transparent proxy (--allow-domain); a run with neither gets the unix
    // policy alone.
    let bpf = host.root && cgroup;
    if capture || !policy.allow_domains.is_empty() {
        ledger.request(
            Guarantee::ConnectFilter,
            check(
                bpf,
                "the eBPF connect filter needs root (CAP_BPF) and the run's cgroup; the private network namespace still has no way out but the gateways",
            ),
        )?;
    }
    if !policy.deny_unix && host.root {
        ledger.request(
            Guarantee::UnixSocketPolicy,
            check(
                bpf && kernel_at_least(&host.kernel, 6, 7),
                "keeping unix sockets outside the writable roots unreachable needs root and Linux 6.7+ (cgroup connect_unix); pass --deny-unix to refuse every unix socket instead",
            ),
        )?;
    }
    if capture {
        ledger.request(
            Guarantee::EbpfCapture,
            check(
                bpf,
                "capturing the agent's execs, file changes and connects for the log needs root (CAP_BPF) and the run's cgroup",
            ),
        )?;
    }
    if !policy.allow_domains.is_empty() {
        ledger.request(
            Guarantee::TransparentInterception,
            check(
                bpf,
                "sending tools that ignore HTTP(S)_PROXY to the proxy needs the eBPF connect programs (root); such tools get no route out instead",
            ),
        )?;
    }
    Ok(ledger)
}

/// Every guarantee `policy` asks for that `host` cannot install, with why
/// and how to get it (for `doctor`): judged best effort, so that all are
/// listed, the namespaces' hard refusal included.
pub fn missing(policy: &Policy, host: &Host, capture: bool) -> Vec<(&'static str, String)> {
    let lenient = Policy {
        strict: false,
        ..policy.clone()
    };
    match requested(&lenient, host, capture) {
        Ok(ledger) => ledger
            .entries()
            .iter()
            .filter(|e| !e.installed)
            .map(|e| (e.guarantee.name(), e.reason.clone()))
            .collect(),
        Err(refusal) => vec![(Guarantee::Namespaces.name(), refusal.message)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_host() -> Host {
        Host {
            root: true,
            seccomp: true,
            user_namespaces: true,
            cgroup_v2: Some("/sys/fs/cgroup".into()),
            cgroup_v2_writable: true,
            landlock_abi: Some(7),
            kernel: "6.18.0".into(),
            controllers: vec![("pids".into(), false), ("memory".into(), false)],
            ..Default::default()
        }
    }

    #[test]
    fn missing_landlock_is_degraded_with_its_reason() {
        let host = Host {
            landlock_abi: Some(2),
            ..root_host()
        };
        let mut ledger = requested(&Policy::default(), &host, false).unwrap();
        assert!(!ledger.installed(Guarantee::LandlockFilesystem));
        assert!(ledger.installed(Guarantee::Seccomp));
        let entry = ledger
            .entries()
            .iter()
            .find(|e| e.guarantee == Guarantee::LandlockFilesystem)
            .unwrap();
        assert!(entry.reason.contains("ABI 3"));
        assert_eq!(
            ledger.names(false),
            vec!["landlock-filesystem", "landlock-scope"]
        );
        let warnings = ledger.take_warnings();
        assert_eq!(warnings.len(), 2);
        assert!(warnings[0].starts_with("landlock-filesystem not installed: "));
        assert!(ledger.take_warnings().is_empty());
    }

    #[test]
    fn strict_refuses_what_is_missing() {
        let host = Host {
            landlock_abi: None,
            ..root_host()
        };
        let policy = Policy {
            strict: true,
            ..Policy::default()
        };
        let refusal = requested(&policy, &host, false).unwrap_err();
        assert_eq!(refusal.code, exit::REFUSED);
        assert!(
            refusal
                .message
                .starts_with("cannot install landlock-filesystem: ")
        );
    }

    #[test]
    fn namespaces_are_always_hard() {
        let host = Host {
            root: false,
            user_namespaces: false,
            ..root_host()
        };
        let refusal = requested(&Policy::default(), &host, false).unwrap_err();
        assert!(refusal.message.starts_with("cannot install namespaces: "));
    }

    #[test]
    fn an_ordinary_user_degrades_capture_and_limits() {
        let host = Host {
            root: false,
            cgroup_v2_writable: false,
            ..root_host()
        };
        let policy = Policy {
            max_processes: Some(10),
            ..Policy::default()
        };
        let ledger = requested(&policy, &host, true).unwrap();
        // Tasks are bounded by the agent's user namespace instead.
        assert!(ledger.installed(Guarantee::MaxProcs));
        for g in [
            Guarantee::Cgroup,
            Guarantee::ConnectFilter,
            Guarantee::UnixSocketPolicy,
            Guarantee::EbpfCapture,
        ] {
            assert!(ledger.requested(g), "{g:?}");
            assert!(!ledger.installed(g), "{g:?}");
        }
    }

    #[test]
    fn a_v1_controller_is_usable_by_root_only() {
        let policy = Policy {
            max_memory: Some(1 << 30),
            ..Policy::default()
        };
        assert!(
            requested(&policy, &root_host(), false)
                .unwrap()
                .installed(Guarantee::MaxMemory)
        );
        let delegated = Host {
            root: false,
            ..root_host()
        };
        assert!(
            !requested(&policy, &delegated, false)
                .unwrap()
                .installed(Guarantee::MaxMemory)
        );
    }

    #[test]
    fn losing_at_run_time_degrades_once_and_ignores_the_unasked() {
        let policy = Policy {
            allow_domains: vec!["example.org".into()],
            ..Policy::default()
        };
        let mut ledger = requested(&policy, &root_host(), false).unwrap();
        assert!(ledger.installed(Guarantee::TransparentInterception));
        ledger
            .lose(Guarantee::TransparentInterception, "no program")
            .unwrap();
        ledger
            .lose(Guarantee::TransparentInterception, "again")
            .unwrap();
        ledger.lose(Guarantee::EbpfCapture, "not asked").unwrap();
        assert_eq!(ledger.names(false), vec!["transparent-interception"]);
        assert_eq!(ledger.take_warnings().len(), 1);
    }

    #[test]
    fn root_always_attaches_the_unix_policy_and_nothing_more() {
        let ledger = requested(&Policy::default(), &root_host(), false).unwrap();
        assert!(ledger.installed(Guarantee::UnixSocketPolicy));
        assert!(!ledger.requested(Guarantee::ConnectFilter));
        assert!(!ledger.requested(Guarantee::EbpfCapture));
        let deny_unix = Policy {
            deny_unix: true,
            ..Policy::default()
        };
        let ledger = requested(&deny_unix, &root_host(), false).unwrap();
        assert!(!ledger.requested(Guarantee::ConnectFilter));
        assert!(!ledger.requested(Guarantee::UnixSocketPolicy));
    }

    #[test]
    fn without_root_the_unix_policy_is_said_missing() {
        let host = Host {
            root: false,
            ..root_host()
        };
        let ledger = requested(&Policy::default(), &host, false).unwrap();
        let unix = ledger
            .entries()
            .iter()
            .find(|e| e.guarantee == Guarantee::UnixSocketPolicy)
            .unwrap();
        assert!(!unix.installed && unix.reason.contains("listening at the start"));
    }
}
