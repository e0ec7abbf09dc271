//! Which arguments of a syscall the capture's `sys_enter` keeps, as data:
//! the descriptor of each syscall number, compiled into the program's
//! frozen `.rodata` with the number's effect kind ([`TABLE`]). The
//! program then has one generic path that
//! reads the descriptor instead of an arm per syscall; the verifier walks
//! that path once instead of every arm, which was most of the program's
//! verification, paid at every `--log` start. The calls whose record
//! depends on their arguments' values (opens, `unlinkat`, `utimensat(fd,
//! NULL)`, the flag ioctls, socket addresses) keep their own code: their
//! descriptor is [`SPECIAL`].
//!
//! A descriptor (`u32`) is, from the low bits: the record (2 bits), when it
//! is written (2), then 3-bit sources for `fd`, the path pointer, `fd2`,
//! the second pointer and `args[0..3]`. A source 0..=5 is that argument
//! register; [`src::NONE`] and [`src::CWD`] are constants, which for a
//! descriptor (fd) mean -1 and `AT_FDCWD`, and for anything else 0 and 1.

use super::nr::*;
use super::syscall_numbers::nr;

/// Classified by its own code in `sys_enter` (or not captured).
pub const SPECIAL: u32 = 0;
/// The record of a descriptor (bits 0..2).
pub const SHAPE_PATH: u32 = 1;
pub const SHAPE_PATH2: u32 = 2;
pub const SHAPE_PLAIN: u32 = 3;

/// Where a field comes from.
pub mod src {
    /// Argument registers 0 to 5 are sources 0 to 5.
    pub const ARG0: u8 = 0;
    /// A descriptor of -1 (none); 0 for any other field.
    pub const NONE: u8 = 6;
    /// `AT_FDCWD` for a descriptor; 1 for any other field.
    pub const CWD: u8 = 7;
}

/// When `sys_exit` writes the record (`Call::when` in the program).
pub mod when {
    pub const ALWAYS: u32 = 0;
    /// Refused with EACCES / EPERM (read-only opens: the denied reads).
    pub const REFUSED: u32 = 1;
    /// Failed (exec: a successful one is `sched_process_exec`'s).
    pub const FAILED: u32 = 2;
    /// Succeeded (chdir: only those move the cwd).
    pub const OK: u32 = 3;
}

/// The record type of descriptor `d` (`record::SYS_PATH`, `SYS_PATH2` or
/// `SYS`), without a branch: the verifier walks one path for all three.
#[inline(always)]
pub const fn record_of(d: u32) -> u16 {
    super::record::SYS + ((d & 3) % 3) as u16
}

const _: () = assert!(
    record_of(SHAPE_PATH) == super::record::SYS_PATH
        && record_of(SHAPE_PATH2) == super::record::SYS_PATH2
        && record_of(SHAPE_PLAIN) == super::record::SYS
);

/// Bit offsets of the fields after the record and `when`.
pub const FD_SHIFT: u32 = 4;
pub const PTR_SHIFT: u32 = 7;
pub const FD2_SHIFT: u32 = 10;
pub const PTR2_SHIFT: u32 = 13;
pub const ARGS_SHIFT: u32 = 16;

/// A descriptor, spelled out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub record: u32,
    pub when: u32,
    pub fd: u8,
    pub ptr: u8,
    pub fd2: u8,
    pub ptr2: u8,
    pub args: [u8; 3],
}

const N: u8 = src::NONE;
const C: u8 = src::CWD;
/// `XATTR_SET` / `XATTR_REMOVE` in `args[0]` of an xattr record.
const SET: u8 = src::NONE;
const REMOVE: u8 = src::CWD;

const fn path(fd: u8, ptr: u8, args: [u8; 3]) -> Shape {
    Shape {
        record: SHAPE_PATH,
        when: when::ALWAYS,
        fd,
        ptr,
        fd2: C,
        ptr2: N,
        args,
    }
}

const fn path2(fd: u8, ptr: u8, fd2: u8, ptr2: u8, args: [u8; 3]) -> Shape {
    Shape {
        record: SHAPE_PATH2,
        when: when::ALWAYS,
        fd,
        ptr,
        fd2,
        ptr2,
        args,
    }
}

const fn plain(fd: u8, args: [u8; 3]) -> Shape {
    Shape {
        record: SHAPE_PLAIN,
        when: when::ALWAYS,
        fd,
        ptr: N,
        fd2: C,
        ptr2: N,
        args,
    }
}

const fn only(mut shape: Shape, when: u32) -> Shape {
    shape.when = when;
    shape
}

