//! Adversarial round 13, the service: the root worker took the caller's
//! whole environment as its own, and glibc reads some of it when root
//! resolves a name for the proxy. `HOSTALIASES=/root-only/file` made the
//! root worker open that file (and send a line of it as a DNS query) on
//! the agent's first request through the proxy (3 of 3 runs).
//!
//! The root process never opens the file (the agent's environment is the
//! caller's, as before). Seen from the host: an inotify watch on the
//! file. Needs root.

mod common;
#[path = "support/service.rs"]
mod harness;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use common::*;
use harness::Service;

const ALICE: u32 = 47_000 + 171;

/// The number of opens of `path` an inotify watch sees while `f` runs.
fn opens_during(path: &std::path::Path, f: impl FnOnce()) -> usize {
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: plain syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        assert!(fd >= 0, "inotify_init1");
        assert!(libc::inotify_add_watch(fd, name.as_ptr(), libc::IN_OPEN) >= 0);
        f();
        let mut buf = [0u8; 4096];
        let mut opens = 0;
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            // Each event is a 16-byte header (no name: the watch is the file).
            opens += n as usize / std::mem::size_of::<libc::inotify_event>();
        }
        libc::close(fd);
        opens
    }
}

#[test]
fn the_root_worker_takes_no_resolver_variable_of_the_caller() {
    if !can_run("service_round13_env") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let secret_dir = tempfile::tempdir().unwrap();
    let aliases = secret_dir.path().join("root-only");
    std::fs::write(&aliases, "foo root-secret.invalid\n").unwrap();
    std::fs::set_permissions(&aliases, std::fs::Permissions::from_mode(0o600)).unwrap();
    let code = "import os, urllib.request\n\
        try:\n    urllib.request.urlopen('http://foo/', timeout=5)\n\
        except Exception as e:\n    print('fetch', type(e).__name__)\n";
    let mut out = None;
    let opens = opens_during(&aliases, || {
        let mut command = service.command(
            ALICE,
            &[
                "run",
                "--write",
                work.path().to_str().unwrap(),
                "--allow-domain",
                "foo",
                "--",
                "python3",
                "-c",
                code,
            ],
            work.path(),
        );
        command.env("HOSTALIASES", &aliases);
        out = Some(command.output().expect("setpriv"));
    });
    let out = out.unwrap();
    assert!(stdout(&out).contains("fetch "), "{}", stdout(&out));
    assert_eq!(opens, 0, "root opened the caller's HOSTALIASES file");
}
