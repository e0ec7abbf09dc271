//! The regular files a run created or modified, by kernel path, for the
//! seal. Kept as raw bytes in byte order: a `PathBuf` set compares paths
//! component by component, which was a tenth of the supervisor's time on a
//! create flood (every modify notification touches a file again), and in
//! byte order a directory's descendants are still one range (`d/` up to
//! `d0`, `0` being the byte after `/`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};

/// At most this many changed files are remembered (~100 bytes each);
/// later ones are only counted.
const MAX_TOUCHED: usize = 1_000_000;
/// And at most this many bytes of names, for the files and the renames
/// together (each name counted with [`ENTRY_BYTES`] of its set's own):
/// the count alone let names of 4 KiB grow a root supervisor (or a
/// service worker, outside the run's cgroup) by 2.3 GB in 30 s of an
/// agent creating and removing files deep in a tree (adversarial round
/// 19); past it, files are counted as not hashed, as past the count.
const MAX_NAME_BYTES: usize = 64 << 20;
/// What one remembered name costs beyond its bytes (a B-tree or hash
/// entry, a `Vec` header), roughly.
const ENTRY_BYTES: usize = 64;
/// At most this many renames are remembered for [`Touched::settle`].
const MAX_RENAMES: usize = 200_000;
/// At most this many names one file touched by a record is followed to,
/// and one name is remembered to have been renamed to.
const MAX_NAMES_PER_FILE: usize = 256;
/// At most this many names are looked up in all at the seal (an agent
/// that renames a directory along a long chain must not stall the seal);
/// the files not followed are counted as not hashed.
const MAX_SETTLE_STEPS: usize = 1 << 22;

#[derive(Debug, Default)]
pub(super) struct Touched {
    paths: BTreeSet<Vec<u8>>,
    /// Bytes of the names remembered in every set (see [`MAX_NAME_BYTES`]).
    name_bytes: usize,
    /// Changed files not remembered (over MAX_TOUCHED).
    untracked: u64,
    /// Every rename of the run, old name to new names, files and
    /// directories apart.
    renamed_files: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    renamed_dirs: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    renames: usize,
    /// More renames than MAX_RENAMES happened.
    renames_dropped: bool,
    /// Names renamed to more than MAX_NAMES_PER_FILE targets: a file
    /// whose walk meets one is counted as not hashed.
    overflowed: HashSet<Vec<u8>>,
    /// Files named by a capture record rather than a notification (a
    /// set: a file opened for writing a million times is one entry).
    by_record: BTreeSet<Vec<u8>>,
    /// Files opened for writing that neither the kernel's walk nor the
    /// process's descriptor named, or that have other links (`dev`,
    /// `ino`, links): looked for at the seal, counted as not hashed when
    /// no name of theirs is found.
    unnamed: HashMap<(u64, u64), u32>,
    /// Directory entries read by [`Touched::touch_tree`] so far (bounded:
    /// the supervisor must not be made to walk big trees again and again).
    tree_read: usize,
    /// Names a directory was renamed to: every file under one holds, at
    /// its name, what another name held before, so the seal walks them
    /// (once, at the end: later renames only move the walk).
    renamed_into: BTreeSet<Vec<u8>>,
}

impl Touched {
    pub fn touch(&mut self, path: &Path) {
        if !insert_bounded(&mut self.paths, path, &mut self.name_bytes) {
            self.untracked += 1;
        }
    }

    /// A file a capture record names (an open for writing, by the
    /// kernel's file). The record is joined after notifications read
    /// with it or before it, so a rename of the file that came after the
    /// open may already have been applied: [`Touched::settle`] follows
    /// every rename of the run from it.
    pub fn touch_by_record(&mut self, path: &Path) {
        self.touch(path);
        if !insert_bounded(&mut self.by_record, path, &mut self.name_bytes) {
            self.untracked += 1;
        }
    }

    /// Before the seal: adds every name a file touched by a record may
    /// have been renamed to (in any order: a name that holds nothing at
    /// the seal is skipped there). When renames were too many to
    /// remember, those files are counted as not hashed.
    pub fn settle(&mut self) {
        let by_record = std::mem::take(&mut self.by_record);
        if self.renames_dropped {
            self.untracked += by_record.len() as u64;
        }
        if self.renames == 0 || self.renames_dropped {
            return;
        }
        let mut steps = MAX_SETTLE_STEPS;
        for start in by_record {
            let mut seen: HashSet<Vec<u8>> = HashSet::from([start.clone()]);
            let mut next = vec![start];
            let mut cut = false;
            while let Some(name) = next.pop() {
                if steps == 0 {
                    cut = true;
                    break;
                }
                steps -= 1;
                let (names, full) = self.new_names(&name);
                cut |= full;
                for new in names {
                    if seen.contains(&new) {
                        continue;
                    }
                    if seen.len() >= MAX_NAMES_PER_FILE {
                        cut = true;
                        break;
                    }
                    seen.insert(new.clone());
                    self.touch(Path::new(OsStr::from_bytes(&new)));
                    next.push(new);
                }
            }
            if cut {
                self.untracked += 1;
            }
        }
    }

