//! The effect log is complete, or says it is not (issue 13, part A): the
//! effects an adversarial agent used to get past the capture are records
//! now, and a log that lost records, whose disk filled up or whose capture
//! was degraded never verifies as `ok`, and its run does not exit 0.
//! Needs root (runs `tartaros run --log`, mounts a tmpfs, adds a user).

mod common;

use std::path::Path;
use std::process::Command;

use common::lease::HostLease;
use common::*;
use serde_json::Value;

fn t<'a>(r: &'a Value, key: &str) -> &'a Value {
    &r["target"][key]
}

/// The one record of `kind` for which `p` holds; prints the log if none.
#[track_caller]
fn find<'a>(log: &'a [Value], kind: &str, what: &str, p: impl Fn(&Value) -> bool) -> &'a Value {
    log.iter()
        .find(|r| r["kind"] == kind && p(r))
        .unwrap_or_else(|| {
            for r in log {
                eprintln!("{r}");
            }
            panic!("no {kind} record: {what}")
        })
}

#[track_caller]
fn allowed(r: &Value) {
    assert_eq!(
        (r["decision"].as_str(), r["errno"].as_u64()),
        (Some("allowed"), Some(0)),
        "{r}"
    );
}

#[track_caller]
fn denied(r: &Value, errno: i32) {
    assert_eq!(
        (r["decision"].as_str(), r["errno"].as_u64()),
        (Some("denied"), Some(errno as u64)),
        "{r}"
    );
}

const AGENT: &str = r#"
import stat, socket, struct, fcntl, signal, threading, time
W = sys.argv[1]
os.chdir(W)
attempt('mknod_fifo', lambda: os.mknod(W + '/fifo', stat.S_IFIFO | 0o600))
attempt('mknod_reg', lambda: os.mknod(W + '/reg', stat.S_IFREG | 0o644))
def bind(kind, name):
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(name)
    return s
