//! Adversarial round 11: the launcher's session keyring. A session keyring
//! survives fork, exec and setuid, so an agent started from a login (PAM's
//! `pam_keyinit`) or after `keyctl session` possessed the launcher's, and
//! the kernel shows every key a process possesses in `/proc/keys`, even to
//! nobody, with seccomp refusing `keyctl`. runc's and crun's tests check
//! that a container gets a session keyring of its own; here the launcher
//! joins a keyring and links a key only a possessor may view, and the
//! agent must not see it.

mod common;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use common::*;

const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const KEYCTL_SETPERM: libc::c_long = 5;
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
/// Every right for a possessor, none for the owner, group or others.
const POSSESSOR_ONLY: libc::c_long = 0x3f00_0000;

/// In the launcher's child, before exec: a session keyring of its own with
/// a `user` key described `marker` that only a possessor may view.
fn with_marked_session_keyring(command: &mut Command, marker: &str) {
    let session = std::ffi::CString::new(format!("tt-r11-session-{}", std::process::id())).unwrap();
    let description = std::ffi::CString::new(marker).unwrap();
    // SAFETY: keyctl and add_key read only the strings moved in here; the
    // closure allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let joined = libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                session.as_ptr(),
            );
            if joined < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let key = libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                description.as_ptr(),
                c"payload".as_ptr(),
                7usize,
                KEY_SPEC_SESSION_KEYRING,
            );
            if key < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_keyctl, KEYCTL_SETPERM, key, POSSESSOR_ONLY) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn keys_seen_by_the_agent(mut command: Command, marker: &str) -> Output {
    with_marked_session_keyring(&mut command, marker);
    command
        .args(["run", "--", "cat", "/proc/keys"])
        .current_dir(Path::new("/"))
        .output()
        .expect("run tartaros")
}

fn assert_not_possessed(out: &Output, marker: &str) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    let text = stdout(out);
    assert!(
        !text.contains(marker),
        "the agent possessed the launcher's session keyring:\n{text}"
    );
}

#[test]
fn a_root_runs_agent_does_not_possess_the_launchers_session_keyring() {
    if !can_run("a_root_runs_agent_does_not_possess_the_launchers_session_keyring") {
        return;
    }
    let marker = format!("tt-r11-key-{}", std::process::id());
    let out = keys_seen_by_the_agent(Command::new(bin()), &marker);
    assert_not_possessed(&out, &marker);
}

#[test]
fn an_ordinary_users_agent_does_not_possess_the_launchers_session_keyring() {
    if !can_run("an_ordinary_users_agent_does_not_possess_the_launchers_session_keyring") {
        return;
    }
    let marker = format!("tt-r11-ukey-{}", std::process::id());
    let mut command = Command::new(bin());
    // std drops the supplementary groups with the uid; the keyring and the
    // key are made after the uid changed, so they are the user's.
    command.uid(4397).gid(4397).env_remove("SUDO_UID");
    let out = keys_seen_by_the_agent(command, &marker);
    assert_not_possessed(&out, &marker);
}
