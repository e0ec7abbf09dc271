//! The effect log contracts of DESIGN.md section 6 that hold for every run.

mod common;

use common::*;

fn verify(log: &std::path::Path) -> (i32, String) {
    let out = tartaros(
        &["log", "verify", log.to_str().unwrap()],
        std::path::Path::new("/"),
    );
    (out.status.code().unwrap_or(-1), stdout(&out))
}

#[test]
fn the_agent_cannot_open_truncate_rename_or_delete_the_log() {
    if !can_run("log_protected") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let l = log.display();
    let code = format!(
        "{ATTEMPT}
attempt('read', lambda: open('{l}').read())
attempt('append', lambda: open('{l}', 'a').write('forged'))
attempt('truncate', lambda: os.truncate('{l}', 0))
attempt('rename', lambda: os.rename('{l}', '{l}.old'))
attempt('unlink', lambda: os.unlink('{l}'))
attempt('control', lambda: open('{}/other', 'w').write('x'))",
        work.path().display()
    );
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "read", "EACCES");
    expect(&out, "append", "EACCES");
    // The log is hidden under /dev/null on a nodev mount: truncate(2) of
    // a device node is EINVAL, before any permission check.
    expect(&out, "truncate", "EINVAL");
    // The live log's inode is append-only (`append_only.rs`), which the
    // kernel checks before it finds the name a mount point (EBUSY).
    expect(&out, "rename", "EPERM");
    expect(&out, "unlink", "EPERM");
    expect(&out, "control", "OK");
    assert_eq!(verify(&log).0, 0, "{}", verify(&log).1);
}

#[test]
fn a_killed_supervisor_leaves_a_log_that_verifies_as_unsealed() {
    if !can_run("log_unsealed") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let marker = format!("1000.{}77", std::process::id());
    let mut supervisor = spawn_quiet(
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sleep",
            &marker,
        ],
        work.path(),
    );
    assert!(
        eventually(5, || !processes_with(&marker).is_empty()),
        "agent did not start"
    );
    let mut child = supervisor.take();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(5, || processes_with(&marker).is_empty()),
        "sandbox survived"
    );
    let (code, message) = verify(&log);
    assert_eq!(code, 2, "{message}");
    assert!(message.contains("unsealed"), "{message}");
}

#[test]
fn a_normal_run_seals_the_log_with_the_exit_status() {
    if !can_run("log_sealed") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let out = tartaros(
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "exit 7",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(7));
    let (code, message) = verify(&log);
    assert_eq!(code, 0, "{message}");
    let text = std::fs::read_to_string(&log).unwrap();
    let seal = text.lines().last().unwrap();
    assert!(
        seal.contains("\"kind\":\"seal\"") && seal.contains("\"exit_status\":{\"code\":7}"),
        "{seal}"
    );
    assert!(seal.contains("\"cgroup_empty\":true"), "{seal}");
}

/// Runs `sh -c script` under `--log` in `work` and returns the log's lines.
fn logged_run(
    work: &Dir,
    extra: &[&str],
    script: &str,
) -> (std::process::Output, Vec<serde_json::Value>) {
    let log = work.join("effects.jsonl");
    let _ = std::fs::remove_file(&log);
    let mut args = vec![
        "run",
        "--write",
        work.path().to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let out = tartaros(&args, work.path());
    let records = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out, records)
}

fn find<'a>(
    records: &'a [serde_json::Value],
    kind: &str,
    needle: &str,
    decision: &str,
) -> Option<&'a serde_json::Value> {
    records.iter().find(|r| {
        r["kind"] == kind && r["decision"] == decision && r["target"].to_string().contains(needle)
    })
}

#[test]
fn an_exec_by_a_daemonized_grandchild_after_the_first_process_exited_is_logged() {
    if !can_run("log_daemon_exec") {
        return;
    }
    let work = Dir::new();
    let marker = format!("daemon-marker-{}", std::process::id());
    // The agent exits at once; the daemon execs a moment later, before the
    // run tears the sandbox down.
    let script = format!("(setsid sh -c 'sleep 0.2; exec /bin/echo {marker}' &) ; sleep 0.5");
    let (_, records) = logged_run(&work, &[], &script);
    assert!(
        find(&records, "exec", &marker, "allowed").is_some(),
        "no exec of the daemon: {records:?}"
    );
}

#[test]
fn file_changes_are_logged_with_their_verdicts() {
    if !can_run("log_file_verdicts") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::open_to_all();
    let o = outside.path().display();
    let script = format!("echo ok > inside.txt; (echo x > {o}/escape.txt) 2>/dev/null; true");
    let (_, records) = logged_run(&work, &[], &script);
    let allowed = find(&records, "create", "inside.txt", "allowed");
    assert!(allowed.is_some(), "no allowed create: {records:?}");
    let denied = find(&records, "create", "escape.txt", "denied").expect("no denied create");
    // The read-only base answers before Landlock does.
    assert_eq!(denied["errno"], 30, "EROFS: {denied}");
}

