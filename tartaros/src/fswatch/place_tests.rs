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
        fid: None,
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

/// Handle [1] is /w, [4] the directory made as /w/d and renamed to /w/g
/// in the same read (looked up after the read: /w/g).
struct Renamed;

impl Facts for Renamed {
    fn member(&self, _: u32) -> Member {
        Member::Sandbox(Task {
            tgid: 10,
            ppid: 1,
            uid: 65534,
        })
    }
    fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
        match dir.bytes.as_slice() {
            [1] => Some(PathBuf::from("/w")),
            [4] => Some(PathBuf::from("/w/g")),
            _ => None,
        }
    }
}

#[test]
fn a_directory_looked_up_after_its_rename_names_what_came_before_it_by_its_old_path() {
    let mut p = placement();
    let mut rename = event(10, bit::ONDIR | bit::RENAME, 1, "d");
    rename.new_entry = event(10, 0, 1, "g").entry;
    let events = vec![
        event(10, bit::ONDIR | bit::CREATE, 1, "d"),
        event(10, bit::CREATE, 4, "f"),
        rename,
        event(10, bit::CREATE, 4, "h"),
    ];
    p.place(events, 5, 0, &Renamed);
    assert_eq!(p.unsure, 0);
    let out = p.finish(10_000_000_000);
    let paths: Vec<&str> = out
        .iter()
        .filter(|r| r.kind == "create")
        .filter_map(|r| r.target.get("path").and_then(Value::as_str))
        .collect();
    assert!(paths.contains(&"/w/d/f"), "{out:?}");
    assert!(paths.contains(&"/w/g/h"), "{out:?}");
    assert!(!paths.contains(&"/w/g/f"), "{out:?}");
}

/// A sandbox process exited and its exit was joined; a host thread then
/// got its tid and wrote a host file on the roots' filesystem. It was
/// placed as the sandbox's (the tid was known): a `write` record of a
/// host file, `deleted: true` once the host removed it (seen in
/// log_round9_pid_reuse beside a cargo build in /tmp).
#[test]
fn a_known_tid_whose_process_exited_is_looked_up_again() {
    let facts = Fake {
        lookups: Cell::new(0),
    };
    let mut p = placement();
    p.join.add_task(
        20,
        Task {
            tgid: 20,
            ppid: 1,
            uid: 65534,
        },
    );
    let exit = record("exit", 20, "code", Value::from(0));
    p.join.join(vec![exit], 50);
    p.place(vec![event(20, bit::MODIFY, 3, "host.o")], 200, 100, &facts);
    assert_eq!(facts.lookups.get(), 1, "looked up: the host's");
    let out = p.finish(10_000_000_000);
    assert!(
        out.iter().all(|r| r.kind != "write"),
        "no write of the host's file: {out:?}"
    );
}
