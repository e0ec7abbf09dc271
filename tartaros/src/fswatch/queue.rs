//! One thread's notifications that records may still claim, in the
//! thread's order, with a cursor per kind: the first notification of a
//! kind not yet claimed is where the next record of that kind starts
//! looking. When the supervisor lags, a queue holds every notification
//! read ahead of the records (thousands on a create flood), and a scan
//! from the front per record made the join quadratic.

use std::collections::VecDeque;

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

    /// The first notification with `want` (for a directory or not) that
    /// `fits` and has not claimed `want`, else with `again` the first that
    /// has (the kernel merges identical notifications still queued, so
    /// one may stand for several records); its `want` bit is then claimed.
    pub fn take(
        &mut self,
        want: u64,
        dir: Option<bool>,
        again: bool,
        fits: impl Fn(&Notice) -> bool,
    ) -> Option<&Notice> {
        let kind_fits = |n: &Notice| n.mask & want != 0 && dir.is_none_or(|d| n.is_dir() == d);
        let slot = match self.done.iter().position(|(w, _)| *w == want) {
            Some(slot) => slot,
            None => {
                self.done.push((want, 0));
                self.done.len() - 1
            }
        };
        let start = self.done[slot].1;
        let mut prefix = start;
        let mut found = None;
        for (i, n) in self.notices.iter().enumerate().skip(start) {
            let open = n.mask & want != 0 && n.claimed & want == 0;
            if !open {
                if prefix == i {
                    prefix = i + 1;
                }
                continue;
            }
            if kind_fits(n) && fits(n) {
                found = Some(i);
                break;
            }
        }
        if let Some(at) = found
            && prefix == at
        {
            prefix = at + 1;
        }
        self.done[slot].1 = prefix;
        let at = found.or_else(|| {
            again
                .then(|| self.notices.iter().position(|n| kind_fits(n) && fits(n)))
                .flatten()
        })?;
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
            let n = q.take(bit::CREATE, Some(false), true, path_is(&p));
            assert_eq!(n.map(|n| n.path.clone()), Some(Some(p.clone())));
            assert!(
                q.take(bit::DELETE, Some(false), true, path_is(&p))
                    .is_some()
            );
        }
        // Every notice is claimed: a search finds none and leaves the
        // cursors at the end.
        assert!(q.take(bit::CREATE, None, false, |_| true).is_none());
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
            q.take(bit::CREATE, Some(false), true, path_is("/w/a"))
                .is_some()
        );
        assert!(
            q.take(bit::DELETE, Some(false), true, path_is("/w/a"))
                .is_some()
        );
        // The second create takes the fresh notice, leaving none unclaimed
        // (a claimed one taken again would leave the fresh one to be
        // logged as an effect no record saw).
        q.take(bit::CREATE, Some(false), true, path_is("/w/a"));
        assert!(q.notices.iter().all(|n| n.claimed & bit::CREATE != 0));
        // A fourth create of the name can only be a merged one.
        assert!(
            q.take(bit::CREATE, Some(false), true, path_is("/w/a"))
                .is_some()
        );
        assert!(
            q.take(bit::CREATE, Some(false), false, path_is("/w/a"))
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
        assert!(q.take(bit::CREATE, Some(false), false, |_| true).is_some());
        assert_eq!(q.done, vec![(bit::CREATE, 0)]);
        let d = q.take(bit::CREATE, Some(true), false, |_| true);
        assert_eq!(d.and_then(|n| n.path.clone()).as_deref(), Some("/w/d"));
        assert_eq!(q.done, vec![(bit::CREATE, 1)]);
        assert!(q.take(bit::CREATE, None, false, |_| true).is_none());
        assert_eq!(q.done, vec![(bit::CREATE, 2)]);
    }
}
