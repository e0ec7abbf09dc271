//! How a record takes its notification beyond the first match: the
//! links and removals a claimed notification implies, and the choice made
//! again when a held record settles (`claims.rs`), in a file of their own
//! to keep `join.rs` readable.

use serde_json::Value;

use super::{Join, RENAME_EXCHANGE, bit};
use crate::effectlog::Record;
use crate::fswatch::claims::{Call, Claim, Pick};
use crate::fswatch::pairing::{Notice, apply, made_and_removed};

impl Join {
    /// A link named by the kernel (an O_TMPFILE's new name, or where a
    /// file lives on once its old name is removed), or the removal of a
    /// name, in the order of the records.
    pub(super) fn note_link(&mut self, r: &Record) {
        if r.kind == "link"
            && let Some(to) = r.target.get("to").and_then(Value::as_str)
            && let Some(key) = self.tmpfile_links.linked(to)
            && let Some(from) = r.target.get("from").and_then(Value::as_str)
        {
            self.relinked.linked(from, key);
        } else if r.kind == "unlink"
            && let Some(path) = r.target.get("path").and_then(Value::as_str)
        {
            self.relinked.unlinked(path);
        } else if r.kind == "rename"
            && r.target.get("flags").and_then(Value::as_u64).unwrap_or(0) & RENAME_EXCHANGE == 0
            && r.target.get("dir").is_none()
            && let (Some(from), Some(to)) = (
                r.target.get("from").and_then(Value::as_str),
                r.target.get("to").and_then(Value::as_str),
            )
        {
            self.relinked.renamed(from, to);
        }
    }

    /// A file's rename notification: its counts move to the new name; the
    /// counts held there of another file (by the kernel's handles) whose
    /// handle says it is gone are of the file the rename replaced, which
    /// the kernel reports no removal of: they are final, as a removal's
    /// (named once the records show whether a link kept the file). A file
    /// still linked was not replaced: the other side of a
    /// `RENAME_EXCHANGE` (its own half moves it on), or a rename joined out
    /// of the queue's order (a thread gone before its notifications were
    /// placed has them joined at the end, after later renames over the
    /// name).
    pub(super) fn file_renamed(&mut self, n: &Notice, path: &str, new: &str) {
        let probe = &self.probe;
        let replaced = self
            .writes
            .renamed(path, new, n.fid.as_ref(), |f| probe.gone(f));
        if !replaced.is_empty() {
            self.relinked.removed(new, n.tid, n.read_ns, replaced);
        }
    }

    /// `renameat2(RENAME_EXCHANGE)` is reported as two renames, `a` to
    /// `b` and `b` to `a`: the record of the call claims both, so the
    /// second is not logged as an effect the capture did not see.
    pub(super) fn claim_exchange_twin(&mut self, tid: u32, r: &Record) {
        let flags = r.target.get("flags").and_then(Value::as_u64).unwrap_or(0);
        if r.kind != "rename" || flags & RENAME_EXCHANGE == 0 {
            return;
        }
        let name = |key| r.target.get(key).and_then(Value::as_str);
        let (Some(from), Some(to)) = (name("from"), name("to")) else {
            return;
        };
        self.take(tid, bit::RENAME, None, false, |n| {
            n.path.as_deref() == Some(to) && n.new_path.as_deref() == Some(from)
        });
    }

    /// A failed bind that made its socket file removed it too
    /// ([`made_and_removed`]): that removal's notification is the call's.
    pub(super) fn claim_removal(&mut self, tid: u32, r: &Record) {
        if !made_and_removed(r) {
            return;
        }
        if let Some(path) = r.target.get("path").and_then(Value::as_str) {
            self.take(tid, bit::DELETE, Some(false), true, |n| {
                n.path.as_deref() == Some(path)
            });
        }
    }

    /// The choice for a held record `r` of `tid` as it settles (every
    /// earlier record of the thread has settled): `None` without a queue.
    /// What it picks is applied to `r`.
    pub(super) fn pick_at_settle(
        &mut self,
        tid: u32,
        r: &mut Record,
        (want, dir): (u64, Option<bool>),
        start_ns: u64,
        agent: &str,
    ) -> Option<Pick> {
        let claim = Claim::of(r, Some(agent));
        let fits = |n: &Notice| claim.fits(n);
        let merged = |n: &Notice| claim.merged(n);
        let call = Call {
            want,
            dir,
            skip: 0,
            start_ns,
            end_ns: r.mono_ns,
            complete: r.mono_ns < self.read_through_ns,
            fits: &fits,
            merged: &merged,
        };
        let (pick, notice) = self.pending.get_mut(&tid)?.pick(&call);
        if let Some(n) = notice {
            apply(r, n);
            let fid = super::arguments::link_handle(r, n);
            self.keep_link_handle(r, fid);
        }
        if matches!(pick, Pick::Fresh(_) | Pick::Merged(_)) {
            self.note_link(r);
            self.claim_exchange_twin(tid, r);
            self.claim_removal(tid, r);
        }
        Some(pick)
    }
}
