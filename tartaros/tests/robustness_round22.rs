//! Adversarial round 22: starts that failed for no good reason — many
//! `--port` grants, a writable root that is a file, a launcher near its
//! process limit.

mod common;
use common::*;

/// 64 `--port` grants (128 listeners) start, and the last one reaches its
/// host port: the listeners no longer travel in a single SCM_RIGHTS message
/// (33 ports failed with ENOBUFS). Loopback only.
#[test]
fn sixty_four_ports_start_and_the_last_one_works() {
    if !can_run("sixty_four_ports_start_and_the_last_one_works") {
        return;
    }
    let work = Dir::new();
    // Held open so no other process takes them while the run lasts; only
    // the last is ever connected to.
    let held: Vec<std::net::TcpListener> = (0..63)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let (last, hits) = host_listener(b"hello from port 64");
    let mut ports: Vec<String> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port().to_string())
        .collect();
    ports.push(last.to_string());
    let mut flags: Vec<&str> = Vec::new();
    for port in &ports {
        flags.extend_from_slice(&["--port", port]);
    }
    let code = format!(
        "{ATTEMPT}
import socket
def fetch():
    s = socket.create_connection(('127.0.0.1', {last}), timeout=5)
    s.sendall(b'hi')
    if s.recv(100) != b'hello from port 64':
        raise OSError(errno.EIO, 'wrong answer')
attempt('last', fetch)"
    );
    let out = python(&flags, work.path(), &code);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "last", "OK");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}
