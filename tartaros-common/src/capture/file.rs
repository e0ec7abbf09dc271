//! The file behind a descriptor, read from the kernel at the syscall's
//! exit (`tartaros-ebpf/src/fdpath.rs`): inode, device and the names up the
//! dentry chain, so the record names the file the call acted on without a
//! `/proc` lookup that races the process's exit. See docs/ebpf.md,
//! "Kernel-sourced paths".

use super::{PATH_BYTES, SysEvent};

/// Name of the map holding the one [`FileLayout`].
pub const MAP_FILE_LAYOUT: &str = "FILE_LAYOUT";

/// Bytes of [`KernelFile::names`].
pub const FILE_NAMES_BYTES: usize = 1024;
/// Longest name read at once (`NAME_MAX` + NUL).
pub const FILE_NAME_MAX: usize = 256;
/// Steps of the walk: one per path component or mount crossing.
pub const FILE_WALK_STEPS: u32 = 128;

/// Bits of [`KernelFile::status`].
pub mod file_status {
    /// [`super::FileLayout`] was not filled (offsets missing from the BTF):
    /// nothing was read.
    pub const NO_LAYOUT: u32 = 1 << 0;
    /// The fd was not open at the syscall's exit.
    pub const NO_FILE: u32 = 1 << 1;
    /// The fd named another `struct file` at entry than at exit (another
    /// thread sharing the table swapped it during the call).
    pub const FD_CHANGED: u32 = 1 << 2;
    /// The walk reached the root of the caller's mount namespace: `names`
    /// is the whole path.
    pub const COMPLETE: u32 = 1 << 3;
    /// The walk stopped at its step or byte limit; `names` is the tail.
    pub const TRUNCATED: u32 = 1 << 4;
    /// A name or a pointer of the chain could not be read.
    pub const UNREADABLE: u32 = 1 << 5;
    /// A dentry that is its own parent but no mount's root (a disconnected
    /// dentry): the path above it is unknown.
    pub const DISCONNECTED: u32 = 1 << 6;
}

/// Offsets of the kernel structures the walk reads, from the kernel BTF
/// (`tartaros/src/ebpf/kbtf_file.rs`). `valid == 0` (a fresh map) makes the
/// program read nothing. 136 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct FileLayout {
    pub valid: u32,
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `fdtable.max_fds`, `fdtable.fd`.
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    /// `file.f_path.mnt`, `file.f_path.dentry`, `file.f_inode`.
    pub file_mnt: u32,
    pub file_dentry: u32,
    pub file_inode: u32,
    /// `inode.i_ino`, `inode.i_sb`, `inode.i_nlink`.
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub inode_nlink: u32,
    /// `super_block.s_dev`.
    pub sb_dev: u32,
    /// `dentry.d_parent`, `dentry.d_name.name`.
    pub dentry_parent: u32,
    pub dentry_name: u32,
    /// `mount.mnt` (the `struct vfsmount` a `struct path` points to),
    /// `mount.mnt_parent`, `mount.mnt_mountpoint`, `mount.mnt_id`.
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    pub mount_id: u32,
    /// `vfsmount.mnt_root`.
    pub vfsmount_root: u32,
    /// `file.f_mode` (tells a file the open created, [`FMODE_CREATED`]).
    pub file_mode: u32,
    /// `linux_binprm.file`: the file an exec runs (the interpreter's, for
    /// a script).
    pub bprm_file: u32,
    /// `files_struct.count`: above 1, another task shares the fd table
    /// and can swap a descriptor while a call of this one uses it.
    pub files_count: u32,
    /// `task_struct.fs`, `fs_struct.pwd.dentry`, `dentry.d_inode`: the
    /// directory a successful `chdir` / `fchdir` reached, recorded as
    /// `(ino, dev)` in its `args[1..3]` so that user space can check the
    /// name it models the cwd with.
    pub task_fs: u32,
    pub fs_pwd_dentry: u32,
    pub dentry_inode: u32,
    /// `task_struct.mm`, `mm_struct.mm_users`: above 1, another task
    /// shares the caller's memory (a thread, a `CLONE_VM` child) and can
    /// rewrite a name between the capture's read and the kernel's copy.
    pub task_mm: u32,
    pub mm_users: u32,
    /// `vm_area_struct.vm_end`, `.vm_flags`, `.vm_file`: a name on a page
    /// of a shared mapping, or of a private mapping of a file someone can
    /// write, can be rewritten by another process (a forked child writing
    /// a `MAP_SHARED` page, a `write(2)` to the mapped file) whatever
    /// `mm_users` says (`bpf_find_vma`, Linux 5.17).
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_file: u32,
    /// `inode.i_writecount`: a private mapping of a file that nobody holds
    /// open for writing (or mapped shared and writable) shows bytes no one
    /// can change while the call copies them (libraries' read-only data:
    /// `cp -a`'s ACL names are in libacl's).
    pub inode_writecount: u32,
    /// `fs_struct.users`, `task_struct.signal`, `signal_struct.nr_threads`:
    /// a path-named call's caller whose `fs_struct` fewer tasks use than
    /// its process has threads has a thread with a cwd of its own
    /// ([`super::flag::FS_SPLIT`], adversarial round 25b).
    pub fs_users: u32,
    pub task_signal: u32,
    pub signal_nr_threads: u32,
}

