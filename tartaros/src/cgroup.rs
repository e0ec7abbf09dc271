//! The run's cgroup: every process of the sandbox lives in it, and the run
//! ends only when it is empty and removed.
//!
//! The cgroup v2 hierarchy is `/sys/fs/cgroup` on pure-v2 hosts and
//! `/sys/fs/cgroup/unified` on hybrid hosts; the run's cgroup is a child of
//! the supervisor's own cgroup there.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "failed to find a cgroup v2 hierarchy (no cgroup2 mount in /proc/self/mountinfo); mount one at /sys/fs/cgroup"
    )]
    NoHierarchy,
    #[error(
        "failed to create the run's cgroup {path}: {source}; run as root or delegate a cgroup subtree to this user"
    )]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to open the run's cgroup {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "failed to empty the run's cgroup {path}: processes are still alive after {waited_ms} ms"
    )]
    NotEmpty { path: PathBuf, waited_ms: u128 },
    #[error("failed to remove the run's cgroup {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to set {what} ({path}): {source}")]
    Limit {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "failed to limit {0}: no cgroup controller for it on this host (neither cgroup v2 nor a v1 hierarchy has it)"
    )]
    NoController(&'static str),
}

/// How long teardown may take to empty a cgroup before it reports failure.
pub const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Resource limits of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_procs: Option<u64>,
    pub max_memory: Option<u64>,
}

/// Where a controller lives: enabled in the v2 tree, or in its own v1
/// hierarchy (hybrid hosts such as these keep pids and memory in v1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Controller {
    V2,
    V1(PathBuf),
}

/// Finds the `pids` or `memory` controller.
pub fn find_controller(name: &str) -> Option<Controller> {
    let mount = v2_mount()?;
    let v2_has = own_v2_controllers(&mount)
        .split_whitespace()
        .any(|c| c == name);
    if v2_has {
        return Some(Controller::V2);
    }
    mounts()
        .v1
        .iter()
        .find(|(options, _)| options.iter().any(|o| o == name))
        .map(|(_, path)| Controller::V1(path.clone()))
}

/// The cgroup hierarchies' mount points.
#[derive(Debug, Default)]
struct CgroupMounts {
    v2: Option<PathBuf>,
    /// Each v1 hierarchy: its super options (the controllers) and where.
    v1: Vec<(Vec<String>, PathBuf)>,
}

/// Read from /proc/self/mountinfo once per process: a run looked them up a
/// dozen times (half a millisecond of a 10 ms start), and cgroup
/// hierarchies are not remounted under a running supervisor.
fn mounts() -> &'static CgroupMounts {
    static MOUNTS: std::sync::OnceLock<CgroupMounts> = std::sync::OnceLock::new();
    MOUNTS.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        parse_mounts(&info)
    })
}

fn parse_mounts(info: &str) -> CgroupMounts {
    let mut mounts = CgroupMounts::default();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4).map(PathBuf::from) else {
            continue;
        };
        let mut right = right.split_whitespace();
        match right.next() {
            Some("cgroup2") if mounts.v2.is_none() => mounts.v2 = Some(point),
            Some("cgroup") => {
                let options = right.nth(1).unwrap_or_default();
                mounts
                    .v1
                    .push((options.split(',').map(str::to_owned).collect(), point));
            }
            _ => {}
        }
    }
    mounts
}

/// Whether a run could set a `controller` limit on this host without
/// failing: a v1 hierarchy (root creates the limit cgroup), or the v2 tree
/// where the run cgroup's parent (the supervisor's own cgroup) can enable
/// the controller for its children. The kernel refuses that (EBUSY, no
/// internal processes) in a non-root cgroup that holds processes, as ours
/// does, unless the controller is already enabled there.
pub fn can_limit(controller: &str) -> bool {
    match find_controller(controller) {
        Some(Controller::V1(_)) => true,
        Some(Controller::V2) => {
            let own = own_v2_path().unwrap_or_default();
            let enabled = own_v2_dir()
                .and_then(|dir| std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok())
                .is_some_and(|c| c.split_whitespace().any(|c| c == controller));
            own.as_os_str().is_empty() || enabled
        }
        None => false,
    }
}

/// Finds the cgroup2 mount point.
pub fn v2_mount() -> Option<PathBuf> {
    mounts().v2.clone()
}

