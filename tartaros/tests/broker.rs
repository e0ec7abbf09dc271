//! The credential broker against local HTTPS upstreams on 127.0.0.1 with a
//! CA made in the test. Names resolve through a static map: no real DNS.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tartaros::broker::{self, BrokerSecrets};
use tartaros::effectlog::{Decision, Record};
use tartaros::events::{EffectReceiver, Entry};
use tartaros::policy::{BrokerCapability, BrokerConfig};
use tartaros::proxy::StaticResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/pki.rs"]
mod pki_support;
use pki_support::{TestPki, pki};

const TOKEN: &str = "agent-token-0123456789";
const SECRET: &str = "Bearer upstream-secret-9f8e7d";

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HashMap<String, String>,
}

#[derive(Default)]
struct Upstream {
    connections: AtomicUsize,
    requests: Mutex<Vec<Seen>>,
}

/// An HTTPS upstream. `/redirect` answers 302 to `redirect_to`, `/echo`
/// echoes the Authorization header in a response header, anything else
/// answers `ok <target>`.
async fn upstream(
    tls: Arc<rustls::ServerConfig>,
    redirect_to: String,
) -> (SocketAddr, Arc<Upstream>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(Upstream::default());
    let shared = state.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            shared.connections.fetch_add(1, Ordering::SeqCst);
            let (state, tls, redirect_to) = (shared.clone(), tls.clone(), redirect_to.clone());
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (state, redirect_to) = (state.clone(), redirect_to.clone());
                    async move {
                        let headers: HashMap<String, String> = request
                            .headers()
                            .iter()
                            .map(|(k, v)| {
                                (
                                    k.as_str().to_string(),
                                    v.to_str().unwrap_or("?").to_string(),
                                )
                            })
                            .collect();
                        let seen = Seen {
                            method: request.method().to_string(),
                            target: request.uri().to_string(),
                            headers: headers.clone(),
                        };
                        state.requests.lock().unwrap().push(seen);
                        let response = match request.uri().path() {
                            "/v1/redirect" => Response::builder()
                                .status(302)
                                .header("location", redirect_to)
                                .body(Full::new(Bytes::from_static(b"moved"))),
                            "/v1/echo" => Response::builder()
                                .header(
                                    "x-echo",
                                    headers.get("authorization").cloned().unwrap_or_default(),
                                )
                                .header("x-safe", "kept")
                                .body(Full::new(Bytes::from_static(b"echoed"))),
                            // The credential in the status line.
                            "/v1/reason" => {
                                let echoed =
                                    headers.get("authorization").cloned().unwrap_or_default();
                                let mut response = Response::builder()
                                    .body(Full::new(Bytes::from_static(b"reason")))
                                    .unwrap();
                                if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(
                                    format!("Echo {echoed}").into_bytes(),
                                ) {
                                    response.extensions_mut().insert(reason);
                                }
                                Ok(response)
                            }
                            _ => Response::builder()
                                .body(Full::new(Bytes::from(format!("ok {}", request.uri())))),
                        };
                        Ok::<_, Infallible>(response.unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, state)
}

struct Setup {
    _pki: TestPki,
    api: Arc<Upstream>,
    other: Arc<Upstream>,
    broker: SocketAddr,
    effects: EffectReceiver,
}

fn config(allow_internal: bool) -> BrokerConfig {
    BrokerConfig {
        port: 1,
        auth_header: "X-Broker-Auth".into(),
        allowed_hosts: vec!["api.test".into()],
        allow_internal,
        token_env: "TT_BROKER_TOKEN".into(),
        ca_file: None,
        capabilities: vec![BrokerCapability {
            name: "api".into(),
            upstream: "api.test".into(),
            header: "Authorization".into(),
            value_env: "TT_API_VALUE".into(),
            methods: vec!["GET".into(), "POST".into()],
            path_prefix: Some("/v1".into()),
        }],
    }
}

async fn setup(allow_internal: bool) -> Setup {
    let pki = pki(&["api.test", "other.test"]);
    let (other_addr, other) = upstream(pki.server.clone(), String::new()).await;
    let redirect = format!("https://other.test:{}/landed", other_addr.port());
    let (api_addr, api) = upstream(pki.server.clone(), redirect).await;
    // The broker always dials port 443; the map sends it to the test ports.
    let resolver = StaticResolver::new()
        .with_addr("api.test", api_addr)
        .with_addr("other.test", other_addr);
    let config = config(allow_internal);
    let env = |name: &str| match name {
        "TT_BROKER_TOKEN" => Some(OsString::from(TOKEN)),
        "TT_API_VALUE" => Some(OsString::from(SECRET)),
        _ => None,
    };
    let secrets = Arc::new(BrokerSecrets::load(&config, env).unwrap());
    let tls = broker::client_tls(Some(pki.ca_file.path())).unwrap();
    let (events, effects) = tartaros::events::channel();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(broker::serve(
        listener,
        Arc::new(config),
        secrets,
        tls,
        Arc::new(resolver),
        events,
    ));
    Setup {
        _pki: pki,
        api,
        other,
        broker: addr,
        effects,
    }
}

impl Setup {
    /// Sends a request to the broker; returns the whole raw answer.
    async fn call(&self, method: &str, path: &str, token: Option<&str>) -> String {
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
        if let Some(token) = token {
            request.push_str(&format!("X-Broker-Auth: {token}\r\n"));
        }
        // The agent trying to set the credential itself must not work.
        request.push_str("Authorization: Bearer agent-chosen\r\n\r\n");
        let answer = self.send(&request).await;
        assert!(
            !answer.contains(SECRET) && !answer.contains("upstream-secret"),
            "secret in answer: {answer}"
        );
        answer
    }

    /// Sends a raw request to the broker; returns the whole raw answer.
    async fn send(&self, request: &str) -> String {
        let mut stream = TcpStream::connect(self.broker).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("broker answers within 10 s")
            .unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    async fn effect(&mut self) -> Record {
        let entry = tokio::time::timeout(Duration::from_secs(5), self.effects.recv())
            .await
            .expect("an effect within 5 s")
            .expect("effect channel open");
        let Entry::Record(effect) = entry else {
            panic!("expected one record, got {entry:?}");
        };
        assert_eq!(effect.kind, "broker");
        let text = serde_json::to_string(&effect.to_fields()).unwrap();
        assert!(
            !text.contains(SECRET) && !text.contains("upstream-secret"),
            "secret in effect: {text}"
        );
        assert!(!text.contains(TOKEN), "token in effect: {text}");
        effect
    }
}

/// `target.name` of the record (null when absent).
fn field<'a>(effect: &'a Record, name: &str) -> &'a serde_json::Value {
    effect.target.get(name).unwrap_or(&serde_json::Value::Null)
}

