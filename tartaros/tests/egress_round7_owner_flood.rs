//! Who opened a gateway connection, after a flood of other connects
//! (adversarial round 7). The owner of every TCP connect the eBPF programs
//! let through was kept in an LRU of 4,096 entries, also for connects to
//! the agent's own servers, and for connects to a gateway that the gateway
//! never accepted: 6,000 of them while X's proxy connection waited in the
//! backlog evicted X's entry, and X's request was logged `pid_unknown`.
//! Now only connections to the gateways' ports get an entry, the gateway
//! removes it on accept and the client socket's close removes one never
//! accepted, so X's `proxy` record names X.

mod common;

use common::proxied::*;
use common::*;

/// Well above the map's 4,096 entries.
const FLOOD: &str = "6000";

fn attack(mode: &str) {
    let records = run_owner_script(
        "flood.py",
        include_str!("support/owner_flood.py"),
        &[mode, FLOOD],
        &format!("flooded {FLOOD}"),
    );
    assert_one_get_by(&records, pid_of_marker(&records, "/X_marker"));
}

#[test]
fn a_flood_of_connects_to_the_agents_own_server_does_not_unname_a_waiting_proxy_connection() {
    if !can_run("owner_flood_local") {
        return;
    }
    attack("local");
}

#[test]
fn a_flood_of_abandoned_connects_to_a_full_gateway_does_not_unname_a_waiting_one() {
    if !can_run("owner_flood_abandoned") {
        return;
    }
    attack("abandoned");
}