    /// The names `name` had after one rename of it or of a directory
    /// above it, and whether some were not remembered.
    fn new_names(&self, name: &[u8]) -> (Vec<Vec<u8>>, bool) {
        let mut out: Vec<Vec<u8>> = self.renamed_files.get(name).cloned().unwrap_or_default();
        let mut full = self.overflowed.contains(name);
        if self.renamed_dirs.is_empty() {
            return (out, full);
        }
        for (i, _) in name.iter().enumerate().filter(|(_, b)| **b == b'/') {
            let dir = &name[..i];
            if let Some(tos) = self.renamed_dirs.get(dir) {
                out.extend(tos.iter().map(|to| [to.as_slice(), &name[i..]].concat()));
            }
            full |= self.overflowed.contains(dir);
        }
        (out, full)
    }

    fn remember_rename(&mut self, from: &Path, to: &Path, dir: bool) {
        let cost = from.as_os_str().len() + to.as_os_str().len() + 2 * ENTRY_BYTES;
        if self.renames >= MAX_RENAMES || self.name_bytes + cost > MAX_NAME_BYTES {
            self.renames_dropped = true;
            return;
        }
        self.renames += 1;
        self.name_bytes += cost;
        let index = if dir {
            &mut self.renamed_dirs
        } else {
            &mut self.renamed_files
        };
        let key = from.as_os_str().as_bytes();
        let tos = index.entry(key.to_vec()).or_default();
        if tos.len() >= MAX_NAMES_PER_FILE {
            // Only the files whose walk meets this name are affected.
            self.overflowed.insert(key.to_vec());
            return;
        }
        tos.push(to.as_os_str().as_bytes().to_vec());
    }

    #[cfg(test)]
    pub fn contains(&self, path: &Path) -> bool {
        self.paths.contains(path.as_os_str().as_bytes())
    }

    /// Changed files the seal cannot list (over the memory bound).
    pub fn untracked(&self) -> u64 {
        self.untracked.saturating_add(self.unnamed.len() as u64)
    }

    /// Names the files known only by inode, with `find` (a search of the
    /// roots); those it does not find stay counted as not hashed.
    pub fn name_unnamed(
        &mut self,
        find: impl FnOnce(&HashMap<(u64, u64), u32>) -> Vec<((u64, u64), PathBuf)>,
    ) {
        if self.unnamed.is_empty() {
            return;
        }
        let found = find(&self.unnamed);
        let named: HashSet<(u64, u64)> = found.iter().map(|(id, _)| *id).collect();
        let missing = self.unnamed.keys().filter(|id| !named.contains(id)).count();
        self.unnamed.clear();
        self.untracked = self.untracked.saturating_add(missing as u64);
        for (_, path) in found {
            self.touch(&path);
        }
    }

    /// Every regular file under `dir` now (a directory that arrived from
    /// where its files' changes could not be named); past the walk's
    /// bound, one more file counted as not hashed.
    pub fn touch_tree(&mut self, dir: &Path) {
        let mut budget = super::content::MAX_INODE_SEARCH.saturating_sub(self.tree_read);
        let before = budget;
        let (files, whole) = super::content::files_under(dir, &mut budget);
        self.tree_read += before - budget;
        for file in files {
            self.touch(&file);
        }
        if !whole {
            self.untracked += 1;
        }
    }

    /// Before the seal: every regular file under a name a directory was
    /// renamed to that is a directory in one of `roots` now (not through
    /// a symlink: the agent may have put one there), within the tree
    /// walk's bound; a directory under another walked one is not walked
    /// again.
    pub fn walk_renamed_dirs(&mut self, roots: &[PathBuf]) {
        let dirs = std::mem::take(&mut self.renamed_into);
        let mut last: Option<Vec<u8>> = None;
        for dir in dirs {
            if let Some(above) = &last
                && dir.len() > above.len()
                && dir.starts_with(above)
                && dir[above.len()] == b'/'
            {
                continue;
            }
            let path = Path::new(OsStr::from_bytes(&dir));
            let in_root = roots.iter().any(|r| path.starts_with(r));
            let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
            if in_root && is_dir {
                self.touch_tree(path);
                last = Some(dir);
            }
        }
    }

