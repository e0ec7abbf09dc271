//! No mount below a root is the root. The unix policy allows socket names
//! under the writable roots and looks them up through a mirror of each
//! root; a mount that sits below a root without being it (a host bind of
//! a directory holding a daemon's socket, a `--bind` target inside the
//! root) must not be reachable through that mirror, while sockets on the
//! root's own mount, and in a root nested in another, stay reachable.
//! The host's listeners say from the outside whether anything arrived.
//! The mounts these tests make on the host are undone on drop, also when
//! a test fails half-way.

mod common;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use common::*;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A mount the test made on the host, detached on drop.
struct HostMount(PathBuf);

impl HostMount {
    fn bind(source: &Path, target: &Path) -> Self {
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind on the host");
        Self(target.to_path_buf())
    }

    fn tmpfs(target: &Path) -> Self {
        mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0777,size=1m"),
        )
        .expect("tmpfs on the host");
        Self(target.to_path_buf())
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.0, MntFlags::MNT_DETACH) {
            eprintln!("failed to unmount {}: {e}", self.0.display());
        }
    }
}

/// A host listener anyone may connect to, that never blocks on accept.
fn listen(path: &Path) -> UnixListener {
    let listener = UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

/// A directory of the agent's inside `dir`.
fn subdir(dir: &Dir, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir(&path).unwrap();
    chown(&path, NOBODY);
    path
}

const CONNECT: &str = "
import socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
def serve_and_connect(path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen()
    connect(path)
";

#[test]
fn a_host_socket_on_a_mount_below_a_root_is_out_of_reach() {
    if !can_run("unix_submount") {
        return;
    }
    let work = Dir::new();
    let host_dir = Dir::open_to_all();
    let bind_source = Dir::open_to_all();
    let sub = subdir(&work, "sub");
    let bound = subdir(&work, "bound");
    // On the root's own filesystem, hidden by the mount made next.
    let under = listen(&sub.join("under.sock"));
    let foreign = listen(&host_dir.join("host.sock"));
    let by_bind = listen(&bind_source.join("bound.sock"));
    let own = listen(&work.join("own.sock"));
    let _mounted = HostMount::bind(host_dir.path(), &sub);

    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}{CONNECT}
attempt('foreign-mount', lambda: connect('{w}/sub/host.sock'))
attempt('under-the-mount', lambda: connect('{w}/sub/under.sock'))
attempt('bind-target', lambda: connect('{w}/bound/bound.sock'))
attempt('control-root', lambda: connect('{w}/own.sock'))
attempt('control-agent', lambda: serve_and_connect('{w}/agent.sock'))"
    );
    let w_arg = work.path().to_str().unwrap();
    let out = python(
        &[
            "--strict",
            "--write",
            w_arg,
            "--bind",
            bind_source.path().to_str().unwrap(),
            bound.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    // The mirror covers each mount below the root with an empty one.
    expect(&out, "foreign-mount", "ENOENT");
    expect(&out, "under-the-mount", "ENOENT");
    expect(&out, "bind-target", "ENOENT");
    expect(&out, "control-root", "OK");
    expect(&out, "control-agent", "OK");
    assert!(
        foreign.accept().is_err(),
        "the host socket below the root got a connection"
    );
    assert!(
        by_bind.accept().is_err(),
        "the --bind source's socket got a connection"
    );
    assert!(
        under.accept().is_err(),
        "the socket under the mount point got a connection"
    );
    assert!(
        own.accept().is_ok(),
        "the socket on the root's own filesystem was not reached"
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_root_nested_in_another_is_reached_through_its_own_mirror() {
    if !can_run("unix_nested_roots") {
        return;
    }
    let work = Dir::new();
    let host_dir = Dir::open_to_all();
    let inner = subdir(&work, "inner");
    let sub = subdir(&work, "sub");
    // The inner root is a mount of its own below the outer one (the outer
    // root's mirror covers it), the other mount below it is no root.
    let _inner_mount = HostMount::tmpfs(&inner);
    let _foreign_mount = HostMount::bind(host_dir.path(), &sub);
    let in_inner = listen(&inner.join("in.sock"));
    let foreign = listen(&host_dir.join("host.sock"));

    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}{CONNECT}
attempt('inner-root', lambda: connect('{w}/inner/in.sock'))
attempt('inner-root-agent', lambda: serve_and_connect('{w}/inner/agent.sock'))
attempt('outer-root-agent', lambda: serve_and_connect('{w}/agent.sock'))
attempt('foreign-below-outer', lambda: connect('{w}/sub/host.sock'))"
    );
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--write",
            inner.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "inner-root", "OK");
    expect(&out, "inner-root-agent", "OK");
    expect(&out, "outer-root-agent", "OK");
    expect(&out, "foreign-below-outer", "ENOENT");
    assert!(
        in_inner.accept().is_ok(),
        "the socket in the inner root was not reached"
    );
    assert!(
        foreign.accept().is_err(),
        "the host socket below the outer root got a connection"
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_host_socket_in_a_directory_kept_in_the_private_tmp_is_out_of_reach() {
    if !can_run("unix_private_tmp_submount") {
        return;
    }
    // Both under the host's /tmp: the root is attached into the private
    // /tmp read-write, the read allow as a read-only copy of the host's.
    let work = Dir::new();
    let kept = Dir::open_to_all();
    let host = listen(&kept.join("host.sock"));
    let own = listen(&work.join("own.sock"));
    let (w, k) = (work.path().display(), kept.path().display());
    let code = format!(
        "{ATTEMPT}{CONNECT}
attempt('kept-host-socket', lambda: connect('{k}/host.sock'))
attempt('control-root', lambda: connect('{w}/own.sock'))
attempt('control-private-tmp', lambda: serve_and_connect('/tmp/agent.sock'))"
    );
    let out = python(
        &[
            "--strict",
            "--private-tmp",
            "--write",
            work.path().to_str().unwrap(),
            "--read-allow",
            kept.path().to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "kept-host-socket", "ENOENT");
    expect(&out, "control-root", "OK");
    expect(&out, "control-private-tmp", "OK");
    assert!(
        host.accept().is_err(),
        "the host socket kept in the private /tmp got a connection"
    );
    assert!(own.accept().is_ok(), "the root's socket was not reached");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_bind_on_or_above_a_writable_root_is_refused() {
    if !can_run("unix_bind_over_root") {
        return;
    }
    let work = Dir::new();
    let source = Dir::open_to_all();
    let project = subdir(&work, "project");
    let (p, s) = (project.to_str().unwrap(), source.path().to_str().unwrap());
    let w = work.path().to_str().unwrap();
    let cases: [&[&str]; 3] = [
        &["--write", p, "--bind", s, p],
        &["--write", p, "--bind", s, w],
        &["--write", p, "--private-tmp", "--bind", s, "/tmp"],
    ];
    for flags in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        let out = tartaros(&args, work.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{flags:?}: {err}");
        assert!(
            err.contains("would hide the writable root") && err.contains("bind it elsewhere"),
            "{flags:?}: {err}"
        );
    }
}
