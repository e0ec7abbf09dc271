//! Placing the kernel's notifications: which belong to the sandbox (by
//! thread), and where their entries are (directory handle to path). Host
//! facts come through [`Facts`], so the rules are unit-tested.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::dir_cache::DirCache;
use super::join::{Join, Notice, Task, bit};
use super::notify::{DirEntry, Handle, RawEvent};
use crate::effectlog::Record;
use crate::effectlog::names::{display, display_path};

/// How long a thread found outside the sandbox is not looked up again
/// (a pid is not reused that fast; a sandbox thread is in the cgroup from
/// its first instruction, so the verdict cannot change while it lives).
const HOST_VERDICT_NS: u64 = 1_000_000_000;
/// Bound of the thread-verdict cache.
const CACHE_ENTRIES: usize = 16_384;
/// Bound of the exec opens outside the roots kept for threads gone
/// before they could be placed (a busy host's short-lived processes
/// queue them too, until the ring shows no record will name them).
const GONE_EXEC_OPENS: usize = 4_096;

/// Membership of a thread in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Member {
    Sandbox(Task),
    Host,
    /// Exited before it could be looked up.
    Gone,
}

/// What the host says about threads and directory handles.
pub(super) trait Facts {
    fn member(&self, tid: u32) -> Member;
    /// The path of a directory handle now; `None` when it is gone.
    fn resolve(&self, dir: &Handle) -> Option<PathBuf>;
    /// The monotonic time now, once the threads of a read are looked up.
    fn now_ns(&self) -> u64 {
        crate::effectlog::mono_now_ns()
    }
}

pub(super) struct Placement {
    pub join: Join,
    pub roots: Vec<PathBuf>,
    /// Regular files the agent inherits as its standard streams (outside
    /// the roots, say the harness's output file): a short-lived thread's
    /// write there is kept like a change in a root.
    pub inherited: Vec<PathBuf>,
    /// Notifications lost (queue overflow, failed reads), for a gap.
    pub lost: u64,
    host: HashMap<u32, u64>,
    dirs: DirCache,
    /// Notifications of threads that were gone before they could be
    /// placed, in queue order: placed when a record names the thread.
    /// Changes in the roots wait for the end; an exec open outside them
    /// (the interpreter, `ld.so`: what tells a script from a program)
    /// waits until the ring has been read past the time its thread was
    /// found gone (`Some`), by when every record of a sandbox thread is.
    unplaced: Vec<(Notice, Option<u64>)>,
}

impl Placement {
    pub fn new(join: Join, roots: Vec<PathBuf>) -> Self {
        Self {
            join,
            roots,
            inherited: Vec::new(),
            lost: 0,
            host: HashMap::new(),
            dirs: DirCache::default(),
            unplaced: Vec::new(),
        }
    }

