//! The per-call scope fields of the policy (`--exec-allow`, `--tmpfs`,
//! read-only `--bind SRC DST`): built from the config file and the flags
//! and checked against the rest of the policy. `crate::scope` mounts them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{FlagPolicy, Policy, PolicyError, PolicyFields, resolve};

/// A `binds` entry of a config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindField {
    pub source: String,
    pub target: String,
}

/// A read-only bind of `source` (on the host) onto `target` (in the sandbox).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bind {
    pub source: PathBuf,
    pub target: PathBuf,
}

/// The scope fields of the normalized policy.
#[derive(Debug, Default)]
pub struct Scope {
    pub exec_allows: Vec<PathBuf>,
    pub tmpfs: Vec<PathBuf>,
    pub binds: Vec<Bind>,
}

fn invalid(message: String) -> PolicyError {
    PolicyError::Invalid(message)
}

fn absolute(field: &str, raw: &str, cwd: &Path) -> Result<PathBuf, PolicyError> {
    if Path::new(raw).is_relative() {
        return Err(invalid(format!(
            "config field {field} has the relative path {raw:?}; write it as an absolute path"
        )));
    }
    Ok(resolve(Path::new(raw), cwd))
}

/// Combines the file's and the flags' scope entries (lists add up).
pub fn build(fields: &PolicyFields, flags: &FlagPolicy, cwd: &Path) -> Result<Scope, PolicyError> {
    let mut exec_allows = fields
        .exec_allows
        .iter()
        .map(|p| absolute("exec_allows", p, cwd))
        .collect::<Result<Vec<_>, _>>()?;
    exec_allows.extend(flags.exec_allow.iter().map(|p| resolve(p, cwd)));
    let mut tmpfs = fields
        .tmpfs
        .iter()
        .map(|p| absolute("tmpfs", p, cwd))
        .collect::<Result<Vec<_>, _>>()?;
    tmpfs.extend(flags.tmpfs.iter().map(|p| resolve(p, cwd)));
    let mut binds = fields
        .binds
        .iter()
        .map(|b| {
            Ok(Bind {
                source: absolute("binds.source", &b.source, cwd)?,
                target: absolute("binds.target", &b.target, cwd)?,
            })
        })
        .collect::<Result<Vec<_>, PolicyError>>()?;
    binds.extend(flags.bind_pairs().map(|(source, target)| Bind {
        source: resolve(source, cwd),
        target: resolve(target, cwd),
    }));
    exec_allows.sort();
    exec_allows.dedup();
    tmpfs.sort();
    tmpfs.dedup();
    binds.sort();
    binds.dedup();
    Ok(Scope {
        exec_allows,
        tmpfs,
        binds,
    })
}

