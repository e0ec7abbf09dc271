//! The escape suite: one test per technique an agent could use to get out.
//! Each asserts the exact errno of the failure under the relevant policy and
//! a control (the same action on an allowed target) that succeeds, so no
//! test can pass by breaking everything. Effects are checked from outside
//! (host listeners, files) where the technique would leave one.

mod common;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::process::{Command, Stdio};

use common::*;

fn run_py(work: &Dir, extra: &[&str], code: &str) -> std::process::Output {
    let w = work.path().to_str().unwrap().to_string();
    let mut flags = vec!["--strict", "--write", w.as_str()];
    flags.extend_from_slice(extra);
    python(&flags, work.path(), &format!("{ATTEMPT}\n{code}"))
}

#[test]
fn proc_pid_cwd_and_root_do_not_reach_outside_processes() {
    if !can_run("proc_tricks") {
        return;
    }
    let work = Dir::new();
    let me = std::process::id();
    let out = run_py(
        &work,
        &[],
        &format!(
            "attempt('host-pid-cwd', lambda: os.listdir('/proc/{me}/cwd'))
attempt('init-cwd', lambda: os.listdir('/proc/1/cwd'))
attempt('init-root', lambda: os.listdir('/proc/1/root/root'))
attempt('control', lambda: os.listdir('/proc/self/cwd'))"
        ),
    );
    // The test process is not in the agent's PID namespace at all.
    expect(&out, "host-pid-cwd", "ENOENT");
    // The init is root and the agent is not: no access to its links.
    expect(&out, "init-cwd", "EACCES");
    expect(&out, "init-root", "EACCES");
    expect(&out, "control", "OK");
}

#[test]
fn symlinks_and_hard_links_planted_in_a_root_do_not_reach_outside() {
    if !can_run("link_planting") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::open_to_all();
    let target = outside.file("target.txt", "original");
    std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let (w, t) = (work.path().display(), target.display());
    let out = run_py(
        &work,
        &[],
        &format!(
            "os.symlink('{t}', '{w}/planted')
attempt('write-through-symlink', lambda: open('{w}/planted', 'w').write('pwned'))
attempt('hard-link-in', lambda: os.link('{t}', '{w}/hl'))
os.symlink('{w}/mine', '{w}/inner')
attempt('control', lambda: open('{w}/inner', 'w').write('ok'))"
        ),
    );
    // The read-only base answers before Landlock does.
    expect(&out, "write-through-symlink", "EROFS");
    expect(&out, "hard-link-in", "EXDEV");
    expect(&out, "control", "OK");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "original");
}

#[test]
fn dotdot_and_openat2_resolution_do_not_leave_the_root() {
    if !can_run("dotdot_openat2") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::open_to_all();
    let rel = format!(
        "../{}/x",
        outside.path().file_name().unwrap().to_str().unwrap()
    );
    let w = work.path().display();
    let out = run_py(
        &work,
        &[],
        &format!(
            "import struct
attempt('dotdot', lambda: open('{w}/{rel}', 'w'))
def openat2(dirfd, path, flags, resolve):
    how = struct.pack('QQQ', flags, 0o644, resolve)
    buf = ctypes.create_string_buffer(how)
    return checked(libc.syscall(437, dirfd, path.encode(), buf, len(how)))
d = os.open('{w}', os.O_RDONLY | os.O_DIRECTORY)
attempt('openat2', lambda: openat2(d, '{rel}', os.O_CREAT | os.O_WRONLY, 0))
attempt('openat2-beneath', lambda: openat2(d, '{rel}', os.O_CREAT | os.O_WRONLY, 0x08))
attempt('openat', lambda: checked(libc.syscall(257, d, '{rel}'.encode(), os.O_CREAT | os.O_WRONLY, 0o644)))
attempt('control', lambda: checked(libc.syscall(257, d, b'inside', os.O_CREAT | os.O_WRONLY, 0o644)))"
        ),
    );
    // The read-only base answers before Landlock does.
    expect(&out, "dotdot", "EROFS");
    expect(&out, "openat", "EROFS");
    // openat2's open_how is a struct seccomp cannot read: it is refused
    // with ENOSYS, as clone3 is, and callers fall back to openat.
    expect(&out, "openat2", "ENOSYS");
    expect(&out, "openat2-beneath", "ENOSYS");
    expect(&out, "control", "OK");
    assert!(!outside.join("x").exists());
}

