//! Adversarial round 19, the service: the agent of an ordinary user's run
//! had the root worker's process attributes, not the caller's. A caller
//! held to `ulimit -u 40 -n 64 -f 100` (as pam_limits sets them) had an
//! agent with the worker's nproc 96367, nofile 20000 and no file size
//! limit; a caller at umask 077, nice 15 and on CPU 0 had an agent at
//! umask 022 (its files world-readable), nice 0 and on every CPU.
//!
//! Seen from the host, while the agent sleeps: its `/proc/<pid>/limits`,
//! `Umask` and `Cpus_allowed_list` in `/proc/<pid>/status`, its nice value
//! in `/proc/<pid>/stat`, and the mode of a file it made. Needs root.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use harness::Service;

const ALICE: u32 = 47_000 + 219;
const CONTROL: u32 = 47_000 + 220;

/// The caller's attributes, set in the launcher before `setpriv` drops to
/// the caller's uid: what a login session with pam_limits, `umask 077`,
/// `renice 15` and `taskset -c 0` hands every process it starts.
#[derive(Clone, Copy)]
struct Lowered {
    limits: &'static [(libc::__rlimit_resource_t, u64)],
    umask: Option<libc::mode_t>,
    nice: Option<i32>,
    cpu0: bool,
}

const NPROC: u64 = 40;
const NOFILE: u64 = 64;
const FSIZE: u64 = 100 * 1024;

const CALLER: Lowered = Lowered {
    limits: &[
        (libc::RLIMIT_NPROC, NPROC),
        (libc::RLIMIT_NOFILE, NOFILE),
        (libc::RLIMIT_FSIZE, FSIZE),
    ],
    umask: Some(0o077),
    nice: Some(15),
    cpu0: true,
};

