//! Landlock: filesystem access rules (and, where the ABI has it, scoping of
//! signals and abstract unix sockets to the sandbox).
//!
//! [`plan`] decides the rules from the policy (pure, unit-tested); [`prepare`]
//! opens the paths while the init is still root and [`Prepared::enforce`]
//! installs them in the agent process right before seccomp and `execve`.
//! Landlock only ever grants, so denies inside granted trees are first the
//! mount namespace's job (see `mounts.rs`); a read deny outside the writable
//! roots is also held here, by granting the siblings along its path instead
//! of the tree above it (`landlock_siblings.rs`), since the host replacing
//! the denied name detaches its cover mount.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

use crate::landlock_siblings::{Entry, Kind, Reach, Rule, sibling_grants};
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
    /// Read denies the rules above must not grant (those outside every
    /// writable hierarchy; see [`plan`]).
    #[serde(default)]
    pub read_denies: Vec<PathBuf>,
}

/// Trees whose entries come and go with processes and devices: a deny in
/// them is left to its mount, as listing-only rights on /proc would hide
/// from the agent its own /proc/PID, made after the rules.
const DYNAMIC_TREES: &[&str] = &["/proc", "/sys", "/dev"];

/// Whether Landlock can hold a deny of `path` outside the writable
/// hierarchies, the host replacing or creating it during the run included.
pub fn holds_deny(path: &Path) -> bool {
    !DYNAMIC_TREES.iter().any(|t| path.starts_with(t))
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
    // A deny inside a writable hierarchy stays with its mount alone: the
    // agent must read what it creates beside it (Cargo.lock replaced by a
    // rename), and rights inherited from a directory cannot tell those
    // names from the one the host fills.
    // A bind shows its source's inodes at its target: a deny under the
    // source is under the target too. Else the target's grant (whole, or
    // as a sibling of a deny's ancestors) holds the denied name's
    // directory by inode, and a file the host puts at the denied name is
    // read by either name (adversarial round 25a).
    let bound = policy.binds.iter().flat_map(|b| {
        policy.read_denies.iter().filter_map(move |d| {
            let rest = d.strip_prefix(&b.source).ok()?;
            Some(if rest.as_os_str().is_empty() {
                b.target.clone()
            } else {
                b.target.join(rest)
            })
        })
    });
    let mut read_denies: Vec<PathBuf> = policy
        .read_denies
        .iter()
        .cloned()
        .chain(bound)
        .filter(|d| !write.iter().any(|w| d.starts_with(w)))
        .filter(|d| holds_deny(d))
        .collect();
    let mut seen = std::collections::HashSet::new();
    read_denies.retain(|d| seen.insert(d.clone()));
    LandlockPlan {
        abi,
        read,
        write,
        devices: WRITABLE_DEVICES.iter().map(PathBuf::from).collect(),
        read_only,
        read_denies,
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
        for rule in expanded(paths, &plan.read_denies) {
            add_rule(&mut created, &rule, access, abi)?;
        }
    }
    Ok(Prepared {
        ruleset: created,
        required,
    })
}

/// The rules for the grants `paths`: each as given, unless a deny lies
/// under it (in this view of the files: the init runs this after every
/// mount, so a cover's name is there and is left out as denied).
fn expanded(paths: &[PathBuf], denies: &[PathBuf]) -> Vec<Rule> {
    if denies.is_empty() {
        return paths.iter().map(|p| Rule::whole(p.clone())).collect();
    }
    let mut rules = Vec::new();
    for path in paths {
        // Compared resolved: a grant of `/lib` is `/usr/lib` to Landlock.
        // A granted path that does not exist (no /lib32 here) has nothing
        // to grant.
        let Ok(resolved) = std::fs::canonicalize(path) else {
            continue;
        };
        if denies.iter().any(|d| d.starts_with(&resolved)) {
            rules.extend(sibling_grants(&[resolved], denies, &list));
        } else {
            rules.push(Rule::whole(path.clone()));
        }
    }
    rules
}