/// The descriptor of syscall `nr` spelled out; `None` for [`SPECIAL`].
pub const fn shape(nr: u32) -> Option<Shape> {
    let s = match nr {
        // A successful exec is reported by sched_process_exec.
        EXECVE => only(path(C, 0, [N, N, N]), when::FAILED),
        EXECVEAT => only(path(0, 1, [4, N, N]), when::FAILED),
        TRUNCATE => path(C, 0, [1, N, N]),
        FTRUNCATE => plain(0, [1, N, N]),
        UNLINK | RMDIR => path(C, 0, [N, N, N]),
        MKDIR => path(C, 0, [1, N, N]),
        MKDIRAT => path(0, 1, [2, N, N]),
        MKNOD => path(C, 0, [1, 2, N]),
        MKNODAT => path(0, 1, [2, 3, N]),
        RENAME | LINK => path2(C, 0, C, 1, [N, N, N]),
        RENAMEAT => path2(0, 1, 2, 3, [N, N, N]),
        RENAMEAT2 | LINKAT => path2(0, 1, 2, 3, [4, N, N]),
        // The first string of a symlink is the link's contents, not a path
        // looked up now: user space does not resolve it.
        SYMLINK => path2(C, 0, C, 1, [N, N, N]),
        SYMLINKAT => path2(C, 0, 1, 2, [N, N, N]),
        CHMOD => path(C, 0, [1, N, N]),
        FCHMOD => plain(0, [1, N, N]),
        FCHMODAT => path(0, 1, [2, N, N]),
        FCHMODAT2 => path(0, 1, [2, 3, N]),
        CHOWN | LCHOWN => path(C, 0, [1, 2, N]),
        FCHOWN => plain(0, [1, 2, N]),
        FCHOWNAT => path(0, 1, [2, 3, 4]),
        // The second string of an xattr record is the attribute's name.
        SETXATTR | LSETXATTR => path2(C, 0, N, 1, [SET, 3, 4]),
        FSETXATTR => path2(0, N, N, 1, [SET, 3, 4]),
        REMOVEXATTR | LREMOVEXATTR => path2(C, 0, N, 1, [REMOVE, N, N]),
        FREMOVEXATTR => path2(0, N, N, 1, [REMOVE, N, N]),
        // (dfd, path, at_flags, name, struct xattr_args *, size)
        SETXATTRAT => path2(0, 1, N, 3, [SET, N, 2]),
        REMOVEXATTRAT => path2(0, 1, N, 3, [REMOVE, N, 2]),
        UTIME | UTIMES => path(C, 0, [N, N, N]),
        FUTIMESAT => path(0, 1, [N, N, N]),
        FILE_SETATTR => path(0, 1, [4, N, N]),
        CHDIR => only(path(C, 0, [N, N, N]), when::OK),
        FCHDIR => only(plain(0, [N, N, N]), when::OK),
        KILL | TKILL | RT_SIGQUEUEINFO => plain(N, [0, 1, N]),
        TGKILL | RT_TGSIGQUEUEINFO => plain(N, [0, 2, 1]),
        PIDFD_SEND_SIGNAL => plain(0, [0, 1, 3]),
        n if nr::is_refused(n) => plain(N, [0, 1, 2]),
        _ => return None,
    };
    Some(s)
}

/// The descriptor of syscall `nr` (the low bits of its [`TABLE`] entry).
pub const fn shape_of(nr: u32) -> u32 {
    match shape(nr) {
        Some(s) => encode(s),
        None => SPECIAL,
    }
}

/// Where a [`TABLE`] entry keeps its effect kind: above the descriptor's
/// 25 bits.
pub const KIND_SHIFT: u32 = 25;
/// The descriptor bits of a [`TABLE`] entry.
pub const DESCRIPTOR_MASK: u32 = (1 << KIND_SHIFT) - 1;

const _: () = assert!(ARGS_SHIFT + 9 <= KIND_SHIFT);
const _: () = assert!(crate::capture::effect::COUNT <= 1 << (32 - KIND_SHIFT));

/// For every syscall number below `SYSCALL_KINDS`: its descriptor, and
/// its effect kind (`effect_of`) at [`KIND_SHIFT`]. The program holds it
/// as a global of its `.rodata`, a map the loader freezes: the table is
/// decided when the object is built, and no start fills a map with it.
/// Read at an index the verifier does not know, an entry is an unknown
/// value to it, as a map lookup's was.
pub const TABLE: [u32; crate::capture::SYSCALL_KINDS as usize] = table();