fn lower(command: &mut Command, lowered: Lowered) {
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe syscalls.
    unsafe {
        command.pre_exec(move || {
            for &(resource, value) in lowered.limits {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(mask) = lowered.umask {
                libc::umask(mask);
            }
            if let Some(nice) = lowered.nice
                && libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if lowered.cpu0 {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The pid of the process of `uid` whose command line is `cmdline`.
fn find(uid: u32, cmdline: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse::<u32>()
            .ok()?;
        (real == uid && cmd == format!("{}\0", cmdline.replace(' ', "\0")).as_bytes())
            .then_some(pid)
    })
}

/// Soft and hard limit of the row `name` of `/proc/<pid>/limits`.
fn limit(pid: i32, name: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let row = text
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    let mut fields = row.split_whitespace().map(|v| match v {
        "unlimited" => u64::MAX,
        v => v.parse().unwrap(),
    });
    (fields.next().unwrap(), fields.next().unwrap())
}

fn status_field(pid: i32, name: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name}"))
        .trim()
        .to_string()
}

/// The nice value, field 19 of `/proc/<pid>/stat`.
fn nice(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    // Fields from the third (state) on; nice is the 19th.
    after.split(' ').nth(16).unwrap().parse().unwrap()
}

/// Starts `command` (a run whose agent makes `made` then sleeps as
/// `sleeper`), waits for the agent, and hands its pid to `check`.
fn with_agent(mut command: Command, uid: u32, made: &Path, sleeper: &str, check: impl FnOnce(i32)) {
    let mut child = KillOnDrop(Some(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    ));
    let mut pid = None;
    let started = eventually(60, || {
        pid = made.exists().then(|| find(uid, sleeper)).flatten();
        pid.is_some()
    });
    if !started {
        let mut taken = child.take();
        let _ = taken.kill();
        let out = taken.wait_with_output().unwrap();
        panic!(
            "the agent did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    check(pid.unwrap());
}

#[test]
fn the_agent_has_the_callers_limits_umask_nice_and_cpus() {
    if !can_run("service_round19_caller_attributes") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let made = work.path().join("made.txt");
    let sleeper = "sleep 61.9";
    let script = format!("echo secret > made.txt; exec {sleeper}");
    let mut command = service.command(
        ALICE,
        &[
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    lower(&mut command, CALLER);
    with_agent(command, ALICE, &made, sleeper, |pid| {
        // Every difference at once, so that a failure names them all.
        let mut wrong = Vec::new();
        for (row, bound) in [
            ("Max processes", NPROC),
            ("Max open files", NOFILE),
            ("Max file size", FSIZE),
        ] {
            let (soft, hard) = limit(pid, row);
            if soft > bound || hard > bound {
                wrong.push(format!("{row} {soft}/{hard}, the caller's {bound}"));
            }
        }
        let umask = status_field(pid, "Umask:");
        if umask != "0077" {
            wrong.push(format!("umask {umask}, the caller's 0077"));
        }
        if nice(pid) < 15 {
            wrong.push(format!("nice {}, the caller's 15", nice(pid)));
        }
        let cpus = status_field(pid, "Cpus_allowed_list:");
        if cpus != "0" {
            wrong.push(format!("CPUs {cpus}, the caller's 0"));
        }
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        if mode != 0o600 {
            wrong.push(format!(
                "the agent's file is {mode:o}: other users may read it"
            ));
        }
        assert!(
            wrong.is_empty(),
            "the agent has more than its caller: {wrong:#?}"
        );
        // The run's own, lower than the caller's, stay.
        assert_eq!(limit(pid, "Max core file size"), (1, 1));
        assert_eq!(limit(pid, "Max realtime priority"), (0, 0));
        assert_eq!(limit(pid, "Max nice priority"), (0, 0));
    });
    drop(service);
}

#[test]
fn a_caller_without_lowered_limits_keeps_working() {
    if !can_run("service_round19_caller_attributes") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CONTROL);
    let made = work.path().join("made.txt");
    let sleeper = "sleep 62.9";
    let script = format!("echo ok > made.txt; exec {sleeper}");
    let command = service.command(
        CONTROL,
        &[
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    with_agent(command, CONTROL, &made, sleeper, |pid| {
        // Nothing lowered that the caller did not lower.
        let (soft, _) = limit(pid, "Max open files");
        assert!(soft > NOFILE, "nofile {soft}");
        assert_eq!(limit(pid, "Max file size"), (u64::MAX, u64::MAX));
        assert_eq!(nice(pid), 0);
        assert_eq!(std::fs::read_to_string(&made).unwrap(), "ok\n");
    });
    // And a whole run ends as it should.
    let out = service.run(
        CONTROL,
        &[
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--",
            "true",
        ],
        work.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_caller_at_its_process_limit_gets_one_line_naming_it() {
    if !can_run("service_round19_caller_attributes") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE + 100);
    let mut command = service.command(ALICE + 100, &["run", "--", "true"], work.path());
    lower(
        &mut command,
        Lowered {
            limits: &[(libc::RLIMIT_NPROC, 1)],
            umask: None,
            nice: None,
            cpu0: false,
        },
    );
    let started = Instant::now();
    let out = command.output().expect("setpriv");
    assert!(started.elapsed() < Duration::from_secs(30), "it hung");
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.contains("on its PATH")).collect();
    assert!(!out.status.success());
    assert!(
        lines.len() == 1 && lines[0].contains("RLIMIT_NPROC"),
        "not one line naming the limit: {err}"
    );
}

#[test]
fn a_root_launchers_own_nice_value_stays() {
    if !can_run("service_round19_caller_attributes") {
        return;
    }
    let work = Dir::new();
    let made = work.path().join("made.txt");
    let sleeper = "sleep 63.9";
    let script = format!("echo ok > made.txt; exec {sleeper}");
    let mut command = Command::new(bin());
    command
        .args([
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .current_dir(work.path());
    lower(
        &mut command,
        Lowered {
            limits: &[],
            umask: None,
            nice: Some(10),
            cpu0: false,
        },
    );
    with_agent(command, 65534, &made, sleeper, |pid| {
        assert_eq!(nice(pid), 10, "`nice -n 10 tartaros run` keeps 10");
    });
    let _ = tartaros(&["cache", "drop"], Path::new("/"));
}
