use serde_json::json;

use super::*;
use crate::effectlog::testutil::{effect, genesis};
use crate::effectlog::{ExitStatus, Genesis, LogWriter, Seal};

fn clean_genesis() -> Genesis {
    // No degraded guarantee: the sample verifies as plain ok.
    Genesis {
        degraded: Vec::new(),
        ..genesis()
    }
}

/// A shell that forks a child which execs, opens, is refused a read, fails
/// a mkdir, appends to a log, and exits; a proxy record written late.
fn sample(path: &Path) {
    let mut w = LogWriter::create(path).unwrap();
    w.genesis(clean_genesis()).unwrap();
    let e = |kind, pid, ppid, ms, t, errno| effect(kind, pid, ppid, ms, t, errno);
    w.record(&mut e(
        "exec",
        10,
        1,
        1,
        json!({"path": "/bin/sh", "argv": ["sh", "-c", "cat x"]}),
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
        json!({"path": "/bin/cat", "argv": ["cat", "x"]}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        4,
        json!({"path": "/work/x", "flags": 0}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "open",
        11,
        10,
        5,
        json!({"path": "/etc/shadow", "flags": 0}),
        Some(13),
    ))
    .unwrap();
    w.record(&mut e(
        "mkdir",
        11,
        10,
        6,
        json!({"path": "/work/d", "mode": 493}),
        Some(17),
    ))
    .unwrap();
    w.record(&mut e(
        "create",
        11,
        10,
        7,
        json!({"path": "/work/log.txt", "flags": 0o2101, "mode": 0o644}),
        None,
    ))
    .unwrap();
    w.record(&mut e(
        "signal",
        11,
        10,
        8,
        json!({"to": 1, "signal": 9}),
        Some(1),
    ))
    .unwrap();
    w.record(&mut e("exit", 11, 10, 9, json!({"code": 1}), None))
        .unwrap();
    // Written at the end of its connection, 8.5 ms after it started.
    w.record(&mut e(
        "proxy",
        10,
        1,
        10,
        json!({"host": "evil.example", "port": 443, "method": "CONNECT",
        "reason": "domain not allowed", "duration_us": 8500}),
        Some(0),
    ))
    .unwrap();
    w.record(&mut e("exit", 10, 1, 11, json!({"code": 0}), None))
        .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
}

fn run(path: &Path, opts: &ShowOptions) -> String {
    let mut out = Vec::new();
    show(path, opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn with(filter: Filter) -> ShowOptions {
    ShowOptions {
        filter,
        ..Default::default()
    }
}

fn sample_log() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    sample(&path);
    (dir, path)
}

#[test]
fn timeline_names_numbers_and_tells_refusals_from_failures() {
    let (_d, path) = sample_log();
    let out = run(&path, &ShowOptions::default());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 13, "{out}");
    assert!(
        lines[0].contains("genesis") && lines[0].contains("6.18.0-test"),
        "{out}"
    );
    assert_eq!(
        lines[5],
        "    +4.000ms      11 open     path=/work/x flags=O_RDONLY  allowed"
    );
    assert_eq!(
        lines[6],
        "    +5.000ms      11 open     path=/etc/shadow flags=O_RDONLY  REFUSED (EACCES, filesystem: no policy rule: file permissions?)"
    );
    assert_eq!(
        lines[7],
        "    +6.000ms      11 mkdir    path=/work/d mode=0755  failed (EEXIST)"
    );
    // An append is an open with O_CREAT, not a create.
    assert_eq!(
        lines[8],
        "    +7.000ms      11 open     path=/work/log.txt flags=O_WRONLY|O_CREAT|O_APPEND mode=0644  allowed"
    );
    assert!(
        lines[9].contains("to=1 signal=SIGKILL  REFUSED (EPERM, signal)"),
        "{out}"
    );
    assert!(
        lines[12].contains("seal") && lines[12].contains("exit code 0"),
        "{out}"
    );
}

#[test]
fn late_proxy_records_are_put_back_in_time_order() {
    let (_d, path) = sample_log();
    let out = run(&path, &ShowOptions::default());
    let lines: Vec<&str> = out.lines().collect();
    // Started at +1.5 ms, written at +10 ms.
    assert!(
        lines[2].contains("proxy") && lines[2].starts_with("    +1.500ms"),
        "{out}"
    );
    assert!(lines[2].ends_with("REFUSED (network)"), "{out}");
}

#[test]
fn denied_failed_kinds_paths_and_times_filter() {
    let (_d, path) = sample_log();
    let denied = run(
        &path,
        &with(Filter {
            denied: true,
            ..Default::default()
        }),
    );
    assert_eq!(denied.lines().count(), 3, "{denied}");
    assert!(
        denied.contains("/etc/shadow") && denied.contains("SIGKILL") && denied.contains("evil")
    );
    let failed = run(
        &path,
        &with(Filter {
            failed: true,
            ..Default::default()
        }),
    );
    assert_eq!(failed.lines().count(), 1, "{failed}");
    assert!(failed.contains("EEXIST"), "{failed}");
    let kinds = expand_kinds(&["exec".into(), "exit".into()]).unwrap();
    let procs = run(
        &path,
        &with(Filter {
            kinds,
            ..Default::default()
        }),
    );
    assert_eq!(procs.lines().count(), 4, "{procs}");
    let files = run(
        &path,
        &with(Filter {
            kinds: expand_kinds(&["file".into()]).unwrap(),
            ..Default::default()
        }),
    );
    assert_eq!(files.lines().count(), 4, "{files}");
    let glob = run(
        &path,
        &with(Filter {
            path: Some("/work/*".into()),
            ..Default::default()
        }),
    );
    assert_eq!(glob.lines().count(), 3, "{glob}");
    let window = Filter {
        since: Some(TimeBound::Relative(4_000_000)),
        until: Some(TimeBound::Relative(6_000_000)),
        ..Default::default()
    };
    assert_eq!(run(&path, &with(window)).lines().count(), 3);
}

#[test]
fn json_prints_records_whole_one_per_line() {
    let (_d, path) = sample_log();
    let opts = ShowOptions {
        json: true,
        filter: Filter {
            denied: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let out = run(&path, &opts);
    let records: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0]["target"]["path"], "/etc/shadow");
    assert_eq!(records[0]["errno"], 13);
}

#[test]
fn tree_nests_children_and_combines_with_filters() {
    let (_d, path) = sample_log();
    let out = run(
        &path,
        &ShowOptions {
            tree: true,
            ..Default::default()
        },
    );
    assert_eq!(
        out,
        "10 (parent 1): /bin/sh -c \"cat x\" [exit code 0]\n  11: /bin/cat x [exit code 1]\n"
    );
    let refused = ShowOptions {
        tree: true,
        filter: Filter {
            denied: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let out = run(&path, &refused);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "10 (parent 1): /bin/sh -c \"cat x\" [exit code 0]",
        "{out}"
    );
    assert!(lines[1].starts_with("  - +1.500ms proxy"), "{out}");
    assert_eq!(lines[2], "  11: /bin/cat x [exit code 1]");
    assert!(
        lines[3].starts_with("    - +5.000ms open path=/etc/shadow"),
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");
    let sub = ShowOptions {
        tree: true,
        filter: Filter {
            pid: Some(11),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        run(&path, &sub),
        "11 (parent 10): /bin/cat x [exit code 1]\n"
    );
}

#[test]
fn tree_handles_pid_reuse_and_missing_exits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(clean_genesis()).unwrap();
    w.record(&mut effect("fork", 5, 1, 1, json!({"child": 6}), None))
        .unwrap();
    w.record(&mut effect("exit", 6, 5, 2, json!({"signal": 9}), None))
        .unwrap();
    w.record(&mut effect("fork", 5, 1, 3, json!({"child": 6}), None))
        .unwrap();
    w.record(&mut effect(
        "exec",
        6,
        5,
        4,
        json!({"path": "/bin/x"}),
        Some(1),
    ))
    .unwrap();
    drop(w);
    let out = run(
        &path,
        &ShowOptions {
            tree: true,
            ..Default::default()
        },
    );
    let body: Vec<&str> = out.lines().skip(1).collect();
    assert!(out.starts_with("WARNING: this log is UNSEALED"), "{out}");
    assert_eq!(
        body,
        [
            "5 (parent 1): (no exec) [no exit recorded]",
            "  6: (no exec) [killed by SIGKILL]",
            "  6: /bin/x (REFUSED (EPERM, filesystem: no policy rule)) [no exit recorded]"
        ]
    );
}

#[test]
fn hostile_names_cannot_drive_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(clean_genesis()).unwrap();
    w.record(&mut effect(
        "create",
        5,
        1,
        1,
        json!({"path": "/w/\u{1b}[2J\u{202e}x\n"}),
        None,
    ))
    .unwrap();
    w.record(&mut effect(
        "exec",
        5,
        1,
        2,
        json!({"path": "/bin/sh", "argc": 3,
        "argv": ["sh", "-c", format!("make test{}; echo pwned > x", " ".repeat(1100))],
        "argv_truncated": true}),
        None,
    ))
    .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    drop(w);
    let out = run(&path, &ShowOptions::default());
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{202e}'),
        "{out:?}"
    );
    assert_eq!(out.lines().count(), 4, "{out:?}");
    assert!(out.contains(r"/w/\u{1b}[2J\u{202e}x\n"), "{out}");
    assert!(
        out.contains("/bin/sh -c \"make test[1100 spaces]; echo pwned > x\" [ARGV TRUNCATED: 3 of 3 arguments shown]"),
        "{out}"
    );
    let json = run(
        &path,
        &ShowOptions {
            json: true,
            ..Default::default()
        },
    );
    assert!(
        !json.contains('\u{202e}') && json.contains(r"\u202e"),
        "{json}"
    );
    for line in json.lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
}

#[test]
fn a_log_that_does_not_verify_gets_a_warning_first() {
    let (_d, path) = sample_log();
    let mut data = std::fs::read(&path).unwrap();
    data.extend_from_slice(b"{not json\n");
    std::fs::write(&path, data).unwrap();
    let mut out = Vec::new();
    let verdict = show(&path, &ShowOptions::default(), &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(verdict.code, 1);
    assert!(
        out.starts_with("WARNING: this log has been TAMPERED with"),
        "{out}"
    );
    assert!(
        out.ends_with("line 14: (not a readable record: not valid JSON)\n"),
        "{out}"
    );
}

#[test]
fn a_closed_output_is_an_output_error_not_a_panic() {
    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (_d, path) = sample_log();
    for tree in [false, true] {
        let r = show(
            &path,
            &ShowOptions {
                tree,
                ..Default::default()
            },
            &mut Closed,
        );
        assert!(matches!(r, Err(LogError::Output { .. })), "{r:?}");
    }
}

#[test]
fn deep_trees_are_indented_by_number() {
    assert_eq!(tree::indent(2), "    ");
    assert_eq!(
        tree::indent(60_000),
        format!("{}[depth 60000] ", "  ".repeat(tree::MAX_INDENT))
    );
}

#[test]
fn a_record_with_thousands_of_fields_prints_one_bounded_line() {
    let mut target = serde_json::Map::new();
    for i in 0..1000 {
        target.insert(format!("k{i:04}"), Value::from("v".repeat(100)));
    }
    let rec = json!({"kind": "open", "decision": "allowed", "errno": 0, "target": target});
    let line = render::timeline_line(rec.as_object().unwrap(), Some(0), None);
    assert!(
        line.ends_with("…968 more fields  allowed"),
        "{}",
        &line[line.len() - 80..]
    );
    assert!(line.len() < 8 << 10, "{} bytes", line.len());
}

#[test]
fn no_reader_panics_on_records_of_the_wrong_shape() {
    let (dir, path) = sample_log();
    let text = std::fs::read_to_string(&path).unwrap();
    let weird = [
        Value::Null,
        json!(-1),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!({}),
        json!([1, "a", null]),
        json!({"code": "x", "signal": []}),
    ];
    let mut lines = Vec::new();
    for line in text.lines() {
        let rec: Map<String, Value> = serde_json::from_str(line).unwrap();
        for key in rec.keys().cloned().collect::<Vec<_>>() {
            for w in &weird {
                let mut bad = rec.clone();
                bad.insert(key.clone(), w.clone());
                lines.push(serde_json::to_string(&bad).unwrap());
                if let Some(Value::Object(t)) = rec.get("target") {
                    for tk in t.keys() {
                        let mut bad = rec.clone();
                        bad["target"][tk] = w.clone();
                        lines.push(serde_json::to_string(&bad).unwrap());
                    }
                }
            }
        }
    }
    lines.push("[]".into());
    lines.push("{}".into());
    let hostile = dir.path().join("shapes.jsonl");
    std::fs::write(&hostile, lines.join("\n") + "\n").unwrap();
    for opts in [
        ShowOptions::default(),
        ShowOptions {
            tree: true,
            ..Default::default()
        },
        ShowOptions {
            json: true,
            ..Default::default()
        },
        with(Filter {
            denied: true,
            failed: true,
            path: Some("**".into()),
            ..Default::default()
        }),
        ShowOptions {
            tree: true,
            filter: Filter {
                denied: true,
                since: Some(TimeBound::Relative(1)),
                ..Default::default()
            },
            ..Default::default()
        },
    ] {
        let mut out = Vec::new();
        let verdict = show(&hostile, &opts, &mut out).unwrap();
        assert_eq!(verdict.code, 1);
    }
    let s = crate::effectlog::summarize(&hostile, None).unwrap();
    let _ = crate::effectlog::summary_text(&s);
    let _ = crate::effectlog::summary_json(&s);
    assert_eq!(
        crate::effectlog::report(&hostile, &dir.path().join("r.html"), None).unwrap(),
        1
    );
}

#[test]
fn an_exec_shows_what_the_kernel_ran_when_the_name_says_otherwise() {
    let linked =
        json!({"path": "/w/run-tests", "binary": "/usr/bin/curl", "argv": ["run-tests", "x"]});
    assert_eq!(
        render::exec_text(&linked, 100),
        "/w/run-tests [runs /usr/bin/curl] x"
    );
    let memfd = json!({"path": "/dev/fd/3", "binary_tail": "memfd:p", "binary_deleted": true, "argv": ["p"]});
    assert_eq!(
        render::exec_text(&memfd, 100),
        "/dev/fd/3 [runs memfd:p (deleted)]"
    );
    let script = json!({"path": "/w/run-tests", "binary": "/usr/bin/dash", "script": "/w/evil.sh", "argv": ["/bin/sh", "./run-tests"]});
    assert_eq!(
        render::exec_text(&script, 100),
        "/w/run-tests [runs /usr/bin/dash /w/evil.sh] ./run-tests"
    );
    let named = json!({"path": "/w/evil.sh", "binary": "/usr/bin/dash", "script": "/w/evil.sh", "argv": ["/bin/sh", "/w/evil.sh"]});
    assert_eq!(
        render::exec_text(&named, 100),
        "/w/evil.sh [runs /usr/bin/dash] /w/evil.sh"
    );
    let same = json!({"path": "/usr/bin/true", "binary": "/usr/bin/true", "argv": ["true"]});
    assert_eq!(render::exec_text(&same, 100), "/usr/bin/true");
}
