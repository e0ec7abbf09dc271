//! The sandbox's private mount namespace: a read-only copy of the host's
//! tree with the writable roots bound read-write on top (Landlock has no
//! right for chmod, utimes, xattrs or inode flags, so only a read-only
//! mount stops those outside the roots), a private /dev, a private /tmp, a
//! fresh /proc, and the denies that must hold inside granted trees
//! (Landlock can only grant).
//!
//! [`plan`] decides the operations (pure, unit-tested); [`apply`] runs them in
//! the sandbox init, as root in its new mount namespace, before privileges
//! are dropped. The agent can never undo them: it has no capabilities,
//! `no_new_privs`, and seccomp refuses the mount family. Every path is
//! opened without following symlinks (`mount_tree::open_no_symlinks`): the
//! policy refused symlinked roots and denies, and a link swapped in since
//! then fails the start instead of redirecting a mount.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use serde::{Deserialize, Serialize};

use crate::mount_tree::{self, NO_DEV, NO_EXEC, NO_SUID, READ_ONLY};
use crate::policy::Policy;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("failed to {what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error(transparent)]
    Dev(#[from] crate::devfs::DevfsError),
}

/// One step of the mount plan, in the order it must run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountOp {
    /// Stop our mounts from propagating to the host (and back).
    MakePrivate,
    /// Take a detached copy of the tree at `path` (every submount, with
    /// its current flags) before the base turns read-only; `read_only`
    /// makes the copy read-only (a read allow kept in a private /tmp).
    Hold { path: PathBuf, read_only: bool },
    /// Every mount of the namespace read-only, recursively: nothing
    /// outside the held trees can change, content or metadata.
    ReadOnlyBase,
    /// A fresh tmpfs on /tmp, with its bounds.
    PrivateTmp(crate::tmpfs_bounds::TmpfsBounds),
    /// A /proc of the sandbox's own PID namespace: no view of host processes.
    FreshProc,
    /// A private /dev (see `devfs.rs`); `mount_points` are held trees that
    /// land under /dev; `shm` bounds its /dev/shm.
    PrivateDev {
        mount_points: Vec<PathBuf>,
        shm: crate::tmpfs_bounds::TmpfsBounds,
    },
    /// Attach the copy held for this path (a writable root, or a directory
    /// kept in the private /tmp) where it was.
    Attach(PathBuf),
    /// Bind a directory onto itself so that it is a mount point and cannot be
    /// renamed or removed; protects the ancestors of a deny from being moved
    /// away (the deny would then guard an empty name).
    Pin(PathBuf),
    /// An empty, read-only, mode 000 tmpfs over a read-denied directory.
    DenyReadDir(PathBuf),
    /// /dev/null bound over a read-denied file on a `nodev` read-only mount:
    /// every open fails with EACCES, and it cannot be linked or renamed.
    DenyReadFile(PathBuf),
    /// A read-only bind of a write-denied path over itself.
    DenyWrite(PathBuf),
    /// Like `DenyReadFile`, for a host socket listening at start; one that
    /// has gone by the time the init runs has nothing left to hide.
    HideSocket(PathBuf),
}