keep = []
attempt('bind_unix', lambda: keep.append(bind(socket.SOCK_STREAM, 'sock')))
attempt('bind_dgram', lambda: keep.append(bind(socket.SOCK_DGRAM, W + '/dgram')))
attempt('setxattr', lambda: os.setxattr(W + '/reg', 'user.k', b'v'))
# A POSIX ACL: user::rw- group::rw- other::rw-, world-writable by ACL.
acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', tag, 6, 0xffffffff) for tag in (1, 4, 0x20))
attempt('acl', lambda: os.setxattr(W + '/reg', 'system.posix_acl_access', acl))
fd = os.open(W + '/reg', os.O_RDONLY)
attempt('fsetxattr', lambda: os.setxattr(fd, 'user.f', b'1'))
attempt('removexattr', lambda: os.removexattr(W + '/reg', 'user.k'))
os.symlink('reg', W + '/lnk')
attempt('lsetxattr', lambda: os.setxattr(W + '/lnk', 'user.l', b'1', follow_symlinks=False))
attempt('utime', lambda: os.utime(W + '/reg', (1, 2)))
attempt('futimens', lambda: os.utime(fd, (3, 4)))
# The file's own flags plus one, as chattr does: ext4 refuses to drop
# its extents flag (EPERM on 6.18.44).
old_flags = struct.unpack('l', fcntl.ioctl(fd, 0x80086601, struct.pack('l', 0)))[0]
attempt('setflags', lambda: fcntl.ioctl(fd, 0x40086602, struct.pack('l', old_flags | 0x80)))
attempt('immutable', lambda: fcntl.ioctl(fd, 0x40086602, struct.pack('l', old_flags | 0x10)))
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
pidfd = os.pidfd_open(child)
attempt('pidfd_signal', lambda: signal.pidfd_send_signal(pidfd, 0))
# The supervisor names the pidfd's process from /proc when the record
# arrives: keep both until then.
time.sleep(0.5)
info = ctypes.create_string_buffer(128)
struct.pack_into('iii', info, 0, 0, 0, -1)
attempt('sigqueue', lambda: checked(libc.syscall(129, os.getpid(), 0, info)))
attempt('tgsigqueue', lambda: checked(libc.syscall(297, os.getpid(), threading.get_native_id(), 0, info)))
os.kill(child, 9)
os.waitpid(child, 0)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [('name', ctypes.c_void_p), ('namelen', ctypes.c_uint32), ('iov', ctypes.POINTER(iovec)),
                ('iovlen', ctypes.c_size_t), ('control', ctypes.c_void_p), ('controllen', ctypes.c_size_t),
                ('flags', ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [('hdr', msghdr), ('len', ctypes.c_uint)]
def sendmmsg(family, kind, addr):
    s = socket.socket(family, kind)
    data = ctypes.create_string_buffer(b'x')
    iov = iovec(ctypes.cast(data, ctypes.c_void_p), 1)
    name = ctypes.create_string_buffer(addr, len(addr))
    msgs = (mmsghdr * 2)()
    for m in msgs:
        m.hdr.name = ctypes.cast(name, ctypes.c_void_p)
        m.hdr.namelen = len(addr)
        m.hdr.iov = ctypes.pointer(iov)
        m.hdr.iovlen = 1
    try:
        checked(libc.sendmmsg(s.fileno(), msgs, 2, 0))
    finally:
        s.close()
unix = struct.pack('<H', socket.AF_UNIX) + (W + '/dgram').encode() + b'\0'
# TEST-NET-1 in a network namespace with only loopback: the connect
# filter refuses it before any routing, nothing is sent anywhere.
inet = struct.pack('<H', socket.AF_INET) + struct.pack('>H', 9) + socket.inet_aton('192.0.2.1') + b'\0' * 8
attempt('sendmmsg_unix', lambda: sendmmsg(socket.AF_UNIX, socket.SOCK_DGRAM, unix))
attempt('sendmmsg_inet', lambda: sendmmsg(socket.AF_INET, socket.SOCK_DGRAM, inet))
attempt('io_uring', lambda: checked(libc.syscall(425, 1, ctypes.create_string_buffer(120))))
# Linux AIO writes send no change notification: refused, and recorded.
aio_ctx = ctypes.c_ulong(0)
attempt('io_setup', lambda: checked(libc.syscall(206, 8, ctypes.byref(aio_ctx))))
import termios
attempt('tiocsti', lambda: fcntl.ioctl(1, termios.TIOCSTI, b'x'))
ro = os.open(W + '/target.txt', os.O_RDONLY | os.O_CREAT, 0o644)
def reopen():
    w = os.open('/proc/self/fd/%d' % ro, os.O_WRONLY)
    os.write(w, b'x')
    os.close(w)
attempt('reopen', reopen)
# Refused by the filter by their mode (no setuid file left in a root).
attempt('chmod_setuid', lambda: os.chmod(W + '/target.txt', 0o4755))
attempt('fchmod_setgid', lambda: os.fchmod(ro, 0o2755))
import resource, subprocess
print('core_limit', resource.getrlimit(resource.RLIMIT_CORE))
subprocess.run([sys.executable, '-c', 'import os; os.abort()'], cwd=W)
"#;

#[test]
fn effects_the_capture_used_to_miss_are_records_with_path_and_verdict() {
    if !can_run("log_complete_missed") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let out = logged_agent(&work, &log, AGENT);
    for label in [
        "mknod_fifo",
        "mknod_reg",
        "bind_unix",
        "bind_dgram",
        "setxattr",
        "acl",
        "fsetxattr",
        "removexattr",
        "utime",
        "futimens",
        "pidfd_signal",
        "sigqueue",
        "tgsigqueue",
        "sendmmsg_unix",
        "reopen",
    ] {
        expect(&out, label, "OK");
    }
    expect(&out, "lsetxattr", "EPERM");
    expect(&out, "immutable", "EPERM");
    expect(&out, "sendmmsg_inet", "EPERM");
    expect(&out, "io_uring", "EPERM");
    expect(&out, "io_setup", "EPERM");
    expect(&out, "tiocsti", "EPERM");
    expect(&out, "chmod_setuid", "EPERM");
    expect(&out, "fchmod_setgid", "EPERM");
    expect(&out, "core_limit", "(1, 1)");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(verify_log(&log).0, 0, "{}", verify_log(&log).1);
    // The tree from the host side: what the records claim happened did.
    assert!(work.join("fifo").exists() && work.join("sock").exists());
    // The crash left no core file the log would not know of.
    let cores: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("core"))
        .collect();
    assert!(cores.is_empty(), "{cores:?}");

    let log = records(&log);
    let w = work.path().to_str().unwrap();
    let p = |name: &str| format!("{w}/{name}");
    let at = |kind: &str, name: &str| {
        let path = p(name);
        find(&log, kind, &path.clone(), move |r| {
            t(r, "path") == path.as_str()
        })
    };
    let fifo = at("mknod", "fifo");
    allowed(fifo);
    assert_eq!(t(fifo, "file_type"), "fifo");
    assert_eq!(t(fifo, "mode"), 0o600);
    assert_eq!(t(at("mknod", "reg"), "file_type"), "regular");
    let sock = at("bind", "sock");
    allowed(sock);
    assert_eq!(
        (t(sock, "family"), t(sock, "resolved_from")),
        (&"unix".into(), &"cwd".into())
    );
    let xattr = |name: &str| find(&log, "xattr", name, move |r| t(r, "name") == name);
    let set = xattr("user.k");
    allowed(set);
    assert_eq!(
        (t(set, "path").as_str(), t(set, "op").as_str()),
        (Some(p("reg").as_str()), Some("set"))
    );
    let acl = xattr("system.posix_acl_access");
    allowed(acl);
    assert_eq!(t(acl, "path").as_str(), Some(p("reg").as_str()));
    // Named by the file the kernel had behind the descriptor, not by a
    // /proc lookup when the record is read (log_fd_swap.rs).
    let fset = xattr("user.f");
    allowed(fset);
    assert_eq!(
        (t(fset, "path").as_str(), t(fset, "path_source").as_str()),
        (Some(p("reg").as_str()), Some("kernel"))
    );
    assert!(
        t(fset, "ino").is_u64() && t(fset, "resolved_from").is_null(),
        "{fset}"
    );
    let removed = find(&log, "xattr", "remove user.k", |r| t(r, "op") == "remove");
    assert_eq!(t(removed, "path").as_str(), Some(p("reg").as_str()));
    let lset = xattr("user.l");
    denied(lset, libc::EPERM);
    assert_eq!(
        (t(lset, "path").as_str(), t(lset, "nofollow")),
        (Some(p("lnk").as_str()), &Value::Bool(true))
    );
    allowed(at("utime", "reg"));
    assert!(
        log.iter()
            .filter(|r| r["kind"] == "utime" && t(r, "path") == p("reg").as_str())
            .count()
            >= 2,
        "utime and futimens"
    );
    let flags: Vec<&Value> = log.iter().filter(|r| r["kind"] == "setflags").collect();
    assert_eq!(flags.len(), 2, "{flags:?}");
    allowed(flags[0]);
    assert_eq!(t(flags[0], "path").as_str(), Some(p("reg").as_str()));
    let bits = |r: &Value| t(r, "flags").as_u64().unwrap_or(0);
    assert_eq!(bits(flags[0]) & 0x90, 0x80, "FS_NOATIME_FL: {}", flags[0]);
    denied(flags[1], libc::EPERM);
    assert_eq!(bits(flags[1]) & 0x90, 0x10, "FS_IMMUTABLE_FL: {}", flags[1]);
    for call in ["pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo"] {
        let s = find(&log, "signal", call, |r| t(r, "call") == call);
        allowed(s);
        assert_eq!(t(s, "signal"), 0, "{call}");
    }
    let pidfd = find(&log, "signal", "pidfd", |r| {
        t(r, "call") == "pidfd_send_signal"
    });
    assert_eq!(t(pidfd, "outside"), false, "{pidfd}");
    let unix = find(&log, "sendto", "sendmmsg unix", |r| {
        t(r, "path") == p("dgram").as_str()
    });
    allowed(unix);
    assert_eq!(
        (t(unix, "messages"), t(unix, "sent")),
        (&Value::from(2), &Value::from(2))
    );
    let inet = find(&log, "sendto", "sendmmsg inet", |r| t(r, "port") == 9);
    denied(inet, libc::EPERM);
    assert_eq!(
        (t(inet, "addr"), t(inet, "messages")),
        (&Value::from("192.0.2.1"), &Value::from(2))
    );
    let uring = find(&log, "syscall", "io_uring_setup", |r| {
        t(r, "syscall") == "io_uring_setup"
    });
    denied(uring, libc::EPERM);
    assert_eq!(t(uring, "refused_by"), "seccomp");
    let aio = find(&log, "syscall", "io_setup", |r| {
        t(r, "syscall") == "io_setup"
    });
    denied(aio, libc::EPERM);
    assert_eq!(t(aio, "refused_by"), "seccomp");
    for (call, mode) in [("chmod", 0o4755), ("fchmod", 0o2755)] {
        let refused = find(&log, "syscall", call, |r| {
            t(r, "syscall") == call && t(r, "mode") == mode
        });
        denied(refused, libc::EPERM);
        assert_eq!(t(refused, "refused_by"), "seccomp");
    }
    let sti = find(&log, "syscall", "TIOCSTI", |r| t(r, "cmd") == "TIOCSTI");
    denied(sti, libc::EPERM);
    assert_eq!(
        (t(sti, "syscall"), t(sti, "fd")),
        (&Value::from("ioctl"), &Value::from(1))
    );
    // Named by the file behind the descriptor the open returned; the
    // agent's alias is its claim.
    let reopen = find(&log, "open", "the /proc/self/fd reopen", |r| {
        t(r, "claimed_path")
            .as_str()
            .is_some_and(|p| p.starts_with("/proc/self/fd/"))
    });
    allowed(reopen);
    assert_eq!(t(reopen, "path"), &Value::from(format!("{w}/target.txt")));
    assert_eq!(t(reopen, "path_source"), "kernel");
}

#[test]
fn the_syscall_table_agrees_with_the_seccomp_filter() {
    use tartaros::seccomp::{SeccompOptions, rules};
    use tartaros_common::syscalls::{Class, TABLE, number_of};
    let always: std::collections::BTreeSet<&str> = rules(&SeccompOptions::default())
        .into_iter()
        .filter(|r| r.when.is_empty())
        .map(|r| r.syscall)
        .collect();
    for name in &always {
        assert!(
            number_of(name).is_some(),
            "{name} is refused but not in the table"
        );
    }
    for (n, name, class) in TABLE {
        let refused = matches!(class, Class::Refused | Class::RefusedQuiet(_));
        assert_eq!(
            refused,
            always.contains(name),
            "{n} {name}: table vs seccomp"
        );
    }
}

#[test]
fn a_log_whose_disk_fills_up_ends_incomplete_and_fails_the_run() {
    if !can_run("log_complete_disk_full") {
        return;
    }
    let fs = Tmpfs::mount("4m");
    chown(fs.path(), NOBODY);
    let dir = fs.path();
    let log = dir.join("effects.jsonl");
    // The agent fills the filesystem that holds the log, then goes on
    // creating (empty) files, which a full tmpfs still allows.
    let code = format!(
        "{ATTEMPT}
W = '{d}'
def fill():
    with open(W + '/fill', 'wb') as f:
        while True:
            f.write(b'x' * 65536)
            f.flush()
attempt('fill', fill)
made = 0
for i in range(4000):
    try:
        os.close(os.open('%s/f%d' % (W, i), os.O_WRONLY | os.O_CREAT, 0o644))
        made += 1
    except OSError:
        pass
print('made', made)",
        d = dir.display()
    );
    let out = tartaros(
        &[
            "run",
            "--write",
            dir.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        Path::new("/"),
    );
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    expect(&out, "fill", "ENOSPC");
    assert!(stdout(&out).contains("made 4000"), "{}", stdout(&out));
    assert_eq!(
        out.status.code(),
        Some(tartaros::exit::LOG_INCOMPLETE),
        "the agent exited 0 but its log is incomplete"
    );
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.starts_with("tartaros: the effect log is incomplete")),
        "{err}"
    );
    let (code, message) = verify_log(&log);
    assert_eq!(code, 3, "{message}");
    assert!(message.contains("filesystem filled up"), "{message}");
    let records = records(&log);
    let gap = find(&records, "gap", "log-full", |r| {
        r["lost_kind"] == "log-full"
    });
    assert!(gap["count"].as_u64().unwrap_or(0) > 0, "{gap}");
    assert_eq!(records.last().unwrap()["kind"], "seal");
}