    /// Places one read of notifications (read at `now`, the read before
    /// it started at `after`); returns the `write` records they complete.
    pub fn place(
        &mut self,
        events: Vec<RawEvent>,
        now: u64,
        after: u64,
        facts: &dyn Facts,
    ) -> Vec<Record> {
        let out = Vec::new();
        let mut gone_exec_opens = Vec::new();
        self.dirs.next_read();
        for event in &events {
            if event.mask & bit::OVERFLOW != 0 {
                // Renames were lost with it: the cache is no longer at
                // the stream's position.
                self.lost += 1;
                self.dirs.clear();
                continue;
            }
            let dir_change =
                event.mask & bit::ONDIR != 0 && event.mask & (bit::RENAME | bit::DELETE) != 0;
            if event.entry.is_none() && event.mask & !(bit::ATTRIB | bit::ONDIR) == 0 {
                // An inode change with no directory entry: the link count
                // of a file being linked or unlinked, whose link / unlink
                // is reported with its entry.
                continue;
            }
            let known = self.join.task(event.tid);
            let cached_host = self.host.get(&event.tid).is_some_and(|&until| until > now);
            // A host verdict is not trusted for a change in a root: the
            // agent can cycle the host's pids (32,768 here) until a thread
            // of its own gets a host thread's tid within the second, and
            // the record naming it may come after its first changes.
            if known.is_none() && cached_host && !self.in_roots(event, facts) {
                if dir_change {
                    self.follow_host_dir_change(event, facts);
                }
                continue;
            }
            let member = match known {
                Some(task) => Member::Sandbox(task),
                None => facts.member(event.tid),
            };
            match member {
                Member::Host => {
                    if dir_change {
                        self.follow_host_dir_change(event, facts);
                    }
                    if self.host.len() >= CACHE_ENTRIES {
                        self.host.retain(|_, until| *until > now);
                    }
                    self.host.insert(event.tid, now + HOST_VERDICT_NS);
                }
                Member::Sandbox(task) => {
                    self.join.add_task(event.tid, task);
                    let n = self.notice(event, now, after, facts);
                    self.join.notice(n, task);
                }
                Member::Gone => {
                    let n = self.notice(event, now, after, facts);
                    let in_roots = n.raw.as_deref().is_some_and(|p| {
                        self.roots.iter().any(|r| p.starts_with(r))
                            || self.inherited.iter().any(|f| p == f.as_path())
                    });
                    if in_roots {
                        self.unplaced.push((n, None));
                    } else if n.mask & bit::OPEN_EXEC != 0 {
                        // Dropped, a gone script's interpreter left its
                        // exec record with no `script` (the nested script
                        // of a busy run: log_round9_exec_race.rs).
                        let mut n = n;
                        n.mask = bit::OPEN_EXEC;
                        gone_exec_opens.push(self.unplaced.len());
                        self.unplaced.push((n, Some(0)));
                    }
                }
            }
        }
        if !gone_exec_opens.is_empty() {
            // Every gone thread of this read had exited by now.
            let gone_ns = facts.now_ns();
            for at in gone_exec_opens {
                self.unplaced[at].1 = Some(gone_ns);
            }
            let kept = self.unplaced.iter().filter(|(_, g)| g.is_some()).count();
            let mut over = kept.saturating_sub(GONE_EXEC_OPENS);
            self.unplaced.retain(|(_, g)| {
                let drop = over > 0 && g.is_some();
                over -= usize::from(drop);
                !drop
            });
        }
        // A thread that was gone may have been named by a record since.
        let unplaced = std::mem::take(&mut self.unplaced);
        for (n, gone_ns) in unplaced {
            match self.join.task(n.tid) {
                Some(task) => self.join.notice(n, task),
                None => self.unplaced.push((n, gone_ns)),
            }
        }
        out
    }

    /// The ring has been read up to a record of `mono_ns`: an exec open
    /// outside the roots of a thread found gone before then, that no
    /// record named, was a host thread's.
    pub fn ring_read_to(&mut self, mono_ns: u64) {
        self.unplaced
            .retain(|(_, gone_ns)| gone_ns.is_none_or(|g| g >= mono_ns));
    }

    /// At the end: the notifications still unplaced are logged as the
    /// thread's (`pid_unverified`), then everything the join holds.
    pub fn finish(&mut self, now: u64) -> Vec<Record> {
        let mut out = Vec::new();
        for (n, gone_ns) in std::mem::take(&mut self.unplaced) {
            if gone_ns.is_some() {
                continue;
            }
            let task = self.join.task(n.tid).unwrap_or(Task {
                tgid: n.tid,
                ppid: 0,
                uid: 0,
            });
            self.join.notice(n, task);
        }
        out.extend(self.join.finish(now));
        out
    }

    /// Whether `event` changes an entry in a root (or an inherited file).
    fn in_roots(&mut self, event: &RawEvent, facts: &dyn Facts) -> bool {
        let paths: Vec<PathBuf> = [&event.entry, &event.new_entry]
            .into_iter()
            .flatten()
            .filter_map(|e| self.entry_path(e, facts))
            .collect();
        paths.iter().any(|p| {
            self.roots.iter().any(|r| p.starts_with(r)) || self.inherited.iter().any(|f| p == f)
        })
    }