const fn table() -> [u32; crate::capture::SYSCALL_KINDS as usize] {
    let mut t = [0; crate::capture::SYSCALL_KINDS as usize];
    let mut n = 0;
    while n < t.len() {
        let kind = crate::capture::effect_of(n as u32) as u32;
        t[n] = shape_of(n as u32) | kind << KIND_SHIFT;
        n += 1;
    }
    t
}

/// The effect kind of a [`TABLE`] entry.
#[inline(always)]
pub const fn kind_of(entry: u32) -> u16 {
    (entry >> KIND_SHIFT) as u16
}

pub const fn encode(s: Shape) -> u32 {
    s.record
        | s.when << 2
        | (s.fd as u32) << FD_SHIFT
        | (s.ptr as u32) << PTR_SHIFT
        | (s.fd2 as u32) << FD2_SHIFT
        | (s.ptr2 as u32) << PTR2_SHIFT
        | (s.args[0] as u32) << ARGS_SHIFT
        | (s.args[1] as u32) << (ARGS_SHIFT + 3)
        | (s.args[2] as u32) << (ARGS_SHIFT + 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(d: u32) -> Shape {
        let at = |shift: u32| ((d >> shift) & 7) as u8;
        Shape {
            record: d & 3,
            when: (d >> 2) & 3,
            fd: at(FD_SHIFT),
            ptr: at(PTR_SHIFT),
            fd2: at(FD2_SHIFT),
            ptr2: at(PTR2_SHIFT),
            args: [at(ARGS_SHIFT), at(ARGS_SHIFT + 3), at(ARGS_SHIFT + 6)],
        }
    }

    #[test]
    fn every_descriptor_reads_back_and_fits_its_bits() {
        for n in 0..crate::capture::SYSCALL_KINDS {
            let Some(s) = shape(n) else {
                assert_eq!(shape_of(n), SPECIAL);
                continue;
            };
            assert_ne!(s.record, SPECIAL, "{n}");
            let fields = [s.fd, s.ptr, s.fd2, s.ptr2, s.args[0], s.args[1], s.args[2]];
            assert!(fields.iter().all(|&f| f <= 7), "{n}: {s:?}");
            assert_eq!(decode(shape_of(n)), s, "{n}");
            assert!(shape_of(n) < 1 << 25, "{n}");
        }
    }

    /// The calls whose record depends on argument values keep their code;
    /// every other captured call has a descriptor.
    #[test]
    fn only_the_value_dependent_calls_are_special() {
        let special = [
            OPEN, OPENAT, CREAT, UNLINKAT, UTIMENSAT, IOCTL, CONNECT, BIND, SENDTO, SENDMSG,
            SENDMMSG,
        ];
        for n in 0..crate::capture::SYSCALL_KINDS {
            let captured = nr::is_captured(u64::from(n));
            let described = shape(n).is_some();
            if special.contains(&n) {
                assert!(captured && !described, "{n}");
            } else {
                assert_eq!(captured, described, "{n}");
            }
        }
    }

    /// `sys_exit` tells a refused-only call by its kind (`SYSCALL`): no
    /// number may be both refused and an effect of its own.
    #[test]
    fn the_refused_calls_are_exactly_those_of_kind_syscall() {
        use crate::capture::{effect, effect_of};
        for n in 0..crate::capture::SYSCALL_KINDS {
            assert!(!(nr::is_refused(n) && nr::is_effect(n)), "{n}");
            assert_eq!(nr::is_refused(n), effect_of(n) == effect::SYSCALL, "{n}");
        }
    }

    #[test]
    fn the_table_holds_each_number_s_kind_and_descriptor() {
        use crate::capture::effect_of;
        for n in 0..crate::capture::SYSCALL_KINDS {
            let entry = TABLE[n as usize];
            assert_eq!(kind_of(entry), effect_of(n), "{n}");
            assert_eq!(entry & DESCRIPTOR_MASK, shape_of(n), "{n}");
        }
        assert_eq!(kind_of(TABLE[2]), crate::capture::effect::OPEN);
        assert_eq!(TABLE[2] & DESCRIPTOR_MASK, SPECIAL);
    }

    #[test]
    fn path_records_read_their_path_and_plain_ones_none() {
        let mkdirat = shape(MKDIRAT).unwrap();
        assert_eq!((mkdirat.fd, mkdirat.ptr, mkdirat.args[0]), (0, 1, 2));
        let fchmod = shape(FCHMOD).unwrap();
        assert_eq!(
            (fchmod.record, fchmod.ptr, fchmod.ptr2),
            (SHAPE_PLAIN, N, N)
        );
        let refused = shape(103).unwrap();
        assert_eq!((refused.fd, refused.args), (N, [0, 1, 2]));
    }
}
