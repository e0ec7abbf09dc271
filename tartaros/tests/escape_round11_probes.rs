//! Adversarial round 11: techniques from other sandboxes' own escape tests
//! that held against the code as it was, kept because no other test of
//! ours tries them (docs/architecture.md, "Adversarial round 11"). Each
//! line names the peer test the technique comes from.

mod common;
#[path = "support/service.rs"]
mod support;
use std::os::unix::net::UnixListener;
use std::path::Path;

use common::*;
use support::Service;

const PROBES: &str = r#"
import fcntl, signal, socket, time
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append('TERM'))
# Landlock scoped_signal_test.c, pidfd and plain kill: the init is outside
# the agent's domain (and, as root, outside its uid).
attempt('kill-init', lambda: os.kill(1, signal.SIGCONT))
def pidfd_signal():
    fd = checked(libc.syscall(434, 1, 0))
    checked(libc.syscall(424, fd, signal.SIGCONT, None, 0))
attempt('pidfd-signal-init', pidfd_signal)
# scoped_signal_test.c "fown": SIGIO (here SIGTERM, which the init would
# forward to the agent) sent by the kernel to the owner of a file.
a, b = socket.socketpair()
checked(libc.fcntl(a.fileno(), fcntl.F_SETOWN, 1))
checked(libc.fcntl(a.fileno(), 10, signal.SIGTERM))  # F_SETSIG
fcntl.fcntl(a.fileno(), fcntl.F_SETFL, fcntl.fcntl(a.fileno(), fcntl.F_GETFL) | os.O_ASYNC)
for _ in range(3):
    b.send(b'x'); a.recv(1); time.sleep(0.1)
print('forwarded', len(got))
# ptrace_test.c; codex's and sandlock's seccomp tests.
attempt('ptrace-init', lambda: checked(libc.ptrace(16, 1, None, None)))
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
attempt('vm-read-init', lambda: checked(libc.process_vm_readv(1, iov, 1, iov, 1, 0)))
# scoped_abstract_unix_test.c: the host's abstract name, from outside.
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1].encode().replace(b'@', b'\0', 1))
attempt('abstract-host', abstract)
# bubblewrap's --disable-userns, firejail's namespaces.c.
attempt('unshare-user', lambda: checked(libc.unshare(0x10000000)))
attempt('unshare-mount', lambda: checked(libc.unshare(0x00020000)))
# runc's read-only and masked paths, firejail's kmsg.exp and sys_fs.exp.
attempt('core-pattern', lambda: open('/proc/sys/kernel/core_pattern', 'w').write('|/bin/sh'))
attempt('proc-kmsg', lambda: open('/proc/kmsg', 'rb').read(1))
attempt('dev-kmsg', lambda: open('/dev/kmsg', 'rb').read(1))
attempt('cgroup-move', lambda: open('/sys/fs/cgroup/unified/cgroup.procs', 'w').write(str(os.getpid())))
# Round 13: other runs' cgroups (names, process counts, CPU use).
attempt('cgroup-list', lambda: os.listdir('/sys/fs/cgroup'))
# codex's managed-proxy test: families that reach the host or hypervisor.
for name, family, kind in [('vsock', 40, 1), ('packet', 17, 3), ('alg', 38, 5), ('xdp', 44, 3), ('bluetooth', 31, 5)]:
    attempt('socket-' + name, lambda f=family, k=kind: socket.socket(f, k, 0).close())
"#;

fn probe(out: &std::process::Output, listener: &UnixListener) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    for label in [
        "kill-init",
        "pidfd-signal-init",
        "ptrace-init",
        "vm-read-init",
        "unshare-user",
        "unshare-mount",
        "socket-vsock",
        "socket-packet",
        "socket-alg",
        "socket-xdp",
        "socket-bluetooth",
    ] {
        expect(out, label, "EPERM");
    }
    expect(out, "forwarded", "0");
    expect(out, "abstract-host", "ECONNREFUSED");
    expect(out, "core-pattern", "EACCES");
    expect(out, "dev-kmsg", "ENOENT");
    // Under the empty cover of the hierarchies (mode 000): no path, and no
    // write, below it.
    expect(out, "cgroup-move", "EACCES");
    expect(out, "cgroup-list", "EACCES");
    let kmsg = stdout(out);
    assert!(
        kmsg.contains("proc-kmsg EACCES") || kmsg.contains("proc-kmsg EPERM"),
        "{kmsg}"
    );
    assert!(
        listener.accept().is_err(),
        "the host's abstract listener got a connection"
    );
}

fn abstract_listener(name: &str) -> UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

#[test]
fn techniques_of_other_sandboxes_tests_hold_in_a_root_run() {
    if !can_run("techniques_of_other_sandboxes_tests_hold_in_a_root_run") {
        return;
    }
    let name = format!("tt-r11-abstract-{}", std::process::id());
    let listener = abstract_listener(&name);
    let code = format!("{ATTEMPT}{PROBES}");
    let arg = format!("@{name}");
    let out = tartaros(&["run", "--", "python3", "-c", &code, &arg], Path::new("/"));
    eprintln!("{}", stdout(&out));
    probe(&out, &listener);
}

#[test]
fn techniques_of_other_sandboxes_tests_hold_in_an_ordinary_users_run() {
    if !can_run("techniques_of_other_sandboxes_tests_hold_in_an_ordinary_users_run") {
        return;
    }
    let name = format!("tt-r11-uabstract-{}", std::process::id());
    let listener = abstract_listener(&name);
    let code = format!("{ATTEMPT}{PROBES}");
    let arg = format!("@{name}");
    let out = run_as(
        4398,
        &["run", "--", "python3", "-c", &code, &arg],
        Path::new("/"),
    );
    eprintln!("{}", stdout(&out));
    probe(&out, &listener);
}

#[test]
fn techniques_of_other_sandboxes_tests_hold_through_the_service() {
    if !can_run("techniques_of_other_sandboxes_tests_hold_through_the_service") {
        return;
    }
    let service = Service::start();
    let name = format!("tt-r11-sabstract-{}", std::process::id());
    let listener = abstract_listener(&name);
    let code = format!("{ATTEMPT}{PROBES}");
    let arg = format!("@{name}");
    let out = service
        .command(
            4399,
            &["run", "--", "python3", "-c", &code, &arg],
            Path::new("/"),
        )
        .output()
        .expect("run through the service");
    eprintln!("{}\n{}", stdout(&out), service.errors());
    probe(&out, &listener);
}
