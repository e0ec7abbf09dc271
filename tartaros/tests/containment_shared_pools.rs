//! Kernel pools every devpts instance of the host draws from: one run must
//! not drain them for the other runs and containers of the host.
//!
//! The sandbox's devpts is an instance of its own, but its ptys come from
//! the host-wide `kernel.pty.max` (4096 here), of which every instance but
//! the host's first shares what `kernel.pty.reserve` leaves (3,072 here).
//! Before, one agent opened all 3,071 of them: every other run (and any
//! container) got ENOSPC from /dev/ptmx until it ended.

mod common;

use std::time::Duration;

use common::*;

/// Opens ptys until refused, says how many, holds them until `release`.
const HOLDER: &str = r#"
import os, sys, time
ready, release = sys.argv[1], sys.argv[2]
fds = []
try:
    while len(fds) < 5000:
        fds.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    print('stopped', e.strerror, flush=True)
open(ready, 'w').write(str(len(fds)))
while not os.path.exists(release):
    time.sleep(0.05)
"#;

/// The tests measure host-wide counters: one at a time, or each would see
/// the others' sockets.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn ptys_in_use() -> usize {
    std::fs::read_to_string("/proc/sys/kernel/pty/nr")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn one_run_cannot_take_every_pty_of_the_host() {
    if !can_run("containment_shared_pools") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let script = work.file("holder.py", HOLDER);
    let ready = work.join("ready");
    let release = work.join("release");
    let before = ptys_in_use();
    let mut hog = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args([
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--",
                "/usr/bin/python3",
                script.to_str().unwrap(),
                ready.to_str().unwrap(),
                release.to_str().unwrap(),
            ])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    ));
    let started = eventually(60, || {
        ready.exists()
            || hog
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    std::thread::sleep(Duration::from_millis(100));
    let held = ptys_in_use().saturating_sub(before);
    // Another run, while the first holds what it could get.
    let other = Dir::new();
    let out = python(
        &["--write", other.path().to_str().unwrap()],
        other.path(),
        "import os\ntry:\n    os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY); print('pty OK')\nexcept OSError as e:\n    print('pty', e.strerror)",
    );
    std::fs::write(&release, "").unwrap();
    let _ = hog.take().wait();
    assert!(started, "the holder never started");
    assert!(
        held <= 256,
        "one run held {held} of the host's ptys (kernel.pty.nr)"
    );
    expect(&out, "pty", "OK");
}

/// Fills loopback TCP connections the agent never reads, then holds them.
const TCP_FILLER: &str = r#"
import os, socket, sys, time
ready, release, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1000)
keep, total, chunk = [], 0, b'x' * 65536
try:
    for _ in range(conns):
        c = socket.create_connection(srv.getsockname())
        s, _ = srv.accept()
        c.setblocking(False)
        keep += [c, s]
        try:
            while True:
                total += c.send(chunk)
        except OSError:
            pass
except OSError as e:
    print('stopped', e.strerror, flush=True)
print('queued', total, flush=True)
open(ready, 'w').write(str(total))
while not os.path.exists(release):
    time.sleep(0.05)
"#;

/// The host's buffer memory of `proto` (`TCP` or `UDP`) in bytes, from
/// `/proc/net/sockstat`: `tcp_memory_allocated` / `udp_memory_allocated`,
/// one budget for every network namespace, past whose `net.ipv4.tcp_mem`
/// (`udp_mem`) limit every socket of the host is starved.
fn host_buffer_memory(proto: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/net/sockstat").unwrap();
    let line = text
        .lines()
        .find(|l| l.strip_prefix(proto).is_some_and(|r| r.starts_with(':')))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let at = fields.iter().position(|f| *f == "mem").unwrap();
    fields[at + 1].parse::<u64>().unwrap() * 4096
}

fn host_tcp_memory() -> u64 {
    host_buffer_memory("TCP")
}

