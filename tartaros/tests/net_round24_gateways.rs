//! Adversarial round 24a (gateways). Each test runs the agent (python)
//! behind the real gateways under `--log`, with a recording upstream on
//! the host's loopback, and judges from the host: what the upstream got
//! and what the log's `proxy` records say.
//!
//! - F1: a later request on an intercepted keep-alive connection was
//!   judged by its Host header only: an absolute-form target naming
//!   another host was forwarded to the Host's site, and refused ones
//!   (CONNECT, absolute form without Host) were recorded with no host.
//! - F2: a direct connection to the transparent listener took the
//!   original destination left by an earlier intercepted connection on
//!   the same ends, reset while it waited in the backlog, and was served.
//! - F3: a proxy connection that got no owner entry (its user over the
//!   connection quota) took the owner entry of an earlier process's
//!   connection on the same ends (reset in the backlog): the record named
//!   that other process, and `log verify` said ok.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::proxied::pid_of_marker;
use common::*;
use serde_json::Value;

/// A keep-alive HTTP/1.1 upstream on 127.0.0.1 that answers every request
/// head with 200 and keeps each request line; bodies are not expected.
fn upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut writer = conn.try_clone().unwrap();
                let mut reader = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    log.lock().unwrap().push(line.trim().to_string());
                    // The rest of the head.
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        if header == "\r\n" {
                            break;
                        }
                    }
                    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
                    if writer.write_all(ok).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// Runs `python3 SCRIPT WORK args...` (the script is `source`) under
/// `tartaros run --strict --allow-domain localhost --log`, the upstream's
/// `port` an allowed HTTP port; the agent's output, the log's records and
/// `log verify`'s exit code and line.
/// The connection quota is per user across runs, and every test's agent
/// is `nobody`: the quota test's 4,400 held connects starved the others'
/// gateway connections when the tests ran at once (CI). One at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run(source: &str, port: u16, args: &[&str]) -> (String, Vec<Value>, Option<i32>, String) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (work, logs) = (Dir::new(), Dir::new());
    let script = work.file("agent.py", source);
    let policy = logs.join("policy.toml");
    std::fs::write(
        &policy,
        format!("[proxy]\nallow_internal = true\nhttp_ports = [{port}]\n"),
    )
    .unwrap();
    let log = logs.join("effects.jsonl");
    let (w, port) = (work.path().to_str().unwrap(), port.to_string());
    let mut argv = vec![
        "run",
        "-q",
        "--strict",
        "--allow-domain",
        "localhost",
        "--config",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--write",
        w,
        "--",
        "python3",
        script.to_str().unwrap(),
        w,
        &port,
    ];
    argv.extend_from_slice(args);
    let out = tartaros(&argv, work.path());
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    (text, records(&log), verify.status.code(), stdout(&verify))
}

/// The log's `proxy` records.
fn proxies(records: &[Value]) -> Vec<&Value> {
    records.iter().filter(|r| r["kind"] == "proxy").collect()
}

#[test]
fn later_requests_on_an_intercepted_connection_are_judged_by_their_target_too() {
    if !can_run("round24_keepalive") {
        return;
    }
    let (port, seen) = upstream();
    let (port_s, evil) = (port.to_string(), "evil.test");
    let script = include_str!("support/round24_keepalive.py");
    let (text, records) = {
        let (text, records, _, _) = run(script, port, &[]);
        (text, records)
    };
    let seen = seen.lock().unwrap().clone();
    // Each first request reached the upstream; no probe did (the old
    // binary sent `GET /second-absolute` and `/second-scheme` to the
    // Host's site).
    assert_eq!(
        seen.iter().filter(|l| l.starts_with("GET /first")).count(),
        4,
        "{seen:?}\n{text}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("second")),
        "a probe reached the upstream: {seen:?}\n{text}"
    );
    for case in ["absolute", "scheme", "nohost", "connect"] {
        assert!(
            text.lines().any(|l| l == format!("{case} 1 1")),
            "{case}: one 200, one 403 expected: {text}"
        );
    }
    // Every refused probe's record names the host the agent named (the
    // old binary's said `allowed`, or `host: ""`).
    let named: Vec<&Value> = proxies(&records)
        .into_iter()
        .filter(|r| {
            r["target"]["host"]
                .as_str()
                .is_some_and(|h| h.contains(evil))
        })
        .collect();
    assert_eq!(named.len(), 4, "{:#?}", proxies(&records));
    assert!(named.iter().all(|r| !logged::allowed(r)), "{named:#?}");
    let mismatch = named
        .iter()
        .find(|r| r["target"]["host"] == format!("{evil}:{port_s}, localhost:{port_s}"))
        .unwrap_or_else(|| panic!("no record naming both: {named:#?}"));
    assert!(
        mismatch
            .to_string()
            .contains("does not match the request target"),
        "{mismatch}"
    );
}

#[test]
fn a_direct_connection_to_the_transparent_listener_does_not_inherit_a_reset_ones_destination() {
    if !can_run("round24_stale") {
        return;
    }
    let (port, seen) = upstream();
    let script = include_str!("support/round24_stale.py");
    let (text, records, code, line) = run(script, port, &["45123"]);
    let seen = seen.lock().unwrap().clone();
    // The old binary served it: the upstream got `GET /stale`, and the
    // record said `original_dst=192.0.2.99:PORT`, where it never went.
    assert!(
        !seen.iter().any(|l| l.contains("/stale")),
        "{seen:?}\n{text}"
    );
    assert!(text.contains("direct got b''"), "{text}");
    let stale = format!("192.0.2.99:{port}");
    let claimed: Vec<_> = proxies(&records)
        .into_iter()
        .filter(|r| logged::allowed(r) && r.to_string().contains(&stale))
        .collect();
    assert!(claimed.is_empty(), "{claimed:#?}");
    assert_eq!(code, Some(0), "{line}");
}

#[test]
fn a_proxy_connection_without_an_owner_entry_is_not_named_after_a_reset_one() {
    if !can_run("round24_quota") {
        return;
    }
    let (port, seen) = upstream();
    let script = include_str!("support/round24_quota.py");
    let (text, records, code, line) = run(script, port, &["46001", "4400"]);
    assert!(text.contains("B got b'HTTP/1.1 200"), "{text}");
    assert!(
        seen.lock().unwrap().iter().any(|l| l.contains("/from-B")),
        "{text}"
    );
    let a = pid_of_marker(&records, "/A_marker");
    let b = pid_of_marker(&records, "/B_marker");
    assert_ne!(a, b);
    let gets: Vec<_> = proxies(&records)
        .into_iter()
        .filter(|r| r["target"]["method"] == "GET")
        .collect();
    assert_eq!(gets.len(), 1, "{gets:#?}");
    let get = gets[0];
    // B is over its quota, so its connection has no entry of its own: the
    // record is unnamed (the old binary named A, the reset connection's
    // process, with no flag).
    assert_ne!(get["pid"].as_u64(), Some(a), "named A: {get}");
    assert!(
        get["pid"].as_u64() == Some(b) || get["target"]["pid_unknown"] == true,
        "{get}"
    );
    // An unnamed proxy record still verifies (docs/effect-log.md).
    assert_eq!(code, Some(0), "{line}");
}