/// Decides the mount operations for `policy`. Deny paths that do not exist
/// are skipped here: the supervisor either materialized them first or
/// refused the run.
pub fn plan(policy: &Policy, cwd: &Path, exists: &dyn Fn(&Path) -> Option<bool>) -> Vec<MountOp> {
    let tmp = Path::new("/tmp");
    let mut held: Vec<(PathBuf, bool)> = policy
        .writable_roots
        .iter()
        // The private /tmp is writable already; the host's must not return.
        .filter(|root| !(policy.private_tmp && root.as_path() == tmp))
        .map(|root| (root.clone(), false))
        .collect();
    if policy.private_tmp {
        held.extend(
            policy
                .read_allows
                .iter()
                .chain(std::iter::once(&cwd.to_path_buf()))
                .filter(|p| p.starts_with(tmp) && p.as_path() != tmp)
                .map(|p| (p.clone(), true)),
        );
    }
    held.retain(|(path, _)| exists(path).is_some());
    held.sort();
    held.dedup_by(|a, b| a.0 == b.0);
    // A tree inside a held writable root comes with that root's copy.
    let roots: Vec<PathBuf> = held
        .iter()
        .filter(|(_, ro)| !ro)
        .map(|(p, _)| p.clone())
        .collect();
    held.retain(|(path, _)| !roots.iter().any(|r| path != r && path.starts_with(r)));

    let mut ops = vec![MountOp::MakePrivate];
    ops.extend(held.iter().map(|(path, read_only)| MountOp::Hold {
        path: path.clone(),
        read_only: *read_only,
    }));
    ops.push(MountOp::ReadOnlyBase);
    let bounds = crate::tmpfs_bounds::of(policy);
    if policy.private_tmp {
        ops.push(MountOp::PrivateTmp(bounds));
    }
    ops.push(MountOp::FreshProc);
    ops.push(MountOp::PrivateDev {
        mount_points: held
            .iter()
            .map(|(p, _)| p.clone())
            .filter(|p| p.starts_with("/dev"))
            .collect(),
        shm: bounds,
    });
    ops.extend(held.iter().map(|(p, _)| MountOp::Attach(p.clone())));

    // What the sandbox shows of the host at a path: nothing under its
    // private /dev and /tmp but the held trees.
    let visible = |path: &Path| visible_in_sandbox(policy, &held, path);
    let mut pins = Vec::new();
    let mut denies = Vec::new();
    for path in policy.read_denies.iter().filter(|p| visible(p)) {
        match exists(path) {
            Some(true) => denies.push(MountOp::DenyReadDir(path.clone())),
            Some(false) => denies.push(MountOp::DenyReadFile(path.clone())),
            None => continue,
        }
        pins.extend(ancestors_to_pin(policy, path));
    }
    for path in policy.write_denies.iter().filter(|p| visible(p)) {
        // Outside the writable roots the read-only base already refuses
        // every write.
        if !policy.is_writable(path) || exists(path).is_none() {
            continue;
        }
        // A read deny of the same path already hides and freezes it.
        if policy.read_denies.iter().any(|r| path.starts_with(r)) {
            continue;
        }
        denies.push(MountOp::DenyWrite(path.clone()));
        pins.extend(ancestors_to_pin(policy, path));
    }
    // Covered like read denies: the host's cgroup hierarchies show every
    // other run (its name, its process count and CPU use: one user's
    // agent watched another's runs under the service, adversarial round
    // 13); tartaros's own state (the pin cache's lock, the kernel layout
    // cache) is files an agent run as uid 0 owns, whose lock or lease
    // stalled every later run's start (round 17).
    for dir in HOST_ONLY.map(Path::new) {
        if exists(dir) == Some(true)
            && !held.iter().any(|(p, _)| p.starts_with(dir))
            && !policy.read_denies.iter().any(|d| dir.starts_with(d))
        {
            denies.push(MountOp::DenyReadDir(dir.to_path_buf()));
        }
    }
    pins.sort();
    pins.dedup();
    ops.extend(pins.into_iter().map(MountOp::Pin));
    ops.extend(denies);
    ops
}

/// Where the host mounts its cgroup hierarchies.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where tartaros keeps its state on the host (`ebpf::PIN_ROOT`, its
/// lock, the kernel layout cache, the placeholder registry).
const STATE_DIR: &str = "/run/tartaros";
/// The host's directories no sandbox shows.
const HOST_ONLY: [&str; 2] = [CGROUP_ROOT, STATE_DIR];

/// Whether the sandbox shows the host's object at `path`: nothing under its
/// private /dev and /tmp but the held trees.
fn visible_in_sandbox(policy: &Policy, held: &[(PathBuf, bool)], path: &Path) -> bool {
    let private = path.starts_with("/dev") || (policy.private_tmp && path.starts_with("/tmp"));
    !private || held.iter().any(|(h, _)| path.starts_with(h))
}

/// [`plan`], with the mount points of `unix_mirrors` mirrors in the
/// private /dev (see `unix_mirror.rs`).
pub fn plan_with_mirrors(
    policy: &Policy,
    cwd: &Path,
    exists: &dyn Fn(&Path) -> Option<bool>,
    unix_mirrors: usize,
) -> Vec<MountOp> {
    let mut ops = plan(policy, cwd, exists);
    for op in &mut ops {
        if let MountOp::PrivateDev { mount_points, .. } = op {
            mount_points.extend(crate::unix_mirror::points(unix_mirrors));
        }
    }
    ops
}

/// What hides each host socket in `sockets` (resolved paths, see
/// [`host_sockets`]) that the sandbox planned by `ops` shows; to run after
/// `ops`.
pub fn hide_sockets(ops: &[MountOp], policy: &Policy, sockets: &[PathBuf]) -> Vec<MountOp> {
    let held: Vec<(PathBuf, bool)> = ops
        .iter()
        .filter_map(|op| match op {
            MountOp::Hold { path, read_only } => Some((path.clone(), *read_only)),
            _ => None,
        })
        .collect();
    sockets
        .iter()
        .filter(|p| visible_in_sandbox(policy, &held, p))
        .filter(|p| !policy.read_denies.iter().any(|d| p.starts_with(d)))
        .map(|p| MountOp::HideSocket(p.clone()))
        .collect()
}

