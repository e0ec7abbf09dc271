//! Adversarial round 11 (egress): techniques from other sandboxes' own
//! network tests, against the explicit proxy and the transparent listener
//! in process. A recording front on the host's loopback stands for every
//! upstream (allowed and denied names resolve to it, `allow_internal` on,
//! so only the proxy's decisions stand between the agent and it) and
//! keeps the method, path and Host of every request it parses; a probe
//! passes when nothing it smuggled (a path with `smuggle`, a Host that is
//! not the allowed one) ever reaches it.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tartaros::events::{Entry, channel};
use tartaros::proxy::{self, OriginalDst, ProxyConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What the front saw: `METHOD path host`, one line per request.
type Seen = Arc<Mutex<Vec<String>>>;

/// A keep-alive HTTP/1.1 server recording every request it parses, and a
/// raw count of connections (for protocols it cannot parse).
async fn front() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let host = request
                            .headers()
                            .get("host")
                            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
                            .unwrap_or_default();
                        // A body is the allowed request's own (what a smuggled
                        // request would be, were it framed as one, is not
                        // looked for there).
                        log.lock().unwrap().push(format!(
                            "{} {} {host}",
                            request.method(),
                            request.uri()
                        ));
                        let _ = request.into_body().collect().await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                            b"front\n",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn config(front: SocketAddr) -> ProxyConfig {
    let resolver = StaticResolver::new()
        .with_ip("allowed.test", LOCALHOST)
        .with_ip("evil.test", LOCALHOST);
    let mut config = ProxyConfig::new(vec!["allowed.test".into()], Arc::new(resolver));
    config.allow_internal = true;
    config.http_ports = vec![front.port()];
    config.connect_ports = vec![front.port()];
    config.sniff_timeout = Duration::from_secs(2);
    config
}

/// The explicit proxy in front of `front`, and its records.
async fn explicit(front: SocketAddr) -> (SocketAddr, Records) {
    let (events, effects) = channel();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, Arc::new(config(front)), events));
    (addr, Records(Arc::new(tokio::sync::Mutex::new(effects))))
}

/// The transparent listener, every connection "originally" to `front`.
async fn transparent(front: SocketAddr) -> (SocketAddr, Records) {
    let (events, effects) = channel();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let original: OriginalDst = Arc::new(move |_: &TcpStream| Some(front));
    tokio::spawn(proxy::serve_transparent(
        listener,
        Arc::new(config(front)),
        events,
        original,
    ));
    (addr, Records(Arc::new(tokio::sync::Mutex::new(effects))))
}

/// The `proxy` records, read as they come.
#[derive(Clone)]
struct Records(Arc<tokio::sync::Mutex<tartaros::events::EffectReceiver>>);

impl Records {
    /// The next record within 5 s, as JSON.
    async fn next(&self) -> Option<serde_json::Value> {
        let mut effects = self.0.lock().await;
        match tokio::time::timeout(Duration::from_secs(5), effects.recv()).await {
            Ok(Some(Entry::Record(record))) => {
                Some(serde_json::to_value(record.to_fields()).unwrap())
            }
            _ => None,
        }
    }
}

