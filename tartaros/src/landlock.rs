//! Landlock: filesystem access rules (and, where the ABI has it, scoping of
//! signals and abstract unix sockets to the sandbox).
//!
//! [`plan`] decides the rules from the policy (pure, unit-tested); [`prepare`]
//! opens the paths while the init is still root and [`Prepared::enforce`]
//! installs them in the agent process right before seccomp and `execve`.
//! Landlock only ever grants, so denies inside granted trees are the mount
//! namespace's job (see `mounts.rs`).

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

use crate::policy::{GRANTED_SYSTEM_DIRS, Policy, ReadScope};

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("failed to build the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("failed to open {path} for a Landlock rule: {source}")]
    Open {
        path: PathBuf,
        source: landlock::PathFdError,
    },
    #[error(
        "failed to enforce Landlock fully (status {0:?}); this kernel lacks the ABI the policy needs — run without --strict to degrade"
    )]
    NotEnforced(String),
}

/// The lowest ABI that confines writes completely: ABI 3 adds truncate,
/// without which a read-only file could still be emptied.
pub const MIN_FULL_ABI: i32 = 3;

/// Device nodes every program expects to write: a shell redirect to
/// /dev/null must not fail because the agent has no writable root there.
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The decided rules, carried to the sandbox init inside the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Landlock ABI to use (the host's, as probed by the supervisor).
    pub abi: i32,
    /// Hierarchies the agent may read and execute.
    pub read: Vec<PathBuf>,
    /// Hierarchies the agent may read, write, create in and delete from.
    pub write: Vec<PathBuf>,
    /// Device nodes the agent may open for writing.
    pub devices: Vec<PathBuf>,
    /// Hierarchies the agent may read but not execute from
    /// (`read_allows` under `read_scope = "none"`).
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
}

/// Decides the rules for `policy` on a host with Landlock ABI `abi`.
pub fn plan(policy: &Policy, abi: i32) -> LandlockPlan {
    let mut write: Vec<PathBuf> = policy.writable_roots.clone();
    if policy.private_tmp {
        write.push(PathBuf::from("/tmp"));
    }
    // The sandbox's own /dev/shm (see devfs.rs): POSIX shared memory and
    // semaphores, gone with the run.
    write.push(PathBuf::from("/dev/shm"));
    write.extend(policy.tmpfs.iter().cloned());
    let named = || {
        policy
            .exec_allows
            .iter()
            .chain(policy.binds.iter().map(|b| &b.target))
            .chain(write.iter())
            .cloned()
    };
    let (read, read_only) = match policy.read_scope {
        ReadScope::All => (vec![PathBuf::from("/")], Vec::new()),
        ReadScope::Granted => (
            GRANTED_SYSTEM_DIRS
                .iter()
                .map(PathBuf::from)
                .chain(policy.read_allows.iter().cloned())
                .chain(named())
                .collect(),
            Vec::new(),
        ),
        ReadScope::None => (named().collect(), policy.read_allows.clone()),
    };
    LandlockPlan {
        abi,
        read,
        write,
        devices: WRITABLE_DEVICES.iter().map(PathBuf::from).collect(),
        read_only,
    }
}

/// Reads the host's Landlock ABI version; `None` when Landlock is not
/// built in or not enabled.
pub fn host_abi() -> Option<i32> {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute and zero
    // size only queries the version; it touches no memory of ours.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (version > 0).then_some(version as i32)
}

/// What [`Prepared::enforce`] managed to install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    Partial,
    None,
}

/// A ruleset whose paths are already opened. Opening happens while the init
/// is still root, so that granted directories the agent's uid cannot
/// traverse are still found; enforcing happens after privileges are dropped.
pub struct Prepared {
    ruleset: landlock::RulesetCreated,
    required: bool,
}

