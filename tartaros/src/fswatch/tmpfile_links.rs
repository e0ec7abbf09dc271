//! Where an `O_TMPFILE` lives once it was given a name.
//!
//! The kernel names an `O_TMPFILE` `#<inode>` in its directory, and every
//! notification of a write through its descriptor keeps that name, also
//! after `linkat` (`/proc/self/fd/N`, or `AT_EMPTY_PATH`) gave it a real
//! one: the descriptor's dentry is still the nameless one. So the `write`
//! record said `#<inode>`, `deleted: true`, and the summary listed the
//! writes as gone, while the file the agent wrote was in the tree under
//! the link's name. A link's record names its new file from the kernel's
//! create notification; the inode found there, when the record is joined,
//! maps `#<inode>` to it.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crate::effectlog::names;

/// Links remembered (a bound on the supervisor's memory; the oldest go).
const KEPT: usize = 65_536;
/// Entries of the tmpfile's directory read to find it by inode.
const DIR_SCAN: usize = 65_536;

#[derive(Debug, Default)]
pub(super) struct TmpfileLinks {
    /// `(dev, ino)` of a linked file -> the link's path (kernel's).
    by_inode: HashMap<(u64, u64), String>,
    /// The same, by path, to follow renames.
    by_path: HashMap<String, (u64, u64)>,
    /// Links were forgotten (the tables were full, or a directory scan
    /// was cut): a nameless file not found may still have a name.
    forgot: Cell<bool>,
}

impl TmpfileLinks {
    /// An allowed link, its `to` named by the kernel; the linked file's
    /// `(dev, ino)` when it is still there.
    pub fn linked(&mut self, to: &str) -> Option<(u64, u64)> {
        let meta = std::fs::symlink_metadata(names::on_disk(to)).ok()?;
        if !meta.is_file() || meta.nlink() == 0 {
            return None;
        }
        if self.by_inode.len() >= KEPT {
            self.by_inode.clear();
            self.by_path.clear();
            self.forgot.set(true);
        }
        let key = (meta.dev(), meta.ino());
        if let Some(old) = self.by_inode.insert(key, to.to_string()) {
            self.by_path.remove(&old);
        }
        self.by_path.insert(to.to_string(), key);
        Some(key)
    }

    /// The name a linked file `(dev, ino)` has now (followed through
    /// renames), if that name still holds it.
    pub fn name_of_inode(&self, key: (u64, u64)) -> Option<String> {
        let to = self.by_inode.get(&key)?;
        std::fs::symlink_metadata(names::on_disk(to))
            .is_ok_and(|m| (m.dev(), m.ino()) == key && m.is_file())
            .then(|| to.clone())
    }

    /// A rename the kernel reported: a linked file (or a directory
    /// holding one) moved.
    pub fn renamed(&mut self, from: &str, to: &str, dir: bool) {
        let moved: Vec<String> = if dir {
            let prefix = format!("{}/", from.trim_end_matches('/'));
            self.by_path
                .keys()
                .filter(|p| p.starts_with(&prefix))
                .cloned()
                .collect()
        } else if self.by_path.contains_key(from) {
            vec![from.to_string()]
        } else {
            return;
        };
        for old in moved {
            let Some(key) = self.by_path.remove(&old) else {
                continue;
            };
            let new = format!(
                "{}{}",
                to.trim_end_matches('/'),
                &old[from.trim_end_matches('/').len()..]
            );
            self.by_inode.insert(key, new.clone());
            self.by_path.insert(new, key);
        }
    }

    /// The name a nameless `path` (`<dir>/#<inode>`) was linked as, if
    /// that name still holds the file.
    pub fn name_of(&self, path: &str) -> Option<String> {
        let (dir, leaf) = path.rsplit_once('/')?;
        let ino: u64 = leaf.strip_prefix('#')?.parse().ok()?;
        let dev = std::fs::metadata(names::on_disk(if dir.is_empty() { "/" } else { dir }))
            .ok()?
            .dev();
        let holds = |p: &str| {
            std::fs::symlink_metadata(names::on_disk(p))
                .is_ok_and(|m| m.dev() == dev && m.ino() == ino && m.is_file())
        };
        if let Some(to) = self.by_inode.get(&(dev, ino)).filter(|to| holds(to)) {
            return Some(to.clone());
        }
        // Linked and renamed before the link's record was joined (both
        // in one read): the usual place is the tmpfile's own directory.
        let entries =
            std::fs::read_dir(names::on_disk(if dir.is_empty() { "/" } else { dir })).ok()?;
        let mut scanned = 0;
        let found = entries
            .flatten()
            .take(DIR_SCAN)
            .inspect(|_| scanned += 1)
            .filter(|e| std::os::unix::fs::DirEntryExt::ino(e) == ino)
            .map(|e| names::display_path(&e.path()))
            .find(|p| holds(p));
        if found.is_none() && scanned == DIR_SCAN {
            self.forgot.set(true);
        }
        found
    }

    /// Whether a link may have been forgotten: a write to a nameless or
    /// removed name not found here cannot be said to be gone.
    pub fn forgot(&self) -> bool {
        self.forgot.get()
    }
}

/// Whether `path` is the kernel's name of an `O_TMPFILE`.
pub(super) fn is_tmpfile_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix('#'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_tmpfile_is_found_under_its_link() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("linked");
        std::fs::write(&file, "x").unwrap();
        let ino = std::fs::metadata(&file).unwrap().ino();
        let d = dir.path().to_str().unwrap();
        let mut links = TmpfileLinks::default();
        links.linked(file.to_str().unwrap());
        let nameless = format!("{d}/#{ino}");
        assert!(is_tmpfile_name(&nameless));
        assert_eq!(links.name_of(&nameless).as_deref(), file.to_str());
        // Another inode's name, and a link removed since, give nothing.
        assert_eq!(links.name_of(&format!("{d}/#{}", ino + 1)), None);
        // Followed through a rename of the file, then of its directory.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let moved = sub.join("moved");
        std::fs::rename(&file, &moved).unwrap();
        links.renamed(file.to_str().unwrap(), moved.to_str().unwrap(), false);
        assert_eq!(links.name_of(&nameless).as_deref(), moved.to_str());
        let sub2 = dir.path().join("sub2");
        std::fs::rename(&sub, &sub2).unwrap();
        links.renamed(sub.to_str().unwrap(), sub2.to_str().unwrap(), true);
        let file = sub2.join("moved");
        assert_eq!(links.name_of(&nameless).as_deref(), file.to_str());
        std::fs::remove_file(&file).unwrap();
        assert_eq!(links.name_of(&nameless), None);
        assert!(!is_tmpfile_name(&format!("{d}/#12x")));
        assert!(!is_tmpfile_name(&format!("{d}/plain")));
    }
}
