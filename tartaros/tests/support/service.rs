//! The service harness of `service.rs` and `service_shared.rs`: a
//! `tartaros service` on a socket of its own, and the cgroup helpers its
//! drop needs to leave the host clean.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::*;

/// A service on a socket of its own. Dropping it stops it (SIGTERM, then
/// SIGKILL after 10 s; its workers die with it) and removes any cgroup it
/// or its workers left, so that a failing test leaves the host clean.
pub struct Service {
    dir: Dir,
    pub socket: PathBuf,
    child: Option<Child>,
    pub pid: i32,
    /// Other owners (worker pids) whose leftover cgroups the drop removes.
    pub owners: Vec<i32>,
}

impl Service {
    pub fn start() -> Self {
        Self::start_in(Dir::new())
    }

    /// [`Self::start`] with its socket at `dir`/tartaros.sock.
    pub fn start_in(dir: Dir) -> Self {
        Self::start_with(dir, &[])
    }

    /// [`Self::start_in`] with more arguments for `tartaros service`.
    pub fn start_with(dir: Dir, args: &[&str]) -> Self {
        let socket = dir.join("tartaros.sock");
        let errors = std::fs::File::create(dir.join("service.err")).expect("service.err");
        let child = Command::new(bin())
            .args(["service", "--socket", socket.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()
            .expect("start the service");
        let pid = child.id() as i32;
        let service = Self {
            dir,
            socket,
            child: Some(child),
            pid,
            owners: Vec::new(),
        };
        assert!(
            eventually(5, || UnixStream::connect(&service.socket).is_ok()),
            "the service did not start listening: {}",
            service.errors()
        );
        service
    }

    /// What the service wrote on stderr so far.
    pub fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.join("service.err")).unwrap_or_default()
    }

    /// `tartaros ARGS` as `uid`, through this service.
    pub fn command(&self, uid: u32, args: &[&str], cwd: &Path) -> Command {
        let mut command = tartaros_as(uid, args, cwd);
        command.env("TARTAROS_SERVICE", &self.socket);
        command
    }

    /// [`Self::command`] started with its output discarded, killed when
    /// the guard drops (a failing test leaves no sandbox running).
    pub fn spawn_quiet(&self, uid: u32, args: &[&str], cwd: &Path) -> KillOnDrop {
        KillOnDrop(Some(
            self.command(uid, args, cwd)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("setpriv"),
        ))
    }

    pub fn run(&self, uid: u32, args: &[&str], cwd: &Path) -> Output {
        self.command(uid, args, cwd).output().expect("setpriv")
    }

    /// SIGTERM, then up to 10 s for the service to exit (SIGKILL after).
    /// Whether it exited on its own.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
        let mut owners = self.owners.clone();
        owners.push(self.pid);
        for owner in owners {
            for leftover in cgroups_of(owner) {
                remove_cgroup(&leftover);
            }
        }
    }
}

/// The mount point of the cgroup2 hierarchy, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        mount.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The v2 cgroup directory of process `pid` (its `0::` line).
pub fn cgroup_dir_of(pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2_mount()?.join(path.trim_start_matches('/')))
}

/// The directories right under `dir`.
pub fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Every directory of the cgroup2 hierarchy named `tartaros-<owner>-*`,
/// wherever it is.
pub fn cgroups_of(owner: i32) -> Vec<PathBuf> {
    let prefix = format!("tartaros-{owner}-");
    let mut found = Vec::new();
    let Some(root) = cgroup2_mount() else {
        return found;
    };
    let mut pending = vec![(root, 0)];
    while let Some((dir, depth)) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(entry.path());
            } else if depth < 12 {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    found.sort();
    found
}

/// Kills what is left in the cgroup `dir` (every process there is one the
/// test started) and removes it with its children.
pub fn remove_cgroup(dir: &Path) {
    eprintln!("removing a leftover cgroup {}", dir.display());
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut dirs = vec![dir.to_path_buf()];
        let mut i = 0;
        while i < dirs.len() {
            let children = subdirs(&dirs[i]);
            dirs.extend(children);
            i += 1;
        }
        // Deepest first.
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        if !dir.exists() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if dir.exists() {
        eprintln!("failed to remove {}", dir.display());
    }
}
