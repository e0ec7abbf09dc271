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
}

impl ScopeMounts {
    pub fn of(policy: &Policy, owner: Identity) -> Self {
        Self {
            tmpfs: policy.tmpfs.clone(),
            binds: policy.binds.clone(),
            owner: Some(owner),
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
    const NONE: Option<&str> = None;
    for bind in &mounts.binds {
        mount(
            Some(bind.source.as_path()),
            bind.target.as_path(),
            NONE,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            NONE,
        )
        .map_err(fail("bind onto", &bind.target))?;
        // Flags of the source mount are locked in a user namespace; keep
        // them and add read-only.
        let locked = locked_flags(&bind.target);
        mount(
            NONE,
            bind.target.as_path(),
            NONE,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | locked,
            NONE,
        )
        .map_err(fail("make read-only the bind on", &bind.target))?;
    }
    for dir in &mounts.tmpfs {
        let options = match mounts.owner {
            Some(owner) => format!("mode=0755,uid={},gid={}", owner.uid, owner.gid),
            None => "mode=1777".to_string(),
        };
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

fn locked_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    let mut flags = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if st.flags().contains(fs) {
            flags |= ms;
        }
    }
    flags
}
