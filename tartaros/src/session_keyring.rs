//! The sandbox's own session keyring.
//!
//! A process's session keyring survives `fork`, `execve` and `setuid`, so
//! the init and the agent held the launcher's (the one PAM's
//! `pam_keyinit` gives a login, or any `keyctl session`): the agent
//! *possessed* it and every key linked there. Seccomp refuses `keyctl`,
//! but possession alone shows every such key in `/proc/keys` (type,
//! description, payload length) to an agent that runs as nobody, and the
//! kernel searches a process's session keyring on its behalf (fscrypt v1
//! policies, `request_key` upcalls of filesystems). The init joins a new,
//! anonymous session keyring before anything else, as runc gives each
//! container one; the agent inherits it, empty (adversarial round 11).

#[derive(Debug, thiserror::Error)]
pub enum SessionKeyringError {
    #[error(
        "failed to give the sandbox a session keyring of its own: {0}; if this user's key quota is used up (kernel.keys.maxkeys, one key per running sandbox), end some runs or raise it"
    )]
    Join(std::io::Error),
}

/// `KEYCTL_JOIN_SESSION_KEYRING` (uapi `linux/keyctl.h`).
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;

/// Replaces the caller's session keyring with a new anonymous one; the
/// caller's children inherit it.
pub fn join_new() -> Result<(), SessionKeyringError> {
    // SAFETY: with a NULL name the kernel reads no memory of ours; the call
    // changes only this process's credentials.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if rc >= 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // A kernel without keys has no keyring to share, and a host filter
        // that refuses keyctl (a container's: runc already gave it a session
        // keyring of its own) leaves none of the launcher's to reach.
        Some(libc::ENOSYS | libc::EPERM) => Ok(()),
        _ => Err(SessionKeyringError::Join(error)),
    }
}