#[test]
fn denied_connects_to_ipv4_and_ipv6_destinations_are_logged() {
    if !can_run("log_connects") {
        return;
    }
    let work = Dir::new();
    // Documentation addresses: no packet leaves the sandbox's namespace.
    let script = "python3 -c \"
import socket
for fam, addr in ((socket.AF_INET, ('192.0.2.1', 80)), (socket.AF_INET6, ('2001:db8::1', 443))):
    s = socket.socket(fam)
    print(s.connect_ex(addr))
\"";
    let (out, records) = logged_run(&work, &[], script);
    assert_eq!(stdout(&out), "1\n1\n", "EPERM twice: {}", stderr(&out));
    for needle in ["192.0.2.1", "2001:db8::1"] {
        let record = find(&records, "connect", needle, "denied")
            .unwrap_or_else(|| panic!("no record for {needle}"));
        assert_eq!(record["errno"], 1);
    }
}

#[test]
fn the_agents_attempts_on_the_log_are_logged_as_denied() {
    if !can_run("log_attempts") {
        return;
    }
    let work = Dir::new();
    let l = work.join("effects.jsonl");
    let l = l.display();
    let script = format!(
        "(echo forged >> {l}) 2>/dev/null; (mv {l} {l}.x) 2>/dev/null; (rm -f {l}) 2>/dev/null; true"
    );
    let (_, records) = logged_run(&work, &[], &script);
    // An open with O_CREAT is recorded as `create`.
    for kinds in [&["open", "create"][..], &["rename"], &["unlink"]] {
        assert!(
            records
                .iter()
                .any(|r| kinds.contains(&r["kind"].as_str().unwrap_or(""))
                    && r["decision"] == "denied"
                    && r["target"].to_string().contains("effects.jsonl")),
            "no denied {kinds:?} of the log: {records:?}"
        );
    }
}

#[test]
fn a_tiny_ring_buffer_under_a_flood_counts_every_lost_event_and_verify_says_incomplete() {
    if !can_run("log_gaps") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let n = 20_000;
    // Each `open` of the marker for writing is one event. The flood waits
    // until the supervisor is stopped, so that nothing reads the ring
    // buffer meanwhile: a fast reader could otherwise keep up with it.
    let script = format!(
        "touch flood.ready; while [ ! -e flood.go ]; do sleep 0.01; done; python3 -c \"
import os
for _ in range({n}):
    os.close(os.open('flood.marker', os.O_WRONLY | os.O_CREAT, 0o644))
open('flood.done', 'w').close()
\""
    );
    let mut supervisor = spawn_quiet(
        &[
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--log-buffer",
            "64K",
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    assert!(
        eventually(10, || work.join("flood.ready").exists()),
        "the agent did not start"
    );
    let pid = supervisor.id() as libc::pid_t;
    // SAFETY: `pid` is our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Every thread stopped (the reader among them) before the flood: on a
    // busy host the stop lands late, and the reader could keep up.
    assert!(
        eventually(10, || all_threads_stopped(pid)),
        "the supervisor did not stop"
    );
    std::fs::write(work.join("flood.go"), "").unwrap();
    let flooded = eventually(30, || work.join("flood.done").exists());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(flooded, "the flood did not finish");
    let status = supervisor.take().wait().unwrap();
    // The agent exited 0, but its log lost events: the run says so.
    assert_eq!(
        status.code(),
        Some(tartaros::exit::LOG_INCOMPLETE),
        "{status}"
    );
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let logged = records
        .iter()
        .filter(|r| {
            ["open", "create"].contains(&r["kind"].as_str().unwrap_or(""))
                && r["target"].to_string().contains("flood.marker")
        })
        .count() as u64;
    let lost: u64 = records
        .iter()
        .filter(|r| r["kind"] == "gap")
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    assert!(
        lost > 0,
        "the flood should overflow a 64 KiB ring ({logged} logged)"
    );
    // Lost events of other kinds (the python start-up) may be counted too,
    // so every marker open is either logged or within the lost count.
    assert!(
        logged + lost >= n,
        "{logged} logged + {lost} lost < {n} generated"
    );
    let seal = records.last().unwrap();
    assert_eq!(seal["kind"], "seal");
    assert_eq!(seal["lost"].as_u64().unwrap(), lost);
    let (code, message) = verify(&work.join("effects.jsonl"));
    assert_eq!(code, 3, "{message}");
}

/// Whether every thread of `pid` is stopped (state `T` in its stat).
fn all_threads_stopped(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let state = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .next()?
                    .to_owned();
                Some(state == "T")
            })
            .unwrap_or(false)
    })
}
