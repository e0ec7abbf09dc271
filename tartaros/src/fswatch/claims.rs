//! Which notification a record may take by the name the agent passed.
//!
//! The capture reads a call's path from the agent's memory when the call
//! starts; the kernel copies it a moment later. Another thread (or a
//! process sharing the page) that rewrites the name in between makes the
//! record claim one file while the kernel changed another (adversarial
//! round 14: `truncate`, `chmod`, `utime`, `setxattr`, `unlink`, `rmdir`
//! and `open(O_CREAT)` records named the other file with `path_source:
//! "kernel"` in up to half of the calls, `verify` ok). A notification is
//! the kernel's truth, but it names the record's file only if it is
//! provably the record's own:
//! - a thread's notifications of one kind are in the order of its calls,
//!   so a record's fresh notification is the first one of its kind not
//!   kept for the thread's earlier records still waiting: one that fits
//!   the claim further on belongs to a later call (read ahead of the
//!   records). For a name change (create, delete, rename) every
//!   notification of the kind is a call's of the kind, so the first one
//!   is the record's, whatever the claim: the pairing by position later
//!   names it. A metadata change or modify also comes from other calls
//!   (an unlink's link count, a write), so a fitting notification behind
//!   one of another name leaves the record unprovable;
//! - the kernel merges a call's notification into an identical one still
//!   queued, so a record whose name fits only an already claimed
//!   notification may be merged into it, but only if no other
//!   notification of the kind could have been its own (queued while the
//!   call ran, of another name), and only once every notification queued
//!   before the call ended has been read.
//!
//! A record that cannot be proven is the agent's claim, and its thread's
//! notifications then stand as records of their own ([`Pick::Ambiguous`]).

use std::collections::VecDeque;

use serde_json::Value;

use super::join::Notice;
use super::pairing::{bit, notice_main};
use crate::effectlog::Record;

/// What a record claims: the name it passed, and for a rename the name it
/// moved from (a rename is merged only into one between the same names).
pub(super) struct Claim {
    kind: &'static str,
    agent: Option<String>,
    from: Option<Option<String>>,
}

impl Claim {
    /// `agent`: the record's name, `None` when the capture could not read it.
    pub(super) fn of(r: &Record, agent: Option<&str>) -> Self {
        let from = (r.kind == "rename").then(|| {
            r.target
                .get("from")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        Self {
            kind: r.kind,
            agent: agent.map(str::to_string),
            from,
        }
    }

    /// The notification names the file the record claims.
    pub(super) fn fits(&self, n: &Notice) -> bool {
        self.agent.is_some() && notice_main(n, self.kind) == self.agent.as_deref()
    }

    /// A claimed notification the record's call may have been merged into.
    pub(super) fn merged(&self, n: &Notice) -> bool {
        match &self.from {
            Some(from) => from.is_some() && self.fits(n) && n.path == *from,
            None => self.fits(n),
        }
    }
}

/// One record's call, as the choice needs it.
pub(super) struct Call<'a> {
    pub want: u64,
    pub dir: Option<bool>,
    /// Fresh notifications of the kind at the front kept for the thread's
    /// earlier records still waiting.
    pub skip: usize,
    /// The call started after this (the thread's previous record ended).
    pub start_ns: u64,
    /// The call ended here (the record's time).
    pub end_ns: u64,
    /// Every notification queued before `end_ns` has been read.
    pub complete: bool,
    /// The notification names the file the record claims.
    pub fits: &'a dyn Fn(&Notice) -> bool,
    /// A claimed notification the record's call may have been merged
    /// into (stricter than `fits` for a rename: both names).
    pub merged: &'a dyn Fn(&Notice) -> bool,
}

/// What a record may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// Its own fresh notification, at this index.
    Fresh(usize),
    /// A claimed one its call was merged into, at this index.
    Merged(usize),
    /// Nothing provable: the record stays the agent's claim.
    Ambiguous,
    /// Nothing yet: the record waits (and is later paired by position).
    Wait,
}

/// The kinds a notification of another kind can be merged with.
const MERGEABLE: u64 = bit::CREATE | bit::DELETE | bit::RENAME | bit::ATTRIB | bit::MODIFY;

/// Whether only calls of the kind make notifications of the kind (name
/// changes), so the thread's first fresh one queued before the call ended
/// is the call's, if it made one. (An `open(O_CREAT)` of a file that
/// exists makes none: a notification queued after it ended is not its.)
pub(super) fn one_each(want: u64) -> bool {
    want & (bit::CREATE | bit::DELETE | bit::RENAME) != 0
}

