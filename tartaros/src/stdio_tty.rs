//! A host terminal given as a standard stream, reopened through a
//! read-only mount.
//!
//! The launcher's terminal (`/dev/pts/N` of the host's devpts, owned by the
//! user who runs it) reached the agent as the launcher's descriptor, on the
//! host's read-write devpts mount. An agent whose uid owns the pty (under
//! sudo, the service) could `fchmod` it 0666 or `fchown` it, by descriptor
//! or through `/proc/self/fd/0`: other local users could then write to, or
//! with `legacy_tiocsti` type into, the user's shell. A pipe relay cannot
//! stand in for a terminal (isatty, job control), so the init binds that
//! one pty node, read-only, into the private /dev (`/dev/.tty/N`) and
//! reopens it there: the same terminal (a device write passes a read-only
//! mount), but its mode, owner and times now fail with EROFS.
//!
//! Since adversarial round 23b the CLI relays the terminal streams of a
//! run without a pty instead (the agent could still set TOSTOP on the
//! terminal, take a VT as its controlling terminal, read the shell's input
//! while its job was stopped, and keep the launcher's own descriptor where
//! the name could not be reopened): this reopening stays for a terminal a
//! service client passes without relaying it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::mount_tree;

/// Where the reopened terminals are mounted in the private /dev.
const DIR: &str = "/dev/.tty";

/// Read-only copies of the pty nodes behind the standard streams that are
/// terminals, taken before the private /dev hides the host's.
pub struct Held(Vec<(RawFd, OwnedFd)>);

/// Copies the node of every standard stream that is a terminal. A stream
/// that cannot be copied is left as it is (and stays the launcher's).
pub fn hold() -> Held {
    let mut held = Vec::new();
    for fd in 0..3 {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            continue;
        }
        // The launcher's descriptor lies on a mount of the host's namespace,
        // which open_tree cannot copy from here: the same node is found by
        // name in this namespace's copy of the host's tree, and must be the
        // same device on the same filesystem.
        let Ok(name) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        let Ok(node) = mount_tree::open_no_symlinks(&name) else {
            continue;
        };
        let same = match (
            nix::sys::stat::fstat(fd),
            nix::sys::stat::fstat(node.as_raw_fd()),
        ) {
            (Ok(a), Ok(b)) => {
                a.st_dev == b.st_dev && a.st_rdev == b.st_rdev && a.st_ino == b.st_ino
            }
            _ => false,
        };
        if !same {
            continue;
        }
        let Ok(copy) = mount_tree::clone_tree(&node, false) else {
            continue;
        };
        if mount_tree::set_device_flags(&copy).is_ok() {
            held.push((fd, copy));
        }
    }
    Held(held)
}

/// Mount points for [`attach`]; made while the /dev tmpfs is writable.
pub fn make_points(held: &Held) -> std::io::Result<()> {
    if held.0.is_empty() {
        return Ok(());
    }
    std::fs::create_dir(DIR)?;
    for (fd, _) in &held.0 {
        std::fs::File::create(point(*fd))?;
    }
    Ok(())
}

fn point(fd: RawFd) -> PathBuf {
    Path::new(DIR).join(fd.to_string())
}

/// Attaches each copy and puts the terminal, reopened through it, on its
/// stream number, with the original's access mode (a write-only stdout
/// must not become a way to read the user's keystrokes) and status flags.
pub fn attach(held: Held) -> Result<(), nix::Error> {
    for (fd, copy) in held.0 {
        let path = point(fd);
        let onto = mount_tree::open_no_symlinks(&path)?;
        mount_tree::attach(&copy, &onto)?;
        // SAFETY: F_GETFL only reads the descriptor's status flags.
        let status = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if status < 0 {
            return Err(nix::Error::last());
        }
        let mode = status & libc::O_ACCMODE;
        let Ok(file) = std::fs::OpenOptions::new()
            .read(mode != libc::O_WRONLY)
            .write(mode != libc::O_RDONLY)
            .custom_flags(libc::O_NOCTTY)
            .open(&path)
        else {
            // Another user's terminal (`su` keeps the caller's), which the
            // init may not open by name: it stays the launcher's descriptor,
            // as it was before this reopening existed.
            continue;
        };
        // SAFETY: F_SETFL sets status flags of our own descriptor.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, status) };
        // SAFETY: dup2 onto a standard stream number; `file` stays open
        // until after the call, then closes its own number.
        if unsafe { libc::dup2(file.as_raw_fd(), fd) } < 0 {
            return Err(nix::Error::last());
        }
    }
    Ok(())
}
