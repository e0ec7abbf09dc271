use std::path::PathBuf;

use super::*;

fn notice(mask: u64, path: &str, read_ns: u64) -> Notice {
    Notice {
        tid: 1,
        mask,
        claimed: 0,
        path: Some(path.to_string()),
        name: path.to_string(),
        new_path: None,
        raw: Some(PathBuf::from(path)),
        new_raw: None,
        read_ns,
        after_ns: 0,
        fid: None,
    }
}

/// The choice for a call of `want` claiming `claim`, which ran from
/// `start` to `end`, with every notification read.
fn choose(notices: &[Notice], want: u64, claim: &str, (start, end): (u64, u64)) -> Pick {
    let queue: VecDeque<Notice> = notices.iter().cloned().collect();
    let fits = |n: &Notice| n.path.as_deref() == Some(claim);
    let call = Call {
        want,
        dir: Some(false),
        skip: 0,
        start_ns: start,
        end_ns: end,
        complete: true,
        fits: &fits,
        merged: &fits,
    };
    pick(&queue, 0, &call)
}

fn claimed(mut n: Notice, bits: u64) -> Notice {
    n.claimed = bits;
    n
}

#[test]
fn the_first_fresh_notification_that_fits_is_the_records() {
    let queue = [notice(bit::ATTRIB, "A", 20), notice(bit::ATTRIB, "B", 20)];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Fresh(0));
}

#[test]
fn a_claim_that_fits_a_later_calls_notification_is_not_proven() {
    // The call changed A (its notification comes first) while the name it
    // passed said B when the capture read it; B's is a later call's.
    let queue = [notice(bit::ATTRIB, "A", 20), notice(bit::ATTRIB, "B", 20)];
    assert_eq!(choose(&queue, bit::ATTRIB, "B", (5, 10)), Pick::Ambiguous);
    // A removal's first fresh notification is the call's own: paired by
    // position (named A, B kept as the claim).
    let queue = [notice(bit::DELETE, "A", 20), notice(bit::DELETE, "B", 20)];
    assert_eq!(choose(&queue, bit::DELETE, "B", (5, 10)), Pick::Wait);
}

#[test]
fn a_notification_read_before_the_call_began_is_not_its_own() {
    let queue = [notice(bit::ATTRIB, "X", 3), notice(bit::ATTRIB, "B", 20)];
    assert_eq!(choose(&queue, bit::ATTRIB, "B", (5, 10)), Pick::Fresh(1));
}

#[test]
fn a_claimed_notification_confirms_a_merged_call_only_without_a_rival() {
    // utime then setxattr of A, merged into one notification.
    let queue = [claimed(notice(bit::ATTRIB, "A", 20), bit::ATTRIB)];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Merged(0));
    // The call's own notification, of another file, is fresh: the claim
    // of A is not proven (round 14: the agent rewrote A over B).
    let queue = [
        claimed(notice(bit::ATTRIB, "A", 20), bit::ATTRIB),
        notice(bit::ATTRIB, "B", 20),
    ];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Ambiguous);
    // ... or merged into another claimed one still queued.
    let queue = [
        claimed(notice(bit::ATTRIB, "B", 20), bit::ATTRIB),
        claimed(notice(bit::ATTRIB, "A", 20), bit::ATTRIB),
    ];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Ambiguous);
    // A rival read before the call began could not have taken it.
    let queue = [
        claimed(notice(bit::ATTRIB, "B", 3), bit::ATTRIB),
        claimed(notice(bit::ATTRIB, "A", 20), bit::ATTRIB),
    ];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Merged(1));
}

#[test]
fn a_merge_waits_until_every_notification_of_the_call_is_read() {
    let queue: VecDeque<Notice> = [claimed(notice(bit::ATTRIB, "A", 20), bit::ATTRIB)]
        .into_iter()
        .collect();
    let fits = |n: &Notice| n.path.as_deref() == Some("A");
    let call = Call {
        want: bit::ATTRIB,
        dir: Some(false),
        skip: 0,
        start_ns: 5,
        end_ns: 10,
        complete: false,
        fits: &fits,
        merged: &fits,
    };
    assert_eq!(pick(&queue, 0, &call), Pick::Wait);
    // Nor into one read before the call began.
    let queue = [claimed(notice(bit::ATTRIB, "A", 3), bit::ATTRIB)];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Wait);
}

#[test]
fn a_notification_queued_after_the_call_ended_is_never_its_own() {
    let mut later = notice(bit::ATTRIB, "A", 30);
    later.after_ns = 12;
    assert_eq!(choose(&[later], bit::ATTRIB, "A", (5, 10)), Pick::Wait);
}

#[test]
fn a_waiting_records_notification_is_taken_only_when_none_is_this_calls() {
    let queue: VecDeque<Notice> = [notice(bit::CREATE, "new", 20)].into_iter().collect();
    let fits = |n: &Notice| n.path.as_deref() == Some("new");
    let mut call = Call {
        want: bit::CREATE,
        dir: Some(false),
        skip: 1,
        start_ns: 5,
        end_ns: 10,
        complete: true,
        fits: &fits,
        merged: &fits,
    };
    // `open(O_CREAT)` of an existing file waits and made none.
    assert_eq!(pick(&queue, 0, &call), Pick::Fresh(0));
    // Not while one of the call's own may be unread: a rewritten claim
    // would take the waiting record's.
    call.complete = false;
    assert_eq!(pick(&queue, 0, &call), Pick::Wait);
}

#[test]
fn a_removal_merged_into_an_earlier_create_is_out_of_order() {
    // `creat A; creat B` at the start, then `unlink B` (merged into B's
    // create) and a later `unlink A` (merged into A's): the removals' bits
    // are in the order of the creates, not of the calls. The first call
    // claimed A.
    let both = bit::CREATE | bit::DELETE;
    let queue = [
        claimed(notice(both, "A", 20), bit::CREATE),
        claimed(notice(both, "B", 20), bit::CREATE),
    ];
    assert_eq!(choose(&queue, bit::DELETE, "A", (5, 10)), Pick::Ambiguous);
    // One name made and removed: nothing out of order.
    let queue = [claimed(notice(both, "A", 20), bit::CREATE)];
    assert_eq!(choose(&queue, bit::DELETE, "A", (5, 10)), Pick::Fresh(0));
}

#[test]
fn a_change_merged_into_an_earlier_create_proves_nothing_by_its_place() {
    // `creat A; creat B` still queued; the first chmod changed B (merged
    // into B's create), the second A (merged into A's, which comes
    // first): the first chmod, claiming A, may not take A's.
    let queue = [
        claimed(notice(bit::CREATE | bit::ATTRIB, "A", 20), bit::CREATE),
        claimed(notice(bit::CREATE | bit::ATTRIB, "B", 20), bit::CREATE),
    ];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Ambiguous);
    // Unmerged, the first is the call's own.
    let queue = [notice(bit::ATTRIB, "A", 20), notice(bit::ATTRIB, "B", 20)];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Fresh(0));
    // A create's notification that a write merged into is still the
    // create's own: first in place (round 9's thread churn).
    let queue = [
        notice(bit::CREATE | bit::MODIFY, "A", 20),
        notice(bit::CREATE, "B", 20),
    ];
    assert_eq!(choose(&queue, bit::CREATE, "A", (5, 10)), Pick::Fresh(0));
    // Merged but alone: nothing else could be the call's.
    let queue = [claimed(
        notice(bit::CREATE | bit::ATTRIB, "A", 20),
        bit::CREATE,
    )];
    assert_eq!(choose(&queue, bit::ATTRIB, "A", (5, 10)), Pick::Fresh(0));
}
