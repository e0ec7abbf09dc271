//! Adversarial round 11: netlink protocols that reach the host. The
//! kernel broadcasts each device's uevent (`kobject_uevent`) to every
//! network namespace the initial user namespace owns, and a root run's
//! namespace is one: an agent that bound `NETLINK_KOBJECT_UEVENT` heard
//! every device the host added, removed or changed (a USB key, a disk, a
//! network card). codex's sandbox tests refuse `AF_NETLINK` outright;
//! here only the protocols spoken for the run's own namespace stay
//! (route, sock_diag, generic). The host makes the uevents itself (a
//! `change` of its /dev/null, which alters nothing) once the agent says,
//! through a file in its root, that it listens.

mod common;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const LISTEN: &str = r#"
import os, socket, sys
root = sys.argv[1]
def opened(label, protocol, kind=socket.SOCK_RAW):
    try:
        socket.socket(socket.AF_NETLINK, kind, protocol).close()
        print(label, 'OK')
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
import errno
opened('route', 0)
opened('sock-diag', 4)
opened('generic', 16)
opened('audit', 9)
opened('connector', 11, socket.SOCK_DGRAM)
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)
    s.bind((0, 1))
    s.settimeout(5)
    print('uevent-socket OK')
except OSError as e:
    s = None
    print('uevent-socket', errno.errorcode.get(e.errno, e.errno))
sys.stdout.flush()
open(os.path.join(root, 'listening'), 'w').close()
if s is not None:
    try:
        print('heard', s.recv(4096).split(b'\0')[0].decode())
    except OSError as e:
        print('heard nothing', e)
"#;

const UEVENT: &str = "/sys/devices/virtual/mem/null/uevent";

#[test]
fn a_root_runs_agent_hears_no_uevent_of_the_host() {
    if !can_run("a_root_runs_agent_hears_no_uevent_of_the_host") {
        return;
    }
    if !Path::new(UEVENT).exists() {
        skip(
            "a_root_runs_agent_hears_no_uevent_of_the_host",
            "no /dev/null uevent file",
        );
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let mut run = std::process::Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", LISTEN, w])
        .current_dir(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tartaros");
    let listening = work.join("listening");
    assert!(
        eventually(60, || listening.exists()
            || run.try_wait().unwrap().is_some()),
        "the agent never got as far as listening"
    );
    // Uevents until the run ends: the agent waits 5 s for one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while run.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::fs::write(UEVENT, "change").expect("a change uevent on the host");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run.wait_with_output().expect("wait for tartaros");
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("heard change@"),
        "the agent heard the host's uevent:\n{}",
        stdout(&out)
    );
    expect(&out, "uevent-socket", "EPERM");
    expect(&out, "audit", "EPERM");
    expect(&out, "connector", "EPERM");
    // What getifaddrs, ip and ss speak, for the run's own namespace.
    expect(&out, "route", "OK");
    expect(&out, "sock-diag", "OK");
    expect(&out, "generic", "OK");
}
