//! Escapes found by an adversarial review of the containment, each proved
//! from the host side (what the host shows afterwards, never the agent's
//! own report) and each failing on the binary before its fix.
//!
//! Escapes: a crash running the host's core handler (the apport
//! CVE-2019-15790 / CVE-2021-25682 class: a crash inside a container makes
//! the host run a root helper with the crashing process's data); the
//! metadata of host files, FIFOs and terminals handed in as standard
//! streams (bubblewrap and firejail leave stdio to the caller; the
//! CVE-2017-5226 write-up on bubblewrap's inherited terminal is the
//! pattern). Regression guards that held: the host's IPC objects, and host
//! mounts made after the start (bubblewrap's `--make-rprivate` reasoning).

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

/// Puts `kernel.core_pattern` back when dropped, also when the test fails.
struct SavedCorePattern(String);

impl Drop for SavedCorePattern {
    fn drop(&mut self) {
        let _ = std::fs::write(CORE_PATTERN, &self.0);
    }
}

/// A root-owned directory with `helper`, a core handler that appends its
/// pid argument to `marker` (and drains the core from its stdin).
fn core_helper() -> (tempfile::TempDir, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("tt-core-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let helper = dir.path().join("helper");
    let marker = dir.path().join("marker");
    let script = format!(
        "#!/bin/sh\necho \"$1\" >> {}\nexec cat > /dev/null\n",
        marker.display()
    );
    std::fs::write(&helper, script).unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, helper, marker)
}

fn crash_on_host(marker: &Path) -> bool {
    let _ = Command::new("sh")
        .args(["-c", "ulimit -c 0; kill -SEGV $$"])
        .status();
    eventually(5, || marker.exists())
}

/// A `core_pattern` that pipes to a handler (`|/usr/lib/systemd/
/// systemd-coredump ...`, apport: the default of most distributions)
/// ignores `RLIMIT_CORE` 0: a crash of the agent made the kernel start that
/// handler as root in the host's namespaces, outside every wall, where it
/// wrote the agent's memory under /var. The agent now keeps `RLIMIT_CORE`
/// at 1, the kernel's marker that refuses the pipe, and cannot lower it.
#[test]
fn a_crash_in_the_sandbox_does_not_run_the_hosts_core_handler() {
    if !can_run("a_crash_in_the_sandbox_does_not_run_the_hosts_core_handler") {
        return;
    }
    let work = Dir::new();
    let (_dir, helper, marker) = core_helper();
    let _saved = SavedCorePattern(std::fs::read_to_string(CORE_PATTERN).unwrap());
    std::fs::write(CORE_PATTERN, format!("|{} %p", helper.display())).unwrap();

    // Control: the handler runs for a crash on the host, limit 0 or not.
    assert!(crash_on_host(&marker), "the host's core handler never ran");
    std::fs::remove_file(&marker).unwrap();

    let code = format!(
        "{ATTEMPT}
import resource, signal, subprocess
print('limit', resource.getrlimit(resource.RLIMIT_CORE))
# By libc, not resource.setrlimit: Python reports EPERM as a ValueError.
hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
soft_zero = (ctypes.c_ulong * 2)(0, hard)
attempt('lower_soft', lambda: checked(libc.setrlimit(4, ctypes.byref(soft_zero))))
attempt('prlimit', lambda: checked(libc.prlimit(0, 4, ctypes.byref(soft_zero), None)))
attempt('lower', lambda: checked(libc.setrlimit(4, ctypes.byref((ctypes.c_ulong * 2)(0, 0)))))
subprocess.run(['sh', '-c', 'ulimit -c 0 2>/dev/null; kill -SEGV $$'])
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGSEGV)
"
    );
    let w = work.path().to_str().unwrap();
    let out = python(&["--write", w], work.path(), &code);
    // Give a handler the kernel started the time the control needed.
    std::thread::sleep(Duration::from_secs(2));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        ran.is_empty(),
        "the host's core handler ran for sandbox pids {ran:?}\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    for label in ["lower_soft", "prlimit", "lower"] {
        expect(&out, label, "EPERM");
    }
    expect(&out, "limit", "(1, 1)");
}

