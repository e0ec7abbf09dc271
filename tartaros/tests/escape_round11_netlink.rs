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
#[path = "support/service.rs"]
mod support;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use support::Service;

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

/// Runs `command` (`tartaros`, its `run` arguments to come) with `work`
/// writable, making uevents on the host while the agent listens; returns
/// what the agent printed.
fn listen_for_host_uevents(mut command: std::process::Command, work: &Dir) -> std::process::Output {
    let w = work.path().to_str().unwrap();
    let mut run = command
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
    out
}

fn assert_heard_nothing(out: &std::process::Output) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    assert!(
        !stdout(out).contains("heard change@"),
        "the agent heard the host's uevent:\n{}",
        stdout(out)
    );
    expect(out, "uevent-socket", "EPERM");
    expect(out, "audit", "EPERM");
    expect(out, "connector", "EPERM");
    // What getifaddrs, ip and ss speak, for the run's own namespace.
    expect(out, "route", "OK");
    expect(out, "sock-diag", "OK");
    expect(out, "generic", "OK");
}

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
    let out = listen_for_host_uevents(std::process::Command::new(bin()), &work);
    assert_heard_nothing(&out);
}

/// A service run's agent is the caller in the initial user namespace, so
/// its network namespace hears the host's uevents as a root run's does.
#[test]
fn a_service_runs_agent_hears_no_uevent_of_the_host() {
    if !can_run("a_service_runs_agent_hears_no_uevent_of_the_host") {
        return;
    }
    if !Path::new(UEVENT).exists() {
        skip(
            "a_service_runs_agent_hears_no_uevent_of_the_host",
            "no /dev/null uevent file",
        );
        return;
    }
    let service = Service::start();
    let work = owned_dir(4396);
    let mut command = service.command(4396, &[], work.path());
    command.env_remove("SUDO_UID");
    let out = listen_for_host_uevents(command, &work);
    assert_heard_nothing(&out);
}
