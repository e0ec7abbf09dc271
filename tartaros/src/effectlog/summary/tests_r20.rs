//! Adversarial round 20: what the summary's cuts and ordering let an agent
//! hide behind decoys, and two explanations it got wrong.

use serde_json::json;

use super::*;
use crate::effectlog::testutil::{effect, genesis};
use crate::effectlog::{ExitStatus, Genesis, LogWriter, Record, Seal};

/// A sealed log of `records` with `/work` writable and `/work/secret`
/// read-denied.
fn summary_of(records: Vec<Record>) -> Summary {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_batch_bytes(1 << 20);
    w.genesis(Genesis {
        degraded: Vec::new(),
        policy: json!({"writable_roots": ["/work"], "read_denies": ["/work/secret"]}),
        ..genesis()
    })
    .unwrap();
    for mut r in records {
        w.record(&mut r).unwrap();
    }
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    summarize(&path, None).unwrap()
}

fn rec(kind: &'static str, t: Value, denied: Option<u64>) -> Record {
    effect(kind, 10, 1, 1, t, denied)
}

/// 20 refused proxy decoys, then a `--port` relay that carried data: the
/// list put refused destinations first and the screen cut it at 12.
#[test]
fn a_destination_that_moved_data_comes_before_refused_decoys() {
    let mut records: Vec<Record> = (0..20)
        .map(|i| {
            let host = format!("decoy{i:03}.example.org");
            rec("proxy", json!({"host": host, "port": 443}), Some(0))
        })
        .collect();
    // More refused destinations than the table holds: the relay still fits.
    records.extend((0..MAX_DESTINATIONS).map(|i| {
        let t = json!({"family": "inet", "addr": "192.0.2.1", "port": i % 65536, "fd": 3});
        let mut r = rec("connect", t, Some(1));
        if i >= 65_536 {
            r.kind = "sendto";
        }
        r
    }));
    let relay = json!({"dest": "127.0.0.1:8765", "via": "port-forward", "bytes_up": 31, "bytes_down": 1710});
    records.push(rec("connect", relay, None));
    let s = summary_of(records);
    assert_eq!(s.destinations[0].dest, "127.0.0.1:8765");
    assert_eq!(s.destinations[0].via, "relay");
    let text = summary_text(&s);
    let net = text.split("network destinations").nth(1).unwrap();
    let first = net.lines().nth(1).unwrap();
    assert!(first.contains("127.0.0.1:8765"), "{text}");
    assert!(first.contains("31 B up"), "{text}");
}

/// 31 created decoys, then rewrites of two files the tree had: the list
/// was alphabetical and cut at 20, so neither rewrite was on the screen.
#[test]
fn files_the_tree_had_come_before_created_decoys() {
    let mut records: Vec<Record> = (10..41)
        .map(|i| {
            rec(
                "create",
                json!({"path": format!("/work/.a{i}"), "flags": 577}),
                None,
            )
        })
        .collect();
    // The capture names an open's file by its inode when the open created
    // nothing.
    let existing = |p: &str, flags: u64| {
        let t = json!({"path": p, "flags": flags, "ino": 7, "dev": 65024, "path_source": "kernel"});
        rec("create", t, None)
    };
    records.push(existing("/work/Makefile", 577));
    records.push(existing("/work/.github/workflows/ci.yml", 1089));
    records.push(rec(
        "chmod",
        json!({"path": "/work/run.sh", "mode": 0o755}),
        None,
    ));
    let s = summary_of(records);
    let order: Vec<&str> = s.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        order[..3],
        [
            "/work/.github/workflows/ci.yml",
            "/work/Makefile",
            "/work/run.sh"
        ]
    );
    assert_eq!(s.files[1].change, "modified");
    assert_eq!(s.files[1].actions, ["overwrite"]);
    assert_eq!(s.files[3].change, "written");
    let text = summary_text(&s);
    for p in ["/work/Makefile", "/work/.github/workflows/ci.yml"] {
        assert!(text.contains(&format!("  modified  {p}")), "{text}");
    }
    assert!(text.contains("… and 14 more"), "{text}");
}

