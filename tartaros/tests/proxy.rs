//! The egress proxy against local upstreams on 127.0.0.1 (HTTP, and HTTPS
//! with a CA made in the test). Names resolve through a static map: no
//! real DNS, no traffic beyond loopback.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tartaros::effectlog::{Decision, Record};
use tartaros::events::{EffectReceiver, Entry};
use tartaros::proxy::{self, OriginalDst, ProxyConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/pki.rs"]
mod pki_support;
use pki_support::{TestPki, pki};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One request as an upstream saw it: method, target, Host header and
/// the header names.
type SeenRequest = (String, String, String, Vec<String>);

/// What an upstream saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: Mutex<Vec<SeenRequest>>,
}

/// An upstream answering `hello <path>` over HTTP, or HTTPS with `tls`.
async fn upstream(tls: Option<Arc<rustls::ServerConfig>>) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen2.connections.fetch_add(1, Ordering::SeqCst);
            let seen = seen2.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let host = request
                            .headers()
                            .get("host")
                            .map(|h| h.to_str().unwrap().to_string());
                        let names = request
                            .headers()
                            .keys()
                            .map(|k| k.as_str().to_string())
                            .collect();
                        let target = request.uri().to_string();
                        seen.requests.lock().unwrap().push((
                            request.method().to_string(),
                            target.clone(),
                            host.unwrap_or_default(),
                            names,
                        ));
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "hello {target}"
                        )))))
                    }
                });
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(config) => {
                        if let Ok(stream) =
                            tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                        {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    (addr, seen)
}

struct Setup {
    pki: TestPki,
    http: SocketAddr,
    http_seen: Arc<Seen>,
    https: SocketAddr,
    https_seen: Arc<Seen>,
    proxy: SocketAddr,
    transparent: SocketAddr,
    effects: EffectReceiver,
    /// Where the transparent listener says connections were going.
    original: Arc<Mutex<Option<SocketAddr>>>,
}

async fn setup(allow_internal: bool) -> Setup {
    let pki = pki(&["allowed.test", "a.wild.test", "denied.test"]);
    let (http, http_seen) = upstream(None).await;
    let (https, https_seen) = upstream(Some(pki.server.clone())).await;
    let resolver = StaticResolver::new()
        .with_ip("allowed.test", LOCALHOST)
        .with_ip("a.wild.test", LOCALHOST)
        .with_ip("denied.test", LOCALHOST);
    let mut config = ProxyConfig::new(
        vec!["allowed.test".into(), "*.wild.test".into()],
        Arc::new(resolver),
    );
    config.allow_internal = allow_internal;
    config.connect_ports = vec![https.port()];
    config.http_ports = vec![http.port()];
    config.sniff_timeout = Duration::from_secs(2);
    let config = Arc::new(config);
    let (events, effects) = tartaros::events::channel();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let proxy = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, config.clone(), events.clone()));
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let transparent = listener.local_addr().unwrap();
    let original = Arc::new(Mutex::new(None));
    let lookup = original.clone();
    let original_dst: OriginalDst = Arc::new(move |_: &TcpStream| *lookup.lock().unwrap());
    tokio::spawn(proxy::serve_transparent(
        listener,
        config,
        events,
        original_dst,
    ));
    Setup {
        pki,
        http,
        http_seen,
        https,
        https_seen,
        proxy,
        transparent,
        effects,
        original,
    }
}

impl Setup {
    async fn effect(&mut self) -> Record {
        let entry = tokio::time::timeout(Duration::from_secs(5), self.effects.recv())
            .await
            .expect("an effect within 5 s")
            .expect("effect channel open");
        let Entry::Record(effect) = entry else {
            panic!("expected one record, got {entry:?}");
        };
        assert_eq!(effect.kind, "proxy");
        effect
    }

    fn tls(&self) -> tokio_rustls::TlsConnector {
        let path = PathBuf::from(self.pki.ca_file.path());
        tokio_rustls::TlsConnector::from(tartaros::broker::client_tls(Some(&path)).unwrap())
    }

