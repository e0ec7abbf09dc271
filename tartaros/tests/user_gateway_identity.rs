//! Whose connection a gateway makes for a service run: the caller's. The
//! root worker relays `--port` (and the proxy's and broker's upstreams);
//! a socket it made as root belonged to uid 0 on the host, so a firewall
//! rule by owner (`-m owner ! --uid-owner 0 -j DROP` before a cloud
//! metadata address, a root-only local API) let the caller's agent
//! through where the caller itself is stopped. Seen from the host:
//! the owner of the connection's socket in /proc/net/tcp.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::net::TcpListener;

use common::*;
use harness::Service;

const FERN: u32 = 47_000 + 188;

/// The owner uid of the host's TCP socket bound to local port `local`
/// and connected to port `remote`, from /proc/net/tcp.
fn socket_owner(local: u16, remote: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
        (port(fields.get(1)?)? == local && port(fields.get(2)?)? == remote)
            .then(|| fields.get(7)?.parse().ok())
            .flatten()
    })
}

/// The next connection on `listener`, if one comes within `secs`: a run
/// that failed must fail the test, not hang it.
fn accept_within(
    listener: &TcpListener,
    secs: u64,
) -> Option<(std::net::TcpStream, std::net::SocketAddr)> {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if let Ok(accepted) = listener.accept() {
            return Some(accepted);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

#[test]
fn a_port_gateways_connection_belongs_to_the_caller_not_root() {
    if !can_run("gateway_owner_uid") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let service = Service::start();
    let work = owned_dir(FERN);
    let agent = format!(
        "import socket, time\ns = socket.create_connection(('127.0.0.1', {port}))\ns.recv(1)"
    );
    let port_arg = port.to_string();
    let mut run = service.spawn_quiet(
        FERN,
        &[
            "run",
            "--port",
            &port_arg,
            "--",
            "/usr/bin/python3",
            "-c",
            &agent,
        ],
        work.path(),
    );
    let (conn, peer) = accept_within(&listener, 20).expect("the relayed connection");
    let owner = socket_owner(peer.port(), port);
    // Let the agent end: it waits for one byte or the end.
    drop(conn);
    let _ = run.take().wait();
    assert_eq!(
        owner,
        Some(FERN),
        "the gateway's socket to the host belonged to uid {owner:?}, not the caller"
    );
}

/// The egress proxy's upstream connection, for a domain the caller's
/// policy allows, is the caller's too.
#[test]
fn the_proxys_upstream_connection_belongs_to_the_caller_not_root() {
    if !can_run("proxy_owner_uid") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let service = Service::start();
    let work = owned_dir(FERN + 1);
    let policy = work.join("policy.toml");
    std::fs::write(
        &policy,
        format!("[proxy]\nallow_internal = true\nhttp_ports = [{port}]\n"),
    )
    .unwrap();
    let agent = format!(
        "import os, socket, urllib.parse\n\
         p = urllib.parse.urlparse(os.environ.get('HTTP_PROXY') or os.environ['http_proxy'])\n\
         s = socket.create_connection((p.hostname, p.port))\n\
         s.sendall(b'GET http://localhost:{port}/ HTTP/1.1\\r\\nHost: localhost:{port}\\r\\n\\r\\n')\n\
         s.recv(1)"
    );
    let mut run = service.spawn_quiet(
        FERN + 1,
        &[
            "run",
            "--config",
            policy.to_str().unwrap(),
            "--allow-domain",
            "localhost",
            "--",
            "/usr/bin/python3",
            "-c",
            &agent,
        ],
        work.path(),
    );
    let (conn, peer) = accept_within(&listener, 20).expect("the proxied connection");
    let owner = socket_owner(peer.port(), port);
    drop(conn);
    let _ = run.take().wait();
    assert_eq!(
        owner,
        Some(FERN + 1),
        "the proxy's socket to the host belonged to uid {owner:?}, not the caller"
    );
}
