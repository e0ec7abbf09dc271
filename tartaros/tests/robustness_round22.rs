//! Adversarial round 22: starts that failed for no good reason — many
//! `--port` grants, a writable root that is a file, a launcher near its
//! process limit.

mod common;
use common::*;

/// 64 `--port` grants (128 listeners) start, and the last one reaches its
/// host port: the listeners no longer travel in a single SCM_RIGHTS message
/// (33 ports failed with ENOBUFS). Loopback only.
#[test]
fn sixty_four_ports_start_and_the_last_one_works() {
    if !can_run("sixty_four_ports_start_and_the_last_one_works") {
        return;
    }
    let work = Dir::new();
    // Held open so no other process takes them while the run lasts; only
    // the last is ever connected to.
    let held: Vec<std::net::TcpListener> = (0..63)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let (last, hits) = host_listener(b"hello from port 64");
    let mut ports: Vec<String> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port().to_string())
        .collect();
    ports.push(last.to_string());
    let mut flags: Vec<&str> = Vec::new();
    for port in &ports {
        flags.extend_from_slice(&["--port", port]);
    }
    let code = format!(
        "{ATTEMPT}
import socket
def fetch():
    s = socket.create_connection(('127.0.0.1', {last}), timeout=5)
    s.sendall(b'hi')
    if s.recv(100) != b'hello from port 64':
        raise OSError(errno.EIO, 'wrong answer')
attempt('last', fetch)"
    );
    let out = python(&flags, work.path(), &code);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "last", "OK");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// `--write FILE` without `--deny-unix` starts (the unix policy's mirror
/// skips a root that is a file), and the agent may write that file and
/// nothing else beside it.
#[test]
fn a_writable_root_that_is_a_file_starts_and_grants_that_file_alone() {
    if !can_run("a_writable_root_that_is_a_file_starts_and_grants_that_file_alone") {
        return;
    }
    let work = Dir::open_to_all();
    let notes = work.file("notes.txt", "before\n");
    let other = work.file("other.txt", "untouched\n");
    let (n, o, d) = (
        notes.to_str().unwrap(),
        other.to_str().unwrap(),
        work.path().to_str().unwrap(),
    );
    let code = format!(
        "{ATTEMPT}
def write(path):
    with open(path, 'w') as f:
        f.write('after\\n')
attempt('notes', lambda: write('{n}'))
attempt('other', lambda: write('{o}'))
attempt('new', lambda: write('{d}/new.txt'))
attempt('remove', lambda: os.unlink('{n}'))"
    );
    let out = python(&["--write", n], work.path(), &code);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "notes", "OK");
    expect(&out, "other", "EROFS");
    expect(&out, "new", "EROFS");
    expect(&out, "remove", "EROFS");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "after\n");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "untouched\n");
    assert!(!work.path().join("new.txt").exists());
}
