//! Who opened a gateway connection, when another process shares its local
//! port (adversarial round 6). Two sockets may be bound to the same local
//! port (`SO_REUSEADDR`) as long as their connections differ: X connects
//! to the proxy from port P and waits in the listen backlog; Y binds P too
//! and connects elsewhere (its own server, or the proxy from 127.0.0.2).
//! The `proxy` record of X's request must name X, the pid that created
//! X's marker file, not Y.

mod common;

use common::proxied::*;
use common::*;

/// The proxy's connection slots on 127.0.0.1 (`ProxyConfig::max_connections`):
/// holding them all keeps X's connection in the listen backlog, unaccepted,
/// while Y connects.
const PROXY_SLOTS: &str = "256";

fn attack(mode: &str) {
    let (work, logs) = (Dir::new(), Dir::new());
    let script = work.join("reuse.py");
    std::fs::write(&script, include_str!("support/owner_port_reuse.py")).unwrap();
    let w = work.path().to_str().unwrap();
    let (out, records) = run_with_proxy(
        &work,
        &logs,
        &["--write", w],
        &["python3", script.to_str().unwrap(), w, PROXY_SLOTS, mode],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("Y connected"), "{text}");
    let (x, y) = (
        pid_of_marker(&records, "/X_marker"),
        pid_of_marker(&records, "/Y_marker"),
    );
    assert_ne!(x, y);
    let by_x: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "proxy" && r["target"]["method"] == "GET")
        .collect();
    assert_eq!(by_x.len(), 1, "{records:#?}");
    assert_eq!(by_x[0]["pid"].as_u64(), Some(x), "{}", by_x[0]);
}

#[test]
fn a_process_sharing_the_local_port_with_its_own_server_is_not_named_for_a_proxy_request() {
    if !can_run("owner_reuse_server") {
        return;
    }
    attack("server");
}

#[test]
fn a_process_sharing_the_local_port_from_another_address_is_not_named_for_a_proxy_request() {
    if !can_run("owner_reuse_address") {
        return;
    }
    attack("address");
}
