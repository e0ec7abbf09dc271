//! The agent's own open file descriptions of the pipes and standard
//! devices on its standard streams.
//!
//! A pipe's status flags (`O_NONBLOCK`, `O_DIRECT`: packet mode) belong to
//! the open file description, not to the pipe, and the launcher's is
//! shared with whatever else on the host writes or reads through it. An
//! agent that set `O_NONBLOCK` on its stdout left it set for the next
//! writer of the launcher's pipeline, which then got short writes
//! (`{ tartaros run -- agent; writer; } | wc -c` counted 65,536 of 2 MB,
//! adversarial round 14). Opening `/proc/self/fd/N` makes a new open file
//! description of the same pipe (the kernel's `fifo_open`): the bytes go
//! where they went, end of file and `SIGPIPE` are unchanged (the reopened
//! end counts as a reader or writer like the original), and the flags the
//! agent sets stay its own. The init does it before forking the agent,
//! while it is still root (the pipe's inode is `0600` of the uid that made
//! it); the init keeps no copy of the launcher's descriptions, only the
//! supervisor does.
//!
//! A standard device (`< /dev/null`, `> /dev/full`: the host's node, on
//! the host's read-write /dev, whose mode, times and ACL a root run's
//! agent changed, adversarial round 14) is replaced by the same device of
//! the sandbox's /dev, a read-only bind (devfs.rs): the same reads and
//! writes, its metadata out of reach. Any other character device but a
//! terminal is relayed (stdio_relay.rs), a terminal reopened
//! (stdio_tty.rs). Not reopened: a regular file (the shared offset is what
//! `{ a; b; } > f` means) and a socket (it cannot be opened by path). What
//! the pipe itself keeps is still shared: its size (`F_SETPIPE_SZ`).

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;

/// The standard devices (major 1, by minor) the sandbox's /dev has of its
/// own (devfs.rs `DEVICES`): a stream of one is replaced, not relayed.
pub const STANDARD: [(u32, &str); 5] = [
    (3, "null"),
    (5, "zero"),
    (7, "full"),
    (8, "random"),
    (9, "urandom"),
];
const MEM_MAJOR: u32 = 1;

/// The sandbox's device standing for the host's device `rdev`, if any.
pub fn standard_device(rdev: libc::dev_t) -> Option<&'static str> {
    if libc::major(rdev) != MEM_MAJOR {
        return None;
    }
    let minor = libc::minor(rdev);
    STANDARD.iter().find(|(m, _)| *m == minor).map(|(_, n)| *n)
}

/// Errors of putting a stream of the agent's own in place.
#[derive(Debug, thiserror::Error)]
pub enum StdioOwnError {
    #[error("failed to read the status flags of standard stream {fd}: {source}")]
    Flags { fd: RawFd, source: nix::Error },
    #[error("failed to put the reopened stream on standard stream {fd}: {source}")]
    Place { fd: RawFd, source: nix::Error },
    #[error(
        "failed to give standard stream {fd} the sandbox's /dev/{name} in place of the host's: {reason}"
    )]
    Device {
        fd: RawFd,
        name: &'static str,
        reason: String,
    },
}

/// Where the new description comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The same pipe, through `/proc/self/fd/N`.
    Pipe,
    /// The sandbox's `/dev/<name>`.
    Device(&'static str),
}

/// How to reopen a stream, decided from its file type, device number and
/// the status flags of the launcher's description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reopen {
    source: Source,
    read: bool,
    write: bool,
    /// The flags to give the new description: the launcher's, as the
    /// agent would have found them.
    status: libc::c_int,
}

/// The flags `F_SETFL` carries over (the others are fixed at open or
/// need an owner, `O_ASYNC`).
const CARRIED: libc::c_int = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT;

/// Whether and how a stream of file type `kind` (`st_mode & S_IFMT`),
/// device `rdev` and status flags `status` is reopened: pipes, FIFOs and
/// the standard devices.
fn reopen(kind: libc::mode_t, rdev: libc::dev_t, status: libc::c_int) -> Option<Reopen> {
    let source = match kind {
        libc::S_IFIFO => Source::Pipe,
        libc::S_IFCHR => Source::Device(standard_device(rdev)?),
        _ => return None,
    };
    let mode = status & libc::O_ACCMODE;
    Some(Reopen {
        source,
        read: mode != libc::O_WRONLY,
        write: mode != libc::O_RDONLY,
        status: status & CARRIED,
    })
}

