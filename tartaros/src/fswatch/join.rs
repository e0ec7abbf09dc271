//! The join of the capture's records (what the agent asked for, with the
//! kernel's verdict) with the kernel's file notifications (what changed,
//! named from the kernel's own objects). Pure: host facts (which thread is
//! in the sandbox, what a handle resolves to) are settled by the caller.
//!
//! Why it can be exact: a notification is queued inside the syscall that
//! caused it, before that syscall's exit record is written to the ring, and
//! one thread's records and one thread's notifications are each in that
//! thread's program order. So when the supervisor reads the notifications
//! after receiving a record, the record's own notification is already
//! there, and pairing the i-th record of a thread with the i-th
//! notification of that thread (of the matching kind) is the kernel's own
//! pairing. See docs/ebpf.md, "Kernel-sourced paths".

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::claims::{Call, Claim, Pick, unproven};
use super::exec_opens::ExecOpens;
use super::notify::FidProbe;
pub(super) use super::pairing::{Notice, Task, bit, wanted};
use super::pairing::{
    apply, is_file_kind, kernel_named, made_and_removed, main_key, named_pairs, wanted_of,
};
use super::queue::Queue;
use super::relinked::{Place, Relinked};
use super::tmpfile_links::TmpfileLinks;
use super::touched::Touched;
use super::writes::WriteCounts;
use crate::effectlog::{Decision, Record, names};

/// `renameat2`'s flag that swaps the two names' files.
const RENAME_EXCHANGE: u64 = 2;
/// How long a record waits for its thread to move on before it is paired
/// by position (a thread that blocks after one create).
const HOLD_NS: u64 = 200_000_000;
/// How long an unclaimed notification waits for a record that claims it.
const ORPHAN_NS: u64 = 1_000_000_000;

/// The join's state for one run.
#[derive(Debug, Default)]
pub(super) struct Join {
    tasks: HashMap<u32, Task>,
    /// Sandbox notifications with bits no record has claimed, per thread.
    pending: HashMap<u32, Queue>,
    /// Records waiting for a positional pairing, in arrival order, with
    /// when their call began at the earliest.
    held: Vec<(u32, Record, u64)>,
    /// Threads a record of which could not be told from another call's
    /// (`claims.rs`): their records are their claims, their notifications
    /// records of their own.
    racy: BTreeSet<u32>,
    /// Every notification queued before this was read.
    read_through_ns: u64,
    /// How many of them, per thread and wanted kind, no name of the
    /// kernel's pairs (see [`Queue::take`]'s `skip`).
    held_kinds: HashMap<(u32, u64, Option<bool>), usize>,
    /// The newest record's time, per thread.
    last_ns: HashMap<u32, u64>,
    /// Processes that exited: the exit record's time, and when it was
    /// joined (every notification of the process was read by then). A pid
    /// is reused (the agent can wrap the host's in seconds): a later
    /// process of that pid is not the one that exited.
    pub(super) exited: HashMap<u32, (u64, u64)>,
    /// Threads with a call on a descriptor of a shared fd table, whose
    /// record asserts no path: their notifications name what changed.
    unverified_fd: BTreeSet<u32>,
    writes: WriteCounts,
    /// The files each process's exec opened, for its record's `script`.
    exec_opens: ExecOpens,
    /// Where O_TMPFILEs were linked, for their `write` records.
    tmpfile_links: TmpfileLinks,
    /// Counts of removed names, and the links that kept their files.
    relinked: Relinked,
    /// Regular files created or modified (for the seal), by kernel path.
    touched: Touched,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, for the records' wall times.
    wall_offset: i128,
    /// Whether a written file's handle still has a name.
    pub(super) probe: FidProbe,
    /// The handles of symlinks the records named, by thread and record
    /// time, until their contents are read (`join_arguments.rs`).
    link_handles: HashMap<(u32, u64), super::notify::Handle>,
    /// Xattr records whose name their file does not show, with when that
    /// was seen; and the last record's time per (file, attribute).
    unshown_xattrs: Vec<(Record, u64)>,
    xattrs_seen: HashMap<(String, String), u64>,
}

/// A thread id of a record (`tid` when it is not the process leader).
pub(super) fn tid_of(r: &Record) -> u32 {
    r.target
        .get("tid")
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .unwrap_or(r.pid)
}

