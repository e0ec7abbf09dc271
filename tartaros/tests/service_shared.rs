//! `tartaros service` with programs shared by every run: the eBPF programs
//! are loaded and attached once, to a parent cgroup under which each run's
//! cgroup is made, and each run registers its configuration (keyed by its
//! cgroup id) and a ring buffer of its own. What must still hold, checked
//! from the host side: concurrent runs keep their own policy and their own
//! log, per-run state does not pile up, a run without `--log` is still
//! confined, and the service leaves no cgroup behind when it stops.
//!
//! Each test starts its own service on a socket of its own and runs
//! `tartaros run` as uids with no passwd entry (nothing to create or remove
//! on the host).

mod common;
#[path = "support/service.rs"]
mod harness;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use harness::*;
use serde_json::Value;

const ALICE: u32 = 47_000 + 141;
const BOB: u32 = 47_000 + 142;

/// A world-connectable unix socket of the host, alone in a directory
/// anyone may write, that counts its connections.
struct HostSocket {
    _dir: Dir,
    path: PathBuf,
    hits: Arc<AtomicUsize>,
}

fn host_socket() -> HostSocket {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::open_to_all();
    let path = dir.join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if conn.is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    HostSocket {
        _dir: dir,
        path,
        hits,
    }
}

/// The names of the `tartaros-*` directories right under `dir`.
fn run_children(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tartaros-"))
        .collect();
    names.sort();
    names
}

/// Pids of the live processes whose parent is `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// How many descriptors process `pid` holds.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `bpf(cmd, attr)` with a zeroed, 128-byte attribute.
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> libc::c_long {
    // SAFETY: `attr` is a zeroed bpf_attr of 128 bytes that lives for the
    // call; the commands used read it and write only buffers it names.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) }
}

/// The eBPF maps that process `pid` holds, by id: their name and, for the
/// hash kinds whose entries are removed explicitly (not the LRU ones), how
/// many entries they have now. Per-run state that is never removed makes
/// these counts grow run after run.
fn held_maps(pid: i32) -> std::collections::BTreeMap<u32, (String, Option<u32>)> {
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // HASH, PERCPU_HASH, LPM_TRIE, HASH_OF_MAPS.
    const COUNTED: [u32; 4] = [1, 5, 11, 13];
    let mut maps = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let mut attr = [0u64; 16];
        attr[0] = id as u64;
        let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut attr);
        if fd < 0 {
            continue;
        }
        // SAFETY: a descriptor the kernel just gave us, closed once.
        let fd =
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd) as u64;
        // bpf_map_info: type, id, key_size, value_size, max_entries,
        // map_flags (u32 each), name[16], ...
        let mut map_info = [0u8; 256];
        let mut attr = [0u64; 16];
        attr[0] = raw | (map_info.len() as u64) << 32;
        attr[1] = map_info.as_mut_ptr() as u64;
        if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) < 0 {
            continue;
        }
        let word = |i: usize| u32::from_ne_bytes(map_info[i * 4..i * 4 + 4].try_into().unwrap());
        let (kind, key_size, max_entries) = (word(0), word(2) as usize, word(4));
        let name = String::from_utf8_lossy(&map_info[24..40])
            .trim_end_matches('\0')
            .to_string();
        let entries = COUNTED.contains(&kind).then(|| {
            let mut key = vec![0u8; key_size.max(1)];
            let mut next = vec![0u8; key_size.max(1)];
            let mut count = 0u32;
            let mut first = true;
            while count <= max_entries {
                let mut attr = [0u64; 16];
                attr[0] = raw;
                attr[1] = if first { 0 } else { key.as_ptr() as u64 };
                attr[2] = next.as_mut_ptr() as u64;
                if bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) < 0 {
                    break;
                }
                count += 1;
                first = false;
                key.copy_from_slice(&next);
            }
            count
        });
        maps.insert(id, (name, entries));
    }
    maps
}

fn kind(record: &Value) -> &str {
    record["kind"].as_str().unwrap_or("")
}

/// Every string inside a record's `target` (paths, argv, ...).
fn target_strings(record: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Object(fields) => fields.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&record["target"], &mut out);
    out
}