/// Gives each standard stream that is a pipe or a standard device a
/// description of the agent's own. A pipe that cannot be reopened (a
/// FIFO with no reader yet, which a write-only open would wait for; a
/// pipe of a uid the init's namespace does not map) stays the launcher's
/// description, as before; a device must be replaced (fail closed: the
/// host's node is what the agent must not hold). After the private /dev.
pub fn reopen_streams() -> Result<(), StdioOwnError> {
    for fd in 0..3 {
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            continue;
        };
        // SAFETY: F_GETFL only reads the descriptor's status flags.
        let status = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if status < 0 {
            return Err(StdioOwnError::Flags {
                fd,
                source: nix::Error::last(),
            });
        }
        let Some(how) = reopen(st.st_mode & libc::S_IFMT, st.st_rdev, status) else {
            continue;
        };
        let path = match how.source {
            Source::Pipe => format!("/proc/self/fd/{fd}"),
            Source::Device(name) => format!("/dev/{name}"),
        };
        // O_NONBLOCK: a named FIFO's open must not wait for a partner (a
        // pipe's never does); the launcher's flags are set right after.
        // The pipe's path is a magic link, to be followed.
        let no_follow = match how.source {
            Source::Pipe => 0,
            Source::Device(_) => libc::O_NOFOLLOW,
        };
        let opened = std::fs::OpenOptions::new()
            .read(how.read)
            .write(how.write)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | no_follow)
            .open(&path);
        let file = match (opened, how.source) {
            (Ok(file), Source::Pipe) => file,
            (Err(_), Source::Pipe) => continue,
            (opened, Source::Device(name)) => {
                let fail = |reason: String| StdioOwnError::Device { fd, name, reason };
                let file = opened.map_err(|e| fail(e.to_string()))?;
                sandbox_device(&file, st.st_rdev).map_err(fail)?;
                file
            }
        };
        // SAFETY: F_SETFL sets status flags of our own descriptor.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, how.status) } < 0 {
            return Err(StdioOwnError::Flags {
                fd,
                source: nix::Error::last(),
            });
        }
        // SAFETY: dup2 onto a standard stream number; `file` stays open
        // until after the call, then closes its own number.
        if unsafe { libc::dup2(file.as_raw_fd(), fd) } < 0 {
            return Err(StdioOwnError::Place {
                fd,
                source: nix::Error::last(),
            });
        }
    }
    Ok(())
}

/// Checks that `file` is device `rdev` on a read-only mount: the
/// sandbox's bind, whose node the agent cannot change.
fn sandbox_device(file: &std::fs::File, rdev: libc::dev_t) -> Result<(), String> {
    let st = nix::sys::stat::fstat(file.as_raw_fd()).map_err(|e| e.to_string())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != rdev {
        return Err("it is another file".into());
    }
    let vfs = nix::sys::statvfs::fstatvfs(file).map_err(|e| e.to_string())?;
    if !vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Err("it is not on the sandbox's read-only bind".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_DEVICE: libc::dev_t = 0;

    #[test]
    fn pipes_are_reopened_with_the_launcher_s_access_mode_and_flags() {
        let fifo = libc::S_IFIFO;
        let status = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
        assert_eq!(
            reopen(fifo, NO_DEVICE, status),
            Some(Reopen {
                source: Source::Pipe,
                read: false,
                write: true,
                status: libc::O_NONBLOCK,
            })
        );
        let input = reopen(fifo, NO_DEVICE, libc::O_RDONLY | libc::O_LARGEFILE).unwrap();
        assert_eq!((input.read, input.write, input.status), (true, false, 0));
        let both = reopen(fifo, NO_DEVICE, libc::O_RDWR | libc::O_APPEND).unwrap();
        assert_eq!(
            (both.read, both.write, both.status),
            (true, true, libc::O_APPEND)
        );
        let status = libc::O_WRONLY | libc::O_ASYNC;
        assert_eq!(reopen(fifo, NO_DEVICE, status).unwrap().status, 0);
    }

    #[test]
    fn standard_devices_are_the_sandbox_s_other_devices_are_not_reopened() {
        let null = libc::makedev(1, 3);
        let out = reopen(libc::S_IFCHR, null, libc::O_WRONLY).unwrap();
        assert_eq!(out.source, Source::Device("null"));
        assert!(out.write && !out.read);
        assert_eq!(standard_device(libc::makedev(1, 9)), Some("urandom"));
        // /dev/mem (1:1), /dev/kmsg (1:11), a terminal (136:0), 3:3.
        for other in [(1, 1), (1, 11), (136, 0), (3, 3)] {
            let rdev = libc::makedev(other.0, other.1);
            assert_eq!(reopen(libc::S_IFCHR, rdev, libc::O_RDWR), None, "{other:?}");
        }
        // A block device with a standard number is no standard device.
        assert_eq!(reopen(libc::S_IFBLK, null, libc::O_RDONLY), None);
    }

    #[test]
    fn files_sockets_and_directories_keep_their_description() {
        for kind in [libc::S_IFREG, libc::S_IFSOCK, libc::S_IFDIR] {
            assert_eq!(reopen(kind, NO_DEVICE, libc::O_WRONLY), None, "{kind:o}");
        }
    }
}
