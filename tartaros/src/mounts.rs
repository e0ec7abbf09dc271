//! The sandbox's private mount namespace: denies that hold inside granted
//! trees (Landlock can only grant), a private /tmp and a fresh /proc.
//!
//! [`plan`] decides the operations (pure, unit-tested); [`apply`] runs them in
//! the sandbox init, as root in its new mount namespace, before privileges
//! are dropped. The agent can never undo them: it has no capabilities,
//! `no_new_privs`, and seccomp refuses the mount family.

use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use serde::{Deserialize, Serialize};

use crate::policy::Policy;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("failed to {what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// One step of the mount plan, in the order it must run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountOp {
    /// Stop our mounts from propagating to the host (and back).
    MakePrivate,
    /// A fresh tmpfs on /tmp; `keep` lists directories under /tmp (writable
    /// roots, the working directory) that stay visible in it.
    PrivateTmp { keep: Vec<PathBuf> },
    /// A /proc of the sandbox's own PID namespace: no view of host processes.
    FreshProc,
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
}

/// Decides the mount operations for `policy`. Deny paths that do not exist
/// are skipped here: the supervisor either materialized them first or
/// refused the run.
pub fn plan(policy: &Policy, cwd: &Path, exists: &dyn Fn(&Path) -> Option<bool>) -> Vec<MountOp> {
    let mut ops = vec![MountOp::MakePrivate];
    if policy.private_tmp {
        let mut keep: Vec<PathBuf> = policy
            .writable_roots
            .iter()
            .chain(&policy.read_allows)
            .chain(std::iter::once(&cwd.to_path_buf()))
            .filter(|p| p.starts_with("/tmp") && p.as_path() != Path::new("/tmp"))
            .filter(|p| exists(p) == Some(true))
            .cloned()
            .collect();
        keep.sort();
        keep.dedup();
        ops.push(MountOp::PrivateTmp { keep });
    }
    ops.push(MountOp::FreshProc);

    let mut pins = Vec::new();
    let mut denies = Vec::new();
    for path in &policy.read_denies {
        match exists(path) {
            Some(true) => denies.push(MountOp::DenyReadDir(path.clone())),
            Some(false) => denies.push(MountOp::DenyReadFile(path.clone())),
            None => continue,
        }
        pins.extend(ancestors_to_pin(policy, path));
    }
    for path in &policy.write_denies {
        // Outside the writable roots Landlock already refuses every write.
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
    pins.sort();
    pins.dedup();
    ops.extend(pins.into_iter().map(MountOp::Pin));
    ops.extend(denies);
    ops
}

/// The host's listening unix sockets (`/proc/net/unix` of the host's
/// network namespace) that lie outside everything the agent may write:
/// the mount plan hides them, so a symlink planted in a root cannot lead to
/// them either (the eBPF unix policy judges the path the agent passes,
/// before any symlink is followed). Sockets bound after the run starts are
/// not covered; the eBPF policy still refuses their direct paths.
pub fn host_sockets_to_hide(proc_net_unix: &str, policy: &Policy) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(7))
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .filter(|path| !policy.is_writable(path))
        .collect();
    paths.sort();
    paths.dedup();
    // A host with thousands of sockets would slow every start; the eBPF
    // policy still holds for their direct paths.
    paths.truncate(256);
    paths
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

/// Runs the plan. Must be called in a fresh mount namespace (and, for
/// `FreshProc`, a fresh PID namespace) by a process that still has
/// CAP_SYS_ADMIN there.
pub fn apply(ops: &[MountOp]) -> Result<(), MountError> {
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
            MountOp::PrivateTmp { keep } => {
                let tmp = Path::new("/tmp");
                // Hold on to the kept directories before the tmpfs hides them.
                let held: Vec<(PathBuf, std::fs::File)> = keep
                    .iter()
                    .filter_map(|p| open_path(p).ok().map(|f| (p.clone(), f)))
                    .collect();
                mount(
                    Some("tmpfs"),
                    tmp,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some("mode=1777"),
                )
                .map_err(fail("mount a private tmpfs on", tmp))?;
                for (path, file) in held {
                    std::fs::create_dir_all(&path).map_err(|e| MountError::Mount {
                        what: "recreate in the private /tmp",
                        path: path.clone(),
                        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                    })?;
                    let source =
                        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
                    mount(
                        Some(source.as_str()),
                        path.as_path(),
                        NONE,
                        MsFlags::MS_BIND | MsFlags::MS_REC,
                        NONE,
                    )
                    .map_err(fail("keep in the private /tmp", &path))?;
                }
            }
            MountOp::FreshProc => {
                let proc = Path::new("/proc");
                mount(Some("proc"), proc, Some("proc"), LOCKED_DOWN, NONE)
                    .map_err(fail("mount a fresh proc on", proc))?;
            }
            MountOp::Pin(path) => {
                // Recursive, so mounts already below the pinned directory stay visible.
                mount(
                    Some(path.as_path()),
                    path.as_path(),
                    NONE,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    NONE,
                )
                .map_err(fail("pin", path))?;
            }
            MountOp::DenyReadDir(path) => {
                mount(
                    Some("tmpfs"),
                    path.as_path(),
                    Some("tmpfs"),
                    LOCKED_DOWN | MsFlags::MS_RDONLY,
                    Some("mode=000,size=4k,nr_inodes=1"),
                )
                .map_err(fail("hide the read-denied directory", path))?;
            }
            MountOp::DenyReadFile(path) => {
                let null = Path::new("/dev/null");
                mount(Some(null), path.as_path(), NONE, MsFlags::MS_BIND, NONE)
                    .map_err(fail("hide the read-denied file", path))?;
                remount_read_only(path, LOCKED_DOWN)?;
            }
            MountOp::DenyWrite(path) => {
                mount(
                    Some(path.as_path()),
                    path.as_path(),
                    NONE,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    NONE,
                )
                .map_err(fail("bind the write-denied path", path))?;
                remount_read_only(path, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
            }
        }
    }
    Ok(())
}