    fn notice(&mut self, event: &RawEvent, now: u64, after: u64, facts: &dyn Facts) -> Notice {
        let (raw, name) = match &event.entry {
            Some(entry) => (self.entry_path(entry, facts), display(&entry.name)),
            None => (None, String::new()),
        };
        let new_raw = event
            .new_entry
            .as_ref()
            .and_then(|e| self.entry_path(e, facts));
        self.follow_dir_change(event, raw.as_deref(), new_raw.as_deref());
        Notice {
            tid: event.tid,
            mask: event.mask,
            claimed: 0,
            path: raw.as_deref().map(display_path),
            name,
            new_path: new_raw.as_deref().map(display_path),
            raw,
            new_raw,
            read_ns: now,
            after_ns: after,
        }
    }

    /// The cached paths below a moved or removed directory follow it, at
    /// this point of the stream (dir_cache.rs); a host's as well (a busy
    /// host renames directories all the time, on the roots' filesystem).
    /// A directory removed from a directory already gone (`rm -r` of a
    /// tree, read late) leaves only paths below gone directories: nothing
    /// to move.
    fn follow_dir_change(&mut self, event: &RawEvent, raw: Option<&Path>, new: Option<&Path>) {
        if event.mask & bit::ONDIR == 0 {
            return;
        }
        match (event.mask & bit::RENAME != 0, raw, new) {
            (true, Some(from), Some(to)) => self.dirs.renamed(from, to, event.tid),
            (true, _, _) => self.dirs.clear(),
            _ => {}
        }
        if event.mask & bit::DELETE != 0
            && let Some(path) = raw
        {
            self.dirs.removed(path);
        }
    }

    fn follow_host_dir_change(&mut self, event: &RawEvent, facts: &dyn Facts) {
        let raw = event.entry.as_ref().and_then(|e| self.entry_path(e, facts));
        let new_raw = event
            .new_entry
            .as_ref()
            .and_then(|e| self.entry_path(e, facts));
        self.follow_dir_change(event, raw.as_deref(), new_raw.as_deref());
    }