impl Join {
    pub fn new(wall_offset: i128) -> Self {
        Self {
            wall_offset,
            ..Default::default()
        }
    }

    /// A record of `tid` claiming a notification of `want` could not be
    /// told from another call's: the thread's later records are its
    /// claims, and its notifications records of their own, so that none
    /// is taken by the wrong record. Not for a modify: only truncates
    /// claim one, so a truncate left unproven misplaces none.
    fn unproven(&mut self, tid: u32, want: u64) {
        if want != bit::MODIFY {
            self.racy.insert(tid);
        }
    }

    /// Every notification queued before `ns` has been read and placed.
    pub fn notices_read_through(&mut self, ns: u64) {
        self.read_through_ns = self.read_through_ns.max(ns);
    }

    /// The sandbox thread `tid`, if a record named it.
    pub fn task(&self, tid: u32) -> Option<Task> {
        self.tasks.get(&tid).copied()
    }

    pub fn add_task(&mut self, tid: u32, task: Task) {
        self.tasks.insert(tid, task);
    }

    /// Learns the sandbox's threads from the capture's records (before the
    /// notifications read with them are classified).
    pub fn learn(&mut self, records: &[Record]) {
        for r in records {
            let task = Task {
                tgid: r.pid,
                ppid: r.ppid,
                uid: r.uid,
            };
            self.tasks.insert(tid_of(r), task);
            self.tasks.entry(r.pid).or_insert(task);
            if r.kind == "fork"
                && let Some(child) = r.target.get("child").and_then(Value::as_u64)
            {
                let child = child as u32;
                self.tasks.insert(
                    child,
                    Task {
                        tgid: child,
                        ppid: r.pid,
                        uid: r.uid,
                    },
                );
            }
        }
    }

    /// Takes one notification of a sandbox thread. The `write` records it
    /// completes (a removed name's) wait for the thread's records.
    pub fn notice(&mut self, mut n: Notice, task: Task) {
        if n.mask & bit::OPEN_EXEC != 0 {
            if let Some(path) = &n.path {
                self.exec_opens.opened(task.tgid, n.tid, path);
            }
            // No record claims it: it only names an exec's files.
            n.mask &= !bit::OPEN_EXEC;
        }
        if let (Some(path), Some(raw)) = (&n.path, &n.raw) {
            if n.mask & (bit::MODIFY | bit::CREATE | bit::ATTRIB) != 0 && !n.is_dir() {
                self.touched.touch(raw);
            }
            if n.mask & bit::MODIFY != 0 {
                self.writes.count(path, task, n.read_ns, n.fid.as_ref());
            }
            if n.mask & bit::RENAME != 0
                && let (Some(new), Some(new_raw)) = (&n.new_path, &n.new_raw)
            {
                if n.is_dir() {
                    self.writes.renamed_dir(path, new, n.tid, n.fid.as_ref());
                } else {
                    self.file_renamed(&n, path, new);
                }
                self.tmpfile_links.renamed(path, new, n.is_dir());
                self.touched.renamed(raw, new_raw, n.is_dir());
            }
            if n.mask & bit::DELETE != 0 && !n.is_dir() {
                // The name is gone: its writers' counts are final, and
                // named once the records show whether a link kept the file.
                let done = self.writes.removed(path, n.fid.as_ref());
                self.relinked.removed(path, n.tid, n.read_ns, done);
            }
        } else if n.mask & bit::RENAME != 0
            && let Some(new_raw) = &n.new_raw
        {
            // Moved in from a directory removed before it could be named:
            // what it holds may have been changed there.
            if n.is_dir() {
                self.touched.touch_tree(new_raw);
            } else {
                self.touched.touch(new_raw);
            }
        }
        // Modify notifications are counted, and claimed only by a truncate.
        if n.mask & !bit::ONDIR != 0 {
            self.pending.entry(n.tid).or_default().push_back(n);
        }
    }

