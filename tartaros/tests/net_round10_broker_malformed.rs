//! Adversarial round 10 (egress): requests the broker's HTTP parser
//! refuses before any decision (a header name with a space, a head past
//! the 64 KiB bound). hyper answers 400 / 431 and nothing reaches an
//! upstream, but the refusal must be a `broker` record, as the proxy's
//! are (`net_round10_malformed`), and hold neither token nor secret.

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tartaros::broker::{self, BrokerSecrets};
use tartaros::effectlog::{Decision, Record};
use tartaros::events::Entry;
use tartaros::policy::{BrokerCapability, BrokerConfig};
use tartaros::proxy::StaticResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// Only the CA is used: no upstream is reached.
#[allow(dead_code)]
#[path = "support/pki.rs"]
mod pki_support;

const TOKEN: &str = "agent-token-0123456789";
const SECRET: &str = "Bearer upstream-secret-9f8e7d";

fn config() -> BrokerConfig {
    BrokerConfig {
        port: 1,
        auth_header: "X-Broker-Auth".into(),
        allowed_hosts: vec!["api.test".into()],
        allow_internal: true,
        token_env: "TT_BROKER_TOKEN".into(),
        ca_file: None,
        capabilities: vec![BrokerCapability {
            name: "api".into(),
            upstream: "api.test".into(),
            header: "Authorization".into(),
            value_env: "TT_API_VALUE".into(),
            methods: vec!["GET".into()],
            path_prefix: Some("/v1".into()),
        }],
    }
}

/// Sends `request` to the broker; the first line of its answer.
async fn status_line(broker: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(broker).await.unwrap();
    // A head past the bound may be cut off while it is written.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn requests_the_brokers_parser_refuses_are_recorded() {
    let pki = pki_support::pki(&["api.test"]);
    let config = config();
    let env = |name: &str| match name {
        "TT_BROKER_TOKEN" => Some(OsString::from(TOKEN)),
        "TT_API_VALUE" => Some(OsString::from(SECRET)),
        _ => None,
    };
    let secrets = Arc::new(BrokerSecrets::load(&config, env).unwrap());
    let tls = broker::client_tls(Some(pki.ca_file.path())).unwrap();
    let (events, mut effects) = tartaros::events::channel();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    // No upstream: nothing may be forwarded anyway.
    let resolver = StaticResolver::new();
    tokio::spawn(broker::serve(
        listener,
        Arc::new(config),
        secrets,
        tls,
        Arc::new(resolver),
        events,
    ));
    let head = format!("GET /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Broker-Auth: {TOKEN}\r\n");
    let bad = format!("{head}Bad Header: x\r\n\r\n");
    let huge = format!("{head}X: {}\r\n\r\n", "a".repeat(300_000));
    for (request, status, reason) in [
        (bad.as_bytes(), 400, "malformed request"),
        (huge.as_bytes(), 431, "request head too large"),
    ] {
        let line = status_line(addr, request).await;
        assert!(
            line.contains(&status.to_string()) || (status == 431 && line.is_empty()),
            "{line}"
        );
        let entry = tokio::time::timeout(Duration::from_secs(5), effects.recv())
            .await
            .unwrap_or_else(|_| panic!("no record of the refused request ({reason}) within 5 s"))
            .expect("effect channel open");
        let Entry::Record(effect) = entry else {
            panic!("expected one record, got {entry:?}");
        };
        let effect: Record = effect;
        assert_eq!((effect.kind, effect.decision), ("broker", Decision::Denied));
        let text = serde_json::to_string(&effect.to_fields()).unwrap();
        assert!(text.contains(reason), "{text}");
        assert!(text.contains(&format!("\"status\":{status}")), "{text}");
        assert!(
            !text.contains(TOKEN) && !text.contains("upstream-secret"),
            "{text}"
        );
    }
}