/// `VM_SHARED | VM_MAYSHARE` of `vm_area_struct.vm_flags`
/// (include/linux/mm.h, unchanged since Linux 2.6): a mapping whose pages
/// other mappings of the same object see.
pub const VM_SHARED_ANY: u64 = 0x08 | 0x80;

/// `FMODE_CREATED` of `file.f_mode` (include/linux/fs.h, the same bit since
/// Linux 4.19): the open created the file. Such an open is named by its
/// `FAN_CREATE` notification; the others get the walk.
pub const FMODE_CREATED: u32 = 1 << 20;

/// `FMODE_WRITE` of `file.f_mode` (include/linux/fs.h, unchanged since
/// Linux 2.6): the file is open for writing, whatever flags the agent's
/// memory claimed (`openat2` reads them from there).
pub const FMODE_WRITE: u32 = 1 << 1;

/// A file as the kernel had it: its inode and the names up its dentry
/// chain (`tartaros-ebpf/src/fdpath.rs`). 1056 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    /// `inode.i_ino`.
    pub ino: u64,
    /// `super_block.s_dev` (kernel encoding: major << 20 | minor).
    pub dev: u32,
    /// `mount.mnt_id` of the file's mount (-1 when unread).
    pub mnt_id: i32,
    /// `inode.i_nlink` (0: the file was deleted).
    pub nlink: u32,
    /// [`file_status`] bits.
    pub status: u32,
    /// Names in `names`.
    pub depth: u32,
    /// Bytes of `names` used.
    pub names_len: u32,
    /// The names from the file up, each NUL-terminated: `leaf\0dir\0...`.
    /// Mount crossings add no name (a mount's root has the mount point's).
    pub names: [u8; FILE_NAMES_BYTES],
}

/// [`SysEvent`] of a call on a descriptor, with the file behind it: the
/// calls that name their file by a descriptor only (the descriptor passed:
/// `fchmod`, `fsetxattr`, `futimens`, the inode-flag ioctls, `*at` calls
/// with `AT_EMPTY_PATH` and an empty path, ...), and the opens for writing
/// that did not create their file (the descriptor returned). `path` is a
/// string read at entry: an open's path argument, an xattr call's
/// attribute name. 1408 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SysFileEvent {
    pub sys: SysEvent,
    pub file: KernelFile,
    /// An open's path argument, or an xattr call's attribute name, as
    /// `sys_enter` read it (the header's `len` / `len2` say how much).
    pub path: [u8; PATH_BYTES],
}

const _: () = assert!(core::mem::size_of::<FileLayout>() == 136);
const _: () = assert!(core::mem::size_of::<KernelFile>() == 1056);
const _: () = assert!(core::mem::size_of::<SysFileEvent>() == 1408);
const _: () = assert!(core::mem::align_of::<SysFileEvent>() == 8);
// Room for a name at any offset the walk writes at.
const _: () = assert!(FILE_NAMES_BYTES >= 2 * FILE_NAME_MAX);
const _: () = assert!(FILE_NAMES_BYTES.is_power_of_two());
