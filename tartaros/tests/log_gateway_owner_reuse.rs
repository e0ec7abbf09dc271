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

fn attack(mode: &str) {
    let records = run_owner_script(
        "reuse.py",
        include_str!("support/owner_port_reuse.py"),
        &[mode],
        "Y connected",
    );
    let (x, y) = (
        pid_of_marker(&records, "/X_marker"),
        pid_of_marker(&records, "/Y_marker"),
    );
    assert_ne!(x, y);
    assert_one_get_by(&records, x);
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
