//! The kernel's file-descriptor mount API (Linux 5.12+): detached copies of
//! mount trees (`open_tree`), attaching them (`move_mount`), per-mount flags
//! on a whole tree at once (`mount_setattr`), and opening a path (or one
//! entry of an open directory) without following any symlink (`openat2`),
//! whether a directory opened so compares names byte for byte, which mount
//! a descriptor lies on (`statx`), and covering a mount point with an empty
//! mount. The only `unsafe` of the mount plan lives here; `mounts.rs` and
//! `unix_mirror.rs` decide what to do with it.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const AT_EMPTY_PATH: libc::c_uint = 0x1000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_BENEATH: u64 = 0x08;

/// Per-mount flags for [`set_flags`].
pub const READ_ONLY: u64 = 0x1;
pub const NO_SUID: u64 = 0x2;
pub const NO_DEV: u64 = 0x4;
pub const NO_EXEC: u64 = 0x8;
/// `MOUNT_ATTR_NOSYMFOLLOW` (Linux 5.14 for `mount_setattr`).
pub const NO_SYMFOLLOW: u64 = 0x0020_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn c_path(path: &Path) -> Result<CString, nix::Error> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| nix::Error::EINVAL)
}

fn fd_result(rc: libc::c_long) -> Result<OwnedFd, nix::Error> {
    if rc < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

/// An `O_PATH` descriptor of `path` reached without following any symlink
/// (nor /proc magic link) on the way: ELOOP if one is there. Pins the name
/// the policy gave against a link swapped in after it was checked.
pub fn open_no_symlinks(path: &Path) -> Result<OwnedFd, nix::Error> {
    open2_no_symlinks(path, libc::O_PATH | libc::O_CLOEXEC)
}

/// `path` opened for reading without following any symlink or /proc magic
/// link in any of its components (ELOOP), without blocking on a FIFO and
/// without taking a terminal: how the supervisor, as root, reads a file an
/// agent named or could have replaced (the seal's hashes), so a directory
/// swapped for a link to `/etc` cannot make it read a host file.
pub fn open_file_no_symlinks(path: &Path) -> Result<std::fs::File, nix::Error> {
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    open2_no_symlinks(path, flags).map(std::fs::File::from)
}

/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`) and its casefold bit.
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_CASEFOLD_FL: libc::c_long = 0x4000_0000;
/// ext4, tmpfs and btrfs: filesystems whose directories compare names byte
/// for byte unless they carry the casefold flag.
const EXACT_NAME_FS: [libc::c_long; 3] = [0xEF53, 0x0102_1994, 0x9123_683E];

/// Whether the directory `dir` looks names up byte for byte, so that a
/// name missing from its listing does not exist. False on a
/// case-insensitive directory (ext4 or tmpfs `casefold`, FAT, NTFS, ...),
/// where the name the kernel reported for a file may differ in case from
/// the listed one, and whenever that cannot be told.
pub fn names_are_exact(dir: &OwnedFd) -> bool {
    let Ok(fs) = nix::sys::statfs::fstatfs(dir) else {
        return false;
    };
    if !EXACT_NAME_FS.contains(&(fs.filesystem_type().0 as libc::c_long)) {
        return false;
    }
    let mut flags: libc::c_long = 0;
    // SAFETY: the kernel writes at most a `long` into `flags`, which
    // outlives the call; `dir` is an open descriptor.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) };
    rc == 0 && flags & FS_CASEFOLD_FL == 0
}

/// The directory `path` opened for listing, reached as
/// [`open_file_no_symlinks`] reaches a file.
pub fn open_dir_no_symlinks(path: &Path) -> Result<OwnedFd, nix::Error> {
    open2_no_symlinks(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)
}

/// `openat2(AT_FDCWD, path, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
fn open2_no_symlinks(path: &Path, flags: libc::c_int) -> Result<OwnedFd, nix::Error> {
    open2(libc::AT_FDCWD, path, flags, 0, 0)
}

/// The directory `path` as an `O_PATH` descriptor, reached without
/// following any symlink: where a walk by descriptor starts.
pub fn open_dir_path_no_symlinks(path: &Path) -> Result<OwnedFd, nix::Error> {
    open2_no_symlinks(path, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
}

/// The entry `name` of the directory `dir` (one component, never `..`),
/// opened with `flags` (and `mode`, with `O_CREAT`) without following a
/// symlink, not even the entry itself (ELOOP), and never leaving `dir`:
/// one step of a walk that a symlink swapped in cannot redirect.
pub fn open_beneath(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
    mode: u32,
) -> Result<OwnedFd, nix::Error> {
    open2(
        dir.as_raw_fd(),
        Path::new(name),
        flags | libc::O_CLOEXEC,
        mode,
        RESOLVE_BENEATH,
    )
}

/// `openat2(at, path, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | more)`.
fn open2(
    at: libc::c_int,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    more: u64,
) -> Result<OwnedFd, nix::Error> {
    let name = c_path(path)?;
    let how = OpenHow {
        flags: flags as u64,
        mode: u64::from(mode),
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | more,
    };
    // SAFETY: `name` and `how` outlive the call; the size is the struct's.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            at,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    fd_result(rc)
}

/// A detached copy of the mount tree at `at` (an `O_PATH` descriptor),
/// every submount included, each keeping its current flags.
pub fn clone_tree(at: &OwnedFd, recursive: bool) -> Result<OwnedFd, nix::Error> {
    let empty = c"";
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_EMPTY_PATH;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: an empty path with AT_EMPTY_PATH names `at` itself.
    let rc = unsafe { libc::syscall(libc::SYS_open_tree, at.as_raw_fd(), empty.as_ptr(), flags) };
    fd_result(rc)
}

/// Flags for a copy of one device node the sandbox may use (its /dev, a
/// host terminal): read-only, `nosuid`, `noexec`, and the `nodev` of the
/// sandbox's base cleared. A host mount locked `nodev` (a user namespace
/// keeps the host's flags) keeps it: its nodes never opened.
pub fn set_device_flags(copy: &OwnedFd) -> Result<(), nix::Error> {
    let flags = READ_ONLY | NO_SUID | NO_EXEC;
    set_flags(copy, flags, NO_DEV, false).or_else(|_| set_flags(copy, flags, 0, false))
}

/// Sets `set` and clears `clear` on the mount `tree` names (a detached
/// tree or an `O_PATH` descriptor of a mount point), and with `recursive`
/// on every mount below it.
pub fn set_flags(tree: &OwnedFd, set: u64, clear: u64, recursive: bool) -> Result<(), nix::Error> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = AT_EMPTY_PATH;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    let empty = c"";
    // SAFETY: `attr` outlives the call and its size is passed with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(nix::Error::last());
    }
    Ok(())
}

/// Attaches the detached `tree` on top of the object `onto` names.
pub fn attach(tree: &OwnedFd, onto: &OwnedFd) -> Result<(), nix::Error> {
    let empty = c"";
    // SAFETY: both paths are empty strings naming the descriptors
    // themselves (MOVE_MOUNT_F_EMPTY_PATH and MOVE_MOUNT_T_EMPTY_PATH).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            onto.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(nix::Error::last());
    }
    Ok(())
}

