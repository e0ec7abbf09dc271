//! Egress through `tartaros run`: the proxy inside the sandbox's network
//! namespace against a local upstream on the host's loopback, and the
//! broker's secrets kept out of the agent's sight.

mod common;
use std::process::Command;

use common::*;

/// A tiny HTTP upstream on 127.0.0.1 that answers every request with
/// `upstream-ok`, counting requests.
fn upstream() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    host_listener(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nupstream-ok")
}

fn proxy_config(work: &Dir, port: u16, allow_internal: bool) -> String {
    let path = work.join("policy.toml");
    std::fs::write(
        &path,
        format!("[proxy]\nallow_internal = {allow_internal}\nhttp_ports = [{port}]\nconnect_ports = [{port}]\n"),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

const FETCH: &str = r#"
import urllib.request, urllib.error, sys, os
# The upstream stands on the host's loopback, named "localhost", which the
# sandbox sends direct by default (NO_PROXY): route it through the proxy.
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
"#;

#[test]
fn allowed_domains_pass_the_proxy_and_everything_else_is_refused_and_logged() {
    if !can_run("egress_proxy") {
        return;
    }
    let work = Dir::new();
    let (port, hits) = upstream();
    let config = proxy_config(&work, port, true);
    let log = work.join("effects.jsonl");
    let code = format!(
        "{FETCH}
fetch('allowed', 'http://localhost:{port}/')
fetch('denied', 'http://not-allowed.invalid:{port}/')
fetch('ip-literal', 'http://127.0.0.1:{port}/')"
    );
    let out = Command::new(bin())
        .args([
            "run",
            "--strict",
            "--allow-domain",
            "localhost",
            "--config",
            &config,
            "--log",
        ])
        .arg(&log)
        .args(["--", "python3", "-c", &code])
        .current_dir(work.path())
        .output()
        .unwrap();
    expect(&out, "allowed", "upstream-ok");
    expect(&out, "denied", "403");
    expect(&out, "ip-literal", "403");
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the allowed request reached the upstream"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let proxy: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"kind\":\"proxy\""))
        .collect();
    assert!(proxy.iter().any(|l| l.contains("\"decision\":\"allowed\"") && l.contains("\"host\":\"localhost\"")), "{text}");
    assert!(
        proxy
            .iter()
            .any(|l| l.contains("\"decision\":\"denied\"") && l.contains("not-allowed.invalid")),
        "{text}"
    );
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}

#[test]
fn a_name_that_resolves_to_an_internal_address_is_refused_by_default() {
    if !can_run("egress_internal") {
        return;
    }
    let work = Dir::new();
    let (port, hits) = upstream();
    let config = proxy_config(&work, port, false);
    let code = format!("{FETCH}\nfetch('rebound', 'http://localhost:{port}/')");
    let out = Command::new(bin())
        .args([
            "run",
            "--strict",
            "--allow-domain",
            "localhost",
            "--config",
            &config,
            "--",
            "python3",
            "-c",
            &code,
        ])
        .current_dir(work.path())
        .output()
        .unwrap();
    expect(&out, "rebound", "403");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn broker_secrets_never_reach_the_agent() {
    if !can_run("broker_secrets") {
        return;
    }
    let work = Dir::new();
    let config = work.join("broker.toml");
    std::fs::write(
        &config,
        "[broker]\nport = 9911\ntoken_env = \"TT_BROKER_TOKEN\"\nallowed_hosts = [\"api.example.com\"]\n\
         [[broker.capability]]\nname = \"api\"\nupstream = \"api.example.com\"\nheader = \"Authorization\"\nvalue_env = \"TT_API_SECRET\"\n",
    )
    .unwrap();
    let log = work.join("effects.jsonl");
    // The needles are built at run time: the command line itself is read.
    let code = "import os, glob\nseen = ''\nfor p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n    try: seen += open(p, 'rb').read().decode(errors='replace')\n    except OSError: pass\nseen += repr(dict(os.environ))\nprint('token-visible', 'tok-' + '123456' in seen)\nprint('secret-visible', 'sec-' + 'abcdef' in seen)";
    let out = Command::new(bin())
        .args(["run", "--strict", "--inherit-env", "--config"])
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--", "python3", "-c", code])
        .current_dir(work.path())
        .env("TT_BROKER_TOKEN", "tok-123456")
        .env("TT_API_SECRET", "sec-abcdef")
        .output()
        .unwrap();
    expect(&out, "token-visible", "False");
    expect(&out, "secret-visible", "False");
    let all = format!(
        "{}{}{}",
        stdout(&out),
        stderr(&out),
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(
        !all.contains("tok-123456") && !all.contains("sec-abcdef"),
        "a secret leaked"
    );
}

#[test]
fn tools_that_ignore_the_proxy_are_intercepted_and_filtered_the_same_way() {
    if !can_run("egress_transparent") {
        return;
    }
    let work = Dir::new();
    let (port, hits) = upstream();
    let config = proxy_config(&work, port, true);
    // A raw socket to a documentation address, no proxy variables used: the
    // eBPF connect program sends it to the transparent listener, which goes
    // by the Host header. No packet leaves the sandbox's namespace.
    let code = format!(
        "import socket, sys
def raw(label, host):
    try:
        s = socket.create_connection(('192.0.2.10', {port}), timeout=10)
        s.sendall(('GET / HTTP/1.1\\r\\nHost: %s:{port}\\r\\nConnection: close\\r\\n\\r\\n' % host).encode())
        reply = s.recv(4096).decode(errors='replace')
        print(label, 'upstream-ok' if 'upstream-ok' in reply else reply.split(' ')[1])
    except OSError as e:
        print(label, type(e).__name__)
    sys.stdout.flush()
raw('allowed', 'localhost')
raw('denied', 'evil.example')"
    );
    let out = Command::new(bin())
        .args([
            "run",
            "--strict",
            "--allow-domain",
            "localhost",
            "--config",
            &config,
            "--",
            "python3",
            "-c",
            &code,
        ])
        .current_dir(work.path())
        .output()
        .unwrap();
    expect(&out, "allowed", "upstream-ok");
    expect(&out, "denied", "403");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}
