//! Adversarial round 14 on the standard streams, each proved from the
//! host side.
//!
//! - A character device given as a stream (`< /dev/null`) was passed as
//!   the launcher's descriptor, on the host's read-write /dev: a root
//!   run's agent (`--user root`, owner of the node) changed its mode,
//!   times and ACL. The init now gives the agent the sandbox's own
//!   /dev/null (a read-only bind) in its place; another device would be
//!   relayed like a host file. The node here is a root-owned copy of
//!   /dev/null made with mknod (the host's own is never touched).
//! - A pipe given as a stream shared the launcher's open file
//!   description: the agent's `O_NONBLOCK` outlived the run, and the next
//!   writer of the launcher's pipeline got short writes. The agent now has
//!   a description of its own. Needs root and python3.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use common::*;

const FDMETA: &str = r#"
import os, stat, sys
for fd in (0, 1):
    print('fd%d-kind' % fd, 'chr' if stat.S_ISCHR(os.fstat(fd).st_mode) else 'other', file=sys.stderr)
    for label, fn in (
        ('fchmod', lambda: os.fchmod(fd, 0o600)),
        ('chmod-proc', lambda: os.chmod('/proc/self/fd/%d' % fd, 0o640)),
        ('futimens', lambda: os.utime(fd, (0, 0))),
        ('fsetxattr', lambda: os.setxattr(fd, 'system.posix_acl_access',
            bytes.fromhex('02000000010006' '00ffffffff' '040000' '00ffffffff' '200000' '00ffffffff'))),
        ('fchown', lambda: os.fchown(fd, 65534, 65534)),
    ):
        try:
            fn()
            print('fd%d-%s OK' % (fd, label), file=sys.stderr)
        except OSError as e:
            print('fd%d-%s %s' % (fd, label, e.errno), file=sys.stderr)
print('done', file=sys.stderr)
"#;

fn xattrs(path: &std::path::Path) -> Vec<u8> {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `name` is a C string and `buf` a writable buffer of its length.
    let n = unsafe { libc::listxattr(name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(n as usize);
    buf
}

#[test]
fn a_device_node_given_as_streams_keeps_its_mode_times_and_acl() {
    if !can_run("a_device_node_given_as_streams_keeps_its_mode_times_and_acl") {
        return;
    }
    let dir = Dir::new();
    let node = dir.join("null");
    let path = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a C string; mknod of a character device 1:3.
    let made = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    std::fs::set_permissions(&node, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let before = std::fs::metadata(&node).unwrap();
    let xattrs_before = xattrs(&node);

    let stdin = std::fs::File::open(&node).unwrap();
    let stdout = std::fs::OpenOptions::new().write(true).open(&node).unwrap();
    let out = Command::new(bin())
        .args(["run", "-q", "--user", "root", "--", "python3", "-c", FDMETA])
        .current_dir(dir.path())
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let report = stderr(&out);
    eprintln!("{report}");
    assert!(report.contains("done"), "{report}");

    let after = std::fs::metadata(&node).unwrap();
    assert_eq!(after.mode(), before.mode(), "mode");
    assert_eq!(after.uid(), 0, "owner");
    assert_eq!(
        (after.ctime(), after.ctime_nsec()),
        (before.ctime(), before.ctime_nsec()),
        "ctime"
    );
    assert_eq!(
        (after.mtime(), after.mtime_nsec()),
        (before.mtime(), before.mtime_nsec()),
        "mtime"
    );
    assert_eq!(xattrs(&node), xattrs_before, "xattrs");
    // The agent held /dev/null, the sandbox's read-only bind of it.
    for fd in [0, 1] {
        assert!(report.contains(&format!("fd{fd}-kind chr")), "{report}");
        for label in ["fchmod", "chmod-proc", "futimens", "fsetxattr"] {
            let line = format!("fd{fd}-{label} {}", libc::EROFS);
            assert!(report.contains(&line), "{line}: {report}");
        }
    }
}

/// Sets O_NONBLOCK on every standard stream, as the adversary's agent did.
const SET_NONBLOCK: &str = r#"
import fcntl, os, sys
for fd in (0, 1, 2):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
    print('fd%d nonblock %s' % (fd, bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)), file=sys.stderr)
"#;

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

fn nonblocking(fd: &OwnedFd) -> bool {
    // SAFETY: F_GETFL only reads the status flags of our descriptor.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0);
    flags & libc::O_NONBLOCK != 0
}

/// `{ tartaros run -- agent; writer; } | wc -c`: the writer after the run
/// writes 2 MB on the same description, and every byte arrives.
#[test]
fn an_agent_s_pipe_flags_do_not_reach_the_launcher_s_pipeline() {
    if !can_run("an_agent_s_pipe_flags_do_not_reach_the_launcher_s_pipeline") {
        return;
    }
    let dir = Dir::new();
    let (in_read, in_write) = pipe();
    let (out_read, out_write) = pipe();
    let out = Command::new(bin())
        .args(["run", "-q", "--", "python3", "-c", SET_NONBLOCK])
        .current_dir(dir.path())
        .stdin(in_read.try_clone().unwrap())
        .stdout(out_write.try_clone().unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let report = stderr(&out);
    eprintln!("{report}");
    // The agent did set the flag, on descriptions of its own.
    assert!(report.contains("fd1 nonblock True"), "{report}");
    assert!(!nonblocking(&out_write), "the launcher's stdout pipe");
    assert!(!nonblocking(&in_read), "the launcher's stdin pipe");

    // The next writer of the pipeline, on the launcher's description.
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::fs::File::from(out_read)
            .read_to_end(&mut all)
            .map(|_| all.len())
    });
    let mut writer = std::fs::File::from(out_write);
    let wrote = writer.write_all(&vec![b'x'; 2_000_000]);
    drop(writer);
    drop(in_write);
    let count = reader.join().unwrap().unwrap();
    assert!(wrote.is_ok(), "{wrote:?}");
    assert_eq!(count, 2_000_000);
}

/// The agent's changes to sockets given as its streams.
const SOCKET_AGENT: &str = r#"
import array, fcntl, os, socket, sys
for fd in (0, 1):
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK | os.O_APPEND)
    try:
        s = socket.socket(fileno=os.dup(fd))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b'\1\0\0\0\0\0\0\0')
        print('fd%d socket' % fd, file=sys.stderr)
    except OSError as e:
        print('fd%d not a socket %d' % (fd, e.errno), file=sys.stderr)
