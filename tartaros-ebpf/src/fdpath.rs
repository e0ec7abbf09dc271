//! The file behind a descriptor, from the kernel's own objects, for the
//! records of calls that name no path (`fchmod`, `fsetxattr`, `futimens`,
//! the inode-flag ioctls, `*at` calls with `AT_EMPTY_PATH`) and of the
//! opens for writing that did not create their file (the descriptor they
//! return; the file behind it is the one opened, whatever the agent's
//! string said when `sys_enter` read it): at
//! `sys_exit`, `current->files->fdt->fd[fd]` gives the `struct file`; its
//! inode gives (device, inode number), and its `f_path` the names up to the
//! root of the caller's mount namespace, walked over `d_parent` and the
//! mounts' `mnt_mountpoint` as `d_path` would (which these hosts allow
//! only in LSM / fentry programs, both refused).
//!
//! The names are read while the kernel holds them: nothing in user space
//! looks the file up afterwards, so a process that has exited (or closed
//! the fd) by the time the record is read is still named. The offsets come
//! from the kernel BTF (`FILE_LAYOUT`, filled by the supervisor); without
//! them nothing is read and the record says so.

use core::ffi::c_void;

use aya_ebpf::{helpers::generated, macros::map, maps::Array};
use tartaros_common::capture::{
    FILE_NAME_MAX, FILE_NAMES_BYTES, FILE_WALK_STEPS, FMODE_CREATED, FMODE_WRITE, FileLayout,
    KernelFile, file_status, flag,
};

use crate::maps::read_kernel;

#[map(name = "FILE_LAYOUT")]
static FILE_LAYOUT: Array<FileLayout> = Array::with_max_entries(1, 0);

/// Highest offset in `names` a name is read at: a whole name fits after it.
const LAST_OFFSET: u32 = (FILE_NAMES_BYTES - FILE_NAME_MAX) as u32;
/// The mask that proves to the verifier an offset is inside `names`.
const OFFSET_MASK: u32 = FILE_NAMES_BYTES as u32 - 1;

#[inline(always)]
pub(crate) fn layout() -> Option<&'static FileLayout> {
    FILE_LAYOUT.get(0).filter(|l| l.valid != 0)
}

#[inline(always)]
/// `(ino, dev)` of the current task's cwd (`fs->pwd`), or zeros: what a
/// successful `chdir` / `fchdir` reached, by the kernel's objects.
#[inline(always)]
pub(crate) fn cwd_inode() -> (u64, u64) {
    let Some(l) = layout() else {
        return (0, 0);
    };
    // SAFETY: helper without arguments; the result is only an address for
    // bpf_probe_read_kernel.
    let task = unsafe { aya_ebpf::helpers::bpf_get_current_task() };
    // Straight reads, no early exits: a failed read gives 0, and a read
    // at a small address fails cleanly (each exit would be another path
    // for the verifier through the rest of `sys_exit`).
    let word = |base: u64, off: u32| read_kernel::<u64>(base + off as u64).unwrap_or(0);
    let fs = word(task, l.task_fs);
    let dentry = word(fs, l.fs_pwd_dentry);
    let inode = word(dentry, l.dentry_inode);
    let ino = word(inode, l.inode_ino);
    let sb = word(inode, l.inode_sb);
    let dev = read_kernel::<u32>(sb + l.sb_dev as u64).unwrap_or(0);
    (ino, u64::from(dev))
}

fn at(base: u64, offset: u32) -> Option<u64> {
    if base == 0 {
        return None;
    }
    read_kernel::<u64>(base + offset as u64)
}

/// The current task's `struct files_struct *` (0: none).
#[inline(always)]
fn files(l: &FileLayout) -> u64 {
    // SAFETY: helper without arguments; used as an address only.
    let task = unsafe { generated::bpf_get_current_task() };
    at(task, l.task_files).unwrap_or(0)
}