    /// Sends CONNECT; returns the status line and, on 200, the tunnel.
    async fn connect(&self, authority: &str) -> (String, TcpStream) {
        let mut stream = TcpStream::connect(self.proxy).await.unwrap();
        let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let head = read_head(&mut stream).await;
        (head, stream)
    }
}

/// Reads an HTTP head byte by byte (so nothing after it is consumed).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Sends raw request text and reads the whole answer (`Connection: close`).
async fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A GET over TLS on `stream` for `name`, returning the body.
async fn https_get<S>(
    tls: &tokio_rustls::TlsConnector,
    stream: S,
    name: ServerName<'static>,
    host: &str,
) -> Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let tls = tls.connect(name, stream).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = Request::get("/secure")
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// `target.name` of the record (null when absent).
fn field<'a>(effect: &'a Record, name: &str) -> &'a serde_json::Value {
    effect.target.get(name).unwrap_or(&serde_json::Value::Null)
}

fn assert_effect(effect: &Record, host: &str, method: &str, decision: &str, mode: &str) {
    assert_eq!(field(effect, "host"), host, "{effect:?}");
    assert_eq!(field(effect, "method"), method, "{effect:?}");
    assert_eq!(effect.decision.as_str(), decision, "{effect:?}");
    assert_eq!(field(effect, "mode"), mode, "{effect:?}");
    for key in ["port", "reason", "bytes_up", "bytes_down", "duration_us"] {
        assert!(
            effect.target.get(key).is_some(),
            "{key} missing in {effect:?}"
        );
    }
}

#[tokio::test]
async fn connect_reaches_an_allowed_https_upstream() {
    let mut s = setup(true).await;
    for host in ["allowed.test", "a.wild.test"] {
        let (head, tunnel) = s.connect(&format!("{host}:{}", s.https.port())).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let name = ServerName::try_from(host.to_string()).unwrap();
        let body = https_get(&s.tls(), tunnel, name, host).await.unwrap();
        assert_eq!(body, "hello /secure");
        let effect = s.effect().await;
        assert_effect(&effect, host, "CONNECT", "allowed", "explicit");
        assert_eq!(field(&effect, "port"), s.https.port());
        assert!(field(&effect, "bytes_up").as_u64().unwrap() > 0);
        assert!(field(&effect, "bytes_down").as_u64().unwrap() > 0);
    }
}

#[tokio::test]
async fn absolute_form_http_is_forwarded_without_proxy_headers() {
    let mut s = setup(true).await;
    let port = s.http.port();
    let answer = exchange(
        s.proxy,
        &format!(
            "GET http://Allowed.Test:{port}/path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nX-Keep: 1\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello /path?q=1"), "{answer}");
    let requests = s.http_seen.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let (method, target, host, names) = &requests[0];
    assert_eq!((method.as_str(), target.as_str()), ("GET", "/path?q=1"));
    assert_eq!(host, &format!("allowed.test:{port}"));
    assert!(names.contains(&"x-keep".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("proxy-")), "{names:?}");
    let effect = s.effect().await;
    assert_effect(&effect, "allowed.test", "GET", "allowed", "explicit");
    assert_eq!(field(&effect, "status"), 200);
    assert_eq!(field(&effect, "bytes_down"), "hello /path?q=1".len());
}

