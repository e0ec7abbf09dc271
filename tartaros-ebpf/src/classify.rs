//! What `sys_enter` records of a syscall, decided from its number and
//! arguments: the descriptor table (`call_shape`) for most, a rule of its
//! own for the calls whose record depends on their arguments' values
//! (opens, `openat2`, `unlinkat`, `futimens`, the inode-flag ioctls, the
//! address-carrying socket calls).

use tartaros_common::capture::{
    AT_EMPTY_PATH, AT_FDCWD, AT_REMOVEDIR, call_shape, effect, flag, ioctl, nr, oflag, record,
};

use crate::syscalls::{Call, read_user, table_entry};

use call_shape::when;

/// Decides whether syscall `nr` with arguments `a` is recorded, and how.
/// x86_64 numbering; the kinds, and the fields of every call not decided
/// by its arguments' values, come from `SYSCALL_TABLE`.
#[inline(always)]
pub(crate) fn classify(nr: u64, a: [u64; 6]) -> Option<Call> {
    if nr > u32::MAX as u64 {
        return None;
    }
    let n = nr as u32;
    let entry = table_entry(nr);
    let e = call_shape::kind_of(entry);
    let described = entry & call_shape::DESCRIPTOR_MASK;
    let mut call = if described != call_shape::SPECIAL {
        let mut c = from_shape(e, described, a);
        // Calls on a descriptor alone: named by the kernel's file at exit,
        // not by a `/proc/<pid>/fd` lookup after the agent may have put
        // another file at that number (`sys_enter` notes the file at entry).
        // A pidfd's file is its process: user space checks the process it
        // names against the inode (`decode_proc.rs`).
        if matches!(
            n,
            nr::FTRUNCATE | nr::FCHMOD | nr::FCHOWN | nr::PIDFD_SEND_SIGNAL
        ) {
            c.record = record::SYS_FILE;
        }
        c
    } else {
        special(n, e, a)?
    };
    // A call that may act on its descriptor's file: with `AT_EMPTY_PATH`
    // and an empty path, with a NULL path (`futimesat`), or always (the
    // xattr calls on a descriptor, whose path pointer is none). Whether
    // the path is empty is known once `sys_enter` has read it.
    let by_fd = match n {
        nr::FCHOWNAT | nr::FILE_SETATTR => a[4],
        nr::FCHMODAT2 | nr::UTIMENSAT => a[3],
        nr::SETXATTRAT | nr::REMOVEXATTRAT => a[2],
        nr::FSETXATTR | nr::FREMOVEXATTR => AT_EMPTY_PATH,
        nr::FUTIMESAT if a[1] == 0 => AT_EMPTY_PATH,
        _ => 0,
    };
    if call.record != record::SYS_FILE && by_fd & AT_EMPTY_PATH != 0 {
        call.flags |= flag::BY_FD;
    }
    Some(call)
}

