//! Whether an argument the capture read from the caller's memory is what
//! the kernel copies a moment later. `sys_enter` reads a path, a socket
//! name or an attribute name before the syscall's body copies it; anyone
//! who can write those bytes in between can make the record name what the
//! call did not touch. A thread (or a `CLONE_VM` child) shares the whole
//! memory (`fdpath::memory_shared`, `mm_users`); a process alone in its
//! memory still shares the pages of a `MAP_SHARED` mapping with every
//! process that maps the object (a forked child flipping a byte, round 23),
//! and a private mapping of a file shows the file's page cache until its
//! first write, so a `write(2)` to the file changes it. A private
//! anonymous mapping is written by its task alone (`process_vm_writev` is
//! refused by seccomp, `/proc/PID/mem` is not writable in a run, and a
//! tracer writes only while its tracee is stopped, never inside a call),
//! and so is a private mapping of a file nobody holds open for writing
//! (a library's read-only data: `cp -a` passes ACL names from libacl's).
//!
//! The mapping comes from the kernel's own `vm_area_struct`
//! (`bpf_find_vma`, Linux 5.17; it takes the caller's mmap lock only if
//! free and fails otherwise, which counts as shared).

use core::ffi::c_void;

use aya_ebpf::helpers::generated;

use tartaros_common::capture::{FileLayout, PATH_BYTES, VM_SHARED_ANY};

use crate::maps::read_kernel;

/// The callback's state: the end of the argument, the layout, the answer.
#[repr(C)]
struct Lookup {
    layout: *const FileLayout,
    end: u64,
    private: u64,
}

/// Whether the `len` bytes at the caller's address `addr` lie in one
/// private mapping of the caller, anonymous or of a file nobody has open
/// for writing (a NULL pointer names nothing and counts as private). `false` when the offsets are unknown or the
/// mapping could not be looked up.
#[inline(always)]
pub fn private(addr: u64, len: i32) -> bool {
    if addr == 0 {
        return true;
    }
    let Some(l) = crate::fdpath::layout() else {
        return false;
    };
    // An unread argument (a page not present) may be as long as any the
    // capture reads, and read at exit as the kernel's: all of it must be
    // in the one private mapping.
    let len = if len > 0 {
        len as u64
    } else {
        PATH_BYTES as u64
    };
    let mut lookup = Lookup {
        layout: l,
        end: addr.wrapping_add(len),
        private: 0,
    };
    // SAFETY: `lookup` outlives the call and `in_vma` only touches it; the
    // task is the current one, as the helper requires of a BTF pointer.
    let r = unsafe {
        generated::bpf_find_vma(
            generated::bpf_get_current_task_btf(),
            addr,
            in_vma as *mut c_void,
            (&raw mut lookup).cast::<c_void>(),
            0,
        )
    };
    r == 0 && lookup.private != 0
}

/// `bpf_find_vma` callback: notes whether `vma` is private, anonymous and
/// holds the argument to its end.
extern "C" fn in_vma(_task: *mut c_void, vma: *mut c_void, ctx: *mut c_void) -> i64 {
    let lookup = ctx.cast::<Lookup>();
    // SAFETY: `ctx` is the caller's `Lookup`, whose `layout` points into
    // the FILE_LAYOUT map value; `vma` is only an address for
    // bpf_probe_read_kernel (offsets masked below one page, which the
    // verifier needs and `kbtf_file::offsets` checks they are).
    unsafe {
        let l = &*(*lookup).layout;
        let base = vma as u64;
        let word = |off: u32| read_kernel::<u64>(base + (off & 0xfff) as u64);
        let (Some(end), Some(flags), Some(file)) =
            (word(l.vma_end), word(l.vma_flags), word(l.vma_file))
        else {
            return 0;
        };
        if flags & VM_SHARED_ANY != 0 || end < (*lookup).end {
            return 0;
        }
        // A private mapping of a file shows the page cache until its first
        // write: private only while nobody holds the file open for
        // writing (`i_writecount` <= 0; below 0 it is an executable's
        // deny-write). A writer must then open the file and write between
        // the capture's read and the kernel's copy, a window shorter than
        // an `open` (an fd kept open, or a shared writable mapping, keeps
        // the count up).
        let writers = if file == 0 {
            Some(0)
        } else {
            read_kernel::<u64>(file + (l.file_inode & 0xfff) as u64)
                .and_then(|inode| read_kernel::<i32>(inode + (l.inode_writecount & 0xfff) as u64))
        };
        if writers.is_some_and(|n| n <= 0) {
            (*lookup).private = 1;
        }
    }
    0
}
