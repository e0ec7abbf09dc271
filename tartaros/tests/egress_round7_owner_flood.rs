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

/// The proxy's connection slots on 127.0.0.1: holding them keeps X in the
/// listen backlog while the flood runs.
const PROXY_SLOTS: &str = "256";
/// Well above the map's 4,096 entries.
const FLOOD: &str = "6000";

fn attack(mode: &str) {
    let (work, logs) = (Dir::new(), Dir::new());
    let script = work.join("flood.py");
    std::fs::write(&script, include_str!("support/owner_flood.py")).unwrap();
    let w = work.path().to_str().unwrap();
    let (out, records) = run_with_proxy(
        &work,
        &logs,
        &["--write", w],
        &[
            "python3",
            script.to_str().unwrap(),
            w,
            PROXY_SLOTS,
            mode,
            FLOOD,
        ],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains(&format!("flooded {FLOOD}")), "{text}");
    let x = pid_of_marker(&records, "/X_marker");
    let by_x: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "proxy" && r["target"]["method"] == "GET")
        .collect();
    assert_eq!(by_x.len(), 1, "{records:#?}");
    assert_eq!(by_x[0]["pid"].as_u64(), Some(x), "{}", by_x[0]);
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