/// What the host shows of `path`: mode, modification time, xattr names
/// and inode flags.
fn host_meta(path: &Path) -> (u32, i64, Vec<u8>, libc::c_long) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut names = vec![0u8; 1024];
    // SAFETY: `names` is writable for its length; `name` is a C string.
    let len = unsafe { libc::listxattr(name.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    names.truncate(usize::try_from(len).unwrap_or(0));
    let file = std::fs::File::open(path).unwrap();
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long into `flags`.
    unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0x8008_6601,
            &mut flags,
        )
    };
    (meta.mode(), meta.mtime(), names, flags)
}

/// A launcher's `< in.txt > out.txt` used to hand the agent descriptors of
/// host files on the host's read-write mount: `fchmod`, `futimens`,
/// `fsetxattr`, `FS_IOC_SETFLAGS` and `chmod("/proc/self/fd/1")` changed
/// them outside every root (the read-only base does not cover a file
/// opened outside the sandbox; Landlock has no right for metadata). Such
/// streams now reach the sandbox as pipes that a process outside copies.
#[test]
fn standard_streams_that_are_host_files_cannot_have_their_metadata_changed() {
    if !can_run("standard_streams_that_are_host_files_cannot_have_their_metadata_changed") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::new();
    let input = outside.file("in.txt", "input line\n");
    let output = outside.file("out.txt", "");
    let before = [host_meta(&input), host_meta(&output)];
    let code = format!(
        "{ATTEMPT}
import fcntl, array
print('read', sys.stdin.readline().strip())
def setflags(fd):
    flags = array.array('l', [0])
    fcntl.ioctl(fd, 0x80086601, flags, True)
    flags[0] |= 0x40  # FS_NODUMP_FL: an owner may set it
    fcntl.ioctl(fd, 0x40086602, flags, True)
for fd in (0, 1):
    attempt(f'fchmod{{fd}}', lambda: os.fchmod(fd, 0o777))
    attempt(f'utime{{fd}}', lambda: os.utime(fd, (1, 1)))
    attempt(f'xattr{{fd}}', lambda: os.setxattr(fd, 'user.evil', b'1'))
    attempt(f'setflags{{fd}}', lambda: setflags(fd))
    attempt(f'by_path{{fd}}', lambda: os.chmod(f'/proc/self/fd/{{fd}}', 0o666))
"
    );
    let w = work.path().to_str().unwrap();
    let out = Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::fs::File::create(&output).unwrap())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let written = std::fs::read_to_string(&output).unwrap();
    assert!(
        written.contains("read input line"),
        "{written}\n{}",
        stderr(&out)
    );
    let after = [host_meta(&input), host_meta(&output)];
    // The output's time moves with its writes; its mode, xattrs and
    // flags, and everything of the input, must not.
    assert_eq!(before[0], after[0], "the input file changed\n{written}");
    let (mode, _, names, flags) = &after[1];
    assert_eq!(
        (mode, names, flags),
        (&before[1].0, &before[1].2, &before[1].3),
        "the output file changed\n{written}"
    );
    assert!(!written.contains(" OK"), "{written}");
}

