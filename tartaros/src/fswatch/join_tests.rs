use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use super::*;
use crate::effectlog::Target;

const T: Task = Task {
    tgid: 10,
    ppid: 1,
    uid: 65534,
};

fn record(kind: &'static str, pid: u32, mono_ns: u64, path: &str) -> Record {
    let mut target = Target::new();
    target.insert("path", path.to_string());
    Record {
        kind,
        pid,
        ppid: 1,
        uid: 65534,
        mono_ns,
        wall_ns: mono_ns,
        decision: Decision::Allowed,
        errno: 0,
        target,
    }
}

fn notice(tid: u32, mask: u64, path: &str, read_ns: u64) -> Notice {
    Notice {
        tid,
        mask,
        claimed: 0,
        path: Some(path.to_string()),
        name: path.rsplit('/').next().unwrap_or_default().to_string(),
        new_path: None,
        raw: Some(PathBuf::from(path)),
        new_raw: None,
        read_ns,
        after_ns: 0,
        fid: None,
    }
}

fn s<'a>(r: &'a Record, key: &str) -> Option<&'a str> {
    r.target.get(key).and_then(Value::as_str)
}

#[test]
fn an_agreeing_record_is_confirmed_by_the_kernel() {
    let mut j = Join::new(0);
    j.learn(&[record("exec", 10, 1, "/bin/sh")]);
    j.notice(notice(10, bit::CREATE, "/w/a", 5), T);
    let out = j.join(vec![record("create", 10, 4, "/w/a")], 6);
    assert_eq!(out.len(), 1);
    assert_eq!(s(&out[0], "path"), Some("/w/a"));
    assert_eq!(s(&out[0], "path_source"), Some("kernel"));
    assert_eq!(out[0].target.get("claimed_path"), None);
    assert!(j.finish(7).is_empty(), "the notification was claimed");
    assert!(j.touched().contains(Path::new("/w/a")));
}

#[test]
fn rewritten_buffers_are_named_by_the_kernel_in_thread_order() {
    // The agent's buffer said b-names; the kernel created a-names.
    let mut j = Join::new(0);
    for i in 0..5u64 {
        j.notice(notice(10, bit::CREATE, &format!("/w/a{i}"), 100 + i), T);
    }
    let records = (0..5u64)
        .map(|i| record("create", 10, 50 + i, &format!("/w/b{i}")))
        .collect();
    let mut out = j.join(records, 200);
    out.extend(j.finish(300));
    assert_eq!(out.len(), 5);
    for (i, r) in out.iter().enumerate() {
        assert_eq!(s(r, "path"), Some(format!("/w/a{i}").as_str()));
        assert_eq!(s(r, "claimed_path"), Some(format!("/w/b{i}").as_str()));
        assert_eq!(s(r, "path_source"), Some("kernel"));
    }
}

#[test]
fn a_record_without_a_notification_does_not_take_the_next_one() {
    // open(O_CREAT) of an existing file creates nothing; the next create
    // of the thread names its own file.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::CREATE, "/w/new", 20), T);
    j.notices_read_through(20);
    let out = j.join(
        vec![
            record("create", 10, 10, "/w/existing"),
            record("create", 10, 11, "/w/new"),
        ],
        30,
    );
    assert_eq!(out.len(), 2);
    let new = out.iter().find(|r| s(r, "path") == Some("/w/new")).unwrap();
    assert_eq!(s(new, "path_source"), Some("kernel"));
    let old = out
        .iter()
        .find(|r| s(r, "path") == Some("/w/existing"))
        .unwrap();
    assert_eq!(s(old, "path_source"), Some("agent"));
}

