//! One thread's notifications that records may still claim, in the
//! thread's order, with a cursor per kind: the first notification of a
//! kind not yet claimed is where the next record of that kind starts
//! looking. When the supervisor lags, a queue holds every notification
//! read ahead of the records (thousands on a create flood), and a scan
//! from the front per record made the join quadratic.

use std::collections::VecDeque;

use super::claims::{self, Call, Pick};
use super::join::Notice;

#[derive(Debug, Default)]
pub(super) struct Queue {
    notices: VecDeque<Notice>,
    /// Per wanted bit: how many notices at the front are done for it
    /// (without the bit, or with it claimed). Both only ever grow.
    done: Vec<(u64, usize)>,
}

impl Queue {
    pub fn push_back(&mut self, n: Notice) {
        self.notices.push_back(n);
    }

    pub fn front(&self) -> Option<&Notice> {
        self.notices.front()
    }

    pub fn pop_front(&mut self) -> Option<Notice> {
        let n = self.notices.pop_front()?;
        for (_, done) in &mut self.done {
            *done = done.saturating_sub(1);
        }
        Some(n)
    }

    pub fn is_empty(&self) -> bool {
        self.notices.is_empty()
    }

    /// [`claims::pick`] for `call`; what it picks is claimed.
    pub fn pick(&mut self, call: &Call<'_>) -> (Pick, Option<&Notice>) {
        let from = self.fresh_from(call.want);
        let pick = claims::pick(&self.notices, from, call);
        match pick {
            Pick::Fresh(at) | Pick::Merged(at) => {
                let n = &mut self.notices[at];
                n.claimed |= call.want;
                (pick, Some(&*n))
            }
            Pick::Ambiguous | Pick::Wait => (pick, None),
        }
    }

    /// Where fresh notifications of `want` may start (the ones before are
    /// done for it); remembered, as it only grows.
    fn fresh_from(&mut self, want: u64) -> usize {
        let slot = self.slot(want);
        let start = self.done[slot].1;
        let open = |n: &Notice| n.mask & want != 0 && n.claimed & want == 0;
        let from = self
            .notices
            .iter()
            .skip(start)
            .position(open)
            .map_or(self.notices.len(), |at| start + at);
        self.done[slot].1 = from;
        from
    }

    fn slot(&mut self, want: u64) -> usize {
        match self.done.iter().position(|(w, _)| *w == want) {
            Some(slot) => slot,
            None => {
                self.done.push((want, 0));
                self.done.len() - 1
            }
        }
    }

    /// The first notification with `want` (for a directory or not) that
    /// `fits` and has not claimed `want`, else with `again` the first that
    /// has (the kernel merges identical notifications still queued, so
    /// one may stand for several records); its `want` bit is then claimed.
    /// With `skip`, the first `skip` unclaimed notifications of the kind
    /// are passed over when a later one fits too: they are those of the
    /// thread's earlier records still waiting for one (a name the capture
    /// could not read), which come first in the thread's order.
    pub fn take(
        &mut self,
        want: u64,
        dir: Option<bool>,
        again: bool,
        skip: usize,
        fits: impl Fn(&Notice) -> bool,
    ) -> Option<&Notice> {
        let merged = |n: &Notice| again && fits(n);
        self.take_or_merged(want, dir, skip, &fits, merged)
    }

