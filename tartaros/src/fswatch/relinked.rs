//! Where a file lives on after the name its writes were reported under
//! was removed, when it had been given another name first (`link x y;
//! unlink x`, writes through a descriptor before and after).
//!
//! A modify notification names a file by its dentry: after `unlink x` the
//! descriptor's dentry is still `x`, so every write through it is reported
//! as `x`, and the `write` records said `x`, `deleted: true`, while the
//! tree holds what was written under `y`. The removal's notification is
//! read before the link's record is joined (and the kernel merges a
//! name's queued modify and delete into one notification, queued where
//! the first write was, before the link's), so notification order cannot
//! say which link kept the file. Record order can: the links made from a
//! name since its previous removal are the ones its next `unlink` record
//! leaves behind. The counts of a removed name are parked here until the
//! thread's records have passed the removal, then named by those links'
//! new names (the kernel's `to`, found by inode through [`TmpfileLinks`],
//! which follows renames), if one still holds the linked file. The link's
//! `from` is the agent's string: a thread rewriting it during the call
//! can make the log name the link's real source's new name for the
//! writes, never a file that was not linked (docs/effect-log.md).

use std::collections::HashMap;

use super::tmpfile_links::{TmpfileLinks, is_tmpfile_name};
use super::writes::Writes;

/// Names remembered (a bound on the supervisor's memory; all go at once
/// when it is reached, as in [`TmpfileLinks`]).
const KEPT: usize = 65_536;
/// Links remembered from one name.
const LINKS_PER_NAME: usize = 256;

/// Write counts of a name that was removed, waiting for the records of
/// the thread that removed it.
#[derive(Debug)]
pub(super) struct Parked {
    pub path: String,
    pub tid: u32,
    pub read_ns: u64,
    pub writes: Vec<Writes>,
}

#[derive(Debug, Default)]
pub(super) struct Relinked {
    /// Links made from each name (the record's `from`) since its last
    /// removal: the new file's `(dev, ino)`.
    pending: HashMap<String, Vec<(u64, u64)>>,
    /// The links each removed name left behind at its last removal.
    removed: HashMap<String, Vec<(u64, u64)>>,
    parked: Vec<Parked>,
    /// Links were forgotten (a table was full): a removed name with no
    /// link found may still live on under one.
    forgot: bool,
}

impl Relinked {
    /// The notification of `path`'s removal, with its counts until then.
    pub fn removed(&mut self, path: &str, tid: u32, read_ns: u64, writes: Vec<Writes>) {
        if !writes.is_empty() {
            self.parked.push(Parked {
                path: path.to_string(),
                tid,
                read_ns,
                writes,
            });
        }
    }

    /// An allowed link record from `from` (the agent's string) to the
    /// file `key`.
    pub fn linked(&mut self, from: &str, key: (u64, u64)) {
        if self.pending.len() >= KEPT {
            self.pending.clear();
            self.forgot = true;
        }
        let links = self.pending.entry(from.to_string()).or_default();
        if links.len() < LINKS_PER_NAME {
            links.push(key);
        } else {
            self.forgot = true;
        }
    }

    /// An allowed unlink record of `path`: the links made from it since
    /// its previous removal are where its file lives on.
    pub fn unlinked(&mut self, path: &str) {
        let links = self.pending.remove(path);
        match links {
            Some(links) => {
                if self.removed.len() >= KEPT {
                    self.removed.clear();
                    self.forgot = true;
                }
                self.removed.insert(path.to_string(), links);
            }
            None => {
                self.removed.remove(path);
            }
        }
    }

    /// An allowed rename record from `from` to `to` (not an exchange): it
    /// removed the name `to` as an unlink would (the file it held lives
    /// on only under the links made from `to`), and the links made from
    /// `from` are now links of the file at `to`.
    pub fn renamed(&mut self, from: &str, to: &str) {
        self.unlinked(to);
        if let Some(links) = self.pending.remove(from) {
            self.pending.insert(to.to_string(), links);
        }
    }

    /// Whether a link may have been forgotten (see [`TmpfileLinks::forgot`]).
    pub fn forgot(&self) -> bool {
        self.forgot
    }

    /// The parked counts `ready` says the records have passed.
    pub fn take_ready(&mut self, ready: impl Fn(&Parked) -> bool) -> Vec<Parked> {
        let (done, kept) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| ready(p));
        self.parked = kept;
        done
    }

    /// Where the file written as the removed name `path` is now: the
    /// newest link its last removal left behind whose new name still
    /// holds the linked file.
    pub fn name_of(&self, path: &str, links: &TmpfileLinks) -> Option<String> {
        self.removed
            .get(path)?
            .iter()
            .rev()
            .find_map(|key| links.name_of_inode(*key))
    }
}

