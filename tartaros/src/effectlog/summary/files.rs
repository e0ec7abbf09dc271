//! Which files a run changed, from the file effect records, joined at the
//! end with the seal's list of final sizes and hashes.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::print::runs_on_host;
use super::table::Table;
use super::{FileChange, MAX_STRING};
use crate::effectlog::show::names;
use crate::effectlog::show::policy::Roots;
use crate::effectlog::show::render::text;

/// Distinct paths tracked; more are counted.
const MAX_FILES: usize = 100_000;
/// Files git runs on the host (hooks, configs) tracked past MAX_FILES: a
/// full table hid a hook written after 100,000 other files.
const MAX_GIT_RUNS: usize = 10_000;
/// Files the tree had before the run, tracked past MAX_FILES: a full
/// table of created decoys hid a rewritten `Makefile`.
const MAX_EXISTING: usize = 10_000;

#[derive(Default)]
pub(super) struct FileState {
    pub(super) created: bool,
    /// Opened with `O_CREAT` but not `O_EXCL`: new or existing, the
    /// record cannot tell.
    maybe_created: bool,
    pub(super) deleted: bool,
    /// One side of a `RENAME_EXCHANGE`: holds what `renamed_from` held.
    exchanged: bool,
    pub(super) actions: Vec<String>,
    pub(super) renamed_from: Option<String>,
    /// Named only by an `O_TMPFILE` open (the kernel's `#<inode>`) and
    /// its writes: a file of no name, which a link's `written_as` folds.
    nameless: bool,
    /// The kernel said the first open with `O_CREAT` created nothing
    /// (the record names the opened file's `ino`): the tree had it.
    existed: bool,
}

/// `__O_TMPFILE`: an open that makes a file with no name.
const O_TMPFILE: u64 = 0o20000000;

/// `renameat2` flags: a rename that replaced nothing, and two that
/// leave both names in place.
const RENAME_NOREPLACE: u64 = 1;
const RENAME_EXCHANGE: u64 = 2;
const RENAME_WHITEOUT: u64 = 4;

/// Paths whose "changes" are not changes to the tree (`> /dev/null`):
/// under `/dev`, `/proc` or `/sys`, unless inside a writable root there
/// (`--write /dev/shm/work`), whose changes are the run's like any other.
fn is_pseudo(path: &str, roots: &Roots) -> bool {
    let special = ["/dev/", "/proc/", "/sys/"]
        .iter()
        .any(|p| path.starts_with(p));
    special && roots.find(path).is_none()
}

#[derive(Default)]
pub(super) struct Files {
    /// A tree of path components: a renamed directory's entries move
    /// with it at once (adversarial round 24b).
    files: Table,
    /// The genesis's writable roots.
    roots: Roots,
    pub(super) more: u64,
}