/// Sends `bytes` on a new connection and reads what comes back until the
/// peer closes or 3 s pass.
async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Request-smuggling shapes (sandbox-runtime's
/// `transparent-capture-proxy.test.ts`, "llhttp CVE lineage", and the
/// classic CL.TE / TE.CL / TE.TE variants): each first request is allowed,
/// and a second one naming `evil.test` (and a `smuggle` path) hides where
/// a parser that frames the body another way would read a request.
fn smuggling_shapes(port: u16, absolute: bool) -> Vec<(&'static str, String)> {
    let target = |path: &str| {
        if absolute {
            format!("http://allowed.test:{port}{path}")
        } else {
            path.to_string()
        }
    };
    let inner = format!(
        "GET {} HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n",
        if absolute {
            format!("http://evil.test:{port}/smuggle-inner")
        } else {
            "/smuggle-inner".to_string()
        }
    );
    let host = format!("Host: allowed.test:{port}");
    let first = target("/first");
    let chunked_inner = format!("0\r\n\r\n{inner}");
    vec![
        (
            "CL.TE",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_inner}",
                chunked_inner.len()
            ),
        ),
        (
            "TE.CL",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
                inner.len()
            ),
        ),
        (
            "two lengths",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nContent-Length: 0\r\nContent-Length: {}\r\n\r\n{inner}",
                inner.len()
            ),
        ),
        (
            "obs-fold TE",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: {}\r\n\r\n{inner}",
                inner.len()
            ),
        ),
        (
            "TE with a space before the colon",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding : chunked\r\nContent-Length: {}\r\n\r\n{chunked_inner}",
                chunked_inner.len()
            ),
        ),
        (
            "TE xchunked",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: xchunked\r\nContent-Length: {}\r\n\r\n{chunked_inner}",
                chunked_inner.len()
            ),
        ),
        (
            "TE chunked, identity",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{inner}"
            ),
        ),
        (
            "bare CR in the head",
            format!(
                "POST {first} HTTP/1.1\r{host}\r\nContent-Length: {}\r\n\r\n{inner}",
                inner.len()
            ),
        ),
        (
            "bare LF line ends",
            format!("GET {first} HTTP/1.1\n{host}\nContent-Length: 0\n\n{inner}"),
        ),
        (
            "chunk size overflow",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n{inner}"
            ),
        ),
        (
            "chunk extension with a bare LF",
            format!(
                "POST {first} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: chunked\r\n\r\n5;x\nyy\r\nhello\r\n0\r\n\r\n{inner}"
            ),
        ),
        (
            "HTTP/1.0 with chunked",
            format!(
                "POST {first} HTTP/1.0\r\n{host}\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: {}\r\n\r\n{chunked_inner}",
                chunked_inner.len()
            ),
        ),
        (
            "refused request with a body that is a request",
            format!(
                "POST {} HTTP/1.1\r\nHost: evil.test:{port}\r\nContent-Length: {}\r\n\r\n{inner}",
                if absolute {
                    format!("http://evil.test:{port}/smuggle-outer")
                } else {
                    "/smuggle-outer".to_string()
                },
                inner.len()
            ),
        ),
    ]
}

