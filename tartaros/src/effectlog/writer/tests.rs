use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use super::*;
use crate::effectlog::testutil::{effect, genesis, write_sample};
use crate::effectlog::{ExitStatus, VERDICT_OK, VERDICT_TAMPERED, VERDICT_UNSEALED, verify_file};

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn chain_links_every_line_to_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let w = write_sample(&path);
    let lines = lines(&path);
    assert_eq!(lines.len(), 9);
    let mut prev = "0".repeat(64);
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["seq"], json!(i));
        assert_eq!(v["prev"], json!(prev));
        prev = sha256_hex(line.as_bytes());
    }
    assert_eq!(w.head(), prev);
    let seal: Value = serde_json::from_str(&lines[8]).unwrap();
    assert_eq!(seal["kind"], "seal");
    assert_eq!(seal["head"], json!(sha256_hex(lines[7].as_bytes())));
    assert_eq!(
        seal["counts"],
        json!({"genesis": 1, "exec": 2, "fork": 1, "open": 2, "exit": 2})
    );
    assert_eq!(seal["lost"], 0);
    assert_eq!(seal["exit_status"], json!({"code": 0}));
    assert_eq!(
        verify_file(&path).code,
        VERDICT_OK,
        "{:?}",
        verify_file(&path)
    );
}

#[test]
fn genesis_carries_the_policy_hash_and_guarantees() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    write_sample(&path);
    let g: Value = serde_json::from_str(&lines(&path)[0]).unwrap();
    assert_eq!(g["kind"], "genesis");
    assert_eq!(
        g["policy_hash"],
        json!(policy_hash(&genesis().policy).unwrap())
    );
    assert_eq!(g["guarantees"]["degraded"], json!(["unix-socket-policy"]));
    assert_eq!(g["programs"], json!(["0123456789abcdef"]));
}

#[test]
fn refuses_an_existing_file_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    std::fs::write(&path, b"keep me\n").unwrap();
    let err = LogWriter::create(&path).err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains("choose another path"), "{msg}");
    assert!(!msg.contains('\n'));
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me\n");
    // A dangling symlink is refused too, and not followed.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
    assert!(matches!(
        LogWriter::create(&link),
        Err(LogError::Exists { .. })
    ));
    assert!(!dir.path().join("elsewhere").exists());
}

#[test]
fn file_is_private_to_the_supervisor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let _w = LogWriter::create(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
}

#[test]
fn order_and_field_rules_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    let e = |kind| effect(kind, 1, 0, 0, json!({"path": "/x"}), None);
    assert!(matches!(
        w.record(&mut e("exec")),
        Err(LogError::NoGenesis { .. })
    ));
    assert!(matches!(w.gap(1, "exec"), Err(LogError::NoGenesis { .. })));
    w.genesis(genesis()).unwrap();
    assert!(matches!(
        w.genesis(genesis()),
        Err(LogError::GenesisTwice { .. })
    ));
    assert!(matches!(
        w.record(&mut e("bogus")),
        Err(LogError::Invalid { .. })
    ));
    match w.record(&mut e("seal")) {
        Err(LogError::Invalid { reason, .. }) => assert!(reason.contains("LogWriter::seal")),
        other => panic!("a seal through record: {other:?}"),
    }
    let mut allowed_with_errno = e("open");
    allowed_with_errno.errno = 13;
    assert!(matches!(
        w.record(&mut allowed_with_errno),
        Err(LogError::Invalid { .. })
    ));
    let mut float = e("open");
    float.target.insert("ratio", json!(0.5));
    assert!(matches!(w.record(&mut float), Err(LogError::Float { .. })));
    assert!(matches!(w.gap(0, "exec"), Err(LogError::Invalid { .. })));
    // None of the refused records reached the file or the chain.
    assert_eq!(w.records(), 1);
    assert_eq!(lines(&path).len(), 1);
    w.seal(Seal {
        exit_status: ExitStatus::Signal(9),
        cgroup_empty: true,
    })
    .unwrap();
    assert!(matches!(
        w.record(&mut e("open")),
        Err(LogError::Sealed { .. })
    ));
    assert_eq!(verify_file(&path).code, VERDICT_OK);
}

#[test]
fn unsealed_writer_leaves_a_verifiable_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    {
        let mut w = LogWriter::create(&path).unwrap();
        w.genesis(genesis()).unwrap();
        w.record(&mut effect(
            "exec",
            1,
            0,
            1,
            json!({"path": "/bin/true"}),
            None,
        ))
        .unwrap();
    }
    let v = verify_file(&path);
    assert_eq!(v.code, VERDICT_UNSEALED, "{v:?}");
}

