//! Shared helpers for the integration tests: they run the real `tartaros`
//! binary as root against the real kernel.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const NOBODY: u32 = 65534;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tartaros")
}

/// Whether the test can run here. Off root it skips with a reason, except
/// under CI=true, where a skipped kernel test would hide a regression.
pub fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root, and CI must run it");
    }
    eprintln!("skipping {test}: needs root");
    false
}

/// A temporary directory that the sandboxed agent (uid nobody) owns, so a
/// write that fails there fails because of the sandbox, not of file modes.
pub struct Dir {
    pub dir: tempfile::TempDir,
}

impl Dir {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tt-")
            .tempdir()
            .expect("tempdir");
        chown(dir.path(), NOBODY);
        Self { dir }
    }

    /// A directory anyone may write, so that only the sandbox stops a write.
    pub fn open_to_all() -> Self {
        let d = Self::new();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        d
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file owned by the agent's uid.
    pub fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
            chown(parent, NOBODY);
        }
        std::fs::write(&path, content).expect("write");
        chown(&path, NOBODY);
        path
    }
}

pub fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
}

/// Runs `tartaros <args>` from `cwd`.
pub fn tartaros(args: &[&str], cwd: &Path) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run tartaros")
}

/// Runs a Python snippet in the sandbox; `run_flags` come before `--`.
pub fn python(run_flags: &[&str], cwd: &Path, code: &str) -> Output {
    let mut args = vec!["run"];
    args.extend_from_slice(run_flags);
    args.extend_from_slice(&["--", "python3", "-c", code]);
    tartaros(&args, cwd)
}

/// Runs `agent` (Python, after [`ATTEMPT`]) with `work` writable and the
/// log at `log`, the work directory as its one argument; prints what it
/// printed.
pub fn logged_agent(work: &Dir, log: &Path, agent: &str) -> Output {
    let w = work.path().to_str().unwrap();
    let code = format!("{ATTEMPT}{agent}");
    let flags = ["--write", w, "--log", log.to_str().unwrap()];
    let mut args = vec!["run"];
    args.extend_from_slice(&flags);
    args.extend_from_slice(&["--", "python3", "-c", &code, w]);
    let out = tartaros(&args, work.path());
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    out
}

/// A Python prelude with `attempt(label, fn)`, which prints `label OK` or
/// `label <ERRNO-NAME>`, so tests can assert the exact errno.
pub const ATTEMPT: &str = r#"
import os, errno, sys, ctypes
libc = ctypes.CDLL(None, use_errno=True)
def checked(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return rc
def attempt(label, fn):
    try:
        fn()
        print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
    sys.stdout.flush()
"#;

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that the line `label RESULT` was printed.
#[track_caller]
pub fn expect(out: &Output, label: &str, result: &str) {
    let text = stdout(out);
    let want = format!("{label} {result}");
    assert!(
        text.lines().any(|l| l == want),
        "expected `{want}`\nstdout:\n{text}\nstderr:\n{}",
        stderr(out)
    );
}

/// Names of the run cgroups that exist now (there must be none left).
pub fn run_cgroups() -> Vec<String> {
    let Some(root) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .find(|p| Path::new(p).join("cgroup.procs").exists() && is_cgroup2(p))
    else {
        return vec![];
    };
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tartaros-") && !n.starts_with("tartaros-test"))
                .collect()
        })
        .unwrap_or_default()
}

fn is_cgroup2(path: &str) -> bool {
    Path::new(path).join("cgroup.controllers").exists()
}

/// Pids of live `sleep` processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.starts_with("sleep ") && cmdline.contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// Polls `cond` for up to `secs` seconds.
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

/// `tartaros args...` in `cwd` as the ordinary user `uid` (no groups, no
/// `SUDO_UID`): uids with no passwd entry leave nothing on the host.
pub fn tartaros_as(uid: u32, args: &[&str], cwd: &Path) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            bin(),
        ])
        .args(args)
        .current_dir(cwd)
        .env_remove("SUDO_UID");
    command
}

/// [`tartaros_as`], run to its end.
pub fn run_as(uid: u32, args: &[&str], cwd: &Path) -> Output {
    tartaros_as(uid, args, cwd).output().expect("setpriv")
}

/// Starts `tartaros args...` in `cwd` with its output discarded, killed
/// when the returned guard drops.
pub fn spawn_quiet(args: &[&str], cwd: &Path) -> KillOnDrop {
    KillOnDrop(Some(
        std::process::Command::new(bin())
            .args(args)
            .current_dir(cwd)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn tartaros"),
    ))
}

/// A spawned supervisor that is SIGKILLed if the test fails before it ends,
/// so a failing test does not leave a sandbox running.
pub struct KillOnDrop(pub Option<std::process::Child>);