/// Twelve agent-built programs run twice each, then `base64` and `od`
/// once: `ran:` kept the ten most run and said nothing of the rest.
#[test]
fn every_program_run_is_listed_or_counted() {
    let mut records = Vec::new();
    for i in 1..=12 {
        for _ in 0..2 {
            let p = format!("/work/t{i}");
            records.push(rec("exec", json!({"path": p, "argv": [p]}), None));
        }
    }
    for _ in 0..5 {
        let t = json!({"path": "/usr/bin/git", "argv": ["git", "status"]});
        records.push(rec("exec", t, None));
    }
    for p in ["/usr/bin/base64", "/usr/bin/od"] {
        records.push(rec("exec", json!({"path": p, "argv": [p]}), None));
    }
    // A name in /usr/bin that runs the agent's file is not a common tool.
    let t = json!({"path": "/usr/bin/ls", "binary": "/work/evil", "argv": ["ls"]});
    records.push(rec("exec", t, None));
    let s = summary_of(records);
    let p = &s.processes;
    assert_eq!((p.programs.len(), p.programs_more), (16, 0));
    assert!(
        p.programs[0].0.starts_with("/usr/bin/ls -> "),
        "{:?}",
        p.programs
    );
    let git = p.programs.iter().position(|(n, _)| n == "/usr/bin/git");
    assert_eq!(git, Some(13), "{:?}", p.programs);
    let text = summary_text(&s);
    assert!(
        text.contains("  … and 6 more (log summary --json lists them)"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&summary_json(&s)).unwrap();
    assert_eq!(json["processes"]["programs_more"], 0);
    assert_eq!(
        json["processes"]["programs"].as_array().map(Vec::len),
        Some(16)
    );
}

/// A refused open whose name the capture could not read: no rule can be
/// matched, and the summary guessed file permissions.
#[test]
fn a_refused_open_of_an_unreadable_name_says_so() {
    let t = json!({"path": "", "flags": 0, "path_source": "agent", "path_unreadable": true});
    let s = summary_of(vec![rec("open", t, Some(13))]);
    assert_eq!(
        s.refusals[0].why.as_deref(),
        Some("name unreadable: no rule can be matched")
    );
    assert!(summary_text(&s).contains("[name unreadable: no rule can be matched]"));
}

/// A pathname unix socket's `bind` makes a file in the root, as mkfifo
/// does; it was on no line. An abstract one makes none.
#[test]
fn a_socket_file_made_by_bind_is_listed_as_created() {
    let sock =
        json!({"family": "unix", "fd": 3, "path": "/work/planted.sock", "path_source": "kernel"});
    let abs = json!({"family": "unix", "fd": 4, "path": "@hidden"});
    let inet = json!({"family": "inet", "fd": 5, "addr": "127.0.0.1", "port": 80});
    let s = summary_of(vec![
        rec("bind", sock, None),
        rec("bind", abs, None),
        rec("bind", inet, None),
    ]);
    assert_eq!(s.files.len(), 1, "{:?}", s.files);
    assert_eq!(
        (s.files[0].path.as_str(), s.files[0].change),
        ("/work/planted.sock", "created")
    );
    assert_eq!(s.files[0].actions, ["bind"]);
    assert!(summary_text(&s).contains("  created   /work/planted.sock (bind)"));
}

/// Round 22: files written on the run's own tmpfs mounts were listed
/// beside the roots' with nothing to say they were gone with the run; the
/// header now names those mounts.
#[test]
fn the_private_tmpfs_mounts_are_named_as_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(Genesis {
        degraded: Vec::new(),
        policy: json!({"writable_roots": ["/work"], "private_tmp": true, "tmpfs": ["/scratch"]}),
        ..genesis()
    })
    .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let s = summarize(&path, None).unwrap();
    assert_eq!(s.run.discarded, ["/tmp", "/scratch"]);
    let text = summary_text(&s);
    assert!(
        text.contains("private tmpfs (discarded with the run): /tmp, /scratch"),
        "{text}"
    );
}
