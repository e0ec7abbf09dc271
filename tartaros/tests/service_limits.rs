//! `tartaros service` under a hostile ordinary user: what one user can take
//! from the host and from the other users (root worker processes held by
//! connections that never finish their request), and what the answers to
//! one user's run tell it about another user's files.
//!
//! Each test starts its own service on a socket of its own, acts as uids
//! with no passwd entry (nothing to create or remove on the host), and
//! checks from the host side: the service's worker processes, the time a
//! connection is held, the output the caller gets.

mod common;
#[path = "support/service.rs"]
mod harness;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use harness::Service;

const ALICE: u32 = 47_000 + 151;
const BOB: u32 = 47_000 + 152;
const CAROL: u32 = 47_000 + 153;

/// The service's bound on workers still reading their request, per user.
const PER_USER: usize = 16;
/// The service's deadline for a whole request.
const DEADLINE: Duration = Duration::from_secs(5);

/// Opens `conns` connections to `socket`, sends each the head of a 1 MiB
/// request with stdio as SCM_RIGHTS, then one byte of the body per second
/// on each, for at most `secs` seconds. Prints `connected N`, then one
/// `ended I SECONDS ANSWER` per connection the service cut off (ANSWER:
/// what it said, if anything), and `alive N` for those still held.
const TRICKLE: &str = r#"
import array, select, socket, sys, time
path, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conns = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendmsg([(1 << 20).to_bytes(4, 'little')],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0, 1, 2]))])
    except OSError:
        pass
    conns.append(s)
start = time.time()
print('connected', n, flush=True)
ended = {}
while time.time() - start < secs and len(ended) < n:
    for i, s in enumerate(conns):
        if i in ended:
            continue
        if select.select([s], [], [], 0)[0]:
            try:
                data = s.recv(65536)
            except OSError:
                data = b''
            ended[i] = (time.time() - start, data)
            continue
        try:
            s.send(b' ')
        except OSError:
            ended[i] = (time.time() - start, b'')
    time.sleep(1)
for i, (t, data) in sorted(ended.items()):
    print('ended', i, round(t, 1), data[4:].decode(errors='replace').replace('\n', ' '), flush=True)
print('alive', n - len(ended), flush=True)
"#;

/// A python3 an ordinary user may run (root's PATH may name one under
/// /root first).
fn python3() -> &'static str {
    ["/usr/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("python3")
}

