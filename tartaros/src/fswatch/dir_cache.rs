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
//! moves older ones. A handle first seen is still looked up now. Since the
//! routine-script pass of round 11, a lookup is followed by a read ahead
//! (`place.rs`): once that finds the queue empty the lookup is *covered*
//! (every rename before it is in hand), and a later read's rename moves
//! it like an older one; a rename read ahead after a lookup that found
//! its old path moves it too (it came after the lookup).
//!
//! The kernel merges a notification with an identical one still queued,
//! renames included (before Linux's `FANOTIFY_NO_MERGE_EVENTS`): `mv p q;
//! mv q p; mv p q` can arrive as `p -> q, q -> p`, which ends where the
//! disk does not. Such a merge needs the renames between the twins in
//! the same read or the next (they were queued after the first twin,
//! before it was read), and one of them touches a name the twins do. So
//! when a directory rename touches a path (at, above or below) that
//! another directory rename of the same thread in this read or the one
//! before touched, the order is not trusted for what those renames
//! moved: the cached paths at or below every such path are forgotten and
//! looked up again when next met. Only those: until round 11 the whole
//! cache was emptied, so the agent's own `mv p q; mv q p` made every
//! directory it had named before be looked up on the disk again, after
//! the renames it made next (a file's past renamed, the attack round 10
//! closed). Past the bound of remembered paths a rename is treated the
//! same way (its own paths forgotten), never the whole cache.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::notify::Handle;

/// At most this many bytes of paths of recent directory renames are
/// remembered to tell a possibly merged order; past it a rename forgets
/// the cached paths at and below its own (as if merged).
const RECENT_BYTES: usize = 8 << 20;
/// Bound of the cache (handles and their paths).
const ENTRIES: usize = 16_384;
/// At most this many cached paths are moved by one rename; past it the
/// rest are dropped and looked up again when next met (the disk's
/// position: what the cache did for every rename before).
const MOVED_PER_RENAME: usize = 1_024;

/// A cached handle.
#[derive(Debug, Clone)]
struct Cached {
    path: Option<PathBuf>,
    /// The read it was looked up in.
    read: u64,
    /// Notifications of that read read when it was looked up.
    seen: usize,
    /// Every notification queued before the lookup was read in that read
    /// (a read ahead after it found the queue empty): a rename of a later
    /// read came after the lookup.
    covered: bool,
}

#[derive(Debug, Default)]
pub(super) struct DirCache {
    /// Each handle's path and when it was looked up.
    by_handle: HashMap<Handle, Cached>,
    /// Handles looked up in this read since the last read ahead.
    uncovered: Vec<Handle>,
    /// The live entries by path bytes (a directory's subtree is the range
    /// from `d/` up to `d0`).
    by_path: BTreeMap<Vec<u8>, Vec<Handle>>,
    /// The read being placed.
    read: u64,
    /// Paths looked up in the read before that a rename of this read may
    /// already have had (see [`Self::renamed`]): the notifications placed
    /// with them may be named after it. Taken by the placement (a gap
    /// when in a root).
    unsure: Vec<Vec<u8>>,
    /// The old and new paths of the directory renames of this read and
    /// the one before, by renaming thread (the kernel merges only one
    /// thread's notifications) and path, with the last read that touched
    /// them; indexed so that a rename looks up its ancestors and its
    /// subtree, not every recent path.
    recent: BTreeMap<(u32, Vec<u8>), u64>,
    /// Their insertion order, to forget them two reads later.
    recent_order: std::collections::VecDeque<(u64, u32, Vec<u8>)>,
    recent_bytes: usize,
}

impl DirCache {
    /// A new read of notifications is being placed.
    pub fn next_read(&mut self) {
        self.read += 1;
        self.uncovered.clear();
        while let Some((r, _, _)) = self.recent_order.front() {
            if r + 1 >= self.read {
                break;
            }
            let Some((r, tid, path)) = self.recent_order.pop_front() else {
                break;
            };
            self.recent_bytes -= path.len();
            let key = (tid, path);
            if self.recent.get(&key) == Some(&r) {
                self.recent.remove(&key);
            }
        }
    }

    #[cfg(test)]
    pub fn get(&self, handle: &Handle) -> Option<&Option<PathBuf>> {
        self.by_handle.get(handle).map(|c| &c.path)
    }