/// An `O_PATH` descriptor: enough to bind the directory later.
fn open_path(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
}

fn remount_read_only(path: &Path, extra: MsFlags) -> Result<(), MountError> {
    // In a user namespace the flags of the original mount are locked: a
    // remount that drops one is refused, so carry them over.
    let locked = nix::sys::statvfs::statvfs(path)
        .map(|st| {
            use nix::sys::statvfs::FsFlags;
            let mut flags = MsFlags::empty();
            for (fs, ms) in [
                (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
            ] {
                if st.flags().contains(fs) {
                    flags |= ms;
                }
            }
            flags
        })
        .unwrap_or(MsFlags::empty());
    mount(
        NONE,
        path,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | extra | locked,
        NONE,
    )
    .map_err(fail("make read-only", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs_only(path: &Path) -> Option<bool> {
        Some(!path.to_string_lossy().ends_with(".env"))
    }

    #[test]
    fn write_deny_inside_root_is_bound_read_only_and_its_parents_pinned() {
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            write_denies: vec!["/work/a/b/.env".into(), "/etc/x".into()],
            ..Default::default()
        };
        let ops = plan(&policy, Path::new("/"), &dirs_only);
        assert!(ops.contains(&MountOp::DenyWrite("/work/a/b/.env".into())));
        assert!(ops.contains(&MountOp::Pin("/work/a".into())));
        assert!(ops.contains(&MountOp::Pin("/work/a/b".into())));
        assert!(
            !ops.contains(&MountOp::Pin("/work".into())),
            "root's parent is not writable"
        );
        assert!(
            !ops.iter()
                .any(|op| matches!(op, MountOp::DenyWrite(p) if p.starts_with("/etc")))
        );
        let pin = ops
            .iter()
            .position(|op| matches!(op, MountOp::Pin(_)))
            .unwrap();
        let deny = ops
            .iter()
            .position(|op| matches!(op, MountOp::DenyWrite(_)))
            .unwrap();
        assert!(
            pin < deny,
            "pins go first so a deny cannot be hidden by them"
        );
    }

    #[test]
    fn host_sockets_outside_the_roots_are_hidden() {
        let table = "Num RefCount Protocol Flags Type St Inode Path\n\
            0000: 00000002 00000000 00010000 0001 01 1 /run/docker.sock\n\
            0001: 00000002 00000000 00010000 0001 01 2 @abstract\n\
            0002: 00000002 00000000 00010000 0001 01 3 /work/own.sock\n\
            0003: 00000003 00000000 00000000 0001 03 4\n";
        let policy = Policy {
            writable_roots: vec!["/work".into()],
            ..Default::default()
        };
        assert_eq!(
            host_sockets_to_hide(table, &policy),
            vec![PathBuf::from("/run/docker.sock")]
        );
    }

    #[test]
    fn read_denies_pick_file_or_dir_and_skip_absent() {
        let policy = Policy {
            read_denies: vec!["/home/u/.ssh".into(), "/work/.env".into(), "/gone".into()],
            ..Default::default()
        };
        let exists = |p: &Path| match p.to_str() {
            Some("/gone") => None,
            Some(s) if s.ends_with(".env") => Some(false),
            _ => Some(true),
        };
        let ops = plan(&policy, Path::new("/"), &exists);
        assert!(ops.contains(&MountOp::DenyReadDir("/home/u/.ssh".into())));
        assert!(ops.contains(&MountOp::DenyReadFile("/work/.env".into())));
        assert!(!ops.iter().any(|op| format!("{op:?}").contains("/gone")));
        assert_eq!(ops[0], MountOp::MakePrivate);
    }
}
