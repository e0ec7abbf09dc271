//! Write counts per file and process, from modify notifications, until
//! the process exits or the file is deleted (the `write` records).

use std::collections::{BTreeSet, HashMap};

use super::join::Task;

/// The modify notifications of one process on one file.
#[derive(Debug, Clone)]
pub(super) struct Writes {
    pub task: Task,
    pub count: u64,
    /// When the first was read.
    pub first_ns: u64,
}

#[derive(Debug, Default)]
pub(super) struct WriteCounts {
    /// By file, one entry per writing process.
    by_path: HashMap<String, Vec<Writes>>,
    /// The files each process has counts for.
    by_process: HashMap<u32, BTreeSet<String>>,
}

impl WriteCounts {
    pub fn count(&mut self, path: &str, task: Task, ns: u64) {
        let entries = self.by_path.entry(path.to_string()).or_default();
        match entries.iter_mut().find(|w| w.task.tgid == task.tgid) {
            Some(w) => w.count += 1,
            None => {
                entries.push(Writes {
                    task,
                    count: 1,
                    first_ns: ns,
                });
                self.by_process
                    .entry(task.tgid)
                    .or_default()
                    .insert(path.to_string());
            }
        }
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
        let Some(entries) = self.by_path.remove(from) else {
            return;
        };
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
            self.renamed(&old, &new);
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