/// A host terminal handed in as stdout (stdin not a terminal, so the run
/// gets no pty of its own) was the launcher's descriptor on the host's
/// read-write devpts: an agent owning the pty (under sudo) made it 0666
/// with `fchmod(1)` or `chmod("/proc/self/fd/1")`, opening the user's
/// terminal to every local user. The init then reopened it through a
/// read-only bind of that one node (`/dev/.tty/1`); since round 23b the
/// terminal is relayed and the agent never holds it.
#[test]
fn a_host_terminal_on_stdout_cannot_have_its_mode_changed() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    if !can_run("a_host_terminal_on_stdout_cannot_have_its_mode_changed") {
        return;
    }
    let work = Dir::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let name = nix::unistd::ttyname(&pty.slave).unwrap();
    // The agent's user owns the terminal, as the user running sudo does.
    chown(&name, NOBODY);
    let before = std::fs::metadata(&name).unwrap().mode();
    let code = format!(
        "{ATTEMPT}
attempt('fchmod', lambda: os.fchmod(1, 0o666))
attempt('by_path', lambda: os.chmod('/proc/self/fd/1', 0o666))
attempt('fchown', lambda: os.fchown(1, os.getuid(), os.getgid()))
print('tty', os.isatty(1))
"
    );
    let w = work.path().to_str().unwrap();
    let out = Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::from(pty.slave))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let after = std::fs::metadata(&name).unwrap().mode();
    let mut master = std::fs::File::from(pty.master);
    nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&master),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut seen = vec![0u8; 4096];
    let n = master.read(&mut seen).unwrap_or(0);
    let seen = String::from_utf8_lossy(&seen[..n]).into_owned();
    assert_eq!(
        before & 0o7777,
        after & 0o7777,
        "the host's pty {name:?} changed mode\n{seen}\n{}",
        stderr(&out)
    );
    // Since adversarial round 23b a run without a pty of its own relays
    // the terminal: the agent writes to a pipe (tests/terminal_round23.rs).
    assert!(seen.contains("tty False"), "{seen}\n{}", stderr(&out));
    assert!(!seen.contains(" OK"), "{seen}");
}

/// The same through a named FIFO on the host (`> /tmp/fifo`): its inode is
/// on the host's read-write mount, so `fchmod(1)` made it 0666. A named
/// FIFO is relayed like a file; anonymous pipes are passed as they are.
#[test]
fn a_named_fifo_on_stdout_cannot_have_its_mode_changed() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run("a_named_fifo_on_stdout_cannot_have_its_mode_changed") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::new();
    let fifo = outside.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    chown(&fifo, NOBODY);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap_or_default())
    };
    let code = format!("{ATTEMPT}\nattempt('fchmod', lambda: os.fchmod(1, 0o666))\n");
    let w = work.path().to_str().unwrap();
    let out = Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdout(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let seen = reader.join().unwrap();
    let mode = std::fs::metadata(&fifo).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode,
        0o600,
        "the host's FIFO changed mode\n{seen}\n{}",
        stderr(&out)
    );
    assert!(seen.contains("fchmod EPERM"), "{seen}\n{}", stderr(&out));
}

/// Regression guard (held on the first try: the init has its own IPC
/// namespace): a SysV shared memory segment and a POSIX message queue the
/// host made open to everyone are not found from the sandbox, and the
/// segment was never attached (its attach count and last pid, as the host
/// kernel keeps them, are unchanged).
#[test]
fn the_hosts_sysv_segments_and_posix_queues_are_not_reachable() {
    if !can_run("the_hosts_sysv_segments_and_posix_queues_are_not_reachable") {
        return;
    }
    let work = Dir::new();
    let key = 0x7a7a_0000 | (std::process::id() as i32 & 0xffff);
    // SAFETY: plain SysV and mq calls with valid arguments.
    let shm = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
    assert!(shm >= 0, "shmget: {}", std::io::Error::last_os_error());
    let queue = format!("/tt-adv-{}", std::process::id());
    let qname = std::ffi::CString::new(queue.clone()).unwrap();
    // SAFETY: as above; a NULL attr asks for the defaults.
    let mq = unsafe {
        libc::mq_open(
            qname.as_ptr(),
            libc::O_CREAT | libc::O_RDWR,
            0o666 as libc::mode_t,
            std::ptr::null_mut::<libc::mq_attr>(),
        )
    };
    let code = format!(
        "{ATTEMPT}
libc.mq_open.restype = ctypes.c_int
attempt('shmget', lambda: checked(libc.shmget({key}, 4096, 0o666)))
attempt('mq_open', lambda: checked(libc.mq_open(b'{queue}', os.O_RDWR)))
"
    );
    let w = work.path().to_str().unwrap();
    let out = python(&["--write", w], work.path(), &code);
    // SAFETY: IPC_STAT fills `ds`; then the segment and queue are removed.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    let stat = unsafe { libc::shmctl(shm, libc::IPC_STAT, &mut ds) };
    unsafe {
        libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut());
        if mq >= 0 {
            libc::mq_close(mq);
        }
        libc::mq_unlink(qname.as_ptr());
    }
    assert_eq!(stat, 0);
    assert_eq!((ds.shm_nattch, ds.shm_lpid), (0, 0), "{}", stdout(&out));
    assert!(mq >= 0, "mq_open on the host failed");
    expect(&out, "shmget", "ENOENT");
    expect(&out, "mq_open", "ENOENT");
}

