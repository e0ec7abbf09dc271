//! The sandbox's private /dev: a small tmpfs with the host's harmless
//! device nodes bound in (null, zero, full, random, urandom, tty), a devpts
//! instance of its own (no host terminal is reachable by name: the agent
//! keeps only the stdio it was given), a private /dev/shm, and the usual
//! symlinks, and a read-only bind of any host terminal on a standard
//! stream (`stdio_tty.rs`). Built by the init, as root in its mount
//! namespace, after the fresh /proc.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};

use crate::mount_tree;

#[derive(Debug, thiserror::Error)]
pub enum DevfsError {
    #[error("failed to {what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// Host device nodes the agent may use; nothing else of the host's /dev.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// A devpts of the sandbox's own (its ptys are not the host's) with at
/// most 256 ptys (`max=`) at once. A devpts instance draws from the
/// host-wide `kernel.pty.max`, and every instance but the host's first
/// shares what `kernel.pty.reserve` leaves (3,072 of 4,096 by default): an
/// agent without `max=` took all of them, and every other run and container
/// of the host got ENOSPC from /dev/ptmx until it ended. 256 is far more
/// than terminals, tmux and pty-spawning test suites hold at once.
const PTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620,max=256";

const LINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

fn failed<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> DevfsError + 'a {
    move |source| DevfsError::Mount {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn io_failed<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DevfsError + 'a {
    move |e| DevfsError::Mount {
        what,
        path: path.to_path_buf(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// Replaces /dev. `mount_points` are directories under /dev that later
/// steps mount on (a writable root such as /dev/shm/work): they are made
/// here, before the tmpfs turns read-only. `shm_bounds` bounds /dev/shm.
pub fn build(
    mount_points: &[PathBuf],
    shm_bounds: &crate::tmpfs_bounds::TmpfsBounds,
) -> Result<(), DevfsError> {
    let dev = Path::new("/dev");
    // A host terminal on a standard stream, before the tmpfs hides it.
    let ttys = crate::stdio_tty::hold();
    // Copies of the host's nodes, taken before the tmpfs hides them.
    let mut nodes: Vec<(&str, OwnedFd)> = Vec::new();
    for name in DEVICES {
        let host = dev.join(name);
        // A host without the node (a minimal container) gives none.
        let Ok(fd) = mount_tree::open_no_symlinks(&host) else {
            continue;
        };
        let copy = mount_tree::clone_tree(&fd, false).map_err(failed("copy the device", &host))?;
        // Writes to a device node pass a read-only mount; its inode's
        // mode, owner and times do not.
        mount_tree::set_device_flags(&copy).map_err(failed("make read-only the device", &host))?;
        nodes.push((name, copy));
    }

    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k,nr_inodes=64"),
    )
    .map_err(failed("mount a private tmpfs on", dev))?;
    for (name, copy) in nodes {
        let path = dev.join(name);
        std::fs::File::create(&path).map_err(io_failed("create the device node", &path))?;
        let onto = mount_tree::open_no_symlinks(&path).map_err(failed("open", &path))?;
        mount_tree::attach(&copy, &onto).map_err(failed("bind the device", &path))?;
    }

    let pts = dev.join("pts");
    std::fs::create_dir(&pts).map_err(io_failed("create", &pts))?;
    // A new devpts instance: its ptys are the sandbox's own, and the
    // host's /dev/pts/N do not exist here.
    mount(
        Some("devpts"),
        pts.as_path(),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(PTS_OPTIONS),
    )
    .map_err(failed("mount a private devpts on", &pts))?;
    let shm = dev.join("shm");
    std::fs::create_dir(&shm).map_err(io_failed("create", &shm))?;
    mount(
        Some("tmpfs"),
        shm.as_path(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(shm_bounds.options("mode=1777").as_str()),
    )
    .map_err(failed("mount a private tmpfs on", &shm))?;
    for (name, target) in LINKS {
        let path = dev.join(name);
        std::os::unix::fs::symlink(target, &path).map_err(io_failed("create the link", &path))?;
    }
    crate::stdio_tty::make_points(&ttys).map_err(io_failed("create", Path::new("/dev/.tty")))?;
    for point in mount_points.iter().filter(|p| p.starts_with(dev)) {
        std::fs::create_dir_all(point).map_err(io_failed("create the mount point", point))?;
    }
    // Nothing may be added to or changed in /dev itself (shm and pts stay
    // writable: they are mounts of their own).
    let root = mount_tree::open_no_symlinks(dev).map_err(failed("open", dev))?;
    mount_tree::set_flags(&root, mount_tree::READ_ONLY, 0, false)
        .map_err(failed("make read-only", dev))?;
    crate::stdio_tty::attach(ttys).map_err(failed("reopen the terminal in", Path::new("/dev/.tty")))
}
