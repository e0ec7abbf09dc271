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

/// The proxy's connection slots on 127.0.0.1 (`ProxyConfig::max_connections`):
/// a script that holds them all keeps its next connection in the listen
/// backlog, unaccepted.
pub const PROXY_SLOTS: &str = "256";

/// What [`run_script_with_proxy`] leaves: the agent's output, the log's
/// records, and the directories (the log is `logs/effects.jsonl`).
pub struct ScriptRun {
    pub text: String,
    pub records: Vec<Value>,
    pub work: Dir,
    pub logs: Dir,
}

/// Writes `files` (name, text) into a new work directory and runs the
/// first under the proxy: `python3 WORK/FIRST WORK args...`, with `--write
/// WORK`. Asserts that it succeeded.
#[track_caller]
pub fn run_script_with_proxy(files: &[(&str, &str)], args: &[&str]) -> ScriptRun {
    let (work, logs) = (Dir::new(), Dir::new());
    for (name, text) in files {
        std::fs::write(work.join(name), text).unwrap();
    }
    let script = work.join(files[0].0);
    let w = work.path().to_str().unwrap();
    let mut argv = vec!["python3", script.to_str().unwrap(), w];
    argv.extend_from_slice(args);
    let (out, records) = run_with_proxy(&work, &logs, &["--write", w], &argv);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    ScriptRun {
        text,
        records,
        work,
        logs,
    }
}

/// Runs a gateway-owner script (`support/NAME`, given as its text) with
/// `support/backlogged_x.py` beside it, under the proxy: `python3 SCRIPT
/// WORK PROXY_SLOTS args...`. Asserts that it succeeded and that its
/// output holds `expect`; returns the log's records.
#[track_caller]
pub fn run_owner_script(name: &str, source: &str, args: &[&str], expect: &str) -> Vec<Value> {
    let backlogged = include_str!("../support/backlogged_x.py");
    let mut all = vec![PROXY_SLOTS];
    all.extend_from_slice(args);
    let run = run_script_with_proxy(&[(name, source), ("backlogged_x.py", backlogged)], &all);
    assert!(run.text.contains(expect), "{}", run.text);
    run.records
}

/// The log holds one proxied GET, and its record names `pid`.
#[track_caller]
pub fn assert_one_get_by(records: &[Value], pid: u64) {
    let gets: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "proxy" && r["target"]["method"] == "GET")
        .collect();
    assert_eq!(gets.len(), 1, "{records:#?}");
    assert_eq!(gets[0]["pid"].as_u64(), Some(pid), "{}", gets[0]);
}
