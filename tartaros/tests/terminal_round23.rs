//! Adversarial round 23b: the launcher's terminal without a pty of the
//! run's own (`tartaros run -- agent > log` at a prompt).
//!
//! The test plays the user's terminal with a pty pair of its own. A small
//! Python "shell" (DRIVER) is the session leader on its slave, with it as
//! controlling terminal, and does what a shell does: puts `tartaros run`
//! in the foreground or the background, stops it as Ctrl-Z does, takes
//! the terminal back and reads what the user types. The test types on the
//! master and checks the results from the host side: what the shell and
//! the agent read, whether the agent ran while its job was stopped, the
//! launcher's descriptor flags, a host node's mode, a host job's state,
//! and which session the terminal belongs to.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// The shell. Notes its findings as `key value` lines in `work/result`,
/// and prints `@@name` on the terminal when the user should type.
const DRIVER: &str = r#"
import os, sys, time, select, signal, fcntl, termios
mode, work, tt = sys.argv[1], sys.argv[2], sys.argv[3]
res = open(os.path.join(work, 'result'), 'w', buffering=1)
def note(k, v): res.write('%s %r\n' % (k, v))
def mark(m): os.write(2, ('@@' + m + '\n').encode())
for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
    signal.signal(s, signal.SIG_IGN)
def wait_for(path, secs=30):
    end = time.time() + secs
    while time.time() < end and not os.path.exists(path):
        time.sleep(0.05)
    return os.path.exists(path)
def ticks():
    try: return int(open(os.path.join(work, 'ticks')).read() or 0)
    except (OSError, ValueError): return -1
def job(argv, fg):
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        if fg: os.tcsetpgrp(0, os.getpgrp())
        for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
            signal.signal(s, signal.SIG_DFL)
        fd = os.open(os.path.join(work, 'job.out'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.execv(tt, argv)
    # Both sides, as shells do; EACCES once the child has exec'd (it set
    # its group itself then).
    try: os.setpgid(pid, pid)
    except PermissionError: pass
    if fg: os.tcsetpgrp(0, pid)
    return pid
def end(pid):
    os.tcsetpgrp(0, os.getpgrp())
    os.killpg(pid, signal.SIGCONT)
    os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + 20
    while time.time() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]: return
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL); os.waitpid(pid, 0)
def shell_read(secs):
    r, _, _ = select.select([0], [], [], secs)
    return os.read(0, 100) if r else b''
def got():
    try: return open(os.path.join(work, 'got')).read()
    except OSError: return ''
run = [tt, 'run', '-q', '--write', work, '--timeout', '60s', '--']
if mode in ('ctrlz', 'background'):
    j = job(run + ['python3', '-c', sys.argv[4], work], mode == 'ctrlz')
    note('started', wait_for(os.path.join(work, 'started')))
    time.sleep(0.3)
    if mode == 'ctrlz':
        os.killpg(j, signal.SIGTSTP)
        _, st = os.waitpid(j, os.WUNTRACED)
        note('stopped', os.WIFSTOPPED(st))
        os.tcsetpgrp(0, os.getpgrp())
        time.sleep(0.5)
        t = ticks(); time.sleep(1.0)
        note('ticks_while_stopped', ticks() - t)
    mark('type')
    note('shell_got', shell_read(10))
    time.sleep(0.5)
    os.tcsetpgrp(0, j)
    os.killpg(j, signal.SIGCONT)
    mark('type2')
    deadline = time.time() + 10
    while time.time() < deadline and 'second' not in got():
        time.sleep(0.05)
    t = ticks(); time.sleep(0.5)
    note('ticks_after_cont', ticks() - t)
    end(j)
    note('agent_got', got())
elif mode == 'nonblock':
    fd = os.open('/dev/tty', os.O_RDWR)
    os.dup2(fd, 0); os.close(fd)
    note('before', fcntl.fcntl(0, fcntl.F_GETFL))
    j = job(run + ['python3', '-c', sys.argv[4]], True)
    os.waitpid(j, 0)
    os.tcsetpgrp(0, os.getpgrp())
    note('after', fcntl.fcntl(0, fcntl.F_GETFL))
elif mode == 'fchmod':
    fd = os.open(sys.argv[5], os.O_RDWR)
    os.dup2(fd, 0); os.close(fd)
    j = job([tt, 'run', '-q', '--user', 'root', '--', 'python3', '-c', sys.argv[4]], True)
    os.waitpid(j, 0)
    os.tcsetpgrp(0, os.getpgrp())
    note('done', True)
elif mode == 'tostop':
    bg = os.fork()
    if bg == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        for i in range(200):
            os.write(2, b'tick\r\n'); time.sleep(0.1)
        os._exit(0)
    try: os.setpgid(bg, bg)
    except PermissionError: pass
    time.sleep(0.3)
    j = job(run + ['python3', '-c', sys.argv[4]], True)
    os.waitpid(j, 0)
    os.tcsetpgrp(0, os.getpgrp())
    time.sleep(0.6)
    note('tostop_now', bool(termios.tcgetattr(0)[3] & termios.TOSTOP))
    note('bg_state', open('/proc/%d/stat' % bg).read().rsplit(')', 1)[1].split()[0])
    os.kill(bg, signal.SIGCONT); os.kill(bg, signal.SIGKILL); os.waitpid(bg, 0)
