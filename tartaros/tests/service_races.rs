//! The root service against a caller who swaps a directory of its own for
//! a symlink into a root-only directory while the service works on its
//! paths (session 13's review): what the service binds must be what it
//! checked the caller could read. Runs many attempts against a flipper and
//! asserts from the host side that nothing root-only was ever shown.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use common::*;
use harness::Service;

const CAROL: u32 = 47_000 + 141;

/// Swaps `w/d` (a directory) and `w/dl` (a symlink to `target`) with
/// `RENAME_EXCHANGE` for `secs` seconds, as `uid`.
const FLIP: &str = r#"
import ctypes, os, sys, time
w, target, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs(w + "/d", exist_ok=True)
os.symlink(target, w + "/dl")
a, b = (w + "/d").encode(), (w + "/dl").encode()
end = time.time() + secs
while time.time() < end:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(1)
"#;

/// A directory only root may enter (like /root or another user's home).
fn root_only_dir() -> Dir {
    let dir = Dir::new();
    chown(dir.path(), 0);
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o700)).unwrap();
    dir
}

#[test]
fn a_bind_source_swapped_for_a_symlink_never_shows_a_root_only_file() {
    if !can_run("bind_swap") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CAROL);
    let private = root_only_dir();
    let public = private.join("pub");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(public.join("secret.txt"), "root-only-marker\n").unwrap();
    let w = work.path().to_str().unwrap();
    let mut flipper = Command::new("setpriv")
        .args(["--reuid", &CAROL.to_string(), "--regid", &CAROL.to_string()])
        .args(["--clear-groups", "/usr/bin/python3", "-c", FLIP, w])
        .arg(&public)
        .arg("15")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the flipper");
    let source = work.join("d");
    assert!(
        eventually(5, || work.join("dl").exists()),
        "the flipper did not start"
    );
    let mut ran = 0;
    for _ in 0..300 {
        let out = service.run(
            CAROL,
            &[
                "run",
                "-q",
                "--bind",
                source.to_str().unwrap(),
                "/mnt",
                "--",
                "cat",
                "/mnt/secret.txt",
            ],
            work.path(),
        );
        assert!(
            !stdout(&out).contains("root-only-marker"),
            "the caller read a root-only file through a bind"
        );
        ran += usize::from(out.status.code().is_some());
    }
    let _ = flipper.kill();
    let _ = flipper.wait();
    assert_eq!(ran, 300, "every attempt ended");
}

#[test]
fn a_sandboxed_agent_cannot_ask_a_service_started_after_its_run_for_more() {
    if !can_run("sandboxed_caller") {
        return;
    }
    let home = owned_dir(CAROL);
    let escaped = home.join("escaped");
    let socket_dir = Dir::new();
    std::fs::set_permissions(socket_dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let socket = socket_dir.join("tartaros.sock");
    // On the user-namespace path (no service when it starts), only the
    // sockets listening at the start are hidden: this one comes later.
    let inner = format!(
        "sleep 2; TARTAROS_SERVICE={} {} run -q --write {} -- touch {}; echo inner=$?",
        socket.display(),
        bin(),
        home.path().display(),
        escaped.display()
    );
    let outer = tartaros_as(CAROL, &["run", "-q", "--", "sh", "-c", &inner], home.path())
        .env("TARTAROS_SERVICE", home.join("none.sock"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the outer run");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let service = Service::start_in(socket_dir);
    let out = outer.wait_with_output().unwrap();
    drop(service);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !escaped.exists(),
        "the inner run wrote outside the sandbox: {text}"
    );
    assert!(
        text.contains("inside a sandbox") || text.contains("inside a TartarOS sandbox"),
        "{text}"
    );
}

#[test]
fn a_run_through_the_service_that_uses_none_of_its_programs_still_starts() {
    if !can_run("service_unregistered") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CAROL);
    // The service's programs sit above every run's cgroup and refuse the
    // sockets of a run they do not know: a run with neither the connect
    // filter nor the unix policy must still be registered, or its init
    // cannot even bring up loopback.
    let out = service.run(
        CAROL,
        &["run", "-q", "--deny-unix", "--", "true"],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let long = work.join(&"r".repeat(100));
    std::fs::create_dir(&long).unwrap();
    chown(&long, CAROL);
    let out = service.run(
        CAROL,
        &["run", "--write", long.to_str().unwrap(), "--", "true"],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("too long for the unix socket policy"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_broker_ca_file_is_read_with_the_callers_access_and_never_quoted() {
    if !can_run("service_ca_file") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CAROL);
    let private = root_only_dir();
    let secret = private.join("secret.pem");
    std::fs::write(&secret, "-----BEGIN password=hunter2\n").unwrap();
    let answer = |ca: &std::path::Path| {
        let config = work.join("policy.toml");
        let text = format!(
            "[broker]\nport = 18977\nauth_header = \"X-Broker-Auth\"\ntoken_env = \"TT_TOKEN\"\n\
             allowed_hosts = [\"upstream.test\"]\nca_file = \"{}\"\n\n\
             [[broker.capability]]\nname = \"api\"\nupstream = \"upstream.test\"\n\
             header = \"Authorization\"\nvalue_env = \"TT_KEY\"\nmethods = [\"GET\"]\npath_prefix = \"/v1/\"\n",
            ca.display()
        );
        std::fs::write(&config, text).unwrap();
        chown(&config, CAROL);
        let out = service
            .command(
                CAROL,
                &[
                    "run",
                    "-q",
                    "--config",
                    config.to_str().unwrap(),
                    "--",
                    "true",
                ],
                work.path(),
            )
            .env("TT_TOKEN", "agent-token-0123456789")
            .env("TT_KEY", "Bearer k")
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0));
        stderr(&out)
    };
    let present = answer(&secret);
    assert!(!present.contains("hunter2"), "{present}");
    let absent = answer(&private.join("absent.pem"));
    assert_eq!(
        present.replace("secret.pem", "X"),
        absent.replace("absent.pem", "X"),
        "the answer tells whether a root-only file exists"
    );
}
