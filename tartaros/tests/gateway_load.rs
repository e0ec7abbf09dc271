//! The supervisor under a hostile agent's load (adversarial round 4). The
//! supervisor runs as root outside the run's cgroup, so whatever the agent
//! makes it hold is bounded by no limit of the run: every per-request state
//! it keeps must be bounded by itself. Measured from the host: the
//! supervisor's resident memory, read from /proc.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// Sends `sys.argv[1]` refused absolute-form requests with 240-byte host
/// names through the explicit proxy on one kept-alive connection
/// (pipelined, reading the 403s on a thread), after a warm-up of 1,000;
/// marks `.warm` and `.done`, then waits for `.stop`.
const FLOOD: &str = r#"
import socket, sys, threading, time, os
n, marker = int(sys.argv[1]), sys.argv[2]
host = "x" * 240 + ".evil"
req = ("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n" % (host, host)).encode()
def flood(count):
    s = socket.create_connection(("127.0.0.1", 3128))
    got = [0]
    def reader():
        while True:
            d = s.recv(1 << 20)
            if not d:
                break
            got[0] += d.count(b" 403 ")
    t = threading.Thread(target=reader)
    t.start()
    sent = 0
    while sent < count:
        k = min(200, count - sent)
        s.sendall(req * k)
        sent += k
        while got[0] < sent - 2000:
            time.sleep(0.001)
    s.shutdown(socket.SHUT_WR)
    t.join()
    s.close()
    return got[0]
flood(1000)
open(marker + ".warm", "w").close()
time.sleep(0.5)
print("refused", flood(n), flush=True)
open(marker + ".done", "w").close()
while not os.path.exists(marker + ".stop"):
    time.sleep(0.05)
"#;

/// Resident memory of the supervisor's processes: the launcher and its
/// children that are TartarOS's own (not the sandbox's init), in KiB. Which
/// of them serves the gateways depends on the launcher's stdio.
fn supervisor_rss_kib(launcher: u32) -> u64 {
    let children = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
        .unwrap_or_default();
    std::iter::once(launcher)
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "tartaros")
        })
        .map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

fn wait_for(path: &Path, secs: u64) {
    assert!(
        eventually(secs, || path.exists()),
        "{} never appeared",
        path.display()
    );
}

/// Without `--log` nothing read the gateways' record channel, which is
/// unbounded so a slow disk never blocks the proxy: every proxy, broker and
/// relay record of the run stayed in root's memory until the run ended
/// (about 1.3 KiB a refused request; 100,000 requests grew the supervisor
/// by 130 MiB, and an agent can send 12,000 a second for as long as it
/// runs).
#[test]
fn a_flood_of_refused_proxy_requests_does_not_grow_the_supervisor() {
    if !can_run("gateway_load") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let marker = work.join("m");
    let requests = "100000";
    let mut launcher = spawn_quiet(
        &[
            "run",
            "-q",
            "--allow-domain",
            "example.com",
            "--write",
            w,
            "--",
            "python3",
            "-c",
            FLOOD,
            requests,
            marker.to_str().unwrap(),
        ],
        work.path(),
    );
    let supervisor = launcher.id();
    wait_for(&marker.with_extension("warm"), 60);
    let before = supervisor_rss_kib(supervisor);
    wait_for(&marker.with_extension("done"), 180);
    let after = supervisor_rss_kib(supervisor);
    std::fs::write(marker.with_extension("stop"), "").unwrap();
    let mut child = launcher.take();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the run did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let grown = after.saturating_sub(before);
    eprintln!("supervisor {supervisor}: {before} -> {after} KiB");
    assert!(
        grown < 32 * 1024,
        "the supervisor grew by {grown} KiB ({before} -> {after}) over {requests} refused requests"
    );
}