/// Whether another task shares the current task's memory
/// (`mm_struct.mm_users > 1`: a thread, a `CLONE_VM` child): it can
/// rewrite a name the capture read before the kernel copies it. Unknown
/// (no offsets, unreadable) counts as shared.
#[inline(always)]
pub fn memory_shared() -> bool {
    let Some(l) = layout() else {
        return true;
    };
    // SAFETY: helper without arguments; used as an address only.
    let task = unsafe { generated::bpf_get_current_task() };
    match at(task, l.task_mm) {
        Some(mm) if mm != 0 => read_kernel::<u32>(mm + l.mm_users as u64).is_none_or(|n| n > 1),
        _ => true,
    }
}

/// The caller's `fs_struct` against its thread group, as the bits
/// [`flag::FS_SPLIT`], [`flag::FS_ALONE`] and [`flag::FS_THREADS`]: what
/// the cwd model, one per process, needs to know at a `chdir` (does it
/// move every thread, and no other process?) and at any relative name
/// (does every thread see this cwd?). Read at `sys_enter`: a thread that
/// unshares its `fs_struct` while the call runs keeps the cwd it copied,
/// and its own later calls carry `FS_SPLIT` while both threads live. No
/// offsets: no bits, and the model moves as it did before round 25b.
/// Unread counts as split (the record becomes the agent's claim). `extra`
/// users are not counted (a `CLONE_FS` child at `sched_process_fork`).
#[inline(always)]
pub fn fs_facts(extra: i32) -> u32 {
    let Some(l) = layout() else {
        return 0;
    };
    // SAFETY: helper without arguments; used as an address only.
    let task = unsafe { generated::bpf_get_current_task() };
    // Straight reads, as in `cwd_inode`: a null pointer's read fails
    // cleanly, and each early exit doubled what the verifier walks in
    // `sched_process_fork`.
    let word = |base: u64, off: u32| read_kernel::<u64>(base + off as u64).unwrap_or(0);
    let users = read_kernel::<i32>(word(task, l.task_fs) + l.fs_users as u64).unwrap_or(0) - extra;
    let threads = read_kernel::<i32>(word(task, l.task_signal) + l.signal_nr_threads as u64)
        .unwrap_or(i32::MAX);
    // An exiting thread drops `fs->users` (`exit_fs`) before
    // `nr_threads` (`__exit_signal`): it can make an unsplit process look
    // split for a moment, which only marks records unverified.
    // Sign bits rather than comparisons: each branch here was one more
    // walk of the rest of `sys_enter` for the verifier.
    let d = users.wrapping_sub(threads);
    let split = (d as u32) >> 31;
    let alone = (((d | d.wrapping_neg()) as u32) >> 31) ^ 1;
    let many = (1i32.wrapping_sub(threads) as u32) >> 31;
    (split << flag::FS_SPLIT.trailing_zeros())
        | (alone << flag::FS_ALONE.trailing_zeros())
        | (many << flag::FS_THREADS.trailing_zeros())
}

/// The `struct file *` at `fd` in the table `files` (0: none).
#[inline(always)]
fn file_in(l: &FileLayout, files: u64, fd: i32) -> u64 {
    if fd < 0 {
        return 0;
    }
    let Some(fdt) = at(files, l.files_fdt) else {
        return 0;
    };
    let max = read_kernel::<u32>(fdt + l.fdt_max_fds as u64).unwrap_or(0);
    if fd as u32 >= max {
        return 0;
    }
    at(fdt, l.fdt_fd)
        .and_then(|fds| at(fds, fd as u32 * 8))
        .unwrap_or(0)
}

/// The `struct file *` at `fd` in the current task's table (0: none).
#[inline(always)]
fn file_of(l: &FileLayout, fd: i32) -> u64 {
    file_in(l, files(l), fd)
}

/// At `sys_enter` of a call on `fd`: the file there (0 when the offsets
/// are unknown or the fd is not open), compared at exit, and whether
/// another task shares the table (`files_struct.count > 1`, or unread).
/// A table not shared when the call starts stays so until it ends: only
/// a task holding it can share it (`clone(CLONE_FILES)`), and its one
/// holder is in this call. Shared, another thread can swap the fd between
/// the kernel's lookup and `sys_exit`, so the file at exit is no proof.
#[inline(always)]
pub fn note(fd: i32) -> (u64, bool) {
    let Some(l) = layout() else {
        return (0, false);
    };
    let files = files(l);
    if files == 0 {
        return (0, false);
    }
    let count = read_kernel::<u32>(files + l.files_count as u64).unwrap_or(u32::MAX);
    (file_in(l, files, fd), count > 1)
}

