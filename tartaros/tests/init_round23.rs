//! Adversarial round 23b, finding 2: the agent killed its own init. Under
//! `--user root` (and in an ordinary user's user-namespace run) the init
//! and the agent share a uid, so `prlimit(1, RLIMIT_CPU, {0, 0})` was
//! allowed and the kernel SIGKILLed the init at its next tick. The run
//! then exited 125 `failed`, the seal said `not_started` and `verify`
//! printed "the agent never started", although the agent had run and
//! written files; the call itself was in no record.
//!
//! Now the filter refuses `prlimit64` with a new limit for any pid but 0
//! (the caller), as a `syscall` record; and an init that ends without a
//! report after the agent started (here: SIGKILLed from the host) is said
//! to have ended while the agent ran, never that the agent did not start.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// An ordinary uid with no passwd entry: nothing of it stays on the host.
const TEST_UID: u32 = 47_000 + 231;

/// Writes `ran` in the work directory (argv[1]), tries to set the init's
/// CPU limit to 0, checks that reading it and setting its own limits still
/// work, then makes orphans for the init to reap for a while (an init with
/// RLIMIT_CPU 0 is killed at the first tick it runs) and exits 3.
const AGENT: &str = r#"
import errno, os, resource, sys, time
open(os.path.join(sys.argv[1], 'ran'), 'w').write('x')
try:
    resource.prlimit(1, resource.RLIMIT_CPU, (0, 0))
    print('prlimit OK', flush=True)
except OSError as e:
    print('prlimit', errno.errorcode[e.errno], flush=True)
try:
    resource.prlimit(1, resource.RLIMIT_CPU)
    print('read OK', flush=True)
except OSError as e:
    print('read', errno.errorcode[e.errno], flush=True)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
resource.prlimit(0, resource.RLIMIT_NOFILE, (soft - 2, hard))
print('own', resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft - 2, flush=True)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
print('done', flush=True)
sys.exit(3)
"#;