    /// Joins a batch of capture records (in ring order) with the
    /// notifications taken so far. Returns what to write now: records
    /// that are settled and notifications no record claimed.
    pub fn join(&mut self, records: Vec<Record>, now_ns: u64) -> Vec<Record> {
        let mut out = Vec::with_capacity(records.len());
        for mut r in records {
            let tid = tid_of(&r);
            let t = self.last_ns.entry(tid).or_insert(0);
            // The thread's previous record ended before this call began.
            let start_ns = *t;
            *t = (*t).max(r.mono_ns);
            if r.kind == "exec" {
                self.exec_opens.name(&mut r, tid);
            }
            if r.kind == "exit" {
                self.exited.insert(r.pid, (r.mono_ns, now_ns));
                self.exec_opens.exited(r.pid);
                for (path, w) in self.writes.flush_process(r.pid) {
                    // Not there, no removal seen yet: kept until one (or the end).
                    let exists = !self.writes.was_removed(&path);
                    match self.place_of(&path, exists, &w) {
                        Place::Missing => self.writes.keep(&path, w),
                        _ => out.push(self.write_record(&path, &w, true)),
                    }
                }
            }
            let allowed = r.decision == Decision::Allowed;
            if r.target.get("path_unverified").is_some() {
                // A call on a descriptor another thread could swap: the
                // record claims no notification, so the one the kernel
                // queued for the file the call changed stands as its own
                // record, named exactly (an `attrib`, or a `write` count).
                self.unverified_fd.insert(tid);
                out.push(r);
                continue;
            }
            // A record the capture already named from the kernel's file
            // (an open for writing by the descriptor it returned, an
            // inode-flag ioctl): nothing to pair, and the file may change
            // with no notification (a shared mapping), so the seal lists it.
            // A tree deeper than the kernel walk is named by the process's
            // descriptor checked against the kernel's inode ("proc"), or
            // not at all: that file is counted as unhashed.
            let source = r.target.get("path_source").and_then(Value::as_str);
            if allowed
                && let Some(path) = r.target.get("path").and_then(Value::as_str)
                && matches!(source, Some("kernel" | "proc"))
            {
                // A name that is not plain is shown escaped: the seal must
                // open the file's own bytes.
                self.touched.touch_by_record(&names::on_disk(path));
                // A file with other links changed under every name: the
                // seal lists those in the roots, and counts it unhashed
                // when one is outside them.
                if let (Some(links), Some(dev), Some(ino)) = (
                    r.target.get("links").and_then(Value::as_u64),
                    r.target.get("dev").and_then(Value::as_u64),
                    r.target.get("ino").and_then(Value::as_u64),
                ) {
                    self.touched
                        .unnamed(dev, ino, u32::try_from(links).unwrap_or(u32::MAX));
                }
                // A metadata change or truncate by descriptor (fchmod,
                // ftruncate, ...) has its notification: it claims only one
                // that names the same file, never one by position.
                if let Some((want, dir)) = named_pairs(r.kind) {
                    let path = path.to_string();
                    let exact = self.take(tid, want, dir, true, |n| {
                        n.path.as_deref() == Some(path.as_str())
                    });
                    if exact.is_none() {
                        self.held.push((tid, r, start_ns));
                        continue;
                    }
                }
                out.push(r);
                continue;
            }
            if allowed
                && r.target.get("path_unresolved").is_some()
                && r.target.get("kernel_path_incomplete").is_some()
            {
                if let (Some(dev), Some(ino)) = (
                    r.target.get("dev").and_then(Value::as_u64),
                    r.target.get("ino").and_then(Value::as_u64),
                ) {
                    let links = r.target.get("links").and_then(Value::as_u64).unwrap_or(1);
                    self.touched
                        .unnamed(dev, ino, u32::try_from(links).unwrap_or(u32::MAX));
                }
                out.push(r);
                continue;
            }
            match wanted_of(&r) {
                Some((want, dir)) if allowed || made_and_removed(&r) => {
                    // An empty name is one the capture could not read.
                    let agent = r
                        .target
                        .get(main_key(r.kind))
                        .and_then(Value::as_str)
                        .filter(|a| !a.is_empty())
                        .map(str::to_string);
                    // The thread's earlier records of the kind still held
                    // come first in its order: their notices are not this
                    // record's, when a later one fits.
                    let skip = self.held_kinds.get(&(tid, want, dir)).copied();
                    if self.racy.contains(&tid) {
                        out.push(unproven(r));
                        continue;
                    }
                    let complete = r.mono_ns < self.read_through_ns;
                    let claim = Claim::of(&r, agent.as_deref());
                    let fits = |n: &Notice| claim.fits(n);
                    let merged = |n: &Notice| claim.merged(n);
                    let call = Call {
                        want,
                        dir,
                        skip: skip.unwrap_or(0),
                        start_ns,
                        end_ns: r.mono_ns,
                        complete,
                        fits: &fits,
                        merged: &merged,
                    };
                    // A name no other task could rewrite is the kernel's own
                    // string: any notification of it is the call's. One
                    // that could is proven (`claims.rs`). No claim: paired
                    // by position once it settles.
                    let shared = r.target.get("name_shared").is_some();
                    let picked = match &agent {
                        Some(_) if shared => self.pending.get_mut(&tid).map(|q| q.pick(&call)),
                        Some(_) => self.pending.get_mut(&tid).map(|q| {
                            let skip = skip.unwrap_or(0);
                            let n = q.take_or_merged(want, dir, skip, fits, merged);
                            (Pick::Wait, n)
                        }),
                        None => None,
                    };
                    match picked {
                        Some((_, Some(n))) => {
                            apply(&mut r, n);
                            let fid = arguments::link_handle(&r, n);
                            self.keep_link_handle(&r, fid);
                            self.note_link(&r);
                            self.claim_exchange_twin(tid, &r);
                            self.claim_removal(tid, &r);
                            out.push(r);
                        }
                        Some((Pick::Ambiguous, None)) => {
                            self.unproven(tid, want);
                            out.push(unproven(r));
                        }
                        _ => {
                            *self.held_kinds.entry((tid, want, dir)).or_default() += 1;
                            self.held.push((tid, r, start_ns));
                        }
                    }
                }
                _ => {
                    // A refused call on a descriptor keeps the kernel's
                    // name of the file it was refused on.
                    if is_file_kind(r.kind) && kernel_named(&r).is_none() {
                        r.target.insert("path_source", "agent");
                        if !allowed {
                            super::links::mark(&mut r);
                        } else if r.target.get("name_shared").is_some() {
                            // An abstract bind whose name another task could
                            // rewrite: what the kernel bound is not known
                            // (a file it made is a record of its own).
                            r = unproven(r);
                        }
                    } else if !allowed && r.kind == "exec" {
                        // A refused exec reads its file as a refused open does.
                        super::links::mark(&mut r);
                    } else if allowed && r.kind == "setflags" && kernel_named(&r).is_none() {
                        // `file_setattr(2)` by name follows a symlink, and
                        // no notification names what it changed: the name
                        // stays the agent's claim (round 15).
                        r = unproven(r);
                    }
                    out.push(r);
                }
            }
        }
        self.settle(now_ns, false, &mut out);
        self.prove_arguments(&mut out, now_ns, false);
        out
    }