/// The file at `fd` if it is open for writing and its open did not create
/// it (0 otherwise): the opens for writing whose file no `FAN_CREATE`
/// names, so the record names it. The mode is the kernel's, not the flags
/// the agent claimed. Handed to [`fill`] as `entry`, so the table is read
/// once.
#[inline(always)]
pub fn opened_existing(fd: i32) -> u64 {
    let Some(l) = layout() else {
        return 0;
    };
    let file = file_of(l, fd);
    let existing = file != 0
        && read_kernel::<u32>(file + l.file_mode as u64)
            .is_some_and(|m| m & (FMODE_WRITE | FMODE_CREATED) == FMODE_WRITE);
    if existing { file } else { 0 }
}

/// Fills `ev`, the file part of a reserved record, for `fd`. With
/// `reread`, `entry` is the file `fd` held when the call started (from
/// [`note`]) and the table is read again to compare; without,
/// `entry` is the file `fd` holds now (from [`opened_existing`]).
#[inline(always)]
pub fn fill(ev: *mut KernelFile, fd: i32, entry: u64, reread: bool) {
    let status = match layout() {
        None => file_status::NO_LAYOUT,
        Some(l) => {
            let file = if reread { file_of(l, fd) } else { entry };
            let changed = if file != entry {
                file_status::FD_CHANGED
            } else {
                0
            };
            // SAFETY: as promised by the caller of `fill`.
            changed | unsafe { describe(ev, l, file) }
        }
    };
    // SAFETY: `ev` is inside a reserved record.
    unsafe { (*ev).status = status };
}

/// Fills `ev` for the file an exec runs (`bprm->file`), whatever name the
/// caller gave it.
#[inline(always)]
pub fn fill_exec(ev: *mut KernelFile, bprm: u64) {
    let status = match layout() {
        None => file_status::NO_LAYOUT,
        Some(l) => {
            let file = read_kernel::<u64>(bprm + l.bprm_file as u64).unwrap_or(0);
            // SAFETY: as promised by the caller of `fill_exec`.
            unsafe { describe(ev, l, file) }
        }
    };
    // SAFETY: `ev` is inside a reserved record.
    unsafe { (*ev).status = status };
}

/// Reads `file` (a `struct file *`, 0 for none) and its names into `ev`;
/// returns the status bits.
///
/// # Safety
/// `ev` points to a [`KernelFile`] inside a reserved record.
#[inline(always)]
unsafe fn describe(ev: *mut KernelFile, l: &FileLayout, file: u64) -> u32 {
    // SAFETY: as promised by the caller; plain stores of integers.
    unsafe {
        (*ev).ino = 0;
        (*ev).dev = 0;
        (*ev).mnt_id = -1;
        (*ev).nlink = 0;
        (*ev).depth = 0;
        (*ev).names_len = 0;
    }
    if file == 0 {
        return file_status::NO_FILE;
    }
    let inode = at(file, l.file_inode).unwrap_or(0);
    let sb = at(inode, l.inode_sb).unwrap_or(0);
    let (Some(vfsmnt), Some(dentry)) = (at(file, l.file_mnt), at(file, l.file_dentry)) else {
        return file_status::UNREADABLE;
    };
    // SAFETY: as promised by the caller; plain stores of integers.
    unsafe {
        (*ev).ino = at(inode, l.inode_ino).unwrap_or(0);
        if sb != 0 {
            (*ev).dev = read_kernel::<u32>(sb + l.sb_dev as u64).unwrap_or(0);
        }
        if inode != 0 {
            (*ev).nlink = read_kernel::<u32>(inode + l.inode_nlink as u64).unwrap_or(0);
        }
    }
    // A `struct path` points to the `struct vfsmount` inside a `struct mount`.
    let mnt = vfsmnt.wrapping_sub(l.mount_mnt as u64);
    // SAFETY: as above.
    unsafe {
        (*ev).mnt_id = read_kernel::<i32>(mnt + l.mount_id as u64).unwrap_or(-1);
    }
    let mut walk = Walk {
        // SAFETY: the record's own bytes; `step` masks offsets into them.
        names: unsafe { (&raw mut (*ev).names).cast::<u8>() },
        ev,
        layout: l,
        mnt,
        dentry,
        end: file_status::TRUNCATED,
        _pad: 0,
    };
    // SAFETY: `walk` outlives the call and `step` only touches it (and the
    // record it points into); bpf_loop fails only on bad arguments.
    let r = unsafe {
        generated::bpf_loop(
            FILE_WALK_STEPS,
            step as *mut c_void,
            (&raw mut walk).cast::<c_void>(),
            0,
        )
    };
    if r < 0 {
        walk.end = file_status::UNREADABLE;
    }
    walk.end
}