/// Adversarial round 8: plain HTTP to an allowed name that names another
/// virtual host in a forwarding header. A shared front (a CDN, a
/// virtual-hosting server, a framework that trusts forwarding headers)
/// picks the site from `X-Forwarded-Host` or `Forwarded: host=`, as it
/// would from a second Host header, which the proxy already refuses.
/// The proxy judged `allowed.test`; no other host name may go with it,
/// through the explicit proxy or an intercepted connection.
#[tokio::test]
async fn host_overrides_do_not_reach_the_upstream() {
    let mut s = setup(true).await;
    let port = s.http.port();
    let overrides = "X-Forwarded-Host: denied.test\r\nForwarded: host=denied.test\r\nX-Host: denied.test\r\nX-Forwarded-Server: denied.test\r\nX-HTTP-Host-Override: denied.test\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n";
    let explicit = format!(
        "GET http://allowed.test:{port}/a HTTP/1.1\r\nHost: allowed.test:{port}\r\n{overrides}X-Keep: 1\r\nConnection: close\r\n\r\n"
    );
    let answer = exchange(s.proxy, &explicit).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    s.effect().await;
    *s.original.lock().unwrap() = Some(SocketAddr::new("198.51.100.1".parse().unwrap(), port));
    let intercepted = format!(
        "GET /b HTTP/1.1\r\nHost: allowed.test:{port}\r\n{overrides}X-Keep: 1\r\nConnection: close\r\n\r\n"
    );
    let answer = exchange(s.transparent, &intercepted).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let requests = s.http_seen.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for (_, target, _, names) in &requests {
        assert!(names.contains(&"x-keep".to_string()), "{target}: {names:?}");
        for name in [
            "x-forwarded-host",
            "forwarded",
            "x-host",
            "x-forwarded-server",
            "x-http-host-override",
            "x-original-url",
            "x-rewrite-url",
        ] {
            assert!(
                !names.contains(&name.to_string()),
                "{target}: {name} reached the upstream: {names:?}"
            );
        }
    }
}