#[test]
fn secrets_are_redacted_everywhere_and_the_log_still_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let token = b"brk_9f8e7d6c5b4a".to_vec();
    let api = b"sk-live-\"quoted\"".to_vec();
    let mut w = LogWriter::create(&path).unwrap();
    w.set_secrets(vec![token.clone(), api.clone()]);
    let mut g = genesis();
    g.policy = json!({"env": {"KEY": "sk-live-\"quoted\""}});
    w.genesis(g).unwrap();
    let t = json!({"url": "http://127.0.0.1:9/gh/x?auth=brk_9f8e7d6c5b4a", "brk_9f8e7d6c5b4a": 1});
    w.record(&mut effect("broker", 3, 1, 1, t, Some(1)))
        .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let raw = std::fs::read(&path).unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(!text.contains("brk_9f8e7d6c5b4a"), "{text}");
    assert!(!text.contains("sk-live"), "{text}");
    assert!(text.contains(&w.redaction_marker()));
    assert_eq!(w.redactions(), 3);
    assert_eq!(
        verify_file(&path).code,
        VERDICT_OK,
        "{:?}",
        verify_file(&path)
    );
}

#[test]
fn a_secret_outside_any_string_is_still_kept_off_disk() {
    // The value pass cannot see a secret inside a number; the line guard
    // replaces it anyway, and verify then flags the broken line.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_secrets(vec![b"987654321987".to_vec()]);
    w.genesis(genesis()).unwrap();
    let mut e = effect("open", 3, 1, 1, json!({"path": "/x"}), None);
    e.wall_ns = 987_654_321_987;
    w.record(&mut e).unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("987654321987"));
    assert_eq!(verify_file(&path).code, VERDICT_TAMPERED);
}

#[test]
fn batching_writes_whole_lines_on_flush_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_batch_bytes(1 << 20);
    w.genesis(genesis()).unwrap();
    for i in 0..5 {
        w.record(&mut effect(
            "write",
            2,
            1,
            i,
            json!({"path": "/work/f"}),
            None,
        ))
        .unwrap();
    }
    assert!(w.writes_pending());
    assert_eq!(lines(&path).len(), 1);
    w.flush().unwrap();
    assert!(!w.writes_pending());
    assert_eq!(lines(&path).len(), 6);
    w.record(&mut effect(
        "unlink",
        2,
        1,
        9,
        json!({"path": "/work/f"}),
        None,
    ))
    .unwrap();
    drop(w);
    assert_eq!(lines(&path).len(), 7);
    assert_eq!(verify_file(&path).code, VERDICT_UNSEALED);
}

#[test]
fn gaps_are_counted_in_the_seal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    w.gap(3, "exec").unwrap();
    w.gap(2, "open").unwrap();
    assert_eq!(w.lost(), 5);
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let seal: Value = serde_json::from_str(&lines(&path)[3]).unwrap();
    assert_eq!(seal["lost"], 5);
    assert_eq!(seal["counts"]["gap"], 2);
    let v = verify_file(&path);
    assert_eq!(v.code, 3, "{v:?}");
    assert_eq!(
        v.message,
        "incomplete: 5 events lost in 2 gap records (first on line 2)"
    );
}

#[test]
fn a_typed_record_is_written_as_its_map_would_be_with_secrets_redacted() {
    use crate::effectlog::{Record, Target};
    let dir = tempfile::tempdir().unwrap();
    let secret = b"brk_9f8e7d6c5b4a".to_vec();
    let mut target = Target::new();
    target.insert("path", "/w/brk_9f8e7d6c5b4a/out");
    target.insert("argv", vec![Value::from("curl"), Value::from("-H")]);
    target.insert("flags", 577u64);
    let record = Record {
        kind: "create",
        pid: 10,
        ppid: 1,
        uid: 1000,
        mono_ns: 5,
        wall_ns: 6,
        decision: Decision::Denied,
        errno: 13,
        target,
    };
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_secrets(vec![secret.clone()]);
    w.genesis(genesis()).unwrap();
    w.record(&mut record.clone()).unwrap();
    assert_eq!(w.redactions(), 1);
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    assert_eq!(verify_file(&path).code, VERDICT_OK);
    // The line is the canonical form of the record's map, redacted.
    let line = lines(&path)[1].clone();
    let mut m = record.to_fields();
    m.insert("seq".into(), 1.into());
    m.insert("prev".into(), sha256_hex(lines(&path)[0].as_bytes()).into());
    m.insert("kind".into(), "create".into());
    m["target"]["path"] = format!("/w/{}/out", w.redaction_marker()).into();
    assert_eq!(line, to_canonical(&Value::Object(m)).unwrap());

    let mut allowed_with_errno = record.clone();
    allowed_with_errno.decision = Decision::Allowed;
    let mut w = LogWriter::create(&dir.path().join("refused.jsonl")).unwrap();
    w.genesis(genesis()).unwrap();
    assert!(w.record(&mut allowed_with_errno).is_err());
    allowed_with_errno.kind = "bogus";
    allowed_with_errno.errno = 0;
    assert!(w.record(&mut allowed_with_errno).is_err());
}

