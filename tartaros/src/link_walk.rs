//! A bounded walk of a directory for regular files with other hard links.
//!
//! A deny guards names: a file under a read-denied directory that has
//! another name elsewhere in the read scope is read through that name, and
//! the sandbox cannot tell where the other name is without walking every
//! filesystem. The walk finds such files below the denied directory at
//! start, so that the decision can say so (as it does for a denied file
//! named by the policy); it stops after a bound of entries and says that
//! it stopped, so a huge denied tree costs a bounded start-up time.

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fstatat};

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

/// Walks `dir` until `limit` entries have been seen. A directory that
/// cannot be read is passed over: the launcher, whose user the agent is
/// or is below, cannot list it either, and a file's other name reads only
/// as its own mode allows.
pub fn linked_files(dir: &Path, limit: usize) -> LinkWalk {
    let mut walk = LinkWalk::default();
    if let Ok(top) = Dir::open(dir, OPEN_DIRECTORY, Mode::empty()) {
        visit(top, dir, limit, 0, &mut walk);
    }
    walk
}

/// Every directory is opened relative to its parent's descriptor without
/// following a symlink: whoever can write the denied tree may swap a
/// directory for a link to `/` between its listing and its opening, and a
/// walk by path (as root) then went on outside the tree.
const OPEN_DIRECTORY: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// One descriptor is open per level: deeper trees are reported unchecked
/// rather than run out of descriptors.
const DEEPEST: usize = 128;

fn visit(mut listing: Dir, path: &Path, limit: usize, depth: usize, walk: &mut LinkWalk) {
    let at = listing.as_raw_fd();
    let mut below = Vec::new();
    for entry in listing.iter().flatten() {
        let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
        if name == "." || name == ".." {
            continue;
        }
        if walk.entries >= limit {
            walk.stopped = true;
            return;
        }
        walk.entries += 1;
        match entry.file_type() {
            Some(Type::Directory) => below.push(name),
            // A regular file, or a filesystem that does not say.
            Some(Type::File) | None => {
                let Ok(stat) = fstatat(Some(at), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                else {
                    continue;
                };
                match stat.st_mode & libc::S_IFMT {
                    libc::S_IFREG if stat.st_nlink > 1 => {
                        walk.linked.push((path.join(&name), stat.st_nlink));
                    }
                    libc::S_IFDIR => below.push(name),
                    _ => {}
                }
            }
            Some(_) => {}
        }
    }
    for name in below {
        if walk.stopped {
            return;
        }
        if depth + 1 >= DEEPEST {
            walk.stopped = true;
            return;
        }
        if let Ok(sub) = Dir::openat(Some(at), name.as_os_str(), OPEN_DIRECTORY, Mode::empty()) {
            visit(sub, &path.join(&name), limit, depth + 1, walk);
        }
    }
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

    /// A directory of the walk swapped for a symlink between its listing
    /// and its opening (`RENAME_EXCHANGE` by whoever can write the denied
    /// tree) must not lead the walk, which runs as root, outside it.
    #[test]
    fn a_directory_swapped_for_a_link_does_not_lead_the_walk_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("linked"), "x").unwrap();
        std::fs::hard_link(outside.path().join("linked"), outside.path().join("again")).unwrap();
        let sub = dir.path().join("sub");
        let link = dir.path().join("link");
        std::fs::create_dir(&sub).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, sub, link) = (stop.clone(), sub.clone(), link.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = nix::fcntl::renameat2(
                        None,
                        &sub,
                        None,
                        &link,
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    );
                }
            })
        };
        let mut strayed = 0;
        for _ in 0..3000 {
            if !linked_files(dir.path(), 100).linked.is_empty() {
                strayed += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(strayed, 0, "the walk followed a swapped-in link");
    }
}
