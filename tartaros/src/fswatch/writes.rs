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
}

/// Bound of [`WriteCounts::removed`] (all forgotten when reached: the
/// counts are then `not_found`, as without it).
const REMOVED: usize = 65_536;

impl WriteCounts {
    pub fn count(&mut self, path: &str, task: Task, ns: u64, fid: Option<&Handle>) {
        if self
            .removed
            .get(path)
            .is_some_and(|gone| gone.is_none() || gone.as_ref() != fid)
        {
            self.removed.remove(path);
        }
        let entries = self.by_path.entry(path.to_string()).or_default();
        match entries.iter_mut().find(|w| w.task.tgid == task.tgid) {
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
            if self.removed.len() >= REMOVED {
                self.removed.clear();
            }
            self.removed.insert(path.to_string(), fid.cloned());
        }
        done
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

    /// Moves the counts of a renamed file.
    pub fn renamed(&mut self, from: &str, to: &str) {
        self.moved(from, to, false);
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
            self.removed.remove(to);
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
    pub fn renamed_dir(&mut self, from: &str, to: &str) {
        let prefix = format!("{}/", from.trim_end_matches('/'));
        let moved: Vec<String> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        for old in moved {
            let new = format!("{}/{}", to.trim_end_matches('/'), &old[prefix.len()..]);
            self.moved(&old, &new, true);
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

    #[test]
    fn counts_moved_by_a_directory_rename_keep_the_name_they_were_written_at() {
        let task = Task {
            tgid: 7,
            ppid: 1,
            uid: 0,
        };
        let mut w = WriteCounts::default();
        w.count("/w/d/sub/f", task, 1, None);
        w.renamed_dir("/w/d", "/w/e");
        let done = w.removed("/w/e/sub/f", None);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].written_at.as_deref(), Some("/w/d/sub/f"));
        // Removed before a late rename brought the counts there.
        w.count("/w/d2/f", task, 2, None);
        assert!(w.removed("/w/e2/f", None).is_empty());
        w.renamed_dir("/w/d2", "/w/e2");
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
        let task = Task {
            tgid: 7,
            ppid: 1,
            uid: 0,
        };
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
        w.renamed("/w/x", "/w/e/f");
        assert!(!w.was_removed("/w/e/f"));
        assert!(w.removed("/w/e2/f", Some(&fid(6))).is_empty());
        w.count("/w/d2/f", task, 6, Some(&fid(6)));
        w.renamed_dir("/w/d2", "/w/e2");
        assert!(w.was_removed("/w/e2/f"));
    }
}
