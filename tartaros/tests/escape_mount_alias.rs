//! Denies reached through another mount of the same directory. A deny is
//! a mount on one path; the host can show the same directory at other
//! paths too (a bind of `/home` elsewhere, a project bound into another, a
//! btrfs top level, ostree's `/sysroot`). The agent makes no mounts, so
//! these are the host's own, and each failed on the binary before its fix
//! (5b25738): the read-denied secret was read, the write-denied config
//! changed and the effect log read and truncated through the alias.
//! Proved from the host side: file contents, and `log verify`.

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A bind mount made by the test, lazily unmounted on drop (even when
/// the test fails).
struct Bind(PathBuf);

impl Bind {
    fn new(source: &Path, target: &Path) -> Self {
        let ok = Command::new("mount")
            .arg("--bind")
            .args([source, target])
            .status()
            .expect("mount");
        assert!(ok.success(), "mount --bind {source:?} {target:?}");
        Self(target.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `--read-deny H/.ssh` on a host that also shows H at M (a bind of the
/// parent) and H/.ssh/keys at K (a mount of a part of the denied tree).
#[test]
fn a_read_deny_holds_at_every_other_mount_of_the_denied_directory() {
    if !can_run("a_read_deny_holds_at_every_other_mount_of_the_denied_directory") {
        return;
    }
    let (work, home, elsewhere) = (Dir::new(), Dir::new(), Dir::new());
    home.file(".ssh/id", "SECRET-ID\n");
    home.file(".ssh/keys/k", "SECRET-KEY\n");
    home.file("notes.txt", "visible\n");
    let mirror = elsewhere.join("mirror");
    let keys = elsewhere.join("keys");
    std::fs::create_dir_all(&mirror).unwrap();
    std::fs::create_dir_all(&keys).unwrap();
    let _m = Bind::new(home.path(), &mirror);
    let _k = Bind::new(&home.join(".ssh/keys"), &keys);
    let deny = home.join(".ssh");
    let script = format!(
        "for f in {h}/.ssh/id {m}/.ssh/id {m}/.ssh/keys/k {k}/k {m}/notes.txt; do cat $f 2>&1; done",
        h = home.path().display(),
        m = mirror.display(),
        k = keys.display()
    );
    let w = work.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run",
            "-q",
            "--write",
            w,
            "--read-deny",
            deny.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !said.contains("SECRET"),
        "a denied file was read through another mount:\n{said}"
    );
    // Control: the alias itself is there; only the denied part is hidden.
    assert!(stdout(&out).contains("visible"), "{said}");
}

/// An ordinary user's run with `--write W --write-deny W/proj/.git --log
/// L/effects.jsonl`, where the host shows W/proj again at W/alias and L
/// at W/logs: the agent is the user, so only the sandbox stands between
/// it and those files.
#[test]
fn a_write_deny_and_the_log_hold_at_every_other_mount_of_them() {
    if !can_run("a_write_deny_and_the_log_hold_at_every_other_mount_of_them") {
        return;
    }
    const UID: u32 = 47_000 + 132;
    let (work, logs) = (owned_dir(UID), owned_dir(UID));
    let config = work.file("proj/.git/config", "[core]\n");
    for dir in ["proj", "proj/.git", "alias", "logs"] {
        std::fs::create_dir_all(work.join(dir)).unwrap();
        chown(&work.join(dir), UID);
    }
    chown(&config, UID);
    let _a = Bind::new(&work.join("proj"), &work.join("alias"));
    let _l = Bind::new(logs.path(), &work.join("logs"));
    let log = logs.join("effects.jsonl");
    let w = work.path().to_str().unwrap();
    let script = format!(
        "echo '[evil]' >> {w}/alias/.git/config
head -c 200 {w}/logs/effects.jsonl
true > {w}/logs/effects.jsonl
echo made > {w}/alias/other.txt"
    );
    let deny = work.join("proj/.git");
    let out = run_as(
        UID,
        &[
            "run",
            "-q",
            "--write",
            w,
            "--write-deny",
            deny.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "[core]\n",
        "the write-denied file changed through another mount:\n{said}"
    );
    assert!(
        !stdout(&out).contains("genesis"),
        "the agent read the log:\n{said}"
    );
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    // Incomplete (3) without capture for an ordinary user; never tampered.
    assert_eq!(
        verify.status.code(),
        Some(3),
        "{}{}\n{said}",
        stdout(&verify),
        stderr(&verify)
    );
    // Control: the alias itself is writable, as the root around it.
    assert_eq!(
        std::fs::read_to_string(work.join("proj/other.txt")).unwrap_or_default(),
        "made\n",
        "{said}"
    );
}

/// An ordinary user's run has no eBPF unix policy: the host's sockets
/// listening at the start are hidden by a mount on each. A host that shows
/// the socket's directory again at another path left it reachable there.
#[test]
fn a_hidden_host_socket_stays_hidden_at_another_mount_of_its_directory() {
    if !can_run("a_hidden_host_socket_stays_hidden_at_another_mount_of_its_directory") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const UID: u32 = 47_000 + 133;
    let (work, run, elsewhere) = (owned_dir(UID), Dir::new(), Dir::new());
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = run.join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let (a, d) = (accepted.clone(), done.clone());
    let thread = std::thread::spawn(move || {
        while d.load(Ordering::SeqCst) == 0 {
            if listener.accept().is_ok() {
                a.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    });
    let mirror = elsewhere.join("run");
    std::fs::create_dir_all(&mirror).unwrap();
    let _b = Bind::new(run.path(), &mirror);
    let code = format!(
        "import socket
for p in ['{}', '{}']:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p); print(p, 'connected')
    except OSError as e:
        print(p, e.errno)",
        socket.display(),
        mirror.join("daemon.sock").display()
    );
    let w = work.path().to_str().unwrap();
    let out = run_as(
        UID,
        &["run", "-q", "--write", w, "--", "python3", "-c", &code],
        work.path(),
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    done.store(1, Ordering::SeqCst);
    thread.join().unwrap();
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2, "{said}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the host socket accepted the agent:\n{said}"
    );
}
