//! An ordinary user's agent keeps that user's uid and gid: the sandbox init
//! is root of a user namespace mapped to the user (it needs that to mount),
//! and the agent, just before it drops its capabilities, enters one more
//! user namespace that maps the user's own ids back onto that root. Files
//! keep their owner, `id` prints the user, and the agent has no capability
//! anywhere (the mounts belong to the outer namespace, and `drop_to`
//! clears the fresh namespace's set).

use std::path::Path;

use crate::credentials::Identity;

#[derive(Debug, thiserror::Error)]
pub enum IdentityMapError {
    #[error("failed to enter the agent's user namespace: {0}")]
    Unshare(nix::Error),
    #[error("failed to write the agent's {file}: {source}; run as root, or report this host")]
    Map {
        file: &'static str,
        source: std::io::Error,
    },
}

/// The single-line maps: `user` inside onto 0 (the init's root) outside.
pub fn maps(user: Identity) -> (String, String) {
    (format!("{} 0 1", user.uid), format!("{} 0 1", user.gid))
}

/// In the agent child, while it is still root of the init's namespace.
/// Once the namespace exists the maps must be written: there is no way
/// back, so a failure ends the start (an unmapped agent could not create
/// files).
pub fn become_user(user: Identity) -> Result<(), IdentityMapError> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(IdentityMapError::Unshare)?;
    let (uid_map, gid_map) = maps(user);
    let write = |file: &'static str, text: &str| {
        std::fs::write(Path::new("/proc/self").join(file), text)
            .map_err(|source| IdentityMapError::Map { file, source })
    };
    write("uid_map", &uid_map)?;
    // gid_map needs setgroups denied first (unprivileged mapping).
    write("setgroups", "deny")?;
    write("gid_map", &gid_map)?;
    drop_bounding_set();
    Ok(())
}

/// The new namespace starts with a full bounding set; `drop_to` empties
/// it only for uid 0, so empty it here (with no_new_privs it could not be
/// used, but nothing should be left to reason about).
fn drop_bounding_set() {
    let last: libc::c_ulong = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no memory.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_maps_onto_the_inits_root() {
        let (uid, gid) = maps(Identity {
            uid: 1000,
            gid: 100,
        });
        assert_eq!(uid, "1000 0 1");
        assert_eq!(gid, "100 0 1");
    }
}
