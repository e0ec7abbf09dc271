//! Target fields of the capture's newer record kinds (mknod, xattr, utime,
//! setflags, refused syscalls), kept out of `decode.rs`, which walks the
//! common shape of every record.

use tartaros_common::capture::{
    SysEvent, X32_SYSCALL_BIT, effect, flag, ioctl, nr, refused_sometimes,
};
use tartaros_common::syscalls;

use crate::effectlog::Target;

/// `args[0]` of an xattr record: set (0) or remove (1).
const XATTR_REMOVE: u64 = 1;
/// `AT_SYMLINK_NOFOLLOW`.
const AT_SYMLINK_NOFOLLOW: u64 = 0x100;

/// Adds what `s` says beyond its path or fd.
pub(super) fn put_more(t: &mut Target, s: &SysEvent) {
    match s.header.effect {
        effect::MKNOD => {
            let mode = s.args[0];
            t.insert("mode", mode & 0o7777);
            let file_type = match mode & 0o170000 {
                0 | 0o100000 => "regular",
                0o010000 => "fifo",
                0o140000 => "socket",
                0o020000 => "char",
                0o060000 => "block",
                _ => "unknown",
            };
            t.insert("file_type", file_type);
            if matches!(file_type, "char" | "block") {
                t.insert("dev", s.args[1]);
            }
        }
        effect::XATTR => {
            let op = if s.args[0] == XATTR_REMOVE {
                "remove"
            } else {
                "set"
            };
            t.insert("op", op);
            if s.args[0] != XATTR_REMOVE && s.nr != nr::SETXATTRAT {
                t.insert("size", s.args[1]);
            }
            match s.nr {
                nr::LSETXATTR | nr::LREMOVEXATTR => {
                    t.insert("nofollow", true);
                }
                nr::SETXATTRAT | nr::REMOVEXATTRAT if s.args[2] & AT_SYMLINK_NOFOLLOW != 0 => {
                    t.insert("nofollow", true);
                }
                _ => {}
            }
        }
        effect::UTIME if s.nr == nr::UTIMENSAT && s.args[0] != 0 => {
            t.insert("flags", s.args[0]);
        }
        effect::SETFLAGS if s.nr == nr::IOCTL => {
            let cmd = match s.args[0] & 0xffff_ffff {
                ioctl::FS_IOC_FSSETXATTR => "FS_IOC_FSSETXATTR",
                _ => "FS_IOC_SETFLAGS",
            };
            t.insert("cmd", cmd);
            if s.args[1] == u64::MAX {
                t.insert("flags_unreadable", true);
            } else if cmd == "FS_IOC_SETFLAGS" {
                t.insert("flags", s.args[1]);
            }
        }
        effect::SYSCALL if s.header.flags & flag::ABI_IA32 != 0 => {
            // The i386 table: no names kept here, the number says it.
            t.insert("syscall", format!("ia32 #{}", s.nr));
            t.insert("abi", "ia32");
            t.insert("nr", s.nr);
            t.insert("refused_by", "seccomp");
        }
        effect::SYSCALL if s.header.flags & flag::ABI_X32 != 0 => {
            let native = u64::from(s.nr) & !X32_SYSCALL_BIT;
            let name = u32::try_from(native)
                .ok()
                .and_then(syscalls::name_of)
                .map_or_else(|| format!("x32 #{native}"), |n| format!("x32 {n}"));
            t.insert("syscall", name);
            t.insert("abi", "x32");
            t.insert("nr", s.nr);
            t.insert("refused_by", "seccomp");
        }
        effect::SYSCALL => {
            t.insert("syscall", syscalls::name_of(s.nr).unwrap_or("unknown"));
            t.insert("nr", s.nr);
            if s.nr == nr::IOCTL {
                let cmd = ioctl::refused_name(s.args[1]).unwrap_or("unknown");
                t.insert("cmd", cmd);
                t.insert("fd", s.args[0] as u32 as i32);
            }
            // The filter's answers; without a filter the call ran. A call
            // refused for its arguments was told apart by its rule.
            if (s.ret == -1 || s.ret == -38) && !refused_sometimes::contains(s.nr) {
                t.insert("refused_by", "seccomp");
            }
        }
        _ => {}
    }
}

/// The arguments the refusing `rule` tested, by the names it gives them
/// (not a pointer's value), and who refused: the filter for certain only
/// when the rule is of the set every run has.
/// A refused call's arguments by the filter's index. The exit record keeps
/// three registers; openat's are its dirfd, flags and mode (the mode, its
/// fourth argument, is what the filter tests), so its path pointer, which
/// no rule reads, is left 0; fadvise64's the same way its fd, length and
/// advice (its offset left 0).
pub(super) fn filtered_args(s: &SysEvent) -> Vec<u64> {
    let [a0, a1, a2] = s.args;
    if s.nr == nr::OPENAT || s.nr == refused_sometimes::FADVISE64 {
        vec![a0, 0, a1, a2]
    } else {
        vec![a0, a1, a2]
    }
}

pub(super) fn put_refused_args(t: &mut Target, rule: &crate::seccomp::Rule, args: &[u64]) {
    for cond in &rule.when {
        if cond.test != crate::seccomp::ArgTest::NotNull
            && let Some(&arg) = args.get(usize::from(cond.index))
        {
            t.insert(cond.name, arg);
        }
    }
    if rule.tier == crate::seccomp::Tier::Default {
        t.insert("refused_by", "seccomp");
    }
}

/// Host pid of the process behind `fd` (a pidfd) of `tgid`, if the
/// descriptor still holds the file `(dev, ino)` the kernel named; and
/// whether that file is a pidfs inode (one per process). The descriptor is
/// reopened, so that the inode checked and the `Pid:` read are of one
/// file, whatever the agent puts at the number meanwhile. Non-blocking
/// and without taking a terminal, as every file an agent can swap is
/// opened here (`mount_tree::open_file_no_symlinks`): a FIFO put at the
/// number after the call made a plain open wait for a writer forever, and
/// the whole supervisor with it (no `--timeout`, no seal; round 7).
pub(super) fn pidfd_pid(
    proc_root: &str,
    tgid: u32,
    fd: i32,
    file: (u64, u64),
) -> Option<(u32, bool)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    if fd < 0 {
        return None;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("{proc_root}/{tgid}/fd/{fd}"))
        .ok()?;
    let meta = f.metadata().ok()?;
    if (meta.dev(), meta.ino()) != file {
        return None;
    }
    // The fdinfo of our own descriptor: nobody else can swap it.
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).ok()?;
    let line = info.lines().find(|l| l.starts_with("Pid:"))?;
    // -1 once the process has been reaped.
    let pid: i64 = line[4..].trim().parse().ok()?;
    let pid = u32::try_from(pid).ok().filter(|p| *p > 0)?;
    let pidfs = nix::sys::statfs::fstatfs(&f)
        .is_ok_and(|fs| fs.filesystem_type().0 as libc::c_long == PIDFS_MAGIC);
    Some((pid, pidfs))
}

/// `PIDFS_MAGIC` (include/uapi/linux/magic.h, Linux 6.9): pidfds on pidfs
/// have an inode of their process's own; before, every pidfd shared one
/// anonymous inode, which names no process.
const PIDFS_MAGIC: libc::c_long = 0x5049_4446;
