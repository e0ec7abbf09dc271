//! The live log's inode is append-only (`FS_APPEND_FL`) from its genesis
//! to its seal. The log may sit in a tree that another run's agent (or
//! any process of the log directory's owner) can write: its own run hides
//! it from its agent, but nothing hid it from a second run on the same
//! tree, whose agent renamed the live log away and put an older, genuine
//! log at its name; `verify` said `ok` on the swapped file (adversarial
//! round 18). An append-only inode cannot be renamed, unlinked, replaced
//! by a rename, hard-linked, truncated or opened for writing without
//! `O_APPEND`, whoever asks, until a holder of `CAP_LINUX_IMMUTABLE`
//! clears the flag: the supervisor does at the seal, so the user can
//! remove the log afterwards.

use std::fs::File;
use std::os::fd::AsRawFd;

/// `FS_APPEND_FL` (include/uapi/linux/fs.h).
const FS_APPEND_FL: libc::c_int = 0x0000_0020;

/// Sets (`on`) or clears the flag on `file`. Needs `CAP_LINUX_IMMUTABLE`
/// and a filesystem with inode flags (ext4, xfs, btrfs, tmpfs since 6.0).
pub(crate) fn set(file: &File, on: bool) -> std::io::Result<()> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (the kernel's ABI despite the
    // `long` in its name) into `flags`, which we own.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let wanted = if on {
        flags | FS_APPEND_FL
    } else {
        flags & !FS_APPEND_FL
    };
    if wanted == flags {
        return Ok(());
    }
    // SAFETY: FS_IOC_SETFLAGS reads one int from `wanted`, which we own.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_SETFLAGS, &wanted) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
