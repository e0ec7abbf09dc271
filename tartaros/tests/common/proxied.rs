//! Helpers of the tests that run an agent behind the egress proxy with a
//! loopback upstream, under `--log`, and ask the log who did what.

use serde_json::Value;

use super::*;

/// The proxy policy of these tests: loopback upstreams on port 18080.
pub const POLICY: &str =
    "[proxy]\nallow_internal = true\nhttp_ports = [18080]\nconnect_ports = [18080]\n";

/// `tartaros run -q --strict --allow-domain localhost` with [`POLICY`],
/// `--log` into `logs`, extra flags, then `argv`, in `work`; the output
/// and the log's records (none if no log was written).
pub fn run_with_proxy(
    work: &Dir,
    logs: &Dir,
    flags: &[&str],
    argv: &[&str],
) -> (std::process::Output, Vec<Value>) {
    let policy = logs.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = logs.join("effects.jsonl");
    let mut args = vec![
        "run",
        "-q",
        "--strict",
        "--allow-domain",
        "localhost",
        "--config",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(argv);
    let out = tartaros(&args, work.path());
    let records = if log.exists() {
        records(&log)
    } else {
        Vec::new()
    };
    (out, records)
}

/// The pid of the record whose path ends with `name` (a marker file a
/// process of the agent created), from the host's log.
#[track_caller]
pub fn pid_of_marker(records: &[Value], name: &str) -> u64 {
    records
        .iter()
        .find(|r| {
            r["target"]["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(name))
        })
        .unwrap_or_else(|| panic!("no record of {name}: {records:#?}"))["pid"]
        .as_u64()
        .unwrap()
}