/// Unmounts what a test mounted on the host, also when it fails.
struct Unmount(Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Regression guard (held: the init makes every mount of its namespace
/// private first): a mount the host makes after the start, under a shared
/// mount outside the roots, does not appear in the sandbox. Were it to
/// propagate, it would arrive read-write (the read-only base was applied
/// before it existed) and its files' modes would be the agent's to change.
#[test]
fn a_host_mount_made_after_the_start_does_not_propagate_in() {
    use nix::mount::{MsFlags, mount};
    use std::os::unix::fs::MetadataExt;
    if !can_run("a_host_mount_made_after_the_start_does_not_propagate_in") {
        return;
    }
    let work = Dir::new();
    let shared = Dir::new();
    let point = shared.join("m");
    std::fs::create_dir(&point).unwrap();
    let none: Option<&str> = None;
    let mut mounted = Unmount(Vec::new());
    mount(
        Some(shared.path()),
        shared.path(),
        none,
        MsFlags::MS_BIND,
        none,
    )
    .unwrap();
    mounted.0.push(shared.path().to_path_buf());
    mount(none, shared.path(), none, MsFlags::MS_SHARED, none).unwrap();
    let (p, w) = (point.display(), work.path().display());
    let code = format!(
        "{ATTEMPT}
import time
open('{w}/ready', 'w').close()
for _ in range(200):
    if os.path.exists('{w}/go'): break
    time.sleep(0.02)
print('same_dev', os.stat('{p}').st_dev == os.stat('{p}/..').st_dev)
attempt('chmod', lambda: os.chmod('{p}', 0o777))
"
    );
    let child = Command::new(bin())
        .args(["run", "--write", work.path().to_str().unwrap(), "--"])
        .args(["python3", "-c", &code])
        .current_dir(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(10, || work.join("ready").exists()), "no start");
    let options = format!("mode=755,uid={NOBODY}");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(
        Some("tmpfs"),
        &point,
        Some("tmpfs"),
        flags,
        Some(options.as_str()),
    )
    .unwrap();
    mounted.0.push(point.clone());
    std::fs::write(work.join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    // The host's tmpfs, as the host sees it.
    let mode = std::fs::metadata(&point).unwrap().mode() & 0o7777;
    drop(mounted);
    assert_eq!(mode, 0o755, "{}", stdout(&out));
    expect(&out, "same_dev", "True");
    expect(&out, "chmod", "EROFS");
}

/// A directory handed in as a standard stream (here the writable root
/// itself, `< "$root"`) was a descriptor on the host's read-write mount:
/// `cd /proc/self/fd/0`, then `..` left the root on that mount, where
/// `chmod` of a file outside every root succeeded. A directory stream is
/// now always relayed (the agent reads a pipe that ends at once).
#[test]
fn a_directory_given_as_stdin_does_not_lead_onto_the_hosts_mount() {
    use std::os::unix::fs::MetadataExt;
    if !can_run("a_directory_given_as_stdin_does_not_lead_onto_the_hosts_mount") {
        return;
    }
    let top = Dir::new();
    let root = top.join("root");
    std::fs::create_dir(&root).unwrap();
    chown(&root, NOBODY);
    let outside = top.file("outside.txt", "host\n");
    std::fs::set_permissions(
        &outside,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["run", "--write", root.to_str().unwrap(), "--", "sh", "-c"])
        .arg("cd /proc/self/fd/0 && chmod 777 ../outside.txt && echo chmod-OK")
        .current_dir(&root)
        .stdin(std::fs::File::open(&root).unwrap())
        .output()
        .unwrap();
    let mode = std::fs::metadata(&outside).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o644, "{}{}", stdout(&out), stderr(&out));
    assert!(!stdout(&out).contains("chmod-OK"));
}
