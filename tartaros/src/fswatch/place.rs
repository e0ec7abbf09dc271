//! Placing the kernel's notifications: which belong to the sandbox (by
//! thread), and where their entries are (directory handle to path). Host
//! facts come through [`Facts`], so the rules are unit-tested.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::dir_cache::DirCache;
use super::join::{Join, Notice, Task, bit};
use super::notify::{DirEntry, Handle, RawEvent};
use super::rewind::Rewind;
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
/// Reads ahead allowed while placing one read (each after a directory
/// handle's lookup; see [`Placement::read_ahead`]).
const READS_AHEAD: usize = 4_096;
/// No read ahead while this many notifications wait to be placed: a busy
/// host's backlog is not pulled into memory a batch per lookup (each read
/// takes up to `READ_BATCH_BYTES`); the lookups are then uncovered.
const QUEUED_AHEAD: usize = 16_384;

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
    /// What was queued since the last read, and whether more may be
    /// waiting; `None` when this host cannot read ahead.
    fn read_ahead(&self) -> Option<std::io::Result<(Vec<RawEvent>, bool)>> {
        None
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
    /// The directory renames of the read being placed, and the position
    /// in it, to take paths looked up now back to it (`rewind.rs`).
    rewind: Rewind,
    at: usize,
    /// The read's notifications not placed yet, each with when it was
    /// read; how many were read; how many reads ahead were made.
    queue: std::collections::VecDeque<(RawEvent, u64)>,
    seen: usize,
    reads_ahead: usize,
    /// The last read ahead said more may be waiting.
    pub more_ahead: bool,
    /// Sandbox notifications whose path could not be taken back to their
    /// place in the stream: a gap of their own (`verify`: incomplete).
    pub unsure: u64,
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
            rewind: Rewind::default(),
            at: 0,
            queue: std::collections::VecDeque::new(),
            seen: 0,
            reads_ahead: 0,
            more_ahead: false,
            unsure: 0,
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
        self.rewind = Rewind::new(&events);
        self.seen = events.len();
        self.reads_ahead = 0;
        self.more_ahead = false;
        self.queue = events.into_iter().map(|e| (e, now)).collect();
        let mut at = 0;
        while let Some((event, read_ns)) = self.queue.pop_front() {
            let event = &event;
            self.at = at;
            at += 1;
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
            // A thread of a process whose exit was joined before the read
            // before this one started had every notification read by then:
            // one of its tid now is another thread's, perhaps the host's
            // (the agent wraps pids in seconds), and is looked up again.
            let known = self.join.task(event.tid).filter(|t| {
                self.join
                    .exited
                    .get(&t.tgid)
                    .is_none_or(|(_, joined)| *joined >= after)
            });
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
                    let n = self.notice(event, read_ns, after, facts);
                    self.join.notice(n, task);
                }
                Member::Gone => {
                    let n = self.notice(event, read_ns, after, facts);
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
            Some(entry) => (self.sandbox_entry_path(entry, facts), display(&entry.name)),
            None => (None, String::new()),
        };
        let new_raw = event
            .new_entry
            .as_ref()
            .and_then(|e| self.sandbox_entry_path(e, facts));
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
            fid: event.fid.clone(),
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
            (true, Some(from), Some(to)) => self.dirs.renamed_at(from, to, event.tid, self.at),
            (true, _, _) => self.dirs.clear(),
            _ => {}
        }
        for path in self.dirs.take_unsure() {
            let path = Path::new(std::ffi::OsStr::from_bytes(&path));
            self.unsure += u64::from(self.roots.iter().any(|r| path.starts_with(r)));
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

    /// [`Self::entry_path`] of a sandbox notification (or a gone
    /// thread's), counted when its path in a root could not be taken back
    /// to its place.
    fn sandbox_entry_path(&mut self, entry: &DirEntry, facts: &dyn Facts) -> Option<PathBuf> {
        let (path, sure) = self.entry_path_at(entry, facts);
        let in_roots = |p: &PathBuf| self.roots.iter().any(|r| p.starts_with(r));
        self.unsure += u64::from(!sure && path.as_ref().is_some_and(in_roots));
        path
    }

    fn entry_path(&mut self, entry: &DirEntry, facts: &dyn Facts) -> Option<PathBuf> {
        self.entry_path_at(entry, facts).0
    }

    /// The entry's path at the notification being placed, and whether it
    /// is certain. A directory looked up in this read has the disk's path
    /// after the whole read; it is taken back through the read's later
    /// directory renames (`rewind.rs`).
    fn entry_path_at(&mut self, entry: &DirEntry, facts: &dyn Facts) -> (Option<PathBuf>, bool) {
        let (dir, now, seen) = match self.dirs.get_with_read(&entry.dir) {
            Some((dir, now, seen)) => (dir.clone(), now, seen),
            None => {
                let dir = facts.resolve(&entry.dir);
                let seen = self.seen;
                self.dirs.insert(entry.dir.clone(), dir.clone(), seen);
                if dir.is_some() && self.read_ahead(facts) {
                    self.dirs.cover();
                }
                (dir, true, seen)
            }
        };
        let Some(mut dir) = dir else {
            return (None, true);
        };
        let mut sure = true;
        if now {
            let alive = || facts.resolve(&entry.dir).is_some();
            // A handle not looked up in this read is at the stream's place.
            let dirs = &self.dirs;
            let at_stream = |h: &Handle| match dirs.get_with_read(h) {
                Some((path, false, _)) => path.clone(),
                _ => None,
            };
            match self.rewind.back_to_looked_up(
                self.at,
                dir.clone(),
                super::rewind::Lookup {
                    handle: Some(&entry.dir),
                    seen,
                },
                &alive,
                &at_stream,
                facts,
            ) {
                Ok(back) => dir = back,
                Err(_) => sure = false,
            }
        }
        if entry.name.is_empty() || entry.name == b"." {
            return (Some(dir), sure);
        }
        (
            Some(dir.join(std::ffi::OsStr::from_bytes(&entry.name))),
            sure,
        )
    }
}

impl Placement {
    /// Reads what was queued since the read being placed, right after a
    /// directory handle was looked up: the lookup has the disk's path,
    /// with every rename queued before it, and those queued after the read
    /// ended were not in hand to take it back through (a rename of the
    /// next read might have come before or after the lookup: a gap, and
    /// `mv x$i o$i` named `x$i`'s files `o$i/...`). Read now, they are:
    /// appended to this read, placed in turn, and taken back through.
    /// Whether the queue was read empty (every notification queued before
    /// the lookup is now in hand).
    fn read_ahead(&mut self, facts: &dyn Facts) -> bool {
        if self.reads_ahead >= READS_AHEAD || self.queue.len() >= QUEUED_AHEAD {
            return false;
        }
        self.reads_ahead += 1;
        let (events, more) = match facts.read_ahead() {
            None => return false,
            Some(Err(e)) => {
                eprintln!("tartaros: failed to read file notifications: {e}");
                self.lost += 1;
                return false;
            }
            Some(Ok(read)) => read,
        };
        let read_ns = facts.now_ns();
        self.rewind.extend(self.seen, &events);
        self.seen += events.len();
        self.queue.extend(events.into_iter().map(|e| (e, read_ns)));
        self.more_ahead = more;
        !more
    }
}

#[cfg(test)]
#[path = "place_tests.rs"]
mod tests;
