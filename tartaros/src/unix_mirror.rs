//! The unix policy's mirrors: every directory under which the agent may
//! reach pathname sockets (the writable roots, the private /tmp) shown a
//! second time at `/dev/.u/<slot>`, recursively, read-only and with
//! `MOUNT_ATTR_NOSYMFOLLOW` (Linux 5.10). The eBPF unix programs rewrite an
//! allowed name `<root>/<rest>` to `/dev/.u/<slot>/<rest>` before the
//! kernel looks it up (tartaros-ebpf/src/unix.rs), so no symlink under a
//! root, planted before or after the start, can lead a connect to a host
//! socket: the lookup fails with ELOOP at the link. The mirror shows the
//! same objects as the root (its denies and scope mounts included: it is
//! made last), grants nothing (read-only, `nodev`, `noexec`), and cannot be
//! reached by its own name (the policy allows only the roots' names).
//!
//! Made by the init, as root in its mount namespace, after the mount plan
//! and the scope; the mount points are made with the private /dev.

use std::path::{Path, PathBuf};

use crate::mount_tree::{self, NO_DEV, NO_EXEC, NO_SUID, NO_SYMFOLLOW, READ_ONLY};

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("failed to {what} {path} for the unix socket policy: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// The mirror of slot `slot` (the prefix the unix programs write).
pub fn point(slot: usize) -> PathBuf {
    let dir = String::from_utf8_lossy(tartaros_common::capture::UNIX_MIRROR);
    PathBuf::from(format!("{dir}{slot}"))
}

/// Mount points for `count` slots, made in the private /dev.
pub fn points(count: usize) -> Vec<PathBuf> {
    (0..count).map(point).collect()
}

fn fail<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MirrorError + 'a {
    move |source| MirrorError::Mount {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Mirrors `dirs[slot]` at [`point`]`(slot)`, in slot order (the order of
/// the unix programs' prefixes).
pub fn apply(dirs: &[PathBuf]) -> Result<(), MirrorError> {
    for (slot, dir) in dirs.iter().enumerate() {
        let at = mount_tree::open_no_symlinks(dir).map_err(fail("open", dir))?;
        let copy = mount_tree::clone_tree(&at, true).map_err(fail("copy", dir))?;
        mount_tree::set_flags(
            &copy,
            READ_ONLY | NO_SUID | NO_DEV | NO_EXEC | NO_SYMFOLLOW,
            0,
            true,
        )
        .map_err(fail("make symlink-free", dir))?;
        let point = point(slot);
        let onto = mount_tree::open_no_symlinks(&point).map_err(fail("open", &point))?;
        mount_tree::attach(&copy, &onto).map_err(fail("mount the mirror of", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_points_are_what_the_unix_programs_write() {
        assert_eq!(point(0), PathBuf::from("/dev/.u/0"));
        assert_eq!(points(2), vec![point(0), point(1)]);
        let prefix = format!("{}/", point(7).display());
        assert_eq!(prefix.len(), tartaros_common::capture::UNIX_MIRROR_LEN);
    }
}
