//! Helpers of `containment_proc.rs`: signals, bounded waits, the test's
//! own cgroups in each hierarchy, launcher cgroups and killed runs.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::common::*;

/// The tests here count cgroups and sweep debris: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A unique `sleep` argument for this test process and `name`.
pub fn marker(name: &str) -> String {
    format!("2000.{}{}", std::process::id(), name.len())
}

pub fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).expect("signal tartaros");
}

/// Waits for `child` up to `bound`; returns its exit code and how long it
/// took, or fails (the KillOnDrop guard then kills it).
pub fn wait_within(child: &mut KillOnDrop, bound: Duration) -> (Option<i32>, Duration) {
    let start = Instant::now();
    let process = child.0.as_mut().expect("child");
    loop {
        if let Some(status) = process.try_wait().expect("wait") {
            return (status.code(), start.elapsed());
        }
        assert!(
            start.elapsed() < bound,
            "tartaros still running after {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn spawn(args: &[&str], cwd: &Path) -> KillOnDrop {
    KillOnDrop(Some(
        Command::new(bin())
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tartaros"),
    ))
}

pub fn stderr_of(child: &mut KillOnDrop) -> String {
    let mut text = String::new();
    if let Some(mut err) = child.0.as_mut().and_then(|c| c.stderr.take()) {
        let _ = err.read_to_string(&mut text);
    }
    text
}

/// An agent that ignores SIGTERM, SIGINT and SIGHUP (and whose children
/// inherit that), as in issue 12.
pub fn stubborn(m: &str) -> String {
    format!("trap '' TERM INT HUP QUIT; sleep {m} & sleep {m}; wait")
}

/// The directory of `controller`'s hierarchy this process lives in.
pub fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    match tartaros::cgroup::find_controller(controller)? {
        tartaros::cgroup::Controller::V1(mount) => {
            Some(mount.join(tartaros::cgroup::own_v1_path(&text, controller)?))
        }
        tartaros::cgroup::Controller::V2 => tartaros::cgroup::own_v2_dir(),
    }
}

/// Launcher cgroups made by a test, removed (after their processes) on drop.
pub struct Launcher {
    pub dirs: Vec<PathBuf>,
}

impl Drop for Launcher {
    fn drop(&mut self) {
        for dir in self.dirs.iter().rev() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while dir.exists() && std::fs::remove_dir(dir).is_err() && Instant::now() < deadline {
                if let Ok(list) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in list.lines().filter_map(|l| l.parse::<i32>().ok()) {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn counter(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The run cgroup of supervisor `pid` under `parent`, if any.
pub fn run_cgroup_of(parent: &Path, pid: u32) -> Option<PathBuf> {
    let prefix = format!("tartaros-{pid}-");
    std::fs::read_dir(parent)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

/// The janitor of supervisor `pid`: its child that leads its own session.
pub fn janitor_of(pid: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        // state ppid pgrp session
        if fields[1] == pid.to_string() && fields[3] == child.to_string() {
            return Some(child);
        }
    }
    None
}

/// Starts a run, SIGKILLs its janitor and then its supervisor, and returns
/// the cgroups the run left behind.
pub fn leave_debris(work: &Path, m: &str) -> Vec<PathBuf> {
    let mut child = spawn(&["run", "--", "sleep", m], work);
    assert!(
        eventually(10, || processes_with(m).len() == 1),
        "agent did not start"
    );
    let supervisor = child.id();
    let janitor = janitor_of(supervisor).expect("the janitor");
    kill(Pid::from_raw(janitor), Signal::SIGKILL).unwrap();
    signal(supervisor, Signal::SIGKILL);
    let _ = child.take().wait();
    assert!(
        eventually(5, || processes_with(m).is_empty()),
        "the sandbox outlived its supervisor"
    );
    let parents: Vec<PathBuf> = ["pids", "memory"]
        .iter()
        .filter_map(|c| own_cgroup(c))
        .chain(tartaros::cgroup::own_v2_dir())
        .collect();
    let left: Vec<PathBuf> = parents
        .iter()
        .filter_map(|p| run_cgroup_of(p, supervisor))
        .collect();
    assert!(
        !left.is_empty(),
        "nothing left behind: the test proves nothing"
    );
    left
}
