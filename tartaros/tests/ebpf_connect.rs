//! The cgroup connect filter against the real kernel: needs root, cgroup v2
//! and python3. Skips (with a reason) when those are missing, unless CI=true.
//! Only loopback addresses are ever used as network targets.

mod common;

use std::io::Read as _;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::fs::MetadataExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use tartaros::ebpf::{self, ConnectEvent, ConnectGrant, kind, verdict};

const EPERM: i64 = libc::EPERM as i64;

const CHILD_SCRIPT: &str = r#"
import errno, json, socket, sys
granted, other = int(sys.argv[1]), int(sys.argv[2])
res = {}
def attempt(name, fn):
    try:
        fn()
        res[name] = 0
    except OSError as e:
        res[name] = e.errno if e.errno is not None else -1
def tcp(family, addr):
    def run():
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(addr)
        finally:
            s.close()
    return run
def udp_sendto():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", ("127.0.0.1", 53))
    finally:
        s.close()
def udp6_mapped_sendto():
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", ("::ffff:127.0.0.1", 53))
    finally:
        s.close()
def tcp_fastopen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", other))
    finally:
        s.close()
def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
def packet():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
attempt("granted", tcp(socket.AF_INET, ("127.0.0.1", granted)))
attempt("other", tcp(socket.AF_INET, ("127.0.0.1", other)))
attempt("v6_loopback_granted_port", tcp(socket.AF_INET6, ("::1", granted)))
attempt("v6_mapped_other", tcp(socket.AF_INET6, ("::ffff:127.0.0.1", other)))
attempt("v6_mapped_granted", tcp(socket.AF_INET6, ("::ffff:127.0.0.1", granted)))
attempt("udp_sendto_53", udp_sendto)
attempt("udp6_mapped_sendto_53", udp6_mapped_sendto)
attempt("tcp_fastopen_other", tcp_fastopen)
attempt("raw_icmp", raw)
attempt("af_packet", packet)
print(json.dumps(res))
"#;

/// Sends more denied datagrams than the ring buffer holds records.
const FLOOD_SCRIPT: &str = r#"
import errno, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
denied = 0
for _ in range(6000):
    try:
        s.sendto(b"x", ("127.0.0.1", 53))
    except PermissionError:
        denied += 1
print('{"denied": %d}' % denied)
"#;

/// Runs the probe script as a process inside `cgroup`; returns its results
/// as (case, errno) pairs (0 = success).
fn run_child(guard: &mut common::CgroupGuard, granted: u16, other: u16) -> Vec<(String, i64)> {
    run_script(guard, CHILD_SCRIPT, granted, other)
}

fn run_script(
    guard: &mut common::CgroupGuard,
    script: &str,
    granted: u16,
    other: u16,
) -> Vec<(String, i64)> {
    let procs = guard.cgroup.join("cgroup.procs");
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec python3 -c "$2" "$3" "$4""#)
        .arg("sh")
        .arg(&procs)
        .arg(script)
        .arg(granted.to_string())
        .arg(other.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sh/python3");
    guard.child = Some(child);
    let child = guard.child.as_mut().expect("child just stored");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut out)
        .expect("read child output");
    let status = child.wait().expect("wait for child");
    guard.child = None;
    assert!(status.success(), "child failed: {status}; output: {out}");
    parse_results(&out)
}

/// Parses the flat JSON object `{"name": errno, ...}` the script prints.
fn parse_results(out: &str) -> Vec<(String, i64)> {
    let body = out.trim().trim_start_matches('{').trim_end_matches('}');
    body.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once(':').expect("key: value");
            (
                k.trim().trim_matches('"').to_owned(),
                v.trim().parse().expect("errno is a number"),
            )
        })
        .collect()
}

fn result(results: &[(String, i64)], name: &str) -> i64 {
    results
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no result for {name} in {results:?}"))
}