impl Files {
    pub(super) fn set_roots<'a>(&mut self, roots: impl Iterator<Item = &'a str>) {
        self.roots = Roots::new(roots.map(str::to_string).collect());
    }

    fn file(&mut self, path: &str) -> Option<&mut FileState> {
        self.file_of(path, false)
    }

    /// The entry of `path`; `existing` when the effect shows the tree had
    /// the file (it changes, not creates), which has room past MAX_FILES.
    fn file_of(&mut self, path: &str, existing: bool) -> Option<&mut FileState> {
        if is_pseudo(path, &self.roots) {
            return None;
        }
        if !self.files.contains_key(path) {
            let extra = existing && self.files.len() < MAX_FILES + MAX_EXISTING;
            if !room(self.files.len(), path) && !extra {
                self.more += 1;
                return None;
            }
            self.files.insert(path, FileState::default());
        }
        self.files.get_mut(path)
    }

    pub(super) fn effect(&mut self, kind: &str, t: &Map<String, Value>) {
        let path = t.get("path").and_then(Value::as_str);
        let flags = t.get("flags").and_then(Value::as_u64);
        let (action, creates, deletes) = match kind {
            "open" | "create" => match names::open_action(kind, flags) {
                "read" | "open" => return,
                "create" => ("create".to_string(), true, false),
                a => (a.to_string(), false, false),
            },
            // A write to a file with no name left (unlinked while open,
            // an O_TMPFILE): nothing of it is in the tree. Not one whose
            // file a rename replaced: the name holds the renamed file.
            "write" if flag(t, "deleted") && !flag(t, "replaced") => {
                ("write".to_string(), false, true)
            }
            // Written, then its name here removed, while another link
            // (perhaps outside every root) keeps the file.
            "write" if flag(t, "still_linked") => (
                "write (the file lives on under another name)".to_string(),
                false,
                false,
            ),
            "write" | "truncate" | "chown" | "xattr" | "utime" | "setflags" | "attrib" => {
                (kind.to_string(), false, false)
            }
            "chmod" => match t.get("mode").and_then(Value::as_u64) {
                Some(m) => (format!("chmod {}", names::mode(m)), false, false),
                None => ("chmod".to_string(), false, false),
            },
            "mkdir" | "symlink" | "mknod" => (kind.to_string(), true, false),
            // A pathname unix socket's `bind` makes its file, as mknod
            // makes a FIFO's; an abstract one (`@name`) makes none.
            "bind"
                if t.get("family").and_then(Value::as_str) == Some("unix")
                    && !flag(t, "abstract")
                    && path.is_some_and(|p| p.starts_with('/')) =>
            {
                ("bind".to_string(), true, false)
            }
            "unlink" | "rmdir" => ("delete".to_string(), false, true),
            "rename" | "link" => return self.moved(kind, t),
            _ => return,
        };
        // A name no notification proved (through a link, `..` after one,
        // a name another thread could rewrite): the kernel changed some
        // file, maybe another; the action says so (round 15).
        let action = if flag(t, "claim_unproven") {
            format!("claimed {action}")
        } else {
            action
        };
        let Some(path) = path else {
            return;
        };
        // An O_TMPFILE's writes, named where it was linked: its nameless
        // `#<inode>` entry (its open) is this file, not one of the tree.
        // A name removed after a link (`written_as` too) was a name of the
        // tree: it stays, with whatever was made there since (a symlink,
        // a directory made at the removed name were folded away).
        let nameless = (kind == "write")
            .then(|| t.get("written_as").and_then(Value::as_str))
            .flatten()
            .filter(|w| self.files.get(w).is_some_and(|f| f.nameless))
            .and_then(|w| self.files.remove(w));
        let tmpfile =
            matches!(kind, "open" | "create") && flags.is_some_and(|f| f & O_TMPFILE != 0);
        // The capture names an open's file by the kernel's `ino` only when
        // the open did not create it (`FMODE_CREATED` unset; docs/ebpf.md,
        // "Opens for writing").
        let opened_existing = matches!(kind, "open" | "create")
            && !tmpfile
            && !flag(t, "deleted")
            && t.get("ino").is_some()
            && t.get("path_source").and_then(Value::as_str) == Some("kernel");
        // An open with `O_CREAT` and no `ino` may have made its file.
        let existing = opened_existing || (!creates && !matches!(kind, "open" | "create"));
        let Some(f) = self.file_of(path, existing) else {
            return;
        };
        let fresh = f.actions.is_empty() && !f.created && !f.maybe_created && !f.deleted;
        if opened_existing && fresh {
            f.existed = true;
        }
        if tmpfile {
            f.nameless = f.nameless || f.actions.is_empty();
        } else if kind != "write" {
            f.nameless = false;
        }
        for a in nameless.into_iter().flat_map(|n| n.actions) {
            if !f.actions.contains(&a) && f.actions.len() < 16 {
                f.actions.push(a);
            }
        }
        if creates {
            f.created = true;
            f.deleted = false;
        }
        if matches!(kind, "open" | "create") && flags.is_some_and(|f| f & 0o100 != 0) && !f.existed
        {
            f.maybe_created = true;
        }
        // Links forgotten: the name holds nothing, and where the file
        // went is unknown; not a sign the name exists again. A replaced
        // file's writes come at its writer's exit, after the rename (and
        // whatever followed it) were read: they say nothing of the name now.
        let unknown = ["links_forgotten", "not_found", "replaced"]
            .iter()
            .any(|k| flag(t, k));
        if deletes {
            f.deleted = true;
        } else if !creates && f.deleted && !unknown {
            // Written again after a delete: it exists again.
            f.deleted = false;
            f.created = true;
        }
        if !f.actions.contains(&action) && f.actions.len() < 16 {
            f.actions.push(action);
        }
    }

    /// A rename carries the source's history to the destination (the
    /// write-then-rename of editors and git keeps one entry); a link
    /// creates the destination.
    fn moved(&mut self, kind: &str, t: &Map<String, Value>) {
        let (Some(from), Some(to)) = (
            t.get("from").and_then(Value::as_str),
            t.get("to").and_then(Value::as_str),
        ) else {
            return;
        };
        let flags = t.get("flags").and_then(Value::as_u64).unwrap_or(0);
        if kind == "rename" {
            // A directory's files move with it (they used to stay at the
            // old place, and be shown `deleted` there).
            let (a, b) = (self.files.take_under(from), self.files.take_under(to));
            self.files.put_under(from, to, a);
            if flags & RENAME_EXCHANGE != 0 {
                self.files.put_under(to, from, b);
            } else {
                // Entries below a destination that was a file or an empty
                // directory: none of them is in the tree now. Dropping
                // them hid deletions (`rm e/f; rmdir e; mkdir n; mv n e`
                // had no line naming `e/f`).
                self.files.gone_below(to, b);
            }
        }
        if kind == "rename" && flags & RENAME_EXCHANGE != 0 {
            return self.exchanged(from, to);
        }
        let old = if kind == "rename" {
            self.files.remove(from)
        } else {
            None
        };
        // A whiteout is a character device (0, 0) left at the old name.
        if kind == "rename"
            && flags & RENAME_WHITEOUT != 0
            && let Some(f) = self.file(from)
        {
            f.created = true;
            f.actions.push("whiteout".to_string());
        }
        if kind == "link" {
            let Some(f) = self.file(to) else {
                return;
            };
            f.deleted = false;
            f.created = true;
            if !f.actions.iter().any(|a| a == "link") {
                f.actions.push("link".to_string());
            }
            return;
        }
        // The destination's entry is what the name held before: the
        // rename replaced it, and the file there is the source's.
        let prior = self.files.remove(to);
        let mut moved = old.unwrap_or_default();
        moved.deleted = false;
        if !moved.created && moved.renamed_from.is_none() {
            moved.renamed_from = Some(from.to_string());
        }
        push(&mut moved.actions, "rename");
        if let Some(prior) = prior {
            // RENAME_NOREPLACE succeeded: the name held nothing.
            if prior.deleted || flags & RENAME_NOREPLACE != 0 {
                // Deleted before the rename: its history stays the name's.
                let mut actions = prior.actions;
                for a in moved.actions {
                    push(&mut actions, &a);
                }
                moved.actions = actions;
            } else {
                // A file of the tree renamed to `to` earlier is gone now:
                // no other entry would name it (`mv x b; mv a b`).
                if !prior.created
                    && let Some(origin) = prior.renamed_from
                {
                    self.replaced(&origin, prior.actions);
                }
                push(&mut moved.actions, "replaced");
            }
        }
        if let Some(f) = self.file(to) {
            *f = moved;
        }
    }

    /// The tree's file first named `origin` was replaced by a rename at
    /// the name it had moved to.
    fn replaced(&mut self, origin: &str, mut actions: Vec<String>) {
        push(&mut actions, "replaced");
        let fresh = !self.files.contains_key(origin);
        if let Some(f) = self.file(origin) {
            if fresh {
                f.deleted = true;
                f.actions = actions;
            } else {
                push(&mut f.actions, "replaced");
            }
        }
    }

    /// A `RENAME_EXCHANGE`: each name now holds the other's file and its
    /// history; neither is gone.
    fn exchanged(&mut self, a: &str, b: &str) {
        let old_a = self.files.remove(a).unwrap_or_default();
        let old_b = self.files.remove(b).unwrap_or_default();
        for (name, other, mut f) in [(a, b, old_b), (b, a, old_a)] {
            f.exchanged = true;
            f.deleted = false;
            f.renamed_from = Some(f.renamed_from.unwrap_or_else(|| other.to_string()));
            if !f.actions.iter().any(|x| x == "exchange") {
                f.actions.push("exchange".to_string());
            }
            if let Some(slot) = self.file(name) {
                *slot = f;
            }
        }
    }

    /// The changes with the seal's sizes and hashes, and the count of
    /// paths that did not fit. Ordered by what a reviewer must see first,
    /// then by path: what git runs on the host; files the tree had before
    /// the run (modified, truncated, chmod'ed, renamed, deleted: those an
    /// agent hid behind created decoys); `written` ones (created or
    /// changed, the record cannot tell) and `seal-only` ones; files the
    /// run created. Alphabetical alone put 31 created `.a10`… before a
    /// rewritten `Makefile` (adversarial round 20).
    pub(super) fn finish(mut self, seal_files: Vec<Value>) -> (Vec<FileChange>, u64) {
        let mut sealed: BTreeMap<String, Sealed> = BTreeMap::new();
        for f in seal_files {
            if let Some(path) = f.get("path").and_then(Value::as_str) {
                let s = |k: &str| f.get(k).and_then(Value::as_str).map(|h| text(h, 128));
                let entry = Sealed {
                    size: f.get("size").and_then(Value::as_u64),
                    sha256: s("sha256"),
                    skipped: s("skipped"),
                };
                sealed.insert(path.to_string(), entry);
            }
        }
        let mut files: Vec<(u8, FileChange)> = Vec::new();
        let mut seen = BTreeSet::new();
        for (path, f) in std::mem::take(&mut self.files).into_sorted() {
            let change = if f.deleted {
                "deleted"
            } else if f.created {
                "created"
            } else if f.exchanged {
                "exchanged"
            } else if f.renamed_from.is_some() {
                "renamed"
            } else if f.maybe_created {
                "written"
            } else {
                "modified"
            };
            let s = sealed.get(&path).cloned().unwrap_or_default();
            seen.insert(path.clone());
            let rank = if runs_on_host(&path) {
                0
            } else if !f.created && !f.maybe_created {
                // Not made by the run: the tree's own file changed.
                1
            } else if f.created {
                3
            } else {
                2
            };
            files.push((
                rank,
                FileChange {
                    path: text(&path, MAX_STRING),
                    change,
                    actions: f.actions,
                    renamed_from: f.renamed_from.map(|p| text(&p, MAX_STRING)),
                    size: s.size,
                    sha256: s.sha256,
                    skipped: s.skipped,
                },
            ));
        }
        for (path, s) in sealed {
            if !seen.contains(&path) && room(files.len(), &path) {
                let rank = if runs_on_host(&path) { 0 } else { 2 };
                files.push((
                    rank,
                    FileChange {
                        path: text(&path, MAX_STRING),
                        change: "seal-only",
                        actions: Vec::new(),
                        renamed_from: None,
                        size: s.size,
                        sha256: s.sha256,
                        skipped: s.skipped,
                    },
                ));
            }
        }
        files.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
        let files = files.into_iter().map(|(_, f)| f).collect();
        (files, self.more)
    }
}

