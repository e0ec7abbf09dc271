//! Hostile logs: escape sequences, invalid UTF-8, huge lines, deep trees
//! and a closed pipe. Output stays escaped and bounded; exit codes stay
//! those of `log verify`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use sha2::Digest;
use tartaros::effectlog::{ExitStatus, Seal};

use super::{assert_inert, code, effect, json_of, log, sealed, write_log};
use crate::common::*;

/// Appends a record line chained to the file's last line, bypassing the
/// writer's checks (a forged kind the writer would refuse).
fn append_chained(path: &Path, mut record: serde_json::Map<String, Value>) {
    let data = std::fs::read(path).unwrap();
    let last = data
        .strip_suffix(b"\n")
        .unwrap()
        .rsplit(|&b| b == b'\n')
        .next()
        .unwrap();
    let seq = data.iter().filter(|&&b| b == b'\n').count();
    record.insert("seq".into(), seq.into());
    record.insert(
        "prev".into(),
        hex::encode(sha2::Sha256::digest(last)).into(),
    );
    let mut line = serde_json::to_vec(&record).unwrap();
    line.push(b'\n');
    let mut all = data;
    all.extend_from_slice(&line);
    std::fs::write(path, all).unwrap();
}

const HOSTILE: &str = "/w/\u{1b}[2K\r\u{1b}[1Aok: 25 records, sealed\u{9b}31m\u{202e}gnp.exe\u{7}";

#[test]
fn escape_sequences_in_paths_and_kinds_never_reach_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), "paths.jsonl", |w| {
        w.record(&mut effect(
            "create",
            5,
            1,
            1,
            json!({"path": HOSTILE, "flags": 0o301}),
            0,
        ))
        .unwrap();
        w.record(&mut effect(
            "open",
            5,
            1,
            2,
            json!({"path": HOSTILE, "flags": 0}),
            13,
        ))
        .unwrap();
        w.record(&mut effect(
            "exec",
            5,
            1,
            3,
            json!({"path": HOSTILE, "argv": [HOSTILE, HOSTILE]}),
            0,
        ))
        .unwrap();
        // The verifier refuses a hash that is not 64 hex digits, so the
        // hostile string rides in the `skipped` reason instead.
        let mut files =
            vec![json!({"path": HOSTILE, "size": 1, "sha256": null, "skipped": HOSTILE})];
        files.push(json!({"path": "/w/ok", "size": 2, "sha256": "ab".repeat(32)}));
        w.seal_with_files(
            Seal {
                exit_status: ExitStatus::Code(0),
                cgroup_empty: true,
            },
            Some(files),
        )
        .unwrap();
    });
    let p = path.to_str().unwrap();
    let html = dir.path().join("r.html");
    for args in [
        &["verify", p][..],
        &["show", p],
        &["show", "--tree", p],
        &["show", "--json", p],
        &["summary", p],
        &["summary", "--json", p],
        &["report", p, "-o", html.to_str().unwrap()],
    ] {
        let out = log(args);
        assert_eq!(code(&out), 0, "{args:?}: {}{}", stdout(&out), stderr(&out));
        assert_inert(&out.stdout, &format!("{args:?} stdout"));
        assert_inert(&out.stderr, &format!("{args:?} stderr"));
    }
    let page = std::fs::read(&html).unwrap();
    assert_inert(
        &page
            .iter()
            .copied()
            .filter(|&b| b != b'\t')
            .collect::<Vec<_>>(),
        "report",
    );
    let shown = stdout(&log(&["show", p]));
    assert!(
        shown.contains(r"\u{1b}[2K\r\u{1b}[1Aok: 25 records"),
        "{shown}"
    );

    // A forged record whose kind is an escape sequence: tampered, escaped.
    let forged = write_log(dir.path(), "kind.jsonl", |_| {});
    let mut rec = serde_json::Map::new();
    rec.insert(
        "kind".into(),
        "\u{1b}[2J\u{1b}[Hok: 25 records, sealed on line 25".into(),
    );
    append_chained(&forged, rec);
    let out = log(&["verify", forged.to_str().unwrap()]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("tampered: line 2: unknown kind `\\u{1b}[2J"),
        "{}",
        stdout(&out)
    );
    assert_inert(&out.stdout, "verify of a forged kind");
    let out = log(&["show", forged.to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).starts_with("WARNING: this log has been TAMPERED"),
        "{}",
        stdout(&out)
    );
    assert_inert(&out.stdout, "show of a forged kind");
}

#[test]
fn invalid_utf8_and_oversized_lines_are_reported_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), "bytes.jsonl", |w| {
        w.record(&mut effect("open", 5, 1, 1, json!({"path": "/w/a"}), 0))
            .unwrap();
        sealed(w);
    });
    let mut data = std::fs::read(&path).unwrap();
    data.extend_from_slice(b"{\"kind\":\"open\",\"target\":{\"path\":\"/w/\xff\xfe\x1b[2J\"}}\n");
    data.extend(std::iter::repeat_n(b'x', 17 << 20));
    data.extend_from_slice(b"\n");
    std::fs::write(&path, data).unwrap();
    let p = path.to_str().unwrap();
    let out = log(&["verify", p]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let show = log(&["show", p]);
    assert_eq!(code(&show), 1);
    assert_inert(&show.stdout, "show");
    let text = stdout(&show);
    assert!(
        text.contains("line 4: (not a readable record: not UTF-8)"),
        "{text}"
    );
    assert!(
        text.contains("line 5: (not a readable record: longer than the 16 MiB line limit)"),
        "{text}"
    );
    assert!(show.stdout.len() < 4096, "{} bytes", show.stdout.len());
    let summary = log(&["summary", "--json", p]);
    assert_eq!(json_of(&summary)["unreadable_lines"], 2);
}

