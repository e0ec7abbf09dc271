//! When `tartaros run` returns, nothing of the run holds the launcher's
//! files. The janitor (forked before the runtime, alive until the run has
//! cleaned up) kept the launcher's working directory, often the writable
//! root, and every descriptor the launcher passed (a harness's
//! `--status-fd` pipe): `tartaros run --write /mnt/x ...; umount /mnt/x`
//! failed with EBUSY in 2 of 5 runs on a busy host, and a harness waiting
//! for EOF on its pipe waited for the janitor.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Command;

use common::*;

/// The supervisor's children that share our mount namespace (the init and
/// the agent have their own).
fn janitors(supervisor: u32) -> Vec<i32> {
    let ours = std::fs::metadata("/proc/self/ns/mnt").unwrap().ino();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // ppid is the second field after the parenthesized name.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            ppid == Some(supervisor)
                && std::fs::metadata(format!("/proc/{pid}/ns/mnt")).is_ok_and(|m| m.ino() == ours)
        })
        .collect()
}

#[test]
fn the_janitor_holds_neither_the_launchers_directory_nor_its_descriptors() {
    if !can_run("the_janitor_holds_neither_the_launchers_directory_nor_its_descriptors") {
        return;
    }
    let work = Dir::new();
    let held = work.file("held", "x");
    let w = work.path().to_str().unwrap();
    // The launcher passes descriptor 7 (open on a file of the root) and
    // runs from the root, as a harness does.
    let script = format!(
        "exec 7<'{}'; exec '{}' run -q --write '{w}' -- sleep 30",
        held.display(),
        bin()
    );
    let mut sup = KillOnDrop(Some(
        Command::new("sh")
            .args(["-c", &script])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let pid = sup.id();
    // A child is copied with the launcher's directory and descriptors and
    // drops them a moment later (the janitor at its start, the init when it
    // enters its own mount namespace), so the state is asked for until it
    // settles: a janitor that keeps them for ten seconds fails.
    let held_by = |janitor: i32| -> Option<String> {
        let cwd = std::fs::read_link(format!("/proc/{janitor}/cwd")).ok()?;
        if cwd != Path::new("/") {
            return Some(format!(
                "the janitor {janitor} keeps the launcher's directory {cwd:?}"
            ));
        }
        let fds = open_fds(janitor);
        let foreign: Vec<_> = fds
            .iter()
            .filter(|(fd, target)| *fd > 3 || target.starts_with(w))
            .collect();
        (!foreign.is_empty())
            .then(|| format!("the janitor {janitor} holds {foreign:?} (all: {fds:?})"))
    };
    let mut problems = vec![format!("no janitor of supervisor {pid} found")];
    let settled = eventually(10, || {
        let found = janitors(pid);
        problems = if found.is_empty() {
            vec![format!("no janitor of supervisor {pid} found")]
        } else {
            found.into_iter().filter_map(held_by).collect()
        };
        problems.is_empty()
    });
    assert!(settled, "{}", problems.join("; "));
    let mut child = sup.take();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
}

#[test]
fn the_roots_filesystem_can_be_unmounted_as_soon_as_the_run_returns() {
    if !can_run("the_roots_filesystem_can_be_unmounted_as_soon_as_the_run_returns") {
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("tt-umount-")
        .tempdir()
        .unwrap();
    let mnt = base.path();
    let m = mnt.to_str().unwrap();
    for round in 0..10 {
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m,mode=0777", "tmpfs", m])
            .status()
            .unwrap();
        assert!(mounted.success());
        let out = tartaros(
            &["run", "-q", "--write", m, "--", "sh", "-c", "echo x > f"],
            mnt,
        );
        // From a directory outside, as a user's script would after cd -.
        let umount = Command::new("umount")
            .arg(m)
            .current_dir("/")
            .output()
            .unwrap();
        if !umount.status.success() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert!(
            umount.status.success(),
            "round {round}: the root's filesystem was still busy when the run returned: {}",
            String::from_utf8_lossy(&umount.stderr)
        );
    }
}