/// The command line of each exec that succeeded, its words joined by
/// spaces.
fn execs(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .filter(|r| kind(r) == "exec" && r["decision"] == "allowed")
        .map(|r| {
            let argv = r["target"]["argv"].as_array().cloned().unwrap_or_default();
            let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
            words.join(" ")
        })
        .collect()
}

/// The paths of the execs that failed (a shell's `PATH` search).
fn failed_execs(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .filter(|r| kind(r) == "exec" && r["decision"] != "allowed")
        .map(|r| r["target"]["path"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Whether the log has the allowed creation of the file named `name` (an
/// `open` with `O_CREAT` is recorded as `create`, or as `open` with its
/// flags).
fn made(records: &[Value], name: &str) -> bool {
    let suffix = format!("/{name}");
    records.iter().any(|r| {
        ["create", "open"].contains(&kind(r))
            && r["decision"] == "allowed"
            && r["target"]["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(&suffix))
    })
}

/// `tartaros log verify LOG`: exit 0 and `ok:` on stdout.
#[track_caller]
fn verified(log: &Path, cwd: &Path) {
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], cwd);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}: {}{}",
        log.display(),
        stdout(&verify),
        stderr(&verify)
    );
    assert!(stdout(&verify).starts_with("ok"), "{}", stdout(&verify));
}

#[test]
fn two_concurrent_runs_through_one_service_keep_their_own_policy_and_log() {
    if !can_run("service_shared_concurrent") {
        return;
    }
    let service = Service::start();
    let (port, hits) = host_listener(b"host-leak");
    // A world-connectable host socket for each run, in a directory that
    // only that run has as a writable root: the unix policy (a per-run map
    // entry) lets each run reach its own and refuses it the other's.
    let sockets = [host_socket(), host_socket()];
    struct Run {
        uid: u32,
        tag: String,
        work: Dir,
        log: PathBuf,
        caller: KillOnDrop,
    }
    let start = |uid: u32, own: &Path, other: &Path| {
        let own_root = own.parent().unwrap().to_path_buf();
        let work = owned_dir(uid);
        let log = work.join("effects.jsonl");
        // Every command of the run carries the uid as a tag, so that each
        // exec record can be told apart. The run announces itself and then
        // waits for the host's go, so that both runs are live at once.
        let tag = uid.to_string();
        let (own, other) = (own.display(), other.display());
        let script = format!(
            "echo {tag} > made-{tag}
python3 -c \"
import socket, sys
def attempt(label, family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
        print(label, sys.argv[1], 'OK')
    except OSError as e:
        print(label, sys.argv[1], e.errno)
attempt('connect', socket.AF_INET, ('127.0.0.1', {port}))
attempt('unix-own', socket.AF_UNIX, sys.argv[2])
attempt('unix-other', socket.AF_UNIX, sys.argv[3])
\" {tag} {own} {other}
touch ready-{tag}
i=0
while [ ! -e go-{tag} ] && [ $i -lt 200 ]; do sleep 0.0{tag}; i=$((i+1)); done
[ -e go-{tag} ]"
        );
        let caller = KillOnDrop(Some(
            service
                .command(
                    uid,
                    &[
                        "run",
                        "--log",
                        log.to_str().unwrap(),
                        "--write",
                        ".",
                        "--write",
                        own_root.to_str().unwrap(),
                        "--",
                        "sh",
                        "-c",
                        &script,
                    ],
                    work.path(),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("setpriv"),
        ));
        Run {
            uid,
            tag,
            work,
            log,
            caller,
        }
    };
    let mut runs = [
        start(ALICE, &sockets[0].path, &sockets[1].path),
        start(BOB, &sockets[1].path, &sockets[0].path),
    ];
    let ready = |run: &Run| run.work.path().join(format!("ready-{}", run.tag)).exists();
    let both = eventually(10, || runs.iter().all(ready));
    // Both are waiting for the go: they overlap.
    let waiting: Vec<bool> = runs
        .iter_mut()
        .map(|r| r.caller.0.as_mut().unwrap().try_wait().unwrap().is_none())
        .collect();
    for run in &runs {
        std::fs::write(run.work.path().join(format!("go-{}", run.tag)), "").unwrap();
    }
    let outputs: Vec<Output> = runs
        .iter_mut()
        .map(|r| r.caller.take().wait_with_output().unwrap())
        .collect();
    assert!(
        both,
        "the two runs were not live at the same time: {outputs:?}\n{}",
        service.errors()
    );
    assert_eq!(
        waiting,
        [true, true],
        "a run ended before the go: {outputs:?}"
    );
    for (i, (run, out)) in runs.iter().zip(&outputs).enumerate() {
        let other = &runs[1 - i];
        assert_eq!(out.status.code(), Some(0), "{}: {}", run.uid, stderr(out));
        let said = |label: &str| {
            let text = stdout(out);
            let prefix = format!("{label} {} ", run.tag);
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
                .unwrap_or_else(|| panic!("{}: no {label} attempt: {text}", run.uid))
        };
        assert_ne!(said("connect"), "OK", "{}: host loopback reached", run.uid);
        assert_eq!(said("unix-own"), "OK", "{}: its own root's socket", run.uid);
        assert_eq!(
            said("unix-other"),
            libc::EPERM.to_string(),
            "{}: the other run's root's socket",
            run.uid
        );
        assert_eq!(
            std::fs::read_to_string(run.work.path().join(format!("made-{}", run.tag))).unwrap(),
            format!("{}\n", run.tag)
        );
        verified(&run.log, run.work.path());
        let records = records(&run.log);
        assert!(
            records[0]["guarantees"]["degraded"]
                .as_array()
                .is_some_and(|d| d.is_empty()),
            "{}: {}",
            run.uid,
            records[0]
        );
        assert!(
            made(&records, &format!("made-{}", run.tag)),
            "{}: no create record of its file: {records:?}",
            run.uid
        );
        // Nothing of the other run: its file, its commands, its uid.
        for record in &records {
            assert!(
                !target_strings(record)
                    .iter()
                    .any(|s| s.contains(&other.tag)),
                "{}: the other run's effect in its log: {record}",
                run.uid
            );
            // The agent's uid, or root's for the init.
            if let Some(uid) = record.get("uid") {
                assert!(
                    [Value::from(run.uid), Value::from(0)].contains(uid),
                    "{}: a record of another uid: {record}",
                    run.uid
                );
            }
        }
        let commands = execs(&records);
        for needle in ["sh -c", "python3 -c", "touch ready-"] {
            assert!(
                commands.iter().any(|c| c.contains(needle)),
                "{}: no exec of `{needle}`: {commands:?}",
                run.uid
            );
        }
        // The sandbox's own init may show its exec (runlog::InitPid: its
        // exec, fork and exit say when the sandbox started).
        assert!(
            commands
                .iter()
                .filter(|c| !c.starts_with("tartaros-init __tartaros_sandbox_init"))
                .all(|c| c.contains(&run.tag)),
            "{}: an exec that is not its own: {commands:?}",
            run.uid
        );
        let searched = failed_execs(&records);
        assert!(
            searched.iter().all(|p| ["sh", "python3", "touch", "sleep"]
                .iter()
                .any(|c| p.ends_with(&format!("/{c}")))),
            "{}: a failed exec that is not its own: {searched:?}",
            run.uid
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "host loopback reached");
    for socket in &sockets {
        assert_eq!(
            socket.hits.load(Ordering::SeqCst),
            1,
            "{}: reached by its run only",
            socket.path.display()
        );
    }
    drop(service);
}

#[test]
fn a_run_after_many_runs_still_captures_everything() {
    if !can_run("service_shared_many") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let started = Instant::now();
    let mut baseline = None;
    for i in 0..20 {
        let log = work.path().join(format!("effects-{i}.jsonl"));
        let out = service.run(
            ALICE,
            &[
                "run",
                "--log",
                log.to_str().unwrap(),
                "--write",
                ".",
                "--",
                "sh",
                "-c",
                &format!("echo x{i} > f{i}"),
            ],
            work.path(),
        );
        assert_eq!(out.status.code(), Some(0), "run {i}: {}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(work.path().join(format!("f{i}"))).unwrap(),
            format!("x{i}\n"),
            "run {i}"
        );
        verified(&log, work.path());
        let records = records(&log);
        assert!(
            made(&records, &format!("f{i}")),
            "run {i}: no create record: {records:?}"
        );
        assert!(
            execs(&records)
                .iter()
                .any(|c| c.contains(&format!("echo x{i} > f{i}"))),
            "run {i}: no exec record: {records:?}"
        );
        if i == 0 {
            // What the service holds once one run has come and gone.
            std::thread::sleep(Duration::from_millis(200));
            baseline = Some((fd_count(service.pid), held_maps(service.pid)));
        }
    }
    eprintln!("20 runs in {:?}", started.elapsed());
    // Nothing per run piles up in the service: no descriptor (a ring, a
    // map, a socket) and no map entry (a run's configuration, its ring's
    // slot) more than after the first run.
    let (fds, maps) = baseline.unwrap();
    // The service keeps a few spare rings ready (named EVENTS, not
    // counted): they are replaced as runs take them, so only their number
    // is compared.
    let spare = |m: &std::collections::BTreeMap<u32, (String, Option<u32>)>| {
        m.values()
            .filter(|(n, e)| n == "EVENTS" && e.is_none())
            .count()
    };
    let grown = || {
        let now = held_maps(service.pid);
        let mut grown: Vec<String> = now
            .iter()
            .filter(|(_, (name, entries))| !(name == "EVENTS" && entries.is_none()))
            .filter(|(id, (_, entries))| match maps.get(id) {
                None => true,
                Some((_, before)) => entries > before,
            })
            .map(|(id, (name, entries))| {
                let before = maps.get(id).and_then(|m| m.1);
                format!("map {id} {name}: {before:?} -> {entries:?} entries")
            })
            .collect();
        if spare(&now) > spare(&maps) {
            grown.push(format!("spare rings: {} -> {}", spare(&maps), spare(&now)));
        }
        let fds_now = fd_count(service.pid);
        if fds_now > fds {
            grown.push(format!("descriptors: {fds} -> {fds_now}"));
        }
        grown
    };
    assert!(
        eventually(5, || grown().is_empty()),
        "the service kept per-run state: {:?} (after the first run: {maps:?})",
        grown()
    );
    eprintln!("the service holds {fds} descriptors and these maps: {maps:?}");
    // The per-run cgroups are gone: under the service's parent cgroup (if
    // it has one) nothing is left.
    let parents = cgroups_of(service.pid);
    assert!(
        eventually(5, || parents.iter().all(|p| subdirs(p).is_empty())),
        "run cgroups left under {parents:?}"
    );
    drop(service);
}

#[test]
fn a_run_without_log_through_the_service_is_still_confined_and_allowed_what_it_asks() {
    if !can_run("service_shared_no_log") {
        return;
    }
    let service = Service::start();
    let work = owned_dir(ALICE);
    let (granted, granted_hits) = host_listener(b"host-ok");
    let (other, other_hits) = host_listener(b"leak");
    // A stand-in for docker.sock: world-connectable, outside every root.
    let outside = Dir::open_to_all();
    let host_path = outside.join("host.sock");
    let host = std::os::unix::net::UnixListener::bind(&host_path).unwrap();
    std::fs::set_permissions(
        &host_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    host.set_nonblocking(true).unwrap();
    let code = format!(
        "{ATTEMPT}
import socket
def talk(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    s.sendall(b'hi')
    if s.recv(100) != b'host-ok':
        raise OSError(errno.EIO, 'wrong answer')
def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
attempt('granted', lambda: talk({granted}))
attempt('other', lambda: talk({other}))
attempt('host-socket', lambda: unix('{h}'))
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{w}/own.sock')
srv.listen()
attempt('own-socket', lambda: unix('{w}/own.sock'))
attempt('inside', lambda: open('{w}/made', 'w').write('x'))",
        h = host_path.display(),
        w = work.path().display(),
    );
    let out = service.run(
        ALICE,
        &[
            "run",
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--port",
            &granted.to_string(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    expect(&out, "granted", "OK");
    expect(&out, "other", "ECONNREFUSED");
    // The eBPF unix policy, which only the service gives an ordinary user.
    expect(&out, "host-socket", "EPERM");
    expect(&out, "own-socket", "OK");
    expect(&out, "inside", "OK");
    assert_eq!(granted_hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        other_hits.load(Ordering::SeqCst),
        0,
        "host loopback reached"
    );
    assert!(host.accept().is_err(), "the host socket got a connection");
    assert_eq!(std::fs::read_to_string(work.join("made")).unwrap(), "x");
    drop(service);
}

#[test]
fn the_services_cgroup_is_removed_when_the_service_stops() {
    if !can_run("service_shared_cgroup") {
        return;
    }
    if cgroup2_mount().is_none() {
        skip("service_shared_cgroup", "no cgroup2 hierarchy");
        return;
    }
    let mut service = Service::start();
    let work = owned_dir(ALICE);
    let log = work.join("effects.jsonl");
    let out = service.run(
        ALICE,
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--write",
            ".",
            "--",
            "sh",
            "-c",
            "echo x > made",
        ],
        work.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    verified(&log, work.path());
    let own = cgroup_dir_of(service.pid).expect("the service's cgroup");
    assert!(own.is_dir(), "{}", own.display());
    // The runs' parent exists while the service runs: the check below
    // looks at something that was there.
    assert!(
        !cgroups_of(service.pid).is_empty(),
        "no tartaros-{}-* parent of the runs under {}: {:?}",
        service.pid,
        own.display(),
        run_children(&own)
    );
    let pid = service.pid;
    assert!(service.stop(), "the service did not exit on SIGTERM");
    let left = |dir: &Path| -> Vec<String> {
        run_children(dir)
            .into_iter()
            .filter(|n| n.starts_with(&format!("tartaros-{pid}-")))
            .collect()
    };
    let clean = eventually(10, || left(&own).is_empty() && cgroups_of(pid).is_empty());
    assert!(
        clean,
        "left after the service stopped: {:?} under {}, {:?}",
        left(&own),
        own.display(),
        cgroups_of(pid)
    );
    drop(service);
}

#[test]
fn a_service_stopped_during_a_run_leaves_no_cgroup() {
    if !can_run("service_shared_cgroup_busy") {
        return;
    }
    if cgroup2_mount().is_none() {
        skip("service_shared_cgroup_busy", "no cgroup2 hierarchy");
        return;
    }
    let mut service = Service::start();
    let work = owned_dir(BOB);
    let log = work.join("effects.jsonl");
    let marker = "sleep 7142";
    let mut caller = service.spawn_quiet(
        BOB,
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--write",
            ".",
            "--",
            "sh",
            "-c",
            &format!("echo x > made; {marker}; true"),
        ],
        work.path(),
    );
    assert!(
        eventually(10, || !processes_with(marker).is_empty()),
        "no sandbox: {}",
        service.errors()
    );
    let pid = service.pid;
    // The run's worker, whose own run cgroup (per-run design) carries its pid.
    let workers = children_of(pid);
    service.owners = workers.clone();
    assert!(!workers.is_empty(), "no worker");
    let owners: Vec<i32> = workers.iter().copied().chain([pid]).collect();
    let left = || -> Vec<PathBuf> { owners.iter().flat_map(|o| cgroups_of(*o)).collect() };
    // The run's cgroup is named after the service (shared programs) or
    // after its worker (per-run programs): the search finds it.
    let during = left();
    eprintln!("cgroups of the service and its worker {workers:?}: {during:?}");
    assert!(!during.is_empty(), "no cgroup of the service or its worker");
    assert!(service.stop(), "the service did not exit on SIGTERM");
    assert!(
        eventually(10, || processes_with(marker).is_empty()),
        "the sandbox outlived the service"
    );
    let status = caller.take().wait().unwrap();
    assert_ne!(status.code(), Some(0), "{status}");
    assert!(
        eventually(10, || left().is_empty()),
        "left after the service stopped: {:?}",
        left()
    );
    drop(service);
}

/// The entry counts of the service's per-run maps, by name.
const PER_RUN_MAPS: [&str; 5] = ["RUNS", "UNIX_ALLOW", "EVENTS", "EVENTS_LOST", "ALLOW"];

/// How many entries each of [`PER_RUN_MAPS`] of process `pid` has now
/// (summed over maps of the same name). Panics if one is not held.
fn per_run_counts(pid: i32) -> std::collections::BTreeMap<&'static str, u32> {
    let held = held_maps(pid);
    PER_RUN_MAPS
        .iter()
        .map(|name| {
            let counts: Vec<u32> = held
                .values()
                .filter(|(n, _)| n == name)
                .filter_map(|(_, entries)| *entries)
                .collect();
            assert!(
                !counts.is_empty(),
                "the service holds no counted map {name}: {held:?}"
            );
            (*name, counts.iter().sum())
        })
        .collect()
}

/// Whether the command line of process `pid` contains `needle`.
fn cmdline_has(pid: i32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        String::from_utf8_lossy(&c)
            .replace('\0', " ")
            .contains(needle)
    })
}

#[test]
fn a_killed_workers_run_is_forgotten_by_the_service() {
    const CAROL: u32 = 47_000 + 143;
    if !can_run("service_shared_sweep") {
        return;
    }
    if cgroup2_mount().is_none() {
        skip("service_shared_sweep", "no cgroup2 hierarchy");
        return;
    }
    let mut service = Service::start();
    // The runs' parent cgroup of the shared programs. The service listens
    // before it loads them (clients wait in the backlog), so under load the
    // cgroup appears after the socket does (a CI run read none).
    let mut parents = Vec::new();
    eventually(10, || {
        parents = cgroups_of(service.pid);
        parents.len() == 1
    });
    assert_eq!(
        parents.len(),
        1,
        "not one runs' parent cgroup of the service: {parents:?}\n{}",
        service.errors()
    );
    let parent = parents[0].clone();
    // Before any run (the probe connections of Service::start are gone).
    std::thread::sleep(Duration::from_millis(200));
    let baseline = per_run_counts(service.pid);
    eprintln!("before the run: {baseline:?}");
    let (port, _) = host_listener(b"unused");
    let work = owned_dir(CAROL);
    let log = work.join("effects.jsonl");
    let marker = "sleep 30.143";
    let mut caller = service.spawn_quiet(
        CAROL,
        &[
            "run",
            "--log",
            log.to_str().unwrap(),
            "--write",
            ".",
            "--port",
            &port.to_string(),
            "--",
            "sh",
            "-c",
            &format!("echo x > made; {marker}; true"),
        ],
        work.path(),
    );
    let runs = || per_run_counts(service.pid)["RUNS"];
    assert!(
        eventually(10, || !processes_with(marker).is_empty()
            && runs() > baseline["RUNS"]),
        "no sandbox, or no run registered: {:?}, {:?}\n{}",
        processes_with(marker),
        per_run_counts(service.pid),
        service.errors()
    );
    // RUNS is written last: the run's other entries are in by now.
    let during = per_run_counts(service.pid);
    eprintln!("during the run: {during:?}");
    // The run's cgroup: the child of the parent the sandbox is in.
    let sandbox = processes_with(marker)[0];
    let inside = cgroup_dir_of(sandbox).expect("the sandbox's cgroup");
    let run_cgroup = inside
        .ancestors()
        .find(|a| a.parent() == Some(parent.as_path()))
        .unwrap_or_else(|| {
            panic!(
                "the sandbox's cgroup {} is not under {}",
                inside.display(),
                parent.display()
            )
        })
        .to_path_buf();
    // Its worker: the service's child that made it (named after its pid).
    let workers: Vec<i32> = children_of(service.pid)
        .into_iter()
        .filter(|p| cmdline_has(*p, tartaros::service::WORKER_ARG))
        .collect();
    let name = run_cgroup
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let worker = *workers
        .iter()
        .find(|w| name.starts_with(&format!("tartaros-{w}-")))
        .unwrap_or_else(|| panic!("no worker of {name} among {workers:?}"));
    service.owners.push(worker);
    eprintln!("killing worker {worker} of {}", run_cgroup.display());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the worker");
    // Its janitor kills the sandbox and removes the run's cgroup.
    assert!(
        eventually(10, || !run_cgroup.exists()),
        "the run's cgroup {} outlived its worker",
        run_cgroup.display()
    );
    assert!(
        eventually(10, || processes_with(marker).is_empty()),
        "the sandbox outlived its worker: {:?}",
        processes_with(marker)
    );
    // The client lost its worker; it is not waited for longer.
    let ended = eventually(5, || {
        caller
            .0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    });
    if !ended {
        eprintln!("the client outlived its worker: killed");
    }
    drop(caller);
    // Nothing has forgotten the run yet: only the sweep at the next
    // connection will.
    std::thread::sleep(Duration::from_millis(200));
    let after_kill = per_run_counts(service.pid);
    eprintln!("after the worker was killed: {after_kill:?}");
    if after_kill == baseline {
        eprintln!("the killed run's entries were already gone before the next connection");
    } else {
        for name in PER_RUN_MAPS {
            if during[name] > baseline[name] {
                assert!(
                    after_kill[name] > baseline[name],
                    "{name} lost the killed run's entry before any sweep: {baseline:?} -> \
                     {during:?} -> {after_kill:?}"
                );
            }
        }
    }
    // The service's keeper sweeps it (within 50 ms); the next run must
    // find everything back to the baseline.
    let next = work.join("next.jsonl");
    let out = service.run(
        CAROL,
        &[
            "run",
            "--log",
            next.to_str().unwrap(),
            "--write",
            ".",
            "--",
            "sh",
            "-c",
            "echo y > next",
        ],
        work.path(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stderr(&out),
        service.errors()
    );
    assert_eq!(std::fs::read_to_string(work.join("next")).unwrap(), "y\n");
    verified(&next, work.path());
    assert!(
        eventually(5, || per_run_counts(service.pid) == baseline),
        "the killed run was not forgotten: {baseline:?} before, {during:?} during, \
         {after_kill:?} after the kill, {:?} after the next run",
        per_run_counts(service.pid)
    );
    assert!(
        eventually(5, || subdirs(&parent).is_empty()),
        "run cgroups left under {}: {:?}",
        parent.display(),
        subdirs(&parent)
    );
    drop(service);
}

/// The kinds of BPF objects process `pid` holds a descriptor of.
fn bpf_descriptors(pid: i32) -> Vec<String> {
    open_fds(pid)
        .into_iter()
        .map(|(_, target)| target)
        .filter(|target| target.starts_with("anon_inode:bpf"))
        .collect()
}

/// The service hands its maps (and a ring) to each worker; none of them
/// may reach the sandbox: seen from the host, no process in the run's
/// cgroup, the init included, holds a BPF map, program or link.
#[test]
fn no_process_in_a_service_run_holds_the_services_maps() {
    if !can_run("service_shared_fds") {
        return;
    }
    let service = Service::start();
    let uid = 47_000 + 144;
    let work = owned_dir(uid);
    let log = work.join("effects.jsonl");
    let marker = "sleep 30.144";
    let mut caller = service.spawn_quiet(
        uid,
        &[
            "run",
            "--write",
            ".",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("{marker}; true"),
        ],
        work.path(),
    );
    assert!(
        eventually(10, || !processes_with("30.144").is_empty()),
        "no sandbox: {}",
        service.errors()
    );
    let sleeper = processes_with("30.144")[0];
    let cgroup = cgroup_dir_of(sleeper).expect("the sandbox's cgroup");
    let members: Vec<i32> = std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert!(members.len() >= 2, "the init and the agent: {members:?}");
    for pid in &members {
        let held = bpf_descriptors(*pid);
        assert!(held.is_empty(), "sandbox process {pid} holds {held:?}");
    }
    // The worker does hold them: the check looks at the right thing.
    let workers: Vec<i32> = children_of(service.pid)
        .into_iter()
        .filter(|p| cmdline_has(*p, "__tartaros_service_worker"))
        .collect();
    assert!(
        workers.iter().any(|w| !bpf_descriptors(*w).is_empty()),
        "no worker holds the maps: {workers:?}"
    );
    let mut child = caller.take();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(10, || processes_with("30.144").is_empty()),
        "the sandbox outlived its caller"
    );
}

/// A service killed together with its janitor (and its runs' janitors)
/// leaves its parent cgroup with run cgroups below it: `doctor --clean`
/// removes the whole tree, not only childless leftovers.
#[test]
fn a_dead_services_parent_cgroup_with_runs_below_is_swept() {
    if !can_run("service_shared_debris") {
        return;
    }
    // Pids of processes that have exited (reaped): debris owners.
    let dead = || {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    let own = cgroup_dir_of(std::process::id() as i32).expect("our cgroup");
    let parent = own.join(format!("tartaros-{}-111", dead()));
    let run = parent.join(format!("tartaros-{}-222", dead()));
    std::fs::create_dir(&parent).unwrap();
    std::fs::create_dir(&run).unwrap();
    let out = tartaros(&["doctor", "--clean"], Path::new("/"));
    let gone = !parent.exists();
    if !gone {
        remove_cgroup(&parent);
    }
    assert!(gone, "the dead service's tree was kept: {}", stderr(&out));
}