/// The listing [`sibling_grants`] works from, symlinks not followed.
fn list(dir: &Path) -> std::io::Result<Vec<Entry>> {
    std::fs::read_dir(dir)?
        .map(|entry| {
            let entry = entry?;
            let kind = entry.file_type()?;
            let kind = if kind.is_dir() {
                Kind::Dir
            } else if kind.is_symlink() {
                Kind::Symlink
            } else {
                Kind::Other
            };
            Ok(Entry::new(entry.file_name(), kind))
        })
        .collect()
}

fn add_rule(
    created: &mut landlock::RulesetCreated,
    rule: &Rule,
    access: BitFlags<AccessFs>,
    abi: ABI,
) -> Result<(), LandlockError> {
    // Directory-only rights on a file are an error, not a no-op.
    let fitted = |meta: &std::fs::Metadata| {
        if meta.is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        }
    };
    if rule.reach == Reach::Grant {
        // A granted path that does not exist has nothing to grant.
        let Ok(meta) = std::fs::metadata(&rule.path) else {
            return Ok(());
        };
        let fd = PathFd::new(&rule.path).map_err(|source| LandlockError::Open {
            path: rule.path.clone(),
            source,
        })?;
        RulesetCreatedAttr::add_rule(&mut *created, PathBeneath::new(fd, fitted(&meta)))?;
        return Ok(());
    }
    // Entries found by a listing are opened without following any symlink,
    // so a link swapped in since cannot take the rule to the denied file;
    // one gone or swapped since gets no rule (closed).
    let Ok(fd) = crate::mount_tree::open_no_symlinks(&rule.path) else {
        return Ok(());
    };
    let file = std::fs::File::from(fd);
    let Ok(meta) = file.metadata() else {
        return Ok(());
    };
    let access = match rule.reach {
        _ if meta.is_symlink() => return Ok(()),
        Reach::ListOnly if meta.is_dir() => access & AccessFs::ReadDir,
        Reach::ListOnly => return Ok(()),
        _ => fitted(&meta),
    };
    // An entry Landlock takes no rule on (a bound namespace file, say)
    // is left without one: closed, and no reason to refuse the run.
    let _ = RulesetCreatedAttr::add_rule(&mut *created, PathBeneath::new(file, access));
    Ok(())
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
    use crate::policy::scope::Bind;

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

    #[test]
    fn only_read_denies_outside_the_writable_hierarchies_are_held() {
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            tmpfs: vec!["/scratch".into()],
            private_tmp: true,
            read_denies: vec![
                "/home/u/.aws/credentials".into(),
                "/work/.env".into(),
                "/tmp/key".into(),
                "/scratch/key".into(),
                "/dev/shm/key".into(),
                "/proc/kcore".into(),
                "/etc/shadow".into(),
            ],
            ..Default::default()
        };
        let plan = plan(&policy, 7);
        assert_eq!(
            plan.read_denies,
            vec![
                PathBuf::from("/home/u/.aws/credentials"),
                PathBuf::from("/etc/shadow")
            ]
        );
    }

    #[test]
    fn a_deny_under_a_bind_source_is_denied_at_its_target_too() {
        let policy = Policy {
            binds: vec![
                Bind {
                    source: "/srv".into(),
                    target: "/mnt/t".into(),
                },
                Bind {
                    source: "/srv/s/key".into(),
                    target: "/mnt/k".into(),
                },
            ],
            read_denies: vec!["/srv/s/key".into(), "/etc/shadow".into()],
            ..Default::default()
        };
        let plan = plan(&policy, 7);
        assert_eq!(
            plan.read_denies,
            vec![
                PathBuf::from("/srv/s/key"),
                PathBuf::from("/etc/shadow"),
                PathBuf::from("/mnt/t/s/key"),
                PathBuf::from("/mnt/k"),
            ]
        );
    }

    #[test]
    fn a_plan_without_the_field_still_reads() {
        // An init of this version gets plans only from its own supervisor,
        // but the field defaults like `read_only` before it.
        let json = r#"{"abi":3,"read":["/"],"write":[],"devices":[]}"#;
        let plan: LandlockPlan = serde_json::from_str(json).unwrap();
        assert!(plan.read_denies.is_empty() && plan.read_only.is_empty());
    }
}
