//! A second request on an intercepted plain-HTTP connection (adversarial
//! round 7). The transparent proxy decides a connection by the Host header
//! of its first request, then relays bytes: a second request on the same
//! kept-alive connection, naming a host that is not allowed, reached the
//! allowed host's server. Behind a shared front (a CDN, a virtual-hosting
//! server) that Host routes to the other site. The explicit proxy decides
//! every request; the upstream here must see only allowed Host headers.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tartaros::proxy::{self, OriginalDst, ProxyConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A keep-alive HTTP/1.1 server that records the Host header of every
/// request: the shared front of two sites.
async fn front() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hosts = Arc::new(Mutex::new(Vec::new()));
    let seen = hosts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let host = request
                        .headers()
                        .get("host")
                        .map(|h| h.to_str().unwrap_or("?").to_string())
                        .unwrap_or_default();
                    seen.lock().unwrap().push(host.clone());
                    async move {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "site {host}\n"
                        )))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, hosts)
}

async fn transparent(front: SocketAddr) -> SocketAddr {
    let resolver = StaticResolver::new()
        .with_ip("allowed.test", LOCALHOST)
        .with_ip("denied.test", LOCALHOST);
    let mut config = ProxyConfig::new(vec!["allowed.test".into()], Arc::new(resolver));
    config.allow_internal = true;
    config.http_ports = vec![front.port()];
    config.sniff_timeout = Duration::from_secs(2);
    let (events, effects) = tartaros::events::channel();
    // Records are not read here; keep the receiver alive with the proxy.
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let original_dst: OriginalDst = Arc::new(move |_: &TcpStream| Some(front));
    tokio::spawn(async move {
        let _effects = effects;
        proxy::serve_transparent(listener, Arc::new(config), events, original_dst).await
    });
    addr
}

async fn send(proxy: SocketAddr, text: &str) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends `requests(port)` on one intercepted connection: the allowed
/// host's request is answered, the denied host's refused with 403, and the
/// front sees only the allowed host.
async fn only_the_allowed_host_is_reached(requests: impl Fn(u16) -> String) {
    let (front, hosts) = front().await;
    let proxy = transparent(front).await;
    let answer = send(proxy, &requests(front.port())).await;
    assert!(answer.contains("site allowed.test"), "{answer}");
    assert!(
        answer.contains("HTTP/1.1 403") && answer.contains("domain not in the allow list"),
        "{answer}"
    );
    let seen = hosts.lock().unwrap().clone();
    assert!(
        seen.iter().all(|h| h.starts_with("allowed.test")),
        "the front saw {seen:?}; the agent got {answer}"
    );
}

#[tokio::test]
async fn a_second_request_to_another_host_on_an_intercepted_connection_is_not_forwarded() {
    only_the_allowed_host_is_reached(|port| {
        format!(
            "GET /one HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n\
             GET /two HTTP/1.1\r\nHost: denied.test:{port}\r\nConnection: close\r\n\r\n"
        )
    })
    .await;
}

#[tokio::test]
async fn a_later_request_in_a_kept_alive_connection_after_a_body_is_judged_too() {
    // The second request hides in what a byte-relay would take for the
    // first one's body, were it judged by a naive scan.
    only_the_allowed_host_is_reached(|port| {
        format!(
            "POST /one HTTP/1.1\r\nHost: allowed.test:{port}\r\nContent-Length: 5\r\n\r\nhello\
             GET /two HTTP/1.1\r\nHost: denied.test:{port}\r\n\r\n\
             GET /three HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"
        )
    })
    .await;
}