#[test]
fn a_held_record_waits_for_its_thread_to_move_on() {
    let mut j = Join::new(0);
    j.notice(notice(10, bit::CREATE, "/w/real", 20), T);
    assert!(
        j.join(vec![record("create", 10, 10, "/w/claim")], 30)
            .is_empty()
    );
    let out = j.join(vec![record("exit", 10, 40, "")], 50);
    let create = out.iter().find(|r| r.kind == "create").unwrap();
    assert_eq!(s(create, "path"), Some("/w/real"));
    assert_eq!(s(create, "claimed_path"), Some("/w/claim"));
}

#[test]
fn denied_and_unconfirmed_records_keep_the_agents_claim() {
    let mut j = Join::new(0);
    let mut denied = record("unlink", 10, 1, "/etc/hosts");
    denied.decision = Decision::Denied;
    denied.errno = 30;
    let out = j.join(vec![denied, record("open", 10, 2, "/w/x")], 3);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|r| s(r, "path_source") == Some("agent")));
}

#[test]
fn notifications_no_record_claims_become_uncaptured_records() {
    let mut j = Join::new(0);
    j.add_task(10, T);
    j.notice(notice(10, bit::CREATE, "/w/core", 20), T);
    j.notice(notice(10, bit::ATTRIB | bit::ONDIR, "/w/d", 21), T);
    // A later record of the thread: the notifications were not its.
    let out = j.join(vec![record("open", 10, 25, "/w/x")], 26);
    let create = out.iter().find(|r| r.kind == "create").unwrap();
    assert_eq!(s(create, "path"), Some("/w/core"));
    assert_eq!(create.target.get("uncaptured"), Some(&Value::from(true)));
    let attrib = out.iter().find(|r| r.kind == "attrib").unwrap();
    assert_eq!(attrib.target.get("dir"), Some(&Value::from(true)));
    assert_eq!(attrib.pid, 10);
}

#[test]
fn writes_are_counted_per_file_and_written_at_close() {
    let mut j = Join::new(0);
    for i in 0..3 {
        j.notice(notice(10, bit::MODIFY, "/w/out", i), T);
    }
    j.notice(notice(11, bit::MODIFY, "/w/other", 4), T);
    j.notice(notice(10, bit::DELETE, "/w/out", 5), T);
    // Written once the thread's records have passed the removal (a link
    // among them would say where the file lives on).
    let w = j
        .join(vec![record("unlink", 10, 6, "/w/out")], 7)
        .into_iter()
        .find(|r| r.kind == "write")
        .expect("a write record when the file is deleted");
    assert_eq!((w.kind, w.pid), ("write", 10));
    assert_eq!(w.target.get("count"), Some(&Value::from(3u64)));
    assert_eq!(s(&w, "path_source"), Some("kernel"));
    let rest = j.finish(10);
    let other: Vec<_> = rest.iter().filter(|r| r.kind == "write").collect();
    assert_eq!(other.len(), 1, "a file still there is written at the end");
    assert_eq!(s(other[0], "path"), Some("/w/other"));
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x");
    std::fs::write(&x, b"xy").unwrap();
    let x = x.to_str().unwrap();
    j.notice(notice(10, bit::MODIFY, x, 11), T);
    j.notice(notice(10, bit::MODIFY, x, 12), T);
    j.notice(notice(10, bit::MODIFY, "/w/moved-away", 12), T);
    let out = j.join(vec![record("exit", 10, 13, "")], 14);
    let w = out
        .iter()
        .find(|r| r.kind == "write")
        .expect("written at exit");
    assert_eq!(w.target.get("count"), Some(&Value::from(2u64)));
    // Not there and no removal seen (round 11): kept for a removal by a
    // thread not placed yet, else written at the end as not found.
    assert_eq!(out.iter().filter(|r| r.kind == "write").count(), 1);
    let rest = j.finish(20);
    let w = rest.iter().find(|r| r.kind == "write").expect("at the end");
    assert_eq!(w.target.get("not_found"), Some(&Value::from(true)));
}

