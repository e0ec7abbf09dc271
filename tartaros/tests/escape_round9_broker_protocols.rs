//! Adversarial round 9: other protocols through the broker. An upgraded
//! connection (WebSocket, `h2c`) or a tunnel would carry bytes the body
//! scan never sees, and the credential the broker injected into the
//! upgrade request along with them. Each must end at the broker: the
//! upstream sees no `Upgrade` (it reports what it got in its body), the
//! agent never gets a 101, and a `CONNECT` or an HTTP/2 preface gets no
//! 200. All held when written.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/broker_echo.rs"]
mod broker_echo;
#[path = "support/pki.rs"]
mod pki_support;
use broker_echo::{Chunks, TOKEN, broker_with, call_with, header};

async fn broker() -> (pki_support::TestPki, std::net::SocketAddr) {
    // The upstream says which upgrade headers it got, and answers 101
    // when asked for an upgrade at all.
    broker_with(Arc::new(|request| {
        let got = format!(
            "upgrade=[{}] connection=[{}] http2-settings=[{}]",
            header(request, "upgrade"),
            header(request, "connection"),
            header(request, "http2-settings"),
        );
        let mut response = Response::builder();
        if request.headers().contains_key("upgrade") {
            response = response
                .status(101)
                .header("connection", "upgrade")
                .header("upgrade", header(request, "upgrade"));
        }
        response.body(Chunks::one(Bytes::from(got))).unwrap()
    }))
    .await
}

#[tokio::test]
async fn upgrades_do_not_pass_the_broker() {
    let (_pki, broker) = broker().await;
    for upgrade in [
        "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
    ] {
        let answer = call_with(broker, "/api/v1/ws", upgrade).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{upgrade}: {answer}");
        assert!(
            answer.contains("upgrade=[] connection=[] http2-settings=[]"),
            "the upstream was asked to upgrade: {answer}"
        );
    }
}

/// Raw bytes to the broker, and what it answers within 5 s.
async fn raw(broker: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(broker).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn tunnels_and_http2_get_no_success() {
    let (_pki, broker) = broker().await;
    let connect = format!(
        "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\nX-Broker-Auth: {TOKEN}\r\n\r\n"
    );
    let answer = raw(broker, connect.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "CONNECT: {answer}");
    let absolute = format!(
        "GET https://api.test/v1/x HTTP/1.1\r\nHost: api.test\r\nX-Broker-Auth: {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let answer = raw(broker, absolute.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "absolute form: {answer}"
    );
    // HTTP/2 with prior knowledge: the preface and an empty SETTINGS.
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let answer = raw(broker, &preface).await;
    assert!(
        !answer.contains(" 200 ") && !answer.contains("upgrade=["),
        "HTTP/2: {answer}"
    );
}
