//! How held records and orphaned notifications settle once their thread
//! has moved on, in a file of its own to keep `join.rs` readable.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{HOLD_NS, Join, ORPHAN_NS, Task, bit, wanted};
use crate::effectlog::{Decision, Record};
use crate::fswatch::claims::{Pick, one_each, unproven};
use crate::fswatch::pairing::{apply, fits_by_position, kernel_named, main_key, notice_main};

impl Join {
    /// Settles held records and orphaned notifications; with `all`, every
    /// one of them (the run is over).
    pub(super) fn settle(&mut self, now_ns: u64, all: bool, out: &mut Vec<Record>) {
        let held = std::mem::take(&mut self.held);
        for (tid, mut r, start_ns) in held {
            let moved_on = self.last_ns.get(&tid).is_some_and(|&t| t > r.mono_ns);
            let ready = all
                || moved_on
                || self.exited.get(&r.pid).is_some_and(|e| e.0 >= r.mono_ns)
                || now_ns.saturating_sub(r.mono_ns) > HOLD_NS;
            if !ready {
                self.held.push((tid, r, start_ns));
                continue;
            }
            let (want, dir) = crate::fswatch::pairing::wanted_of(&r).unwrap_or((0, None));
            // A notification queued after the record's syscall ended
            // belongs to a later call of the thread.
            let ended = r.mono_ns;
            if let Some(path) = kernel_named(&r) {
                // Named by the kernel's file: only that file's notification.
                self.take(tid, want, dir, false, |n| {
                    n.after_ns < ended && n.path.as_deref() == Some(path.as_str())
                });
                out.push(r);
                continue;
            }
            // Only a name change (create, delete, rename) is paired by
            // position: only calls of its kind make its notifications, so
            // the first fresh one is the call's. A metadata change or
            // modify also comes from other calls (every write, an unlink's
            // link count), and the kernel merges a file's while queued (a
            // `chmod` and `utime` through one link are one notification):
            // such a record whose string is not the kernel's name (a
            // symlink, `..` after one) took the next file's, and every
            // later record of the thread drifted one file ahead (round 15).
            // It is paired by name only, or stays the agent's claim; the
            // file's own notification is then a kernel-named record.
            let agent = r
                .target
                .get(main_key(r.kind))
                .and_then(Value::as_str)
                .map(str::to_string);
            // Nor a refused call (a failed bind that made its socket file):
            // when its name was not read it may have made nothing, and a
            // notification by position would name it after another call's.
            let allowed = r.decision == Decision::Allowed;
            // An unread name (a page the capture could not read) claims
            // nothing to compare: it is still paired by position, or its
            // record would name no file at all.
            let read = agent.as_deref().is_some_and(|a| !a.is_empty());
            let by_name_only = want == bit::MODIFY || !allowed || (read && !one_each(want));
            if self.racy.contains(&tid) {
                out.push(unproven(r));
                continue;
            }
            let agent = agent.filter(|a| !a.is_empty());
            let shared = r.target.get("name_shared").is_some();
            // A name change of a name nobody could rewrite is proven as a
            // shared one is: by position, unless a create-and-delete of
            // another name merged into one notification breaks the order.
            let proven = shared || (allowed && one_each(want));
            let picked = match &agent {
                Some(agent) if proven => {
                    self.pick_at_settle(tid, &mut r, (want, dir), start_ns, agent)
                }
                _ => None,
            };
            match picked {
                Some(Pick::Ambiguous) => {
                    self.unproven(tid, want);
                    out.push(unproven(r));
                    continue;
                }
                Some(Pick::Fresh(_) | Pick::Merged(_)) => {
                    out.push(r);
                    continue;
                }
                _ => {}
            }
            let found = self.take(tid, want, dir, false, |n| {
                n.after_ns < ended
                    && if by_name_only {
                        agent.is_some() && notice_main(n, r.kind) == agent.as_deref()
                    } else {
                        fits_by_position(n, want)
                    }
            });
            match found {
                Some(n) => {
                    apply(&mut r, n);
                    let fid = super::arguments::link_handle(&r, n);
                    self.keep_link_handle(&r, fid);
                    self.note_link(&r);
                    self.claim_exchange_twin(tid, &r);
                    self.claim_removal(tid, &r);
                }
                // A metadata change or truncate no notification of its
                // name confirms: the kernel changed some file, not
                // provably the one the string names.
                None if allowed && read && want != 0 && !one_each(want) => r = unproven(r),
                None => {
                    r.target.insert("path_source", "agent");
                    if !allowed {
                        crate::fswatch::links::mark(&mut r);
                    }
                }
            }
            out.push(r);
        }
        self.held_kinds.clear();
        for (tid, r, _) in &self.held {
            if let Some((want, dir)) = wanted(r.kind).filter(|_| kernel_named(r).is_none()) {
                *self.held_kinds.entry((*tid, want, dir)).or_default() += 1;
            }
        }
        let waiting: BTreeSet<u32> = self.held.iter().map(|(tid, _, _)| *tid).collect();
        // Counts of removed names, once the thread's records (its links)
        // have passed the removal, as for an orphaned notification below.
        let (last_ns, tasks, exited) = (&self.last_ns, &self.tasks, &self.exited);
        let parked = self.relinked.take_ready(|p| {
            all || (!waiting.contains(&p.tid)
                && (last_ns.get(&p.tid).is_some_and(|&l| l >= p.read_ns)
                    || tasks
                        .get(&p.tid)
                        .and_then(|t| exited.get(&t.tgid))
                        .is_some_and(|e| e.1 >= p.read_ns)
                    || now_ns.saturating_sub(p.read_ns) > ORPHAN_NS))
        });
        for p in parked {
            for w in &p.writes {
                out.push(self.write_record(&p.path, w, false));
            }
        }
        let tids: Vec<u32> = self.pending.keys().copied().collect();
        for tid in tids {
            if waiting.contains(&tid) && !all {
                continue;
            }
            let last = self.last_ns.get(&tid).copied().unwrap_or(0);
            let task = self.tasks.get(&tid).copied();
            let exited_at = task.and_then(|t| self.exited.get(&t.tgid)).map(|e| e.1);
            let Some(queue) = self.pending.get_mut(&tid) else {
                continue;
            };
            let mut orphans = Vec::new();
            while let Some(front) = queue.front() {
                let orphan = all
                    || exited_at.is_some_and(|at| at >= front.read_ns)
                    || last >= front.read_ns
                    || now_ns.saturating_sub(front.read_ns) > ORPHAN_NS;
                if !orphan {
                    break;
                }
                orphans.extend(queue.pop_front());
            }
            if queue.is_empty() {
                self.pending.remove(&tid);
            }
            let task = task.unwrap_or(Task {
                tgid: tid,
                ppid: 0,
                uid: 0,
            });
            for n in orphans {
                out.extend(self.uncaptured(&n, task));
            }
        }
        if all {
            let writes = self.writes.drain();
            for (path, w) in writes {
                out.push(self.write_record(&path, &w, true));
            }
        }
    }
}
