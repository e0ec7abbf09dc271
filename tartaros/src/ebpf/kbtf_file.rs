//! Offsets of the structures between a task and the names of a file it
//! has open (`task_struct` -> `files_struct` -> `fdtable` -> `file` ->
//! `dentry` / `mount` / `inode`), for `tartaros-ebpf/src/fdpath.rs`. Each
//! one is looked up by name; one missing leaves the whole walk off (the
//! records then say why), never a guessed offset.

use tartaros_common::capture::FileLayout;

use super::{Btf, KIND_STRUCT};

/// The offsets, as cached with the rest of the layout.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileOffsets {
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_mnt: u32,
    pub file_dentry: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub inode_nlink: u32,
    pub sb_dev: u32,
    pub dentry_parent: u32,
    pub dentry_name: u32,
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    pub mount_id: u32,
    pub vfsmount_root: u32,
}

impl FileOffsets {
    /// The map value the program reads.
    pub fn to_map(&self) -> FileLayout {
        FileLayout {
            valid: 1,
            task_files: self.task_files,
            files_fdt: self.files_fdt,
            fdt_max_fds: self.fdt_max_fds,
            fdt_fd: self.fdt_fd,
            file_mnt: self.file_mnt,
            file_dentry: self.file_dentry,
            file_inode: self.file_inode,
            inode_ino: self.inode_ino,
            inode_sb: self.inode_sb,
            inode_nlink: self.inode_nlink,
            sb_dev: self.sb_dev,
            dentry_parent: self.dentry_parent,
            dentry_name: self.dentry_name,
            mount_mnt: self.mount_mnt,
            mount_parent: self.mount_parent,
            mount_mountpoint: self.mount_mountpoint,
            mount_id: self.mount_id,
            vfsmount_root: self.vfsmount_root,
            _pad: 0,
        }
    }
}

/// The offsets from parsed kernel BTF, or which one is missing.
pub(super) fn offsets(btf: &Btf<'_>) -> Result<FileOffsets, String> {
    const STRUCTS: [&str; 9] = [
        "task_struct",
        "files_struct",
        "fdtable",
        "file",
        "inode",
        "super_block",
        "dentry",
        "mount",
        "vfsmount",
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
    Ok(FileOffsets {
        task_files: off("task_struct", "files")?,
        files_fdt: off("files_struct", "fdt")?,
        fdt_max_fds: off("fdtable", "max_fds")?,
        fdt_fd: off("fdtable", "fd")?,
        file_mnt: off("file", "f_path.mnt")?,
        file_dentry: off("file", "f_path.dentry")?,
        file_inode: off("file", "f_inode")?,
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
