//! Directory handles to paths, kept at the position of the notification
//! stream rather than of the disk. A notification names its entry by the
//! directory's handle; the path of a handle looked up now already has every
//! rename the agent made since, so a file written in `d` and then moved
//! out of it, with `d` renamed to `g` right after, read as a move out of
//! `g`, a name the file never had (and its writes were carried nowhere).
//! A handle looked up once keeps its path here, and a directory renamed
//! by the sandbox moves the paths cached below it when its notification
//! comes, in queue order.
//!
//! A path looked up while placing read `k` already has every rename of
//! reads up to `k` (they were queued before the read ended); a rename of
//! read `k + 1` may have come before or after the lookup (a notification
//! carries no time), and one of read `k + 2` or later came after it (it
//! was queued after read `k + 1` started). So a rename leaves a path of
//! its own read as it is, forgets one of the read before (looked up again
//! when next met: the disk's position, as every path was before), and
//! moves older ones. A handle first seen is still looked up now.
//!
//! The kernel merges a notification with an identical one still queued,
//! renames included (before Linux's `FANOTIFY_NO_MERGE_EVENTS`): `mv p q;
//! mv q p; mv p q` can arrive as `p -> q, q -> p`, which ends where the
//! disk does not. Such a merge needs the renames between the twins in
//! the same read or the next (they were queued after the first twin,
//! before it was read), and one of them touches a name the twins do. So
//! when a directory rename touches a path (at, above or below) that
//! another directory rename of this read or the one before touched, the
//! order is not trusted: the cache is emptied, and every path is looked
//! up again when next met (the disk's position, as before).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::notify::Handle;

/// At most this many paths of recent directory renames are remembered
/// to tell a possibly merged order; past it the cache is emptied.
const RECENT_RENAMES: usize = 256;
/// Bound of the cache (handles and their paths).
const ENTRIES: usize = 16_384;
/// At most this many cached paths are moved by one rename; past it the
/// rest are dropped and looked up again when next met (the disk's
/// position: what the cache did for every rename before).
const MOVED_PER_RENAME: usize = 1_024;

#[derive(Debug, Default)]
pub(super) struct DirCache {
    /// Each handle's path and the read it was looked up in.
    by_handle: HashMap<Handle, (Option<PathBuf>, u64)>,
    /// The live entries by path bytes (a directory's subtree is the range
    /// from `d/` up to `d0`).
    by_path: BTreeMap<Vec<u8>, Vec<Handle>>,
    /// The read being placed.
    read: u64,
    /// The old and new paths of the directory renames of this read and
    /// the one before, with their read and the renaming thread (the
    /// kernel merges only one thread's notifications).
    recent: Vec<(u64, u32, Vec<u8>)>,
}

impl DirCache {
    /// A new read of notifications is being placed.
    pub fn next_read(&mut self) {
        self.read += 1;
        let read = self.read;
        self.recent.retain(|(r, _, _)| r + 1 >= read);
    }

    pub fn get(&self, handle: &Handle) -> Option<&Option<PathBuf>> {
        self.by_handle.get(handle).map(|(path, _)| path)
    }

    /// The path of `handle` looked up now.
    pub fn insert(&mut self, handle: Handle, path: Option<PathBuf>) {
        if let Some((Some(old), _)) = self.by_handle.remove(&handle) {
            self.unindex(&old, &handle);
        }
        if self.by_handle.len() >= ENTRIES {
            self.clear();
        }
        if let Some(p) = &path {
            self.index(p.as_os_str().as_bytes().to_vec(), handle.clone());
        }
        self.by_handle.insert(handle, (path, self.read));
    }

    pub fn clear(&mut self) {
        self.by_handle.clear();
        self.by_path.clear();
    }

    /// A directory renamed from `from` to `to` by thread `tid`: the
    /// cached paths at and below `from` move below `to` (see the module's
    /// note on which).
    pub fn renamed(&mut self, from: &Path, to: &Path, tid: u32) {
        let (f, t) = (from.as_os_str().as_bytes(), to.as_os_str().as_bytes());
        let merged = self.recent.len() >= RECENT_RENAMES
            || self
                .recent
                .iter()
                .any(|(_, by, p)| *by == tid && (related(p, f) || related(p, t)));
        self.recent.push((self.read, tid, f.to_vec()));
        self.recent.push((self.read, tid, t.to_vec()));
        if merged {
            self.clear();
            return;
        }
        let from_len = from.as_os_str().len();
        let mut moved = 0;
        for (path, handles) in self.take_below(from) {
            let mut new = to.as_os_str().as_bytes().to_vec();
            new.extend_from_slice(&path[from_len..]);
            for h in handles {
                let read = self.by_handle.get(&h).map_or(0, |(_, read)| *read);
                if read == self.read {
                    self.index(path.clone(), h);
                } else if read + 1 == self.read || moved >= MOVED_PER_RENAME {
                    self.by_handle.remove(&h);
                } else {
                    moved += 1;
                    let new_path = PathBuf::from(OsStr::from_bytes(&new));
                    self.by_handle.insert(h.clone(), (Some(new_path), read));
                    self.index(new.clone(), h);
                }
            }
        }
    }

    /// A directory of the sandbox removed: what was cached at or below
    /// `path` is gone (looked up again if its handle is met).
    pub fn removed(&mut self, path: &Path) {
        for (_, handles) in self.take_below(path) {
            for h in handles {
                self.by_handle.remove(&h);
            }
        }
    }

    fn index(&mut self, path: Vec<u8>, handle: Handle) {
        self.by_path.entry(path).or_default().push(handle);
    }

