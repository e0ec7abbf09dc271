//! `--port N`: a gateway from the sandbox's 127.0.0.1:N to the host's
//! 127.0.0.1:N, and nothing else.

mod common;
use std::io::Write;
use std::net::TcpListener;

use common::*;

#[test]
fn a_granted_port_reaches_the_host_and_another_does_not() {
    if !can_run("ports") {
        return;
    }
    let work = Dir::new();
    let granted = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let (gp, op) = (
        granted.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let server = std::thread::spawn(move || {
        let (mut conn, _) = granted.accept().unwrap();
        conn.write_all(b"hello from the host").unwrap();
    });
    let log = work.join("effects.jsonl");
    let code = format!(
        "{ATTEMPT}
import socket
def fetch(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    data = s.recv(100)
    if data != b'hello from the host':
        raise OSError(errno.EIO, repr(data))
attempt('granted', lambda: fetch({gp}))
attempt('other', lambda: fetch({op}))"
    );
    let gp_s = gp.to_string();
    let out = python(
        &["--strict", "--port", &gp_s, "--log", log.to_str().unwrap()],
        work.path(),
        &code,
    );
    expect(&out, "granted", "OK");
    expect(&out, "other", "ECONNREFUSED");
    server.join().unwrap();
    assert!(other.accept().is_err(), "the non-granted port was reached");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("\"kind\":\"connect\"") && l.contains(&format!("127.0.0.1:{gp}"))),
        "no connect record: {text}"
    );
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
