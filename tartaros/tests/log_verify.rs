//! Writes a real effect log with `LogWriter` and checks that `verify` sees
//! every kind of damage: bit flips, deletions, swaps, insertions, appends
//! after the seal, truncation, and incomplete (lossy or unkilled) runs.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tartaros::effectlog::{
    Decision, ExitStatus, Genesis, LogWriter, Record, Seal, VERDICT_INCOMPLETE, VERDICT_OK,
    VERDICT_TAMPERED, VERDICT_UNSEALED, Verdict, verify_file, verify_reader,
};

fn verify(bytes: &[u8]) -> Verdict {
    verify_reader(bytes)
}

fn effect(kind: &'static str, pid: u32, ppid: u32, i: u64, target: Value, errno: u64) -> Record {
    let target: Map<String, Value> = target.as_object().cloned().unwrap_or_default();
    Record {
        kind,
        pid,
        ppid,
        uid: 1000,
        mono_ns: 5_000_000_000 + i * 250_000,
        wall_ns: 1_760_000_000_000_000_000 + i * 250_000,
        target: target.into(),
        decision: if errno == 0 {
            Decision::Allowed
        } else {
            Decision::Denied
        },
        errno,
    }
}

struct Opts {
    gap: bool,
    cgroup_empty: bool,
    /// How many of the 21 effect records to write.
    records: usize,
}

/// Genesis, up to 21 effect records of every kind (a few denied), optional
/// gap, two exits, seal.
fn write_log(path: &Path, o: Opts) -> Vec<u8> {
    let mut w = LogWriter::create(path).expect("create");
    w.set_secrets(vec![b"broker-token-0123456789".to_vec()]);
    w.genesis(Genesis {
        version: "0.1.0".into(),
        kernel: "6.18.0".into(),
        policy: json!({"writable_roots": ["/work"], "allow_domains": ["crates.io"]}),
        installed: vec!["landlock".into(), "seccomp".into(), "pid-ns".into()],
        degraded: vec![],
        programs: vec!["a1b2c3d4e5f60718".into()],
        started_wall_ns: 1_760_000_000_000_000_000,
        started_mono_ns: 5_000_000_000,
    })
    .expect("genesis");
    let records: Vec<(&str, u32, u32, Value, u64)> = vec![
        (
            "exec",
            2,
            1,
            json!({"path": "/bin/sh", "argv": ["sh", "-c", "make"]}),
            0,
        ),
        ("fork", 2, 1, json!({"child": 3}), 0),
        (
            "exec",
            3,
            2,
            json!({"path": "/usr/bin/make", "argv": ["make"]}),
            0,
        ),
        (
            "open",
            3,
            2,
            json!({"path": "/work/Makefile", "flags": "O_RDONLY"}),
            0,
        ),
        (
            "open",
            3,
            2,
            json!({"path": "/home/u/.ssh/id_ed25519", "flags": "O_RDONLY"}),
            13,
        ),
        ("create", 3, 2, json!({"path": "/work/out.o"}), 0),
        (
            "write",
            3,
            2,
            json!({"path": "/work/out.o", "bytes": 4096}),
            0,
        ),
        (
            "truncate",
            3,
            2,
            json!({"path": "/work/out.o", "length": 0}),
            0,
        ),
        (
            "chmod",
            3,
            2,
            json!({"path": "/work/run.sh", "mode": 493}),
            0,
        ),
        ("mkdir", 3, 2, json!({"path": "/work/build"}), 0),
        (
            "rename",
            3,
            2,
            json!({"from": "/work/out.o", "to": "/work/build/out.o"}),
            0,
        ),
        ("link", 3, 2, json!({"from": "/work/a", "to": "/work/b"}), 0),
        (
            "symlink",
            3,
            2,
            json!({"target": "/etc/passwd", "path": "/work/p"}),
            0,
        ),
        (
            "chown",
            3,
            2,
            json!({"path": "/work/b", "uid": 0, "gid": 0}),
            1,
        ),
        ("unlink", 3, 2, json!({"path": "/work/b"}), 0),
        ("rmdir", 3, 2, json!({"path": "/tmp/x"}), 13),
        (
            "connect",
            3,
            2,
            json!({"addr": "1.1.1.1", "port": 443, "family": "inet"}),
            1,
        ),
        (
            "sendto",
            3,
            2,
            json!({"addr": "8.8.8.8", "port": 53, "family": "inet"}),
            1,
        ),
        (
            "proxy",
            3,
            2,
            json!({"method": "CONNECT", "host": "evil.example", "port": 443}),
            0,
        ),
        (
            "broker",
            3,
            2,
            json!({"capability": "gh", "method": "GET", "path": "/user"}),
            0,
        ),
        ("signal", 3, 2, json!({"to": 1, "signal": 9}), 1),
    ];
    for (i, (kind, pid, ppid, target, errno)) in records.into_iter().take(o.records).enumerate() {
        let mut e = effect(kind, pid, ppid, i as u64, target, errno);
        let decision = e.decision;
        let seq = w.record(&mut e).expect("append");
        assert_eq!(seq, i as u64 + 1);
        assert_eq!(decision == Decision::Denied, errno != 0);
    }
    if o.gap {
        w.gap(7, "open").expect("gap");
    }
    w.record(&mut effect("exit", 3, 2, 30, json!({"code": 2}), 0))
        .expect("exit");
    w.record(&mut effect("exit", 2, 1, 31, json!({"code": 2}), 0))
        .expect("exit");
    w.seal(Seal {
        exit_status: ExitStatus::Code(2),
        cgroup_empty: o.cgroup_empty,
    })
    .expect("seal");
    drop(w);
    std::fs::read(path).expect("read back")
}

