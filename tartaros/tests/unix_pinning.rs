//! Pathname unix sockets reached through a symlink the agent planted in a
//! root (class 12.3): the eBPF hook sees the name before the kernel looks it
//! up, so every allowed name is rewritten to the root's mirror, a mount that
//! follows no symlink. These tests bind the host's sockets *after* the agent
//! started (a daemon that starts or restarts later), which no start-time
//! hiding can cover, and assert from the host side that nothing arrived.
//! Each beside a control that must keep working.

mod common;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::Path;

use common::*;

/// Waits (in the agent) for the host to say it bound its sockets.
const WAIT_FOR_HOST: &str = "
import socket, time
def wait_for(path):
    for _ in range(500):
        if os.path.exists(path):
            return
        time.sleep(0.02)
    raise SystemExit('the host never bound its sockets')
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
def send(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b'pwned', path)
";

fn open_to_all(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn symlinks_planted_in_a_root_reach_no_host_socket_bound_after_the_start() {
    if !can_run("unix_symlink_after_start") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::open_to_all();
    // A host socket inside the root, there before the start: granted.
    let granted_path = work.join("granted.sock");
    let granted = UnixListener::bind(&granted_path).unwrap();
    open_to_all(&granted_path);
    granted.set_nonblocking(true).unwrap();
    // A daemon that will restart: its socket exists at the start.
    let restart_path = outside.join("restart.sock");
    drop(UnixListener::bind(&restart_path).unwrap());
    let (w, o) = (work.path().display(), outside.path().display());
    let code = format!(
        "{ATTEMPT}{WAIT_FOR_HOST}
os.symlink('{o}/late.sock', '{w}/planted.sock')
os.symlink('{o}', '{w}/dir')
os.symlink('{o}/restart.sock', '{w}/restart.sock')
os.symlink('{o}/late.dgram', '{w}/planted.dgram')
os.mkdir('{w}/sub')
os.symlink('../planted.sock', '{w}/sub/relative.sock')
open('{w}/ready', 'w').close()
wait_for('{w}/bound')
attempt('file-link', lambda: connect('{w}/planted.sock'))
attempt('dir-link', lambda: connect('{w}/dir/late.sock'))
attempt('restarted-daemon', lambda: connect('{w}/restart.sock'))
attempt('relative-link', lambda: connect('{w}/sub/relative.sock'))
attempt('dgram-link', lambda: send('{w}/planted.dgram'))
attempt('direct', lambda: connect('{o}/late.sock'))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{w}/sub/own.sock')
srv.listen()
attempt('control-own', lambda: connect('{w}/sub/own.sock'))
attempt('control-own-dot', lambda: connect('{w}/./sub/own.sock'))
attempt('control-own-nul-padded', lambda: connect(b'{w}/sub/own.sock' + bytes(20)))
dg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
dg.bind('{w}/own.dgram')
attempt('control-own-dgram', lambda: send('{w}/own.dgram'))
attempt('control-granted', lambda: connect('{w}/granted.sock'))"
    );
    let w_arg = work.path().to_str().unwrap().to_string();
    let child = std::process::Command::new(bin())
        .args([
            "run", "--strict", "--write", &w_arg, "--", "python3", "-c", &code,
        ])
        .current_dir(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(20, || work.join("ready").exists()),
        "the agent did not start"
    );
    let late = UnixListener::bind(outside.join("late.sock")).unwrap();
    open_to_all(&outside.join("late.sock"));
    late.set_nonblocking(true).unwrap();
    std::fs::remove_file(&restart_path).unwrap();
    let restarted = UnixListener::bind(&restart_path).unwrap();
    open_to_all(&restart_path);
    restarted.set_nonblocking(true).unwrap();
    let dgram = UnixDatagram::bind(outside.join("late.dgram")).unwrap();
    open_to_all(&outside.join("late.dgram"));
    dgram.set_nonblocking(true).unwrap();
    std::fs::write(work.join("bound"), "").unwrap();
    let out = child.wait_with_output().unwrap();

    // The lookup through the mirror stops at the planted link.
    expect(&out, "file-link", "ELOOP");
    expect(&out, "dir-link", "ELOOP");
    expect(&out, "restarted-daemon", "ELOOP");
    expect(&out, "relative-link", "ELOOP");
    expect(&out, "dgram-link", "ELOOP");
    expect(&out, "direct", "EPERM");
    expect(&out, "control-own", "OK");
    expect(&out, "control-own-dot", "OK");
    expect(&out, "control-own-nul-padded", "OK");
    expect(&out, "control-own-dgram", "OK");
    expect(&out, "control-granted", "OK");
    assert!(
        late.accept().is_err(),
        "the late host socket got a connection"
    );
    assert!(
        restarted.accept().is_err(),
        "the restarted daemon got a connection"
    );
    let mut buf = [0u8; 16];
    assert!(dgram.recv(&mut buf).is_err(), "the host got a datagram");
    assert!(
        granted.accept().is_ok(),
        "the granted socket in the root was not reached"
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_name_that_cannot_be_pinned_is_refused_and_one_that_can_works() {
    if !can_run("unix_pin_length") {
        return;
    }
    let work = Dir::new();
    // "/tmp/" is 5 bytes and its mirror prefix "/dev/.u/N/" 10: a name of
    // 104 bytes there cannot be rewritten in 108, one of 103 just can.
    let code = format!(
        "{ATTEMPT}{WAIT_FOR_HOST}
def serve(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen()
    return s
longest = '/tmp/' + 'a' * 99
fits = '/tmp/' + 'b' * 98
a, b = serve(longest), serve(fits)
attempt('too-long', lambda: connect(longest))
attempt('control-fits', lambda: connect(fits))"
    );
    let out = python(
        &[
            "--strict",
            "--private-tmp",
            "--write",
            work.path().to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "too-long", "EPERM");
    expect(&out, "control-fits", "OK");
}

#[test]
fn the_mirror_grants_nothing_the_root_does_not() {
    if !can_run("unix_mirror_grants_nothing") {
        return;
    }
    let work = Dir::new();
    std::fs::write(work.join("secret"), "s3cr3t").unwrap();
    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}{WAIT_FOR_HOST}
import glob
mirror = [m for m in glob.glob('/dev/.u/*') if os.path.exists(m + '/secret')][0]
attempt('write-through-mirror', lambda: open(mirror + '/new', 'w'))
attempt('chmod-through-mirror', lambda: os.chmod(mirror + '/secret', 0o777))
attempt('denied-read-through-mirror', lambda: open(mirror + '/secret').read())
attempt('bind-in-mirror', lambda: socket.socket(socket.AF_UNIX).bind(mirror + '/x.sock'))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{w}/own.sock')
srv.listen()
attempt('mirror-by-its-own-name', lambda: connect(mirror + '/own.sock'))
attempt('control-write-in-root', lambda: open('{w}/new', 'w'))"
    );
    let secret = work.join("secret");
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--read-deny",
            secret.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "write-through-mirror", "EROFS");
    expect(&out, "chmod-through-mirror", "EROFS");
    // The read deny inside the root is part of the mirror (made last).
    expect(&out, "denied-read-through-mirror", "EACCES");
    expect(&out, "bind-in-mirror", "EROFS");
    expect(&out, "mirror-by-its-own-name", "EPERM");
    expect(&out, "control-write-in-root", "OK");
}

#[test]
fn the_agents_own_socket_in_a_fresh_tmpfs_works_and_a_planted_link_there_does_not() {
    if !can_run("unix_tmpfs") {
        return;
    }
    let work = Dir::new();
    let scratch = work.join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let outside = Dir::open_to_all();
    let host_path = outside.join("host.sock");
    let host = UnixListener::bind(&host_path).unwrap();
    open_to_all(&host_path);
    host.set_nonblocking(true).unwrap();
    let (s, h) = (scratch.display(), host_path.display());
    let code = format!(
        "{ATTEMPT}{WAIT_FOR_HOST}
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{s}/own.sock')
srv.listen()
attempt('control-own-in-tmpfs', lambda: connect('{s}/own.sock'))
os.symlink('{h}', '{s}/planted.sock')
attempt('planted-in-tmpfs', lambda: connect('{s}/planted.sock'))"
    );
    let out = python(
        &["--strict", "--tmpfs", scratch.to_str().unwrap()],
        work.path(),
        &code,
    );
    expect(&out, "control-own-in-tmpfs", "OK");
    expect(&out, "planted-in-tmpfs", "ELOOP");
    assert!(host.accept().is_err(), "the host socket got a connection");
}