mark('done')
"#;

/// Ticks while it runs; saves every line it reads from stdin.
const READER: &str = r#"
import os, sys, threading, time
w = sys.argv[1]
def tick():
    n = 0
    while True:
        n += 1
        with open(w + '/ticks.tmp', 'w') as f: f.write(str(n))
        os.replace(w + '/ticks.tmp', w + '/ticks')
        time.sleep(0.05)
threading.Thread(target=tick, daemon=True).start()
open(w + '/started', 'w').close()
for line in sys.stdin:
    with open(w + '/got', 'a') as f: f.write(line)
"#;

/// The user's terminal: the master, what came out of it, and the shell.
struct Session {
    master: std::fs::File,
    seen: Arc<Mutex<String>>,
    shell: Child,
}

impl Session {
    fn start(mode: &str, work: &Path, extra: &[&str]) -> Self {
        let pair = nix::pty::openpty(None, None).expect("openpty");
        let mut command = Command::new("python3");
        command
            .args(["-c", DRIVER, mode, work.to_str().expect("utf-8"), bin()])
            .args(extra);
        on_terminal(&mut command, pair.slave);
        let shell = command.spawn().expect("spawn the shell");
        drop(command);
        let master = std::fs::File::from(pair.master);
        let seen = Arc::new(Mutex::new(String::new()));
        let mut reader = master.try_clone().expect("dup master");
        let into = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once no slave is open: the shell is gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut seen) = into.lock() {
                    seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        Self {
            master,
            seen,
            shell,
        }
    }

    fn seen(&self) -> String {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn wait_mark(&self, mark: &str) {
        let needle = format!("@@{mark}");
        assert!(
            eventually(60, || self.seen().contains(&needle)),
            "no {needle} from the shell; the terminal shows:\n{}",
            self.seen()
        );
    }

    fn type_text(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).expect("type");
    }

    /// Waits (bounded) for the shell's note `key`.
    fn note(&self, work: &Path, key: &str) -> String {
        let mut value = None;
        eventually(20, || {
            value = notes(work).remove(key);
            value.is_some()
        });
        value.unwrap_or_else(|| format!("no {key} noted; the terminal shows:\n{}", self.seen()))
    }

    /// Waits for the shell to end; its notes.
    fn finish(mut self, work: &Path) -> HashMap<String, String> {
        self.wait_mark("done");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.shell.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "the shell did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        notes(work)
    }
}

/// The shell's notes so far.
fn notes(work: &Path) -> HashMap<String, String> {
    let notes = std::fs::read_to_string(work.join("result")).unwrap_or_default();
    notes
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Drop for Session {
    /// A failed test leaves no job behind: every process of the shell's
    /// session (its jobs are process groups of their own) is killed; a
    /// killed supervisor takes its sandbox with it.
    fn drop(&mut self) {
        let session = self.shell.id() as i32;
        for pid in in_session(session) {
            // SAFETY: a signal to a process of the test's own session.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.shell.wait();
    }
}

/// The pids whose session is `sid` (field 6 of `/proc/<pid>/stat`).
fn in_session(sid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        if fields.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(sid) {
            found.push(pid);
        }
    }
    found
}

/// Runs `mode` in a pty session with the reader agent; the user types a
/// line while the job is stopped or in the background, then another once
/// it is in the foreground. Checks that the shell got the first line and
/// the agent only the second; returns the notes.
fn typed_lines(mode: &str) -> HashMap<String, String> {
    let work = Dir::new();
    let mut session = Session::start(mode, work.path(), &[READER]);
    session.wait_mark("type");
    session.type_text("hunter2\n");
    // The line typed while the job is stopped or in the background is
    // the shell's, not the agent's.
    assert_eq!(session.note(work.path(), "shell_got"), "b'hunter2\\n'");
    session.wait_mark("type2");
    session.type_text("second\n");
    let notes = session.finish(work.path());
    let all = format!("{notes:?}");
    for (key, want) in [("started", "True"), ("shell_got", "b'hunter2\\n'")] {
        assert_eq!(notes.get(key).map(String::as_str), Some(want), "{all}");
    }
    assert!(!notes["agent_got"].contains("hunter2"), "{all}");
    // In the foreground, the agent reads as before.
    assert!(notes["agent_got"].contains("second"), "{all}");
    notes
}

/// Ctrl-Z stopped the supervisor, but the agent (a session of its own)
/// ran on and read the line the user then typed at the shell. Now the
/// job's stop freezes the agent, and the line reaches the shell.
#[test]
fn ctrl_z_stops_the_agent_and_the_shell_gets_the_next_line() {
    if !can_run("ctrl_z_stops_the_agent_and_the_shell_gets_the_next_line") {
        return;
    }
    let notes = typed_lines("ctrlz");
    let all = format!("{notes:?}");
    assert_eq!(
        notes.get("stopped").map(String::as_str),
        Some("True"),
        "{all}"
    );
    // Frozen while stopped; running again, and reading again, once continued.
    assert_eq!(
        notes.get("ticks_while_stopped").map(String::as_str),
        Some("0"),
        "{all}"
    );
    let after: i64 = notes["ticks_after_cont"].parse().unwrap_or(0);
    assert!(after > 0, "{all}");
}

/// `tartaros run -- agent > out &`: the agent read the terminal where a
/// background job would get SIGTTIN. Now it gets nothing until `fg`.
#[test]
fn a_background_run_does_not_read_the_shells_input() {
    if !can_run("a_background_run_does_not_read_the_shells_input") {
        return;
    }
    typed_lines("background");
}

/// `TIOCSCTTY` on a terminal no session owns (a VT, a serial console; here
/// a pty the test owns) made it the agent's controlling terminal; for a
/// VT the kernel hung it up for the host when the agent exited.
#[test]
fn the_agent_cannot_take_a_host_terminal_as_its_controlling_terminal() {
    if !can_run("the_agent_cannot_take_a_host_terminal_as_its_controlling_terminal") {
        return;
    }
    let work = Dir::new();
    let pair = nix::pty::openpty(None, None).expect("openpty");
    let agent = format!(
        "import fcntl, os, termios, time
try:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0); r = 'ok'
except OSError as e:
    r = e.strerror
open('{w}/taken', 'w').write(r)
time.sleep(2)",
        w = work.path().display()
    );
    let w = work.path().to_str().expect("utf-8");
    let mut child = Command::new(bin())
        .args(["run", "-q", "--write", w, "--", "python3", "-c", &agent])
        .stdin(Stdio::from(pair.slave))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tartaros");
    assert!(
        eventually(30, || work.join("taken").exists()),
        "the agent did not start"
    );
    let mut sid: libc::pid_t = 0;
    // SAFETY: TIOCGSID writes one pid_t into `sid`.
    let rc = unsafe { libc::ioctl(pair.master.as_raw_fd(), libc::TIOCGSID, &mut sid) };
    let taken = std::fs::read_to_string(work.join("taken")).unwrap_or_default();
    let _ = child.wait();
    assert!(
        rc != 0,
        "the test's terminal became session {sid}'s (agent: {taken})"
    );
}