/// The host's listening unix sockets (`/proc/net/unix` of the host's
/// network namespace) that lie outside everything the agent may write.
/// Defence in depth: where the eBPF unix policy is attached (root) it
/// refuses every such path the agent passes, also for sockets bound later;
/// hiding the ones that exist at start also stops a symlink planted in a
/// root from leading to them (the eBPF hook sees the path before symlinks
/// are followed). Each costs one bind mount, so there is no cap.
pub fn host_sockets_to_hide(proc_net_unix: &str, policy: &Policy) -> Vec<PathBuf> {
    listening_paths(proc_net_unix, |path| !policy.is_writable(path))
}

/// The pathname sockets of a `/proc/net/unix` table that `keep` keeps,
/// sorted, each once.
fn listening_paths(proc_net_unix: &str, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(7))
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .filter(|path| keep(path))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The host's listening unix sockets under a writable root. The unix
/// policy grants every name under a root (the lab's `net-unix-allowed`
/// relies on it), so the agent reaches the process behind each: with
/// `--write /tmp`, a tmux server's, an X display's or an editor's socket,
/// any of which runs commands outside the sandbox (adversarial round 11).
pub fn host_sockets_in_roots(proc_net_unix: &str, policy: &Policy) -> Vec<PathBuf> {
    listening_paths(proc_net_unix, |path| {
        policy.writable_roots.iter().any(|r| path.starts_with(r))
    })
}

/// The warning for [`host_sockets_in_roots`], naming at most three.
pub fn reachable_sockets_warning(sockets: &[PathBuf]) -> Option<String> {
    let (first, rest) = (sockets.iter().take(3), sockets.len().saturating_sub(3));
    let named: Vec<String> = first
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let more = if rest > 0 {
        format!(" and {rest} more")
    } else {
        String::new()
    };
    (!sockets.is_empty()).then(|| {
        format!(
            "processes outside the sandbox listen on unix sockets under the writable roots ({}{more}), and the agent may connect to every socket under a root (a terminal multiplexer's or a display's runs commands outside the sandbox); pass --private-tmp or a narrower --write, or --deny-unix",
            named.join(", ")
        )
    })
}

/// The host's listening pathname sockets outside the roots, resolved so
/// that the init can open them without following links; none with
/// `--deny-unix` (seccomp refuses every unix socket). Warns about those
/// under the roots, which the agent reaches.
pub fn host_sockets(policy: &Policy) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    if policy.deny_unix {
        return Vec::new();
    }
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    if let Some(warning) = reachable_sockets_warning(&host_sockets_in_roots(&table, policy)) {
        crate::tt_warn!("{warning}");
    }
    let mut resolved: Vec<PathBuf> = host_sockets_to_hide(&table, policy)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()))
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| !policy.is_writable(p) && !p.starts_with("/proc"))
        .collect();
    resolved.sort();
    resolved.dedup();
    resolved
}

/// The ancestors of `path` that the agent could rename (their parent is
/// writable), outermost first.
fn ancestors_to_pin(policy: &Policy, path: &Path) -> Vec<PathBuf> {
    let mut pins: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .filter(|ancestor| {
            ancestor
                .parent()
                .is_some_and(|parent| policy.is_writable(parent))
        })
        .map(Path::to_path_buf)
        .collect();
    pins.reverse();
    pins
}

fn fail<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |source| MountError::Mount {
        what,
        path: path.to_path_buf(),
        source,
    }
}

const NONE: Option<&str> = None;
const LOCKED_DOWN: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Opens `path` for a mount without following a symlink on the way.
fn open(path: &Path) -> Result<OwnedFd, MountError> {
    mount_tree::open_no_symlinks(path).map_err(fail("open (without following symlinks)", path))
}

/// The `/proc/self/fd/N` name of `fd`, for the mount(2) calls that take a
/// path (the fresh /proc is mounted by then).
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd))
}

/// A copy of the tree at `path`, with `flags` set on every mount of it,
/// attached back over `path`.
fn rebind(path: &Path, flags: u64) -> Result<(), MountError> {
    let at = open(path)?;
    let copy = mount_tree::clone_tree(&at, true).map_err(fail("copy the tree at", path))?;
    if flags != 0 {
        mount_tree::set_flags(&copy, flags, 0, true).map_err(fail("set the flags of", path))?;
    }
    mount_tree::attach(&copy, &at).map_err(fail("bind", path))
}

