//! Helpers shared by the effect log's unit tests.

use std::path::Path;

use serde_json::{Value, json};

use super::{Decision, ExitStatus, Genesis, LogWriter, Record, Seal};

pub(crate) fn genesis() -> Genesis {
    Genesis {
        version: "0.1.0".into(),
        kernel: "6.18.0-test".into(),
        policy: json!({"writable_roots": ["/work"], "local_ports": [8080]}),
        installed: vec!["landlock".into(), "seccomp".into()],
        degraded: vec!["unix-socket-policy".into()],
        programs: vec!["0123456789abcdef".into()],
        started_wall_ns: 1_700_000_000_000_000_000,
        started_mono_ns: 1_000_000_000,
    }
}

/// A record of `kind` by `pid` at `at_ms` after the genesis, denied with
/// the errno in `denied` if any.
pub(crate) fn effect(
    kind: &'static str,
    pid: u32,
    ppid: u32,
    at_ms: u64,
    t: Value,
    denied: Option<u64>,
) -> Record {
    Record {
        kind,
        pid,
        ppid,
        uid: 1000,
        mono_ns: 1_000_000_000 + at_ms * 1_000_000,
        wall_ns: 1_700_000_000_000_000_000 + at_ms * 1_000_000,
        target: t.as_object().cloned().unwrap_or_default().into(),
        decision: if denied.is_some() {
            Decision::Denied
        } else {
            Decision::Allowed
        },
        errno: denied.unwrap_or(0),
    }
}

/// A small sealed log: a shell that forks a child which execs, opens, is
/// denied a read, and exits.
pub(crate) fn write_sample(path: &Path) -> LogWriter {
    let mut w = LogWriter::create(path).unwrap();
    w.genesis(genesis()).unwrap();
    w.record(&mut effect(
        "exec",
        10,
        1,
        1,
        json!({"path": "/bin/sh", "argv": ["sh", "-c", "cat x"]}),
        None,
    ))
    .unwrap();
    w.record(&mut effect("fork", 10, 1, 2, json!({"child": 11}), None))
        .unwrap();
    w.record(&mut effect(
        "exec",
        11,
        10,
        3,
        json!({"path": "/bin/cat", "argv": ["cat", "x"]}),
        None,
    ))
    .unwrap();
    w.record(&mut effect(
        "open",
        11,
        10,
        4,
        json!({"path": "/work/x", "flags": "O_RDONLY"}),
        None,
    ))
    .unwrap();
    w.record(&mut effect(
        "open",
        11,
        10,
        5,
        json!({"path": "/etc/shadow"}),
        Some(13),
    ))
    .unwrap();
    w.record(&mut effect("exit", 11, 10, 6, json!({"code": 1}), None))
        .unwrap();
    w.record(&mut effect("exit", 10, 1, 7, json!({"code": 0}), None))
        .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    w
}