#[test]
fn a_truncate_claims_only_its_own_files_modify_which_still_counts_as_a_write() {
    let mut j = Join::new(0);
    j.notice(notice(10, bit::MODIFY, "/w/src/notes.txt", 20), T);
    let out = j.join(vec![record("truncate", 10, 10, "/w/src/notes.txt")], 30);
    let t = out.iter().find(|r| r.kind == "truncate").unwrap();
    assert_eq!(s(t, "path"), Some("/w/src/notes.txt"));
    assert_eq!(s(t, "path_source"), Some("kernel"));
    let out = j.finish(40);
    assert!(out.iter().any(|r| r.kind == "write"));
}

#[test]
fn a_truncate_is_never_paired_by_position_with_another_files_modify() {
    // The modify is an earlier write's (or the string was swapped): the
    // truncate stays the agent's claim, and the modified file is named
    // by the kernel in its `write` record.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::MODIFY, "/w/hooks/pre-commit", 20), T);
    let mut out = j.join(vec![record("truncate", 10, 10, "/w/link")], 30);
    out.extend(j.finish(40));
    let t = out.iter().find(|r| r.kind == "truncate").unwrap();
    assert_eq!(s(t, "path"), Some("/w/link"));
    assert_eq!(s(t, "path_source"), Some("agent"));
    let w = out.iter().find(|r| r.kind == "write").unwrap();
    assert_eq!(s(w, "path"), Some("/w/hooks/pre-commit"));
}

#[test]
fn renames_add_touched_files_and_name_both_ends() {
    let mut j = Join::new(0);
    j.notice(notice(10, bit::CREATE, "/w/d/f", 1), T);
    let mut n = notice(10, bit::RENAME | bit::ONDIR, "/w/d", 2);
    n.new_path = Some("/w/e".into());
    n.new_raw = Some("/w/e".into());
    j.notice(n, T);
    let mut r = record("rename", 10, 3, "");
    r.target.insert("from", "/w/d");
    r.target.insert("to", "/w/x");
    let mut out = j.join(vec![r], 4);
    out.extend(j.finish(5));
    let rename = out.iter().find(|r| r.kind == "rename").unwrap();
    assert_eq!(s(rename, "to"), Some("/w/e"));
    assert_eq!(s(rename, "claimed_to"), Some("/w/x"));
    assert_eq!(s(rename, "from"), Some("/w/d"));
    assert_eq!(rename.target.get("claimed_from"), None);
    assert!(j.touched().contains(Path::new("/w/e/f")));
    // Kept for an exchange (touched.rs); the seal skips what is not there.
    assert!(j.touched().contains(Path::new("/w/d/f")));
}

#[test]
fn a_kernel_named_file_that_is_not_utf8_is_touched_by_its_bytes() {
    let mut j = Join::new(0);
    let mut r = record("open", 10, 1, "/w/a\\xff");
    r.target.insert("path_source", "kernel");
    assert_eq!(j.join(vec![r], 2).len(), 1);
    let raw = std::ffi::OsStr::from_bytes(b"/w/a\xff");
    assert!(j.touched().contains(Path::new(raw)), "the file's own bytes");
    // The shown string is no file's name: a UTF-8 name with a `\` is
    // shown escaped too.
    assert!(!j.touched().contains(Path::new("/w/a\\xff")));
}

#[test]
fn threads_are_paired_separately() {
    let t2 = 11;
    let mut j = Join::new(0);
    j.notice(notice(t2, bit::CREATE, "/w/from-thread", 1), T);
    j.notice(notice(10, bit::CREATE, "/w/from-leader", 2), T);
    let mut r2 = record("create", 10, 3, "/w/claim2");
    r2.target.insert("tid", t2);
    let r1 = record("create", 10, 4, "/w/claim1");
    let mut out = j.join(vec![r2, r1], 5);
    out.extend(j.finish(6));
    let by_claim = |c: &str| {
        out.iter()
            .find(|r| s(r, "claimed_path") == Some(c))
            .and_then(|r| s(r, "path"))
            .map(str::to_string)
    };
    assert_eq!(by_claim("/w/claim2").as_deref(), Some("/w/from-thread"));
    assert_eq!(by_claim("/w/claim1").as_deref(), Some("/w/from-leader"));
}

