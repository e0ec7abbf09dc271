//! Private tmpfs mounts without bounds (adversarial round 9). The private
//! `/tmp`, `/dev/shm` and every `--tmpfs` were mounted with the kernel's
//! defaults: half of the host's RAM each, and as many inodes as RAM has
//! pages. In an ordinary user's run without a delegated cgroup there is
//! no memory limit, so an agent could park `3 x RAM / 2` of pages (and
//! millions of inodes) there until the run ended. Proved from the host
//! side: the run's own mount table, read while the agent lives.

mod common;
use std::path::Path;

use common::*;

/// The default budget of all the private tmpfs mounts of a run without a
/// memory limit (`tmpfs_bounds::DEFAULT_BUDGET`).
const DEFAULT_BUDGET: u64 = 2 << 30;

/// `(size in bytes, nr_inodes)` of each tmpfs mount point of `pid`'s
/// mount namespace; `None` where the kernel's default is in force (it
/// shows neither option then).
fn tmpfs_bounds(pid: i32) -> Vec<(String, Option<u64>, Option<u64>)> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mut found = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields[dash + 1] != "tmpfs" {
            continue;
        }
        let option = |name: &str| {
            fields[dash + 3]
                .split(',')
                .find_map(|o| o.strip_prefix(name))
                .map(|v| v.to_string())
        };
        let size = option("size=").map(|v| match v.strip_suffix('k') {
            Some(kib) => kib.parse::<u64>().unwrap() * 1024,
            None => v.parse().unwrap(),
        });
        let inodes = option("nr_inodes=").map(|v| v.parse().unwrap());
        found.push((fields[4].to_string(), size, inodes));
    }
    found
}

/// Starts `command`, finds its agent (`sleep marker`), and returns the
/// bounds of the tmpfs mounts at `points` in the agent's namespace.
fn bounds_while_running(
    mut command: std::process::Command,
    marker: &str,
    points: &[&str],
) -> Vec<(String, Option<u64>, Option<u64>)> {
    let child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = KillOnDrop(Some(child));
    let mut agent = None;
    assert!(
        eventually(20, || {
            agent = processes_with(marker).first().copied();
            agent.is_some()
        }),
        "the agent never started"
    );
    let all = tmpfs_bounds(agent.unwrap());
    let out = run.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut wanted = Vec::new();
    for point in points {
        let mount = all.iter().rev().find(|(at, _, _)| at == point);
        wanted.push(
            mount
                .cloned()
                .unwrap_or_else(|| panic!("no tmpfs at {point}: {all:?}")),
        );
    }
    wanted
}

fn assert_bounded(mounts: &[(String, Option<u64>, Option<u64>)], budget: u64) {
    let mut sizes = 0;
    for (point, size, inodes) in mounts {
        let size = size.unwrap_or_else(|| panic!("{point} has the kernel's default size"));
        let inodes = inodes.unwrap_or_else(|| panic!("{point} has the kernel's default inodes"));
        assert!(
            size > 0 && inodes > 0,
            "{point}: {size} bytes, {inodes} inodes"
        );
        // One inode per page at most, the kernel's own ratio.
        assert!(
            inodes <= size / 4096,
            "{point}: {inodes} inodes for {size} bytes"
        );
        sizes += size;
    }
    assert!(
        sizes <= budget,
        "the private tmpfs mounts hold {sizes} bytes together, over {budget}: {mounts:?}"
    );
}

/// A root run with a memory limit: its tmpfs mounts share that limit.
#[test]
fn a_root_runs_tmpfs_mounts_share_its_memory_limit() {
    if !can_run("a_root_runs_tmpfs_mounts_share_its_memory_limit") {
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("tt-scratch-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let scratch_path = scratch.path().to_str().unwrap().to_string();
    let mut command = std::process::Command::new(bin());
    command
        .args(["run", "--private-tmp", "--max-memory", "64M", "--tmpfs"])
        .arg(&scratch_path)
        .args(["--", "sleep", "4.1931"])
        .current_dir("/");
    let mounts = bounds_while_running(command, "4.1931", &["/tmp", "/dev/shm", &scratch_path]);
    assert_bounded(&mounts, 64 << 20);
}

/// An ordinary user's run (no delegated cgroup here, so no memory limit):
/// its tmpfs mounts share the documented default.
#[test]
fn an_ordinary_users_tmpfs_mounts_are_bounded_without_a_memory_limit() {
    if !can_run("an_ordinary_users_tmpfs_mounts_are_bounded_without_a_memory_limit") {
        return;
    }
    let command = tartaros_as(
        4391,
        &["run", "--private-tmp", "--", "sleep", "4.2173"],
        Path::new("/"),
    );
    let mounts = bounds_while_running(command, "4.2173", &["/tmp", "/dev/shm"]);
    assert_bounded(&mounts, DEFAULT_BUDGET);
}