/// Opens every granted path and builds the ruleset. With `required`,
/// anything short of full enforcement is an error, so the agent never runs
/// under a weaker wall than the one promised.
pub fn prepare(plan: &LandlockPlan, required: bool) -> Result<Prepared, LandlockError> {
    let abi = ABI::from(plan.abi);
    let level = if required {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let read = AccessFs::from_read(abi) | AccessFs::IoctlDev;
    let device = read | AccessFs::WriteFile | AccessFs::Truncate;
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))?;
    if plan.abi >= 6 {
        ruleset = ruleset.scope(Scope::Signal | Scope::AbstractUnixSocket)?;
    }
    let mut created = ruleset.create()?.no_new_privs(true);
    let read_only = AccessFs::ReadFile | AccessFs::ReadDir;
    for (paths, access) in [
        (&plan.read_only, read_only),
        (&plan.read, read),
        (&plan.devices, device),
        (&plan.write, AccessFs::from_all(abi)),
    ] {
        for path in paths {
            // A granted path that does not exist (no /lib32 here) has
            // nothing to grant.
            let Ok(meta) = std::fs::metadata(path) else {
                continue;
            };
            // Directory-only rights on a file are an error, not a no-op.
            let access = if meta.is_dir() {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            let fd = PathFd::new(path).map_err(|source| LandlockError::Open {
                path: path.clone(),
                source,
            })?;
            created = created.add_rule(PathBeneath::new(fd, access))?;
        }
    }
    Ok(Prepared {
        ruleset: created,
        required,
    })
}

impl Prepared {
    /// Restricts the calling process (and every process it starts). Sets
    /// `no_new_privs`.
    pub fn enforce(self) -> Result<Enforcement, LandlockError> {
        let status = self.ruleset.restrict_self()?;
        let enforcement = match status.ruleset {
            RulesetStatus::FullyEnforced => Enforcement::Full,
            RulesetStatus::PartiallyEnforced => Enforcement::Partial,
            RulesetStatus::NotEnforced => Enforcement::None,
        };
        if self.required && enforcement != Enforcement::Full {
            return Err(LandlockError::NotEnforced(format!("{:?}", status.ruleset)));
        }
        Ok(enforcement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_scope_all_reads_everything_writes_only_roots() {
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            ..Default::default()
        };
        let plan = plan(&policy, 7);
        assert_eq!(plan.read, vec![PathBuf::from("/")]);
        assert_eq!(
            plan.write,
            vec![PathBuf::from("/work"), PathBuf::from("/dev/shm")]
        );
    }

    #[test]
    fn read_scope_granted_lists_system_dirs_roots_and_allows() {
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            read_allows: vec!["/opt/tool".into()],
            read_scope: ReadScope::Granted,
            private_tmp: true,
            ..Default::default()
        };
        let plan = plan(&policy, 7);
        assert!(!plan.read.contains(&PathBuf::from("/")));
        for needed in ["/usr", "/etc", "/work", "/opt/tool", "/tmp"] {
            assert!(plan.read.contains(&PathBuf::from(needed)), "{needed}");
        }
        assert!(
            !plan
                .read
                .iter()
                .any(|p| p.starts_with("/root") || p.starts_with("/home"))
        );
        assert!(plan.write.contains(&PathBuf::from("/tmp")));
    }

    #[test]
    fn read_scope_none_grants_only_what_is_named() {
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            read_allows: vec!["/data".into()],
            exec_allows: vec!["/nix/store/abc-rg".into()],
            tmpfs: vec!["/scratch".into()],
            read_scope: ReadScope::None,
            ..Default::default()
        };
        let plan = plan(&policy, 7);
        assert!(
            !plan
                .read
                .iter()
                .any(|p| p.starts_with("/usr") || p.starts_with("/etc"))
        );
        for named in ["/work", "/nix/store/abc-rg", "/scratch"] {
            assert!(plan.read.contains(&PathBuf::from(named)), "{named}");
        }
        // Read allows are readable but not executable under "none".
        assert_eq!(plan.read_only, vec![PathBuf::from("/data")]);
        assert!(!plan.read.contains(&PathBuf::from("/data")));
        assert!(plan.write.contains(&PathBuf::from("/scratch")));
    }
}
