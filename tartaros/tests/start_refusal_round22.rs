//! Adversarial round 22: a guarantee the plan had and the agent's last
//! steps could not install. tartaros ran under an outer seccomp filter
//! that refuses `seccomp(2)` with EPERM (as a container runtime's or
//! another sandbox's may): the run was refused (78) and the agent never
//! ran, but the status line's `field` was null, and the sealed log's
//! genesis listed `seccomp` as installed while `verify` said a plain `ok`.
//! Now the refusal names the guarantee (`cannot install seccomp: ...`),
//! and the seal says the agent never started, which `verify` repeats.

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::*;

/// Installs, in the launcher, a classic BPF filter that answers
/// `seccomp(2)` (x86-64 number 317) with EPERM and allows the rest.
fn refuse_seccomp() -> std::io::Result<()> {
    let code = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let insns = [
        code((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 0, 0, 0),
        code(
            (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            0,
            1,
            317,
        ),
        code(
            (libc::BPF_RET | libc::BPF_K) as u16,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        code(
            (libc::BPF_RET | libc::BPF_K) as u16,
            0,
            0,
            libc::SECCOMP_RET_ALLOW,
        ),
    ];
    let prog = libc::sock_fprog {
        len: insns.len() as u16,
        filter: insns.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with a filter that lives until the call returns;
    // between fork and exec, async-signal-safe.
    let rc = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_guarantee_refused_at_the_agents_last_step_is_named_and_the_seal_says_nothing_ran() {
    if !can_run("start_refusal_round22") {
        return;
    }
    let (work, logs) = (Dir::new(), Dir::new());
    chown(work.path(), NOBODY);
    let log = logs.join("effects.jsonl");
    let (status_read, status_write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    let raw = status_write.as_raw_fd();
    let w = work.path().to_str().unwrap();
    let mut command = Command::new(bin());
    command
        .args(["run", "-q", "--strict", "--status-fd", "9", "--write", w])
        .args(["--log", log.to_str().unwrap()])
        .args(["--", "sh", "-c", &format!("touch {w}/ran")])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on_fd9(&mut command, raw);
    // SAFETY: prctl between fork and exec, async-signal-safe.
    unsafe { command.pre_exec(refuse_seccomp) };
    let out = command.output().unwrap();
    drop(command);
    drop(status_write);
    let mut status = String::new();
    std::fs::File::from(status_read)
        .read_to_string(&mut status)
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "stderr: {err}");
    assert!(!work.join("ran").exists(), "the agent ran");
    assert!(
        err.contains("cannot install seccomp"),
        "stderr names the guarantee: {err}"
    );
    let refused: serde_json::Value = status
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["event"] == "refused")
        .unwrap_or_else(|| panic!("no refused line: {status}"));
    assert_eq!(refused["field"], "seccomp", "{refused}");
    // The log: sealed, intact, and saying that nothing ran.
    let text = std::fs::read_to_string(&log).unwrap();
    let seal: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(seal["kind"], "seal", "{seal}");
    let why = seal["not_started"].as_str().unwrap_or_default();
    assert!(why.starts_with("cannot install seccomp"), "{seal}");
    let verify = tartaros(
        &["log", "verify", log.to_str().unwrap()],
        std::path::Path::new("/"),
    );
    let line = stdout(&verify);
    assert_eq!(verify.status.code(), Some(0), "{line}");
    assert!(
        line.contains("the agent never started: cannot install seccomp"),
        "{line}"
    );
}