    /// A file changed through a descriptor whose names are not all known
    /// (`links`: how many it has, at least the one to find).
    pub fn unnamed(&mut self, dev: u64, ino: u64, links: u32) {
        if self.unnamed.len() < MAX_TOUCHED || self.unnamed.contains_key(&(dev, ino)) {
            self.unnamed.insert((dev, ino), links.max(1));
        } else {
            self.untracked += 1;
        }
    }

    /// The remembered files, in byte order.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.paths
            .iter()
            .map(|p| Path::new(OsStr::from_bytes(p.as_slice())))
    }

    /// A rename changes what its new name holds, whether or not the run
    /// wrote the file: the new name is a changed file (for a directory,
    /// every file under it, walked at the seal by
    /// [`Touched::walk_renamed_dirs`]). The old names are kept: a
    /// `RENAME_EXCHANGE` is reported as two renames (`a` to `b`, then `b`
    /// to `a`), and moving the names would leave the changed file, now at
    /// `b`, unlisted. A name that holds nothing at the seal is skipped
    /// there.
    pub fn renamed(&mut self, from: &Path, to: &Path, dir: bool) {
        self.remember_rename(from, to, dir);
        if !dir {
            self.touch(to);
            return;
        }
        if !insert_bounded(&mut self.renamed_into, to, &mut self.name_bytes) {
            self.untracked += 1;
        }
        let from = from.as_os_str().as_bytes();
        let start = [from, b"/"].concat();
        let end = [from, b"0"].concat();
        let moved: Vec<Vec<u8>> = self.paths.range(start.clone()..end).cloned().collect();
        for p in moved {
            let rest = OsString::from_vec(p[start.len()..].to_vec());
            self.touch(&to.join(rest));
        }
    }
}

