//! An allowed name that resolves to one of the host's own addresses
//! (adversarial round 7). The proxy runs on the host, so such a name
//! reaches every host service bound to `0.0.0.0` or `::` on an allowed
//! port, as from loopback. The internal ranges did not cover it when the
//! host's address is public, or in a documentation range the rules leave
//! public on purpose (this host's eth0 is 192.0.2.2): a GET and a CONNECT
//! reached a service listening only on that address. Now an own address
//! is refused like an internal one, unless `allow_internal`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tartaros::events::Entry;
use tartaros::proxy::{self, ProxyConfig, StaticResolver, upstream_address_allowed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An address of one of this host's interfaces that the ranges call
/// public, if there is one.
fn own_public_address() -> Option<IpAddr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter_map(|a| a.address)
        .filter_map(|s| s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())))
        .find(|ip| upstream_address_allowed(*ip, false))
}

/// A service bound to `ip` alone (not loopback), counting its connections.
async fn service(ip: IpAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nhost")
                .await;
        }
    });
    (addr, count)
}

async fn exchange(proxy: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

async fn try_reach(ip: IpAddr, allow_internal: bool) -> (String, String, usize, Vec<String>) {
    let (service, count) = service(ip).await;
    let resolver = StaticResolver::new().with_ip("self.test", ip);
    let mut config = ProxyConfig::new(vec!["self.test".into()], Arc::new(resolver));
    config.allow_internal = allow_internal;
    config.http_ports = vec![service.port()];
    config.connect_ports = vec![service.port()];
    let (events, mut effects) = tartaros::events::channel();
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let proxy_addr = listener.local_addr().unwrap();
    let server = tokio::spawn(proxy::serve(listener, Arc::new(config), events));
    let port = service.port();
    let get = exchange(
        proxy_addr,
        &format!(
            "GET http://self.test:{port}/ HTTP/1.1\r\nHost: self.test:{port}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    let connect = exchange(
        proxy_addr,
        &format!("CONNECT self.test:{port} HTTP/1.1\r\nHost: self.test:{port}\r\n\r\n"),
    )
    .await;
    let mut reasons = Vec::new();
    while let Ok(Some(Entry::Record(r))) =
        tokio::time::timeout(Duration::from_millis(500), effects.recv()).await
    {
        reasons.push(format!("{} {:?}", r.decision.as_str(), r.target));
    }
    server.abort();
    (get, connect, count.load(Ordering::SeqCst), reasons)
}

#[tokio::test]
async fn an_allowed_name_resolving_to_the_hosts_own_address_does_not_reach_it() {
    let Some(ip) = own_public_address() else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "this host has no address the ranges call public"
        );
        eprintln!("skipping: no interface address the ranges call public");
        return;
    };
    let (get, connect, reached, records) = try_reach(ip, false).await;
    assert!(get.starts_with("HTTP/1.1 403"), "{get}");
    assert!(connect.starts_with("HTTP/1.1 403"), "{connect}");
    assert_eq!(
        reached, 0,
        "the host's own service was reached: {records:?}"
    );
    assert!(
        records.iter().all(|r| r.contains("internal")),
        "{records:?}"
    );
    // With internal addresses allowed, the same service is reached: the
    // refusal above is the proxy's, not a dead service.
    let (get, _, reached, _) = try_reach(ip, true).await;
    assert!(get.ends_with("host"), "{get}");
    assert!(reached >= 1);
}