/// The id of the mount the object `fd` names lies on (`statx` with
/// `STATX_MNT_ID`, Linux 5.8): the first field of its line in
/// /proc/self/mountinfo. For a mount point, the topmost mount there.
pub fn mount_id(fd: &OwnedFd) -> Result<u64, nix::Error> {
    let empty = c"";
    // SAFETY: an empty path with AT_EMPTY_PATH names `fd` itself; `buf` is
    // plain data (all zeroes is a valid value) that outlives the call, and
    // the kernel writes at most a `struct statx` into it.
    let (rc, buf) = unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        let rc = libc::statx(
            fd.as_raw_fd(),
            empty.as_ptr(),
            AT_EMPTY_PATH as libc::c_int,
            libc::STATX_MNT_ID,
            &mut buf,
        );
        (rc, buf)
    };
    if rc < 0 {
        return Err(nix::Error::last());
    }
    if buf.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(nix::Error::EOPNOTSUPP);
    }
    Ok(buf.stx_mnt_id)
}

/// Covers the object `at` names (an `O_PATH` descriptor on an attached
/// mount) with an empty, read-only mount: a directory with an empty tmpfs,
/// anything else with /dev/null on a `nodev` mount. No name below it
/// reaches what was there, and a socket name there finds no socket.
pub fn cover(at: &OwnedFd) -> Result<(), nix::Error> {
    use nix::mount::MsFlags;
    let stat = nix::sys::stat::fstat(at.as_raw_fd())?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
        let null = open_no_symlinks(Path::new("/dev/null"))?;
        let copy = clone_tree(&null, false)?;
        set_flags(&copy, READ_ONLY | NO_SUID | NO_DEV | NO_EXEC, 0, false)?;
        return attach(&copy, at);
    }
    // mount(2) takes a path: the descriptor's, through the fresh /proc.
    let target = format!("/proc/self/fd/{}", at.as_raw_fd());
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    nix::mount::mount(
        Some("tmpfs"),
        target.as_str(),
        Some("tmpfs"),
        flags,
        Some("mode=0555,size=4k,nr_inodes=1"),
    )
}