fn status(answer: &str) -> u16 {
    answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn right_token_injects_the_credential_and_strips_the_token() {
    let mut s = setup(true).await;
    let answer = s.call("GET", "/api/v1/repos?page=2", Some(TOKEN)).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.ends_with("ok /v1/repos?page=2"), "{answer}");
    let seen = s.api.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, "/v1/repos?page=2");
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some(SECRET)
    );
    assert_eq!(
        seen[0].headers.get("host").map(String::as_str),
        Some("api.test")
    );
    assert!(
        !seen[0].headers.contains_key("x-broker-auth"),
        "{:?}",
        seen[0].headers
    );
    assert!(!seen[0].headers.values().any(|v| v.contains(TOKEN)));
    let effect = s.effect().await;
    assert_eq!(field(&effect, "capability"), "api");
    assert_eq!(field(&effect, "method"), "GET");
    assert_eq!(field(&effect, "host"), "api.test");
    assert_eq!(field(&effect, "path"), "/v1/repos");
    assert_eq!(field(&effect, "status"), 200);
    assert_eq!(effect.decision, Decision::Allowed);
    assert_eq!(field(&effect, "bytes"), "ok /v1/repos?page=2".len());
}

#[tokio::test]
async fn wrong_or_missing_token_gets_401() {
    let mut s = setup(true).await;
    for token in [None, Some("wrong"), Some(""), Some("agent-token-012345678")] {
        let answer = s.call("GET", "/api/v1/repos", token).await;
        assert_eq!(status(&answer), 401, "{token:?}: {answer}");
        assert!(answer.contains("X-Broker-Auth"), "{answer}");
        let effect = s.effect().await;
        assert_eq!(effect.decision, Decision::Denied);
        assert_eq!(field(&effect, "status"), 401);
    }
    // Without the token, an unknown capability is not revealed as such.
    let answer = s.call("GET", "/nope/x", Some("wrong")).await;
    assert_eq!(status(&answer), 401, "{answer}");
    s.effect().await;
    assert_eq!(s.api.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn policy_refusals_get_403() {
    let mut s = setup(true).await;
    for (method, path, reason) in [
        ("DELETE", "/api/v1/repos", "method not allowed"),
        ("GET", "/api/v2/repos", "path prefix"),
        ("GET", "/api/v1x", "path prefix"),
        ("GET", "/api/v1/../admin", "dot segments"),
        ("GET", "/api/v1/%2e%2e/admin", "percent-encoded"),
        ("GET", "/api/v1//admin", "empty path segment"),
        ("GET", "/api/v1/a%2fb", "encoded"),
        ("GET", "/other/v1", "no such capability"),
    ] {
        let answer = s.call(method, path, Some(TOKEN)).await;
        assert_eq!(status(&answer), 403, "{method} {path}: {answer}");
        assert!(answer.contains(reason), "{method} {path}: {answer}");
        let effect = s.effect().await;
        assert_eq!(effect.decision, Decision::Denied);
        assert!(
            field(&effect, "reason").as_str().unwrap().contains(reason),
            "{effect:?}"
        );
    }
    assert_eq!(s.api.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn redirects_are_passed_back_not_followed() {
    let mut s = setup(true).await;
    let answer = s.call("GET", "/api/v1/redirect", Some(TOKEN)).await;
    assert_eq!(status(&answer), 302, "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("location: https://other.test:"),
        "{answer}"
    );
    let effect = s.effect().await;
    assert_eq!(field(&effect, "status"), 302);
    assert_eq!(effect.decision, Decision::Allowed);
    // Give a (wrongly) following broker time to reach the other host.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.other.connections.load(Ordering::SeqCst), 0);
    assert!(s.other.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_upstream_echoing_the_credential_in_a_header_is_redacted() {
    let mut s = setup(true).await;
    let answer = s.call("GET", "/api/v1/echo", Some(TOKEN)).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("x-echo"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("x-safe: kept"),
        "{answer}"
    );
    s.effect().await;
}

#[tokio::test]
async fn an_upstream_echoing_the_credential_in_its_status_line_is_redacted() {
    let mut s = setup(true).await;
    let answer = s.call("GET", "/api/v1/reason", Some(TOKEN)).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    s.effect().await;
}

#[tokio::test]
async fn internal_upstreams_are_refused_without_allow_internal() {
    let mut s = setup(false).await;
    let answer = s.call("GET", "/api/v1/repos", Some(TOKEN)).await;
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("internal address"), "{answer}");
    let effect = s.effect().await;
    assert_eq!(effect.decision, Decision::Denied);
    assert_eq!(field(&effect, "host"), "api.test");
    assert_eq!(s.api.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_token_in_a_path_is_redacted_from_the_log() {
    let mut s = setup(true).await;
    let answer = s
        .call("GET", &format!("/api/v1/{TOKEN}"), Some(TOKEN))
        .await;
    assert_eq!(status(&answer), 200, "{answer}");
    let effect = s.effect().await; // asserts no token in the effect
    assert_eq!(field(&effect, "path"), "/v1/<redacted>");
}

#[tokio::test]
async fn a_missing_variable_is_named_and_no_value_printed() {
    let config = config(true);
    let err = BrokerSecrets::load(&config, |name| {
        (name == "TT_BROKER_TOKEN").then(|| OsString::from(TOKEN))
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("TT_API_VALUE") && !err.contains(TOKEN),
        "{err}"
    );
}

/// Issue 12, class 10: paths an upstream would normalize outside the
/// prefix never reach it with the credential; method overrides and
/// agent-supplied copies of injected headers are stripped.
#[tokio::test]
async fn normalization_tricks_are_refused_and_method_overrides_stripped() {
    let mut s = setup(true).await;
    for path in [
        "/api/v1/..;/admin",
        "/api/v1/%2e%2e;/admin",
        "/api/v1/.;/admin",
        "/api/v1/%252e%252e/admin",
        "/api/v1;x=1/../admin",
        "/api/v1/a%3bb",
        "/api/v1/a\\b",
    ] {
        let answer = s.call("GET", path, Some(TOKEN)).await;
        assert_eq!(status(&answer), 403, "{path}: {answer}");
        let effect = s.effect().await;
        assert_eq!(effect.decision, Decision::Denied, "{path}");
    }
    assert_eq!(
        s.api.connections.load(Ordering::SeqCst),
        0,
        "a refused path reached the upstream"
    );
    // Control: an ordinary request with override headers goes through,
    // as the GET that was checked, without them.
    let request = format!(
        "GET /api/v1/repos HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Broker-Auth: {TOKEN}\r\nX-HTTP-Method-Override: DELETE\r\nX-HTTP-Method: DELETE\r\nX-Method-Override: DELETE\r\nAuthorization: Bearer agent-chosen\r\nX-Kept: 1\r\n\r\n"
    );
    let answer = s.send(&request).await;
    assert_eq!(status(&answer), 200, "{answer}");
    let seen = s.api.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    for name in [
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ] {
        assert!(
            !seen[0].headers.contains_key(name),
            "{name}: {:?}",
            seen[0].headers
        );
    }
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some(SECRET)
    );
    assert_eq!(seen[0].headers.get("x-kept").map(String::as_str), Some("1"));
}

/// Issue 12, class 9: finished connections free their slot. The broker
/// serves 128 connections at once; far more sequential ones must work.
#[tokio::test]
async fn hundreds_of_sequential_calls_then_one_more_work() {
    let mut s = setup(true).await;
    let started = std::time::Instant::now();
    for i in 0..300 {
        let answer = s.call("GET", &format!("/api/v1/n{i}"), Some(TOKEN)).await;
        assert_eq!(status(&answer), 200, "call {i}: {answer}");
        s.effect().await;
    }
    let answer = s.call("GET", "/api/v1/last", Some(TOKEN)).await;
    assert_eq!(status(&answer), 200, "the call after 300: {answer}");
    assert!(answer.ends_with("ok /v1/last"), "{answer}");
    eprintln!("301 broker calls in {:?}", started.elapsed());
}

/// Adversarial round 8: headers with which frameworks and fronts replace
/// the request's path or host. Symfony, Zend and IIS's URL Rewrite route
/// by `X-Original-URL` / `X-Rewrite-URL`; fronts and frameworks that
/// trust forwarding headers pick the virtual host from `X-Forwarded-Host`,
/// `Forwarded: host=` or `X-Host`. The broker checked `/v1/repos` against
/// the prefix, and the upstream served `/admin`. Like the method
/// overrides, they must not reach the upstream.
#[tokio::test]
async fn path_and_host_overrides_do_not_reach_the_upstream() {
    let s = setup(true).await;
    let overrides = [
        ("x-original-url", "/admin/delete-everything"),
        ("x-rewrite-url", "/admin/delete-everything"),
        ("x-override-url", "/admin/delete-everything"),
        ("x-forwarded-host", "evil.test"),
        ("x-forwarded-server", "evil.test"),
        ("x-host", "evil.test"),
        ("x-http-host-override", "evil.test"),
        ("forwarded", "host=evil.test;proto=https"),
        ("x-forwarded-prefix", "/admin"),
    ];
    let extra: String = overrides
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "GET /api/v1/repos HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Broker-Auth: {TOKEN}\r\n{extra}X-Kept: 1\r\n\r\n"
    );
    let answer = s.send(&request).await;
    assert_eq!(status(&answer), 200, "{answer}");
    let seen = s.api.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    for (name, _) in overrides {
        assert!(
            !seen[0].headers.contains_key(name),
            "{name} reached the upstream: {:?}",
            seen[0].headers
        );
    }
    assert_eq!(seen[0].headers.get("x-kept").map(String::as_str), Some("1"));
}
