//! Offsets of the structures between a task and the names of a file it
//! has open (`task_struct` -> `files_struct` -> `fdtable` -> `file` ->
//! `dentry` / `mount` / `inode`, and an exec's `linux_binprm` -> `file`),
//! for `tartaros-ebpf/src/fdpath.rs`. Each
//! one is looked up by name; one missing leaves the whole walk off (the
//! records then say why), never a guessed offset.

use tartaros_common::capture::FileLayout;

use super::{Btf, KIND_STRUCT};

/// The offsets from parsed kernel BTF, or which one is missing.
/// The map value the program reads, as cached with the rest of the
/// layout.
pub(super) fn offsets(btf: &Btf<'_>) -> Result<FileLayout, String> {
    const STRUCTS: [&str; 14] = [
        "task_struct",
        "mm_struct",
        "files_struct",
        "fs_struct",
        "fdtable",
        "file",
        "inode",
        "super_block",
        "dentry",
        "mount",
        "vfsmount",
        "linux_binprm",
        "vm_area_struct",
        "signal_struct",
    ];
    let wanted: Vec<(&str, u32)> = STRUCTS.iter().map(|s| (*s, KIND_STRUCT)).collect();
    let ids = btf.find(&wanted);
    let off = |st: &str, path: &str| {
        let id = ids
            .get(&(st.to_owned(), KIND_STRUCT))
            .ok_or_else(|| format!("no struct {st} in the kernel BTF"))?;
        btf.offset(*id, path)
            .ok_or_else(|| format!("no member {path} in struct {st} of the kernel BTF"))
    };
    // `argmem.rs` masks these below one page for the verifier: a larger
    // one would read another field, and a wrong "private" is fail-open.
    let small = |st: &str, path: &str| {
        off(st, path).and_then(|o| {
            (o < 0x1000)
                .then_some(o)
                .ok_or_else(|| format!("{st}.{path} at {o}, past the first page"))
        })
    };
    Ok(FileLayout {
        valid: 1,
        task_files: off("task_struct", "files")?,
        files_fdt: off("files_struct", "fdt")?,
        fdt_max_fds: off("fdtable", "max_fds")?,
        fdt_fd: off("fdtable", "fd")?,
        file_mnt: off("file", "f_path.mnt")?,
        file_dentry: off("file", "f_path.dentry")?,
        file_inode: small("file", "f_inode")?,
        inode_ino: off("inode", "i_ino")?,
        inode_sb: off("inode", "i_sb")?,
        inode_nlink: off("inode", "i_nlink")?,
        sb_dev: off("super_block", "s_dev")?,
        dentry_parent: off("dentry", "d_parent")?,
        dentry_name: off("dentry", "d_name.name")?,
        mount_mnt: off("mount", "mnt")?,
        mount_parent: off("mount", "mnt_parent")?,
        mount_mountpoint: off("mount", "mnt_mountpoint")?,
        mount_id: off("mount", "mnt_id")?,
        vfsmount_root: off("vfsmount", "mnt_root")?,
        file_mode: off("file", "f_mode")?,
        bprm_file: off("linux_binprm", "file")?,
        files_count: off("files_struct", "count")?,
        task_fs: off("task_struct", "fs")?,
        fs_pwd_dentry: off("fs_struct", "pwd.dentry")?,
        dentry_inode: off("dentry", "d_inode")?,
        task_mm: off("task_struct", "mm")?,
        mm_users: off("mm_struct", "mm_users")?,
        vma_end: small("vm_area_struct", "vm_end")?,
        vma_flags: small("vm_area_struct", "vm_flags")?,
        vma_file: small("vm_area_struct", "vm_file")?,
        inode_writecount: small("inode", "i_writecount")?,
        fs_users: off("fs_struct", "users")?,
        task_signal: off("task_struct", "signal")?,
        signal_nr_threads: off("signal_struct", "nr_threads")?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_running_kernel_has_every_offset() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: no /sys/kernel/btf/vmlinux");
            return;
        };
        let Ok(btf) = super::super::Btf::parse(&data) else {
            panic!("unparsable kernel BTF");
        };
        let o = super::offsets(&btf).unwrap();
        eprintln!("{o:?}");
        // `struct path { struct vfsmount *mnt; struct dentry *dentry; }`.
        assert_eq!(o.file_dentry, o.file_mnt + 8);
        assert!(o.task_files > 0 && o.fdt_fd > 0 && o.mount_mnt > 0);
    }
}
