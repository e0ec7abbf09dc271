//! Per-call scope: `--exec-allow`, `--tmpfs PATH` and read-only
//! `--bind SRC DST`, for harnesses that give each tool call its own view.
//!
//! `policy::scope` decides (pure, apart from looking at the paths);
//! [`apply`] mounts, in the sandbox init after the mount plan, so a tmpfs
//! or bind lands on top of the read-only base and the denies.

use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use serde::{Deserialize, Serialize};

use crate::credentials::Identity;
use crate::policy::Policy;
pub use crate::policy::scope::Bind;

#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("failed to {what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// The mounts [`apply`] makes, decided by the supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeMounts {
    pub tmpfs: Vec<PathBuf>,
    pub binds: Vec<Bind>,
    /// Owner of the fresh tmpfs roots (the agent, as seen in the init).
    pub owner: Option<Identity>,
    /// The size and inodes of each tmpfs (`tmpfs_bounds.rs`).
    pub bounds: crate::tmpfs_bounds::TmpfsBounds,
}

impl ScopeMounts {
    pub fn of(policy: &Policy, owner: Identity) -> Self {
        Self {
            tmpfs: policy.tmpfs.clone(),
            binds: policy.binds.clone(),
            owner: Some(owner),
            bounds: crate::tmpfs_bounds::of(policy),
        }
    }
}

fn fail<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> ScopeError + 'a {
    move |source| ScopeError::Mount {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Mounts the scope (in the init's mount namespace, still privileged).
pub fn apply(mounts: &ScopeMounts) -> Result<(), ScopeError> {
    use crate::mount_tree::{NO_DEV, NO_SUID, READ_ONLY};
    for bind in &mounts.binds {
        // Both names are canonical (policy::scope): reached without
        // following any symlink, the source is the directory the caller's
        // read was checked on, not a link swapped in since (a bind by
        // path, as root, followed one into a root-only directory).
        let source = crate::mount_tree::open_no_symlinks(&bind.source).map_err(fail(
            "open (without following symlinks) the bind source",
            &bind.source,
        ))?;
        let tree = crate::mount_tree::clone_tree(&source, true)
            .map_err(fail("copy the mounts of", &bind.source))?;
        // Set, never cleared: flags locked in a user namespace stay.
        crate::mount_tree::set_flags(&tree, READ_ONLY | NO_SUID | NO_DEV, 0, true)
            .map_err(fail("make read-only the bind of", &bind.source))?;
        let target = crate::mount_tree::open_no_symlinks(&bind.target).map_err(fail(
            "open (without following symlinks) the bind target",
            &bind.target,
        ))?;
        crate::mount_tree::attach(&tree, &target).map_err(fail("bind onto", &bind.target))?;
    }
    for dir in &mounts.tmpfs {
        let access = match mounts.owner {
            Some(owner) => format!("mode=0755,uid={},gid={}", owner.uid, owner.gid),
            None => "mode=1777".to_string(),
        };
        let options = mounts.bounds.options(&access);
        mount(
            Some("tmpfs"),
            dir.as_path(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(fail("mount a tmpfs on", dir))?;
    }
    Ok(())
}
