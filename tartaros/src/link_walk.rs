//! A bounded walk of a directory for regular files with other hard links.
//!
//! A deny guards names: a file under a read-denied directory that has
//! another name elsewhere in the read scope is read through that name, and
//! the sandbox cannot tell where the other name is without walking every
//! filesystem. The walk finds such files below the denied directory at
//! start, so that the decision can say so (as it does for a denied file
//! named by the policy); it stops after a bound of entries and says that
//! it stopped, so a huge denied tree costs a bounded start-up time.

use std::path::{Path, PathBuf};

/// What a walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkWalk {
    /// Regular files with more than one hard link, and how many they have.
    pub linked: Vec<(PathBuf, u64)>,
    /// Entries looked at (directories, files, links, anything).
    pub entries: usize,
    /// The bound stopped the walk before it saw every entry.
    pub stopped: bool,
}

/// Walks `dir` (not following symlinks) until `limit` entries have been
/// seen. A directory that cannot be read is passed over: the launcher,
/// whose user the agent is or is below, cannot list it either, and a
/// file's other name reads only as its own mode allows.
pub fn linked_files(dir: &Path, limit: usize) -> LinkWalk {
    use std::os::unix::fs::MetadataExt;
    let mut walk = LinkWalk::default();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            if walk.entries >= limit {
                walk.stopped = true;
                return walk;
            }
            walk.entries += 1;
            // The type from the directory entry needs no stat; only
            // regular files need one, for their link count.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                // `DirEntry::metadata` does not follow a symlink swapped in.
                match entry.metadata() {
                    Ok(meta) if meta.is_file() && meta.nlink() > 1 => {
                        walk.linked.push((entry.path(), meta.nlink()));
                    }
                    _ => {}
                }
            }
        }
    }
    walk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_linked_files_below_and_stops_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("secret"), "s").unwrap();
        std::fs::write(dir.path().join("plain"), "p").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::hard_link(deep.join("secret"), outside.path().join("copy")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();

        let walk = linked_files(dir.path(), 100);
        assert_eq!(walk.linked, vec![(deep.join("secret"), 2)]);
        assert_eq!(walk.entries, 5);
        assert!(!walk.stopped);

        let bounded = linked_files(dir.path(), 2);
        assert!(bounded.stopped);
        assert_eq!(bounded.entries, 2);
    }
}
