//! Write counts per file and process, from modify notifications, until
//! the process exits or the file is deleted (the `write` records).

use std::collections::{BTreeSet, HashMap};

use super::join::Task;
use super::notify::Handle;

/// The modify notifications of one process on one file.
#[derive(Debug, Clone)]
pub(super) struct Writes {
    pub task: Task,
    pub count: u64,
    /// When the first was read.
    pub first_ns: u64,
    /// The name the file had when written, once a directory rename moved
    /// the counts: a removal under the new name names the file by it (a
    /// name it had), as `deleted`.
    pub written_at: Option<String>,
    /// The written file's own handle, when the kernel reports it.
    pub fid: Option<Handle>,
    /// Taken from its name by a rename of another file over it (the
    /// kernel reports no removal of a replaced file).
    pub replaced: bool,
}

#[derive(Debug, Default)]
pub(super) struct WriteCounts {
    /// By file, one entry per writing process.
    by_path: HashMap<String, Vec<Writes>>,
    /// The files each process has counts for.
    by_process: HashMap<u32, BTreeSet<String>>,
    /// Names removed when no counts were there, until written again: a
    /// removal by a thread placed before the rename that moved counts to
    /// the name (a short-lived `mv`, looked up only once a record named
    /// it) was the removal of the file the counts are of. With the
    /// removed file's handle (when the kernel reports it), also names
    /// whose counts the removal took: a write to that file after its
    /// removal (open, unlink, write) is a write to a removed file, and
    /// only another file's write or counts end the mark.
    removed: HashMap<String, Option<Handle>>,
    /// Bytes of [`Self::removed`]'s names (see [`NAME_BYTES`]).
    removed_bytes: usize,
    /// The names renames of a file (by its handle) gave it or took from
    /// it: where a written file may be when the name its counts reached
    /// holds no file (see [`Self::names_of`]).
    names: HashMap<Handle, Vec<String>>,
    /// Bytes of [`Self::names`]' names.
    names_bytes: usize,
    /// Per thread, its last directory rename: the directory's handle and
    /// the names of counts it moved (see [`Self::renamed_dir`]).
    last_dir_move: HashMap<u32, (String, Handle, BTreeSet<String>)>,
}

/// Bounds of [`WriteCounts::names`]: files (all forgotten when reached:
/// their records are then as without it), and names kept per file (the
/// newest).
const NAMED_FILES: usize = 65_536;
const NAMES_PER_FILE: usize = 16;

/// Bound of [`WriteCounts::removed`] (all forgotten when reached: the
/// counts are then `not_found`, as without it).
const REMOVED: usize = 65_536;

/// Bound of the names [`WriteCounts::removed`] and [`WriteCounts::names`]
/// each hold, in bytes (a name counted with 64 bytes of its entry's own):
/// their counts alone let names of 4 KiB hold 250 MB of a root process
/// (adversarial round 19). Reached, the map is forgotten, as at its count.
const NAME_BYTES: usize = 16 << 20;

impl WriteCounts {
    pub fn count(&mut self, path: &str, task: Task, ns: u64, fid: Option<&Handle>) {
        if self
            .removed
            .get(path)
            .is_some_and(|gone| gone.is_none() || gone.as_ref() != fid)
        {
            self.forget_removed(path);
        }
        let entries = self.by_path.entry(path.to_string()).or_default();
        // One entry per process and file: a name can hold another file
        // than the one counted there before (renamed over it).
        let same_file = |w: &Writes| fid.is_none() || w.fid.is_none() || w.fid.as_ref() == fid;
        match entries
            .iter_mut()
            .find(|w| w.task.tgid == task.tgid && same_file(w))
        {
            Some(w) => {
                w.count += 1;
                if fid.is_some() {
                    w.fid = fid.cloned();
                }
            }
            None => {
                entries.push(Writes {
                    task,
                    count: 1,
                    first_ns: ns,
                    written_at: None,
                    fid: fid.cloned(),
                    replaced: false,
                });
                self.by_process
                    .entry(task.tgid)
                    .or_default()
                    .insert(path.to_string());
            }
        }
    }