/// A fact about the calling process read once per process: a root run's
/// start read `/proc/self/cgroup` 15 times and its v2 cgroup's
/// `cgroup.controllers` 8 times (each a formatting of every hierarchy's
/// path by the kernel). Keyed by pid so that a forked child reads its
/// own; the supervisor and the service never move themselves, and the
/// processes that do (the init joining its v1 cgroups) never ask.
struct PerProcess(std::sync::Mutex<Option<(u32, std::sync::Arc<str>)>>);

impl PerProcess {
    const fn new() -> Self {
        Self(std::sync::Mutex::new(None))
    }

    fn get(&self, read: impl FnOnce() -> String) -> std::sync::Arc<str> {
        let pid = std::process::id();
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some((of, text)) if *of == pid => text.clone(),
            _ => {
                let text: std::sync::Arc<str> = read().into();
                *slot = Some((pid, text.clone()));
                text
            }
        }
    }
}

/// The text of `/proc/self/cgroup` (empty when unreadable), once per
/// process ([`PerProcess`]).
pub fn own_cgroups() -> std::sync::Arc<str> {
    static OWN: PerProcess = PerProcess::new();
    OWN.get(|| std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default())
}

/// The controllers of the calling process's own v2 cgroup, once per
/// process ([`PerProcess`]).
fn own_v2_controllers(mount: &Path) -> std::sync::Arc<str> {
    static CONTROLLERS: PerProcess = PerProcess::new();
    CONTROLLERS.get(|| {
        let own = mount.join(own_v2_path().unwrap_or_default());
        std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default()
    })
}

/// The calling process's own cgroup v2 path, relative to the mount.
fn own_v2_path() -> Option<PathBuf> {
    own_cgroups()
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|p| PathBuf::from(p.trim_start_matches('/')))
}

/// The calling process's cgroup in the v1 hierarchy that holds
/// `controller`, relative to that hierarchy's mount, from the text of
/// `/proc/self/cgroup` (`ID:controller[,controller...]:/path`).
pub fn own_v1_path(proc_self_cgroup: &str, controller: &str) -> Option<PathBuf> {
    if controller.is_empty() {
        return None;
    }
    proc_self_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| PathBuf::from(path.trim_start_matches('/')))
    })
}

/// The calling process's own v2 cgroup directory.
pub fn own_v2_dir() -> Option<PathBuf> {
    Some(v2_mount()?.join(own_v2_path().unwrap_or_default()))
}

/// A live run cgroup. Dropping it does nothing: teardown is explicit
/// ([`RunCgroup::kill_and_remove`]) because it must be awaited and checked.
pub struct RunCgroup {
    path: PathBuf,
    dir: File,
    /// v1 cgroups holding the limits on hybrid hosts; the init joins them
    /// before it starts the agent.
    v1: Vec<PathBuf>,
}

impl RunCgroup {
    /// Creates `<own cgroup>/tartaros-<id>` in the v2 hierarchy.
    pub fn create(id: &str) -> Result<Self, CgroupError> {
        let mount = v2_mount().ok_or(CgroupError::NoHierarchy)?;
        let parent = mount.join(own_v2_path().unwrap_or_default());
        Self::create_in(&parent, id)
    }

