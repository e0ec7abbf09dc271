use serde_json::json;

use super::*;
use crate::effectlog::testutil::{effect, genesis};
use crate::effectlog::{ExitStatus, Genesis, LogWriter, Record, Seal};

/// Denied without an errno: the proxy's refusals.
fn denied(e: Record) -> Record {
    e.denied(0)
}

fn write(path: &Path, with_files: bool) {
    let mut w = LogWriter::create(path).unwrap();
    w.genesis(Genesis {
        degraded: Vec::new(),
        policy: json!({"writable_roots": ["/work"], "read_denies": ["/home/u/.ssh"]}),
        ..genesis()
    })
    .unwrap();
    let e = |kind, pid, ppid, ms, t, errno| effect(kind, pid, ppid, ms, t, errno);
    w.record(&mut e(
        "exec",
        10,
        1,
        1,
        json!({"path": "/bin/sh", "argv": ["sh", "-c", "make"]}),
        None,
    ))
    .unwrap();
    w.record(&mut e("fork", 10, 1, 2, json!({"child": 11}), None))
        .unwrap();
    w.record(&mut e(
        "exec",
        11,
        10,
        3,
        json!({"path": "/usr/bin/make", "argv": ["make"]}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "create",
        11,
        10,
        4,
        json!({"path": "/work/new.txt", "flags": 0o301}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "create",
        11,
        10,
        5,
        json!({"path": "/work/README", "flags": 577}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "create",
        11,
        10,
        6,
        json!({"path": "/work/.tmp1", "flags": 0o301}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "rename",
        11,
        10,
        7,
        json!({"from": "/work/.tmp1", "to": "/work/out.bin"}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "rename",
        11,
        10,
        8,
        json!({"from": "/work/a", "to": "/work/b"}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "unlink",
        11,
        10,
        9,
        json!({"path": "/work/old"}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        10,
        json!({"path": "/dev/null", "flags": 1}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        11,
        json!({"path": "/work/src.c", "flags": 0}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "mkdir",
        11,
        10,
        12,
        json!({"path": "/work/exists"}),
        Some(17),
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        13,
        json!({"path": "/home/u/.ssh/id", "flags": 0}),
        Some(13),
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        14,
        json!({"path": "/home/u/.ssh/id", "flags": 0}),
        Some(13),
    ))
    .unwrap();
    w.record(&mut e(
        "connect",
        11,
        10,
        15,
        json!({"family": "inet", "addr": "1.1.1.1", "port": 443}),
        Some(1),
    ))
    .unwrap();
    w.record(&mut e(
        "connect",
        11,
        10,
        16,
        json!({"family": "inet6", "addr": "::1", "port": 8080}),
        None,
    ))
    .unwrap();
    w.record(&mut denied(e(
        "proxy",
        0,
        0,
        17,
        json!({"host": "evil.example", "port": 443,
        "reason": "domain not allowed"}),
        None,
    )))
    .unwrap();
    w.record(&mut e(
        "proxy",
        0,
        0,
        18,
        json!({"host": "crates.io", "port": 443,
        "bytes_up": 100, "bytes_down": 20_000}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "signal",
        11,
        10,
        19,
        json!({"to": 1, "signal": 9}),
        Some(1),
    ))
    .unwrap();
    w.record(&mut e("exit", 11, 10, 20, json!({"code": 2}), None))
        .unwrap();
    w.record(&mut e("exit", 10, 1, 21, json!({"code": 2}), None))
        .unwrap();
    let seal = Seal {
        exit_status: ExitStatus::Code(2),
        cgroup_empty: true,
    };
    if with_files {
        let h = |c: char| c.to_string().repeat(64);
        let files = vec![
            json!({"path": "/work/README", "size": 12, "sha256": h('a')}),
            json!({"path": "/work/b", "size": 3, "sha256": h('b')}),
            json!({"path": "/work/new.txt", "size": 0, "sha256": h('c')}),
            json!({"path": "/work/out.bin", "size": 20480, "sha256": h('d')}),
            json!({"path": "/work/unseen", "size": 1, "sha256": h('e')}),
            json!({"path": "/work/z.iso", "size": 1u64 << 33, "sha256": null, "skipped": "too large"}),
        ];
        w.seal_with_files(seal, Some(files)).unwrap();
    } else {
        w.seal(seal).unwrap();
    }
}

fn summary(with_files: bool) -> Summary {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write(&path, with_files);
    summarize(&path, None).unwrap()
}

fn file<'a>(s: &'a Summary, path: &str) -> &'a FileChange {
    s.files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path}: {:#?}", s.files))
}

#[test]
fn files_are_listed_with_their_change_and_the_seals_hashes() {
    let s = summary(true);
    assert_eq!(s.verify_code, 0, "{}", s.verify);
    assert!(s.seal_has_files);
    let f = file(&s, "/work/new.txt");
    assert_eq!(
        (f.change, f.size, f.sha256.as_deref()),
        ("created", Some(0), Some("c".repeat(64).as_str()))
    );
    let f = file(&s, "/work/README");
    assert_eq!(
        (f.change, f.actions.as_slice()),
        ("written", &["overwrite".to_string()][..])
    );
    // Write-then-rename of a new file: one created entry at the final name.
    let f = file(&s, "/work/out.bin");
    assert_eq!((f.change, f.renamed_from.as_deref()), ("created", None));
    assert!(s.files.iter().all(|f| f.path != "/work/.tmp1"));
    let f = file(&s, "/work/b");
    assert_eq!(
        (f.change, f.renamed_from.as_deref()),
        ("renamed", Some("/work/a"))
    );
    assert_eq!(file(&s, "/work/old").change, "deleted");
    assert_eq!(file(&s, "/work/unseen").change, "seal-only");
    let big = file(&s, "/work/z.iso");
    assert_eq!(
        (big.sha256.as_deref(), big.skipped.as_deref()),
        (None, Some("too large"))
    );
    assert!(summary_text(&s).contains("  seal-only /work/z.iso  8.0 GiB  no hash: too large"));
    assert!(
        s.files
            .iter()
            .all(|f| f.path != "/dev/null" && f.path != "/work/src.c")
    );
}

#[test]
fn without_seal_files_sizes_and_hashes_are_unknown() {
    let s = summary(false);
    assert!(!s.seal_has_files);
    assert!(
        s.files
            .iter()
            .all(|f| f.size.is_none() && f.sha256.is_none())
    );
    let text = summary_text(&s);
    assert!(text.contains("the seal lists no files"), "{text}");
    assert!(
        text.contains("  created   /work/new.txt (create)  -  -"),
        "{text}"
    );
}

#[test]
fn destinations_refusals_and_failures_are_grouped() {
    let s = summary(true);
    let dest = |d: &str| s.destinations.iter().find(|x| x.dest == d).unwrap();
    assert_eq!(
        (
            dest("1.1.1.1:443").refused,
            dest("1.1.1.1:443").via.as_str()
        ),
        (1, "connect")
    );
    assert_eq!(dest("[::1]:8080").allowed, 1);
    assert_eq!(dest("evil.example:443").refused, 1);
    let crates = dest("crates.io:443");
    assert_eq!(
        (crates.allowed, crates.bytes_up, crates.bytes_down),
        (1, 100, 20_000)
    );
    let ssh = s
        .refusals
        .iter()
        .find(|r| r.target.contains(".ssh"))
        .unwrap();
    assert_eq!(
        (ssh.mechanism, ssh.count, ssh.errno.as_deref()),
        ("filesystem", 2, Some("EACCES"))
    );
    assert_eq!(ssh.command.as_deref(), Some("/usr/bin/make"));
    assert_eq!(ssh.ancestry, ["10 /bin/sh -c make"]);
    let mechanisms: Vec<&str> = s.refusals.iter().map(|r| r.mechanism).collect();
    assert_eq!(mechanisms, ["filesystem", "network", "network", "signal"]);
    assert_eq!(s.failures.get("EEXIST"), Some(&1));
    let proxy = s.refusals.iter().find(|r| r.kind == "proxy").unwrap();
    assert_eq!((proxy.pid, proxy.command.as_deref()), (None, None));
    assert!(summary_text(&s).contains("      by an unknown process (the record names no pid)"));
    assert_eq!(
        (
            s.processes.processes,
            s.processes.execs,
            s.processes.max_depth
        ),
        (3, 2, 1)
    );
}

#[test]
fn the_text_fits_a_screen_and_starts_with_the_verdict() {
    let s = summary(true);
    let text = summary_text(&s);
    assert!(text.starts_with("log: ok: "), "{text}");
    assert!(text.lines().count() < 50, "{text}");
    assert!(
        text.contains("  created   /work/new.txt (create)  0 B  sha256 cccccccccccccccc…"),
        "{text}"
    );
    assert!(
        text.contains("  renamed   /work/a -> /work/b (rename)  3 B"),
        "{text}"
    );
    assert!(
        text.contains(
            "  filesystem (2):\n    open path=/home/u/.ssh/id flags=O_RDONLY (EACCES) ×2 [read_denies /home/u/.ssh]\n      by 11 /usr/bin/make <- 10 /bin/sh -c make"
        ),
        "{text}"
    );
    assert!(
        text.contains("ordinary failures (not refusals): 1 (EEXIST 1)"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&summary_json(&s)).unwrap();
    assert_eq!(json["files"].as_array().unwrap().len(), s.files.len());
}

/// One refusal of `/home/u/.ssh/id` by each of four processes: pid 11
/// running `evil`, then (after its exit) a new pid 11 running `make`; pid
/// 12 running `evil`, then `make` after an exec. Counting them by pid put
/// the second of each under the first's command (`×2 by 11 evil`), so an
/// agent could file its own refusals under an innocent program's name, or
/// an innocent program's under its own.
#[test]
fn a_reused_pid_or_an_exec_starts_a_new_refusal_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(Genesis {
        degraded: Vec::new(),
        ..genesis()
    })
    .unwrap();
    let exec = |pid, ms, prog: &str| {
        effect(
            "exec",
            pid,
            10,
            ms,
            json!({"path": prog, "argv": [prog]}),
            None,
        )
    };
    let refused = |pid, ms| {
        effect(
            "open",
            pid,
            10,
            ms,
            json!({"path": "/home/u/.ssh/id", "flags": 0}),
            Some(13),
        )
    };
    let mut records = vec![
        exec(10, 1, "/bin/sh"),
        effect("fork", 10, 1, 2, json!({"child": 11}), None),
        exec(11, 3, "/usr/bin/evil"),
        refused(11, 4),
        effect("exit", 11, 10, 5, json!({"code": 0}), None),
        effect("fork", 10, 1, 6, json!({"child": 11}), None),
        exec(11, 7, "/usr/bin/make"),
        refused(11, 8),
        effect("exit", 11, 10, 9, json!({"code": 0}), None),
        effect("fork", 10, 1, 10, json!({"child": 12}), None),
        exec(12, 11, "/usr/bin/evil"),
        refused(12, 12),
        exec(12, 13, "/usr/bin/make"),
        refused(12, 14),
        effect("exit", 12, 10, 15, json!({"code": 0}), None),
        effect("exit", 10, 1, 16, json!({"code": 0}), None),
    ];
    for r in &mut records {
        w.record(r).unwrap();
    }
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let s = summarize(&path, None).unwrap();
    let mut by: Vec<(Option<u64>, Option<&str>, u64)> = s
        .refusals
        .iter()
        .map(|r| (r.pid, r.command.as_deref(), r.count))
        .collect();
    by.sort();
    assert_eq!(
        by,
        [
            (Some(11), Some("/usr/bin/evil"), 1),
            (Some(11), Some("/usr/bin/make"), 1),
            (Some(12), Some("/usr/bin/evil"), 1),
            (Some(12), Some("/usr/bin/make"), 1),
        ]
    );
}

/// 100,000 files made first fill the summary's table of files; a git
/// hook written after them was then on no line (not even `seal-only`),
/// while the summary promises to list what the reviewer's next `git`
/// command runs first.
#[test]
fn a_git_hook_written_after_the_file_table_is_full_is_still_listed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_batch_bytes(1 << 20);
    w.genesis(Genesis {
        degraded: Vec::new(),
        policy: json!({"writable_roots": ["/work"]}),
        ..genesis()
    })
    .unwrap();
    let create = |p: String| effect("create", 10, 1, 1, json!({"path": p, "flags": 0o301}), None);
    for i in 0..100_000 {
        w.record(&mut create(format!("/work/f{i}"))).unwrap();
    }
    let hook = "/work/r/.git/hooks/pre-commit";
    w.record(&mut create(hook.to_string())).unwrap();
    let config = "/work/r/.git/config";
    let h = "a".repeat(64);
    let files = vec![json!({"path": config, "size": 1, "sha256": h})];
    w.seal_with_files(
        Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        },
        Some(files),
    )
    .unwrap();
    let s = summarize(&path, None).unwrap();
    let text = summary_text(&s);
    for p in [hook, config] {
        assert!(
            text.lines()
                .any(|l| l.contains(p) && l.ends_with("[git runs this]")),
            "{p}:\n{text}"
        );
    }
}

/// A write whose file's links were forgotten (`links_forgotten`: no file
/// has its name, and where the file lives is unknown) is no sign the
/// name exists again: it was taken for one, and `x` shown `created`.
#[test]
fn a_write_with_forgotten_links_does_not_bring_a_name_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    let x = "/work/x";
    let mut records = vec![
        effect("create", 10, 1, 1, json!({"path": x, "flags": 0o301}), None),
        effect("unlink", 10, 1, 2, json!({"path": x}), None),
        effect(
            "write",
            10,
            1,
            3,
            json!({"path": x, "count": 1, "path_source": "kernel", "links_forgotten": true}),
            None,
        ),
    ];
    for r in &mut records {
        w.record(r).unwrap();
    }
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let s = summarize(&path, None).unwrap();
    assert_eq!(s.verify_code, 3, "{}", s.verify);
    assert_eq!(file(&s, x).change, "deleted", "{:#?}", s.files);
}

#[test]
fn an_unproven_claim_is_listed_as_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    let (l, r) = ("/work/l", "/work/r");
    let claim = json!({"path": l, "mode": 0o777, "path_source": "agent", "claim_unproven": true});
    let attrib = json!({"path": r, "path_source": "kernel", "uncaptured": true});
    for mut e in [
        effect("chmod", 10, 1, 1, claim, None),
        effect("attrib", 10, 1, 2, attrib, None),
    ] {
        w.record(&mut e).unwrap();
    }
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let s = summarize(&path, None).unwrap();
    assert_eq!(
        file(&s, l).actions,
        ["claimed chmod 0777"],
        "{:#?}",
        s.files
    );
    assert_eq!(file(&s, r).actions, ["attrib"], "{:#?}", s.files);
}

/// 10,000 distinct refused writes outside the roots fill the table of
/// refusals; a refused read of a denied secret after them was counted in
/// `refusals_more` with no line. It is kept, and listed first.
#[test]
fn a_denied_read_after_the_refusal_table_is_full_is_listed_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_batch_bytes(1 << 20);
    w.genesis(Genesis {
        degraded: Vec::new(),
        policy: json!({"writable_roots": ["/work"], "read_denies": ["/home/u/.ssh"]}),
        ..genesis()
    })
    .unwrap();
    let open = |p: String, flags: u64, errno| {
        effect(
            "open",
            10,
            1,
            1,
            json!({"path": p, "flags": flags}),
            Some(errno),
        )
    };
    for i in 0..10_001 {
        w.record(&mut open(format!("/etc/decoy{i}"), 0o101, 30))
            .unwrap();
    }
    w.record(&mut open("/home/u/.ssh/id".to_string(), 0, 13))
        .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let s = summarize(&path, None).unwrap();
    assert_eq!(s.refusals_more, 1);
    assert!(
        s.refusals[0].target.contains("/home/u/.ssh/id"),
        "{:?}",
        s.refusals[0]
    );
    let text = summary_text(&s);
    assert!(text.contains("[read_denies /home/u/.ssh]"), "{text}");
}
