//! A broker in front of a careless TLS upstream that echoes what it is
//! sent, shared by the tests of credentials echoed back to the agent
//! (`escape_broker.rs`, `escape_round9_broker_encodings.rs`; included
//! with `#[path]` after `support/pki.rs`; not every file uses every
//! item).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::ffi::OsString;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tartaros::broker::{self, BrokerSecrets};
use tartaros::policy::{BrokerCapability, BrokerConfig};
use tartaros::proxy::StaticResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::pki_support::{TestPki, pki};

pub const TOKEN: &str = "agent-token-0123456789";
/// The scheme and the credential proper; the upstream quotes the latter.
pub const SECRET: &str = "Bearer ghp_Up5treamCred/9f8e+7d==";
pub const CREDENTIAL: &str = "ghp_Up5treamCred/9f8e+7d==";
/// A second capability's value, whose credential is a valid header name.
pub const NAMED: &str = "token ghp_HeaderNameCred0123";
/// A third capability's value: HTTP Basic, user `deploy-bot`.
pub const BASIC: &str = "Basic ZGVwbG95LWJvdDpzM2NyZXQtUGFzc3cwcmQtNzc=";
pub const BASIC_PASSWORD: &str = "s3cret-Passw0rd-77";

/// A response body sent as the given chunks, one frame each, so that a
/// credential can straddle two of them; with a pause before the second
/// (a streaming upstream that has not sent the rest yet).
pub struct Chunks {
    chunks: VecDeque<Bytes>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Chunks {
    pub fn one(bytes: impl Into<Bytes>) -> Self {
        Self::many([bytes.into()])
    }

    pub fn many(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self {
            chunks: chunks.into_iter().collect(),
            pause: None,
        }
    }

    /// `first`, then `rest` after `pause`.
    pub fn paused(first: Bytes, pause: Duration, rest: Bytes) -> Self {
        Self {
            chunks: VecDeque::from([first, rest]),
            pause: Some(Box::pin(tokio::time::sleep(pause))),
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(pause) = this.pause.as_mut().filter(|_| this.chunks.len() == 1) {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.pause = None;
        }
        Poll::Ready(this.chunks.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    /// One chunk has a known length (sent with `Content-Length`); more
    /// are sent chunked, so that they stay apart on the wire.
    fn size_hint(&self) -> SizeHint {
        match self.chunks.len() {
            0 | 1 => SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum()),
            _ => SizeHint::default(),
        }
    }
}

/// What the upstream answers to each request it gets.
pub type Answer = Arc<dyn Fn(&Request<hyper::body::Incoming>) -> Response<Chunks> + Send + Sync>;

/// A TLS upstream on 127.0.0.1 answering every request with `answer`.
pub async fn upstream(tls: Arc<rustls::ServerConfig>, answer: Answer) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
                    return;
                };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = answer(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A broker whose capabilities `api` (`SECRET`), `named` (`NAMED`) and
/// `basic` (`BASIC`) all reach `/v1` of `api.test`, served by an upstream
/// answering with `answer`.
pub async fn broker_with(answer: Answer) -> (TestPki, SocketAddr) {
    let pki = pki(&["api.test"]);
    let api = upstream(pki.server.clone(), answer).await;
    let capability = |name: &str, value_env: &str| BrokerCapability {
        name: name.into(),
        upstream: "api.test".into(),
        header: "Authorization".into(),
        value_env: value_env.into(),
        methods: vec![],
        path_prefix: Some("/v1".into()),
    };
    let config = BrokerConfig {
        port: 1,
        auth_header: "X-Broker-Auth".into(),
        allowed_hosts: vec!["api.test".into()],
        allow_internal: true,
        token_env: "TT_BROKER_TOKEN".into(),
        ca_file: None,
        capabilities: vec![
            capability("api", "TT_API_VALUE"),
            capability("named", "TT_NAMED_VALUE"),
            capability("basic", "TT_BASIC_VALUE"),
        ],
    };
    let env = |name: &str| match name {
        "TT_BROKER_TOKEN" => Some(OsString::from(TOKEN)),
        "TT_API_VALUE" => Some(OsString::from(SECRET)),
        "TT_NAMED_VALUE" => Some(OsString::from(NAMED)),
        "TT_BASIC_VALUE" => Some(OsString::from(BASIC)),
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

/// The broker's whole answer to `GET path` with the agent's token and the
/// extra header lines `headers` (each ending in CRLF).
pub async fn call_with(broker: SocketAddr, path: &str, headers: &str) -> String {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Broker-Auth: {TOKEN}\r\n{headers}\r\n"
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

/// The request header `name` as text, or "".
pub fn header(request: &Request<hyper::body::Incoming>, name: &str) -> String {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}