    fn entry_path(&mut self, entry: &DirEntry, facts: &dyn Facts) -> Option<PathBuf> {
        let dir = match self.dirs.get(&entry.dir) {
            Some(dir) => dir.clone(),
            None => {
                let dir = facts.resolve(&entry.dir);
                self.dirs.insert(entry.dir.clone(), dir.clone());
                dir
            }
        }?;
        if entry.name.is_empty() || entry.name == b"." {
            return Some(dir);
        }
        Some(dir.join(std::ffi::OsStr::from_bytes(&entry.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::cell::Cell;

    /// tid 10: the sandbox; 20: the host; 30: gone. Handle [1]: /w, [2]:
    /// a deleted directory.
    struct Fake {
        lookups: Cell<u32>,
    }

    impl Facts for Fake {
        fn member(&self, tid: u32) -> Member {
            self.lookups.set(self.lookups.get() + 1);
            match tid {
                10 => Member::Sandbox(Task {
                    tgid: 10,
                    ppid: 1,
                    uid: 65534,
                }),
                20 => Member::Host,
                _ => Member::Gone,
            }
        }
        fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
            match dir.bytes.as_slice() {
                [1] => Some(PathBuf::from("/w")),
                [3] => Some(PathBuf::from("/usr/bin")),
                _ => None,
            }
        }
        fn now_ns(&self) -> u64 {
            50
        }
    }

    fn event(tid: u32, mask: u64, dir: u8, name: &str) -> RawEvent {
        RawEvent {
            mask,
            tid,
            entry: Some(DirEntry {
                dir: Handle {
                    fsid: [0, 0],
                    handle_type: 1,
                    bytes: vec![dir],
                },
                name: name.as_bytes().to_vec(),
            }),
            new_entry: None,
        }
    }

    fn placement() -> Placement {
        Placement::new(Join::new(0), vec![PathBuf::from("/w")])
    }

    /// The sandbox thread 10, with handle [1] resolving to a real directory.
    struct OnDisk(PathBuf);

    impl Facts for OnDisk {
        fn member(&self, _: u32) -> Member {
            Member::Sandbox(Task {
                tgid: 10,
                ppid: 1,
                uid: 65534,
            })
        }
        fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
            (dir.bytes == [1]).then(|| self.0.clone())
        }
    }

    #[test]
    fn a_deleted_file_s_writes_get_no_size() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        // Both exist now; `again` is a new file under the deleted name.
        std::fs::write(root.join("kept"), b"12345").unwrap();
        std::fs::write(root.join("again"), b"123").unwrap();
        let mut p = Placement::new(Join::new(0), vec![root.clone()]);
        let events = vec![
            event(10, bit::MODIFY, 1, "kept"),
            event(10, bit::MODIFY, 1, "again"),
            event(10, bit::DELETE, 1, "again"),
            event(10, bit::CREATE, 1, "again"),
        ];
        let mut out = p.place(events, 100, 0, &OnDisk(root.clone()));
        out.extend(p.finish(100 + 10_000_000_000));
        let size = |name: &str| {
            let path = Value::from(root.join(name).to_string_lossy().into_owned());
            let r = out
                .iter()
                .find(|r| r.kind == "write" && r.target.get("path") == Some(&path))
                .unwrap_or_else(|| panic!("no write record of {name}: {out:?}"));
            r.target.get("size").cloned()
        };
        assert_eq!(size("kept"), Some(Value::from(5)));
        assert_eq!(size("again"), None, "the size would be the new file's");
    }

    /// Outside the roots (handle [2] resolves to nothing); a host change
    /// in a root is looked up every time (round 9: a reused tid).
    #[test]
    fn host_threads_are_dropped_and_looked_up_once_a_second() {
        let facts = Fake {
            lookups: Cell::new(0),
        };
        let mut p = placement();
        let events = vec![
            event(20, bit::CREATE, 2, "a"),
            event(20, bit::CREATE, 2, "b"),
        ];
        assert!(p.place(events, 100, 0, &facts).is_empty());
        assert_eq!(facts.lookups.get(), 1, "the verdict is cached");
        p.place(
            vec![event(20, bit::CREATE, 2, "c")],
            100 + HOST_VERDICT_NS + 1,
            0,
            &facts,
        );
        assert_eq!(facts.lookups.get(), 2, "and expires");
        p.place(vec![event(20, bit::CREATE, 1, "d")], 101, 0, &facts);
        assert_eq!(facts.lookups.get(), 3, "in a root, not cached");
        assert!(p.finish(10).is_empty(), "nothing of the host is logged");
    }

    /// tid 20 is a host thread, then (its pid reused within the second)
    /// a sandbox thread: its change in a root is not dropped on the cached
    /// verdict, nor is a host change outside the roots looked up again.
    struct Reused {
        lookups: Cell<u32>,
        reused: Cell<bool>,
    }

    impl Facts for Reused {
        fn member(&self, _: u32) -> Member {
            self.lookups.set(self.lookups.get() + 1);
            if self.reused.get() {
                Member::Sandbox(Task {
                    tgid: 20,
                    ppid: 1,
                    uid: 65534,
                })
            } else {
                Member::Host
            }
        }
        fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
            match dir.bytes.as_slice() {
                [1] => Some(PathBuf::from("/w")),
                [3] => Some(PathBuf::from("/elsewhere")),
                _ => None,
            }
        }
    }

    #[test]
    fn a_host_verdict_does_not_hide_a_reused_tid_s_change_in_a_root() {
        let facts = Reused {
            lookups: Cell::new(0),
            reused: Cell::new(false),
        };
        let mut p = placement();
        p.place(vec![event(20, bit::CREATE, 3, "host")], 100, 0, &facts);
        p.place(vec![event(20, bit::CREATE, 3, "host2")], 150, 100, &facts);
        assert_eq!(facts.lookups.get(), 1, "outside the roots: cached");
        facts.reused.set(true);
        p.place(vec![event(20, bit::CREATE, 1, "agent")], 200, 150, &facts);
        let out = p.finish(300 + 10_000_000_000);
        assert!(
            out.iter()
                .any(|r| r.target.get("path").and_then(Value::as_str) == Some("/w/agent")),
            "{out:?}"
        );
        assert!(
            out.iter()
                .all(|r| r.target.get("path").and_then(Value::as_str) != Some("/elsewhere/host")),
            "{out:?}"
        );
    }