/// Runs the plan. Must be called in a fresh mount namespace (and, for
/// `FreshProc`, a fresh PID namespace) by a process that still has
/// CAP_SYS_ADMIN there.
pub fn apply(ops: &[MountOp]) -> Result<(), MountError> {
    let mut held: Vec<(PathBuf, OwnedFd, bool)> = Vec::new();
    for op in ops {
        match op {
            MountOp::MakePrivate => {
                let root = Path::new("/");
                mount(
                    NONE,
                    root,
                    NONE,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    NONE,
                )
                .map_err(fail("make private the mounts under", root))?;
            }
            MountOp::Hold { path, read_only } => {
                let at = open(path)?;
                let is_dir = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&at))
                    .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                    .map_err(fail("inspect", path))?;
                let copy =
                    mount_tree::clone_tree(&at, true).map_err(fail("copy the tree at", path))?;
                // `nodev` as the base below, which it was held before.
                let flags = NO_DEV | if *read_only { READ_ONLY } else { 0 };
                mount_tree::set_flags(&copy, flags, 0, true)
                    .map_err(fail("set the flags of the copy of", path))?;
                held.push((path.clone(), copy, is_dir));
            }
            MountOp::ReadOnlyBase => {
                let root = Path::new("/");
                let at = open(root)?;
                // `nodev`: read-only stops writes to files, not opens of a
                // host's device node outside /dev (a chroot's `dev/sda`).
                // The sandbox's own devices clear it (devfs.rs).
                mount_tree::set_flags(&at, READ_ONLY | NO_DEV, 0, true)
                    .map_err(fail("make read-only and nodev every mount under", root))?;
            }
            MountOp::PrivateTmp(bounds) => {
                let tmp = Path::new("/tmp");
                mount(
                    Some("tmpfs"),
                    tmp,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(bounds.options("mode=1777").as_str()),
                )
                .map_err(fail("mount a private tmpfs on", tmp))?;
            }
            MountOp::FreshProc => {
                let proc = Path::new("/proc");
                mount(Some("proc"), proc, Some("proc"), LOCKED_DOWN, NONE)
                    .map_err(fail("mount a fresh proc on", proc))?;
            }
            MountOp::PrivateDev { mount_points, shm } => crate::devfs::build(mount_points, shm)?,
            MountOp::Attach(path) => {
                let Some(index) = held.iter().position(|(p, _, _)| p == path) else {
                    continue;
                };
                let (_, copy, is_dir) = held.swap_remove(index);
                // A private tmpfs starts empty: make the mount point, by
                // descriptor (a link swapped in elsewhere must not move it).
                if std::fs::symlink_metadata(path).is_err() {
                    crate::deputy::make_mount_point(path, is_dir).map_err(|e| {
                        let source = e.into_parts().1.raw_os_error().unwrap_or(libc::EIO);
                        MountError::Mount {
                            what: "make the mount point",
                            path: path.clone(),
                            source: nix::Error::from_raw(source),
                        }
                    })?;
                }
                let onto = open(path)?;
                mount_tree::attach(&copy, &onto).map_err(fail("bind read-write", path))?;
            }
            // Recursive, so mounts already below the pinned directory stay
            // visible; the copy keeps their flags (read-write in a root).
            MountOp::Pin(path) => rebind(path, 0)?,
            MountOp::DenyReadDir(path) => {
                let at = open(path)?;
                mount(
                    Some("tmpfs"),
                    fd_path(&at).as_str(),
                    Some("tmpfs"),
                    LOCKED_DOWN | MsFlags::MS_RDONLY,
                    Some("mode=000,size=4k,nr_inodes=1"),
                )
                .map_err(fail("hide the read-denied directory", path))?;
            }
            // Gone, or no longer a socket under that name (a daemon
            // restarting): nothing of it left to hide.
            MountOp::HideSocket(path) => match mount_tree::open_no_symlinks(path) {
                Ok(at) if is_socket(&at) => hide_file(path, at)?,
                _ => continue,
            },
            MountOp::DenyReadFile(path) => hide_file(path, open(path)?)?,
            MountOp::DenyWrite(path) => rebind(path, READ_ONLY | NO_SUID | NO_DEV)?,
        }
    }
    Ok(())
}

fn is_socket(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(fd))
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK)
}

/// Covers the file at `path` with /dev/null on a read-only, `nodev` mount.
fn hide_file(path: &Path, at: OwnedFd) -> Result<(), MountError> {
    let null = open(Path::new("/dev/null"))?;
    let copy = mount_tree::clone_tree(&null, false).map_err(fail("copy /dev/null for", path))?;
    mount_tree::set_flags(&copy, READ_ONLY | NO_SUID | NO_DEV | NO_EXEC, 0, false)
        .map_err(fail("lock down the cover of", path))?;
    mount_tree::attach(&copy, &at).map_err(fail("hide the read-denied file", path))
}

#[cfg(test)]
#[path = "mounts_tests.rs"]
mod tests;
