//! The JSON Schema of the records (docs/effect-log.schema.json), checked
//! with a real validator against logs of every kind and of a real run.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use tartaros::effectlog::{ExitStatus, Seal};

use super::{ci, effect, real_run, sealed, write_log};
use crate::common::*;

/// Validates every line of each log against docs/effect-log.schema.json
/// with Python's `jsonschema` (Draft 2020-12).
fn validate(logs: &[&Path]) {
    let probe = Command::new("python3")
        .args(["-c", "import jsonschema"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            !ci(),
            "python3-jsonschema is missing: cargo xtask deps installs it"
        );
        eprintln!("skipping the schema check: python3 jsonschema is not installed");
        return;
    }
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/effect-log.schema.json");
    let code = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
bad = 0
for name in sys.argv[2:]:
    for n, line in enumerate(open(name, encoding="utf-8"), 1):
        for e in v.iter_errors(json.loads(line)):
            bad += 1
            print(f"{name}:{n}: {e.json_path}: {e.message[:300]}")
sys.exit(1 if bad else 0)
"#;
    let out = Command::new("python3")
        .args(["-c", code, schema.to_str().unwrap()])
        .args(logs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
}

#[test]
fn the_schema_describes_every_record_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), "all.jsonl", |w| {
        // Each record's kind is set from its row below.
        let e = |t: Value, errno| effect("exec", 5, 1, 1, t, errno);
        let records = [
            (
                "exec",
                e(json!({"path": "/bin/sh", "argv": ["sh"], "argc": 1}), 0),
            ),
            ("fork", e(json!({"child": 6}), 0)),
            ("open", e(json!({"path": "/a", "flags": 0}), 13)),
            (
                "create",
                e(json!({"path": "/a", "flags": 577, "mode": 420}), 0),
            ),
            ("write", e(json!({"path": "/a", "bytes": 10}), 0)),
            ("unlink", e(json!({"path": "/a"}), 2)),
            ("rename", e(json!({"from": "/a", "to": "/b"}), 0)),
            ("chmod", e(json!({"path": "/b", "mode": 493}), 0)),
            ("truncate", e(json!({"path": "/b", "length": 0}), 0)),
            ("mkdir", e(json!({"path": "/d", "mode": 493}), 17)),
            ("rmdir", e(json!({"path": "/d"}), 0)),
            ("link", e(json!({"from": "/b", "to": "/c"}), 18)),
            (
                "symlink",
                e(json!({"target": "/etc/passwd", "path": "/p"}), 0),
            ),
            ("chown", e(json!({"path": "/b", "uid": 0, "gid": 0}), 1)),
            (
                "connect",
                e(json!({"family": "inet", "addr": "1.1.1.1", "port": 443}), 1),
            ),
            (
                "sendto",
                e(json!({"family": "inet6", "addr": "::1", "port": 53}), 1),
            ),
            (
                "proxy",
                e(
                    json!({"host": "x.example", "port": 443, "method": "CONNECT", "reason": "domain not allowed"}),
                    0,
                ),
            ),
            (
                "broker",
                e(
                    json!({"capability": "gh", "method": "GET", "path": "/user", "status": 200}),
                    0,
                ),
            ),
            ("signal", e(json!({"to": 1, "signal": 9}), 1)),
            ("exit", e(json!({"code": 0}), 0)),
        ];
        for (kind, mut r) in records {
            r.kind = kind;
            w.record(&mut r).unwrap();
        }
        w.gap(3, "open").unwrap();
        let files = vec![json!({"path": "/b", "size": 3, "sha256": "ab".repeat(32)})];
        w.seal_with_files(
            Seal {
                exit_status: ExitStatus::Signal(9),
                cgroup_empty: false,
            },
            Some(files),
        )
        .unwrap();
    });
    let plain = write_log(dir.path(), "plain.jsonl", sealed);
    validate(&[&path, &plain]);
}

#[test]
fn the_schema_accepts_a_real_run() {
    if !can_run("review_schema_real") {
        return;
    }
    let run = real_run();
    validate(&[&run.log]);
}

#[test]
fn the_schema_lists_exactly_the_record_kinds_the_writer_knows() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/effect-log.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut listed: Vec<&str> = schema["properties"]["kind"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let mut known: Vec<&str> = tartaros::effectlog::EFFECT_KINDS.to_vec();
    known.extend(["genesis", "gap", "seal"]);
    listed.sort();
    known.sort();
    assert_eq!(
        listed, known,
        "update docs/effect-log.schema.json with the new kinds"
    );
}
