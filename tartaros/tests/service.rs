//! `tartaros service`: the root service runs an ordinary user's sandbox
//! with the whole feature set and the caller's identity, never with more
//! than the caller could do. Each test starts its own service on a socket
//! of its own, runs `tartaros run` as uids with no passwd entry (nothing to
//! create or remove on the host), and checks from the host side.

mod common;
#[path = "support/service.rs"]
mod harness;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use harness::Service;

const ALICE: u32 = 47_000 + 131;
const BOB: u32 = 47_000 + 132;

fn records(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_ordinary_users_run_through_the_service_gets_the_whole_product() {
    if !can_run("service_run") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let outside = Dir::open_to_all();
    let (granted, granted_hits) = host_listener(b"host-ok");
    let (other, other_hits) = host_listener(b"leak");
    let (upstream, upstream_hits) = host_listener(
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nupstream-ok",
    );
    let config = work.join("policy.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallow_internal = true\nhttp_ports = [{upstream}]\nconnect_ports = [{upstream}]\n"
        ),
    )
    .unwrap();
    chown(&config, ALICE);
    let log = work.join("effects.jsonl");
    let code = format!(
        "{ATTEMPT}
import socket, urllib.request, urllib.error
os.environ['no_proxy'] = os.environ['NO_PROXY'] = ''
def talk(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    s.sendall(b'hi')
    if s.recv(100) != b'host-ok':
        raise OSError(errno.EIO, 'wrong answer')
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return str(e.code)
print('id', os.getuid(), os.getgid())
attempt('inside', lambda: open('{w}/made', 'w').write('x'))
attempt('outside', lambda: open('{o}/escape', 'w'))
attempt('granted', lambda: talk({granted}))
attempt('other', lambda: talk({other}))
print('allowed', fetch('http://localhost:{upstream}/'))
print('denied', fetch('http://not-allowed.invalid:{upstream}/'))",
        w = work.path().display(),
        o = outside.path().display(),
    );
    let out = service.run(
        ALICE,
        &[
            "run",
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--port",
            &granted.to_string(),
            "--allow-domain",
            "localhost",
            "--config",
            config.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "id", &format!("{ALICE} {ALICE}"));
    expect(&out, "inside", "OK");
    assert!(
        ["EROFS", "EACCES"]
            .iter()
            .any(|e| stdout(&out).contains(&format!("outside {e}"))),
        "{}",
        stdout(&out)
    );
    expect(&out, "granted", "OK");
    expect(&out, "allowed", "upstream-ok");
    expect(&out, "denied", "403");
    assert!(!outside.join("escape").exists());
    assert_eq!(granted_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        other_hits.load(Ordering::SeqCst),
        0,
        "host loopback reached"
    );
    assert_eq!(upstream_hits.load(Ordering::SeqCst), 1);
    use std::os::unix::fs::MetadataExt;
    let made = std::fs::metadata(work.join("made")).unwrap();
    assert_eq!(made.uid(), ALICE, "the agent's files belong to the caller");

    // Strict, through the service: every guarantee installed, and the
    // capture saw the agent.
    let log_meta = std::fs::metadata(&log).unwrap();
    assert_eq!(log_meta.uid(), ALICE, "the log belongs to the caller");
    assert_eq!(
        log_meta.mode() & 0o077,
        0,
        "the log is private to the caller"
    );
    let lines = records(&log);
    assert!(lines[0].contains("\"degraded\":[]"), "{}", lines[0]);
    assert!(lines[0].contains("\"ebpf-capture\""), "{}", lines[0]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"kind\":\"exec\"") && l.contains("python3")),
        "no exec record"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"kind\":\"connect\"") && l.contains(&other.to_string())),
        "no connect record"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"kind\":\"proxy\"") && l.contains("\"decision\":\"allowed\"")),
        "no proxy record"
    );
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));

    // Another user cannot read it.
    let peek = Command::new("setpriv")
        .args([
            &format!("--reuid={BOB}"),
            &format!("--regid={BOB}"),
            "--clear-groups",
            "cat",
        ])
        .arg(&log)
        .output()
        .unwrap();
    assert!(!peek.status.success(), "another user read the log");
    drop(service);
}