    fn take_below(&mut self, dir: &Path) -> Vec<(Vec<u8>, Vec<Handle>)> {
        let dir = dir.as_os_str().as_bytes();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        if self.by_path.contains_key(dir) {
            keys.push(dir.to_vec());
        }
        let start = [dir, b"/"].concat();
        let end = [dir, b"0"].concat();
        keys.extend(self.by_path.range(start..end).map(|(k, _)| k.clone()));
        keys.into_iter()
            .filter_map(|k| self.by_path.remove(&k).map(|h| (k, h)))
            .collect()
    }

    fn unindex(&mut self, path: &Path, handle: &Handle) {
        let key = path.as_os_str().as_bytes();
        if let Some(handles) = self.by_path.get_mut(key) {
            handles.retain(|h| h != handle);
            if handles.is_empty() {
                self.by_path.remove(key);
            }
        }
    }
}

/// Whether one path is the other or below it.
fn related(a: &[u8], b: &[u8]) -> bool {
    let below = |x: &[u8], y: &[u8]| x.len() > y.len() && x.starts_with(y) && x[y.len()] == b'/';
    a == b || below(a, b) || below(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> Handle {
        Handle {
            fsid: [0, 0],
            handle_type: 1,
            bytes: vec![b],
        }
    }

    fn path_of(c: &DirCache, b: u8) -> Option<&Path> {
        c.get(&h(b)).and_then(|p| p.as_deref())
    }

    #[test]
    fn a_renamed_directory_moves_the_paths_below_it_and_nothing_else() {
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/d".into()));
        c.insert(h(2), Some("/w/d/e".into()));
        c.insert(h(3), Some("/w/d-x".into()));
        c.insert(h(4), Some("/w/dz".into()));
        c.insert(h(5), None);
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/d"), Path::new("/w/g"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/g")));
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/g/e")));
        assert_eq!(path_of(&c, 3), Some(Path::new("/w/d-x")));
        assert_eq!(path_of(&c, 4), Some(Path::new("/w/dz")));
        assert_eq!(c.get(&h(5)), Some(&None));
        // Renamed again, reads later, and a new directory made at the old
        // name.
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/g/e"), Path::new("/w/e"), 1);
        c.insert(h(6), Some("/w/d".into()));
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/e")));
        assert_eq!(path_of(&c, 6), Some(Path::new("/w/d")));
        c.removed(Path::new("/w/g"));
        assert_eq!(c.get(&h(1)), None, "looked up again when met");
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/e")));
    }

    #[test]
    fn a_handle_looked_up_again_is_indexed_once_under_its_new_path() {
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/a".into()));
        c.insert(h(1), Some("/w/b".into()));
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/a"), Path::new("/w/x"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/b")));
        c.renamed(Path::new("/w/b"), Path::new("/w/y"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/y")));
    }

    #[test]
    fn a_rename_moves_a_bounded_number_of_paths_and_forgets_the_rest() {
        let mut c = DirCache::default();
        let n = MOVED_PER_RENAME + 10;
        for i in 0..n {
            let handle = Handle {
                fsid: [0, 0],
                handle_type: 1,
                bytes: (i as u32).to_le_bytes().to_vec(),
            };
            c.insert(handle, Some(PathBuf::from(format!("/w/d/{i:05}"))));
        }
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/d"), Path::new("/w/g"), 1);
        let kept = c.by_handle.values().filter(|(p, _)| p.is_some()).count();
        assert_eq!(kept, MOVED_PER_RENAME);
        assert!(
            c.by_handle
                .values()
                .filter_map(|(p, _)| p.as_ref())
                .all(|p| p.starts_with("/w/g"))
        );
    }

    #[test]
    fn a_rename_moves_only_paths_looked_up_before_it_happened() {
        // Looked up in this read: the rename, queued before the read
        // ended, is in the path already (`mv a b; mv c a`, then `c`'s
        // handle met and looked up as `a`): it stays.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/a".into()));
        c.renamed(Path::new("/w/a"), Path::new("/w/b"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/a")));
        // Looked up in the read before: it may or may not be; forgotten.
        c.next_read();
        c.renamed(Path::new("/w/a"), Path::new("/w/b"), 1);
        assert_eq!(c.get(&h(1)), None);
        // Two reads before: the rename came after the lookup.
        c.insert(h(2), Some("/w/p".into()));
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/q")));
        // Once moved it follows every later rename.
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/q"), Path::new("/w/r"), 1);
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/r")));
    }

    #[test]
    fn renames_that_may_have_been_merged_are_not_followed() {
        // `mv p q; mv q p` in one read (or across two): the queue may hold
        // them merged out of order, so what was cached is forgotten.
        for gap in [0, 1] {
            let mut c = DirCache::default();
            c.insert(h(1), Some("/w/p/d".into()));
            c.insert(h(2), Some("/w/other".into()));
            c.next_read();
            c.next_read();
            c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
            assert_eq!(path_of(&c, 1), Some(Path::new("/w/q/d")));
            for _ in 0..gap {
                c.next_read();
            }
            c.renamed(Path::new("/w/q"), Path::new("/w/p"), 1);
            assert_eq!(c.get(&h(1)), None, "gap {gap}");
            assert_eq!(c.get(&h(2)), None, "gap {gap}");
        }
        // Unrelated renames two reads apart are followed.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/p/d".into()));
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/x"), Path::new("/w/p"), 1);
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/q/d")));
        assert!(related(b"/w/p", b"/w/p/d") && !related(b"/w/p", b"/w/pd"));
        // Another thread's renames are never merged with these.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/p/d".into()));
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
        c.renamed(Path::new("/w/q"), Path::new("/w/p"), 2);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/p/d")));
    }
}
