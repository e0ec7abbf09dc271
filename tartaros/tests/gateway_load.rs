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

/// Opens 256 connections to the proxy on each of 127.0.0.1 and [::1] and
/// sends each a request head of 300 KB that never ends; marks `.done` and
/// holds them until `.stop`.
const HEADS: &str = r#"
import socket, sys, time, os
marker = sys.argv[1]
socks = []
line = b"X-Fill: " + b"a" * 8000 + b"\r\n"
for fam, addr in ((socket.AF_INET, ("127.0.0.1", 3128)), (socket.AF_INET6, ("::1", 3128))):
    for i in range(256):
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.connect(addr)
            s.sendall(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n")
            s.setblocking(False)
            socks.append(s)
        except OSError:
            break
for r in range(37):
    for s in socks:
        try:
            s.send(line)
        except OSError:
            pass
time.sleep(1)
open(marker + ".done", "w").close()
while not os.path.exists(marker + ".stop"):
    time.sleep(0.05)
"#;

/// Holds 256 connections on each of the proxy's and the transparent
/// listener's IPv4 and IPv6 addresses (from four processes, so the agent's
/// own descriptor limit is not what stops it), then writes 50 files in
/// `sys.argv[1]` while they are held, and lets them go only after the
/// supervisor has had time to read the files' notifications.
const HOLD: &str = r#"
import socket, sys, time, os
w = sys.argv[1]
release = os.path.join(w, ".release")
def hold(addr, fam):
    if os.fork() == 0:
        socks = []
        for i in range(256):
            try:
                s = socket.socket(fam, socket.SOCK_STREAM)
                s.settimeout(2)
                s.connect(addr)
                socks.append(s)
            except OSError:
                break
        while not os.path.exists(release):
            time.sleep(0.05)
        os._exit(0)
hold(("127.0.0.1", 3128), socket.AF_INET)
hold(("192.0.2.1", 443), socket.AF_INET)
hold(("::1", 3128), socket.AF_INET6)
hold(("2001:db8::1", 443, 0, 0), socket.AF_INET6)
time.sleep(2)
for i in range(50):
    with open(os.path.join(w, "f%d" % i), "w") as f:
        f.write("changed")
time.sleep(1.5)
open(release, "w").close()
for _ in range(4):
    os.wait()
"#;

/// Each gateway connection holds up to six of the supervisor's descriptors
/// (the agent's socket, the upstream's, two pipes), and every listener
/// served up to 256 of them, whatever the supervisor's descriptor limit.
/// An agent holding idle connections on the gateways used up a supervisor
/// limited to 512 descriptors, and the files it then changed were in no
/// `write` record and not in the seal, while `verify` said plain ok: the
/// kernel's notifications name a directory by a handle that takes a
/// descriptor to open. The gateways now share a budget that leaves the
/// supervisor a reserve.
#[test]
fn held_gateway_connections_leave_the_supervisor_descriptors_for_the_log() {
    if !can_run("gateway_load") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let (work, logs) = (Dir::new(), Dir::new());
    let w = work.path().to_str().unwrap();
    let log = logs.join("effects.jsonl");
    let mut command = std::process::Command::new(bin());
    command
        .args([
            "run",
            "-q",
            "--allow-domain",
            "example.com",
            "--write",
            w,
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            HOLD,
            w,
        ])
        .current_dir(work.path());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 512,
                rlim_max: 512,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().expect("run tartaros");
    assert!(out.status.success(), "{}", stderr(&out));
    let records = records(&log);
    let written = |name: &str| {
        let path = work.join(name);
        let path = path.to_str().unwrap();
        records
            .iter()
            .any(|r| r["kind"] == "write" && r["target"]["path"] == path)
    };
    let missing: Vec<String> = (0..50)
        .map(|i| format!("f{i}"))
        .filter(|name| !written(name))
        .collect();
    assert!(
        missing.is_empty(),
        "no write record of {} of 50 files: {missing:?}",
        missing.len()
    );
    let seal = records.last().expect("a sealed log");
    let sealed = seal["target"]["files"]
        .as_array()
        .or_else(|| seal["files"].as_array())
        .map(Vec::len)
        .unwrap_or(0);
    assert!(sealed >= 50, "the seal lists {sealed} files: {seal}");
}

/// hyper buffers up to about 400 KiB of a request head by default: an
/// agent sending never-ending heads on every proxy connection made root
/// hold 125 MiB for the header timeout (30 s), again and again. A head
/// past 64 KiB is now refused (431) and its connection closed.
#[test]
fn never_ending_request_heads_do_not_pin_the_supervisors_memory() {
    if !can_run("gateway_load") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let marker = work.join("h");
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
            HEADS,
            marker.to_str().unwrap(),
        ],
        work.path(),
    );
    let supervisor = launcher.id();
    assert!(eventually(30, || supervisor_rss_kib(supervisor) > 0));
    std::thread::sleep(Duration::from_millis(500));
    let before = supervisor_rss_kib(supervisor);
    wait_for(&marker.with_extension("done"), 120);
    let after = supervisor_rss_kib(supervisor);
    std::fs::write(marker.with_extension("stop"), "").unwrap();
    let status = launcher.take().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let grown = after.saturating_sub(before);
    eprintln!("supervisor {supervisor}: {before} -> {after} KiB");
    assert!(
        grown < 40 * 1024,
        "the supervisor grew by {grown} KiB ({before} -> {after}) holding never-ending request heads"
    );
}