/// `< /dev/tty` could not be reopened by the init and stayed the
/// launcher's descriptor: the agent's `O_NONBLOCK` stayed on the
/// launcher's open file description after the run.
#[test]
fn the_launchers_descriptor_flags_are_unchanged_after_the_run() {
    if !can_run("the_launchers_descriptor_flags_are_unchanged_after_the_run") {
        return;
    }
    let work = Dir::new();
    let agent = "import fcntl, os
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)";
    let session = Session::start("nonblock", work.path(), &[agent]);
    let notes = session.finish(work.path());
    let all = format!("{notes:?}");
    assert!(notes.contains_key("before"), "{all}");
    assert_eq!(notes.get("before"), notes.get("after"), "{all}");
}

/// A terminal node the init could not reopen by name (a `c 5 0` node, as
/// `/dev/tty` is) was the launcher's descriptor on the host's mount: a
/// `--user root` agent `fchmod`ed the host node.
#[test]
fn a_root_agent_cannot_change_the_mode_of_a_host_terminal_node() {
    if !can_run("a_root_agent_cannot_change_the_mode_of_a_host_terminal_node") {
        return;
    }
    let work = Dir::new();
    let nodes = tempfile::Builder::new()
        .prefix("tt-node-")
        .tempdir()
        .expect("tempdir");
    let node = nodes.path().join("devtty");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(5, 0),
    )
    .expect("mknod");
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let agent = "import os
for f in (lambda: os.fchmod(0, 0o600), lambda: os.chmod('/proc/self/fd/0', 0o600)):
    try: f()
    except OSError: pass";
    let session = Session::start(
        "fchmod",
        work.path(),
        &[agent, node.to_str().expect("utf-8")],
    );
    let notes = session.finish(work.path());
    let mode = std::fs::metadata(&node).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o666, "the host node's mode changed; {notes:?}");
}

/// The agent set TOSTOP on the launcher's terminal: a host background job
/// that writes to it was stopped (SIGTTOU) and stayed stopped.
#[test]
fn the_agent_cannot_stop_the_users_background_jobs() {
    if !can_run("the_agent_cannot_stop_the_users_background_jobs") {
        return;
    }
    let work = Dir::new();
    let agent = "import termios, time
for fd in (0, 1, 2):
    try:
        a = termios.tcgetattr(fd); a[3] |= termios.TOSTOP
        termios.tcsetattr(fd, termios.TCSANOW, a)
    except termios.error: pass
time.sleep(1.5)";
    let session = Session::start("tostop", work.path(), &[agent]);
    let notes = session.finish(work.path());
    let all = format!("{notes:?}");
    let state = notes.get("bg_state").map(String::as_str).unwrap_or("none");
    assert!(state == "'S'" || state == "'R'", "{all}");
    assert_eq!(
        notes.get("tostop_now").map(String::as_str),
        Some("False"),
        "{all}"
    );
}
