//! One user's flood must not take the room another user's gateway
//! connections need in the service's shared eBPF maps (adversarial round
//! 22b). Runs through the service share one object and its maps by
//! connection; as LRU maps of 4,096 entries, an agent that kept ~8,000
//! intercepted connects in flight (waiting in its own proxy's backlog,
//! replaced all the time) evicted the entries of another user's
//! connections waiting in that user's backlog: its transparent proxy
//! refused them ("original destination unknown"), its explicit proxy's
//! records lost their pid. Now the maps are plain hashes and a user holds
//! at most its quota of live gateway connections in them.

mod common;
#[path = "support/service.rs"]
mod harness;

use common::*;
use harness::Service;

const VICTIM: u32 = 47_000 + 222;
const FLOODER: u32 = 47_000 + 223;
/// Connects the flooder keeps in flight: well above the old maps' 4,096.
const FLOOD: &str = "6000";
/// Each kind of GET the victim makes (explicit and intercepted).
const GETS: usize = 15;

#[test]
fn another_users_flood_leaves_the_victims_gateway_connections_their_destination_and_owner() {
    if !can_run("service_round22b_shared_maps") {
        return;
    }
    let (port, hits) = host_listener(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let service = Service::start();
    let policy = format!("[proxy]\nallow_internal = true\nhttp_ports = [{port}]\n");

    // The flooder: its own run, intercepting (an allowed domain), for
    // long enough to outlast the victim's run.
    let flood_work = owned_dir(FLOODER);
    std::fs::write(
        flood_work.join("flood.py"),
        include_str!("support/r22b_flood.py"),
    )
    .unwrap();
    std::fs::write(flood_work.join("policy.toml"), &policy).unwrap();
    let fw = flood_work.path().to_str().unwrap();
    let flood_script = flood_work.join("flood.py");
    let flood_policy = flood_work.join("policy.toml");
    let mut flooder = service.spawn_quiet(
        FLOODER,
        &[
            "run",
            "-q",
            "--allow-domain",
            "localhost",
            "--config",
            flood_policy.to_str().unwrap(),
            "--write",
            fw,
            "--",
            "python3",
            flood_script.to_str().unwrap(),
            fw,
            FLOOD,
            "16",
        ],
        flood_work.path(),
    );
    assert!(
        eventually(12, || flood_work.join("ready").exists()),
        "the flooder never had {FLOOD} connects in flight: {}",
        service.errors()
    );

    // The victim: its GETs wait in its own proxy's backlogs during the
    // flood, then go through.
    let work = owned_dir(VICTIM);
    std::fs::write(
        work.join("victim.py"),
        include_str!("support/r22b_victim.py"),
    )
    .unwrap();
    std::fs::write(work.join("policy.toml"), &policy).unwrap();
    let log = work.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let victim_script = work.join("victim.py");
    let victim_policy = work.join("policy.toml");
    let port_arg = port.to_string();
    let gets = GETS.to_string();
    let out = service.run(
        VICTIM,
        &[
            "run",
            "-q",
            "--allow-domain",
            "localhost",
            "--config",
            victim_policy.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--write",
            w,
            "--",
            "python3",
            victim_script.to_str().unwrap(),
            &port_arg,
            &gets,
            "4",
            "256",
        ],
        work.path(),
    );
    let mut flooder = flooder.take();
    let flooding = flooder.try_wait().ok().flatten().is_none();
    let _ = flooder.kill();
    let _ = flooder.wait();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(flooding, "the flood ended before the victim did");

    let want = format!("victim ok={} of {}", 2 * GETS, 2 * GETS);
    assert!(text.contains(&want), "{text}");
    assert!(hits.load(std::sync::atomic::Ordering::SeqCst) >= 2 * GETS);
    let records = records(&log);
    // The explicit proxy's GETs, and the intercepted ones (method `HTTP`,
    // the transparent shape), each named.
    for method in ["GET", "HTTP"] {
        let gets: Vec<_> = records
            .iter()
            .filter(|r| {
                r["kind"] == "proxy"
                    && r["target"]["method"] == method
                    && r["decision"] == "allowed"
            })
            .collect();
        assert_eq!(gets.len(), GETS, "{method}: {records:#?}");
        for get in gets {
            assert!(
                get["pid"].as_u64().is_some_and(|p| p > 0)
                    && get["target"]["pid_unknown"].is_null(),
                "a GET lost its owner: {get}"
            );
        }
    }
}