/// Whether the front saw anything but requests to the allowed host.
fn smuggled(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("smuggle") || line.contains("evil.test"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn smuggling_shapes_through_the_explicit_proxy_reach_nothing() {
    let (front, seen) = front().await;
    let (proxy, _records) = explicit(front).await;
    for (name, request) in smuggling_shapes(front.port(), true) {
        let answer = exchange(proxy, request.as_bytes()).await;
        let got = smuggled(&seen);
        assert!(
            got.is_empty(),
            "{name}: the front saw {got:?}; agent got {answer}"
        );
    }
}

#[tokio::test]
async fn smuggling_shapes_on_an_intercepted_connection_reach_nothing() {
    let (front, seen) = front().await;
    let (proxy, _records) = transparent(front).await;
    for (name, request) in smuggling_shapes(front.port(), false) {
        let answer = exchange(proxy, request.as_bytes()).await;
        let got = smuggled(&seen);
        assert!(
            got.is_empty(),
            "{name}: the front saw {got:?}; agent got {answer}"
        );
    }
}

/// Host spellings from sandbox-runtime's `network-filter.test.ts` and
/// `host-header-proxy.test.ts` (NUL and CRLF before an allowed suffix,
/// an IPv6 zone id ending in an allowed name, ports that are zero, too
/// large, or a second colon), through CONNECT and absolute-form GET.
#[tokio::test]
async fn host_spellings_from_other_sandboxes_reach_nothing() {
    let (front, seen) = front().await;
    let (proxy, _records) = explicit(front).await;
    let port = front.port();
    let wrap = port as u32 + 65536;
    let authorities = [
        format!("evil.test%00.allowed.test:{port}"),
        format!("evil.test\0.allowed.test:{port}"),
        format!("[::ffff:127.0.0.1%25x.allowed.test]:{port}"),
        format!("::ffff:127.0.0.1%x.allowed.test:{port}"),
        format!("allowed.test:{port}:1"),
        format!("evil.test:{port}#allowed.test"),
        format!("evil.test#allowed.test:{port}"),
        format!("allowed.test:{wrap}"),
        "allowed.test:0".to_string(),
        format!("allowed.test.:{port}@evil.test:{port}"),
        format!("evil.test\t.allowed.test:{port}"),
    ];
    for authority in &authorities {
        let connect = format!(
            "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\nGET /smuggle HTTP/1.1\r\nHost: evil.test\r\n\r\n"
        );
        let answer = exchange(proxy, connect.as_bytes()).await;
        assert!(!answer.contains(" 200 "), "CONNECT {authority:?}: {answer}");
        let get = format!(
            "GET http://{authority}/smuggle HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(proxy, get.as_bytes()).await;
        assert!(!answer.contains("front"), "GET {authority:?}: {answer}");
    }
    let got = smuggled(&seen);
    assert!(got.is_empty(), "the front saw {got:?}");
}

/// HTTP/2 with prior knowledge (codex's proxy serves `HttpServer::auto`;
/// ours speaks HTTP/1 only) and an `h2c` upgrade: neither reaches the
/// front as anything but an HTTP/1 request to the allowed host.
#[tokio::test]
async fn http2_prior_knowledge_and_h2c_reach_nothing() {
    let (front, seen) = front().await;
    let port = front.port();
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let (proxy, _r1) = explicit(front).await;
    let answer = exchange(proxy, preface).await;
    assert!(!answer.contains(" 200 "), "explicit: {answer}");
    let (intercept, _r2) = transparent(front).await;
    let answer = exchange(intercept, preface).await;
    assert!(!answer.contains(" 200 "), "transparent: {answer}");
    let h2c = format!(
        "GET http://allowed.test:{port}/h2c HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n\
         PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    );
    let answer = exchange(proxy, h2c.as_bytes()).await;
    assert!(!answer.contains(" 101 "), "h2c: {answer}");
    let got = smuggled(&seen);
    assert!(got.is_empty(), "the front saw {got:?}");
}

/// A refused origin-form request names its destination only in its Host
/// header (curl with `--proxy` off and `Host:` set, a hand-written
/// client): the record must carry that destination, as every refusal's
/// record names where the agent tried to go.
#[tokio::test]
async fn a_refused_origin_form_request_is_recorded_with_its_host() {
    let (front, _seen) = front().await;
    let (proxy, records) = explicit(front).await;
    let answer = exchange(
        proxy,
        b"GET /exfil HTTP/1.1\r\nHost: evil.test:8080\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let record = records.next().await.expect("a record");
    assert_eq!(record["decision"], "denied", "{record}");
    assert_eq!(record["target"]["host"], "evil.test", "{record}");
    assert_eq!(record["target"]["port"], 8080, "{record}");
}

/// An absolute-form request whose Host header names another host is
/// refused; its record must name both, since a shared front would have
/// routed by the Host header.
#[tokio::test]
async fn a_refused_host_mismatch_is_recorded_with_the_host_header() {
    let (front, _seen) = front().await;
    let (proxy, records) = explicit(front).await;
    let port = front.port();
    let request = format!(
        "GET http://allowed.test:{port}/x HTTP/1.1\r\nHost: evil.test:{port}\r\nConnection: close\r\n\r\n"
    );
    let answer = exchange(proxy, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let record = records.next().await.expect("a record");
    assert_eq!(record["decision"], "denied", "{record}");
    assert_eq!(record["target"]["host"], "allowed.test", "{record}");
    assert_eq!(
        record["target"]["host_header"],
        format!("evil.test:{port}"),
        "{record}"
    );
}

/// An intercepted request head the sniffer refuses for naming its host
/// ambiguously (two Host headers; an absolute-form target other than the
/// Host) names its hosts nowhere but in that head: the record must carry
/// them, beside the original destination.
#[tokio::test]
async fn a_refused_ambiguous_intercepted_head_is_recorded_with_its_hosts() {
    let (front, seen) = front().await;
    let (proxy, records) = transparent(front).await;
    let port = front.port();
    for head in [
        format!("GET /x HTTP/1.1\r\nHost: allowed.test:{port}\r\nHost: evil.test:{port}\r\n\r\n"),
        format!("GET http://evil.test:{port}/x HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n"),
    ] {
        // The sniffer's refusals close the connection without an answer.
        let answer = exchange(proxy, head.as_bytes()).await;
        assert!(!answer.contains("front"), "{head:?}: {answer}");
        let record = records.next().await.expect("a record");
        assert_eq!(record["decision"], "denied", "{record}");
        assert_eq!(
            record["target"]["original_dst"],
            front.to_string(),
            "{record}"
        );
        let host = record["target"]["host"].as_str().unwrap_or_default();
        assert!(
            host.contains(&format!("evil.test:{port}")),
            "{head:?}: {record}"
        );
    }
    let got = smuggled(&seen);
    assert!(got.is_empty(), "the front saw {got:?}");
}
