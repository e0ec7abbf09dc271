//! Transparent interception against the real kernel: needs root, cgroup v2
//! and python3; skips (with a reason) when those are missing, unless
//! CI=true.
//!
//! The transparent listener lives in this test process on 127.0.0.1 (and
//! [::1]) at an ephemeral port. A python3 client inside a test cgroup
//! connects to documentation addresses (192.0.2.1, 2001:db8::1): the
//! connect programs rewrite the destination before routing, so no packet
//! leaves loopback; were the rewrite broken, the connect would just fail.

mod common;

use std::collections::HashMap;
use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tartaros::ebpf::{self, AttachOptions, ConnectGrant};

const EPERM: i64 = libc::EPERM as i64;

/// Prints one line per case: `name errno local_port`.
const CLIENT: &str = r#"
import socket, sys
loop_port, with_v6 = int(sys.argv[1]), sys.argv[2] == "1"
def tcp(name, family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
        print(name, 0, s.getsockname()[1], flush=True)
    except OSError as e:
        print(name, e.errno if e.errno is not None else -1, 0, flush=True)
    finally:
        s.close()
def udp(name, fn):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fn(s)
        print(name, 0, 0, flush=True)
    except OSError as e:
        print(name, e.errno if e.errno is not None else -1, 0, flush=True)
    finally:
        s.close()
tcp("v4", socket.AF_INET, ("192.0.2.1", 443))
tcp("mapped", socket.AF_INET6, ("::ffff:192.0.2.7", 8443))
if with_v6:
    tcp("v6", socket.AF_INET6, ("2001:db8::1", 443))
tcp("loopback", socket.AF_INET, ("127.0.0.1", loop_port))
udp("udp_sendto", lambda s: s.sendto(b"x", ("192.0.2.1", 53)))
udp("udp_connect", lambda s: s.connect(("192.0.2.1", 53)))
"#;

/// Binds 127.0.0.1 and, if possible, [::1] on the same ephemeral port.
fn bind_pair() -> (TcpListener, Option<TcpListener>) {
    for _ in 0..20 {
        let v4 = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = v4.local_addr().expect("addr").port();
        match TcpListener::bind(("::1", port)) {
            Ok(v6) => return (v4, Some(v6)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => {
                eprintln!("no IPv6 loopback ({e}): the connect6 case is skipped");
                return (v4, None);
            }
        }
    }
    panic!("no ephemeral port free on both 127.0.0.1 and ::1");
}

/// Accepts one connection within 5 s.
fn accept(listener: &TcpListener) -> std::net::TcpStream {
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true).expect("nonblocking stream");
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("no connection on {:?}: {e}", listener.local_addr()),
        }
    }
}

#[test]
fn tcp_connects_are_redirected_and_their_destination_recovered() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return common::skip(
            "transparent",
            "needs root (loads BPF programs, creates cgroups)",
        );
    }
    let Some(root) = common::cgroup2_root() else {
        return common::skip(
            "transparent",
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
        return common::skip("transparent", "python3 is not available");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let _enter = rt.enter();

    let (v4, v6) = bind_pair();
    let port = v4.local_addr().expect("addr").port();
    let loop_listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback listener");
    let loop_port = loop_listener.local_addr().expect("addr").port();

    let cgroup = root.join(format!("tartaros-transparent-{}", std::process::id()));
    std::fs::create_dir(&cgroup).expect("create test cgroup");
    let mut guard = common::CgroupGuard {
        cgroup: cgroup.clone(),
        programs: None,
        child: None,
    };
    let grants = vec![
        ConnectGrant {
            addr: std::net::Ipv4Addr::LOCALHOST.into(),
            port: 0,
        },
        ConnectGrant {
            addr: std::net::Ipv6Addr::LOCALHOST.into(),
            port: 0,
        },
    ];
    let programs = ebpf::attach_with(
        &cgroup,
        &AttachOptions {
            grants,
            transparent_port: Some(port),
            ring_bytes: 256 * 1024,
            ..AttachOptions::default()
        },
    )
    .expect("attach with transparent interception");
    assert!(programs.programs().any(|p| p == "sock_ops"));
    let original_dst = programs
        .original_dst()
        .expect("original_dst with a transparent port");
    guard.programs = Some(programs);

    // A connection that was not intercepted has no original destination.
    let direct = std::net::TcpStream::connect(("127.0.0.1", port)).expect("direct connect");
    let accepted = tokio::net::TcpStream::from_std(accept(&v4)).expect("tokio stream");
    assert_eq!(original_dst(&accepted), None, "not intercepted");
    drop((direct, accepted));

    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec python3 -c "$2" "$3" "$4""#)
        .arg("sh")
        .arg(cgroup.join("cgroup.procs"))
        .arg(CLIENT)
        .arg(loop_port.to_string())
        .arg(if v6.is_some() { "1" } else { "0" })
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
        .expect("read client output");
    let status = child.wait().expect("wait for client");
    guard.child = None;
    assert!(status.success(), "client failed: {status}; output: {out}");
    let results: HashMap<&str, (i64, u16)> = out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?,
                (f.next()?.parse().ok()?, f.next()?.parse().ok()?),
            ))
        })
        .collect();
    eprintln!("client: {results:?}");

    // Every intercepted connect reached our listener; its peer port leads
    // to the destination the client asked for.
    let mut expected: Vec<(&str, &TcpListener, SocketAddr)> = vec![
        ("v4", &v4, "192.0.2.1:443".parse().expect("addr")),
        ("mapped", &v4, "192.0.2.7:8443".parse().expect("addr")),
    ];
    if let Some(v6) = v6.as_ref() {
        expected.push(("v6", v6, "[2001:db8::1]:443".parse().expect("addr")));
    }
    // The v4 listener holds two connections; match them by peer port.
    let mut by_port: HashMap<u16, Option<SocketAddr>> = HashMap::new();
    for (name, listener, _) in &expected {
        let (errno, local_port) = results[name];
        assert_eq!(errno, 0, "{name}: the intercepted connect failed");
        assert_ne!(local_port, 0, "{name}");
        let stream = tokio::net::TcpStream::from_std(accept(listener)).expect("tokio stream");
        let peer = stream.peer_addr().expect("peer").port();
        by_port.insert(peer, original_dst(&stream));
        assert_eq!(original_dst(&stream), None, "an entry is taken only once");
    }
    for (name, _, want) in &expected {
        let local_port = results[name].1;
        assert_eq!(
            by_port.get(&local_port).copied().flatten(),
            Some(*want),
            "{name}: original destination"
        );
    }

    // Loopback is granted: not redirected.
    assert_eq!(results["loopback"].0, 0, "loopback connect");
    let _ = accept(&loop_listener);
    // UDP is never intercepted.
    assert_eq!(results["udp_sendto"].0, EPERM, "UDP sendto 192.0.2.1:53");
    assert_eq!(results["udp_connect"].0, EPERM, "UDP connect 192.0.2.1:53");

    let programs = guard.programs.take().expect("programs");
    programs.detach();
}