    /// `handle`'s path, and whether it was looked up while placing this
    /// read: it is then the disk's at the end of the read, not the
    /// stream's at the notification being placed (`rewind.rs` takes it
    /// back), with the notifications of the read read by then.
    pub fn get_with_read(&self, handle: &Handle) -> Option<(&Option<PathBuf>, bool, usize)> {
        self.by_handle
            .get(handle)
            .map(|c| (&c.path, c.read == self.read, c.seen))
    }

    /// The path of `handle` looked up now, with `seen` notifications of
    /// the read read.
    pub fn insert(&mut self, handle: Handle, path: Option<PathBuf>, seen: usize) {
        if let Some(Cached {
            path: Some(old), ..
        }) = self.by_handle.remove(&handle)
        {
            self.unindex(&old, &handle);
        }
        if self.by_handle.len() >= ENTRIES {
            self.clear();
        }
        if let Some(p) = &path {
            self.index(p.as_os_str().as_bytes().to_vec(), handle.clone());
        }
        self.uncovered.push(handle.clone());
        let cached = Cached {
            path,
            read: self.read,
            seen,
            covered: false,
        };
        self.by_handle.insert(handle, cached);
    }

    /// A read ahead found nothing more queued: every notification queued
    /// before this read's lookups so far has been read.
    pub fn cover(&mut self) {
        for h in std::mem::take(&mut self.uncovered) {
            if let Some(c) = self.by_handle.get_mut(&h)
                && c.read == self.read
            {
                c.covered = true;
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_handle.clear();
        self.by_path.clear();
    }

    /// A directory renamed from `from` to `to` by thread `tid`: the
    /// cached paths at and below `from` move below `to` (see the module's
    /// note on which).
    #[cfg(test)]
    pub fn renamed(&mut self, from: &Path, to: &Path, tid: u32) {
        self.renamed_at(from, to, tid, 0);
    }

    /// [`Self::renamed`], the rename being notification `at` of the read.
    /// A path looked up in this read before the rename was read is the
    /// disk's at the lookup: at or below the rename's old path, the
    /// rename came after the lookup (after it, the directory would have
    /// been below the new path), so it moves it, and from then on the
    /// path is the stream's (as one of an older read).
    pub fn renamed_at(&mut self, from: &Path, to: &Path, tid: u32, at: usize) {
        let (f, t) = (from.as_os_str().as_bytes(), to.as_os_str().as_bytes());
        self.check_previous_lookups(to);
        let mut merged: Vec<Vec<u8>> = self.recent_related(tid, f);
        merged.extend(self.recent_related(tid, t));
        let full = self.recent_bytes + f.len() + t.len() > RECENT_BYTES;
        if !full {
            for p in [f, t] {
                self.recent.insert((tid, p.to_vec()), self.read);
                self.recent_order.push_back((self.read, tid, p.to_vec()));
                self.recent_bytes += p.len();
            }
        }
        if full || !merged.is_empty() {
            merged.extend([f.to_vec(), t.to_vec()]);
            for p in merged {
                self.removed(Path::new(OsStr::from_bytes(&p)));
            }
            return;
        }
        let from_len = from.as_os_str().len();
        let mut moved = 0;
        for (path, handles) in self.take_below(from) {
            let mut new = to.as_os_str().as_bytes().to_vec();
            new.extend_from_slice(&path[from_len..]);
            for h in handles {
                let Some(c) = self.by_handle.get_mut(&h) else {
                    continue;
                };
                // A lookup of the read before not followed by an empty
                // read ahead may have come after this rename.
                let unsure = c.read + 1 == self.read && !c.covered;
                if c.read == self.read && at >= c.seen {
                    c.read = self.read.saturating_sub(1);
                    c.covered = true;
                    c.path = Some(PathBuf::from(OsStr::from_bytes(&new)));
                    self.index(new.clone(), h);
                } else if c.read == self.read {
                    self.index(path.clone(), h);
                } else if unsure || moved >= MOVED_PER_RENAME {
                    self.by_handle.remove(&h);
                } else {
                    moved += 1;
                    c.path = Some(PathBuf::from(OsStr::from_bytes(&new)));
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

    /// A path looked up in the read before, at or below a rename's new
    /// path: the rename was queued after that read ended, but it may have
    /// come before the lookup, which then already had it, so the
    /// notifications of that read placed in the directory were named as
    /// after the rename, a name they may never have had (a rename that
    /// came after the lookup would have left the directory at the old
    /// path). Counted, and the path forgotten. Only a directory the rename
    /// replaced (an empty one) is counted without cause.
    fn check_previous_lookups(&mut self, to: &Path) {
        let previous = self.read.saturating_sub(1);
        let mut kept = Vec::new();
        for (path, handles) in self.take_below(to) {
            for h in handles {
                let uncovered = self
                    .by_handle
                    .get(&h)
                    .is_some_and(|c| c.read == previous && !c.covered);
                if uncovered && previous > 0 {
                    self.unsure.push(path.clone());
                    self.by_handle.remove(&h);
                } else {
                    kept.push((path.clone(), h));
                }
            }
        }
        for (path, h) in kept {
            self.index(path, h);
        }
    }

    /// The paths [`Self::check_previous_lookups`] found unsure.
    pub fn take_unsure(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.unsure)
    }

    /// The recent rename paths of `tid` at, above or below `path`.
    fn recent_related(&self, tid: u32, path: &[u8]) -> Vec<Vec<u8>> {
        let mut found = Vec::new();
        // At or above: every prefix ending before a `/`, and the path.
        let ends = path
            .iter()
            .enumerate()
            .filter(|(i, b)| **b == b'/' && *i > 0)
            .map(|(i, _)| i)
            .chain([path.len()]);
        for end in ends {
            if self.recent.contains_key(&(tid, path[..end].to_vec())) {
                found.push(path[..end].to_vec());
            }
        }
        // Below: the range from `path/` up to `path0`.
        let start = (tid, [path, b"/"].concat());
        let end = (tid, [path, b"0"].concat());
        found.extend(self.recent.range(start..end).map(|((_, p), _)| p.clone()));
        found
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
        c.insert(h(1), Some("/w/d".into()), usize::MAX);
        c.insert(h(2), Some("/w/d/e".into()), usize::MAX);
        c.insert(h(3), Some("/w/d-x".into()), usize::MAX);
        c.insert(h(4), Some("/w/dz".into()), usize::MAX);
        c.insert(h(5), None, usize::MAX);
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
        c.insert(h(6), Some("/w/d".into()), usize::MAX);
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/e")));
        assert_eq!(path_of(&c, 6), Some(Path::new("/w/d")));
        c.removed(Path::new("/w/g"));
        assert_eq!(c.get(&h(1)), None, "looked up again when met");
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/e")));
    }

    #[test]
    fn a_handle_looked_up_again_is_indexed_once_under_its_new_path() {
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/a".into()), usize::MAX);
        c.insert(h(1), Some("/w/b".into()), usize::MAX);
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
            c.insert(
                handle,
                Some(PathBuf::from(format!("/w/d/{i:05}"))),
                usize::MAX,
            );
        }
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/d"), Path::new("/w/g"), 1);
        let kept = c.by_handle.values().filter(|c| c.path.is_some()).count();
        assert_eq!(kept, MOVED_PER_RENAME);
        assert!(
            c.by_handle
                .values()
                .filter_map(|c| c.path.as_ref())
                .all(|p| p.starts_with("/w/g"))
        );
    }

    #[test]
    fn a_rename_moves_only_paths_looked_up_before_it_happened() {
        // Looked up in this read: the rename, queued before the read
        // ended, is in the path already (`mv a b; mv c a`, then `c`'s
        // handle met and looked up as `a`): it stays.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/a".into()), usize::MAX);
        c.renamed(Path::new("/w/a"), Path::new("/w/b"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/a")));
        // Looked up in the read before: it may or may not be; forgotten.
        c.next_read();
        c.renamed(Path::new("/w/a"), Path::new("/w/b"), 1);
        assert_eq!(c.get(&h(1)), None);
        // Two reads before: the rename came after the lookup.
        c.insert(h(2), Some("/w/p".into()), usize::MAX);
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
    fn a_lookup_of_the_read_before_at_a_rename_s_new_path_is_unsure() {
        // `mkdir d; creat d/f` read, `mv d g` queued after the read ended
        // but before `d`'s handle was looked up (as `g`).
        let mut c = DirCache::default();
        c.next_read();
        c.insert(h(1), Some("/w/g".into()), usize::MAX);
        c.insert(h(2), Some("/w/other".into()), usize::MAX);
        c.next_read();
        c.renamed(Path::new("/w/d"), Path::new("/w/g"), 1);
        assert_eq!(c.take_unsure(), vec![b"/w/g".to_vec()]);
        assert_eq!(c.get(&h(1)), None);
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/other")));
        // Looked up in this read: the rename is in it (rewind.rs).
        c.insert(h(3), Some("/w/x".into()), usize::MAX);
        c.renamed(Path::new("/w/y"), Path::new("/w/x"), 1);
        assert!(c.take_unsure().is_empty());
    }

    #[test]
    fn renames_that_may_have_been_merged_are_not_followed() {
        // `mv p q; mv q p` in one read (or across two): the queue may hold
        // them merged out of order, so what was cached is forgotten.
        for gap in [0, 1] {
            let mut c = DirCache::default();
            c.insert(h(1), Some("/w/p/d".into()), usize::MAX);
            c.insert(h(2), Some("/w/other".into()), usize::MAX);
            c.next_read();
            c.next_read();
            c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
            assert_eq!(path_of(&c, 1), Some(Path::new("/w/q/d")));
            for _ in 0..gap {
                c.next_read();
            }
            c.renamed(Path::new("/w/q"), Path::new("/w/p"), 1);
            assert_eq!(c.get(&h(1)), None, "gap {gap}");
            // Round 11: only what the loop's renames touch is forgotten.
            assert_eq!(path_of(&c, 2), Some(Path::new("/w/other")), "gap {gap}");
        }
        // Unrelated renames two reads apart are followed.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/p/d".into()), usize::MAX);
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/x"), Path::new("/w/p"), 1);
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/q/d")));
        assert_eq!(c.recent_related(1, b"/w/p/d"), vec![b"/w/p".to_vec()]);
        assert!(c.recent_related(1, b"/w/pd").is_empty());
        assert_eq!(
            c.recent_related(1, b"/w"),
            vec![b"/w/p".to_vec(), b"/w/q".to_vec()]
        );
        // Another thread's renames are never merged with these.
        let mut c = DirCache::default();
        c.insert(h(1), Some("/w/p/d".into()), usize::MAX);
        c.next_read();
        c.next_read();
        c.renamed(Path::new("/w/p"), Path::new("/w/q"), 1);
        c.renamed(Path::new("/w/q"), Path::new("/w/p"), 2);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/p/d")));
    }

    #[test]
    fn a_lookup_before_a_rename_is_moved_by_it_once_the_order_is_known() {
        // Looked up with 3 notifications read; the rename is the 5th: it
        // was read after the lookup, which found the old path: moved.
        let mut c = DirCache::default();
        c.next_read();
        c.insert(h(1), Some("/w/d/sub".into()), 3);
        c.renamed_at(Path::new("/w/d"), Path::new("/w/e"), 1, 4);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/e/sub")));
        assert_eq!(c.get_with_read(&h(1)).map(|g| g.1), Some(false));
        // Read before the lookup: the disk's path already has it.
        c.insert(h(2), Some("/w/x/sub".into()), 3);
        c.renamed_at(Path::new("/w/x"), Path::new("/w/y"), 1, 2);
        assert_eq!(path_of(&c, 2), Some(Path::new("/w/x/sub")));
        // A lookup of the read before: moved when a read ahead found the
        // queue empty after it (covered), forgotten when not.
        let mut c = DirCache::default();
        c.next_read();
        c.insert(h(1), Some("/w/a/s".into()), 1);
        c.cover();
        c.insert(h(2), Some("/w/b/s".into()), 1);
        c.insert(h(3), Some("/w/new/s".into()), 1);
        c.next_read();
        c.renamed_at(Path::new("/w/a"), Path::new("/w/a2"), 1, 0);
        c.renamed_at(Path::new("/w/b"), Path::new("/w/b2"), 2, 1);
        assert_eq!(path_of(&c, 1), Some(Path::new("/w/a2/s")));
        assert_eq!(c.get(&h(2)), None);
        // At a rename's new path: unsure only when not covered.
        c.renamed_at(Path::new("/w/old"), Path::new("/w/new"), 3, 2);
        assert_eq!(c.take_unsure(), vec![b"/w/new/s".to_vec()]);
    }
}