impl KillOnDrop {
    pub fn take(&mut self) -> std::process::Child {
        self.0.take().expect("child already taken")
    }
    pub fn id(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Skips `test` with a reason, or fails it under CI=true (for tests with
/// more preconditions than root).
pub fn skip(test: &str, reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} cannot run: {reason}");
    }
    eprintln!("skipping {test}: {reason}");
}

/// The cgroup v2 hierarchy: `/sys/fs/cgroup/unified` on hybrid hosts,
/// `/sys/fs/cgroup` on pure-v2 hosts (checked by filesystem magic).
pub fn cgroup2_root() -> Option<PathBuf> {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| {
            nix::sys::statfs::statfs(path)
                .is_ok_and(|st| st.filesystem_type().0 == CGROUP2_SUPER_MAGIC)
        })
}

/// A test cgroup with programs attached and a child inside: on drop (also
/// when the test fails half-way) kills the child, detaches, and removes the
/// cgroup, retrying briefly because reaped processes leave it
/// asynchronously.
pub struct CgroupGuard {
    pub cgroup: PathBuf,
    pub programs: Option<tartaros::ebpf::CgroupPrograms>,
    pub child: Option<std::process::Child>,
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.programs.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while let Err(e) = std::fs::remove_dir(&self.cgroup) {
            if e.kind() == std::io::ErrorKind::NotFound || std::time::Instant::now() > deadline {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("failed to remove {}: {e}", self.cgroup.display());
                }
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Every record of the effect log at `log`, parsed.
pub fn records(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .expect("read log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// `tartaros log verify` of `log`: its exit code and line.
pub fn verify_log(log: &Path) -> (i32, String) {
    let out = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    (out.status.code().unwrap_or(-1), stdout(&out))
}

/// A fresh directory owned by `uid`.
pub fn owned_dir(uid: u32) -> Dir {
    let dir = Dir::new();
    chown(dir.path(), uid);
    dir
}

/// A host TCP listener on 127.0.0.1 that answers `body` and counts its
/// connections.
pub fn host_listener(body: &'static [u8]) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(body);
        }
    });
    (port, hits)
}

/// The descriptors of a process, as (number, what it points at).
pub fn open_fds(pid: i32) -> Vec<(i32, String)> {
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let fd = e.file_name().to_string_lossy().parse().ok()?;
                    let target = std::fs::read_link(e.path()).ok()?;
                    Some((fd, target.to_string_lossy().into_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    fds.sort();
    fds
}

pub mod lease;
pub mod logged;
#[allow(dead_code)]
pub mod pins;
#[allow(dead_code)]
pub mod proxied;

/// Who launches a run whose agent plants files in its writable root.
pub enum Planter {
    /// Root launches; the agent is nobody (the default).
    Nobody,
    /// Root launches with `--user root`: uid 0 without capabilities.
    UserRoot,
    /// An ordinary user launches (no service); the agent is that user.
    Ordinary(u32),
}

/// `tartaros run -q [--user root] --write W -- python3 -c SCRIPT W` as
/// `planter` would start it, in a work dir it owns: the dir and the output.
pub fn plant(planter: Planter, script: &str) -> (Dir, Output) {
    let work = match planter {
        Planter::Ordinary(uid) => owned_dir(uid),
        _ => Dir::new(),
    };
    if matches!(planter, Planter::UserRoot) {
        chown(work.path(), 0);
    }
    let w = work.path().to_str().unwrap().to_string();
    let mut args = vec!["run", "-q"];
    if matches!(planter, Planter::UserRoot) {
        args.extend(["--user", "root"]);
    }
    args.extend(["--write", &w, "--", "python3", "-c", script, &w]);
    let out = match planter {
        Planter::Ordinary(uid) => run_as(uid, &args, work.path()),
        _ => tartaros(&args, work.path()),
    };
    (work, out)
}

/// A tmpfs of its own (a small disk to fill), unmounted lazily on drop so
/// that a failing test cannot leave it busy.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tt-tmpfs-")
            .tempdir()
            .expect("tempdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg("tmpfs")
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(ok.success(), "mount tmpfs");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The bytes an unprivileged writer may still use.
    pub fn free(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(self.0.path()).unwrap();
        st.blocks_available() * st.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// Puts `fd` on descriptor 9 of `command`'s process (the tests' usual
/// `--status-fd 9`), inheritable: `dup2`, or, when `fd` is 9 already, a
/// clear of its close-on-exec flag (`dup2(9, 9)` leaves it set).
#[allow(dead_code)]
pub fn on_fd9(command: &mut Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: dup2 and fcntl between fork and exec, async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let ok = if fd == 9 {
                libc::fcntl(9, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 9)
            };
            if ok < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes `slave` the standard streams and the controlling terminal of
/// `command`'s process, in a session of its own, as a login shell's
/// terminal is.
#[allow(dead_code)]
pub fn on_terminal(command: &mut Command, slave: std::os::fd::OwnedFd) {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    command
        .stdin(Stdio::from(slave.try_clone().expect("dup the slave")))
        .stdout(Stdio::from(slave.try_clone().expect("dup the slave")))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; they make the slave
    // (now fd 0) the controlling terminal of the new session.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