fn intact() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("effects.jsonl");
    let bytes = write_log(
        &path,
        Opts {
            gap: false,
            cgroup_empty: true,
            records: 21,
        },
    );
    (dir, path, bytes)
}

/// Lines with their newline, so joining them gives the file back.
fn lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn intact_log_verifies() {
    let (_dir, path, bytes) = intact();
    let v = verify_file(&path);
    assert_eq!(v.code, VERDICT_OK, "{v:?}");
    assert!(
        v.message.starts_with("ok: 25 records, sealed on line 25"),
        "{v:?}"
    );
    assert_eq!(lines(&bytes).len(), 25);
    assert_eq!(verify(&bytes), v);
    assert!(!String::from_utf8_lossy(&bytes).contains('\r'));
}

#[test]
fn every_single_bit_flip_is_detected() {
    // A smaller log (genesis, 6 effects including a denied read, 2 exits,
    // seal) keeps the exhaustive search to ~25k verifications.
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = write_log(
        &dir.path().join("small.jsonl"),
        Opts {
            gap: false,
            cgroup_empty: true,
            records: 6,
        },
    );
    assert_eq!(verify(&bytes).code, VERDICT_OK);
    let last = bytes.len() - 1;
    // Split the positions over a few threads: ~50k verifications.
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    let chunk = bytes.len().div_ceil(threads);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let bytes = &bytes;
                s.spawn(move || {
                    let mut bad = Vec::new();
                    let mut copy = bytes.clone();
                    for pos in (t * chunk)..((t + 1) * chunk).min(bytes.len()) {
                        for bit in 0..8 {
                            copy[pos] ^= 1 << bit;
                            let v = verify(&copy);
                            copy[pos] ^= 1 << bit;
                            // Only the final newline can turn the file into a
                            // truncated one; everywhere else it is tampering.
                            let want = if pos == last {
                                VERDICT_UNSEALED
                            } else {
                                VERDICT_TAMPERED
                            };
                            if v.code != want {
                                bad.push(format!("byte {pos} bit {bit}: {v:?}"));
                            }
                        }
                    }
                    bad
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|_| vec!["thread panicked".into()]))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} misses, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

#[test]
fn each_deleted_line_is_detected() {
    let (_dir, _path, bytes) = intact();
    let ls = lines(&bytes);
    for i in 0..ls.len() {
        let mut kept = ls.clone();
        kept.remove(i);
        let v = verify(&kept.concat());
        // Deleting the seal leaves a valid unsealed prefix: that is exactly
        // what a crash before sealing looks like, so 2 is the honest answer.
        let want = if i == ls.len() - 1 {
            VERDICT_UNSEALED
        } else {
            VERDICT_TAMPERED
        };
        assert_eq!(v.code, want, "deleting line {}: {v:?}", i + 1);
    }
}

#[test]
fn swapped_lines_are_detected() {
    let (_dir, _path, bytes) = intact();
    let ls = lines(&bytes);
    for i in 0..ls.len() {
        for j in (i + 1)..ls.len() {
            let mut sw = ls.clone();
            sw.swap(i, j);
            let v = verify(&sw.concat());
            assert_eq!(
                v.code,
                VERDICT_TAMPERED,
                "swapping {} and {}: {v:?}",
                i + 1,
                j + 1
            );
        }
    }
}

#[test]
fn inserted_and_duplicated_lines_are_detected() {
    let (_dir, _path, bytes) = intact();
    let ls = lines(&bytes);
    for i in 0..ls.len() {
        let mut dup = ls.clone();
        dup.insert(i, ls[i].clone());
        let v = verify(&dup.concat());
        assert_eq!(
            v.code,
            VERDICT_TAMPERED,
            "duplicating line {}: {v:?}",
            i + 1
        );
    }
}

