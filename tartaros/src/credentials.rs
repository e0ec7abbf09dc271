//! Who the agent runs as: an unprivileged uid/gid when TartarOS is started as
//! root, no capabilities at all, and `no_new_privs`.

use nix::unistd::{Gid, Uid, User};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("unknown --user {0:?}; name an existing user or a numeric uid")]
    UnknownUser(String),
    #[error("failed to look up user {name:?}: {source}")]
    Lookup { name: String, source: nix::Error },
    #[error(
        "failed to read the supplementary groups of uid {uid}: {source}; check the group database (/etc/group, NSS)"
    )]
    Groups { uid: u32, source: nix::Error },
    #[error("failed to {what}: {source}")]
    Drop {
        what: &'static str,
        source: nix::Error,
    },
}

/// The identity the agent gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// The conventional unprivileged identity.
pub const NOBODY: Identity = Identity {
    uid: 65534,
    gid: 65534,
};

/// Decides the agent's identity. Started as root: `--user` if given, else the
/// user who ran `sudo` (`SUDO_UID`/`SUDO_GID`), else `nobody`. Started as an
/// ordinary user: that user (the kernel would refuse anything else).
pub fn choose(
    requested: Option<&str>,
    current: Identity,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Identity, CredentialsError> {
    if let Some(name) = requested {
        return lookup(name);
    }
    if current.uid != 0 {
        return Ok(current);
    }
    Ok(sudo_user(env).unwrap_or(NOBODY))
}

/// The user who ran `sudo` (`SUDO_UID`/`SUDO_GID`), unless that was root.
fn sudo_user(env: &dyn Fn(&str) -> Option<String>) -> Option<Identity> {
    let sudo = |name: &str| env(name).and_then(|v| v.parse::<u32>().ok());
    match (sudo("SUDO_UID"), sudo("SUDO_GID")) {
        (Some(uid), Some(gid)) if uid != 0 => Some(Identity { uid, gid }),
        _ => None,
    }
}

/// The home a config file's `~` names: the home of the user the agent
/// runs as. A root launcher that names that user (`--user`, or sudo's
/// `SUDO_UID`) has root's `$HOME` (sudo sets it), so that user's home comes
/// from `home_of` (the passwd database); a `~/.ssh` deny taken from `$HOME`
/// guarded /root/.ssh while the agent read the user's own. Otherwise `$HOME`
/// (an ordinary user, the service's caller, root's own run as nobody).
/// `None` when the named user has no absolute home: `~` is then refused.
pub fn tilde_home(
    requested: Option<&str>,
    current: Identity,
    env: &dyn Fn(&str) -> Option<String>,
    home_of: &dyn Fn(&str) -> Option<std::path::PathBuf>,
) -> Option<std::path::PathBuf> {
    let launcher_home = || env("HOME").map(std::path::PathBuf::from);
    if current.uid != 0 {
        return launcher_home();
    }
    let named = match (requested, sudo_user(env)) {
        (Some(name), _) => name.to_string(),
        (None, Some(user)) => user.uid.to_string(),
        (None, None) => return launcher_home(),
    };
    home_of(&named).filter(|home| home.is_absolute())
}

/// The passwd home of `name` (a user name or a numeric uid).
pub fn passwd_home(name: &str) -> Option<std::path::PathBuf> {
    match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    }
    .ok()
    .flatten()
    .map(|user| user.dir)
}

pub fn lookup(name: &str) -> Result<Identity, CredentialsError> {
    let user = match name.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(name),
    }
    .map_err(|source| CredentialsError::Lookup {
        name: name.to_string(),
        source,
    })?;
    match user {
        Some(user) => Ok(Identity {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }),
        None => Err(CredentialsError::UnknownUser(name.to_string())),
    }
}

/// The supplementary groups of the user `identity` is, for the agent.
/// Dropping them is no narrowing: a file `root:staff 0604` (or an ACL
/// entry `group:staff:---`) is readable by everyone but staff, so an agent
/// without the group read what its user cannot (adversarial round 25a;
/// the kernel's setgroups rule for user namespaces is the same lesson).
/// A service caller's are the kernel's (`SO_PEERGROUPS`); another user's
/// come from the group database, as a login's do (a uid without an entry
/// has no name to be a member by). A database that cannot be read is an
/// error, not "no groups": that would drop them again. In a user
/// namespace the agent keeps the launcher's.
pub fn supplementary(
    identity: Identity,
    in_user_namespace: bool,
) -> Result<Vec<u32>, CredentialsError> {
    if in_user_namespace {
        return Ok(Vec::new());
    }
    if let Some(caller) = crate::caller::caller().filter(|c| c.uid == identity.uid) {
        return Ok(caller.groups.clone());
    }
    let failed = |source| CredentialsError::Groups {
        uid: identity.uid,
        source,
    };
    let Some(user) = User::from_uid(Uid::from_raw(identity.uid)).map_err(failed)? else {
        return Ok(Vec::new());
    };
    let name = std::ffi::CString::new(user.name).map_err(|_| failed(nix::Error::EINVAL))?;
    let groups = nix::unistd::getgrouplist(&name, Gid::from_raw(identity.gid)).map_err(failed)?;
    Ok(groups.into_iter().map(Gid::as_raw).collect())
}