    #[test]
    fn a_gone_thread_is_placed_by_a_later_record_or_logged_unverified() {
        let facts = Fake {
            lookups: Cell::new(0),
        };
        let mut p = placement();
        p.place(
            vec![
                event(30, bit::CREATE, 1, "in-root"),
                event(31, bit::CREATE, 1, "unknown"),
            ],
            5,
            0,
            &facts,
        );
        // A fork record names 30 after the fact.
        let fork = record("fork", 9, "child", Value::from(30));
        p.join.learn(&[fork]);
        p.place(Vec::new(), 6, 5, &facts);
        let out = p.finish(7);
        let by_path = |path: &str| {
            out.iter()
                .find(|r| r.target.get("path").and_then(Value::as_str) == Some(path))
                .unwrap_or_else(|| panic!("no record for {path}: {out:?}"))
        };
        let placed = by_path("/w/in-root");
        assert_eq!(placed.pid, 30);
        assert_eq!(placed.target.get("pid_unverified"), None);
        let unknown = by_path("/w/unknown");
        assert_eq!(
            unknown.target.get("pid_unverified"),
            Some(&Value::from(true))
        );
    }

    fn record(kind: &'static str, pid: u32, key: &'static str, value: Value) -> Record {
        let mut target = crate::effectlog::Target::new();
        target.insert(key, value);
        Record {
            kind,
            pid,
            ppid: 9,
            uid: 65534,
            mono_ns: 40,
            wall_ns: 40,
            decision: crate::effectlog::Decision::Allowed,
            errno: 0,
            target,
        }
    }

    /// A nested script's exec opens, read once its thread had exited and
    /// before a record named it (a busy run): its interpreter, outside the
    /// roots, was dropped, and the record then had no `script`.
    #[test]
    fn a_gone_thread_s_interpreter_open_still_names_its_script() {
        let facts = Fake {
            lookups: Cell::new(0),
        };
        let mut p = placement();
        let events = vec![
            event(30, bit::OPEN_EXEC, 1, "outer.sh"),
            event(30, bit::OPEN_EXEC, 1, "inner.sh"),
            event(30, bit::OPEN_EXEC, 3, "dash"),
            // A host thread's exec, gone too, that no record names.
            event(31, bit::OPEN_EXEC, 3, "true"),
        ];
        p.place(events, 5, 0, &facts);
        let exec = record("exec", 30, "binary", Value::from("/usr/bin/dash"));
        p.join.learn(std::slice::from_ref(&exec));
        p.place(Vec::new(), 60, 5, &facts);
        let joined = p.join.join(vec![exec], 60);
        let named = joined.iter().find(|r| r.kind == "exec").unwrap();
        assert_eq!(
            named.target.get("script"),
            Some(&Value::from("/w/outer.sh")),
            "{named:?}"
        );
        // The ring read past the time 31 was found gone: no record will
        // name it, its open is not kept.
        assert_eq!(p.unplaced.len(), 1);
        p.ring_read_to(49);
        assert_eq!(p.unplaced.len(), 1, "a record of 31 may still come");
        p.ring_read_to(51);
        assert!(p.unplaced.is_empty());
    }

    #[test]
    fn gone_threads_outside_the_roots_and_link_counts_are_not_logged() {
        let facts = Fake {
            lookups: Cell::new(0),
        };
        let mut p = placement();
        let mut link_count = event(10, bit::ATTRIB, 1, "x");
        link_count.entry = None;
        p.place(
            vec![event(31, bit::CREATE, 2, "elsewhere"), link_count],
            5,
            0,
            &facts,
        );
        assert!(p.finish(6).is_empty());
    }

    #[test]
    fn an_overflow_is_counted_as_lost() {
        let facts = Fake {
            lookups: Cell::new(0),
        };
        let mut p = placement();
        let mut overflow = event(0, bit::OVERFLOW, 1, "");
        overflow.entry = None;
        p.place(vec![overflow], 1, 0, &facts);
        assert_eq!(p.lost, 1);
    }
}