/// Where the file written under the kernel's name `path` is now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Under a link the run made (the `write` record's `path`; the
    /// kernel's name is its `written_as`).
    Linked(String),
    /// At `path` itself.
    Here,
    /// Nowhere: the writes went to a file the tree does not have.
    Gone,
    /// Under another name the run's renames gave the file, where its own
    /// handle finds it (the counts' name was one it no longer has).
    Moved(String),
    /// Not at `path`, and a link that may keep it was forgotten.
    Unknown,
    /// Not at `path` when the record is written, though no removal of it
    /// was seen: moved by something the notifications do not carry in
    /// order (renames the kernel merged, a host's rename). Not `Gone`:
    /// that would say a file was deleted that may live on elsewhere.
    Missing,
}

/// An O_TMPFILE linked into the tree is named `#<inode>` by the kernel
/// however it is named now; a name removed after a link keeps the
/// descriptor's old dentry. Either is looked up among the run's links.
/// Once the link tables forgot a link (an agent made 65,536 of them
/// between a link and a write), a name not found there may live on under
/// one: the record cannot say `deleted`, and `verify` says incomplete.
pub(super) fn locate(path: &str, exists: bool, links: &TmpfileLinks, relinked: &Relinked) -> Place {
    let absent = |p: &str| super::content::absent(&crate::effectlog::names::on_disk(p));
    let gone = !exists || absent(path);
    let linked = if exists && is_tmpfile_name(path) {
        links.name_of(path)
    } else if gone {
        relinked.name_of(path, links)
    } else {
        None
    };
    match linked {
        Some(to) => Place::Linked(to),
        None if !gone => Place::Here,
        None if links.forgot() || relinked.forgot() => Place::Unknown,
        None if exists => Place::Missing,
        None => Place::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fswatch::join::Task;
    use std::os::unix::fs::MetadataExt as _;

    fn writes() -> Vec<Writes> {
        let task = Task {
            tgid: 7,
            ppid: 1,
            uid: 0,
        };
        vec![Writes {
            task,
            count: 1,
            first_ns: 0,
            written_at: None,
            fid: None,
            replaced: false,
        }]
    }

    #[test]
    fn a_removed_name_is_found_at_the_link_made_before_its_removal() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let (x, y) = (format!("{d}/x"), format!("{d}/y"));
        std::fs::write(&y, "kept").unwrap();
        let meta = std::fs::metadata(&y).unwrap();
        let mut links = TmpfileLinks::default();
        let key = links.linked(&y).unwrap();
        assert_eq!(key, (meta.dev(), meta.ino()));
        let mut relinked = Relinked::default();
        relinked.removed(&x, 1, 0, writes());
        assert_eq!(relinked.take_ready(|_| true).len(), 1);
        // Removed with no link: nothing; linked, then removed: the link.
        relinked.unlinked(&x);
        assert_eq!(relinked.name_of(&x, &links), None);
        relinked.linked(&x, key);
        assert_eq!(relinked.name_of(&x, &links), None, "not removed yet");
        relinked.unlinked(&x);
        assert_eq!(relinked.name_of(&x, &links), Some(y.clone()));
        // A later file of that name, removed with no link: its own.
        relinked.unlinked(&x);
        assert_eq!(relinked.name_of(&x, &links), None);
        // The new name no longer holds the file: nothing.
        relinked.linked(&x, key);
        relinked.unlinked(&x);
        std::fs::remove_file(&y).unwrap();
        assert_eq!(relinked.name_of(&x, &links), None);
        assert_eq!(relinked.name_of(&format!("{d}/z"), &links), None);
    }

    #[test]
    fn a_removed_name_is_unknown_once_the_links_overflowed() {
        let dir = tempfile::tempdir().unwrap();
        let x = format!("{}/x", dir.path().to_str().unwrap());
        let links = TmpfileLinks::default();
        let mut relinked = Relinked::default();
        assert_eq!(locate(&x, false, &links, &relinked), Place::Gone);
        // Not there, but no removal seen: not said deleted (round 11).
        assert_eq!(locate(&x, true, &links, &relinked), Place::Missing);
        for i in 0..=KEPT as u64 {
            relinked.linked(&format!("/w/f{i}"), (1, i));
        }
        assert!(relinked.forgot());
        assert_eq!(locate(&x, false, &links, &relinked), Place::Unknown);
    }

    #[test]
    fn a_rename_removes_its_target_name_and_carries_the_source_s_links() {
        let mut relinked = Relinked::default();
        // link a c; rename b a: the old `a` lives on at c.
        relinked.linked("/w/a", (1, 10));
        relinked.renamed("/w/b", "/w/a");
        assert_eq!(relinked.removed.get("/w/a"), Some(&vec![(1, 10)]));
        // link x y; rename x z: the links are z's file's now.
        relinked.linked("/w/x", (1, 11));
        relinked.renamed("/w/x", "/w/z");
        assert!(!relinked.pending.contains_key("/w/x"));
        assert_eq!(relinked.pending.get("/w/z"), Some(&vec![(1, 11)]));
    }
}
