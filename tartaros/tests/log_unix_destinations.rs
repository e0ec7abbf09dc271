//! A unix `connect` record names the socket the kernel connected to, not
//! the agent's sockaddr as read at `sys_enter`: a second thread can rewrite
//! the path between that read and the kernel's copy, so a record made from
//! the agent's memory can name one socket while the connection went to
//! another. The host counts each listener's accepts; the log's records must
//! say the same. Needs root and gcc (fails under CI=true without).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::logged::*;
use common::*;
use serde_json::Value;

/// argv[1]: a socket path, argv[2]: the offset of a byte in it; the
/// flipper thread switches that byte to `b` and back (one byte store, so
/// every path the kernel can copy is one of the two) while the main thread
/// connects through it. Prints how many connects failed.
const AGENT: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static struct sockaddr_un addr;
static volatile int done;
static volatile char *flip;

static void *flipper(void *arg) {
    char orig = *flip;
    (void)arg;
    while (!done) {
        *flip = 'b';
        *flip = orig;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || strlen(argv[1]) >= sizeof addr.sun_path) return 10;
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, argv[1]);
    flip = (volatile char *)addr.sun_path + atoi(argv[2]);
    pthread_t t;
    if (pthread_create(&t, 0, flipper, 0)) return 11;
    int failed = 0;
    for (int i = 0; i < 3000; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0) return 12;
        if (connect(fd, (void *)&addr, sizeof addr)) failed++;
        close(fd);
    }
    done = 1;
    pthread_join(t, 0);
    dprintf(1, "%d\n", failed);
    return 0;
}
"#;

/// Accepts on `path` until `stop`, then drains the backlog; the count.
fn listen_counting(path: &std::path::Path, stop: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let listener = UnixListener::bind(path).expect("bind a host socket");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        loop {
            match listener.accept() {
                Ok(_) => {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) if stop.load(Ordering::SeqCst) => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    });
    count
}

fn unix_connects(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "connect" && field(r, "family") == Some("unix"))
        .collect()
}

#[test]
fn a_unix_connect_record_names_the_socket_the_kernel_connected_to() {
    if !usable("unix_destinations") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (a, b) = (root.join("a.sock"), root.join("b.sock"));
    let stop = Arc::new(AtomicBool::new(false));
    let (at_a, at_b) = (
        listen_counting(&a, stop.clone()),
        listen_counting(&b, stop.clone()),
    );
    let agent = compile(&bin, "agent", AGENT);
    // The `a` of `a.sock`.
    let flip_at = (a.as_os_str().len() - 6).to_string();
    let (out, records) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), a.to_str().unwrap(), &flip_at],
    );
    // The agent has exited: every connection it made is in a backlog.
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "0", "some connects failed");
    let (at_a, at_b) = (at_a.load(Ordering::SeqCst), at_b.load(Ordering::SeqCst));
    assert_eq!(at_a + at_b, 3000, "the host accepted {at_a} + {at_b}");
    let connects = unix_connects(&records);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let naming = |p: &str| {
        connects
            .iter()
            .filter(|r| allowed(r) && field(r, "path") == Some(p))
            .count()
    };
    let strays: Vec<_> = connects
        .iter()
        .filter(|r| !matches!(field(r, "path"), Some(p) if p == a || p == b))
        .collect();
    assert!(strays.is_empty(), "records name no listener: {strays:#?}");
    // Every allowed one names the kernel's copy (which agrees with the
    // agent's memory unless the race was won).
    assert!(
        connects
            .iter()
            .all(|r| !allowed(r) || field(r, "addr_source") == Some("kernel")),
        "{connects:#?}"
    );
    let mislabelled: Vec<_> = connects
        .iter()
        .filter(|r| r["target"].get("claimed_path").is_some())
        .take(3)
        .collect();
    assert_eq!(
        (naming(a), naming(b)),
        (at_a, at_b),
        "records of connects to a.sock and b.sock do not match the host's accepts \
         (records that say the agent claimed another path: {mislabelled:#?})"
    );
}

/// The same race between a name in the root and its twin outside: the
/// outside listener accepts nothing, every allowed record names the root's
/// socket (as many as it accepted), and every refusal the outside one, the
/// name the kernel refused.
#[test]
fn a_refused_unix_connect_record_names_the_path_the_kernel_refused() {
    if !usable("unix_refused_destinations") {
        return;
    }
    let (base, bin, logs) = (Dir::open_to_all(), Dir::open_to_all(), Dir::new());
    let root = Dir {
        dir: tempfile::Builder::new()
            .prefix("a")
            .tempdir_in(base.path())
            .expect("tempdir"),
    };
    chown(root.path(), NOBODY);
    let name = root.path().file_name().unwrap().to_str().unwrap();
    let outside = base.join(&format!("b{}", &name[1..]));
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (a, b) = (root.join("s.sock"), outside.join("s.sock"));
    let stop = Arc::new(AtomicBool::new(false));
    let (at_a, at_b) = (
        listen_counting(&a, stop.clone()),
        listen_counting(&b, stop.clone()),
    );
    let agent = compile(&bin, "agent", AGENT);
    // The `a` of the root's name.
    let flip_at = (base.path().as_os_str().len() + 1).to_string();
    let (out, records) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), a.to_str().unwrap(), &flip_at],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let (at_a, at_b) = (at_a.load(Ordering::SeqCst), at_b.load(Ordering::SeqCst));
    assert_eq!(at_b, 0, "a connection reached the socket outside the root");
    let connects = unix_connects(&records);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let wrong: Vec<_> = connects
        .iter()
        .filter(|r| field(r, "path") != Some(if allowed(r) { a } else { b }))
        .take(3)
        .collect();
    assert!(
        wrong.is_empty(),
        "records name another path than the kernel connected to or refused: {wrong:#?}"
    );
    let allowed_count = connects.iter().filter(|r| allowed(r)).count();
    assert_eq!(allowed_count, at_a, "{at_a} accepts in the root");
    assert!(
        connects
            .iter()
            .all(|r| field(r, "addr_source") == Some("kernel")),
        "{connects:#?}"
    );
}