/// The calls whose record depends on their arguments' values.
#[inline(always)]
fn special(n: u32, e: u16, a: [u64; 6]) -> Option<Call> {
    let fd = |v: u64| v as i32;
    let call = match n {
        nr::OPEN => open_call(AT_FDCWD, a[0], a[1], a[2]),
        nr::OPENAT => open_call(fd(a[0]), a[1], a[2], a[3]),
        nr::CREAT => open_call(AT_FDCWD, a[0], oflag::CREAT_FLAGS, a[1]),
        nr::UNLINKAT => {
            let e = if a[2] & AT_REMOVEDIR != 0 {
                effect::RMDIR
            } else {
                effect::UNLINK
            };
            Call::path(e, fd(a[0]), a[1], [a[2], 0, 0])
        }
        // utimensat(fd, NULL, ...) is futimens(fd): named like fchmod.
        nr::UTIMENSAT if a[1] == 0 => {
            let mut c = Call::plain(e, fd(a[0]), [a[3], 0, 0]);
            c.record = record::SYS_FILE;
            c
        }
        nr::UTIMENSAT => Call::path(e, fd(a[0]), a[1], [a[3], 0, 0]),
        nr::IOCTL if ioctl::sets_flags(a[1]) => {
            let value = read_user::<u32>(a[2]).map(u64::from).unwrap_or(u64::MAX);
            let mut c = Call::plain(e, fd(a[0]), [a[1], value, 0]);
            c.record = record::SYS_FILE;
            c
        }
        nr::CONNECT | nr::BIND => Call::addr(e, fd(a[0]), a[1], a[2], [0; 3]),
        // Without a destination it is a send on a connected socket, whose
        // destination was recorded at connect.
        nr::SENDTO if a[4] == 0 => return None,
        nr::SENDTO => Call::addr(e, fd(a[0]), a[4], a[5], [a[3], 0, 0]),
        // struct msghdr { void *msg_name; int msg_namelen; ... }; sendmmsg's
        // first struct mmsghdr starts with one.
        nr::SENDMSG | nr::SENDMMSG => {
            let extra = if n == nr::SENDMMSG {
                [a[3], a[2], 0]
            } else {
                [a[2], 0, 0]
            };
            match read_user::<[u64; 2]>(a[1]) {
                // sendmmsg is recorded also when its first message names
                // no destination (its address is then unreadable): a
                // later one can, and the record names what the kernel's
                // hooks saw.
                Some(m) if m[0] == 0 && n == nr::SENDMSG => return None,
                Some(m) => Call::addr(e, fd(a[0]), m[0], m[1] & 0xffff_ffff, extra),
                None => {
                    let mut c = Call::addr(e, fd(a[0]), 0, 0, extra);
                    c.flags = flag::ADDR_UNREADABLE;
                    c
                }
            }
        }
        // The other ioctls, and anything the supervisor gave no shape.
        _ => return None,
    };
    Some(call)
}

/// The call of descriptor `d` (`call_shape`): each field is an argument
/// register or a constant, picked by index.
#[inline(always)]
fn from_shape(effect: u16, d: u32, a: [u64; 6]) -> Call {
    const NONE: u32 = call_shape::src::NONE as u32;
    const CWD: u32 = call_shape::src::CWD as u32;
    const _: () = assert!(NONE == 6 && CWD == 7);
    // Sources NONE and CWD: 0 and 1, or for a descriptor -1 and AT_FDCWD.
    let v = [a[0], a[1], a[2], a[3], a[4], a[5], 0, 1];
    let value = |shift: u32| v[((d >> shift) & 7) as usize];
    let fd = |shift: u32| match (d >> shift) & 7 {
        NONE => -1,
        CWD => AT_FDCWD,
        s => v[s as usize] as i32,
    };
    Call {
        effect,
        record: call_shape::record_of(d),
        fd: fd(call_shape::FD_SHIFT),
        fd2: fd(call_shape::FD2_SHIFT),
        flags: 0,
        ptr: value(call_shape::PTR_SHIFT),
        ptr2: value(call_shape::PTR2_SHIFT),
        len: 0,
        when: (d >> 2) & 3,
        args: [
            value(call_shape::ARGS_SHIFT),
            value(call_shape::ARGS_SHIFT + 3),
            value(call_shape::ARGS_SHIFT + 6),
        ],
    }
}

/// Opens are recorded when they may write (write access, create, truncate,
/// tmpfile), and read-only opens only when they were refused (EACCES /
/// EPERM): the denied reads.
#[inline(always)]
fn open_call(fd: i32, path: u64, flags: u64, mode: u64) -> Call {
    let path_only = flags & oflag::O_PATH != 0;
    let access = flags & oflag::O_ACCMODE;
    let creates = flags & (oflag::O_CREAT | oflag::O_TMPFILE_BIT) != 0;
    let truncates = flags & oflag::O_TRUNC != 0;
    let writes = !path_only && (access != 0 || creates || truncates);
    let e = if !writes {
        effect::OPEN
    } else if creates {
        effect::CREATE
    } else if truncates {
        effect::TRUNCATE
    } else {
        effect::OPEN
    };
    let mut call = Call::path(e, fd, path, [flags, mode, 0]);
    if writes {
        // Named by the descriptor it returned (`sysemit::emit`), unless
        // the open created the file (its FAN_CREATE names it). A
        // truncating open too: pairing its FAN_MODIFY by position could
        // take one of an earlier write of the thread (session 13).
        call.flags = flag::OPENS_FILE;
        call
    } else {
        call.only(when::REFUSED)
    }
}
