//! Adversarial round 9: the explicit proxy against spellings of a host
//! that some parser reads as another one, end to end (the unit tests of
//! `proxy::rules` judge the strings; these check that nothing reaches a
//! listener on the host's loopback). Each attempt goes as `CONNECT` and
//! as an absolute-form GET (HTTP/1.1 and 1.0); a service on 127.0.0.1
//! counts the connections it gets, and must get none:
//! - IP literals in every `inet_aton` and URL spelling (`127.1`,
//!   `0x7f.1`, `0177.0.0.1`, `2130706433`, a trailing dot), bracketed
//!   IPv6 forms that embed 127.0.0.1 (mapped, long form, scoped),
//!   full-width digits and ideographic dots that IDNA maps to a literal
//!   (hyper answers 400 to raw UTF-8 in a request line, before any
//!   matching; the mapping itself is judged by `proxy::rules`' tests);
//! - names with a NUL, an escape, a second authority or an empty label;
//! - allowed names whose DNS answer is the host's loopback in a form
//!   that hides it (`::ffff:127.0.0.1`, NAT64, IPv4-compatible, 6to4, a
//!   public address mixed with it, `0.0.0.0`, `::`): DNS rebinding;
//! - a Host header naming another host than an HTTP/1.0 target.
//!   All held when written.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tartaros::proxy::{self, ProxyConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A service on the host's loopback that answers 200 and counts.
async fn host_service() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nINSIDE",
                    )
                    .await;
            });
        }
    });
    (port, count)
}

/// A proxy allowing `allowed`, resolving by `resolver`, for `port` (as
/// CONNECT and plain HTTP port).
async fn proxy(
    allowed: &[&str],
    resolver: StaticResolver,
    port: u16,
    allow_internal: bool,
) -> SocketAddr {
    let mut config = ProxyConfig::new(
        allowed.iter().map(|s| s.to_string()).collect(),
        Arc::new(resolver),
    );
    config.allow_internal = allow_internal;
    config.connect_ports = vec![port];
    config.http_ports = vec![port];
    let (events, _effects) = tartaros::events::channel();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, Arc::new(config), events));
    addr
}

/// Whether `answer` is a whole response: a head, and as much body as its
/// `Content-Length` says (none for a CONNECT that passed, whose tunnel
/// stays open).
fn complete(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer).to_ascii_lowercase();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok());
    length.map_or(head.contains(" 200 "), |n| body.len() >= n)
}

/// The proxy's answer to `request` (the status line and what follows).
async fn send(proxy: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if complete(&answer) {
                break;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether `answer` is a success (any HTTP version).
fn passed(answer: &str) -> bool {
    answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200")
}

/// Whether `answer` is a refusal or an upstream failure.
fn refused(answer: &str) -> bool {
    ["403", "502"].iter().any(|code| {
        answer.starts_with(&format!("HTTP/1.1 {code}"))
            || answer.starts_with(&format!("HTTP/1.0 {code}"))
    })
}

/// `host` tried as CONNECT and as absolute-form GET in HTTP/1.1 and 1.0;
/// the answers.
async fn try_host(proxy: SocketAddr, host: &str, port: u16) -> Vec<String> {
    let mut answers = Vec::new();
    let connect = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    answers.push(send(proxy, connect.as_bytes()).await);
    for version in ["1.1", "1.0"] {
        let get = format!(
            "GET http://{host}:{port}/ HTTP/{version}\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        );
        answers.push(send(proxy, get.as_bytes()).await);
    }
    answers
}

#[tokio::test]
async fn literal_and_odd_spellings_of_the_hosts_loopback_are_refused() {
    let (port, reached) = host_service().await;
    let resolver = StaticResolver::new().with_ip("allowed.test", IpAddr::V4(Ipv4Addr::LOCALHOST));
    let proxy = proxy(&["allowed.test"], resolver, port, true).await;
    for host in [
        "127.1",
        "127.0.1",
        "0x7f.1",
        "0x7F.0.0.1",
        "0177.0.0.1",
        "0177.1",
        "2130706433",
        "0x7f000001",
        "017700000001",
        "127.0.0.1.",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[0:0:0:0:0:ffff:7f00:0001]",
        "[::127.0.0.1]",
        "[::1]",
        "[fe80::1%25lo]",
        "\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}",
        "127\u{3002}0\u{3002}0\u{3002}1",
        "allowed.test..",
        "allowed.test%00.evil.test",
        "allowed.test%2eevil.test",
        "evil.test@allowed.test",
        "allowed.test\\@evil.test",
        "allowed.test\t",
        ".allowed.test",
        "allowed.test.evil.test",
    ] {
        for answer in try_host(proxy, host, port).await {
            assert!(
                !passed(&answer) && !answer.contains("INSIDE"),
                "{host:?} passed: {answer}"
            );
        }
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the host's loopback service was reached"
    );
    // The allowed name, in the spellings that mean it, still passes.
    // (Raw UTF-8 in a request line is a 400 of hyper's before any
    // matching, so the full-width spellings above never reach it.)
    for host in ["allowed.test", "ALLOWED.test."] {
        let answers = try_host(proxy, host, port).await;
        assert!(answers.iter().all(|a| passed(a)), "{host:?}: {answers:?}");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn allowed_names_answering_with_a_hidden_loopback_are_refused() {
    let (port, reached) = host_service().await;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let names = [
        ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
        ("nat64.test", vec![ip("64:ff9b::7f00:1")]),
        ("nat64local.test", vec![ip("64:ff9b:1::7f00:1")]),
        ("compat.test", vec![ip("::127.0.0.1")]),
        ("sixtofour.test", vec![ip("2002:7f00:1::1")]),
        ("mixed.test", vec![ip("203.0.113.5"), ip("127.0.0.1")]),
        ("zero.test", vec![ip("0.0.0.0")]),
        ("unspecified.test", vec![ip("::")]),
        ("loopback6.test", vec![ip("::1")]),
    ];
    let mut resolver = StaticResolver::new();
    for (name, addrs) in &names {
        for addr in addrs {
            resolver = resolver.with_ip(name, *addr);
        }
    }
    let allowed: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
    let proxy = proxy(&allowed, resolver, port, false).await;
    for (name, _) in &names {
        for answer in try_host(proxy, name, port).await {
            assert!(refused(&answer), "{name}: {answer}");
        }
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the host's loopback service was reached"
    );
}

#[tokio::test]
async fn an_http_1_0_host_header_naming_another_host_is_refused() {
    let (port, reached) = host_service().await;
    let resolver = StaticResolver::new().with_ip("allowed.test", IpAddr::V4(Ipv4Addr::LOCALHOST));
    let proxy = proxy(&["allowed.test"], resolver, port, true).await;
    for host in [
        "evil.test",
        "127.0.0.1",
        "allowed.test.evil.test",
        "allowed.test, evil.test",
    ] {
        let get = format!("GET http://allowed.test:{port}/ HTTP/1.0\r\nHost: {host}\r\n\r\n");
        let answer = send(proxy, get.as_bytes()).await;
        assert!(refused(&answer), "{host}: {answer}");
    }
    // Two Host headers, the first the target's.
    let two = format!(
        "GET http://allowed.test:{port}/ HTTP/1.0\r\nHost: allowed.test:{port}\r\nHost: evil.test\r\n\r\n"
    );
    let answer = send(proxy, two.as_bytes()).await;
    assert!(!passed(&answer), "{answer}");
    assert_eq!(reached.load(Ordering::SeqCst), 0);
}
