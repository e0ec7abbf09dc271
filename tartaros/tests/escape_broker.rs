//! The broker against a hostile agent and a careless upstream
//! (adversarial round 6):
//! - the injected credential echoed back by the upstream in another form
//!   than the exact value it injected: the bare token without its
//!   `Bearer ` scheme (as an API's error or debug header would quote it),
//!   percent-encoded in a redirect's `Location`, in another letter case,
//!   or as a header's name. None of these may reach the agent;
//! - paths whose meaning depends on the upstream's decoding: overlong
//!   UTF-8 for `.` and `/` (`%C0%AE`, which lenient decoders read as `.`)
//!   and characters that Unicode compatibility normalization (NFKC) turns
//!   into `.`, `/`, `\`, `;` or `%` (`%EF%BC%8E` is U+FF0E FULLWIDTH FULL
//!   STOP). Each could climb out of the capability's `path_prefix` at an
//!   upstream that normalizes; the broker must refuse them, not forward.

use std::convert::Infallible;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tartaros::broker::{self, BrokerSecrets};
use tartaros::policy::{BrokerCapability, BrokerConfig};
use tartaros::proxy::StaticResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/pki.rs"]
mod pki_support;
use pki_support::pki;

const TOKEN: &str = "agent-token-0123456789";
/// The scheme and the credential proper; the upstream quotes the latter.
const SECRET: &str = "Bearer ghp_Up5treamCred/9f8e+7d==";
const CREDENTIAL: &str = "ghp_Up5treamCred/9f8e+7d==";
/// A second capability's value, whose credential is a valid header name.
const NAMED: &str = "token ghp_HeaderNameCred0123";

/// What the upstream answers for each path: a header that holds the
/// credential in some form, and one that must be kept.
fn echo(path: &str, authorization: &str) -> Option<(&'static str, String)> {
    let bare = authorization
        .strip_prefix("Bearer ")
        .unwrap_or(authorization);
    let encoded: String = bare
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Some(match path {
        "/v1/bare" => (
            "www-authenticate",
            format!("Bearer error=\"invalid_token\", token=\"{bare}\""),
        ),
        "/v1/location" => (
            "location",
            format!("https://login.example/cb?access_token={encoded}"),
        ),
        "/v1/upper" => ("x-debug-token", bare.to_ascii_uppercase()),
        _ => return None,
    })
}

/// The upstream of the second capability names a header after the
/// credential (`token <credential>`).
fn echo_as_name(path: &str, authorization: &str) -> Option<(String, String)> {
    let bare = authorization.strip_prefix("token ")?;
    (path == "/v1/name").then(|| (bare.to_ascii_lowercase(), "1".to_string()))
}

async fn upstream(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = service_fn(|request: Request<hyper::body::Incoming>| async move {
                    let authorization = request
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let mut response = Response::builder().header("x-safe", "kept");
                    if let Some((name, value)) = echo(request.uri().path(), &authorization) {
                        response = response.header(name, value);
                    }
                    if let Some((name, value)) = echo_as_name(request.uri().path(), &authorization)
                    {
                        response = response.header(name, value);
                    }
                    Ok::<_, Infallible>(
                        response.body(Full::new(Bytes::from_static(b"ok"))).unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn broker_with_upstream() -> (pki_support::TestPki, SocketAddr) {
    let pki = pki(&["api.test"]);
    let api = upstream(pki.server.clone()).await;
    let config = BrokerConfig {
        port: 1,
        auth_header: "X-Broker-Auth".into(),
        allowed_hosts: vec!["api.test".into()],
        allow_internal: true,
        token_env: "TT_BROKER_TOKEN".into(),
        ca_file: None,
        capabilities: vec![
            BrokerCapability {
                name: "api".into(),
                upstream: "api.test".into(),
                header: "Authorization".into(),
                value_env: "TT_API_VALUE".into(),
                methods: vec![],
                path_prefix: Some("/v1".into()),
            },
            BrokerCapability {
                name: "named".into(),
                upstream: "api.test".into(),
                header: "Authorization".into(),
                value_env: "TT_NAMED_VALUE".into(),
                methods: vec![],
                path_prefix: Some("/v1".into()),
            },
        ],
    };
    let env = |name: &str| match name {
        "TT_BROKER_TOKEN" => Some(OsString::from(TOKEN)),
        "TT_API_VALUE" => Some(OsString::from(SECRET)),
        "TT_NAMED_VALUE" => Some(OsString::from(NAMED)),
        _ => None,
    };
    let secrets = Arc::new(BrokerSecrets::load(&config, env).unwrap());
    let tls = broker::client_tls(Some(pki.ca_file.path())).unwrap();
    let (events, _effects) = tartaros::events::channel();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let resolver = StaticResolver::new().with_addr("api.test", api);
    tokio::spawn(broker::serve(
        listener,
        Arc::new(config),
        secrets,
        tls,
        Arc::new(resolver),
        events,
    ));
    (pki, addr)
}

#[tokio::test]
async fn paths_that_normalize_to_dot_segments_are_refused() {
    let (_pki, broker) = broker_with_upstream().await;
    for path in [
        "/api/v1/x/%C0%AE%C0%AE/admin",
        "/api/v1/%C0%AE%C0%AE%C0%AF..%C0%AFadmin",
        "/api/v1/%E0%80%AE%E0%80%AE/admin",
        "/api/v1/x/%EF%BC%8E%EF%BC%8E/admin",
        "/api/v1/x/%E2%80%A5/admin",
        "/api/v1/x%EF%BC%8F..%EF%BC%8Fadmin",
        "/api/v1/x%EF%BC%BC..",
        "/api/v1/x%EF%BC%9B/admin",
        "/api/v1/x%CD%BE/admin",
        "/api/v1/x/%FF/admin",
    ] {
        let answer = call(broker, path).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
    }
    // Other non-ASCII names still pass.
    let answer = call(broker, "/api/v1/caf%C3%A9.txt").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

async fn call(broker: SocketAddr, path: &str) -> String {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Broker-Auth: {TOKEN}\r\n\r\n"
    );
    let mut stream = TcpStream::connect(broker).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("broker answers within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_credential_echoed_in_another_form_does_not_reach_the_agent() {
    let (_pki, broker) = broker_with_upstream().await;
    let lower = CREDENTIAL.to_ascii_lowercase();
    for path in ["/api/v1/bare", "/api/v1/location", "/api/v1/upper"] {
        let answer = call(broker, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        assert!(answer.contains("x-safe: kept"), "{path}: {answer}");
        let decoded = answer
            .replace("%2F", "/")
            .replace("%2B", "+")
            .replace("%3D", "=");
        assert!(
            !decoded.to_ascii_lowercase().contains(&lower),
            "{path}: credential in the answer: {answer}"
        );
    }
    let answer = call(broker, "/named/v1/name").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-safe: kept"), "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("ghp_headernamecred0123"),
        "credential as a header name in the answer: {answer}"
    );
}
