use serde_json::json;
use sha2::Digest;

use super::*;
use crate::effectlog::testutil::{effect, genesis};
use crate::effectlog::{ExitStatus, Genesis, LogWriter, Seal};

#[test]
fn the_page_is_self_contained_and_escapes_every_log_string() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&log).unwrap();
    w.genesis(Genesis {
        degraded: Vec::new(),
        ..genesis()
    })
    .unwrap();
    let evil = "/w/<script>alert(1)</script>\"'&\u{1b}[31m";
    w.record(&mut effect(
        "create",
        5,
        1,
        1,
        json!({"path": evil, "flags": 0o301}),
        None,
    ))
    .unwrap();
    w.record(&mut effect(
        "open",
        5,
        1,
        2,
        json!({"path": "/etc/shadow", "flags": 0}),
        Some(13),
    ))
    .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    drop(w);
    let html_path = dir.path().join("r.html");
    assert_eq!(report(&log, &html_path, None).unwrap(), 0);
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(!html.contains("<script>alert"), "unescaped log text");
    // Quoted, as every value holding a quote: its own `"` as `\"`.
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;\\&quot;&#39;&amp;\\u{1b}[31m"));
    assert_eq!(
        html.matches("<script>").count(),
        1,
        "only the report's own script"
    );
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains(" src="));
    assert!(html.contains("default-src 'none'; style-src 'sha256-"));
    assert!(!html.contains("unsafe-inline") && !html.contains(" style=\""));
    assert!(html.contains("data-outcome=\"refused\""));
    assert!(html.contains("class=\"verdict ok\""));
}

#[test]
fn the_report_never_overwrites_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&log).unwrap();
    w.genesis(genesis()).unwrap();
    drop(w);
    let before = std::fs::read(&log).unwrap();
    let link = dir.path().join("link.html");
    std::os::unix::fs::symlink(&log, &link).unwrap();
    for out in [&log, &link] {
        assert!(matches!(
            report(&log, out, None),
            Err(ReportError::SameFile { .. })
        ));
    }
    assert_eq!(std::fs::read(&log).unwrap(), before);
}

#[test]
fn the_policy_pins_the_pages_own_style_and_script() {
    use base64::Engine as _;
    let want = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(SCRIPT));
    assert_eq!(csp_hash(SCRIPT), want);
    assert_eq!(csp_hash("").len(), 44);
}

#[test]
fn past_the_cut_only_notable_rows_fit_up_to_their_bound() {
    let mut p = PastCut::default();
    assert!(p.take(MAX_ROWS - 1, Keep::Ordinary));
    assert!(!p.take(MAX_ROWS, Keep::Ordinary));
    for _ in 0..MAX_NOTABLE_ROWS {
        assert!(p.take(MAX_ROWS + 5, Keep::Notable));
    }
    assert!(!p.take(MAX_ROWS + 5, Keep::Notable));
    // Connections have a bound of their own: a full notable bound leaves
    // them room, and they leave refusals theirs.
    let mut p = PastCut::default();
    for _ in 0..MAX_NET_ROWS {
        assert!(p.take(MAX_ROWS, Keep::Connection));
    }
    assert!(!p.take(MAX_ROWS, Keep::Connection));
    assert!(p.take(MAX_ROWS, Keep::Notable));
}

/// 20,001 file records, then an allowed `--port` relay that carried data:
/// the timeline kept only refusals past its cut, so the connection was on
/// no row (adversarial round 20).
#[test]
fn an_allowed_connection_after_the_cut_is_on_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut w = LogWriter::create(&log).unwrap();
    w.set_batch_bytes(1 << 20);
    w.genesis(Genesis {
        degraded: Vec::new(),
        ..genesis()
    })
    .unwrap();
    for i in 0..MAX_ROWS {
        let t = json!({"path": format!("/w/f{i}"), "flags": 0o301});
        w.record(&mut effect("create", 5, 1, 1, t, None)).unwrap();
    }
    let relay = json!({"dest": "127.0.0.1:8765", "via": "port-forward", "bytes_up": 31, "bytes_down": 1710});
    w.record(&mut effect("connect", 5, 1, 2, relay, None))
        .unwrap();
    w.seal(Seal {
        exit_status: ExitStatus::Code(0),
        cgroup_empty: true,
    })
    .unwrap();
    drop(w);
    let html_path = dir.path().join("r.html");
    report(&log, &html_path, None).unwrap();
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.contains("id=\"cut\""), "the report was not cut");
    assert!(
        html.lines()
            .any(|l| l.starts_with("<tr") && l.contains("127.0.0.1:8765")),
        "the relay is on no timeline row"
    );
}