    /// A removal of `path` (of the file `fid`, when reported): its
    /// counts, as [`Self::flush`].
    pub fn removed(&mut self, path: &str, fid: Option<&Handle>) -> Vec<Writes> {
        let done = self.flush(path, None);
        if done.is_empty() || fid.is_some() {
            let cost = path.len() + 64;
            if self.removed.len() >= REMOVED || self.removed_bytes + cost > NAME_BYTES {
                self.removed.clear();
                self.removed_bytes = 0;
            }
            if self
                .removed
                .insert(path.to_string(), fid.cloned())
                .is_none()
            {
                self.removed_bytes += cost;
            }
        }
        done
    }

    fn forget_removed(&mut self, path: &str) {
        if self.removed.remove(path).is_some() {
            self.removed_bytes = self.removed_bytes.saturating_sub(path.len() + 64);
        }
    }

    /// Whether `path` was removed (see [`Self::removed`]) and no other
    /// file was written there since.
    pub fn was_removed(&self, path: &str) -> bool {
        self.removed.contains_key(path)
    }

    /// Takes the counts of `path` (of one process, or of all).
    pub fn flush(&mut self, path: &str, tgid: Option<u32>) -> Vec<Writes> {
        let Some(entries) = self.by_path.get_mut(path) else {
            return Vec::new();
        };
        let (done, kept): (Vec<Writes>, Vec<Writes>) = entries
            .drain(..)
            .partition(|w| tgid.is_none_or(|t| t == w.task.tgid));
        *entries = kept;
        if entries.is_empty() {
            self.by_path.remove(path);
        }
        for w in &done {
            if let Some(files) = self.by_process.get_mut(&w.task.tgid) {
                files.remove(path);
            }
        }
        done
    }

    /// Puts back the counts of a process that exited, under `path`, to be
    /// taken by the name's removal or at the end (not by the process).
    pub fn keep(&mut self, path: &str, w: Writes) {
        self.by_path.entry(path.to_string()).or_default().push(w);
    }

    /// Takes the counts of a process that exited.
    pub fn flush_process(&mut self, tgid: u32) -> Vec<(String, Writes)> {
        let files = self.by_process.remove(&tgid).unwrap_or_default();
        let mut out = Vec::new();
        for path in files {
            for w in self.flush(&path, Some(tgid)) {
                out.push((path.clone(), w));
            }
        }
        out
    }

    /// Moves the counts of a renamed file, `fid` the moved file's handle
    /// when the kernel reports it (`FAN_REPORT_TARGET_FID`). Returns the
    /// counts of the file the rename replaced: those held at `to` of
    /// another file than the moved one, which `gone` says is gone (a file
    /// still linked was not replaced: see `Join::file_renamed`). Without a
    /// handle, or for counts of no handle, nothing can tell them apart and
    /// they are merged.
    pub fn renamed(
        &mut self,
        from: &str,
        to: &str,
        fid: Option<&Handle>,
        gone: impl Fn(&Handle) -> bool,
    ) -> Vec<Writes> {
        let Some(fid) = fid else {
            self.moved(from, to, false);
            return Vec::new();
        };
        // Only written files' names are kept (the bound is then spent on
        // the files whose records need it).
        let written = |p: &str| {
            self.by_path
                .get(p)
                .is_some_and(|e| e.iter().any(|w| w.fid.as_ref() == Some(fid)))
        };
        if self.names.contains_key(fid) || written(from) || written(to) {
            self.named(fid, from);
            self.named(fid, to);
        }
        let other = |w: &Writes| w.fid.as_ref().is_some_and(|f| f != fid);
        let replaced = self.take_where(to, |w| w.fid.as_ref().is_some_and(|f| f != fid && gone(f)));
        // Counts of another file left at the old name (the other side of
        // a `RENAME_EXCHANGE` moved there by its first half) stay.
        let stay = self.take_where(from, |w| other(w));
        self.moved(from, to, false);
        for w in stay {
            self.put(from, w);
        }
        replaced
            .into_iter()
            .map(|mut w| {
                w.replaced = true;
                w
            })
            .collect()
    }

    /// Puts counts taken from a name back under `path`.
    fn put(&mut self, path: &str, w: Writes) {
        self.by_process
            .entry(w.task.tgid)
            .or_default()
            .insert(path.to_string());
        self.by_path.entry(path.to_string()).or_default().push(w);
    }