#[test]
fn tiocsti_cannot_inject_into_the_launchers_terminal() {
    if !can_run("tiocsti") {
        return;
    }
    let work = Dir::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let code = format!(
        "{ATTEMPT}
import fcntl, termios
attempt('tiocsti', lambda: fcntl.ioctl(0, termios.TIOCSTI, b'x'))
attempt('control', lambda: fcntl.ioctl(0, termios.TCGETS, bytes(64)))"
    );
    let slave = std::fs::File::from(pty.slave);
    let out = Command::new(bin())
        .args(["run", "--strict", "--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdin(Stdio::from(slave))
        .output()
        .unwrap();
    expect(&out, "tiocsti", "EPERM");
    // Without a run pty of its own (stdout is a pipe here), the agent's
    // stdin is the relay's pipe, no terminal at all (adversarial round
    // 23b): the launcher's terminal is never in its hands.
    expect(&out, "control", "ENOTTY");
    // Nothing arrived on the terminal's input side.
    nix::fcntl::fcntl(
        pty.master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    let injected = std::fs::File::from(pty.master).read(&mut buf).unwrap_or(0);
    assert_eq!(injected, 0, "bytes were injected into the terminal");
}

#[test]
fn ptrace_process_vm_readv_environ_and_signals_cannot_reach_the_supervisor_or_init() {
    if !can_run("ptrace_signals") {
        return;
    }
    let work = Dir::new();
    let me = std::process::id();
    let out = run_py(
        &work,
        &[],
        &format!(
            "import signal
PTRACE_ATTACH = 16
attempt('ptrace-init', lambda: checked(libc.ptrace(PTRACE_ATTACH, 1, 0, 0)))
iov = ctypes.create_string_buffer(16)
attempt('vm-readv-init', lambda: checked(libc.process_vm_readv(1, iov, 1, iov, 1, 0)))
attempt('environ-init', lambda: open('/proc/1/environ').read())
attempt('environ-host', lambda: open('/proc/{me}/environ').read())
attempt('kill-init', lambda: os.kill(1, signal.SIGTERM))
attempt('kill-host', lambda: os.kill({me}, 0))
attempt('control-environ', lambda: open('/proc/self/environ').read())
attempt('control-kill', lambda: os.kill(os.getpid(), 0))
child = os.fork()
if child == 0:
    import time; time.sleep(5); os._exit(0)
attempt('control-ptrace-own-child', lambda: checked(libc.ptrace(PTRACE_ATTACH, child, 0, 0)))
os.kill(child, signal.SIGKILL)"
        ),
    );
    expect(&out, "ptrace-init", "EPERM");
    expect(&out, "vm-readv-init", "EPERM");
    expect(&out, "environ-init", "EACCES");
    expect(&out, "environ-host", "ENOENT");
    // Landlock signal scoping: the init is outside the agent's domain.
    expect(&out, "kill-init", "EPERM");
    expect(&out, "kill-host", "ESRCH");
    expect(&out, "control-environ", "OK");
    expect(&out, "control-kill", "OK");
    expect(&out, "control-ptrace-own-child", "OK");
}

#[test]
fn deny_mounts_cannot_be_unmounted_or_covered_and_user_namespaces_give_nothing() {
    if !can_run("mounts_unshare") {
        return;
    }
    let work = Dir::new();
    let secret = work.file("secret", "s3cr3t");
    let s = secret.display();
    let out = run_py(
        &work,
        &["--read-deny", secret.to_str().unwrap()],
        &format!(
            "attempt('umount', lambda: checked(libc.umount2(b'{s}', 2)))
attempt('mount', lambda: checked(libc.mount(b'/tmp', b'{s}', None, 4096, None)))
attempt('unshare-user', lambda: checked(libc.unshare(0x10000000)))
attempt('unshare-mount', lambda: checked(libc.unshare(0x00020000)))
attempt('still-denied', lambda: open('{s}').read())
attempt('control', lambda: checked(libc.unshare(0)))"
        ),
    );
    expect(&out, "umount", "EPERM");
    expect(&out, "mount", "EPERM");
    expect(&out, "unshare-user", "EPERM");
    expect(&out, "unshare-mount", "EPERM");
    expect(&out, "still-denied", "EACCES");
    expect(&out, "control", "OK");
}

#[test]
fn io_uring_raw_packet_and_vsock_sockets_are_refused() {
    if !can_run("io_uring_sockets") {
        return;
    }
    let work = Dir::new();
    let out = run_py(
        &work,
        &[],
        "import socket
params = ctypes.create_string_buffer(120)
attempt('io_uring', lambda: checked(libc.syscall(425, 8, params)))
attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt('vsock', lambda: socket.socket(40, socket.SOCK_STREAM, 0))
attempt('control-tcp', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt('control-io', lambda: open('/etc/hostname').read())",
    );
    for label in ["io_uring", "raw", "packet", "vsock"] {
        expect(&out, label, "EPERM");
    }
    expect(&out, "control-tcp", "OK");
    expect(&out, "control-io", "OK");
}

#[test]
fn abstract_unix_sockets_of_the_host_are_unreachable() {
    if !can_run("abstract_unix") {
        return;
    }
    let work = Dir::new();
    let name = format!("tartaros-test-{}", std::process::id());
    let host = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    host.set_nonblocking(true).unwrap();
    let out = run_py(
        &work,
        &[],
        &format!(
            "import socket
def connect(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(name)
attempt('host-abstract', lambda: connect('\\0{name}'))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('\\0inside-{name}')
srv.listen()
attempt('control', lambda: connect('\\0inside-{name}'))"
        ),
    );
    // Abstract names live in the network namespace: the host's is not there.
    expect(&out, "host-abstract", "ECONNREFUSED");
    expect(&out, "control", "OK");
    assert!(host.accept().is_err(), "the host socket got a connection");
}

#[test]
fn udp_to_port_53_and_tcp_to_a_non_granted_port_never_reach_the_host() {
    if !can_run("network_exfiltration") {
        return;
    }
    let work = Dir::new();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let (up, tp) = (
        udp.local_addr().unwrap().port(),
        tcp.local_addr().unwrap().port(),
    );
    let out = run_py(
        &work,
        &[],
        &format!(
            "import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt('udp-53', lambda: u.sendto(b'exfil.example.', ('127.0.0.53', 53)))
attempt('udp-host-port', lambda: u.sendto(b'exfil', ('127.0.0.1', {up})))
attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {tp}), timeout=2))
attempt('ipv6', lambda: socket.create_connection(('::1', {tp}), timeout=2))
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
attempt('control-own-port', lambda: socket.create_connection(srv.getsockname(), timeout=2))"
        ),
    );
    // The sandbox has its own loopback: the connects find no listener there,
    // and a datagram is sent into the void (which is not an escape).
    expect(&out, "tcp", "ECONNREFUSED");
    expect(&out, "ipv6", "ECONNREFUSED");
    expect(&out, "control-own-port", "OK");
    let mut buf = [0u8; 64];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram reached the host"
    );
    assert!(tcp.accept().is_err(), "a connection reached the host");
}

#[test]
fn inherited_file_descriptors_are_closed_before_the_agent_runs() {
    if !can_run("inherited_fds") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let work = Dir::new();
    let outside = Dir::open_to_all();
    let secret = outside.file("secret", "s3cr3t");
    let file = std::fs::File::open(&secret).unwrap();
    let fd = file.as_raw_fd();
    let code = format!(
        "{ATTEMPT}\nattempt('inherited', lambda: os.read(7, 10))\nattempt('control', lambda: os.write(1, b''))"
    );
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--strict", "--", "python3", "-c", &code])
        .current_dir(work.path());
    // SAFETY: dup2 is async-signal-safe; it puts the open secret on fd 7
    // without close-on-exec, as a careless launcher would.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    expect(&out, "inherited", "EBADF");
    expect(&out, "control", "OK");
    assert!(!stdout(&out).contains("s3cr3t"));
}

#[test]
fn a_host_unix_socket_outside_the_roots_cannot_be_reached() {
    if !can_run("unix_socket_outside") {
        return;
    }
    let work = Dir::new();
    // A stand-in for docker.sock: world-connectable, outside every root.
    let outside = Dir::open_to_all();
    let host_path = outside.join("docker.sock");
    let host = std::os::unix::net::UnixListener::bind(&host_path).unwrap();
    std::fs::set_permissions(
        &host_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    host.set_nonblocking(true).unwrap();
    let (h, w) = (host_path.display(), work.path().display());
    let out = run_py(
        &work,
        &[],
        &format!(
            "import socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
attempt('host-socket', lambda: connect('{h}'))
os.symlink('{h}', '{w}/planted.sock')
attempt('host-socket-via-symlink', lambda: connect('{w}/planted.sock'))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{w}/own.sock')
srv.listen()
attempt('control-own-socket', lambda: connect('{w}/own.sock'))"
        ),
    );
    // As root the eBPF unix policy is always attached: the path is refused.
    expect(&out, "host-socket", "EPERM");
    // The allowed name is looked up through the root's mirror, which
    // follows no symlink (unix_pinning.rs has the sockets bound later).
    expect(&out, "host-socket-via-symlink", "ELOOP");
    expect(&out, "control-own-socket", "OK");
    assert!(host.accept().is_err(), "the host socket got a connection");
}
