//! Writing a syscall record: the call noted at `sys_enter` (a `PENDING`
//! entry) and the kernel's result, into a ring-buffer record of the call's
//! type. Kept apart from `syscalls.rs`, which decides what is recorded.

use tartaros_common::capture::{
    ADDR_BYTES, PATH_BYTES, RunConfig, SysAddrEvent, SysEvent, SysFileEvent, SysPath2Event,
    SysPathEvent, effect, flag, record,
};

use crate::maps::{Run, copy_kernel, fill_header, wake_flags};
use crate::syscalls::Pending;

/// Fills the fixed part of a syscall record.
#[inline(always)]
fn fill_sys(s: *mut SysEvent, cfg: &RunConfig, p: *const Pending, rec: u16, nr: u32, ret: i64) {
    // SAFETY: `s` points to a reserved record, `p` to a map entry.
    unsafe {
        let call = &(*p).call;
        fill_header(&raw mut (*s).header, cfg, rec, call.effect);
        (*s).header.flags |= call.flags;
        (*s).nr = nr;
        (*s).fd = call.fd;
        (*s).fd2 = call.fd2;
        (*s).len = (*p).len;
        (*s).len2 = (*p).len2;
        (*s)._pad = 0;
        (*s).ret = ret;
        // One word at a time: as an array copy the compiler calls its
        // byte-loop `memmove`, which the verifier walks once per byte per
        // call site (41% of this program's verification).
        for i in 0..3 {
            core::ptr::write_volatile(&raw mut (*s).args[i], call.args[i]);
        }
    }
}

/// Writes the record of the call in `p` (a map entry) with result `ret`.
#[inline(always)]
pub(crate) fn emit(run: &Run, p: *const Pending, nr: u32, ret: i64) {
    let cfg = run.cfg;
    // SAFETY: `p` is a map entry; the copies stay inside it and inside
    // the reserved records, whose sizes the helpers are told.
    unsafe {
        let kind = (*p).call.effect;
        let mut rec = (*p).call.record;
        let mut fd = (*p).call.fd;
        // A successful open for writing: named by the descriptor it
        // returned, unless it created the file (its FAN_CREATE names it).
        let mut opened = 0;
        if rec == record::SYS_PATH && (*p).call.flags & flag::OPENS_FILE != 0 && ret >= 0 {
            opened = crate::fdpath::opened_existing(ret as i32);
            if opened != 0 {
                rec = record::SYS_FILE;
                fd = ret as i32;
            }
        }
        // A call that may act on its descriptor, with the empty path it
        // read at entry (one NUL, or a NULL pointer) and a file at the fd
        // then: the call's file is its descriptor's, named like an
        // fchmod's. (An xattr call keeps its attribute name.)
        let len = (*p).len;
        let by_fd = (*p).call.flags & flag::BY_FD != 0 && (0..=1).contains(&len) && (*p).file != 0;
        if by_fd && (rec == record::SYS_PATH || rec == record::SYS_PATH2) {
            rec = record::SYS_FILE;
        }
        match rec {
            record::SYS_PATH => {
                let Some((ring, mut entry)) = run.reserve::<SysPathEvent>(kind) else {
                    return;
                };
                let ev = entry.as_mut_ptr();
                fill_sys(&raw mut (*ev).sys, cfg, p, rec, nr, ret);
                copy_kernel(
                    (&raw mut (*ev).path).cast::<u8>(),
                    PATH_BYTES as u32,
                    (&raw const (*p).path) as u64,
                );
                // A (successful: only those are recorded) chdir's record
                // gets the directory it reached, `(ino, dev)` in
                // `args[1..3]`: user space checks the name it models the
                // cwd with against it (a `chdir("lnk")` whose link is
                // re-pointed before the record is read). Not for `fchdir`
                // (a plain record): a second site costs the verifier as
                // much again, and its cwd stays unverified.
                if kind == effect::CHDIR {
                    let (ino, dev) = crate::fdpath::cwd_inode();
                    core::ptr::write_volatile(&raw mut (*ev).sys.args[1], ino);
                    core::ptr::write_volatile(&raw mut (*ev).sys.args[2], dev);
                }
                entry.submit(wake_flags(&ring, cfg, size_of::<SysPathEvent>()));
            }
            record::SYS_PATH2 => {
                let Some((ring, mut entry)) = run.reserve::<SysPath2Event>(kind) else {
                    return;
                };
                let ev = entry.as_mut_ptr();
                fill_sys(&raw mut (*ev).sys, cfg, p, rec, nr, ret);
                copy_kernel(
                    (&raw mut (*ev).path).cast::<u8>(),
                    PATH_BYTES as u32,
                    (&raw const (*p).path) as u64,
                );
                copy_kernel(
                    (&raw mut (*ev).path2).cast::<u8>(),
                    PATH_BYTES as u32,
                    (&raw const (*p).path2) as u64,
                );
                entry.submit(wake_flags(&ring, cfg, size_of::<SysPath2Event>()));
            }
            record::SYS_ADDR => {
                let Some((ring, mut entry)) = run.reserve::<SysAddrEvent>(kind) else {
                    return;
                };
                let ev = entry.as_mut_ptr();
                fill_sys(&raw mut (*ev).sys, cfg, p, rec, nr, ret);
                copy_kernel(
                    (&raw mut (*ev).addr).cast::<u8>(),
                    ADDR_BYTES as u32,
                    (&raw const (*p).path) as u64,
                );
                entry.submit(wake_flags(&ring, cfg, size_of::<SysAddrEvent>()));
            }
            record::SYS_FILE => {
                let Some((ring, mut entry)) = run.reserve::<SysFileEvent>(kind) else {
                    return;
                };
                let ev = entry.as_mut_ptr();
                fill_sys(&raw mut (*ev).sys, cfg, p, rec, nr, ret);
                // A kernel address, for the comparison only (never in the
                // record): the call's file at entry, or the file an open
                // just returned.
                let (at_entry, reread) = if opened != 0 {
                    (opened, false)
                } else {
                    ((*p).file, true)
                };
                // An xattr call's string is its attribute's name.
                let text = if kind == effect::XATTR {
                    &raw const (*p).path2
                } else {
                    &raw const (*p).path
                };
                copy_kernel(
                    (&raw mut (*ev).path).cast::<u8>(),
                    PATH_BYTES as u32,
                    text as u64,
                );
                crate::fdpath::fill(&raw mut (*ev).file, fd, at_entry, reread);
                entry.submit(wake_flags(&ring, cfg, size_of::<SysFileEvent>()));
            }
            _ => {
                let Some((ring, mut entry)) = run.reserve::<SysEvent>(kind) else {
                    return;
                };
                fill_sys(entry.as_mut_ptr(), cfg, p, rec, nr, ret);
                entry.submit(wake_flags(&ring, cfg, size_of::<SysEvent>()));
            }
        }
    }
}
