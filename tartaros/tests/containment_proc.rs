//! Process, cgroup and gateway containment (issue 12, classes 4, 5, 8, 9
//! and 12), against the real kernel, as root. Every check is made from the
//! host side: exit statuses and timings seen by the launcher, kernel
//! counters of the cgroups (pids.events, memory.oom_control), directories
//! in the cgroup trees, processes in /proc, and the sealed log.

mod common;
#[path = "support/containment.rs"]
mod containment;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use containment::*;
use nix::sys::signal::Signal;

#[test]
fn an_agent_that_ignores_sigterm_is_killed_after_the_grace_period() {
    if !can_run("grace_period") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let m = marker("grace");
    let script = stubborn(&m);
    let mut child = spawn(
        &["run", "--kill-after", "1s", "--", "sh", "-c", &script],
        work.path(),
    );
    assert!(
        eventually(10, || processes_with(&m).len() == 2),
        "agent did not start"
    );
    signal(child.id(), Signal::SIGTERM);
    let (code, took) = wait_within(&mut child, Duration::from_secs(8));
    eprintln!("killed {took:?} after SIGTERM with --kill-after 1s");
    assert_eq!(code, Some(137), "{}", stderr_of(&mut child));
    assert!(
        took >= Duration::from_millis(900),
        "killed before the grace period: {took:?}"
    );
    assert!(
        stderr_of(&mut child).contains("--kill-after"),
        "no reason on stderr"
    );
    assert!(
        eventually(2, || processes_with(&m).is_empty()),
        "agent processes survived: {:?}",
        processes_with(&m)
    );
}

