//! Adversarial round 10 (egress): requests the proxy's HTTP parser
//! refuses before any decision (a header name with a space, a head past
//! the 64 KiB bound, two different `Content-Length`s), on the explicit
//! proxy and on an intercepted connection whose first head the sniffer
//! passed. The agent gets a
//! 400 or 431 and nothing is reached, but the refusal must still be a
//! `proxy` record naming the agent's pid: every refusal is in the log.
//! Needs root and python3.

mod common;

use common::proxied::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
import os, socket, sys
open(os.path.join(sys.argv[1], 'malformed_marker'), 'w').close()
def raw(label, addr, data):
    s = socket.create_connection(addr, timeout=10)
    try:
        s.sendall(data)
        print(label, s.recv(64).split(b'\r\n')[0].decode())
    except OSError as e:
        print(label, 'error', e.errno)
    s.close()
target = b'http://evil.invalid:18080/'
host = b'Host: evil.invalid:18080\r\n'
raw('explicit', ('127.0.0.1', 3128), b'GET ' + target + b' HTTP/1.1\r\n' + host + b'Bad Header: x\r\n\r\n')
raw('huge', ('127.0.0.1', 3128), b'GET ' + target + b' HTTP/1.1\r\n' + host + b'X: ' + b'a' * 300000 + b'\r\n\r\n')
# The sniffer decides the first head (an allowed name), then the parser
# of every request refuses two different lengths.
raw('transparent', ('192.0.2.81', 18080), b'GET / HTTP/1.1\r\nHost: localhost:18080\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx')
"#;

#[test]
fn requests_the_parser_refuses_are_recorded_with_the_agents_pid() {
    if !can_run("net_round10_malformed") {
        return;
    }
    let run = run_script_with_proxy(&[("malformed.py", AGENT)], &[]);
    let (text, records) = (&run.text, &run.records);
    eprintln!("{text}");
    // A head past the bound may be cut off before its answer is read.
    for (label, status) in [
        ("explicit", "HTTP/1.1 400"),
        ("huge", "HTTP/1.1 431"),
        ("transparent", "HTTP/1.1 400"),
    ] {
        assert!(
            text.contains(&format!("{label} {status}"))
                || (label == "huge" && text.contains("huge error")),
            "{label}: {text}"
        );
    }
    let agent = pid_of_marker(records, "/malformed_marker");
    let proxy: Vec<&Value> = records.iter().filter(|r| r["kind"] == "proxy").collect();
    let explicit = proxy
        .iter()
        .filter(|r| r["target"]["mode"] == "explicit")
        .count();
    assert_eq!(explicit, 2, "one record per refused request: {proxy:#?}");
    let transparent = proxy
        .iter()
        .filter(|r| r["target"]["original_dst"] == "192.0.2.81:18080")
        .count();
    assert_eq!(transparent, 1, "{proxy:#?}");
    for r in &proxy {
        assert_eq!(r["decision"], "denied", "{r}");
        assert_eq!(r["pid"].as_u64(), Some(agent), "{r}");
    }
}