#[test]
fn a_writer_whose_filesystem_fills_drops_counts_and_still_seals() {
    // The real fill is tests/log_complete.rs, on a small tmpfs.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    w.full = Some("no room".into());
    let r = w.record(&mut effect("exec", 10, 1, 5, serde_json::json!({}), None));
    assert!(matches!(r, Err(LogError::Full { .. })), "{r:?}");
    assert_eq!(w.dropped(), 1);
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    let v = verify_file(&path);
    assert_eq!(v.code, crate::effectlog::VERDICT_INCOMPLETE, "{v:?}");
    assert!(v.message.contains("1 events lost"), "{v:?}");
}

#[test]
fn a_secret_in_a_sealed_file_name_is_redacted_before_the_digest_and_stays_distinct() {
    // Round 20: the agent named one file with the broker token and another
    // `note-[REDACTED].txt`; the seal was digested before its redaction
    // (verify: tampered, run: complete), and both names read the same.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.set_secrets(vec![b"tok4242xyz".to_vec()]);
    w.genesis(genesis()).unwrap();
    let sha = "ab".repeat(32);
    let file = |name: &str| json!({"path": name, "size": 7, "sha256": sha});
    let files = vec![
        file("/w/note-[REDACTED].txt"),
        file("/w/note-tok4242xyz.txt"),
    ];
    w.seal_with_files(
        Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        },
        Some(files),
    )
    .unwrap();
    assert_eq!(
        verify_file(&path).code,
        VERDICT_OK,
        "{:?}",
        verify_file(&path)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("tok4242xyz"), "{text}");
    let marker = w.redaction_marker();
    assert!(text.contains(&format!("/w/note-{marker}.txt")), "{text}");
    assert!(text.contains("/w/note-[REDACTED].txt"), "{text}");
}

/// A 1 MiB tmpfs for one test, unmounted when dropped.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    /// `None` (with the reason printed) where mounting needs root we lack;
    /// under `CI=true` that fails the test instead.
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        );
        match mounted {
            Ok(()) => Some(Self(dir)),
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: cannot mount a tmpfs ({e}); run as root");
                None
            }
            Err(e) => panic!("cannot mount a tmpfs: {e}"),
        }
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount(self.0.path());
    }
}

#[test]
fn a_seal_on_a_full_filesystem_fits_what_is_left_of_the_reserve() {
    // CI flake: the log became full with ~64 KiB of its reserve left,
    // and a `files` list cut to a fixed 64 KiB ended the seal mid-line.
    let Some(fs) = SmallTmpfs::mount() else {
        return;
    };
    let path = fs.0.path().join("log");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    // Leave 40 KiB of the reserve allocated, then fill the filesystem.
    let left = 40 * 1024;
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let from = (w.written + left) as i64;
    let len = (w.reserved_end - w.written - left) as i64;
    // SAFETY: fallocate on a file this test owns.
    assert_eq!(
        unsafe { libc::fallocate(w.file.as_raw_fd(), punch, from, len) },
        0
    );
    w.reserved_end = w.written + left;
    let fill = std::fs::File::create(fs.0.path().join("fill")).unwrap();
    let chunk = vec![b'x'; 65536];
    while (&fill).write_all(&chunk).is_ok() {}
    w.full = Some("no room".into());
    w.dropped = 1;
    let sha = "ab".repeat(32);
    let files: Vec<Value> = (0..4000)
        .map(|i| json!({"path": format!("/w/f{i:04}"), "size": 0, "sha256": sha}))
        .collect();
    let sealed = w.seal_with_files(
        Seal {
            exit_status: ExitStatus::Code(0),
            cgroup_empty: true,
        },
        Some(files),
    );
    assert!(sealed.is_ok(), "{sealed:?}");
    let v = verify_file(&path);
    assert_eq!(v.code, crate::effectlog::VERDICT_INCOMPLETE, "{v:?}");
    let seal: Value = serde_json::from_str(lines(&path).last().unwrap()).unwrap();
    assert!(seal["files_omitted"].as_u64().unwrap_or(0) > 0, "{seal}");
}

#[test]
fn bytes_another_process_appended_to_the_live_log_fail_the_seal() {
    // Round 24b: an agent of another run whose root held the log
    // appended a line; the run reported its log complete.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    w.flush().unwrap();
    let mut other = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    other.write_all(b"{\"kind\":\"exit\"}\n").unwrap();
    let sealed = w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    });
    assert!(
        matches!(sealed, Err(LogError::Foreign { bytes: 16, .. })),
        "{sealed:?}"
    );
    assert_eq!(verify_file(&path).code, VERDICT_TAMPERED);
}

#[test]
fn a_log_whose_directory_was_replaced_during_the_run_fails_the_seal() {
    // Round 24b: another run's agent moved the log's directory away and
    // put an older log at the name; `verify` of the name said ok.
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let path = logs.join("log.jsonl");
    let mut w = LogWriter::create(&path).unwrap();
    w.genesis(genesis()).unwrap();
    std::fs::rename(&logs, dir.path().join("logs.moved")).unwrap();
    std::fs::create_dir(&logs).unwrap();
    write_sample(&path);
    let sealed = w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    });
    assert!(matches!(sealed, Err(LogError::Moved { .. })), "{sealed:?}");
}
