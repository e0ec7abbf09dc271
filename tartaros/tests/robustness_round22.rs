//! Adversarial round 22: starts that failed for no good reason — many
//! `--port` grants, a writable root that is a file, a launcher near its
//! process limit.

mod common;
use common::*;

/// 64 `--port` grants (128 listeners) start, and the last one reaches its
/// host port: the listeners no longer travel in a single SCM_RIGHTS message
/// (33 ports failed with ENOBUFS). Loopback only.
#[test]
fn sixty_four_ports_start_and_the_last_one_works() {
    if !can_run("sixty_four_ports_start_and_the_last_one_works") {
        return;
    }
    let work = Dir::new();
    // Held open so no other process takes them while the run lasts; only
    // the last is ever connected to.
    let held: Vec<std::net::TcpListener> = (0..63)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let (last, hits) = host_listener(b"hello from port 64");
    let mut ports: Vec<String> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port().to_string())
        .collect();
    ports.push(last.to_string());
    let mut flags: Vec<&str> = Vec::new();
    for port in &ports {
        flags.extend_from_slice(&["--port", port]);
    }
    let code = format!(
        "{ATTEMPT}
import socket
def fetch():
    s = socket.create_connection(('127.0.0.1', {last}), timeout=5)
    s.sendall(b'hi')
    if s.recv(100) != b'hello from port 64':
        raise OSError(errno.EIO, 'wrong answer')
attempt('last', fetch)"
    );
    let out = python(&flags, work.path(), &code);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "last", "OK");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// `--write FILE` without `--deny-unix` starts (the unix policy's mirror
/// skips a root that is a file), and the agent may write that file and
/// nothing else beside it.
#[test]
fn a_writable_root_that_is_a_file_starts_and_grants_that_file_alone() {
    if !can_run("a_writable_root_that_is_a_file_starts_and_grants_that_file_alone") {
        return;
    }
    let work = Dir::open_to_all();
    let notes = work.file("notes.txt", "before\n");
    let other = work.file("other.txt", "untouched\n");
    let (n, o, d) = (
        notes.to_str().unwrap(),
        other.to_str().unwrap(),
        work.path().to_str().unwrap(),
    );
    let code = format!(
        "{ATTEMPT}
def write(path):
    with open(path, 'w') as f:
        f.write('after\\n')
attempt('notes', lambda: write('{n}'))
attempt('other', lambda: write('{o}'))
attempt('new', lambda: write('{d}/new.txt'))
attempt('remove', lambda: os.unlink('{n}'))"
    );
    let out = python(&["--write", n], work.path(), &code);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "notes", "OK");
    expect(&out, "other", "EROFS");
    expect(&out, "new", "EROFS");
    expect(&out, "remove", "EROFS");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "after\n");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "untouched\n");
    assert!(!work.path().join("new.txt").exists());
}

/// A pids cgroup for the launcher, removed on drop (its processes have
/// exited by then: each run is waited for).
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
    fn new() -> Option<Self> {
        let name = format!("tartaros-test-r22-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/pids");
        let parent = if v1.join("pids.max").exists() || v1.join("cgroup.procs").exists() {
            v1.to_path_buf()
        } else {
            let root = cgroup2_root()?;
            let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).ok()?;
            if !enabled.split_whitespace().any(|c| c == "pids") {
                return None;
            }
            root
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        Some(Self(dir))
    }

    fn limit(&self, max: &str) {
        std::fs::write(self.0.join("pids.max"), max).unwrap();
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("pids.max"), "max");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A launcher in a cgroup of 2 to 9 processes, its stdout a file (the
/// relay's path): each run starts or fails with exit 125 and one
/// `tartaros:` line naming the process limit; never a panic (134), never a
/// refusal of the stream as a denied path (78), never the kernel version.
#[test]
fn a_launcher_at_its_process_limit_is_told_so_in_one_line() {
    let test = "a_launcher_at_its_process_limit_is_told_so_in_one_line";
    if !can_run(test) {
        return;
    }
    let Some(cgroup) = PidsCgroup::new() else {
        return skip(test, "no pids cgroup controller to limit the launcher with");
    };
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let procs = cgroup.0.join("cgroup.procs");
    let mut failures = 0;
    for max in 2..10 {
        cgroup.limit(&max.to_string());
        let out_file = work.join(&format!("out{max}.txt"));
        let launch = format!(
            "echo $$ > {}; exec {} run -q --write {w} -- /bin/true",
            procs.display(),
            bin()
        );
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &launch])
            .stdout(std::fs::File::create(&out_file).unwrap())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        cgroup.limit("max");
        let err = stderr(&out) + &std::fs::read_to_string(&out_file).unwrap();
        let code = out.status.code();
        if code == Some(0) {
            continue;
        }
        failures += 1;
        assert_eq!(code, Some(125), "pids.max={max}: {err}");
        assert_eq!(err.lines().count(), 1, "pids.max={max}: {err}");
        assert!(err.starts_with("tartaros: "), "pids.max={max}: {err}");
        assert!(
            err.contains("pids.max") && !err.contains("kernel must be"),
            "pids.max={max}: {err}"
        );
    }
    assert!(
        failures > 0,
        "no limit from 2 to 9 processes stopped a start"
    );
}