#[test]
fn a_notification_queued_after_a_call_ended_is_not_paired_with_it() {
    // open(O_CREAT|O_TRUNC) of an existing file created nothing; the
    // thread's next create, queued after it ended, is not its.
    let mut j = Join::new(0);
    let mut later = notice(10, bit::CREATE, "/w/next", 30);
    later.after_ns = 15;
    j.notice(later, T);
    let mut out = j.join(vec![record("create", 10, 10, "/w/existing")], 31);
    out.extend(j.join(vec![record("open", 10, 20, "/w/y")], 32));
    let existing = out.iter().find(|r| r.kind == "create").unwrap();
    assert_eq!(s(existing, "path"), Some("/w/existing"));
    assert_eq!(s(existing, "path_source"), Some("agent"));
    let out = j.join(vec![record("create", 10, 40, "/w/claim")], 41);
    out.iter()
        .for_each(|r| assert_ne!(r.kind, "create", "held: {r:?}"));
    let out = j.finish(50);
    let next = out.iter().find(|r| r.kind == "create").unwrap();
    assert_eq!(s(next, "path"), Some("/w/next"));
}

#[test]
fn a_merged_notification_confirms_every_record_of_its_path() {
    // utime and setxattr of one file: the kernel merged them into one
    // FAN_ATTRIB; both records are the kernel's.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::ATTRIB, "/w/f", 5), T);
    // The read that returned it found the queue empty: nothing queued
    // before it is still to come (a merge is proven only then).
    j.notices_read_through(5);
    let mut out = j.join(
        vec![
            record("utime", 10, 3, "/w/f"),
            record("xattr", 10, 4, "/w/f"),
        ],
        6,
    );
    out.extend(j.finish(7));
    assert_eq!(out.len(), 2, "no uncaptured attrib: {out:?}");
    assert!(out.iter().all(|r| s(r, "path_source") == Some("kernel")));
}

#[test]
fn a_claimed_notification_is_not_taken_again_by_position() {
    // `echo hi > a` then `echo x >> existing`: the second open created
    // nothing and must not be named after `a`.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::CREATE, "/w/a", 5), T);
    let mut out = j.join(vec![record("create", 10, 3, "/w/a")], 6);
    out.extend(j.join(vec![record("create", 10, 8, "/w/existing")], 9));
    out.extend(j.finish(10));
    let existing = out
        .iter()
        .find(|r| s(r, "path") == Some("/w/existing"))
        .expect("the second record keeps its path");
    assert_eq!(s(existing, "path_source"), Some("agent"));
    assert_eq!(out.len(), 2);
}

#[test]
fn an_fd_based_change_gets_the_kernels_path_and_no_empty_claim() {
    let mut j = Join::new(0);
    j.notice(notice(10, bit::ATTRIB, "/w/a", 5), T);
    let mut r = record("utime", 10, 3, "");
    r.target = Target::new();
    r.target.insert("fd", 0);
    r.target.insert("path_unresolved", true);
    let mut out = j.join(vec![r], 6);
    out.extend(j.finish(7));
    assert_eq!(out.len(), 1);
    assert_eq!(s(&out[0], "path"), Some("/w/a"));
    assert_eq!(out[0].target.get("claimed_path"), None);
    assert_eq!(out[0].target.get("path_unresolved"), None);
    assert_eq!(s(&out[0], "path_source"), Some("kernel"));
}

#[test]
fn a_refused_descriptor_call_keeps_the_kernel_s_name() {
    let mut j = Join::new(0);
    let mut r = record("xattr", 10, 3, "/w/locked");
    r.decision = Decision::Denied;
    r.errno = 13;
    r.target.insert("path_source", "kernel");
    let mut out = j.join(vec![r], 4);
    out.extend(j.finish(5));
    assert_eq!(out.len(), 1);
    assert_eq!(s(&out[0], "path_source"), Some("kernel"));
}