    /// [`Self::take`] where a notification already claimed is taken again
    /// only when `merged` says the record's call is one the kernel merged
    /// into it: a rename is merged only into a rename of the same file
    /// between the same two names (`fanotify_should_merge`), so a rename
    /// record that found no fresh notification names both, and the old
    /// name alone (`to`) would take an earlier rename of another source
    /// to it (`w` to `y`, then `x` to `y` merged: the record said `w`).
    pub fn take_or_merged(
        &mut self,
        want: u64,
        dir: Option<bool>,
        skip: usize,
        fits: impl Fn(&Notice) -> bool,
        merged: impl Fn(&Notice) -> bool,
    ) -> Option<&Notice> {
        let kind_fits = |n: &Notice| n.mask & want != 0 && dir.is_none_or(|d| n.is_dir() == d);
        let open = |n: &Notice| n.mask & want != 0 && n.claimed & want == 0;
        let slot = self.slot(want);
        let start = self.done[slot].1;
        // The notices at the front that are done for `want`.
        let prefix = self
            .notices
            .iter()
            .skip(start)
            .position(&open)
            .map_or(self.notices.len(), |at| start + at);
        let scan = |skip: usize| {
            let mut seen = 0usize;
            for (i, n) in self.notices.iter().enumerate().skip(prefix) {
                if !(open(n) && kind_fits(n)) {
                    continue;
                }
                if seen >= skip && fits(n) {
                    return Some(i);
                }
                seen += 1;
            }
            None
        };
        let found = scan(skip).or_else(|| (skip > 0).then(|| scan(0)).flatten());
        self.done[slot].1 = match found {
            Some(at) if at == prefix => prefix + 1,
            _ => prefix,
        };
        let at = found.or_else(|| self.notices.iter().position(|n| kind_fits(n) && merged(n)))?;
        let n = &mut self.notices[at];
        n.claimed |= want;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fswatch::join::bit;

    fn notice(mask: u64, path: &str) -> Notice {
        Notice {
            tid: 1,
            mask,
            claimed: 0,
            path: Some(path.to_string()),
            name: path.to_string(),
            new_path: None,
            raw: None,
            new_raw: None,
            read_ns: 0,
            after_ns: 0,
            fid: None,
        }
    }

    fn path_is(p: &str) -> impl Fn(&Notice) -> bool + '_ {
        move |n| n.path.as_deref() == Some(p)
    }

    #[test]
    fn records_claim_in_order_and_the_cursor_skips_what_is_claimed() {
        let mut q = Queue::default();
        for k in 0..1000 {
            q.push_back(notice(bit::CREATE, &format!("/w/{k}")));
            q.push_back(notice(bit::DELETE, &format!("/w/{k}")));
        }
        for k in 0..1000 {
            let p = format!("/w/{k}");
            let n = q.take(bit::CREATE, Some(false), true, 0, path_is(&p));
            assert_eq!(n.map(|n| n.path.clone()), Some(Some(p.clone())));
            assert!(
                q.take(bit::DELETE, Some(false), true, 0, path_is(&p))
                    .is_some()
            );
        }
        // Every notice is claimed: a search finds none and leaves the
        // cursors at the end.
        assert!(q.take(bit::CREATE, None, false, 0, |_| true).is_none());
        assert!(q.done.iter().all(|(_, done)| *done == 2000), "{:?}", q.done);
        q.pop_front();
        assert!(q.done.iter().all(|(_, done)| *done == 1999));
    }

    #[test]
    fn a_merged_notice_is_claimed_again_only_when_no_fresh_one_fits() {
        let mut q = Queue::default();
        // create a, unlink a, create a: the first two merged into one
        // notice, the third read later on its own.
        q.push_back(notice(bit::CREATE | bit::DELETE, "/w/a"));
        q.push_back(notice(bit::CREATE, "/w/a"));
        assert!(
            q.take(bit::CREATE, Some(false), true, 0, path_is("/w/a"))
                .is_some()
        );
        assert!(
            q.take(bit::DELETE, Some(false), true, 0, path_is("/w/a"))
                .is_some()
        );
        // The second create takes the fresh notice, leaving none unclaimed
        // (a claimed one taken again would leave the fresh one to be
        // logged as an effect no record saw).
        q.take(bit::CREATE, Some(false), true, 0, path_is("/w/a"));
        assert!(q.notices.iter().all(|n| n.claimed & bit::CREATE != 0));
        // A fourth create of the name can only be a merged one.
        assert!(
            q.take(bit::CREATE, Some(false), true, 0, path_is("/w/a"))
                .is_some()
        );
        assert!(
            q.take(bit::CREATE, Some(false), false, 0, path_is("/w/a"))
                .is_none()
        );
    }