/// Whether process `pid` has a handler for signal `sig` (SigCgt).
fn catches(pid: u32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

#[test]
fn a_sigterm_during_start_up_is_not_lost() {
    if !can_run("early_sigterm") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let m = marker("early-term");
    let script = stubborn(&m);
    let mut child = spawn(
        &["run", "--kill-after", "1s", "--", "sh", "-c", &script],
        work.path(),
    );
    // As soon as the supervisor handles SIGTERM (before the agent runs,
    // in most runs): the signal must end the run, not be swallowed, and
    // not kill tartaros outright (which would leave the sandbox to the
    // janitor and give no exit status).
    assert!(eventually(5, || catches(child.id(), libc::SIGTERM)));
    signal(child.id(), Signal::SIGTERM);
    let (code, took) = wait_within(&mut child, Duration::from_secs(8));
    assert!(
        matches!(code, Some(137) | Some(143)),
        "{code:?}: {}",
        stderr_of(&mut child)
    );
    eprintln!("an early SIGTERM ended the run after {took:?}");
    assert!(eventually(2, || processes_with(&m).is_empty()));
}

#[test]
fn a_second_sigint_kills_at_once() {
    if !can_run("second_sigint") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let m = marker("second-int");
    let script = stubborn(&m);
    // A grace period far longer than the test bound: only the second
    // SIGINT can end the run in time.
    let mut child = spawn(
        &["run", "--kill-after", "10m", "--", "sh", "-c", &script],
        work.path(),
    );
    assert!(eventually(10, || processes_with(&m).len() == 2));
    signal(child.id(), Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.0.as_mut().unwrap().try_wait().unwrap().is_none(),
        "one SIGINT must only be forwarded"
    );
    assert_eq!(processes_with(&m).len(), 2, "the agent ignores SIGINT");
    signal(child.id(), Signal::SIGINT);
    let (code, took) = wait_within(&mut child, Duration::from_secs(5));
    eprintln!("killed {took:?} after the second SIGINT");
    assert_eq!(code, Some(137), "{}", stderr_of(&mut child));
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(eventually(2, || processes_with(&m).is_empty()));
}

#[test]
fn timeout_ends_the_run_with_124_and_says_so_in_the_log() {
    if !can_run("timeout") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("run.jsonl");
    let m = marker("timeout");
    let script = stubborn(&m);
    let started = Instant::now();
    let mut child = spawn(
        &[
            "run",
            "--timeout",
            "1s",
            "--kill-after",
            "500ms",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    let (code, _) = wait_within(&mut child, Duration::from_secs(15));
    let took = started.elapsed();
    eprintln!("--timeout 1s --kill-after 500ms ended the run {took:?} after start");
    let err = stderr_of(&mut child);
    assert_eq!(code, Some(124), "{err}");
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert!(err.contains("--timeout"), "{err}");
    assert!(eventually(2, || processes_with(&m).is_empty()));
    // The log is sealed with the status and records the supervisor's
    // SIGTERM and SIGKILL with their reason.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seal = lines.last().unwrap();
    assert_eq!(seal["kind"], "seal", "{seal}");
    assert_eq!(
        seal["exit_status"],
        serde_json::json!({"code": 124}),
        "{seal}"
    );
    let reasons: Vec<(i64, String)> = lines
        .iter()
        .filter(|l| l["kind"] == "signal" && l["target"]["by"] == "supervisor")
        .map(|l| {
            (
                l["target"]["signal"].as_i64().unwrap_or(0),
                l["target"]["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        reasons.contains(&(15, "timeout".into())) && reasons.contains(&(9, "timeout".into())),
        "{reasons:?}"
    );
    // Control: a run that ends in time keeps its own status.
    let out = tartaros(
        &["run", "--timeout", "30s", "--", "sh", "-c", "exit 3"],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let bad = tartaros(&["run", "--timeout", "soon", "--", "true"], work.path());
    assert_eq!(bad.status.code(), Some(78));
    assert!(stderr(&bad).starts_with("tartaros:"), "{}", stderr(&bad));
}

/// Issue 12, class 9: a host service that keeps a relayed connection open
/// must not keep tartaros alive, or its log unsealed.
#[test]
fn a_held_open_relay_connection_does_not_keep_the_run_alive() {
    if !can_run("held_relay") {
        return;
    }
    let _serial = serial();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    // The host service: accepts, reads, never answers, never closes.
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for stream in host.incoming().flatten() {
            keep.lock().unwrap().push(stream);
        }
    });
    let work = Dir::new();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("relay.jsonl");
    // The agent leaves a daemon holding its end open too; the run's end
    // kills it, and the relay must let go of the host side.
    let code = format!(
        "import socket, os, time\n\
         s = socket.create_connection(('127.0.0.1', {port}))\n\
         s.sendall(b'hello')\n\
         if os.fork() == 0:\n\
         \x20   time.sleep(600)\n\
         print('connected', flush=True)\n"
    );
    let mut child = KillOnDrop(Some(
        Command::new(bin())
            .args([
                "run",
                "--port",
                &port.to_string(),
                "--log",
                log.to_str().unwrap(),
                "--",
                "python3",
                "-c",
                &code,
            ])
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    // Bounded: before the fix tartaros waited for the host service forever.
    let (status, took) = wait_within(&mut child, Duration::from_secs(10));
    let out = child.take().wait_with_output().unwrap();
    assert_eq!(status, Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("connected"), "{}", stderr(&out));
    eprintln!("tartaros ended {took:?} after start with the relay held open");
    assert!(
        !held.lock().unwrap().is_empty(),
        "the relay never reached the host service"
    );
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    let text = std::fs::read_to_string(&log).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(last.contains("\"kind\":\"seal\""), "log not sealed: {last}");
    assert!(
        text.lines().any(|l| l.contains("\"via\":\"port-forward\"")),
        "the relayed connection is not in the log"
    );
    assert_ne!(verify.status.code(), Some(2), "{}", stdout(&verify));
}

/// Issue 12, class 4: a launcher held to 40 processes and 256 MiB runs
/// tartaros asking for more; the kernel holds the sandbox to the launcher's
/// limits, because every cgroup of the run nests under the launcher's.
#[test]
fn the_sandbox_cannot_exceed_the_launchers_limits() {
    if !can_run("launcher_limits") {
        return;
    }
    let _serial = serial();
    let v1 = |c| {
        matches!(
            tartaros::cgroup::find_controller(c),
            Some(tartaros::cgroup::Controller::V1(_))
        )
    };
    if !(v1("pids") && v1("memory")) {
        // A pure-v2 launcher needs its limits on a parent of a leaf cgroup
        // (no internal processes); this test covers the hybrid hosts.
        skip(
            "launcher_limits",
            "pids and memory are not v1 hierarchies here",
        );
        return;
    }
    let name = format!("tt-launcher-{}", std::process::id());
    let pids = own_cgroup("pids").unwrap().join(&name);
    let memory = own_cgroup("memory").unwrap().join(&name);
    let unified = tartaros::cgroup::own_v2_dir().unwrap().join(&name);
    let mut launcher = Launcher { dirs: Vec::new() };
    for dir in [&pids, &memory, &unified] {
        std::fs::create_dir(dir).unwrap();
        launcher.dirs.push(dir.clone());
    }
    std::fs::write(pids.join("pids.max"), "40").unwrap();
    std::fs::write(
        memory.join("memory.limit_in_bytes"),
        (256u64 << 20).to_string(),
    )
    .unwrap();
    let memsw = memory.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        std::fs::write(&memsw, (256u64 << 20).to_string()).unwrap();
    }
    let work = Dir::new();
    let enter = format!(
        "for d in {} {} {}; do echo $$ > \"$d/cgroup.procs\" || exit 99; done; exec \"$@\"",
        pids.display(),
        memory.display(),
        unified.display()
    );
    let in_launcher = |agent: &str| {
        Command::new("sh")
            .args(["-c", &enter, "launcher", bin(), "run", "--max-procs", "200"])
            .args(["--max-memory", "600M", "--", "python3", "-c", agent])
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };

    // Fork bomb: children that sleep, until fork fails.
    let bomb = "import os, time, sys\n\
                n = 0\n\
                kids = []\n\
                try:\n\
                \x20   while n < 200:\n\
                \x20       pid = os.fork()\n\
                \x20       if pid == 0:\n\
                \x20           time.sleep(60); os._exit(0)\n\
                \x20       kids.append(pid); n += 1\n\
                except OSError as e:\n\
                \x20   pass\n\
                print('forked', n, flush=True)\n\
                time.sleep(2)\n";
    let mut child = KillOnDrop(Some(in_launcher(bomb)));
    // While it runs: the run's cgroups are children of the launcher's.
    let nested = |parent: &Path| {
        std::fs::read_dir(parent)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("tartaros-"))
            })
            .unwrap_or(false)
    };
    assert!(
        eventually(10, || nested(&pids) && nested(&memory) && nested(&unified)),
        "the run's cgroups are not under the launcher's (pids {}, memory {}, v2 {})",
        nested(&pids),
        nested(&memory),
        nested(&unified)
    );
    let mut line = String::new();
    let out = child.0.as_mut().unwrap().stdout.take().unwrap();
    BufReader::new(out).read_line(&mut line).unwrap();
    // While the bomb holds its children: the launcher is at its limit,
    // and the run's own cgroup (limit 200), where the forks happen, is
    // where the kernel counts the refusals (v1 pids.events).
    let at_limit = std::fs::read_to_string(pids.join("pids.current")).unwrap();
    let run = run_cgroup_of(&pids, child.id()).expect("the run's pids cgroup under the launcher's");
    let run_max = std::fs::read_to_string(run.join("pids.max")).unwrap();
    let refused = counter(&run.join("pids.events"), "max ");
    let forked: u32 = line
        .trim()
        .strip_prefix("forked ")
        .unwrap()
        .parse()
        .unwrap();
    let output = child.take().wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        forked < 40,
        "forked {forked} processes past the launcher's 40"
    );
    assert_eq!(at_limit.trim(), "40", "the launcher was not at its limit");
    assert_eq!(run_max.trim(), "200");
    assert!(
        refused > 0,
        "the kernel refused no fork in the run's cgroup"
    );

    // Memory hog: the launcher's 256 MiB binds although --max-memory says 600M.
    let hog = "chunks = []\n\
               for i in range(40):\n\
               \x20   chunks.append(bytearray(16 << 20))\n\
               print('allocated 640 MiB', flush=True)\n";
    let output = in_launcher(hog).wait_with_output().unwrap();
    assert!(
        !stdout(&output).contains("allocated"),
        "the hog got 640 MiB: {}",
        stderr(&output)
    );
    assert_eq!(output.status.code(), Some(137), "{}", stderr(&output));
    // The launcher's own counter hit its limit (the OOM kill itself is
    // counted in the run's cgroup, which is gone by now).
    // With swap accounting the memory+swap counter (same limit) is
    // charged first and counts the failures.
    let failcnt: u64 = ["memory.failcnt", "memory.memsw.failcnt"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(memory.join(f)).ok())
        .filter_map(|t| t.trim().parse::<u64>().ok())
        .sum();
    let peak: u64 = std::fs::read_to_string(memory.join("memory.max_usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // (With memory+swap accounting limited too, v1 counts no failcnt;
    // the peak then sits exactly at the limit.)
    assert!(
        failcnt > 0 || peak == 256 << 20,
        "the launcher's memory limit was never reached (peak {peak}): {}",
        stderr(&output)
    );
    assert!(peak <= 256 << 20, "the launcher's cgroup used {peak} bytes");
    drop(launcher);
}

/// Issue 12, class 5: no flags still means limits, in the genesis and in
/// the kernel; a task bomb stops at the default.
#[test]
fn a_run_without_flags_has_default_limits() {
    if !can_run("default_limits") {
        return;
    }
    let _serial = serial();
    if !(tartaros::cgroup::can_limit("pids") && tartaros::cgroup::can_limit("memory")) {
        skip(
            "default_limits",
            "this host's cgroups cannot take a limit from the supervisor's cgroup (docs/architecture.md, Resource limits)",
        );
        return;
    }
    let defaults = tartaros::limits::host_defaults();
    let procs = defaults.max_procs.unwrap();
    let work = Dir::new();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("defaults.jsonl");
    // Threads count as tasks for the pids controller, and cost far less
    // than processes: the bomb starts threads until the kernel says no.
    let bomb = "import threading, time\n\
                stop = threading.Event()\n\
                n = 0\n\
                try:\n\
                \x20   while n < 100000:\n\
                \x20       threading.Thread(target=stop.wait, daemon=True).start(); n += 1\n\
                except RuntimeError:\n\
                \x20   pass\n\
                print('threads', n, flush=True)\n\
                time.sleep(3)\n\
                stop.set()\n";
    let mut child = KillOnDrop(Some(
        Command::new(bin())
            .args([
                "run",
                "--log",
                log.to_str().unwrap(),
                "--",
                "python3",
                "-c",
                bomb,
            ])
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let mut line = String::new();
    let out = child.0.as_mut().unwrap().stdout.take().unwrap();
    BufReader::new(out).read_line(&mut line).unwrap();
    // While the bomb holds its threads, read the kernel's side.
    let parent = own_cgroup("pids").unwrap();
    let cgroup = run_cgroup_of(&parent, child.id()).expect("the run's pids cgroup");
    let max = std::fs::read_to_string(cgroup.join("pids.max")).unwrap();
    let refused = counter(&cgroup.join("pids.events"), "max ");
    let threads: u64 = line
        .trim()
        .strip_prefix("threads ")
        .unwrap()
        .parse()
        .unwrap();
    let output = child.take().wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(max.trim(), procs.to_string());
    assert!(refused > 0, "the default pids limit was never hit");
    assert!(
        threads < procs,
        "{threads} threads under a limit of {procs}"
    );
    let genesis: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let policy = &genesis["policy"];
    assert_eq!(policy["max_processes"], procs, "{policy}");
    assert_eq!(
        policy["max_memory"],
        defaults.max_memory.unwrap(),
        "{policy}"
    );
    // Flags raise and lower the defaults.
    let raised_log = logs.path().join("raised.jsonl");
    let raised = (procs * 2).to_string();
    let out = tartaros(
        &[
            "run",
            "--max-procs",
            &raised,
            "--log",
            raised_log.to_str().unwrap(),
            "--",
            "true",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let genesis: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&raised_log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(genesis["policy"]["max_processes"], procs * 2);
    let lowered = tartaros(
        &["run", "--max-procs", "20", "--", "python3", "-c", bomb],
        work.path(),
    );
    let n: u64 = stdout(&lowered)
        .lines()
        .find_map(|l| l.strip_prefix("threads ")?.parse().ok())
        .unwrap();
    assert!(n < 20, "{n} threads under --max-procs 20");
}

/// Issue 12, class 12: both the supervisor and the janitor SIGKILLed; the
/// next run and `doctor --clean` remove the leftovers, never a live run's.
#[test]
fn debris_of_killed_runs_is_swept_but_live_runs_are_kept() {
    if !can_run("debris") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    // A live run beside the debris must survive the sweep. (Started first:
    // a run's start sweeps its own parents, which would leave doctor
    // nothing to do.)
    let live_m = marker("debris-live-run");
    let mut live = spawn(&["run", "--", "sleep", &live_m], work.path());
    assert!(eventually(10, || processes_with(&live_m).len() == 1));
    let live_cgroup = run_cgroup_of(&tartaros::cgroup::own_v2_dir().unwrap(), live.id())
        .expect("the live run's cgroup");
    let left = leave_debris(work.path(), &marker("debris-one"));
    let report = Command::new(bin()).arg("doctor").output().unwrap();
    assert!(
        stdout(&report).contains("leftover cgroups"),
        "doctor does not report the leftovers: {}",
        stdout(&report)
    );
    let out = Command::new(bin())
        .args(["doctor", "--clean"])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("leftover run cgroup"),
        "{}",
        stdout(&out)
    );
    // (Another run on this host may have swept some first: every run
    // sweeps its own parents. Either way they must be gone, and doctor
    // must have removed at least one itself.)
    assert!(
        left.iter()
            .any(|d| stdout(&out).contains(&d.display().to_string())),
        "doctor --clean removed none of {left:?}: {}",
        stdout(&out)
    );
    for dir in &left {
        assert!(
            !dir.exists(),
            "doctor --clean left {}: {}",
            dir.display(),
            stdout(&out)
        );
    }
    assert!(
        live_cgroup.exists(),
        "doctor --clean removed a live run's cgroup"
    );
    assert_eq!(
        processes_with(&live_m).len(),
        1,
        "doctor --clean killed a live agent"
    );
    signal(live.id(), Signal::SIGTERM);
    let (code, _) = wait_within(&mut live, Duration::from_secs(15));
    assert_eq!(code, Some(143));

    // The next run sweeps its own parents.
    let left = leave_debris(work.path(), &marker("debris-two"));
    let out = tartaros(&["run", "--", "true"], work.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for dir in &left {
        assert!(!dir.exists(), "the next run left {}", dir.display());
    }
    assert!(stderr(&out).contains("leftover cgroup"), "{}", stderr(&out));
}