/// A call on a shared descriptor asserts no path and claims nothing: the
/// notification of the file it changed stands as a kernel-named record.
#[test]
fn an_unverified_descriptor_call_leaves_its_notification_to_name_the_file() {
    let mut j = Join::new(0);
    j.add_task(10, T);
    j.notice(notice(10, bit::ATTRIB, "/w/changed", 5), T);
    let mut r = record("xattr", 10, 6, "");
    r.target = Target::new();
    r.target.insert("fd", 40);
    r.target.insert("path_unverified", true);
    r.target.insert("fd_path_at_exit", "/w/other");
    let mut out = j.join(vec![r], 7);
    out.extend(j.finish(8));
    assert_eq!(out.len(), 2, "{out:#?}");
    let call = out.iter().find(|r| r.kind == "xattr").unwrap();
    assert_eq!(call.target.get("path"), None);
    assert_eq!(call.target.get("path_source"), None);
    let attrib = out.iter().find(|r| r.kind == "attrib").unwrap();
    assert_eq!(s(attrib, "path"), Some("/w/changed"));
    assert_eq!(s(attrib, "path_source"), Some("kernel"));
    assert_eq!(
        attrib.target.get("unverified_fd_call"),
        Some(&Value::from(true))
    );
    assert_eq!(attrib.target.get("uncaptured"), None);
    assert!(j.touched().contains(Path::new("/w/changed")));
}

#[test]
fn a_write_open_the_kernel_named_is_kept_and_sealed() {
    // O_TRUNC of an existing file: named from its descriptor by the
    // capture, and its FAN_MODIFY is counted, not claimed.
    let mut j = Join::new(0);
    j.learn(&[record("exec", 10, 1, "/bin/sh")]);
    j.notice(notice(10, bit::MODIFY, "/w/hook", 3), T);
    let mut r = record("truncate", 10, 4, "/w/hook");
    r.target.insert("path_source", "kernel");
    r.target.insert("claimed_path", "/w/notes");
    let mut mapped = record("open", 10, 5, "/w/mapped");
    mapped.target.insert("path_source", "kernel");
    let out = j.join(vec![r, mapped], 6);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(s(&out[0], "path"), Some("/w/hook"));
    assert_eq!(s(&out[0], "claimed_path"), Some("/w/notes"));
    assert_eq!(s(&out[1], "path_source"), Some("kernel"));
    // A shared mapping changes a file without a notification: the seal
    // hashes every file opened for writing.
    assert!(j.touched().contains(Path::new("/w/mapped")));
    assert!(j.touched().contains(Path::new("/w/hook")));
    let rest = j.finish(7);
    assert!(
        rest.iter().all(|r| r.kind == "write"),
        "only the write count is left: {rest:?}"
    );
}

#[test]
fn an_exchange_record_claims_both_of_its_renames() {
    let mut j = Join::new(0);
    for (from, to) in [("/w/a", "/w/b"), ("/w/b", "/w/a")] {
        let mut n = notice(10, bit::RENAME, from, 1);
        n.new_path = Some(to.into());
        n.new_raw = Some(to.into());
        j.notice(n, T);
    }
    let mut r = record("rename", 10, 2, "");
    r.target.insert("from", "/w/a");
    r.target.insert("to", "/w/b");
    r.target.insert("flags", 2u64);
    let mut out = j.join(vec![r], 3);
    out.extend(j.finish(4));
    let renames: Vec<_> = out.iter().filter(|r| r.kind == "rename").collect();
    assert_eq!(renames.len(), 1, "{out:?}");
    assert_eq!(s(renames[0], "path_source"), Some("kernel"));
}