#[test]
fn anything_after_the_seal_is_tampering() {
    let (_dir, _path, bytes) = intact();
    let ls = lines(&bytes);
    // A well-formed record that chains correctly onto the seal.
    let seal_hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        &ls[ls.len() - 1][..ls[ls.len() - 1].len() - 1],
    ));
    let forged = format!(
        "{{\"decision\":\"allowed\",\"errno\":0,\"kind\":\"exec\",\"mono_ns\":1,\"pid\":9,\"ppid\":1,\"prev\":\"{seal_hash}\",\"seq\":25,\"target\":{{\"path\":\"/x\"}},\"uid\":0,\"wall_ns\":1}}\n"
    );
    for tail in [
        forged.as_bytes().to_vec(),
        ls[3].clone(),
        b"\n".to_vec(),
        b"{\"partial\":".to_vec(),
        ls[ls.len() - 1].clone(),
    ] {
        let mut data = bytes.clone();
        data.extend_from_slice(&tail);
        let v = verify(&data);
        assert_eq!(v.code, VERDICT_TAMPERED, "{v:?}");
        assert!(v.message.contains("line 26"), "{v:?}");
    }
}

#[test]
fn every_cut_is_truncation() {
    let (_dir, _path, bytes) = intact();
    let mut boundary = 0;
    for (n, line) in lines(&bytes).iter().enumerate() {
        let v = verify(&bytes[..boundary]);
        assert_eq!(v.code, VERDICT_UNSEALED, "cut before line {}: {v:?}", n + 1);
        boundary += line.len();
    }
    assert_eq!(verify(b"").code, VERDICT_UNSEALED);
    assert_eq!(verify(b"").message, "unsealed: the log is empty");
    // Cuts in the middle of a line are truncation too.
    for cut in 1..bytes.len() {
        let v = verify(&bytes[..cut]);
        assert_eq!(v.code, VERDICT_UNSEALED, "cut at byte {cut}: {v:?}");
    }
}

#[test]
fn forged_chain_without_a_matching_seal_is_detected() {
    // Edit a record and recompute every later prev: the seal's head and
    // digest no longer agree with what precedes it.
    let (_dir, _path, bytes) = intact();
    let text = String::from_utf8(bytes).expect("utf8");
    let mut out = String::new();
    let mut prev = "0".repeat(64);
    for (i, line) in text.lines().enumerate() {
        let mut v: Value = serde_json::from_str(line).expect("json");
        v["prev"] = json!(prev);
        if i == 5 {
            v["target"]["path"] = json!("/tmp/harmless");
        }
        // serde_json's default Map is sorted, and these values are canonical.
        let l = serde_json::to_string(&v).expect("ser");
        prev = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(l.as_bytes()));
        out.push_str(&l);
        out.push('\n');
    }
    let v = verify(out.as_bytes());
    assert_eq!(v.code, VERDICT_TAMPERED, "{v:?}");
    assert!(v.message.contains("line 25"), "{v:?}");
}

#[test]
fn lost_events_are_incomplete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("effects.jsonl");
    write_log(
        &path,
        Opts {
            gap: true,
            cgroup_empty: true,
            records: 21,
        },
    );
    let v = verify_file(&path);
    assert_eq!(v.code, VERDICT_INCOMPLETE, "{v:?}");
    assert_eq!(
        v.message,
        "incomplete: 7 events lost in 1 gap records (first on line 23)"
    );
}

#[test]
fn cgroup_not_emptied_is_incomplete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("effects.jsonl");
    write_log(
        &path,
        Opts {
            gap: false,
            cgroup_empty: false,
            records: 21,
        },
    );
    let v = verify_file(&path);
    assert_eq!(v.code, VERDICT_INCOMPLETE, "{v:?}");
    assert!(v.message.contains("cgroup was not empty"), "{v:?}");
}

#[test]
fn missing_file_is_not_ok() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = verify_file(&dir.path().join("nope.jsonl"));
    assert_eq!(v.code, VERDICT_UNSEALED, "{v:?}");
    assert!(!v.message.contains('\n'));
}

#[test]
fn messages_are_one_line_and_say_where() {
    let (_dir, _path, bytes) = intact();
    let mut ls = lines(&bytes);
    ls.remove(6);
    let v = verify(&ls.concat());
    assert_eq!(v.message, "tampered: line 7: seq is 7, expected 6");
    let ls = lines(&bytes);
    let mut edited = ls.clone();
    let l = String::from_utf8(edited[6].clone()).expect("utf8");
    edited[6] = l.replace("/work/out.o", "/work/ou7.o").into_bytes();
    let v = verify(&edited.concat());
    assert_eq!(
        v.message,
        "tampered: line 8: prev does not match the hash of line 7"
    );
}