    pub fn create_in(parent: &Path, id: &str) -> Result<Self, CgroupError> {
        let path = parent.join(format!("tartaros-{id}"));
        std::fs::create_dir(&path).map_err(|source| CgroupError::Create {
            path: path.clone(),
            source,
        })?;
        let dir = File::open(&path).map_err(|source| CgroupError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            path,
            dir,
            v1: Vec::new(),
        })
    }

    /// Sets the limits, in the v2 cgroup where the controller is enabled
    /// there, else in a v1 cgroup of the same name that the init joins
    /// itself ([`join_v1_self`]). A v1 cgroup is created under the launcher's
    /// own cgroup of that hierarchy (read from `/proc/self/cgroup`), so
    /// the launcher's limits bind the run too: the kernel charges every
    /// ancestor.
    pub fn set_limits(&mut self, limits: Limits) -> Result<(), CgroupError> {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        let own = own_cgroups();
        let wanted = [("pids", limits.max_procs), ("memory", limits.max_memory)];
        for (controller, value) in wanted {
            let Some(value) = value else { continue };
            let value = value.to_string();
            match find_controller(controller).ok_or(CgroupError::NoController(controller))? {
                Controller::V2 => {
                    let parent = self.path.parent().unwrap_or(Path::new("/"));
                    write_limit(
                        &parent.join("cgroup.subtree_control"),
                        &format!("+{controller}"),
                        controller,
                    )?;
                    let file = if controller == "pids" {
                        "pids.max"
                    } else {
                        "memory.max"
                    };
                    write_limit(&self.path.join(file), &value, controller)?;
                }
                Controller::V1(mount) => {
                    let parent = mount.join(own_v1_path(&own, controller).unwrap_or_default());
                    let dir = parent.join(&name);
                    std::fs::create_dir(&dir).map_err(|source| CgroupError::Create {
                        path: dir.clone(),
                        source,
                    })?;
                    self.v1.push(dir.clone());
                    if controller == "pids" {
                        write_limit(&dir.join("pids.max"), &value, controller)?;
                    } else {
                        write_limit(&dir.join("memory.limit_in_bytes"), &value, controller)?;
                        // Without a swap limit the memory limit could be
                        // sidestepped by swapping; it must not be below
                        // the memory limit, so it is set second. Hosts
                        // without swap accounting have no such file.
                        let memsw = dir.join("memory.memsw.limit_in_bytes");
                        if memsw.exists() {
                            write_limit(&memsw, &value, controller)?;
                        }
                        // A v1 memory cgroup leaves socket buffers (TCP
                        // and UDP) uncharged unless this is set, and they
                        // come from one budget for the whole host: bound
                        // the run's share (limits::tcp_buffer_limit). Set
                        // before the init exists, so every socket counts.
                        let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
                        if tcp.exists() {
                            let bytes = limits.max_memory.unwrap_or(u64::MAX);
                            let bound = crate::limits::host_tcp_buffer_limit(bytes);
                            write_limit(&tcp, &bound.to_string(), controller)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves `pid` (the init, before it forks) into the v1 limit cgroups.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A descriptor of the cgroup directory, for `CLONE_INTO_CGROUP`.
    pub fn fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    /// The cgroup id (the directory's inode), as eBPF sees it.
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.dir.metadata().map(|m| m.ino()).unwrap_or(0)
    }

    /// Kills everything left, waits until the cgroup is empty, removes it.
    pub fn kill_and_remove(&self, timeout: Duration) -> Result<(), CgroupError> {
        let result = kill_and_remove(&self.path, timeout);
        for dir in &self.v1 {
            remove_v1(dir, timeout);
        }
        result
    }

    /// Kills everything left and waits until the cgroup is empty, leaving
    /// it in place (see [`kill_and_wait`]).
    pub fn kill_and_wait(&self, timeout: Duration) -> Result<(), CgroupError> {
        kill_and_wait(&self.path, timeout)
    }

    /// The v1 limit cgroups, for the janitor.
    pub fn v1_paths(&self) -> &[PathBuf] {
        &self.v1
    }
}

/// Moves the calling process into each v1 cgroup of `dirs`, by writing 0
/// (itself) to the cgroup's `tasks`. The caller must be single-threaded, so
/// that moving its thread moves the process. This is why the init joins
/// itself: a move of another process (its pid in `cgroup.procs`) takes
/// the kernel's `cgroup_threadgroup_rwsem` for writing and waits for an
/// RCU grace period (4–12 ms on the 2-core VM); moving the calling thread
/// does not take it (`cgroup_procs_write_start`).
pub fn join_v1_self(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    for dir in dirs {
        write_limit(&dir.join("tasks"), "0", "cgroup membership")?;
    }
    Ok(())
}

fn write_limit(file: &Path, value: &str, what: &'static str) -> Result<(), CgroupError> {
    std::fs::write(file, value).map_err(|source| CgroupError::Limit {
        what,
        path: file.to_path_buf(),
        source,
    })
}

/// Removes a v1 limit cgroup once its members are gone (they are members of
/// the v2 cgroup too, which was emptied first).
pub fn remove_v1(dir: &Path, timeout: Duration) {
    let start = Instant::now();
    while dir.exists() && std::fs::remove_dir(dir).is_err() && start.elapsed() < timeout {
        if let Ok(list) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in list.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether the cgroup at `path` still holds a process (itself or below).
pub fn is_populated(path: &Path) -> bool {
    std::fs::read_to_string(path.join("cgroup.events"))
        .map(|events| events.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

/// Kills every process in the cgroup at `path` and below (`cgroup.kill`,
/// 5.14+; else freeze, SIGKILL each listed process, thaw), waits until it
/// is empty and removes it with the cgroups below it. Also used by the
/// janitor after a supervisor crash.
pub fn kill_and_remove(path: &Path, timeout: Duration) -> Result<(), CgroupError> {
    if !path.exists() {
        return Ok(());
    }
    let start = Instant::now();
    let mut delay = Duration::from_micros(100);
    loop {
        kill_and_wait(path, timeout.saturating_sub(start.elapsed()))?;
        // Cgroups below it first, deepest first (a service's runs under
        // its parent, when their own janitors died too).
        for below in walk(path).into_iter().skip(1).rev() {
            let _ = std::fs::remove_dir(below);
        }
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // Exiting tasks can keep the cgroup busy for a moment.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < timeout => {}
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(20));
    }
}

/// Kills every process in the cgroup at `path` and below and waits until
/// it is empty, without removing it: the run's cgroup is its liveness to
/// the pin cache's start-up sweep (`ebpf/pin_cache.rs`), which removes a
/// run's shared entries once its cgroup is gone. Removed before the run's
/// last drain had read its loss counters, a second run's sweep took them
/// away in between, and the log ended `incomplete`
/// (`loss-counters-unreadable`, 3 of 120 short runs three at a time).
pub fn kill_and_wait(path: &Path, timeout: Duration) -> Result<(), CgroupError> {
    let start = Instant::now();
    let mut delay = Duration::from_micros(100);
    while is_populated(path) {
        kill_all(path);
        if start.elapsed() >= timeout {
            return Err(CgroupError::NotEmpty {
                path: path.to_path_buf(),
                waited_ms: start.elapsed().as_millis(),
            });
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(20));
    }
    Ok(())
}

/// Kills every process in the cgroup at `path` and below, now
/// (`cgroup.kill`, else freeze and SIGKILL each); does not wait.
pub fn kill_all(path: &Path) {
    if std::fs::write(path.join("cgroup.kill"), "1").is_err() {
        kill_each(path);
    }
}

/// The fallback for kernels without `cgroup.kill`: a frozen cgroup cannot
/// fork new members while we kill the listed ones.
fn kill_each(path: &Path) {
    let _ = std::fs::write(path.join("cgroup.freeze"), "1");
    for procs in walk(path) {
        if let Ok(list) = std::fs::read_to_string(procs.join("cgroup.procs")) {
            for pid in list.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = std::fs::write(path.join("cgroup.freeze"), "0");
}

fn walk(path: &Path) -> Vec<PathBuf> {
    let mut all = vec![path.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                all.extend(walk(&entry.path()));
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launchers_v1_cgroup_is_read_per_hierarchy() {
        let text = "9:name=systemd:/\n8:pids:/launcher/a\n4:memory:/process_api/x\n\
                    2:cpu,cpuacct:/\n0::/unified/me\n";
        assert_eq!(own_v1_path(text, "pids"), Some(PathBuf::from("launcher/a")));
        assert_eq!(
            own_v1_path(text, "memory"),
            Some(PathBuf::from("process_api/x"))
        );
        assert_eq!(own_v1_path(text, "cpuacct"), Some(PathBuf::new()));
        // The v2 line (empty controller list) is not a v1 hierarchy.
        assert_eq!(own_v1_path(text, ""), None);
        assert_eq!(own_v1_path(text, "blkio"), None);
        // A path with ':' in it stays whole.
        assert_eq!(
            own_v1_path("5:pids:/a:b\n", "pids"),
            Some(PathBuf::from("a:b"))
        );
    }

    #[test]
    fn mountinfo_gives_the_v2_mount_and_each_v1_hierarchys_controllers() {
        let info = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";
        let m = parse_mounts(info);
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(m.v1.len(), 2);
        assert!(m.v1[0].0.contains(&"pids".to_string()));
        assert_eq!(m.v1[1].1, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(m.v1[1].0.contains(&"cpuacct".to_string()));
        assert!(parse_mounts("garbage\n").v2.is_none());
    }

    #[test]
    fn a_per_process_fact_is_read_once_per_process() {
        static FACT: PerProcess = PerProcess::new();
        let mut reads = 0;
        let first = FACT.get(|| {
            reads += 1;
            "0::/a\n".into()
        });
        let again = FACT.get(|| {
            reads += 1;
            String::new()
        });
        assert_eq!(reads, 1);
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        assert_eq!(
            own_cgroups().as_ref(),
            std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default()
        );
    }

    #[test]
    fn finds_a_cgroup2_mount() {
        // Every supported host has one; this host mounts it hybrid or pure.
        if let Some(mount) = v2_mount() {
            assert!(mount.join("cgroup.procs").exists());
        }
    }
}