    /// Everything still waiting, at the end of the run.
    pub fn finish(&mut self, now_ns: u64) -> Vec<Record> {
        let mut out = Vec::new();
        self.settle(now_ns, true, &mut out);
        self.prove_arguments(&mut out, now_ns, true);
        out
    }

    /// A file the agent inherits open for writing
    /// (`writable_standard_files`): sealed like one it opened itself, with
    /// its renames followed.
    pub fn touch_inherited(&mut self, path: &Path) {
        self.touched.touch_by_record(path);
    }

    /// Regular files created or modified, by kernel path.
    #[cfg(test)]
    pub fn touched(&self) -> &Touched {
        &self.touched
    }

    /// The same, with every rename followed, for the seal.
    pub fn settled_touched(&mut self, roots: &[PathBuf]) -> &Touched {
        self.touched
            .name_unnamed(|wanted| super::content::find_inodes(roots, wanted));
        self.touched.settle();
        self.touched.walk_renamed_dirs(roots);
        &self.touched
    }

    /// The first pending notification of `tid` that a record of `want`
    /// may claim (see [`Queue::take`]).
    fn take(
        &mut self,
        tid: u32,
        want: u64,
        dir: Option<bool>,
        again: bool,
        fits: impl Fn(&Notice) -> bool,
    ) -> Option<&Notice> {
        self.pending.get_mut(&tid)?.take(want, dir, again, 0, fits)
    }
}

#[path = "join_records.rs"]
mod records;

#[path = "join_claims.rs"]
mod claims;

#[path = "join_settle.rs"]
mod settle;

#[path = "join_arguments.rs"]
mod arguments;

#[cfg(test)]
#[path = "join_tests.rs"]
mod tests;