/// Refuses scopes that would not mean what they say.
pub fn check(policy: &Policy) -> Result<(), PolicyError> {
    for dir in &policy.tmpfs {
        if dir == Path::new("/") {
            return Err(invalid(
                "--tmpfs / would hide the whole system; name a directory".into(),
            ));
        }
        // Looked up with the service caller's file access, as `resolve`.
        if !crate::caller::as_caller(|| dir.is_dir()) {
            return Err(invalid(format!(
                "--tmpfs {} is not an existing directory; create it first",
                dir.display()
            )));
        }
        // The tmpfs is mounted last and would cover what lies below it.
        let hidden = policy
            .read_denies
            .iter()
            .chain(&policy.write_denies)
            .chain(&policy.writable_roots)
            .chain(policy.binds.iter().map(|b| &b.target))
            .find(|p| p.starts_with(dir));
        if let Some(hidden) = hidden {
            return Err(invalid(format!(
                "--tmpfs {} would hide {} below it; drop one of them",
                dir.display(),
                hidden.display()
            )));
        }
    }
    for bind in &policy.binds {
        let (Ok(source), Ok(target)) = crate::caller::as_caller(|| {
            (
                std::fs::metadata(&bind.source),
                std::fs::metadata(&bind.target),
            )
        }) else {
            return Err(invalid(format!(
                "--bind {} {}: both paths must exist (create the target first)",
                bind.source.display(),
                bind.target.display()
            )));
        };
        if source.is_dir() != target.is_dir() {
            return Err(invalid(format!(
                "--bind {} {}: a directory binds onto a directory and a file onto a file",
                bind.source.display(),
                bind.target.display()
            )));
        }
        // Binds land on top of the denies (scope::apply), so a read deny
        // at or below the target would guard the host's hidden file while
        // the agent reads the source's under the denied name. A deny of
        // the source's path is in place before the bind copies the tree.
        if let Some(deny) = policy
            .read_denies
            .iter()
            .find(|d| d.starts_with(&bind.target))
        {
            let source = match deny.strip_prefix(&bind.target) {
                Ok(rest) if !rest.as_os_str().is_empty() => bind.source.join(rest),
                _ => bind.source.clone(),
            };
            return Err(invalid(format!(
                "--bind {} {} would show its source over the read-denied {}; deny {} instead",
                bind.source.display(),
                bind.target.display(),
                deny.display(),
                source.display()
            )));
        }
        // Inside a writable root the root's grant reaches the bind's
        // files through the mount (Landlock walks up across it), and a
        // deny in a writable root is held by its mount alone, which the
        // host's replacing the denied file takes away (round 25a).
        if let Some(deny) = policy
            .read_denies
            .iter()
            .find(|d| d.starts_with(&bind.source))
            && let Some(root) = policy
                .writable_roots
                .iter()
                .find(|w| bind.target.starts_with(w))
        {
            return Err(invalid(format!(
                "--bind {} {}: the source holds the read-denied {} and the target lies in the writable root {}; bind onto a place outside the writable roots, or bind a directory that does not hold the deny",
                bind.source.display(),
                bind.target.display(),
                deny.display(),
                root.display()
            )));
        }
        // A target inside a read-denied directory is hidden by the deny
        // before the bind lands: the start would fail on a missing path.
        if let Some(deny) = policy
            .read_denies
            .iter()
            .find(|d| bind.target.starts_with(d) && bind.target != **d)
        {
            return Err(invalid(format!(
                "--bind {} {}: the target lies inside the read-denied {}; bind onto a place outside it",
                bind.source.display(),
                bind.target.display(),
                deny.display()
            )));
        }
        if bind.target == Path::new("/") {
            return Err(invalid(
                "--bind onto / is not supported; bind onto a directory".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_flag_entries_add_up_and_relative_file_paths_are_refused() {
        let fields = PolicyFields {
            tmpfs: vec!["/a".into()],
            binds: vec![BindField {
                source: "/s".into(),
                target: "/t".into(),
            }],
            ..Default::default()
        };
        let flags = FlagPolicy {
            tmpfs: vec!["b".into()],
            exec_allow: vec!["/x".into()],
            ..Default::default()
        };
        let scope = build(&fields, &flags, Path::new("/nonexistent-cwd")).unwrap();
        assert_eq!(scope.tmpfs.len(), 2);
        assert_eq!(scope.binds.len(), 1);
        assert_eq!(scope.exec_allows, vec![PathBuf::from("/x")]);
        let relative = PolicyFields {
            exec_allows: vec!["rel".into()],
            ..Default::default()
        };
        assert!(build(&relative, &FlagPolicy::default(), Path::new("/")).is_err());
    }

    #[test]
    fn a_tmpfs_may_not_hide_a_deny_or_root() {
        let policy = Policy {
            tmpfs: vec!["/tmp".into()],
            read_denies: vec!["/tmp/secret".into()],
            ..Default::default()
        };
        assert!(check(&policy).unwrap_err().to_string().contains("hide"));
        let root = Policy {
            tmpfs: vec!["/".into()],
            ..Default::default()
        };
        assert!(check(&root).is_err());
    }

    #[test]
    fn binds_need_matching_existing_paths() {
        let missing = Policy {
            binds: vec![Bind {
                source: "/etc".into(),
                target: "/nonexistent-tartaros".into(),
            }],
            ..Default::default()
        };
        assert!(check(&missing).unwrap_err().to_string().contains("exist"));
        let mismatch = Policy {
            binds: vec![Bind {
                source: "/etc/passwd".into(),
                target: "/tmp".into(),
            }],
            ..Default::default()
        };
        assert!(check(&mismatch).is_err());
    }

    #[test]
    fn a_bind_target_inside_a_read_deny_is_refused_before_the_start() {
        let inside = Policy {
            binds: vec![Bind {
                source: "/etc".into(),
                target: "/usr/share".into(),
            }],
            read_denies: vec!["/usr".into()],
            ..Default::default()
        };
        let refusal = check(&inside).unwrap_err().to_string();
        assert!(refusal.contains("inside the read-denied /usr"), "{refusal}");
        let beside = Policy {
            read_denies: vec!["/usr/lib".into()],
            ..inside
        };
        assert!(check(&beside).is_ok());
    }

    #[test]
    fn a_bind_holding_a_deny_may_not_land_in_a_writable_root() {
        let work = tempfile::tempdir().unwrap();
        let (src, root) = (work.path().join("src"), work.path().join("w"));
        std::fs::create_dir_all(src.join("s")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let policy = Policy {
            binds: vec![Bind {
                source: src.clone(),
                target: root.join("sub"),
            }],
            read_denies: vec![src.join("s/key")],
            writable_roots: vec![root.clone()],
            ..Default::default()
        };
        let refusal = check(&policy).unwrap_err().to_string();
        assert!(refusal.contains("writable root"), "{refusal}");
        let elsewhere = Policy {
            read_denies: vec![work.path().join("other")],
            ..policy.clone()
        };
        assert!(check(&elsewhere).is_ok());
    }
}