/// Whether the record's target says `key: true`.
fn flag(t: &Map<String, Value>, key: &str) -> bool {
    t.get(key).and_then(Value::as_bool) == Some(true)
}

/// Whether a table of `len` files takes `path`.
fn room(len: usize, path: &str) -> bool {
    len < MAX_FILES || (len < MAX_FILES + MAX_GIT_RUNS && runs_on_host(path))
}

/// Adds `action` to a file's actions once (bounded, as `effect` is).
pub(super) fn push(actions: &mut Vec<String>, action: &str) {
    if !actions.iter().any(|a| a == action) && actions.len() < 16 {
        actions.push(action.to_string());
    }
}

/// What the seal says of one file.
#[derive(Clone, Default)]
struct Sealed {
    size: Option<u64>,
    sha256: Option<String>,
    skipped: Option<String>,
}

#[cfg(test)]
mod tests_r24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_paths_are_those_outside_the_roots() {
        let roots = Roots::new(vec!["/dev/shm/work".to_string(), "/w".to_string()]);
        assert!(is_pseudo("/dev/null", &roots));
        assert!(is_pseudo("/proc/self/fd/1", &roots));
        assert!(is_pseudo("/dev/shm/workshop/x", &roots));
        assert!(!is_pseudo("/dev/shm/work/x", &roots));
        assert!(!is_pseudo("/dev/shm/work", &roots));
        assert!(!is_pseudo("/w/dev/null", &roots));
        assert!(!is_pseudo("/devices/x", &Roots::default()));
    }

    #[test]
    fn a_replaced_file_s_writes_do_not_remove_the_name() {
        let t = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        let mut files = Files::default();
        files.effect(
            "create",
            &t(serde_json::json!({"path": "/w/a", "flags": 0o301})),
        );
        files.effect(
            "create",
            &t(serde_json::json!({"path": "/w/b", "flags": 0o301})),
        );
        files.effect(
            "rename",
            &t(serde_json::json!({"from": "/w/b", "to": "/w/a"})),
        );
        // At the writer's exit: the replaced file's, then the renamed one's.
        let gone = serde_json::json!({"path": "/w/a", "deleted": true, "replaced": true});
        files.effect("write", &t(gone));
        files.effect("write", &t(serde_json::json!({"path": "/w/a"})));
        // A name removed later stays removed.
        files.effect(
            "create",
            &t(serde_json::json!({"path": "/w/c", "flags": 0o301})),
        );
        files.effect("unlink", &t(serde_json::json!({"path": "/w/c"})));
        let late = serde_json::json!({"path": "/w/c", "deleted": true, "replaced": true});
        files.effect("write", &t(late));
        let (out, _) = files.finish(Vec::new());
        let change = |p: &str| out.iter().find(|f| f.path == p).map(|f| f.change);
        assert_eq!(change("/w/a"), Some("created"));
        assert_eq!(change("/w/c"), Some("deleted"));
    }
}