#[tokio::test]
async fn denied_domains_and_ip_literals_get_403() {
    let mut s = setup(true).await;
    let (https, http) = (s.https.port(), s.http.port());
    let cases = [
        (
            format!("denied.test:{https}"),
            "denied.test",
            "domain not in the allow list",
        ),
        (
            format!("wild.test:{https}"),
            "wild.test",
            "domain not in the allow list",
        ),
        (
            format!("127.0.0.1:{https}"),
            "127.0.0.1",
            "IP literals are refused",
        ),
        (
            format!("2130706433:{https}"),
            "2130706433",
            "IP literals are refused",
        ),
        (format!("[::1]:{https}"), "[::1]", "IP literals are refused"),
        (
            "allowed.test:22".to_string(),
            "allowed.test",
            "port not allowed",
        ),
    ];
    for (authority, host, reason) in cases {
        let (head, mut stream) = s.connect(&authority).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{authority}: {head}");
        let mut body = vec![0u8; 200];
        let n = stream.read(&mut body).await.unwrap();
        assert!(
            String::from_utf8_lossy(&body[..n]).contains(reason),
            "{authority}"
        );
        let effect = s.effect().await;
        assert_effect(&effect, host, "CONNECT", "denied", "explicit");
        assert!(
            field(&effect, "reason").as_str().unwrap().contains(reason),
            "{effect:?}"
        );
    }
    for url in [
        format!("http://denied.test:{http}/"),
        format!("http://127.0.0.1:{http}/"),
    ] {
        let answer = exchange(
            s.proxy,
            &format!("GET {url} HTTP/1.1\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{url}: {answer}");
        assert_eq!(s.effect().await.decision, Decision::Denied);
    }
    assert_eq!(s.http_seen.connections.load(Ordering::SeqCst), 0);
    assert_eq!(s.https_seen.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_without_allow_internal() {
    let mut s = setup(false).await;
    let (head, _) = s.connect(&format!("allowed.test:{}", s.https.port())).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let effect = s.effect().await;
    assert_effect(&effect, "allowed.test", "CONNECT", "denied", "explicit");
    assert_eq!(
        field(&effect, "reason"),
        "host resolves to an internal address"
    );
    let url = format!("http://allowed.test:{}/", s.http.port());
    let answer = exchange(
        s.proxy,
        &format!("GET {url} HTTP/1.1\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("internal address"),
        "{answer}"
    );
    assert_eq!(s.effect().await.decision, Decision::Denied);
    assert_eq!(s.http_seen.connections.load(Ordering::SeqCst), 0);
    assert_eq!(s.https_seen.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn host_header_must_match_the_target() {
    let mut s = setup(true).await;
    let port = s.http.port();
    for host in [
        "denied.test".to_string(),
        format!("a.wild.test:{port}"),
        format!("allowed.test:{}", port + 1),
    ] {
        let request = format!(
            "GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(s.proxy, &request).await;
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains("Host header does not match"),
            "{answer}"
        );
        assert_eq!(s.effect().await.decision, Decision::Denied);
    }
    assert_eq!(s.http_seen.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn transparent_tls_is_filtered_by_sni() {
    let mut s = setup(true).await;
    // The agent "connected" to some address on the HTTPS port; the proxy
    // goes by the SNI and resolves the name itself.
    *s.original.lock().unwrap() = Some(SocketAddr::new(
        "203.0.113.7".parse().unwrap(),
        s.https.port(),
    ));
    let stream = TcpStream::connect(s.transparent).await.unwrap();
    let name = ServerName::try_from("allowed.test").unwrap();
    let body = https_get(&s.tls(), stream, name, "allowed.test")
        .await
        .unwrap();
    assert_eq!(body, "hello /secure");
    let effect = s.effect().await;
    assert_effect(&effect, "allowed.test", "TLS", "allowed", "transparent");
    assert_eq!(
        field(&effect, "original_dst"),
        format!("203.0.113.7:{}", s.https.port()).as_str()
    );

    let connections = s.https_seen.connections.load(Ordering::SeqCst);
    let stream = TcpStream::connect(s.transparent).await.unwrap();
    let name = ServerName::try_from("denied.test").unwrap();
    assert!(
        https_get(&s.tls(), stream, name, "denied.test")
            .await
            .is_err()
    );
    let effect = s.effect().await;
    assert_effect(&effect, "denied.test", "TLS", "denied", "transparent");
    assert_eq!(field(&effect, "reason"), "domain not in the allow list");

    // An IP server name makes rustls send no SNI at all.
    let stream = TcpStream::connect(s.transparent).await.unwrap();
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    assert!(
        https_get(&s.tls(), stream, name, "allowed.test")
            .await
            .is_err()
    );
    let effect = s.effect().await;
    assert_eq!(effect.decision, Decision::Denied);
    assert_eq!(field(&effect, "reason"), "TLS ClientHello without SNI");
    assert_eq!(s.https_seen.connections.load(Ordering::SeqCst), connections);
}

#[tokio::test]
async fn transparent_http_is_filtered_by_host() {
    let mut s = setup(true).await;
    let port = s.http.port();
    *s.original.lock().unwrap() = Some(SocketAddr::new("198.51.100.1".parse().unwrap(), port));
    let answer = exchange(
        s.transparent,
        &format!("GET /plain HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello /plain"),
        "{answer}"
    );
    let effect = s.effect().await;
    assert_effect(&effect, "allowed.test", "HTTP", "allowed", "transparent");
    assert!(field(&effect, "bytes_down").as_u64().unwrap() > 0);

    for (host, reason) in [
        ("denied.test".to_string(), "domain not in the allow list"),
        ("127.0.0.1".to_string(), "IP literals are refused"),
        (format!("allowed.test:{}", port + 1), "port does not match"),
    ] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = exchange(s.transparent, &request).await;
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains(reason),
            "{host}: {answer}"
        );
        let effect = s.effect().await;
        assert_eq!(effect.decision, Decision::Denied, "{effect:?}");
    }
    let answer = exchange(s.transparent, "GET / HTTP/1.0\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("without a Host"),
        "{answer}"
    );
    assert_eq!(s.effect().await.decision, Decision::Denied);
    assert_eq!(s.http_seen.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn transparent_connection_without_original_destination_is_refused() {
    let mut s = setup(true).await;
    *s.original.lock().unwrap() = None;
    let answer = exchange(
        s.transparent,
        "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    )
    .await;
    assert_eq!(answer, "");
    let effect = s.effect().await;
    assert_eq!(effect.decision, Decision::Denied);
    assert_eq!(field(&effect, "reason"), "original destination unknown");
}

#[tokio::test]
async fn transparent_silence_and_other_protocols_are_refused() {
    let mut s = setup(true).await;
    *s.original.lock().unwrap() = Some(SocketAddr::new(LOCALHOST, 22));
    // A protocol where the server speaks first: nothing to sniff.
    let stream = TcpStream::connect(s.transparent).await.unwrap();
    let effect = s.effect().await;
    assert_eq!(effect.decision, Decision::Denied);
    assert_eq!(
        field(&effect, "reason"),
        "no ClientHello or request head in time"
    );
    drop(stream);
    let answer = exchange(s.transparent, "SSH-2.0-OpenSSH_9.6\r\n").await;
    assert_eq!(answer, "");
    assert_eq!(field(&s.effect().await, "reason"), "neither TLS nor HTTP");
}

/// `cargo test --release -p tartaros --test proxy -- --ignored --nocapture bench_proxy`
/// (what `cargo xtask bench proxy` runs). TARTAROS_BENCH_MIB sets the
/// download size (default 1024), TARTAROS_BENCH_RUNS the runs (default 5),
/// TARTAROS_BENCH_REQUESTS the latency requests (default 2000, 0 skips),
/// TARTAROS_BENCH_PATHS a comma list of direct, connect, transparent.
#[cfg(feature = "bench")]
#[test]
#[ignore = "benchmark, not a test"]
fn bench_proxy() {
    let mib: u64 = std::env::var("TARTAROS_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let runs: usize = std::env::var("TARTAROS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut options = tartaros::proxy::bench::BenchOptions {
        bytes: mib << 20,
        runs,
        ..Default::default()
    };
    if let Some(requests) = std::env::var("TARTAROS_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options.requests = requests;
    }
    if let Ok(paths) = std::env::var("TARTAROS_BENCH_PATHS") {
        options.paths = paths
            .split(',')
            .filter_map(tartaros::proxy::bench::Path::parse)
            .collect();
    }
    let report = tartaros::proxy::bench::run(&options).unwrap();
    println!("{report}");
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_in_the_backlog() {
    let (https, _) = upstream(None).await;
    let resolver = StaticResolver::new().with_ip("allowed.test", LOCALHOST);
    let mut config = ProxyConfig::new(vec!["allowed.test".into()], Arc::new(resolver));
    config.allow_internal = true;
    config.connect_ports = vec![https.port()];
    config.max_connections = 1;
    let (events, _effects) = tartaros::events::channel();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, Arc::new(config), events));
    let request = format!(
        "CONNECT allowed.test:{0} HTTP/1.1\r\nHost: allowed.test:{0}\r\n\r\n",
        https.port()
    );
    let mut first = TcpStream::connect(addr).await.unwrap();
    first.write_all(request.as_bytes()).await.unwrap();
    assert!(read_head(&mut first).await.starts_with("HTTP/1.1 200"));
    let mut second = TcpStream::connect(addr).await.unwrap();
    second.write_all(request.as_bytes()).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), read_head(&mut second)).await;
    assert!(
        waited.is_err(),
        "the second connection was served while the first held the only slot"
    );
    drop(first);
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut second))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Issue 12, class 9: finished connections free their slot. The proxy
/// serves 256 connections at once; 1,000 sequential requests and 300
/// tunnels must not use them up, and one more still works.
#[tokio::test]
async fn a_thousand_finished_connections_do_not_exhaust_the_proxy() {
    let mut s = setup(true).await;
    let port = s.http.port();
    let started = std::time::Instant::now();
    let get = |i: usize| {
        format!(
            "GET http://allowed.test:{port}/n{i} HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"
        )
    };
    for i in 0..1000 {
        let answer = exchange(s.proxy, &get(i)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "request {i}: {answer}");
        s.effect().await;
    }
    let https = s.https.port();
    for i in 0..300 {
        let (head, tunnel) = s.connect(&format!("allowed.test:{https}")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "tunnel {i}: {head}");
        // The agent hangs up; the upstream sees EOF and closes too.
        drop(tunnel);
        s.effect().await;
    }
    let answer = exchange(s.proxy, &get(1000)).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the request after 1,300: {answer}"
    );
    assert!(answer.ends_with("hello /n1000"), "{answer}");
    eprintln!("1,301 proxy requests in {:?}", started.elapsed());
}