/// The state of a walk, shared with the `bpf_loop` callback: the verifier
/// walks a callback until its state repeats, where an unrolled walk cost
/// 59,000 verified instructions (45 ms more per start) instead of a few
/// thousand. The bytes and names written are counted in the record
/// (`names_len`, `depth`), not here: read back from the record they are
/// unknown values to the verifier, where on the stack their ranges grew
/// with every step it walked, and it walked more steps before the state
/// repeated.
#[repr(C)]
struct Walk {
    names: *mut u8,
    ev: *mut KernelFile,
    layout: *const FileLayout,
    /// The `struct mount` and the dentry the next step looks at.
    mnt: u64,
    dentry: u64,
    /// The status to report when the walk stops.
    end: u32,
    _pad: u32,
}

/// `bpf_loop` callback: one step up, writing one name or crossing one
/// mount; returns 1 to stop.
extern "C" fn step(_index: u64, ctx: *mut c_void) -> i64 {
    let w = ctx.cast::<Walk>();
    // SAFETY: `ctx` is the caller's `Walk`; `layout` points into the
    // FILE_LAYOUT map value, `names` and `ev` into the reserved record.
    unsafe {
        let l = &*(*w).layout;
        let (mnt, dentry) = ((*w).mnt, (*w).dentry);
        let root = at(mnt.wrapping_add(l.mount_mnt as u64), l.vfsmount_root);
        let parent = at(dentry, l.dentry_parent);
        let (Some(root), Some(parent)) = (root, parent) else {
            return stop(w, file_status::UNREADABLE);
        };
        if dentry == root {
            let Some(up) = at(mnt, l.mount_parent) else {
                return stop(w, file_status::UNREADABLE);
            };
            if up == mnt {
                return stop(w, file_status::COMPLETE);
            }
            // A mount's root has the name of the dentry it is mounted on.
            let Some(point) = at(mnt, l.mount_mountpoint) else {
                return stop(w, file_status::UNREADABLE);
            };
            (*w).dentry = point;
            (*w).mnt = up;
            return 0;
        }
        let ev = (*w).ev;
        let o = core::ptr::read_volatile(&raw const (*ev).names_len) & OFFSET_MASK;
        if o > LAST_OFFSET {
            return stop(w, file_status::TRUNCATED);
        }
        let Some(name) = at(dentry, l.dentry_name) else {
            return stop(w, file_status::UNREADABLE);
        };
        // `o <= LAST_OFFSET`: FILE_NAME_MAX bytes from it stay inside
        // `names`; the helper checks `name`.
        let n = generated::bpf_probe_read_kernel_str(
            (*w).names.add(o as usize).cast::<c_void>(),
            FILE_NAME_MAX as u32,
            name as *const c_void,
        );
        if n <= 0 {
            return stop(w, file_status::UNREADABLE);
        }
        (*ev).names_len = o + n as u32;
        (*ev).depth = core::ptr::read_volatile(&raw const (*ev).depth) + 1;
        if dentry == parent {
            // Its own parent but no mount's root: nothing above it (a
            // memfd's or pipe's pseudo dentry, named but in no tree).
            return stop(w, file_status::DISCONNECTED);
        }
        (*w).dentry = parent;
    }
    0
}

/// Ends the walk with `end`.
///
/// # Safety
/// `w` is the walk's state.
#[inline(always)]
unsafe fn stop(w: *mut Walk, end: u32) -> i64 {
    // SAFETY: as promised by the caller.
    unsafe { (*w).end = end };
    1
}