    /// Takes the counts at `path` that `which` selects.
    fn take_where(&mut self, path: &str, which: impl Fn(&Writes) -> bool) -> Vec<Writes> {
        let Some(entries) = self.by_path.get_mut(path) else {
            return Vec::new();
        };
        let (taken, kept): (Vec<Writes>, Vec<Writes>) = entries.drain(..).partition(which);
        *entries = kept;
        if entries.is_empty() {
            self.by_path.remove(path);
        }
        for w in &taken {
            let still = self
                .by_path
                .get(path)
                .is_some_and(|e| e.iter().any(|o| o.task.tgid == w.task.tgid));
            if !still && let Some(files) = self.by_process.get_mut(&w.task.tgid) {
                files.remove(path);
            }
        }
        taken
    }

    /// Remembers that the file `fid` had the name `path`.
    fn named(&mut self, fid: &Handle, path: &str) {
        let cost = |n: &str| n.len() + 64;
        if (self.names.len() >= NAMED_FILES && !self.names.contains_key(fid))
            || self.names_bytes + cost(path) > NAME_BYTES
        {
            self.names.clear();
            self.names_bytes = 0;
        }
        let names = self.names.entry(fid.clone()).or_default();
        let mut freed = 0;
        names.retain(|n| {
            let keep = n != path;
            if !keep {
                freed += cost(n);
            }
            keep
        });
        if names.len() >= NAMES_PER_FILE {
            freed += cost(&names.remove(0));
        }
        names.push(path.to_string());
        self.names_bytes = (self.names_bytes + cost(path)).saturating_sub(freed);
    }

    /// The names renames gave or took from the file `fid`, newest last.
    /// The kernel merges a thread's identical rename notifications still
    /// queued, into the first one's place in the queue: a loop `x -> y,
    /// y -> x` read as one batch may move the counts in another order
    /// than the calls ran, so the counts' name can be one the file no
    /// longer has. The file is then at one of these names, which the
    /// caller checks against the file itself.
    pub fn names_of(&self, fid: &Handle) -> &[String] {
        self.names.get(fid).map_or(&[], Vec::as_slice)
    }

    fn moved(&mut self, from: &str, to: &str, by_dir: bool) {
        let Some(mut entries) = self.by_path.remove(from) else {
            return;
        };
        if by_dir {
            for w in &mut entries {
                w.written_at.get_or_insert_with(|| from.to_string());
            }
        }
        // Counts of another file than the one removed there: the name
        // holds that file now.
        if let Some(Some(gone)) = self.removed.get(to)
            && entries.iter().any(|w| w.fid.as_ref() != Some(gone))
        {
            self.forget_removed(to);
        }
        for w in &entries {
            if let Some(files) = self.by_process.get_mut(&w.task.tgid) {
                files.remove(from);
                files.insert(to.to_string());
            }
        }
        self.by_path
            .entry(to.to_string())
            .or_default()
            .extend(entries);
    }