fn drain_events(ring: &mut aya::maps::RingBuf<aya::maps::MapData>) -> Vec<ConnectEvent> {
    let mut events = Vec::new();
    while let Some(item) = ring.next() {
        events.push(ebpf::parse_event(&item).expect("event record"));
    }
    events
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

#[test]
fn connect_filter_allows_only_granted_destinations() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return common::skip(
            "ebpf_connect",
            "needs root (loads BPF programs, creates cgroups)",
        );
    }
    // As the supervisor does: prepare the loader while other start-up work runs.

    let Some(root) = common::cgroup2_root() else {
        return common::skip(
            "ebpf_connect",
            "no cgroup v2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup",
        );
    };
    if Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        return common::skip("ebpf_connect", "python3 is not available");
    }

    let granted_listener = TcpListener::bind("127.0.0.1:0").expect("bind granted listener");
    let other_listener = TcpListener::bind("127.0.0.1:0").expect("bind other listener");
    let granted = granted_listener.local_addr().expect("addr").port();
    let other = other_listener.local_addr().expect("addr").port();

    let name = format!(
        "tartaros-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let cgroup = root.join(name);
    std::fs::create_dir(&cgroup).expect("create test cgroup");
    let mut guard = common::CgroupGuard {
        cgroup: cgroup.clone(),
        programs: None,
        child: None,
    };
    let cgroup_id = std::fs::metadata(&cgroup).expect("stat cgroup").ino();

    let grants = [ConnectGrant {
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: granted,
    }];
    let started = Instant::now();
    let programs = match ebpf::attach(&cgroup, &grants) {
        Ok(p) => p,
        Err(e) => {
            return common::skip(
                "ebpf_connect",
                &format!("cannot attach the filter here: {e}"),
            );
        }
    };
    let elapsed = started.elapsed();
    eprintln!(
        "attach: {elapsed:?} (first in process, after warm_up; includes aya feature probing)"
    );
    guard.programs = Some(programs);
    let programs = guard.programs.as_mut().expect("just stored");
    let mut ring = programs.take_events().expect("ring buffer");
    assert!(
        programs.take_events().is_none(),
        "ring buffer can be taken once"
    );

    let results = run_child(&mut guard, granted, other);
    eprintln!("child results: {results:?}");
    assert_eq!(
        result(&results, "granted"),
        0,
        "granted connect must succeed"
    );
    assert_eq!(
        result(&results, "other"),
        EPERM,
        "other loopback port must be EPERM"
    );
    assert_eq!(
        result(&results, "v6_loopback_granted_port"),
        EPERM,
        "IPv6 must be EPERM"
    );
    assert_eq!(
        result(&results, "v6_mapped_other"),
        EPERM,
        "mapped non-granted must be EPERM"
    );
    assert_eq!(
        result(&results, "v6_mapped_granted"),
        0,
        "mapped form of the granted pair passes"
    );
    assert_eq!(
        result(&results, "udp_sendto_53"),
        EPERM,
        "UDP to :53 must be EPERM"
    );
    assert_eq!(
        result(&results, "raw_icmp"),
        EPERM,
        "raw sockets must be EPERM"
    );
    eprintln!(
        "AF_PACKET socket() in the cgroup: errno {} (cgroup/sock_create does not run for non-inet families; seccomp must refuse them)",
        result(&results, "af_packet")
    );

    let events = drain_events(&mut ring);
    for ev in &events {
        eprintln!(
            "event kind={} verdict={} dest={:?} pid={} tgid={} uid={} cgroup={}",
            ev.kind,
            ev.verdict,
            ebpf::event_destination(ev),
            ev.pid,
            ev.tgid,
            ev.uid,
            ev.cgroup_id
        );
    }
    let denied_other = events
        .iter()
        .find(|e| e.kind == kind::CONNECT4 && e.verdict == verdict::DENY && e.port == other);
    let denied_other = denied_other.expect("a denied connect4 event for the other port");
    assert_eq!(
        denied_other.cgroup_id, cgroup_id,
        "event carries the test cgroup's id"
    );
    assert_eq!(&denied_other.addr[..4], &[127, 0, 0, 1]);
    assert!(denied_other.ktime_ns > 0 && denied_other.tgid > 0);
    assert!(
        events
            .iter()
            .any(|e| e.kind == kind::CONNECT4 && e.verdict == verdict::ALLOW && e.port == granted),
        "an allowed connect4 event for the granted port"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == kind::SENDMSG4 && verdict::is_denied(e.verdict) && e.port == 53),
        "a denied sendmsg4 event for port 53"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == kind::CONNECT6 && verdict::is_denied(e.verdict)),
        "a denied connect6 event"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == kind::SOCK_CREATE && verdict::is_denied(e.verdict)),
        "a denied sock_create event"
    );
    assert_eq!(
        guard
            .programs
            .as_ref()
            .expect("attached")
            .lost_events()
            .expect("read lost counters"),
        0
    );

    // Monitor mode lets everything through (and still reports it); a
    // grant added later takes effect at once.
    {
        let programs = guard.programs.as_mut().expect("attached");
        programs.set_enforcing(false).expect("monitor mode");
    }
    let results = run_child(&mut guard, granted, other);
    assert_eq!(result(&results, "other"), 0, "monitor mode allows");
    {
        let programs = guard.programs.as_mut().expect("attached");
        programs.set_enforcing(true).expect("enforce mode");
        programs
            .allow(ConnectGrant {
                addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: other,
            })
            .expect("add grant");
    }
    let results = run_child(&mut guard, granted, other);
    assert_eq!(result(&results, "other"), 0, "late grant allows");
    assert_eq!(result(&results, "udp_sendto_53"), EPERM, "enforcing again");
    let events = drain_events(&mut ring);
    assert!(
        events
            .iter()
            .any(|e| e.verdict == verdict::ALLOW_MONITOR && e.port == other),
        "monitor-mode event for the other port"
    );

    // Loss accounting: flood the ring buffer (256 KiB, 64 bytes a record
    // with its header) without reading it; what does not fit is counted.
    let results = run_script(&mut guard, FLOOD_SCRIPT, granted, other);
    assert_eq!(result(&results, "denied"), 6000);
    let lost = guard
        .programs
        .as_ref()
        .expect("attached")
        .lost_events()
        .expect("read lost counters");
    let kept = drain_events(&mut ring).len() as u64;
    eprintln!("flood: {kept} events delivered, {lost} counted as lost");
    assert!(lost > 0, "a full ring buffer must be counted");
    assert_eq!(kept + lost, 6000, "every event is delivered or counted");

    // Dropping the programs detaches them: the same connect now passes.
    drop(guard.programs.take());
    let results = run_child(&mut guard, granted, other);
    assert_eq!(
        result(&results, "other"),
        0,
        "after detach the filter is gone"
    );

    // A second attach in the same process: loader and aya's feature
    // probing are cached.
    let started = Instant::now();
    let programs = ebpf::attach(&cgroup, &grants).expect("re-attach");
    eprintln!(
        "attach: {:?} (second in process); reported {:?}",
        started.elapsed(),
        programs.attach_time()
    );
    programs.detach();
}

#[test]
fn probe_program_types_reports_cgroup_programs() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return common::skip("ebpf_connect", "needs root (loads BPF programs)");
    }
    let started = Instant::now();
    let probes = ebpf::probe_program_types();
    eprintln!("probe_program_types: {probes:?} in {:?}", started.elapsed());
    for name in [
        "cgroup_sock_addr",
        "cgroup_sock",
        "raw_tracepoint",
        "tp_btf",
        "lsm",
        "fentry",
    ] {
        assert!(probes.iter().any(|(n, _)| *n == name), "{name} probed");
    }
    let loads = |name: &str| probes.iter().any(|(n, ok)| *n == name && *ok);
    assert!(
        loads("cgroup_sock_addr"),
        "cgroup_sock_addr must load: {probes:?}"
    );
    assert!(loads("cgroup_sock"), "cgroup_sock must load: {probes:?}");
}