/// [`TRICKLE`] as `uid`, its stdout piped; killed when the guard drops.
fn trickle(uid: u32, socket: &Path, conns: usize, secs: u64) -> KillOnDrop {
    let child = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            python3(),
            "-c",
            TRICKLE,
        ])
        .arg(socket)
        .args([conns.to_string(), secs.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    KillOnDrop(Some(child))
}

/// The lines a [`trickle`] printed after `connected`, up to its `alive`
/// line (at most `secs` seconds from now).
fn trickle_report(lines: &std::sync::mpsc::Receiver<String>, secs: u64) -> Vec<String> {
    let mut report = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let last = line.starts_with("alive");
                report.push(line);
                if last {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    report
}

/// Waits for the `connected` line of a [`trickle`] and gives back the
/// guard (its stdout drained by a thread into the returned receiver).
fn connected(mut guard: KillOnDrop) -> (KillOnDrop, std::sync::mpsc::Receiver<String>) {
    let stdout = guard
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .expect("piped stdout");
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let first = receive
        .recv_timeout(Duration::from_secs(20))
        .expect("the trickling client did not connect");
    assert!(first.starts_with("connected"), "{first}");
    (guard, receive)
}

/// The service's worker processes (its children running the worker).
fn workers(service: &Service) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The parent pid is the second field after the parenthesized name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(service.pid)
            && String::from_utf8_lossy(&cmdline).contains("__tartaros_service_worker")
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_request_trickled_in_a_byte_at_a_time_is_cut_off_at_the_deadline() {
    if !can_run("service_trickle") {
        return;
    }
    let service = Service::start();
    let started = Instant::now();
    let client = trickle(ALICE, &service.socket, 1, 15);
    let (client, lines) = connected(client);
    assert!(
        eventually(3, || workers(&service).len() == 1),
        "no worker for the connection"
    );
    // Cut off by the deadline, not by the end of the trickle.
    let cut = eventually(DEADLINE.as_secs() + 4, || workers(&service).is_empty());
    let held = started.elapsed();
    let report = trickle_report(&lines, 15);
    drop(client);
    assert!(
        cut,
        "a worker still reads a trickled request after {held:?}: {report:?}"
    );
    let ended = report
        .iter()
        .find(|l| l.starts_with("ended 0 "))
        .unwrap_or_else(|| panic!("the connection was not ended: {report:?}"));
    assert!(
        ended.contains("did not arrive within 5 seconds"),
        "no one-line refusal: {ended}"
    );
    let seconds: f64 = ended
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::MAX);
    assert!(
        seconds <= DEADLINE.as_secs_f64() + 2.0,
        "cut off after {seconds} s: {ended}"
    );
    drop(service);
}

#[test]
fn one_user_holding_connections_gets_a_bounded_number_of_workers_and_others_are_served() {
    if !can_run("service_pending_cap") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(BOB);
    let own = owned_dir(ALICE);
    let held = 3 * PER_USER;
    let client = trickle(ALICE, &service.socket, held, 20);
    let (client, lines) = connected(client);
    // Every connection is in: at most the per-user bound became workers.
    assert!(
        eventually(3, || workers(&service).len() >= PER_USER),
        "fewer workers than the bound: {:?}",
        workers(&service)
    );
    std::thread::sleep(Duration::from_millis(300));
    let count = workers(&service).len();
    assert_eq!(
        count, PER_USER,
        "one user holds {count} root workers with {held} connections"
    );
    // The same user's real run is refused with one line saying why.
    let refused = service.run(ALICE, &["run", "--", "true"], own.path());
    let said = stderr(&refused);
    assert_eq!(refused.status.code(), Some(125), "{said}");
    assert!(
        said.contains("the service is busy") && said.contains("at most 16 per user"),
        "{said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    // Another user is served meanwhile.
    let out = service.run(BOB, &["run", "--", "sh", "-c", "id -u"], work.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), BOB.to_string());
    let report = trickle_report(&lines, 25);
    drop(client);
    // The connections over the bound were refused at once, the others cut
    // off at the deadline; none is held any longer.
    let busy = report
        .iter()
        .filter(|l| l.starts_with("ended") && l.contains("the service is busy"))
        .count();
    let late = report
        .iter()
        .filter(|l| l.starts_with("ended") && l.contains("did not arrive within 5 seconds"))
        .count();
    assert_eq!(busy, held - PER_USER, "{report:#?}");
    assert_eq!(late, PER_USER, "{report:#?}");
    assert_eq!(report.last().map(String::as_str), Some("alive 0"));
    assert!(eventually(5, || workers(&service).is_empty()));
    // And the user gets its runs again.
    let again = service.run(ALICE, &["run", "--", "true"], own.path());
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    drop(service);
}

/// What `args` (with `{}` replaced by `path`) tells `uid`: exit status and
/// stderr, with `path` itself written as `PATH`.
fn answer(service: &Service, uid: u32, args: &[&str], path: &Path, cwd: &Path) -> String {
    let path_text = path.to_str().unwrap();
    let args: Vec<String> = args.iter().map(|a| a.replace("{}", path_text)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = service.run(uid, &args, cwd);
    format!(
        "exit {:?}: {}{}",
        out.status.code(),
        stdout(&out),
        stderr(&out)
    )
    .replace(path_text, "PATH")
}

#[test]
fn nothing_is_told_of_what_lies_behind_a_directory_the_caller_cannot_search() {
    if !can_run("service_lookups") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(CAROL);
    std::fs::create_dir(work.join("view")).unwrap();
    chown(&work.join("view"), CAROL);
    // Bob's private directory: a file, a directory, a symlink to a place
    // whose name is a secret, and (by name only) something absent.
    let bobs = owned_dir(BOB);
    std::fs::set_permissions(
        bobs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(bobs.join("there"), "bob's\n").unwrap();
    chown(&bobs.join("there"), BOB);
    std::fs::create_dir(bobs.join("dir")).unwrap();
    chown(&bobs.join("dir"), BOB);
    let secret = Dir::new();
    let target = secret.join("secret-target-marker");
    std::fs::write(&target, "x\n").unwrap();
    std::os::unix::fs::symlink(&target, bobs.join("link")).unwrap();
    let names = ["there", "dir", "link", "absent"];
    let probes: [&[&str]; 9] = [
        &["run", "--log", "{}", "--", "true"],
        &["run", "--read-allow", "{}", "--", "true"],
        &["run", "--exec-allow", "{}", "--", "true"],
        &["run", "--write", "{}", "--", "true"],
        &["run", "--write-deny", "{}", "--", "true"],
        &["run", "--read-deny", "{}", "--", "true"],
        &["run", "--tmpfs", "{}", "--", "true"],
        &["run", "--chdir", "{}", "--", "true"],
        &["run", "--bind", "{}", "view", "--", "true"],
    ];
    for probe in probes {
        let answers: Vec<String> = names
            .iter()
            .map(|name| answer(&service, CAROL, probe, &bobs.join(name), work.path()))
            .collect();
        for (name, said) in names.iter().zip(&answers) {
            assert!(
                !said.contains("secret-target-marker"),
                "{probe:?} on {name} shows where Bob's link points: {said}"
            );
            assert_eq!(
                said, &answers[0],
                "{probe:?} tells {name} from {}",
                names[0]
            );
        }
    }
    // The same names in a directory the caller may search are answered as
    // before: an existing log is refused as existing.
    let mine = work.join("mine.jsonl");
    std::fs::write(&mine, "").unwrap();
    chown(&mine, CAROL);
    let out = service.run(
        CAROL,
        &["run", "--log", mine.to_str().unwrap(), "--", "true"],
        work.path(),
    );
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    drop(service);
}

/// Every run the service holds takes an entry of its shared eBPF maps
/// (1,024 in all): one user's idle runs must not keep the others out.
/// With a bound of 2 per user, Alice's third run is refused with a
/// one-line error while Bob still gets in, and her next run starts once
/// one of hers has ended.
#[test]
fn one_user_cannot_hold_every_run_the_service_can_take() {
    if !can_run("service_runs_per_user") {
        return;
    }
    let service = Service::start_with(Dir::new(), &["--max-runs-per-user", "2"]);
    let alices = owned_dir(ALICE);
    let bobs = owned_dir(BOB);
    let sleep = ["run", "--", "sleep", "60"];
    let mut first = service.spawn_quiet(ALICE, &sleep, alices.path());
    let _second = service.spawn_quiet(ALICE, &sleep, alices.path());
    assert!(
        eventually(10, || workers(&service).len() == 2),
        "Alice's two runs did not start: {}",
        service.errors()
    );
    let out = service.run(ALICE, &["run", "--", "true"], alices.path());
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{said}");
    assert!(said.contains("at most 2 per user"), "{said}");
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert_eq!(workers(&service).len(), 2, "a worker for a refused run");
    // Another user is not held up by Alice's runs.
    let out = service.run(BOB, &["run", "--", "true"], bobs.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // One of Alice's runs ends: she may start another.
    let mut client = first.take();
    let _ = client.kill();
    let _ = client.wait();
    assert!(
        eventually(10, || workers(&service).len() == 1),
        "the killed client's run did not end"
    );
    let out = service.run(ALICE, &["run", "--", "true"], alices.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    drop(service);
}