try:
    f = os.open('/proc/self/exe', os.O_RDONLY)
    socket.socket(fileno=os.dup(1)).sendmsg(
        [b'X'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(array.array('i', [f])))])
    print('sent a descriptor', file=sys.stderr)
except OSError as e:
    print('no descriptor sent %d' % e.errno, file=sys.stderr)
try:
    socket.socket(fileno=os.dup(0)).shutdown(socket.SHUT_RDWR)
except OSError as e:
    print('no shutdown %d' % e.errno, file=sys.stderr)
sys.stdout.write('out\n')
"#;

fn status_flags(fd: &OwnedFd) -> libc::c_int {
    // SAFETY: F_GETFL only reads the status flags of our descriptor.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }
}

fn send_buffer(fd: &OwnedFd) -> libc::c_int {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int into `value`, of the length given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    value
}

/// A harness's socketpairs as stdin and stdout (libuv's `pipe`, socat):
/// the agent's flags, options, shutdown and passed descriptors stay off
/// the launcher's sockets.
#[test]
fn an_agent_s_changes_to_socket_streams_do_not_reach_the_launcher() {
    if !can_run("an_agent_s_changes_to_socket_streams_do_not_reach_the_launcher") {
        return;
    }
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let dir = Dir::new();
    let pair = || {
        socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    };
    let (out_launcher, out_agent) = pair();
    let (in_launcher, in_agent) = pair();
    let (flags_out, flags_in) = (status_flags(&out_agent), status_flags(&in_agent));
    let (buf_out, buf_in) = (send_buffer(&out_agent), send_buffer(&in_agent));
    let out = Command::new(bin())
        .args(["run", "-q", "--", "python3", "-c", SOCKET_AGENT])
        .current_dir(dir.path())
        .stdin(in_agent.try_clone().unwrap())
        .stdout(out_agent.try_clone().unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let report = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(status_flags(&out_agent), flags_out, "{report}");
    assert_eq!(status_flags(&in_agent), flags_in, "{report}");
    assert_eq!(send_buffer(&out_agent), buf_out, "{report}");
    assert_eq!(send_buffer(&in_agent), buf_in, "{report}");
    // Only the agent's bytes arrive, with no descriptor.
    drop(out_agent);
    let mut got = Vec::new();
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    loop {
        let mut buf = [0u8; 64];
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = nix::sys::socket::recvmsg::<()>(
            out_launcher.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::empty(),
        )
        .unwrap();
        assert_eq!(
            msg.cmsgs().unwrap().count(),
            0,
            "a descriptor reached the launcher"
        );
        let n = msg.bytes;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).contains("out"), "{got:?}");
    // The launcher can still write to the agent's stdin peer.
    let wrote = nix::unistd::write(&in_launcher, b"more");
    assert!(wrote.is_ok(), "{wrote:?}: {report}");
}