    /// Moves the counts of the files below a renamed directory (they
    /// were left at the old place and written as deleted there).
    ///
    /// `renameat2(RENAME_EXCHANGE)` of two directories is reported as two
    /// renames of the thread, `a` to `b` (directory A's handle) then `b`
    /// to `a` (B's). The second must move only B's counts: those the first
    /// moved to `b` are A's, which now lives there. Without the handles
    /// (an older kernel) the two halves cannot be told from two renames.
    pub fn renamed_dir(&mut self, from: &str, to: &str, tid: u32, fid: Option<&Handle>) {
        let (from, to) = (from.trim_end_matches('/'), to.trim_end_matches('/'));
        let stay = match (self.last_dir_move.remove(&tid), fid) {
            (Some((target, moved_by, names)), Some(fid)) if target == from && moved_by != *fid => {
                names
            }
            _ => BTreeSet::new(),
        };
        let prefix = format!("{from}/");
        let moved: Vec<String> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(&prefix) && !stay.contains(*p))
            .cloned()
            .collect();
        let mut names = BTreeSet::new();
        for old in moved {
            let new = format!("{to}/{}", &old[prefix.len()..]);
            self.moved(&old, &new, true);
            names.insert(new);
        }
        if let Some(fid) = fid {
            if self.last_dir_move.len() >= NAMED_FILES {
                self.last_dir_move.clear();
            }
            self.last_dir_move
                .insert(tid, (to.to_string(), fid.clone(), names));
        }
    }

    /// Takes everything, oldest first.
    pub fn drain(&mut self) -> Vec<(String, Writes)> {
        let mut all: Vec<(String, Writes)> = self
            .by_path
            .drain()
            .flat_map(|(path, entries)| entries.into_iter().map(move |w| (path.clone(), w)))
            .collect();
        self.by_process.clear();
        all.sort_by_key(|(_, w)| w.first_ns);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: Task = Task {
        tgid: 7,
        ppid: 1,
        uid: 0,
    };

    #[test]
    fn removed_names_are_bounded_by_their_bytes() {
        let mut w = WriteCounts::default();
        let deep = format!("/w/{}", "d".repeat(4000));
        for i in 0..(NAME_BYTES / 4000 + 100) {
            w.removed(&format!("{deep}/{i}"), None);
            assert!(w.removed_bytes <= NAME_BYTES);
            let held: usize = w.removed.keys().map(|k| k.len() + 64).sum();
            assert_eq!(held, w.removed_bytes);
        }
        assert!(w.removed.len() < NAME_BYTES / 4000, "forgotten once full");
    }

    #[test]
    fn counts_moved_by_a_directory_rename_keep_the_name_they_were_written_at() {
        let task = TASK;
        let mut w = WriteCounts::default();
        w.count("/w/d/sub/f", task, 1, None);
        w.renamed_dir("/w/d", "/w/e", 7, None);
        let done = w.removed("/w/e/sub/f", None);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].written_at.as_deref(), Some("/w/d/sub/f"));
        // Removed before a late rename brought the counts there.
        w.count("/w/d2/f", task, 2, None);
        assert!(w.removed("/w/e2/f", None).is_empty());
        w.renamed_dir("/w/d2", "/w/e2", 7, None);
        assert!(w.was_removed("/w/e2/f"));
        // Written again: a file lives there.
        w.count("/w/e2/f", task, 3, None);
        assert!(!w.was_removed("/w/e2/f"));
    }

    fn fid(n: u8) -> Handle {
        Handle {
            fsid: [1, 1],
            handle_type: 1,
            bytes: vec![n; 8],
        }
    }

    #[test]
    fn a_write_to_the_removed_file_keeps_its_removal() {
        let task = TASK;
        let mut w = WriteCounts::default();
        // open gone; unlink gone; write: the removal came first.
        assert!(w.removed("/w/gone", Some(&fid(1))).is_empty());
        w.count("/w/gone", task, 1, Some(&fid(1)));
        assert!(
            w.was_removed("/w/gone"),
            "the file written is the removed one"
        );
        // Another file made under the name and written: it lives there.
        w.count("/w/gone", task, 2, Some(&fid(2)));
        assert!(!w.was_removed("/w/gone"));
        // Written, removed (the counts taken), written again: removed.
        w.count("/w/t", task, 3, Some(&fid(3)));
        assert_eq!(w.removed("/w/t", Some(&fid(3))).len(), 1);
        w.count("/w/t", task, 4, Some(&fid(3)));
        assert!(w.was_removed("/w/t"));
        // Another file's counts renamed over a removed name end the mark;
        // the removed file's own (its directory renamed late) keep it.
        assert!(w.removed("/w/e/f", Some(&fid(4))).is_empty());
        w.count("/w/x", task, 5, Some(&fid(5)));
        w.renamed("/w/x", "/w/e/f", Some(&fid(5)), |_| true);
        assert!(!w.was_removed("/w/e/f"));
        assert!(w.removed("/w/e2/f", Some(&fid(6))).is_empty());
        w.count("/w/d2/f", task, 6, Some(&fid(6)));
        w.renamed_dir("/w/d2", "/w/e2", 7, None);
        assert!(w.was_removed("/w/e2/f"));
    }

    #[test]
    fn an_exchange_of_two_directories_leaves_each_one_s_counts_in_it() {
        let task = TASK;
        let mut w = WriteCounts::default();
        // write mine/f and host/g; exchange mine and host (A's handle 1,
        // B's 2): f is now host/f, g is mine/g.
        w.count("/w/mine/f", task, 1, Some(&fid(10)));
        w.count("/w/host/g", task, 2, Some(&fid(11)));
        w.renamed_dir("/w/mine", "/w/host", 7, Some(&fid(1)));
        w.renamed_dir("/w/host", "/w/mine", 7, Some(&fid(2)));
        let mut left: Vec<String> = w.flush_process(7).into_iter().map(|(p, _)| p).collect();
        left.sort();
        assert_eq!(left, ["/w/host/f", "/w/mine/g"]);
        // Two renames of one directory back and forth (its own handle
        // both times) move its counts both times.
        w.count("/w/d/f", task, 3, Some(&fid(12)));
        w.renamed_dir("/w/d", "/w/e", 7, Some(&fid(3)));
        w.renamed_dir("/w/e", "/w/d", 7, Some(&fid(3)));
        let left: Vec<String> = w.flush_process(7).into_iter().map(|(p, _)| p).collect();
        assert_eq!(left, ["/w/d/f"]);
    }

    #[test]
    fn a_rename_over_a_written_file_takes_that_file_s_counts_as_replaced() {
        let task = TASK;
        let mut w = WriteCounts::default();
        // write a; write b; rename b a: the old `a` is replaced.
        w.count("/w/a", task, 1, Some(&fid(1)));
        w.count("/w/b", task, 2, Some(&fid(2)));
        let replaced = w.renamed("/w/b", "/w/a", Some(&fid(2)), |_| true);
        assert_eq!(replaced.len(), 1);
        assert!(replaced[0].replaced && replaced[0].fid == Some(fid(1)));
        let left = w.flush_process(7);
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].0, "/w/a");
        assert_eq!(left[0].1.fid, Some(fid(2)));
        assert_eq!(w.names_of(&fid(2)), ["/w/b", "/w/a"]);
        // A file with no counts: its names are not kept.
        assert!(
            w.renamed("/w/u", "/w/v", Some(&fid(20)), |_| true)
                .is_empty()
        );
        assert!(w.names_of(&fid(20)).is_empty());
        // Written again under the name after the rename: one entry per
        // file, not the replaced file's.
        w.count("/w/c", task, 3, Some(&fid(3)));
        w.count("/w/d", task, 4, Some(&fid(4)));
        assert_eq!(w.renamed("/w/d", "/w/c", Some(&fid(4)), |_| true).len(), 1);
        w.count("/w/c", task, 5, Some(&fid(4)));
        let left = w.flush_process(7);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].1.count, 2);
        // Without handles nothing tells them apart: merged, as before.
        w.count("/w/e", task, 6, None);
        w.count("/w/f", task, 7, None);
        assert!(w.renamed("/w/f", "/w/e", None, |_| true).is_empty());
        assert_eq!(w.flush("/w/e", None).len(), 2);
        // Counts of no handle at the target are not called replaced.
        w.count("/w/g", task, 8, None);
        w.count("/w/h", task, 9, Some(&fid(9)));
        assert!(
            w.renamed("/w/h", "/w/g", Some(&fid(9)), |_| true)
                .is_empty()
        );
        // A file still linked was not replaced (read out of order, or the
        // other side of an exchange): its counts stay, with the name's.
        w.count("/w/i", task, 10, Some(&fid(10)));
        w.count("/w/j", task, 11, Some(&fid(11)));
        assert!(
            w.renamed("/w/j", "/w/i", Some(&fid(11)), |_| false)
                .is_empty()
        );
        assert_eq!(w.flush("/w/i", None).len(), 2);
    }

    #[test]
    fn an_exchange_leaves_each_file_s_counts_at_its_new_name() {
        let task = TASK;
        let mut w = WriteCounts::default();
        w.count("/w/a", task, 1, Some(&fid(1)));
        w.count("/w/b", task, 2, Some(&fid(2)));
        // First half, a to b moving file 1: file 2 lives, not replaced.
        assert!(
            w.renamed("/w/a", "/w/b", Some(&fid(1)), |_| false)
                .is_empty()
        );
        // Second half, b to a moving file 2: file 1's counts stay at b.
        assert!(
            w.renamed("/w/b", "/w/a", Some(&fid(2)), |_| false)
                .is_empty()
        );
        let mut at: Vec<(String, Option<Handle>)> = w
            .flush_process(7)
            .into_iter()
            .map(|(p, w)| (p, w.fid))
            .collect();
        at.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            at,
            vec![
                ("/w/a".to_string(), Some(fid(2))),
                ("/w/b".to_string(), Some(fid(1)))
            ]
        );
    }
}