/// The status lines read from `status`, parsed.
fn status_lines(status: &str) -> Vec<Value> {
    status
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn verify(log: &std::path::Path) -> (Option<i32>, String) {
    let out = tartaros(
        &["log", "verify", log.to_str().unwrap()],
        std::path::Path::new("/"),
    );
    (
        out.status.code(),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

/// `tartaros run args... -- python3 -c AGENT work` with `--status-fd 9`;
/// returns the output and the status lines.
fn run_agent(mut command: Command, work: &Dir) -> (std::process::Output, Vec<Value>) {
    let (status_read, status_write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    command
        .args(["--", "python3", "-c", AGENT, work.path().to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on_fd9(&mut command, status_write.as_raw_fd());
    let child = KillOnDrop(Some(command.spawn().expect("spawn tartaros")));
    drop(status_write);
    let mut status = String::new();
    std::fs::File::from(status_read)
        .read_to_string(&mut status)
        .unwrap();
    let out = { child }.take().wait_with_output().expect("wait");
    (out, status_lines(&status))
}

#[test]
fn a_root_agent_cannot_set_its_inits_limits_and_the_attempt_is_recorded() {
    if !can_run("init_round23_prlimit_root") {
        return;
    }
    // uid 0 without CAP_DAC_OVERRIDE writes where anyone may.
    let (work, logs) = (Dir::open_to_all(), Dir::new());
    let log = logs.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let mut command = Command::new(bin());
    command
        .args([
            "run",
            "-q",
            "--user",
            "root",
            "--status-fd",
            "9",
            "--write",
            w,
        ])
        .args(["--log", log.to_str().unwrap()])
        .current_dir(work.path());
    let (out, status) = run_agent(command, &work);
    let printed = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        work.join("ran").exists(),
        "the agent did not run: {printed}"
    );
    assert!(printed.contains("prlimit EPERM"), "{printed}");
    assert!(printed.contains("read OK"), "{printed}");
    assert!(printed.contains("own True"), "{printed}");
    assert_eq!(out.status.code(), Some(3), "{printed}\n{status:?}");
    let end = status.last().cloned().unwrap_or_default();
    assert_eq!(end["event"], "exited", "{status:?}");
    assert_eq!(end["code"], 3, "{status:?}");
    let records = records(&log);
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "syscall" && r["target"]["syscall"] == "prlimit64")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let r = refused[0];
    assert_eq!(r["errno"], 1, "{r}");
    assert_eq!(r["decision"], "denied", "{r}");
    assert_eq!(r["target"]["pid"], 1, "{r}");
    assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
    let seal = records.last().cloned().unwrap_or_default();
    assert_eq!(seal["kind"], "seal", "{seal}");
    assert_eq!(seal["exit_status"]["code"], 3, "{seal}");
    assert!(seal.get("not_started").is_none(), "{seal}");
    let (code, line) = verify(&log);
    assert_eq!(code, Some(0), "{line}");
    assert!(!line.contains("never started"), "{line}");
}

/// The ordinary user's own run (no service): the init is the user, root
/// of the run's user namespace, as the agent is.
#[test]
fn an_ordinary_users_agent_cannot_set_its_inits_limits() {
    if !can_run("init_round23_prlimit_user") {
        return;
    }
    let work = owned_dir(TEST_UID);
    let w = work.path().to_str().unwrap();
    let mut command = tartaros_as(
        TEST_UID,
        &["run", "-q", "--status-fd", "9", "--write", w],
        work.path(),
    );
    command.env("TARTAROS_SERVICE", work.join("no-service.sock"));
    let (out, status) = run_agent(command, &work);
    let printed = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        work.join("ran").exists(),
        "the agent did not run: {printed}"
    );
    assert!(printed.contains("prlimit EPERM"), "{printed}");
    assert!(printed.contains("own True"), "{printed}");
    assert_eq!(out.status.code(), Some(3), "{printed}\n{status:?}");
}

/// Whatever ends the init after the agent started (here the host's
/// SIGKILL), the run does not say that the agent never started: the
/// status stream has `started` then `failed` saying the init ended while
/// the agent ran, the seal has no `not_started`, and `verify` says so.
#[test]
fn an_init_killed_while_the_agent_runs_is_not_reported_as_never_started() {
    if !can_run("init_round23_killed_init") {
        return;
    }
    let (work, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let (status_read, status_write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    let mut command = Command::new(bin());
    command
        .args(["run", "-q", "--status-fd", "9", "--write", w])
        .args(["--log", log.to_str().unwrap()])
        .args([
            "--",
            "sh",
            "-c",
            &format!("echo x > {w}/ran; exec sleep 60"),
        ])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on_fd9(&mut command, status_write.as_raw_fd());
    let child = KillOnDrop(Some(command.spawn().expect("spawn tartaros")));
    drop(status_write);
    let mut lines = BufReader::new(std::fs::File::from(status_read)).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    let started: Value = serde_json::from_str(&first).unwrap_or_default();
    assert_eq!(started["event"], "started", "{first}");
    let init = started["pid"].as_i64().unwrap_or(0) as i32;
    assert!(init > 0, "{first}");
    assert!(
        eventually(30, || work.join("ran").exists()),
        "the agent never wrote its file"
    );
    // The init of this run, as the status line named it.
    let comm = std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "tartaros-init", "pid {init}");
    std::thread::sleep(Duration::from_millis(200));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = { child }.take().wait_with_output().expect("wait");
    let printed = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(125), "{printed}\n{rest:?}");
    let end: Value = serde_json::from_str(rest.last().map_or("", |s| s)).unwrap_or_default();
    assert_eq!(end["event"], "failed", "{rest:?}");
    let reason = end["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("while the agent ran"), "{reason}");
    assert!(printed.contains("while the agent ran"), "{printed}");
    let records = records(&log);
    let seal = records.last().cloned().unwrap_or_default();
    assert_eq!(seal["kind"], "seal", "{seal}");
    assert!(seal.get("not_started").is_none(), "{seal}");
    let unknown = seal["end_unknown"].as_str().unwrap_or_default();
    assert!(unknown.contains("while the agent ran"), "{seal}");
    let (code, line) = verify(&log);
    assert_eq!(code, Some(0), "{line}");
    assert!(!line.contains("never started"), "{line}");
    assert!(line.contains("while the agent ran"), "{line}");
}