/// Adds `path` to `set` unless it is there; false when the set is full.
fn insert_bounded(set: &mut BTreeSet<Vec<u8>>, path: &Path, bytes: &mut usize) -> bool {
    let key = path.as_os_str().as_bytes();
    if set.contains(key) {
        return true;
    }
    let cost = key.len() + ENTRY_BYTES;
    if set.len() >= MAX_TOUCHED || *bytes + cost > MAX_NAME_BYTES {
        return false;
    }
    *bytes += cost;
    set.insert(key.to_vec());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_bounded_by_their_bytes_not_only_their_count() {
        let mut t = Touched::default();
        let deep = format!("/w/{}", "d".repeat(4000));
        let n = MAX_NAME_BYTES / 4000 + 100;
        for i in 0..n {
            t.touch(Path::new(&format!("{deep}/{i}")));
        }
        assert!(t.name_bytes <= MAX_NAME_BYTES);
        let kept = t.paths.iter().map(|p| p.len()).sum::<usize>();
        assert!(kept <= MAX_NAME_BYTES, "{kept}");
        assert_eq!(t.paths.len() as u64 + t.untracked, n as u64);
        assert!(t.untracked >= 100, "{}", t.untracked);
        // A name already remembered costs nothing more.
        let before = t.untracked;
        t.touch(Path::new(&format!("{deep}/0")));
        assert_eq!(t.untracked, before);
    }

    #[test]
    fn a_renamed_directory_adds_its_descendants_and_nothing_else() {
        let mut t = Touched::default();
        for p in ["/w/d/f", "/w/d/e/g", "/w/d-x", "/w/d", "/w/dz/f", "/w/d0"] {
            t.touch(Path::new(p));
        }
        t.renamed(Path::new("/w/d"), Path::new("/w/n"), true);
        let now: Vec<&Path> = t.iter().collect();
        let want: Vec<&Path> = [
            "/w/d", "/w/d-x", "/w/d/e/g", "/w/d/f", "/w/d0", "/w/dz/f", "/w/n/e/g", "/w/n/f",
        ]
        .into_iter()
        .map(Path::new)
        .collect();
        assert_eq!(now, want);
        t.renamed(Path::new("/w/d0"), Path::new("/w/m"), false);
        assert!(t.contains(Path::new("/w/m")) && t.contains(Path::new("/w/d0")));
        // A file never touched is changed at its new name (it holds
        // what `q` held), not at the old one.
        t.renamed(Path::new("/w/q"), Path::new("/w/r"), false);
        assert!(t.contains(Path::new("/w/r")) && !t.contains(Path::new("/w/q")));
    }

    #[test]
    fn an_exchange_keeps_the_changed_file_listed_under_its_new_name() {
        // renameat2(a, b, RENAME_EXCHANGE) of a changed `a` and an
        // unchanged `b`: the kernel reports a -> b, then b -> a.
        let mut t = Touched::default();
        t.touch(Path::new("/w/a"));
        t.renamed(Path::new("/w/a"), Path::new("/w/b"), false);
        t.renamed(Path::new("/w/b"), Path::new("/w/a"), false);
        assert!(
            t.contains(Path::new("/w/b")),
            "the changed file is at b now"
        );
        let mut t = Touched::default();
        t.touch(Path::new("/w/x/f"));
        t.renamed(Path::new("/w/x"), Path::new("/w/y"), true);
        t.renamed(Path::new("/w/y"), Path::new("/w/x"), true);
        assert!(t.contains(Path::new("/w/y/f")));
    }

    #[test]
    fn a_file_named_by_a_record_follows_renames_read_before_it() {
        // The notifications of `mv a b`, `mv d e`, `mv e/b f` were read
        // before the record of the open that changed `d/a`.
        let mut t = Touched::default();
        t.renamed(Path::new("/w/d/a"), Path::new("/w/d/b"), false);
        t.renamed(Path::new("/w/d"), Path::new("/w/e"), true);
        t.renamed(Path::new("/w/e/b"), Path::new("/w/f"), false);
        t.renamed(Path::new("/w/f"), Path::new("/w/d/a"), false);
        t.touch_by_record(Path::new("/w/d/a"));
        t.settle();
        for p in ["/w/d/a", "/w/d/b", "/w/e/b", "/w/f"] {
            assert!(t.contains(Path::new(p)), "{p}");
        }
        assert_eq!(t.untracked(), 0);
    }

    #[test]
    fn a_long_chain_of_renames_is_followed_within_bounds_and_counted() {
        // d0 -> d1 -> ... -> d999: a file under d0 has 1,000 names, more
        // than are followed; it is counted as not hashed.
        let mut t = Touched::default();
        for i in 0..1000 {
            t.renamed(
                Path::new(&format!("/w/d{i}")),
                Path::new(&format!("/w/d{}", i + 1)),
                true,
            );
        }
        t.touch_by_record(Path::new("/w/d0/f"));
        t.settle();
        assert!(t.contains(Path::new("/w/d1/f")) && t.contains(Path::new("/w/d255/f")));
        assert!(!t.contains(Path::new("/w/d999/f")));
        assert_eq!(t.untracked(), 1);
    }

    #[test]
    fn a_name_renamed_too_often_costs_only_the_files_that_met_it() {
        // `a` is created and renamed away 300 times: only a file whose
        // walk reaches `a` is counted; another file is followed as usual.
        let mut t = Touched::default();
        for i in 0..300 {
            t.renamed(Path::new("/w/a"), Path::new(&format!("/w/x{i}")), false);
        }
        t.renamed(Path::new("/w/b"), Path::new("/w/c"), false);
        t.touch_by_record(Path::new("/w/a"));
        t.touch_by_record(Path::new("/w/b"));
        t.settle();
        assert!(t.contains(Path::new("/w/c")) && t.contains(Path::new("/w/x0")));
        assert_eq!(t.untracked(), 1);
    }

    #[test]
    fn files_under_a_renamed_directory_are_walked_in_the_roots_only() {
        // `mv d n`, `mv n/g m` (nested: walked once), a rename to a name
        // that is a symlink to a host directory at the seal, and one
        // outside the roots: only real directories in a root are walked.
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let r = root.path();
        for f in ["n/f", "n/g/h", "m/k"] {
            std::fs::create_dir_all(r.join(f).parent().unwrap()).unwrap();
            std::fs::write(r.join(f), "x").unwrap();
        }
        std::fs::write(host.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(host.path(), r.join("l")).unwrap();
        let mut t = Touched::default();
        t.renamed(&r.join("d"), &r.join("n"), true);
        t.renamed(&r.join("x"), &r.join("n/g"), true);
        t.renamed(&r.join("y"), &r.join("m"), true);
        t.renamed(&r.join("z"), &r.join("l"), true);
        t.renamed(&r.join("w"), host.path(), true);
        t.walk_renamed_dirs(&[r.to_path_buf()]);
        let got: Vec<PathBuf> = t.iter().map(Path::to_path_buf).collect();
        let want: Vec<PathBuf> = ["m/k", "n/f", "n/g/h"].iter().map(|f| r.join(f)).collect();
        assert_eq!(got, want);
        assert_eq!(t.untracked(), 0);
    }
}