    #[test]
    fn a_notice_that_does_not_fit_stops_the_cursor() {
        let mut q = Queue::default();
        q.push_back(notice(bit::CREATE | bit::ONDIR, "/w/d"));
        q.push_back(notice(bit::CREATE, "/w/f"));
        // A file's record skips the directory's notice but cannot move the
        // cursor past it: a mkdir record still finds it.
        assert!(
            q.take(bit::CREATE, Some(false), false, 0, |_| true)
                .is_some()
        );
        assert_eq!(q.done, vec![(bit::CREATE, 0)]);
        let d = q.take(bit::CREATE, Some(true), false, 0, |_| true);
        assert_eq!(d.and_then(|n| n.path.clone()).as_deref(), Some("/w/d"));
        assert_eq!(q.done, vec![(bit::CREATE, 1)]);
        assert!(q.take(bit::CREATE, None, false, 0, |_| true).is_none());
        assert_eq!(q.done, vec![(bit::CREATE, 2)]);
    }

    #[test]
    fn a_record_after_one_held_without_a_name_skips_the_held_one_s_notice() {
        // create x (its name unreadable: held), unlink x, create x, unlink
        // x, ...: one notice per file (the kernel reports each file's
        // handle, so it merges only a file's own create and unlink).
        let mut q = Queue::default();
        for _ in 0..3 {
            q.push_back(notice(bit::CREATE | bit::DELETE, "/w/x"));
        }
        // The second and third creates, one record held before them.
        for _ in 0..2 {
            assert!(
                q.take(bit::CREATE, Some(false), true, 1, path_is("/w/x"))
                    .is_some()
            );
        }
        assert_eq!(q.notices[0].claimed, 0, "the held record's notice is left");
        assert!(q.notices.iter().skip(1).all(|n| n.claimed == bit::CREATE));
        // The held record, by position.
        assert!(
            q.take(bit::CREATE, Some(false), false, 0, |_| true)
                .is_some()
        );
        // A held record that had no notice of its own: the later record
        // still finds its own.
        let mut q = Queue::default();
        q.push_back(notice(bit::CREATE, "/w/y"));
        assert!(
            q.take(bit::CREATE, Some(false), true, 1, path_is("/w/y"))
                .is_some()
        );
    }

    #[test]
    fn a_merged_rename_is_taken_again_only_by_both_of_its_names() {
        let rename = |from: &str, to: &str| {
            let mut n = notice(bit::RENAME, from);
            n.new_path = Some(to.to_string());
            n
        };
        // w -> x, then a loop x -> y, y -> x read once: the kernel merged
        // the later calls into the first two.
        let mut q = Queue::default();
        q.push_back(rename("/w/w", "/w/x"));
        q.push_back(rename("/w/x", "/w/y"));
        q.push_back(rename("/w/y", "/w/x"));
        let to = |p: &'static str| move |n: &Notice| n.new_path.as_deref() == Some(p);
        let both = |f: &'static str, t: &'static str| {
            move |n: &Notice| n.path.as_deref() == Some(f) && n.new_path.as_deref() == Some(t)
        };
        for (f, t) in [("/w/w", "/w/x"), ("/w/x", "/w/y"), ("/w/y", "/w/x")] {
            let n = q.take_or_merged(bit::RENAME, None, 0, to(t), both(f, t));
            assert_eq!(n.and_then(|n| n.path.clone()).as_deref(), Some(f));
        }
        // The second y -> x: its own notification, not w -> x's.
        let n = q.take_or_merged(bit::RENAME, None, 0, to("/w/x"), both("/w/y", "/w/x"));
        assert_eq!(n.and_then(|n| n.path.clone()).as_deref(), Some("/w/y"));
        // A rename of names no notification has finds none.
        let n = q.take_or_merged(bit::RENAME, None, 0, to("/w/x"), both("/w/z", "/w/x"));
        assert!(n.is_none());
    }
}
