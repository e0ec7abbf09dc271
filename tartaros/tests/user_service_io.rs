//! The root service's input and output on the caller's descriptors: the
//! stdio a client sends by SCM_RIGHTS are the caller's, and what root
//! copies to and from them must carry the caller's identity, not root's.
//! A client is any program that speaks the frame protocol (the socket is
//! mode 0666), so these tests speak it themselves, as an unnamed uid.

mod common;
#[path = "support/service.rs"]
mod harness;

use common::*;
use harness::Service;

const DORA: u32 = 47_000 + 181;

/// A client of the service speaking the frame protocol by hand: its
/// stdout is one end of a socket pair whose other end (kept here, with
/// `SO_PASSCRED`) reports the credentials of every write that reaches it;
/// prints `uid <n> <bytes>` for each.
const CLIENT: &str = r#"
import array, json, os, socket, struct, sys, time
sock_path, args = sys.argv[1], json.loads(sys.argv[2])
def pair():
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return mine, theirs
out, out_theirs = pair()
status, status_theirs = pair()
if os.environ.get("STALLED_STATUS"):
    # A status pipe that is full and never read, its read end held open.
    status, status_theirs = os.pipe()
    os.set_blocking(status_theirs, False)
    try:
        while True:
            os.write(status_theirs, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(status_theirs, True)
    status_theirs = open(status_theirs, "wb", closefd=True)
r, w = os.pipe()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
body = json.dumps({"version": 1, "args": args, "cwd": "/tmp",
                   "env": [["PATH", "/usr/bin:/bin"]]}).encode()
frame = struct.pack("<I", len(body)) + body
fds = [0, out_theirs.fileno(), w]
if "--status-fd" in args:
    fds.append(status_theirs.fileno())
s.sendmsg([frame[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
s.sendall(frame[4:])
out_theirs.close(); status_theirs.close(); os.close(w)
reply = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    reply += d
print("reply", reply, flush=True)
if os.environ.get("STALLED_STATUS"):
    time.sleep(15)
    sys.exit(0)
for name, mine in (("out", out), ("status", status)):
    mine.settimeout(5)
    while True:
        try:
            msg, anc, _, _ = mine.recvmsg(4096, socket.CMSG_SPACE(12))
        except (BlockingIOError, socket.timeout):
            break
        if not msg:
            break
        for _, kind, data in anc:
            if kind == socket.SCM_CREDENTIALS:
                print(name, "uid", struct.unpack("iII", data)[1], msg)
"#;

/// With a pty (`--tty`), root's relay copies the agent's output to the
/// caller's stdout. Done with root's identity, the agent's bytes reached a
/// socket as uid 0's: a datagram to journald's `/dev/log` or native
/// socket became a log entry of root's, in whatever words the agent chose
/// (and a write-time capability check, e.g. of a /proc file, passed).
#[test]
fn the_agents_output_through_the_pty_relay_reaches_the_caller_as_the_caller() {
    if !can_run("pty_relay_identity") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(DORA);
    let args = r#"["--tty", "--", "sh", "-c", "echo written-by-the-agent"]"#;
    let socket = service.socket.to_str().unwrap();
    let out = tartaros_python_as(DORA, work.path(), &[socket, args]);
    let text = stdout(&out);
    assert!(text.contains(r#"{"exit":0}"#), "the run failed: {text}");
    let writes: Vec<&str> = text.lines().filter(|l| l.starts_with("out uid ")).collect();
    assert!(
        writes.iter().any(|l| l.contains("written-by-the-agent")),
        "the agent's output never arrived: {text}"
    );
    for write in writes {
        assert!(
            write.starts_with(&format!("out uid {DORA} ")),
            "root wrote the agent's output to the caller's socket as itself: {write}"
        );
    }
}

/// The `--status-fd` descriptor is the caller's too: root wrote the status
/// lines (with the label the caller chose) to it with root's credentials.
#[test]
fn the_status_lines_reach_the_callers_descriptor_as_the_caller() {
    if !can_run("status_identity") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(DORA);
    let args = r#"["--status-fd", "9", "--label", "a-label", "--", "true"]"#;
    let socket = service.socket.to_str().unwrap();
    let out = tartaros_python_as(DORA, work.path(), &[socket, args]);
    let text = stdout(&out);
    assert!(text.contains(r#"{"exit":0}"#), "the run failed: {text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("status ")).collect();
    assert!(
        lines.iter().any(|l| l.contains("exited")),
        "no exited line arrived: {text}"
    );
    for line in lines {
        assert!(
            line.starts_with(&format!("status uid {DORA} ")),
            "root wrote a status line to the caller's socket as itself: {line}"
        );
    }
}

/// The status relay runs as the caller, so it must not outlive the run:
/// a caller whose status pipe is full and never read (its read end held
/// open) would otherwise keep one blocked process per run for ever.
#[test]
fn a_status_descriptor_nobody_reads_leaves_no_process_behind() {
    if !can_run("stalled_status") {
        return;
    }
    use std::io::BufRead;
    let service = Service::start();
    let work = owned_dir(DORA + 1);
    let args = r#"["--status-fd", "9", "--", "true"]"#;
    let mut child = KillOnDrop(Some(
        python_client_as(
            DORA + 1,
            work.path(),
            &[service.socket.to_str().unwrap(), args],
        )
        .env("STALLED_STATUS", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv"),
    ));
    let out = child.0.as_mut().unwrap().stdout.take().unwrap();
    let reply = std::io::BufReader::new(out).lines().next();
    let reply = reply.and_then(Result::ok).unwrap_or_default();
    assert!(reply.contains(r#"{"exit":0}"#), "the run failed: {reply}");
    let left = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                status.contains(&format!("Uid:\t{}\t", DORA + 1))
                    && String::from_utf8_lossy(&cmdline).contains("__tartaros_service_worker")
            })
            .count()
    };
    assert!(
        eventually(8, || left() == 0),
        "{} processes of the service's, as the caller, outlived the run",
        left()
    );
}

/// Runs [`CLIENT`] as `uid` with `args`.
fn tartaros_python_as(uid: u32, cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    python_client_as(uid, cwd, args).output().expect("setpriv")
}

/// [`CLIENT`] as `uid` with `args`, to spawn.
fn python_client_as(uid: u32, cwd: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command
        .args([&format!("--reuid={uid}"), &format!("--regid={uid}")])
        .args(["--clear-groups", "/usr/bin/python3", "-c", CLIENT])
        .args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null());
    command
}

/// The copying is the caller's, but no thread of the root worker is: a
/// thread with the caller's uid is one the caller may signal (`tgkill`),
/// and a SIGSTOP to it stops the whole worker, with any shared lock it
/// holds. The relay is a process of the caller's instead.
#[test]
fn no_thread_of_the_root_worker_runs_as_the_caller() {
    if !can_run("worker_threads_identity") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(DORA + 2);
    let args = r#"["--tty", "--", "sh", "-c", "echo started; sleep 3"]"#;
    let socket = service.socket.to_str().unwrap().to_string();
    let client = std::thread::spawn({
        let work = work.path().to_path_buf();
        move || tartaros_python_as(DORA + 2, &work, &[&socket, args])
    });
    let workers = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains("__tartaros_service_worker")
            })
            .collect()
    };
    let uid_of = |task: &std::path::Path| {
        std::fs::read_to_string(task.join("status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
    };
    // Once the relay is copying: the agent's pty exists for a while.
    assert!(
        eventually(10, || workers()
            .iter()
            .any(|w| uid_of(w).as_deref() == Some(&(DORA + 2).to_string()))),
        "no process of the caller's relays the pty"
    );
    let mut mixed = Vec::new();
    for worker in workers() {
        let tasks: Vec<_> = std::fs::read_dir(worker.join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| uid_of(&e.path()))
            .collect();
        if tasks.iter().any(|u| u.as_deref() == Some("0"))
            && tasks.iter().any(|u| u.as_deref() != Some("0"))
        {
            mixed.push((worker, tasks));
        }
    }
    let out = client.join().unwrap();
    assert!(stdout(&out).contains(r#"{"exit":0}"#), "{}", stdout(&out));
    assert!(
        mixed.is_empty(),
        "a root worker has threads of the caller's: {mixed:?}"
    );
}