#[test]
fn a_failed_bind_claims_the_socket_file_it_made_and_removed() {
    let mut j = Join::new(0);
    j.add_task(10, T);
    // bind(ghost.sock) fails with EINVAL after the kernel made the file;
    // then a create whose name the capture could not read.
    j.notice(notice(10, bit::CREATE | bit::DELETE, "/w/ghost.sock", 5), T);
    j.notice(notice(10, bit::CREATE, "/w/real", 5), T);
    let mut bind = record("bind", 10, 2, "/w/ghost.sock");
    bind.decision = Decision::Denied;
    bind.errno = libc::EINVAL as u64;
    let mut out = j.join(vec![bind, record("create", 10, 3, "")], 6);
    out.extend(j.finish(7));
    assert_eq!(out.len(), 2, "{out:#?}");
    assert_eq!(s(&out[0], "path_source"), Some("kernel"), "{:?}", out[0]);
    assert_eq!(
        (out[1].kind, s(&out[1], "path")),
        ("create", Some("/w/real"))
    );
    // Refused before it made anything (EADDRINUSE): the agent's claim,
    // and the file's notification is no call's.
    let mut j = Join::new(0);
    j.add_task(10, T);
    j.notice(notice(10, bit::CREATE, "/w/x.sock", 5), T);
    let mut bind = record("bind", 10, 2, "/w/x.sock");
    bind.decision = Decision::Denied;
    bind.errno = libc::EADDRINUSE as u64;
    let mut out = j.join(vec![bind], 6);
    out.extend(j.finish(7));
    assert_eq!(s(&out[0], "path_source"), Some("agent"));
    assert_eq!(out[1].target.get("uncaptured"), Some(&Value::from(true)));
}

#[test]
fn a_write_s_merged_metadata_change_pairs_no_unread_name() {
    let mut j = Join::new(0);
    j.add_task(10, T);
    // A write cleared /w/suid's set-uid bit (merged with its modify), then
    // a chmod of another file whose name the capture could not read.
    j.notice(notice(10, bit::ATTRIB | bit::MODIFY, "/w/suid", 5), T);
    j.notice(notice(10, bit::ATTRIB, "/w/other", 5), T);
    let mut out = j.join(vec![record("chmod", 10, 3, "")], 6);
    out.extend(j.finish(7));
    let chmod = out.iter().find(|r| r.kind == "chmod").expect("the chmod");
    assert_eq!(s(chmod, "path"), Some("/w/other"), "{out:#?}");
    let cleared = out
        .iter()
        .find(|r| r.kind == "attrib")
        .expect("the cleared bit");
    assert_eq!(s(cleared, "path"), Some("/w/suid"));
}

#[test]
fn a_failed_bind_is_paired_by_its_name_only() {
    // bind("/w/bad.sock") refused with EINVAL before it made anything (a
    // bad address length), its notification not yet read; a create of
    // another name is the thread's only notification.
    let mut j = Join::new(0);
    j.add_task(10, T);
    let mut bind = record("bind", 10, 2, "/w/bad.sock");
    bind.decision = Decision::Denied;
    bind.errno = libc::EINVAL as u64;
    let mut out = j.join(vec![bind], 3);
    j.notice(notice(10, bit::CREATE, "/w/real", 5), T);
    out.extend(j.join(Vec::new(), 6));
    out.extend(j.finish(7));
    let bind = out.iter().find(|r| r.kind == "bind").expect("the bind");
    assert_eq!(s(bind, "path"), Some("/w/bad.sock"), "{out:#?}");
    assert_eq!(s(bind, "path_source"), Some("agent"));
    let create = out.iter().find(|r| r.kind == "create").expect("the create");
    assert_eq!(s(create, "path"), Some("/w/real"));
}