/// The choice for `call` among `notices` (one thread's, in order); those
/// before `from` have no fresh notification of the kind.
pub(super) fn pick(notices: &VecDeque<Notice>, from: usize, call: &Call<'_>) -> Pick {
    let kind = |n: &Notice| n.mask & call.want != 0 && call.dir.is_none_or(|d| n.is_dir() == d);
    let fresh = |n: &Notice| kind(n) && n.claimed & call.want == 0;
    // Fresh ones queued before the call ended; the first `skip` are kept
    // for the thread's records still waiting.
    let open: Vec<usize> = notices
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(_, n)| fresh(n) && n.after_ns < call.end_ns)
        .map(|(i, _)| i)
        .collect();
    let (kept, mine) = open.split_at(call.skip.min(open.len()));
    let fits = |i: &usize| (call.fits)(&notices[*i]);
    // Every write makes a modify: one of the claimed file may be an
    // earlier write's, and the truncate's own another file's, anywhere.
    let strict = call.want == bit::MODIFY;
    let rival_fresh = || {
        mine.iter()
            .any(|i| !fits(i) && notices[*i].read_ns >= call.start_ns)
    };
    if remade_rival(notices, mine, call, &kind) {
        return Pick::Ambiguous;
    }
    // A rename is merged only into a rename of the same file between the
    // same two names (`fanotify_should_merge`), which `merged` checks: a
    // loop (`mv p q; mv q p` again and again) is merged before any fresh
    // one of the thread's later renames.
    if call.want == bit::RENAME
        && mine.first().is_none_or(|&i| !fits(&i))
        && let Some(at) = notices
            .iter()
            .position(|n| kind(n) && !fresh(n) && (call.merged)(n))
    {
        return Pick::Merged(at);
    }
    // A notification that carries another kind too (`creat A` queued,
    // then a later call's `chmod A` merged into it) stands where its first
    // event was queued, ahead of notifications the thread's calls made
    // before the merged one: its position proves nothing (a chmod record
    // claiming A took a later call's change of A while its own, of B,
    // came second, about 1 in 300 runs of round 14's flipping test).
    // (A name change starts its own notification: later events merge
    // into it, so its place is its own; `remade_rival` covers the rest.)
    let merged_first = !one_each(call.want)
        && mine
            .first()
            .is_some_and(|&i| notices[i].mask & !call.want & MERGEABLE != 0);
    match mine.iter().position(fits) {
        Some(0) if (strict || merged_first) && rival_fresh() => return Pick::Ambiguous,
        Some(0) => return Pick::Fresh(mine[0]),
        // The first is this call's: the pairing by position names it.
        Some(_) if one_each(call.want) => return Pick::Wait,
        Some(at) => {
            // Behind one that may be this call's own (read after it began).
            let behind = mine[..at]
                .iter()
                .any(|&i| notices[i].read_ns >= call.start_ns);
            return if behind || (strict && rival_fresh()) {
                Pick::Ambiguous
            } else {
                Pick::Fresh(mine[at])
            };
        }
        None if !mine.is_empty() => {
            // A fresh one of another name may be this call's own.
            return if one_each(call.want) {
                Pick::Wait
            } else {
                Pick::Ambiguous
            };
        }
        None => {}
    }
    // None of its own, with every notification up to its end read: a
    // waiting record's may be the one that made none.
    if call.complete
        && let Some(&at) = kept.iter().find(|i| fits(i))
    {
        return Pick::Fresh(at);
    }
    let Some(merged) = notices
        .iter()
        .position(|n| kind(n) && !fresh(n) && (call.merged)(n))
    else {
        return Pick::Wait;
    };
    if !call.complete || notices[merged].read_ns < call.start_ns {
        // Its own may not be read yet; or the claimed one was read before
        // the call began, so the call could not be merged into it.
        return Pick::Wait;
    }
    let rival = notices
        .iter()
        .enumerate()
        .any(|(i, n)| i != merged && kind(n) && !(call.fits)(n) && n.read_ns >= call.start_ns);
    if rival {
        Pick::Ambiguous
    } else {
        Pick::Merged(merged)
    }
}

/// Whether a create or removal may have been merged into a notification
/// of another name than the first fresh one. A name made and removed
/// while its first notification is still queued is one notification
/// (`mkdir A; rmdir A` merged into an earlier `rmdir A`'s; `unlink B`
/// into the `creat B` of the start, ahead of a later call's `unlink A`
/// merged into the start's `creat A`): the thread's notifications of the
/// kind are then not in the order of its calls, and the first fresh one
/// may be a later call's (round 14: `rmdir` and `unlink` records named
/// the next call's file).
fn remade_rival(
    notices: &VecDeque<Notice>,
    mine: &[usize],
    call: &Call<'_>,
    kind: &dyn Fn(&Notice) -> bool,
) -> bool {
    if call.want & (bit::CREATE | bit::DELETE) == 0 {
        return false;
    }
    let both = bit::CREATE | bit::DELETE;
    let mut names = notices
        .iter()
        .filter(|n| kind(n) && n.mask & both == both && n.read_ns >= call.start_ns)
        .chain(mine.first().map(|&i| &notices[i]))
        .map(|n| n.path.as_deref());
    match names.next() {
        Some(first) => names.any(|other| other != first),
        None => false,
    }
}

/// A record no notification proves: its name stays the agent's claim,
/// marked; its thread's notifications stand as records of their own.
pub(super) fn unproven(mut r: Record) -> Record {
    r.target.insert("path_source", "agent");
    r.target.insert("claim_unproven", true);
    r
}

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;