/// Becomes `identity` for good (inside a user namespace, where the init is
/// root, that is root of the namespace with every capability removed): empties the capability bounding and ambient
/// sets while still privileged, switches gid then uid, clears any capability
/// left (the uid 0 case), and sets `no_new_privs` so no exec can regain any.
/// Runs in the single-threaded agent child of the sandbox init.
pub fn drop_to(
    identity: Identity,
    groups: &[u32],
    in_user_namespace: bool,
) -> Result<(), CredentialsError> {
    let fail = |what| move |source| CredentialsError::Drop { what, source };
    if nix::unistd::geteuid().is_root() {
        for cap in 0..=last_cap() {
            // SAFETY: PR_CAPBSET_DROP takes a capability number and no memory.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
            // EINVAL: a capability this kernel does not know; nothing to drop.
            if rc != 0 && nix::errno::Errno::last() != nix::errno::Errno::EINVAL {
                return Err(fail("drop the capability bounding set")(
                    nix::errno::Errno::last(),
                ));
            }
        }
        let gid = Gid::from_raw(identity.gid);
        // A user namespace made by an unprivileged user has setgroups
        // denied and maps only one group anyway.
        if !in_user_namespace {
            let mut all = vec![gid];
            all.extend(
                groups
                    .iter()
                    .map(|g| Gid::from_raw(*g))
                    .filter(|g| *g != gid),
            );
            nix::unistd::setgroups(&all).map_err(fail("set the supplementary groups"))?;
        }
        nix::unistd::setresgid(gid, gid, gid).map_err(fail("set the group id"))?;
        let uid = Uid::from_raw(identity.uid);
        nix::unistd::setresuid(uid, uid, uid).map_err(fail("set the user id"))?;
    }
    // SAFETY: clearing the ambient set takes no memory.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(fail("clear the ambient capabilities")(
            nix::errno::Errno::last(),
        ));
    }
    clear_capabilities().map_err(fail("clear the remaining capabilities"))?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(fail("set no_new_privs")(nix::errno::Errno::last()));
    }
    Ok(())
}

fn last_cap() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Empties the effective, permitted and inheritable sets (a non-root uid
/// already has none after setresuid; uid 0 keeps them otherwise).
fn clear_capabilities() -> Result<(), nix::Error> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and data are valid for the v3 layout (two data words),
    // and outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_tilde_is_the_home_of_the_user_the_agent_runs_as() {
        use std::path::PathBuf;
        let root = Identity { uid: 0, gid: 0 };
        let alice = Identity {
            uid: 1000,
            gid: 1000,
        };
        let home_of = |name: &str| match name {
            "1000" | "alice" => Some(PathBuf::from("/home/alice")),
            "root" => Some(PathBuf::from("/root")),
            "odd" => Some(PathBuf::from("rel")),
            _ => None,
        };
        let env = |sudo: bool| {
            move |name: &str| match name {
                "HOME" => Some("/root".to_string()),
                "SUDO_UID" | "SUDO_GID" if sudo => Some("1000".to_string()),
                _ => None,
            }
        };
        // sudo sets HOME to root's, the agent is the sudo user.
        assert_eq!(
            tilde_home(None, root, &env(true), &home_of),
            Some(PathBuf::from("/home/alice"))
        );
        assert_eq!(
            tilde_home(Some("alice"), root, &env(false), &home_of),
            Some(PathBuf::from("/home/alice"))
        );
        assert_eq!(
            tilde_home(Some("root"), root, &env(true), &home_of),
            Some(PathBuf::from("/root"))
        );
        // Root's own run (agent nobody) and ordinary users keep $HOME.
        assert_eq!(
            tilde_home(None, root, &env(false), &home_of),
            Some(PathBuf::from("/root"))
        );
        assert_eq!(
            tilde_home(None, alice, &env(true), &home_of),
            Some(PathBuf::from("/root"))
        );
        // A named user without an absolute home: `~` is refused, never $HOME.
        assert_eq!(tilde_home(Some("ghost"), root, &env(false), &home_of), None);
        assert_eq!(tilde_home(Some("odd"), root, &env(false), &home_of), None);
    }

    #[test]
    fn root_defaults_to_sudo_user_then_nobody() {
        let root = Identity { uid: 0, gid: 0 };
        let sudo = |name: &str| match name {
            "SUDO_UID" => Some("1000".to_string()),
            "SUDO_GID" => Some("1001".to_string()),
            _ => None,
        };
        assert_eq!(
            choose(None, root, &sudo).unwrap(),
            Identity {
                uid: 1000,
                gid: 1001
            }
        );
        assert_eq!(choose(None, root, &|_| None).unwrap(), NOBODY);
        let user = Identity {
            uid: 1000,
            gid: 1000,
        };
        assert_eq!(choose(None, user, &|_| None).unwrap(), user);
    }

    #[test]
    fn unknown_user_is_refused() {
        let err = choose(Some("no-such-user-tartaros"), NOBODY, &|_| None).unwrap_err();
        assert!(err.to_string().contains("--user"));
        assert_eq!(choose(Some("root"), NOBODY, &|_| None).unwrap().uid, 0);
    }

    #[test]
    fn the_agent_keeps_its_users_groups_and_a_namespace_keeps_the_launchers() {
        let root = Identity { uid: 0, gid: 0 };
        assert!(supplementary(root, false).unwrap().contains(&0));
        assert_eq!(supplementary(root, true).unwrap(), Vec::<u32>::new());
        // No entry, no name to be a member by.
        let nameless = Identity {
            uid: 3_999_999_999,
            gid: 3_999_999_999,
        };
        assert_eq!(supplementary(nameless, false).unwrap(), Vec::<u32>::new());
    }
}