#[test]
fn a_runs_tcp_buffers_stay_within_its_memory_limit() {
    if !can_run("containment_shared_pools") {
        return;
    }
    let _serial = serial();
    const LIMIT: u64 = 64 << 20;
    let work = Dir::new();
    let script = work.file("filler.py", TCP_FILLER);
    let ready = work.join("ready");
    let release = work.join("release");
    let before = host_tcp_memory();
    let mut filler = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args([
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--max-memory",
                "64M",
                "--",
                "/usr/bin/python3",
                script.to_str().unwrap(),
                ready.to_str().unwrap(),
                release.to_str().unwrap(),
                "60",
            ])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    ));
    let started = eventually(60, || {
        ready.exists()
            || filler
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    let during = host_tcp_memory();
    std::fs::write(&release, "").unwrap();
    let _ = filler.take().wait();
    assert!(started, "the filler never started");
    let queued: u64 = std::fs::read_to_string(&ready).unwrap().parse().unwrap();
    let grown = during.saturating_sub(before);
    // Slack for the rest of the host's TCP traffic meanwhile.
    assert!(
        grown <= LIMIT + (16 << 20),
        "the host's TCP memory grew by {} MiB ({} MiB queued) under --max-memory 64M",
        grown >> 20,
        queued >> 20
    );
}

/// Opens `conns` connections to the egress proxy, asks each for a tunnel
/// to an allowed host that cannot be reached, and sends into it what the
/// kernel takes: the gateway's side of each connection is the supervisor's
/// socket, outside the run's memory cgroup.
const GATEWAY_FILLER: &str = r#"
import os, socket, sys, time
ready, release, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
proxy = os.environ['HTTPS_PROXY'].split('//')[1].rstrip('/')
host, port = proxy.rsplit(':', 1)
keep, total = [], 0
for _ in range(conns):
    try:
        c = socket.create_connection((host, int(port)))
    except OSError as e:
        print('stopped', e.strerror, flush=True)
        break
    c.setblocking(False)
    keep.append(c)
    c.send(b'CONNECT unreachable.example:443 HTTP/1.1\r\nHost: unreachable.example:443\r\n\r\n')
    # The request alone first: the gateway reads it, starts its upstream
    # connection, and reads no more until that is up.
    time.sleep(0.001)
    try:
        while True:
            total += c.send(b'\x16' * 65536)
    except OSError:
        pass
print('queued', total, flush=True)
open(ready, 'w').write(str(total))
while not os.path.exists(release):
    time.sleep(0.05)
"#;

#[test]
fn a_gateways_sockets_do_not_hold_the_hosts_tcp_memory_for_the_agent() {
    if !can_run("containment_shared_pools") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let script = work.file("filler.py", GATEWAY_FILLER);
    let ready = work.join("ready");
    let release = work.join("release");
    let before = host_tcp_memory();
    let mut filler = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args([
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--max-memory",
                "64M",
                "--allow-domain",
                "unreachable.example",
                "--",
                "/usr/bin/python3",
                script.to_str().unwrap(),
                ready.to_str().unwrap(),
                release.to_str().unwrap(),
                "300",
            ])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    ));
    let started = eventually(60, || {
        ready.exists()
            || filler
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    let during = host_tcp_memory();
    std::fs::write(&release, "").unwrap();
    let _ = filler.take().wait();
    assert!(started, "the filler never started");
    let queued: u64 = std::fs::read_to_string(&ready).unwrap().parse().unwrap();
    let grown = during.saturating_sub(before);
    eprintln!("grown {} MiB, queued {} MiB", grown >> 20, queued >> 20);
    // The run's own 64 MiB, and the gateway's fixed buffers: 128 KiB,
    // doubled by the kernel, a connection (300 here, accepted or in the
    // backlog), and slack for the rest of the host's traffic.
    assert!(
        grown <= (64 << 20) + 300 * (256 << 10) + (16 << 20),
        "the host's TCP memory grew by {} MiB ({} MiB queued) under --max-memory 64M",
        grown >> 20,
        queued >> 20
    );
}

/// Queues datagrams to `socks` UDP sockets that never read them.
const UDP_FILLER: &str = r#"
import os, socket, sys, time
ready, release, socks = sys.argv[1], sys.argv[2], int(sys.argv[3])
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.setblocking(False)
keep, total = [], 0
for _ in range(socks):
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(('127.0.0.1', 0))
    keep.append(rx)
    for _ in range(400):
        try:
            total += tx.sendto(b'x' * 1400, rx.getsockname())
        except OSError:
            break
open(ready, 'w').write(str(total))
while not os.path.exists(release):
    time.sleep(0.05)
"#;

fn host_udp_memory() -> u64 {
    host_buffer_memory("UDP")
}

#[test]
fn a_runs_udp_buffers_stay_within_its_memory_limit() {
    if !can_run("containment_shared_pools") {
        return;
    }
    let _serial = serial();
    let work = Dir::new();
    let script = work.file("filler.py", UDP_FILLER);
    let ready = work.join("ready");
    let release = work.join("release");
    let before = host_udp_memory();
    let mut filler = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args([
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--max-memory",
                "64M",
                "--",
                "/usr/bin/python3",
                script.to_str().unwrap(),
                ready.to_str().unwrap(),
                release.to_str().unwrap(),
                "1500",
            ])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    ));
    let started = eventually(60, || {
        ready.exists()
            || filler
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    let during = host_udp_memory();
    std::fs::write(&release, "").unwrap();
    let _ = filler.take().wait();
    assert!(started, "the filler never started");
    let grown = during.saturating_sub(before);
    eprintln!("UDP memory grown {} MiB", grown >> 20);
    assert!(
        grown <= (64 << 20) + (16 << 20),
        "the host's UDP memory grew by {} MiB under --max-memory 64M",
        grown >> 20
    );
}

/// Opens `conns` connections to a `--port` relay and reads nothing.
const IDLE_READER: &str = r#"
import os, socket, sys, time
port, conns, ready, release = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
keep = [socket.create_connection(('127.0.0.1', port)) for _ in range(conns)]
open(ready, 'w').write(str(len(keep)))
while not os.path.exists(release):
    time.sleep(0.05)
"#;

/// Bytes queued for sending on the sockets bound to local `port` in the
/// network namespace of `pid` (`/proc/<pid>/net/tcp`, `tx_queue`).
fn queued_from_port(pid: i32, port: u16) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            let tx = fields.get(4)?.split(':').next()?;
            (local_port == port).then(|| u64::from_str_radix(tx, 16).ok())?
        })
        .sum()
}

