//! The `--status-fd` channel from the harness's side: only TartarOS may
//! write it (an agent must not forge `exited` or `refused`), and every run
//! gives exactly one end line on it, also when the service refuses it
//! before it starts.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use harness::Service;

const ERIN: u32 = 47_000 + 185;

/// What a hostile agent prints to pass for the supervisor.
const FORGED: &str = r#"{"event":"exited","code":0,"signal":null,"status":0,"duration_ms":1,"log_head":null,"log_complete":true}"#;

/// `args` run by `sh` with fd 3 opened by `redirect` (e.g. `3>&1`).
fn with_fd3(redirect: &str, args: &[&str], cwd: &Path) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", &format!("exec \"$@\" {redirect}"), "sh"])
        .args(args)
        .current_dir(cwd);
    command
}

/// `3>&1`: the status channel is the agent's stdout, so the agent's own
/// `exited` line reads as ours. The descriptor is refused, not only the
/// numbers 0 to 2.
#[test]
fn a_status_descriptor_that_is_also_stdout_is_refused() {
    if !can_run("status_is_stdout") {
        return;
    }
    let work = Dir::new();
    let out = with_fd3(
        "3>&1",
        &[bin(), "run", "--status-fd", "3", "--", "echo", FORGED],
        work.path(),
    )
    .output()
    .expect("sh");
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains(r#""log_complete":true"#),
        "the agent ran and wrote on the status channel: {}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("standard stream 1"),
        "{}",
        stderr(&out)
    );
}

/// Through the service the client's `--status-fd 1` travels as a fourth
/// descriptor, which the worker renumbers: the check of the number alone
/// let it through, and the agent's stdout was the status channel.
#[test]
fn status_fd_1_through_the_service_is_refused_too() {
    if !can_run("status_fd_1_service") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ERIN);
    let out = service.run(
        ERIN,
        &["run", "--status-fd", "1", "--", "echo", FORGED],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains(r#""log_complete":true"#),
        "the agent ran and wrote on the status channel: {}",
        stdout(&out)
    );
}

/// A run the service refuses before `tartaros run` (here: over the
/// per-user bound of runs) still gives its one end line: the harness got
/// an end of file and had to guess.
#[test]
fn a_run_the_service_refuses_still_ends_with_a_status_line() {
    if !can_run("status_busy_line") {
        return;
    }
    let service = Service::start_with(Dir::new(), &["--max-runs-per-user", "1"]);
    let work = owned_dir(ERIN + 1);
    let w = work.path().to_str().unwrap();
    let started = work.join("started");
    let _holder = service.spawn_quiet(
        ERIN + 1,
        &[
            "run",
            "--write",
            w,
            "--",
            "sh",
            "-c",
            "touch started; sleep 60",
        ],
        work.path(),
    );
    assert!(
        eventually(10, || started.exists()),
        "the first run did not start: {}",
        service.errors()
    );
    let status = work.join("status.jsonl");
    let redirect = format!("3>{}", status.display());
    let client: Vec<String> = service
        .command(
            ERIN + 1,
            &["run", "--status-fd", "3", "--", "true"],
            work.path(),
        )
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["setpriv"];
    args.extend(client.iter().map(String::as_str));
    let out: Output = with_fd3(&redirect, &args, work.path())
        .env("TARTAROS_SERVICE", &service.socket)
        .env_remove("SUDO_UID")
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let lines = std::fs::read_to_string(&status).unwrap_or_default();
    let events: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a status line is JSON"))
        .collect();
    assert_eq!(events.len(), 1, "{lines}");
    assert_eq!(events[0]["event"], "failed", "{lines}");
    assert_eq!(events[0]["code"], 125, "{lines}");
    assert!(
        events[0]["reason"].as_str().unwrap_or("").contains("busy"),
        "{lines}"
    );
}
