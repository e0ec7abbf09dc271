//! Gateways for an ordinary user's run: the sandbox init (root only in its
//! own user namespace) makes the listeners inside the sandbox's network
//! namespace and hands them to the supervisor, which serves them from the
//! host. Checked from the host side: what reached the host's listeners.

mod common;
use std::sync::atomic::Ordering;

use common::*;

/// A uid with no passwd entry: nothing to create or remove on the host.
const TEST_UID: u32 = 47_000 + 124;

fn as_user(args: &[&str], cwd: &std::path::Path) -> std::process::Output {
    run_as(TEST_UID, args, cwd)
}

const HTTP_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nupstream-ok";

fn work_dir() -> Dir {
    let work = Dir::new();
    chown(work.path(), TEST_UID);
    work
}

#[test]
fn an_ordinary_users_port_grant_reaches_the_host_and_nothing_else_does() {
    if !can_run("rootless_port") {
        return;
    }
    let work = work_dir();
    let (granted, granted_hits) = host_listener(b"host-ok");
    let (other, other_hits) = host_listener(b"leak");
    let code = format!(
        "{ATTEMPT}
import socket
def talk(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    s.sendall(b'hi')
    data = s.recv(100)
    if data != b'host-ok':
        raise OSError(errno.EIO, repr(data))
attempt('granted', lambda: talk({granted}))
attempt('other', lambda: talk({other}))"
    );
    let out = as_user(
        &[
            "run",
            "--port",
            &granted.to_string(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    expect(&out, "granted", "OK");
    expect(&out, "other", "ECONNREFUSED");
    assert_eq!(granted_hits.load(Ordering::SeqCst), 1, "{}", stderr(&out));
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
}

const FETCH: &str = r#"
import urllib.request, urllib.error, sys, os, socket
os.environ["no_proxy"] = os.environ["NO_PROXY"] = ""
def fetch(label, url):
    try:
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        print(label, body)
    except urllib.error.HTTPError as e:
        print(label, e.code)
    except Exception as e:
        print(label, type(e).__name__)
    sys.stdout.flush()
def direct(label, port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5)
        print(label, "connected")
    except OSError as e:
        print(label, type(e).__name__)
    sys.stdout.flush()
"#;

#[test]
fn an_ordinary_users_allowed_domain_goes_through_the_proxy_and_others_fail_closed() {
    if !can_run("rootless_proxy") {
        return;
    }
    let work = work_dir();
    let (port, hits) = host_listener(HTTP_OK);
    let config = work.join("policy.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallow_internal = true\nhttp_ports = [{port}]\nconnect_ports = [{port}]\n"
        ),
    )
    .unwrap();
    let log = work.join("effects.jsonl");
    let code = format!(
        "{FETCH}
print('proxy-var', os.environ.get('HTTPS_PROXY'))
fetch('allowed', 'http://localhost:{port}/')
fetch('denied', 'http://not-allowed.invalid:{port}/')
direct('direct', {port})"
    );
    let out = as_user(
        &[
            "run",
            "--allow-domain",
            "localhost",
            "--config",
            config.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    expect(&out, "proxy-var", "http://127.0.0.1:3128");
    expect(&out, "allowed", "upstream-ok");
    expect(&out, "denied", "403");
    // A tool that ignores the proxy variables has no route out: the
    // upstream is on the host's loopback, not the sandbox's.
    expect(&out, "direct", "ConnectionRefusedError");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("transparent-interception not installed"),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().any(|l| l.contains("\"kind\":\"proxy\"")
            && l.contains("\"decision\":\"allowed\"")
            && l.contains("\"host\":\"localhost\"")),
        "{text}"
    );
    let genesis = text.lines().next().unwrap();
    assert!(genesis.contains("transparent-interception"), "{genesis}");
}

#[test]
fn a_strict_ordinary_user_run_with_a_domain_is_refused_not_half_open() {
    if !can_run("rootless_strict") {
        return;
    }
    let work = work_dir();
    let out = as_user(
        &[
            "run",
            "--strict",
            "--allow-domain",
            "example.org",
            "--",
            "true",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("tartaros: cannot install "),
        "{}",
        stderr(&out)
    );
}