#[test]
fn a_10_mb_record_prints_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let huge = format!("/w/{}", "A".repeat(10 << 20));
    let path = write_log(dir.path(), "huge.jsonl", |w| {
        w.record(&mut effect(
            "open",
            5,
            1,
            1,
            json!({"path": huge, "flags": 0}),
            13,
        ))
        .unwrap();
        w.record(&mut effect(
            "exec",
            5,
            1,
            2,
            json!({"path": "/bin/sh", "argv": ["sh", "-c", huge]}),
            0,
        ))
        .unwrap();
        sealed(w);
    });
    let p = path.to_str().unwrap();
    assert_eq!(code(&log(&["verify", p])), 0);
    let html = dir.path().join("r.html");
    for args in [
        &["show", p][..],
        &["show", "--tree", p],
        &["summary", p],
        &["summary", "--json", p],
    ] {
        let out = log(args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert!(
            out.stdout.len() < 64 << 10,
            "{args:?}: {} bytes",
            out.stdout.len()
        );
    }
    assert!(
        stdout(&log(&["show", p])).contains("…[+"),
        "the cut is visible"
    );
    assert_eq!(code(&log(&["report", p, "-o", html.to_str().unwrap()])), 0);
    assert!(std::fs::metadata(&html).unwrap().len() < 256 << 10);
}

/// 60,000 processes, each forked by the one before, which then exits
/// (what `--max-procs 64` allows).
fn deep_chain(dir: &Path) -> PathBuf {
    write_log(dir, "deep.jsonl", |w| {
        w.record(&mut effect(
            "exec",
            100,
            1,
            0,
            json!({"path": "/bin/sh", "argv": ["sh"]}),
            0,
        ))
        .unwrap();
        for i in 0..60_000u32 {
            let (pid, at) = (100 + i, u64::from(i) * 3);
            w.record(&mut effect(
                "fork",
                pid,
                pid.saturating_sub(1),
                at + 1,
                json!({"child": pid + 1}),
                0,
            ))
            .unwrap();
            w.record(&mut effect(
                "exit",
                pid,
                pid.saturating_sub(1),
                at + 2,
                json!({"code": 0}),
                0,
            ))
            .unwrap();
        }
        sealed(w);
    })
}

#[test]
fn a_60000_deep_fork_chain_is_indented_by_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = deep_chain(dir.path());
    let p = path.to_str().unwrap();
    let started = std::time::Instant::now();
    let out = log(&["show", "--tree", p]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 60_001);
    assert!(text.lines().all(|l| l.len() < 120), "a line is too long");
    let last = text.lines().last().unwrap();
    assert!(last.contains("[depth 60000] 60100: (no exec)"), "{last}");
    assert!(out.stdout.len() < 8 << 20, "{} bytes", out.stdout.len());
    assert!(started.elapsed().as_secs() < 60);
    let s = json_of(&log(&["summary", "--json", p]));
    assert_eq!(s["processes"]["max_depth"], 60_000);
    assert_eq!(s["processes"]["processes"], 60_001);
}

#[test]
fn a_closed_pipe_ends_show_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path = deep_chain(dir.path());
    for extra in [&[][..], &["--tree"], &["--json"]] {
        let mut child = Command::new(bin())
            .args(["log", "show"])
            .args(extra)
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 100];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        // The read end is closed here, as `| head` does.
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{extra:?}");
    }
}

#[test]
fn bad_filters_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), "l.jsonl", sealed);
    for (flag, value) in [
        ("--kind", "files"),
        ("--since", "yesterday"),
        ("--until", "2026-13-01T00:00:00Z"),
    ] {
        let out = log(&["show", flag, value, path.to_str().unwrap()]);
        assert_eq!(code(&out), 78, "{flag} {value}");
        let err = stderr(&out);
        assert!(
            err.starts_with("tartaros: failed to read ") && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// Adversarial round 8: a destination the agent named (a TLS server name
/// is any UTF-8, spaces included) printed bare in `log summary` forged
/// the columns of the destinations list: a refused server name
/// `pypi.org:443  1 allowed, 9.0 MiB up` showed as a line saying pypi.org
/// was reached. Shown quoted now, as `log show` quotes values with spaces.
#[test]
fn a_destination_with_spaces_cannot_forge_a_summary_line() {
    let dir = tempfile::tempdir().unwrap();
    let forged = format!(
        "pypi.org:443  1 allowed, 9.0 MiB up, 2.0 MiB down{}",
        " ".repeat(120)
    );
    let path = write_log(dir.path(), "dest.jsonl", |w| {
        let mut refused = effect(
            "proxy",
            0,
            0,
            1,
            json!({"host": forged, "port": 443, "method": "TLS", "mode": "transparent",
                   "reason": "domain not in the allow list"}),
            0,
        );
        refused.decision = tartaros::effectlog::Decision::Denied;
        w.record(&mut refused).unwrap();
        sealed(w);
    });
    let out = log(&["summary", path.to_str().unwrap()]);
    let text = stdout(&out);
    let section = text
        .split("network destinations")
        .nth(1)
        .unwrap_or_else(|| panic!("no destinations section:\n{text}"));
    for line in section.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            !(words.first() == Some(&"proxy") && words.get(1) == Some(&"pypi.org:443")),
            "a forged destination line:\n{line}"
        );
    }
    assert!(
        section.contains("\"pypi.org:443  1 allowed"),
        "the agent's name is shown quoted:\n{section}"
    );
}