#[test]
fn the_service_never_does_more_than_the_caller_could() {
    if !can_run("service_limits") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    // Root's own directory and a root-only file with a recognizable line.
    let private = Dir::new();
    chown(private.path(), 0);
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let secret = private.join("secret.toml");
    std::fs::write(&secret, "root-only-marker = [\n").unwrap();
    let private_log = private.join("log.jsonl").to_string_lossy().into_owned();
    let private_made = private.join("made").to_string_lossy().into_owned();
    // A world-readable file in a root-only directory: the caller cannot
    // reach it, and a bind must not show it.
    let hidden_dir = private.join("inner");
    std::fs::create_dir(&hidden_dir).unwrap();
    std::fs::write(hidden_dir.join("seen.txt"), "root-only-marker\n").unwrap();
    std::fs::set_permissions(
        &hidden_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bind_target = work.join("view");
    std::fs::create_dir(&bind_target).unwrap();
    let bind_arg = format!("{}", hidden_dir.display());
    let bind_out = service.run(
        ALICE,
        &[
            "run",
            "--bind",
            &bind_arg,
            bind_target.to_str().unwrap(),
            "--",
            "cat",
            &format!("{}/seen.txt", bind_target.display()),
        ],
        work.path(),
    );
    assert_eq!(bind_out.status.code(), Some(78), "{}", stderr(&bind_out));
    assert!(!stdout(&bind_out).contains("root-only-marker"));
    let cases: [&[&str]; 5] = [
        &["run", "--log", &private_log, "--", "true"],
        &["run", "--config", secret.to_str().unwrap(), "--", "true"],
        &["run", "--user", "root", "--", "id"],
        &[
            "run",
            "--write",
            private.path().to_str().unwrap(),
            "--write-deny",
            &private_made,
            "--materialize",
            "--",
            "true",
        ],
        &[
            "run",
            "--write",
            private.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("echo x > {}/written", private.path().display()),
        ],
    ];
    for args in cases {
        let out = service.run(ALICE, args, work.path());
        assert_ne!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("root-only-marker"),
            "a root-only file leaked: {}",
            stderr(&out)
        );
    }
    let left: Vec<_> = std::fs::read_dir(private.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(
        left,
        vec![
            std::ffi::OsString::from("inner"),
            std::ffi::OsString::from("secret.toml")
        ]
    );
    drop(service);
}

/// Sends raw bytes as a client would and returns what the worker answered.
fn raw_request(socket: &Path, bytes: &[u8], with_stdio: bool) -> Vec<u8> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let conn = UnixStream::connect(socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    if with_stdio && bytes.len() >= 4 {
        let null = std::fs::File::open("/dev/null").unwrap();
        let fds = [null.as_raw_fd(); 3];
        let rights = [ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(&bytes[..4])];
        sendmsg::<()>(conn.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None).unwrap();
        let _ = (&conn).write_all(&bytes[4..]);
    } else {
        let _ = (&conn).write_all(bytes);
    }
    let mut answer = Vec::new();
    let _ = (&conn).read_to_end(&mut answer);
    answer
}

fn framed(json: &str) -> Vec<u8> {
    let mut out = (json.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out
}

#[test]
fn hostile_requests_are_refused_and_the_service_keeps_serving() {
    if !can_run("service_hostile") {
        return;
    }
    let service = Service::start();
    let refused = |answer: &[u8]| String::from_utf8_lossy(answer).contains("\"refused\"");
    // Garbage, with and without descriptors.
    assert!(refused(&raw_request(
        &service.socket,
        b"GET / HTTP/1.0\r\n\r\n",
        false
    )));
    assert!(refused(&raw_request(
        &service.socket,
        &framed("not json"),
        true
    )));
    // A huge length.
    assert!(refused(&raw_request(
        &service.socket,
        &u32::MAX.to_le_bytes(),
        true
    )));
    // Half a request, then silence: refused after the timeout.
    let mut half = framed(r#"{"version":1,"args":["--","true"],"cwd":"/","env":[]}"#);
    half.truncate(20);
    assert!(refused(&raw_request(&service.socket, &half, true)));
    // A claimed identity is not part of the protocol.
    let claim = framed(r#"{"version":1,"args":["--","id"],"cwd":"/","env":[],"uid":0}"#);
    assert!(refused(&raw_request(&service.socket, &claim, true)));
    // And a real run still works.
    let work = owned_dir(ALICE);
    let out = service.run(ALICE, &["run", "--", "sh", "-c", "id -u"], work.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ALICE.to_string());
    drop(service);
}

fn sandbox_of(marker: &str) -> bool {
    !processes_with(marker).is_empty()
}

#[test]
fn killing_the_caller_or_the_service_ends_the_sandbox_and_leaves_an_unsealed_log() {
    if !can_run("service_kill") {
        return;
    }
    let service = Service::start();
    for victim in ["caller", "service"] {
        let work = owned_dir(ALICE);
        let log = work.join("effects.jsonl");
        let marker = format!("sleep 77{}", victim.len());
        let mut caller = service.spawn_quiet(
            ALICE,
            &[
                "run",
                "--log",
                log.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                &format!("{marker}; true"),
            ],
            work.path(),
        );
        assert!(
            eventually(10, || sandbox_of(&marker)),
            "{victim}: no sandbox"
        );
        if victim == "caller" {
            let mut child = caller.take();
            child.kill().unwrap();
            child.wait().unwrap();
        } else {
            let pid = service.pid;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
        }
        assert!(
            eventually(10, || !sandbox_of(&marker)),
            "{victim}: the sandbox outlived its supervision"
        );
        let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
        assert_eq!(
            verify.status.code(),
            Some(2),
            "{victim}: {}",
            stdout(&verify)
        );
    }
    drop(service);
}

#[test]
fn the_status_channel_works_through_the_service() {
    if !can_run("service_status") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let status = work.join("status.jsonl");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec setpriv --reuid={ALICE} --regid={ALICE} --clear-groups {} run --status-fd 3 --label call-7 -- sh -c 'exit 78' 3>{}",
            bin(),
            status.display()
        ))
        .current_dir(work.path())
        .env("TARTAROS_SERVICE", &service.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let lines = std::fs::read_to_string(&status).unwrap();
    assert!(
        lines.contains("\"event\":\"started\"") && lines.contains("call-7"),
        "{lines}"
    );
    assert!(
        lines.contains("\"event\":\"exited\"") && lines.contains("\"code\":78"),
        "{lines}"
    );
    assert!(!lines.contains("\"refused\""), "{lines}");
    drop(service);
}
