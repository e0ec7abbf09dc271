//! Adversarial round 21: a status channel that is a unix socket whose
//! peer (or own) name lies in a writable root. The harness bound its
//! reader at `W/status.sock` and passed a socket connected to it; the
//! agent did `sendto("W/status.sock")` and its forged `exited` line came
//! before ours. Such a socket is refused (78) before anything runs, by
//! `tartaros run` and through the service; a socket bound outside the
//! roots and a socketpair still work.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use harness::Service;

const FRANK: u32 = 47_000 + 330;

/// What a hostile agent sends to pass for the supervisor.
const FORGED: &str = r#"{"event":"exited","code":0,"signal":null,"status":0,"duration_ms":1,"log_head":null,"log_complete":true}"#;

/// `run -q --write W --status-fd 9 -- sh -c AGENT`: the agent leaves a
/// marker in W (so that a run that started shows) and, where the sandbox
/// has python3, sends the forged line to `socket` both as a datagram and
/// over a stream connection.
fn agent_args(work: &Path, socket: &Path) -> Vec<String> {
    let w = work.to_str().unwrap();
    let s = socket.to_str().unwrap();
    let forge = format!(
        "import socket\nfor t in (socket.SOCK_DGRAM, socket.SOCK_STREAM):\n try:\n  c = socket.socket(socket.AF_UNIX, t)\n  c.connect('{s}')\n  c.send(b'{FORGED}\\n')\n except OSError:\n  pass\n"
    );
    let agent = format!("touch {w}/marker; python3 -c \"$0\" 2>/dev/null; true");
    [
        "run",
        "-q",
        "--write",
        w,
        "--status-fd",
        "9",
        "--",
        "sh",
        "-c",
        &agent,
        &forge,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `command` with `fd` as its descriptor 9.
fn with_fd9(mut command: Command, fd: RawFd) -> Output {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    on_fd9(&mut command, fd);
    command.output().expect("spawn")
}

fn run_with_fd9(args: &[String], fd: RawFd, cwd: &Path) -> Output {
    let mut command = Command::new(bin());
    command.args(args).current_dir(cwd);
    with_fd9(command, fd)
}

/// Every datagram waiting on `reader`.
fn datagrams(reader: &UnixDatagram) -> String {
    reader
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut all = String::new();
    let mut buf = [0u8; 65536];
    while let Ok(n) = reader.recv(&mut buf) {
        all.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    all
}

/// Everything on `stream` until end of file or a short quiet spell.
fn read_stream(mut stream: &UnixStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&all).into_owned()
}

#[track_caller]
fn assert_refused_and_nothing_ran(out: &Output, work: &Path, seen: &str, case: &str) {
    assert_eq!(
        out.status.code(),
        Some(78),
        "{case}: {}{}",
        stdout(out),
        stderr(out)
    );
    assert!(
        !work.join("marker").exists(),
        "{case}: the agent ran: {}",
        stderr(out)
    );
    assert!(
        !seen.contains(r#""log_complete":true"#) && !seen.contains(r#""event":"started""#),
        "{case}: the run started or the agent's line arrived: {seen}"
    );
    assert!(
        stderr(out).contains("unix socket") && stderr(out).contains("socketpair"),
        "{case}: {}",
        stderr(out)
    );
}

#[track_caller]
fn assert_ran_with_status(out: &Output, seen: &str, case: &str) {
    assert_eq!(out.status.code(), Some(0), "{case}: {}", stderr(out));
    let events: Vec<String> = seen
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["event"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(events, ["started", "exited"], "{case}: {seen}");
}

/// The repro: a datagram reader bound in the root, the status descriptor
/// connected to it.
#[test]
fn a_datagram_socket_bound_inside_a_writable_root_is_refused() {
    if !can_run("status_dgram_in_root") {
        return;
    }
    let work = Dir::open_to_all();
    let path = work.join("status.sock");
    let reader = UnixDatagram::bind(&path).expect("bind");
    let writer = UnixDatagram::unbound().expect("socket");
    writer.connect(&path).expect("connect");
    let args = agent_args(work.path(), &path);
    let out = run_with_fd9(&args, writer.as_raw_fd(), work.path());
    let seen = datagrams(&reader);
    assert_refused_and_nothing_ran(&out, work.path(), &seen, "dgram peer");
    assert!(stderr(&out).contains("peer's address"), "{}", stderr(&out));
    // A nested directory of the root is the root too, and a name through
    // a symlink outside the roots that leads into it as well.
    let nested = work.join("sub/deeper");
    std::fs::create_dir_all(&nested).unwrap();
    let deep = nested.join("s.sock");
    let reader = UnixDatagram::bind(&deep).expect("bind");
    let outside = Dir::new();
    let link = outside.join("link");
    std::os::unix::fs::symlink(&nested, &link).unwrap();
    let writer = UnixDatagram::unbound().expect("socket");
    writer.connect(link.join("s.sock")).expect("connect");
    let out = run_with_fd9(&args, writer.as_raw_fd(), work.path());
    let seen = datagrams(&reader);
    assert_refused_and_nothing_ran(&out, work.path(), &seen, "dgram through link");
}

/// A stream listener bound in the root: the status descriptor as the
/// client connected to it (its peer's name), and as the accepted side
/// (its own name is the listener's).
#[test]
fn a_stream_listener_inside_a_writable_root_is_refused() {
    if !can_run("status_stream_in_root") {
        return;
    }
    let work = Dir::open_to_all();
    let path = work.join("status.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    listener.set_nonblocking(true).unwrap();
    let args = agent_args(work.path(), &path);
    let client = UnixStream::connect(&path).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    let out = run_with_fd9(&args, client.as_raw_fd(), work.path());
    drop(client);
    let seen = read_stream(&accepted);
    assert_refused_and_nothing_ran(&out, work.path(), &seen, "stream peer");
    assert!(
        listener.accept().is_err(),
        "the agent connected to the listener"
    );
    // The harness hands over its accepted end and reads the client.
    let client = UnixStream::connect(&path).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    let out = run_with_fd9(&args, accepted.as_raw_fd(), work.path());
    drop(accepted);
    let seen = read_stream(&client);
    assert_refused_and_nothing_ran(&out, work.path(), &seen, "stream own");
    assert!(stderr(&out).contains("own address"), "{}", stderr(&out));
}

/// A reader bound outside the roots, and a socketpair, still get the
/// status lines.
#[test]
fn a_socket_outside_the_roots_or_a_socketpair_still_works() {
    if !can_run("status_socket_outside") {
        return;
    }
    let work = Dir::open_to_all();
    let outside = Dir::new();
    let w = work.path().to_str().unwrap().to_string();
    let args: Vec<String> = ["run", "-q", "--write", &w, "--status-fd", "9", "--", "true"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let path = outside.join("status.sock");
    let reader = UnixDatagram::bind(&path).expect("bind");
    let writer = UnixDatagram::unbound().expect("socket");
    writer.connect(&path).expect("connect");
    let out = run_with_fd9(&args, writer.as_raw_fd(), work.path());
    assert_ran_with_status(&out, &datagrams(&reader), "dgram outside");
    let listener = UnixListener::bind(outside.join("stream.sock")).expect("bind");
    let client = UnixStream::connect(outside.join("stream.sock")).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    let out = run_with_fd9(&args, client.as_raw_fd(), work.path());
    drop(client);
    assert_ran_with_status(&out, &read_stream(&accepted), "stream outside");
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let out = run_with_fd9(&args, theirs.as_raw_fd(), work.path());
    drop(theirs);
    assert_ran_with_status(&out, &read_stream(&ours), "stream socketpair");
    let (ours, theirs) = UnixDatagram::pair().expect("socketpair");
    let out = run_with_fd9(&args, theirs.as_raw_fd(), work.path());
    assert_ran_with_status(&out, &datagrams(&ours), "dgram socketpair");
}

/// Through the service the worker receives the caller's socket and checks
/// its names once the policy is known.
#[test]
fn a_datagram_socket_inside_a_root_through_the_service_is_refused() {
    if !can_run("status_dgram_in_root_service") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(FRANK);
    let path = work.join("status.sock");
    let reader = UnixDatagram::bind(&path).expect("bind");
    chown(&path, FRANK);
    let writer = UnixDatagram::unbound().expect("socket");
    writer.connect(&path).expect("connect");
    let args = agent_args(work.path(), &path);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = service.command(FRANK, &args, work.path());
    command.env_remove("SUDO_UID");
    let out = with_fd9(command, writer.as_raw_fd());
    let seen = datagrams(&reader);
    assert_refused_and_nothing_ran(&out, work.path(), &seen, "service dgram");
    drop(service);
}

/// A TCP reader on the host's loopback at a port the run relays
/// (`--port P`): the agent's connections to its own 127.0.0.1:P reach it.
/// Without `--port P` the same socket is a status channel.
#[test]
fn a_tcp_socket_on_a_relayed_port_is_refused() {
    if !can_run("status_tcp_relayed") {
        return;
    }
    let work = Dir::open_to_all();
    let w = work.path().to_str().unwrap().to_string();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port().to_string();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (mut accepted, _) = listener.accept().expect("accept");
    let marker = format!("touch {w}/marker");
    let relayed: Vec<String> = [
        "run",
        "-q",
        "--write",
        &w,
        "--port",
        &port,
        "--status-fd",
        "9",
        "--",
        "sh",
        "-c",
        &marker,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = run_with_fd9(&relayed, client.as_raw_fd(), work.path());
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(!work.join("marker").exists(), "the agent ran");
    assert!(stderr(&out).contains("--port"), "{}", stderr(&out));
    let plain: Vec<String> = ["run", "-q", "--write", &w, "--status-fd", "9", "--", "true"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = run_with_fd9(&plain, client.as_raw_fd(), work.path());
    drop(client);
    accepted
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut seen = String::new();
    let _ = accepted.read_to_string(&mut seen);
    // The refused run's `refused` line came first.
    let seen: String = seen
        .lines()
        .filter(|l| !l.contains(r#""event":"refused""#))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ran_with_status(&out, &seen, "tcp not relayed");
}
