//! Request targets the intercepted plain-HTTP path rebuilt by text
//! (adversarial round 13). `OPTIONS *` on an allowed port was refused as
//! `port not allowed` after the sniff timeout, and its record named port
//! 80: the asterisk was pasted after the authority (`http://host:port*`).
//! A refused first request's record had no `status`, though the agent got
//! a 403. Records here are the proxy's own, read from its channel.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tartaros::effectlog::Record;
use tartaros::events::{EffectReceiver, Entry};
use tartaros::proxy::{self, OriginalDst, ProxyConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A server that counts the connections it accepts and answers nothing.
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (addr, count)
}

async fn transparent(upstream: SocketAddr) -> (SocketAddr, EffectReceiver) {
    let resolver = StaticResolver::new().with_ip("allowed.test", LOCALHOST);
    let mut config = ProxyConfig::new(vec!["allowed.test".into()], Arc::new(resolver));
    config.allow_internal = true;
    config.http_ports = vec![upstream.port()];
    config.sniff_timeout = Duration::from_secs(2);
    let (events, effects) = tartaros::events::channel();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let original_dst: OriginalDst = Arc::new(move |_: &TcpStream| Some(upstream));
    tokio::spawn(proxy::serve_transparent(
        listener,
        Arc::new(config),
        events,
        original_dst,
    ));
    (addr, effects)
}

/// The answer to `text` sent on one intercepted connection, and how long
/// it took.
async fn send(proxy: SocketAddr, text: &str) -> (String, Duration) {
    let start = Instant::now();
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    (
        String::from_utf8_lossy(&answer).into_owned(),
        start.elapsed(),
    )
}

async fn records(effects: &mut EffectReceiver) -> Vec<Record> {
    let mut out = Vec::new();
    while let Ok(Some(entry)) = tokio::time::timeout(Duration::from_secs(1), effects.recv()).await {
        match entry {
            Entry::Record(r) => out.push(r),
            Entry::Records(rs) => out.extend(rs),
            Entry::Gap(_) => {}
        }
    }
    out
}

fn field(record: &Record, key: &str) -> String {
    record
        .target
        .get(key)
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
        .unwrap_or_default()
}

#[tokio::test]
async fn options_asterisk_is_refused_at_once_and_recorded_with_its_real_port() {
    let (up, reached) = upstream().await;
    let (proxy, mut effects) = transparent(up).await;
    let port = up.port();
    let (answer, took) = send(
        proxy,
        &format!("OPTIONS * HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let got = records(&mut effects).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("asterisk"),
        "the refusal should say why: {answer}"
    );
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the upstream was reached"
    );
    assert_eq!(got.len(), 1, "{got:?}");
    let record = &got[0];
    assert_eq!(record.decision.as_str(), "denied", "{record:?}");
    assert_eq!(field(record, "port"), port.to_string(), "{record:?}");
    assert!(field(record, "reason").contains("asterisk"), "{record:?}");
    assert_eq!(field(record, "status"), "403", "{record:?}");
}

#[tokio::test]
async fn a_refused_first_request_is_recorded_with_the_status_the_agent_got() {
    let (up, reached) = upstream().await;
    let (proxy, mut effects) = transparent(up).await;
    let port = up.port();
    let (answer, _) = send(
        proxy,
        &format!("GET / HTTP/1.1\r\nHost: denied.test:{port}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let got = records(&mut effects).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert_eq!(reached.load(Ordering::SeqCst), 0);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].decision.as_str(), "denied");
    assert_eq!(field(&got[0], "status"), "403", "{:?}", got[0]);
}
