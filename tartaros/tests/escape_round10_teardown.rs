//! Adversarial round 10: a supervisor SIGKILLed while it starts (the
//! OOM killer, `kill -9`, `timeout -s KILL`) must leave nothing of the run
//! on the host: no process, no cgroup, no placeholder in the user's tree
//! and no marker of one in the placeholder registry.
//! Proved from the host: the tree listed, /proc and the cgroup
//! hierarchies read after the kill.

mod common;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// Every process in a cgroup named after `supervisor` (`tartaros-<pid>-*`),
/// and every such cgroup directory, in any hierarchy.
fn left_of(supervisor: u32) -> Vec<String> {
    let name = format!("tartaros-{supervisor}-");
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(cgroups) = std::fs::read_to_string(entry.path().join("cgroup"))
            && cgroups.contains(&name)
        {
            left.push(format!("process {}", entry.file_name().to_string_lossy()));
        }
    }
    let mut stack = vec![(Path::new("/sys/fs/cgroup").to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if !kind.is_dir() {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(&name) {
                left.push(format!("cgroup {}", entry.path().display()));
            } else if depth < 4 {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    left
}

/// Names left in `dir` that were not there before the run.
fn placeholders_left(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The registry's markers (and staged markers) of `denies` still there.
fn markers_left(denies: &[String]) -> Vec<String> {
    let registry = Path::new("/run/tartaros/placeholders");
    let mut left = Vec::new();
    for deny in denies {
        let marker = tartaros::materialize::marker_name(Path::new(deny));
        for name in [marker.clone(), format!("{marker}.new")] {
            if registry.join(&name).exists() {
                left.push(format!("{name} ({deny})"));
            }
        }
    }
    left
}

/// 150 absent denies under `--materialize`: the supervisor makes 150
/// placeholder directories in the user's tree before it tells its janitor
/// about any of them. Killed in between, it left them there (a `.env`
/// that is now a directory breaks the project's tools).
#[test]
fn a_supervisor_killed_while_it_starts_leaves_no_placeholder_process_or_cgroup() {
    if !can_run("a_supervisor_killed_while_it_starts_leaves_no_placeholder_process_or_cgroup") {
        return;
    }
    let mut failures = Vec::new();
    for delay_ms in [0u64, 5, 10, 20, 30, 45, 60, 80, 110, 150, 200, 300] {
        let work = Dir::new();
        let w = work.path().to_str().unwrap().to_owned();
        let marker = format!("tt-r10-teardown-{}-{delay_ms}", std::process::id());
        let mut args = vec![
            "run".to_owned(),
            "--write".into(),
            w.clone(),
            "--materialize".into(),
        ];
        let denies: Vec<String> = (0..150).map(|i| format!("{w}/deny-{i}")).collect();
        for deny in &denies {
            args.push("--read-deny".into());
            args.push(deny.clone());
        }
        args.extend(["--".into(), "sleep".into(), marker.clone()]);
        let mut supervisor = Command::new(bin())
            .args(&args)
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = supervisor.id();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        supervisor.kill().unwrap();
        supervisor.wait().unwrap();
        let clean = eventually(10, || {
            placeholders_left(work.path()).is_empty()
                && markers_left(&denies).is_empty()
                && left_of(pid).is_empty()
                && processes_with(&marker).is_empty()
        });
        if !clean {
            let names = placeholders_left(work.path());
            failures.push(format!(
                "killed after {delay_ms} ms: {} placeholders left (first {:?}), markers {:?}, {:?}, sleeps {:?}",
                names.len(),
                names.first(),
                markers_left(&denies),
                left_of(pid),
                processes_with(&marker)
            ));
            for name in names {
                let _ = std::fs::remove_dir(work.join(&name));
            }
            for deny in &denies {
                let marker = tartaros::materialize::marker_name(Path::new(deny));
                let registry = Path::new("/run/tartaros/placeholders");
                let _ = std::fs::remove_file(registry.join(format!("{marker}.new")));
                let _ = std::fs::remove_file(registry.join(marker));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