#[test]
fn a_port_relay_does_not_buffer_a_streaming_host_service_for_an_agent_that_never_reads() {
    if !can_run("containment_shared_pools") {
        return;
    }
    let _serial = serial();
    const CONNS: u64 = 100;
    // A host service that sends as fast as it may, on every connection.
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in service.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::Write;
                let mut stream = stream;
                let chunk = [b'y'; 65536];
                while stream.write_all(&chunk).is_ok() {}
            });
        }
    });
    let work = Dir::new();
    let script = work.file("reader.py", IDLE_READER);
    let ready = work.join("ready");
    let release = work.join("release");
    let port_arg = port.to_string();
    let conns = CONNS.to_string();
    let mut run = KillOnDrop(Some(
        std::process::Command::new(bin())
            .args([
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--port",
                &port_arg,
                "--",
                "/usr/bin/python3",
                script.to_str().unwrap(),
                &port_arg,
                &conns,
                ready.to_str().unwrap(),
                release.to_str().unwrap(),
            ])
            .current_dir(work.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn"),
    ));
    let started = eventually(60, || {
        ready.exists()
            || run
                .0
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)))
    });
    // Let the relay push what the kernel takes.
    std::thread::sleep(Duration::from_secs(2));
    let agent = processes_running(script.to_str().unwrap());
    let queued = agent.map_or(0, |pid| queued_from_port(pid, port));
    std::fs::write(&release, "").unwrap();
    let _ = run.take().wait();
    assert!(started && agent.is_some(), "the reader never started");
    eprintln!("the relay's side queued {} MiB", queued >> 20);
    // What the relay's sockets in the sandbox may hold for one connection:
    // their fixed buffer (doubled by the kernel for its bookkeeping).
    assert!(
        queued <= CONNS * (512 << 10),
        "the relay's sockets held {} MiB of the host's TCP memory for {CONNS} connections the agent never read",
        queued >> 20
    );
}

/// The pid of a process whose command line holds `marker`.
fn processes_running(marker: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
            (cmdline.contains(marker) && !cmdline.contains("tartaros")).then_some(pid)
        })
}