/// A user added for one test and removed after it.
struct ThrowawayUser {
    name: String,
    uid: u32,
}

impl ThrowawayUser {
    fn add() -> Self {
        let name = format!("ttlogc{}", std::process::id() % 100_000);
        // A run that died before its cleanup may have left the name taken.
        let _ = Command::new("userdel")
            .arg(&name)
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                &name,
            ])
            .status()
            .expect("useradd");
        assert!(ok.success(), "useradd {name}");
        let id = Command::new("id").args(["-u", &name]).output().expect("id");
        let uid = String::from_utf8_lossy(&id.stdout)
            .trim()
            .parse()
            .expect("uid");
        Self { name, uid }
    }
}

impl Drop for ThrowawayUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

#[test]
fn an_ordinary_users_log_without_capture_verifies_incomplete() {
    if !can_run("log_complete_ordinary_user") {
        return;
    }
    let user = ThrowawayUser::add();
    let work = Dir::new();
    chown(work.path(), user.uid);
    let log = work.join("effects.jsonl");
    let out = Command::new("runuser")
        .args(["-u", &user.name, "--", bin(), "run", "--write"])
        .arg(work.path())
        .arg("--log")
        .arg(&log)
        .args([
            "--",
            "sh",
            "-c",
            "echo x > \"$0/made\"",
            work.path().to_str().unwrap(),
        ])
        .current_dir(work.path())
        .env_remove("SUDO_UID")
        .output()
        .expect("runuser");
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    assert!(work.join("made").exists(), "the agent ran");
    assert_eq!(out.status.code(), Some(tartaros::exit::LOG_INCOMPLETE));
    let (code, message) = verify_log(&log);
    assert_eq!(code, 3, "{message}");
    assert!(message.contains("ebpf-capture"), "{message}");
}

