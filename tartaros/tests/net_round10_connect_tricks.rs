//! Adversarial round 10 (egress): connects the agent makes without a
//! plain `connect(2)`, to destinations no grant covers, must still land
//! at the transparent proxy, be judged by the name they carry, and be in
//! the log with the pid of the process that made them:
//!
//! - TCP Fast Open: `sendto(MSG_FASTOPEN)` on a fresh socket connects and
//!   sends in one call (the connect hook runs inside `sendto`), over IPv4
//!   and through a dual-stack IPv6 socket to an IPv4-mapped address;
//! - `connect(AF_UNSPEC)` to drop an intercepted connection, then a
//!   second connect of the same socket (the same socket cookie, under
//!   which the first one's original destination and owner were saved)
//!   somewhere else.
//!
//! The proxy judged each by its name and named the agent. But the
//! syscall's own record (`connect`, or `sendto` for Fast Open) said an
//! allowed connection to the original address, which nothing reached:
//! with capture on, the connect program's verdict (`REDIRECT`) was only a
//! note of the destination, and the record lost `transparent: true`.
//! Needs root and python3.

mod common;

use common::proxied::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
import ctypes, os, socket, sys
open(os.path.join(sys.argv[1], 'tricks_marker'), 'w').close()
def head(host):
    return ('GET / HTTP/1.1\r\nHost: %s:18080\r\nConnection: close\r\n\r\n' % host).encode()
def answer(s):
    try:
        return s.recv(64).split(b'\r\n')[0].decode()
    except OSError as e:
        return 'error %d' % e.errno
def tfo(label, family, addr, host):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Blocking: without a cookie the SYN carries no data, and a
        # non-blocking call would return EINPROGRESS having sent none.
        s.sendto(head(host), socket.MSG_FASTOPEN, addr)
        s.settimeout(10)
        print(label, answer(s))
    except OSError as e:
        print(label, 'error', e.errno)
    s.close()
tfo('tfo4', socket.AF_INET, ('192.0.2.77', 18080), 'tfo4.invalid')
tfo('tfo6', socket.AF_INET6, ('::ffff:192.0.2.78', 18080), 'tfo6.invalid')
# AF_UNSPEC drops the first connection; the socket connects again.
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(('192.0.2.79', 18080))
unspec = ctypes.create_string_buffer(16)
rc = libc.connect(s.fileno(), unspec, 16)
print('unspec', rc, ctypes.get_errno())
s.connect(('192.0.2.80', 18080))
s.sendall(head('again.invalid'))
print('again', answer(s))
"#;

/// The transparent proxy's record of the request naming `host` (a refused
/// one keeps the Host header as sent, port included).
fn proxy_record<'a>(records: &'a [Value], host: &str) -> &'a Value {
    records
        .iter()
        .find(|r| {
            r["kind"] == "proxy"
                && r["target"]["host"]
                    .as_str()
                    .is_some_and(|h| h.split(':').next() == Some(host))
        })
        .unwrap_or_else(|| panic!("no proxy record of {host}: {records:#?}"))
}

#[test]
fn fast_open_and_reconnected_sockets_are_intercepted_and_named() {
    if !can_run("net_round10_connect_tricks") {
        return;
    }
    let run = run_script_with_proxy(&[("tricks.py", AGENT)], &[]);
    let (text, records, work, logs) = (&run.text, &run.records, &run.work, &run.logs);
    eprintln!("{text}");
    let agent = pid_of_marker(records, "/tricks_marker");
    for (label, host, dst) in [
        ("tfo4", "tfo4.invalid", "192.0.2.77:18080"),
        ("tfo6", "tfo6.invalid", "192.0.2.78:18080"),
        ("again", "again.invalid", "192.0.2.80:18080"),
    ] {
        // The proxy answered (a refusal: the name is not allowed), so the
        // connect reached it and no other place.
        assert!(
            text.contains(&format!("{label} HTTP/1.1 403")),
            "{label}: {text}"
        );
        let r = proxy_record(records, host);
        assert_eq!(r["decision"], "denied", "{r}");
        assert_eq!(r["target"]["mode"], "transparent", "{r}");
        assert_eq!(r["target"]["original_dst"], dst, "{r}");
        assert_eq!(r["pid"].as_u64(), Some(agent), "{r}");
    }
    assert!(text.contains("unspec 0 0"), "{text}");
    // The syscalls' records say where the kernel sent them: to the
    // transparent proxy, not to the address they named.
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| {
            matches!(r["kind"].as_str(), Some("connect" | "sendto"))
                && r["target"]["addr"]
                    .as_str()
                    .is_some_and(|a| a.contains("192.0.2."))
        })
        .collect();
    assert!(calls.len() >= 4, "{calls:#?}");
    for call in calls {
        assert_eq!(call["target"]["transparent"], true, "{call}");
    }
    // Nor does the summary list them as places reached: the proxy's
    // records are where those connections went.
    let log = logs.join("effects.jsonl");
    let summary = tartaros(&["log", "summary", log.to_str().unwrap()], work.path());
    let summary = stdout(&summary);
    assert!(summary.contains("again.invalid"), "{summary}");
    let listed = |l: &str| {
        let l = l.trim_start();
        (l.starts_with("connect ") || l.starts_with("sendto ")) && l.contains("192.0.2.")
    };
    assert!(!summary.lines().any(listed), "{summary}");
    // `connect(AF_UNSPEC)` dissolved a connection; it reached nothing.
    assert!(!summary.contains("connect ?"), "{summary}");
}