#[test]
fn a_name_another_thread_could_rewrite_is_proven_or_left_a_claim() {
    // A thread of a process with two threads claimed B; its own removal
    // (A) comes first, and B's is a later call's, read ahead of it.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::ATTRIB, "/w/A", 20), T);
    j.notice(notice(10, bit::ATTRIB, "/w/B", 20), T);
    j.notices_read_through(20);
    let mut r = record("chmod", 10, 10, "/w/B");
    r.target.insert("name_shared", true);
    let mut out = j.join(vec![r], 30);
    out.extend(j.finish(40));
    let chmod = out.iter().find(|r| r.kind == "chmod").unwrap();
    assert_eq!(s(chmod, "path_source"), Some("agent"), "{out:#?}");
    assert_eq!(chmod.target.get("claim_unproven"), Some(&Value::from(true)));
    // Both changes stand as the kernel's own records.
    let attribs: Vec<_> = out.iter().filter(|r| r.kind == "attrib").collect();
    assert_eq!(attribs.len(), 2, "{out:#?}");
    // Without another task on the memory, the claim is the kernel's own
    // string: B's notification is the call's.
    let mut j = Join::new(0);
    j.notice(notice(10, bit::ATTRIB, "/w/B", 20), T);
    let out = j.join(vec![record("chmod", 10, 10, "/w/B")], 30);
    assert_eq!(s(&out[0], "path_source"), Some("kernel"));
}

#[test]
fn a_metadata_change_through_a_link_takes_no_other_file_s_notification() {
    // `chmod l0; utime l0; chmod l1` with `l0 -> r0`, `l1 -> r1`: the
    // kernel merged the utime into the chmod's notification of r0. By
    // position the utime took r1's, and the chmod of l1 the next one
    // (round 15). Each stays the agent's claim; r0 and r1 are named by
    // the kernel's own records.
    let mut j = Join::new(0);
    j.add_task(10, T);
    j.notice(notice(10, bit::ATTRIB, "/w/r0", 5), T);
    j.notice(notice(10, bit::ATTRIB, "/w/r1", 5), T);
    let calls = vec![
        record("chmod", 10, 2, "/w/l0"),
        record("utime", 10, 3, "/w/l0"),
        record("chmod", 10, 4, "/w/l1"),
    ];
    let mut out = j.join(calls, 6);
    out.extend(j.finish(7));
    for r in out.iter().filter(|r| r.kind != "attrib") {
        assert_eq!(s(r, "path_source"), Some("agent"), "{out:#?}");
        assert_eq!(r.target.get("claim_unproven"), Some(&Value::from(true)));
    }
    let named: Vec<_> = out
        .iter()
        .filter(|r| r.kind == "attrib" && s(r, "path_source") == Some("kernel"))
        .filter_map(|r| s(r, "path"))
        .collect();
    assert_eq!(named, ["/w/r0", "/w/r1"], "{out:#?}");
}

#[test]
fn a_metadata_change_through_a_link_is_named_by_a_notification_of_its_name_only() {
    // The claim fits a notification (a plain name after one through a
    // link): that one is the call's file; the link's stays a claim.
    let mut j = Join::new(0);
    j.add_task(10, T);
    j.notice(notice(10, bit::ATTRIB, "/w/r0", 5), T);
    j.notice(notice(10, bit::ATTRIB, "/w/b", 5), T);
    let calls = vec![
        record("chmod", 10, 2, "/w/l0"),
        record("chmod", 10, 3, "/w/b"),
    ];
    let mut out = j.join(calls, 6);
    out.extend(j.finish(7));
    let b = out.iter().find(|r| s(r, "path") == Some("/w/b")).unwrap();
    assert_eq!((b.kind, s(b, "path_source")), ("chmod", Some("kernel")));
    let l0 = out.iter().find(|r| s(r, "path") == Some("/w/l0")).unwrap();
    assert_eq!(s(l0, "path_source"), Some("agent"), "{out:#?}");
    let r0 = out.iter().find(|r| s(r, "path") == Some("/w/r0")).unwrap();
    assert_eq!((r0.kind, s(r0, "path_source")), ("attrib", Some("kernel")));
}