#[test]
fn relay_and_proxy_records_count_every_byte_and_name_the_connecting_process() {
    if !can_run("log_complete_relay_bytes") {
        return;
    }
    use std::io::Read;
    use std::os::fd::AsRawFd;
    const BYTES: usize = 10 * 1024 * 1024;
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = host.local_addr().unwrap().port();
    // The host side reads all 10 MiB, then resets the connection: the
    // relay's copy ends with an error.
    let server = std::thread::spawn(move || {
        let (mut conn, _) = host.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < BYTES {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt on the accepted socket with a valid linger.
        unsafe {
            libc::setsockopt(
                conn.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        got
    });
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let proxy = tartaros::egress::PROXY_PORT;
    let code = format!(
        "import socket
s = socket.create_connection(('127.0.0.1', {port}))
s.sendall(b'x' * {BYTES})
try:
    s.recv(1)
except OSError:
    pass
print('sent')
p = socket.create_connection(('127.0.0.1', {proxy}))
p.sendall(b'CONNECT denied.invalid:443 HTTP/1.1\\r\\nHost: denied.invalid:443\\r\\n\\r\\n')
print('proxy', p.recv(12))"
    );
    let out = tartaros(
        &[
            "run",
            "--port",
            &port.to_string(),
            "--allow-domain",
            "allowed.invalid",
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    assert!(stdout(&out).contains("sent"), "{}", stderr(&out));
    assert_eq!(server.join().unwrap(), BYTES, "the host got all of it");
    let records = records(&log);
    let relay = find(&records, "connect", "the relay", |r| {
        t(r, "via") == "port-forward"
    });
    assert_eq!(t(relay, "bytes_up"), BYTES as u64, "{relay}");
    assert!(
        t(relay, "error").is_string(),
        "the copy ended in an error: {relay}"
    );
}

/// The host's lease keeps the agent's write open blocked in the kernel
/// while a second thread rewrites what the open was given: the path
/// (openat) to another file (the sandbox refuses `F_SETLEASE`). The records have what the kernel was asked,
/// read at entry. (openat2, whose `open_how` flags could be flipped the
/// same way, is refused with ENOSYS: docs/seccomp.md.)
const FLIP_WHILE_BLOCKED: &str = r#"
import threading, time
W = sys.argv[1]
def leased(name, call, flip):
    result = {}
    def run():
        result['tid'] = threading.get_native_id()
        result['fd'] = call()
    t = threading.Thread(target=run)
    started = time.time()
    t.start()
    # Flip only once the opener sits in the kernel, waiting on the lease.
    while time.time() - started < 5:
        try:
            if open('/proc/self/task/%d/syscall' % result['tid']).read().split()[0] in ('437', '257'):
                break
        except (KeyError, OSError, IndexError):
            pass
        time.sleep(0.01)
    time.sleep(0.1)
    flip()
    t.join()
    fd = result['fd']
    print(name, 'blocked', time.time() - started > 0.2, 'opened', fd >= 0)
    os.write(fd, b'written by ' + name.encode())
    os.close(fd)
leased('leased', lambda: libc.syscall(257, -100, (W + '/leased').encode(), os.O_WRONLY, 0),
       lambda: None)
hook = W + '/pre-commit'
buf = ctypes.create_string_buffer(hook.encode(), 256)
leased('pre-commit', lambda: libc.syscall(257, -100, buf, os.O_WRONLY | os.O_TRUNC, 0),
       lambda: ctypes.memmove(buf, (W + '/notes.txt\0').encode(), len(W) + 11))
"#;
#[test]
fn arguments_rewritten_while_an_open_blocks_are_recorded_as_asked() {
    if !can_run("log_complete_openat2_flip") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let files = [work.file("leased", ""), work.file("pre-commit", "")];
    let lease = HostLease::take(&[&files[0], &files[1]]);
    let out = tartaros(
        &[
            "run",
            "--write",
            w,
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &format!("{ATTEMPT}{FLIP_WHILE_BLOCKED}"),
            w,
        ],
        work.path(),
    );
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(lease.released(), 2, "each open broke its lease");
    expect(&out, "leased blocked True opened", "True");
    expect(&out, "pre-commit blocked True opened", "True");
    assert_eq!(
        std::fs::read_to_string(work.join("leased")).unwrap(),
        "written by leased"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("pre-commit")).unwrap(),
        "written by pre-commit"
    );
    let records = records(&log);
    let leased = format!("{w}/leased");
    let open = find(&records, "open", "the write open", |r| {
        t(r, "path") == leased.as_str() && t(r, "flags") == libc::O_WRONLY as u64
    });
    allowed(open);
    let hook = format!("{w}/pre-commit");
    let truncated = find(&records, "truncate", "the hook", |r| {
        t(r, "path") == hook.as_str()
    });
    allowed(truncated);
    let notes = format!("{w}/notes.txt");
    assert!(
        !records.iter().any(|r| t(r, "path") == notes.as_str()),
        "no record names the file that was never opened"
    );
}

#[test]
fn broker_records_name_the_connecting_process() {
    if !can_run("log_complete_broker_pid") {
        return;
    }
    let work = Dir::new();
    let config = work.join("broker.toml");
    std::fs::write(
        &config,
        "[broker]\nport = 9913\ntoken_env = \"TT_LOGC_TOKEN\"\nallowed_hosts = [\"api.example.invalid\"]\n\
         [[broker.capability]]\nname = \"api\"\nupstream = \"api.example.invalid\"\nheader = \"Authorization\"\nvalue_env = \"TT_LOGC_SECRET\"\n",
    )
    .unwrap();
    let log = work.join("effects.jsonl");
    // No token: the broker answers 401 itself, nothing goes upstream.
    let code = "import socket\ns = socket.create_connection(('127.0.0.1', 9913))\ns.sendall(b'GET /api/x HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n')\nprint('answer', s.recv(12))";
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--", "python3", "-c", code])
        .current_dir(work.path())
        .env("TT_LOGC_TOKEN", "tok-logc-1")
        .env("TT_LOGC_SECRET", "sec-logc-1")
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("401"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let records = records(&log);
    let python = find(&records, "exec", "python3", |r| {
        t(r, "argv")[0]
            .as_str()
            .is_some_and(|a| a.ends_with("python3"))
    });
    let broker = find(&records, "broker", "the 401", |_| true);
    assert_eq!(broker["decision"], "denied", "{broker}");
    assert_eq!(broker["pid"], python["pid"], "{broker}");
}
