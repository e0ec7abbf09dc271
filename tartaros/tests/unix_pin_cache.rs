//! The pin cache of a plain root run's unix programs (ebpf/pin_cache.rs):
//! the first run pins what it verified, the next attaches the same
//! programs (asserted from the host: the program attached to the run's
//! cgroup is the pinned one) and still refuses a host socket; a tampered
//! cache is detected and replaced; a SIGKILLed run's entries are removed
//! by the next run; `tartaros cache drop` leaves nothing mounted.
//!
//! One test, in steps: the cache is host-wide state.

mod common;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::pins::*;
use common::*;

/// `BPF_CGROUP_UNIX_CONNECT`.
const ATTACH_UNIX_CONNECT: u32 = 49;

/// The ids of the programs attached to `cgroup` for unix connects.
fn attached_unix_connect(cgroup: &Path) -> Vec<u32> {
    let dir = std::fs::File::open(cgroup).unwrap();
    let mut ids = [0u32; 8];
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(dir.as_raw_fd() as u32).to_le_bytes());
    attr[4..8].copy_from_slice(&ATTACH_UNIX_CONNECT.to_le_bytes());
    attr[16..24].copy_from_slice(&(ids.as_mut_ptr() as u64).to_le_bytes());
    attr[24..28].copy_from_slice(&8u32.to_le_bytes());
    bpf(16, &mut attr).expect("query the cgroup's programs");
    let count = u32::from_le_bytes(attr[24..28].try_into().unwrap()) as usize;
    ids[..count.min(8)].to_vec()
}

/// The one cache directory.
fn cache_dir() -> Option<PathBuf> {
    cache_dir_of("unix_")
}

/// The agent: connects to the host socket (which it must not reach) and
/// to its own, after `wait` exists (when given).
fn agent(work: &Dir, host: &Path, wait: Option<&Path>) -> Command {
    let (w, h) = (work.path().display(), host.display());
    let wait = wait.map_or(String::new(), |p| {
        format!(
            "open('{w}/ready', 'w').close()\nwhile not os.path.exists('{}'): time.sleep(0.02)\n",
            p.display()
        )
    });
    let code = format!(
        "{ATTEMPT}
import socket, time
{wait}def connect(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind('{w}/own.sock')
srv.listen()
attempt('host', lambda: connect('{h}'))
attempt('control-own', lambda: connect('{w}/own.sock'))"
    );
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--strict", "--write"])
        .arg(work.path())
        .args(["--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn denied(out: &Output) {
    expect(out, "host", "EPERM");
    expect(out, "control-own", "OK");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
}

fn run_once(host: &Path) -> Output {
    let work = Dir::new();
    agent(&work, host, None).output().unwrap()
}

/// `MAX_RUNS` empty cgroups, each with an entry in `RUNS`; the cgroups
/// are removed on drop.
struct Fill {
    cgroups: Vec<PathBuf>,
}

impl Fill {
    fn new(runs: &OwnedFd) -> Self {
        let parent = run_parent();
        let value = vec![0u8; value_size(runs)];
        let cgroups: Vec<PathBuf> = (0..1024)
            .map(|i| parent.join(format!("pin-cache-fill-{}-{i}", std::process::id())))
            .collect();
        let fill = Fill { cgroups };
        for cgroup in &fill.cgroups {
            std::fs::create_dir(cgroup).unwrap();
            let key = inode(cgroup);
            let mut attr = [0u8; 128];
            attr[0..4].copy_from_slice(&(runs.as_raw_fd() as u32).to_le_bytes());
            attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_le_bytes());
            attr[16..24].copy_from_slice(&(value.as_ptr() as u64).to_le_bytes());
            bpf(2, &mut attr).expect("fill RUNS");
        }
        fill
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        for cgroup in &self.cgroups {
            let _ = std::fs::remove_dir(cgroup);
        }
    }
}

#[test]
fn plain_runs_reuse_checked_pins_and_leave_nothing_after_cache_drop() {
    if !can_run("unix_pin_cache") {
        return;
    }
    let outside = Dir::open_to_all();
    let host_path = outside.join("host.sock");
    let host = UnixListener::bind(&host_path).unwrap();
    std::fs::set_permissions(
        &host_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    host.set_nonblocking(true).unwrap();
    drop_cache();
    assert!(!mounted() && !Path::new(PIN_ROOT).exists());

    // 1. The first run loads afresh and pins.
    denied(&run_once(&host_path));
    let dir = cache_dir().expect("the first run pinned its programs");
    let pinned = obj_id(&obj_get(&dir.join("prog_unix_connect")));
    assert!(entries(&dir).is_empty(), "the run left entries");

    // 2. The second attaches the pinned programs and still refuses.
    let work = Dir::new();
    let go = work.join("go");
    let child = agent(&work, &host_path, Some(&go)).spawn().unwrap();
    assert!(eventually(20, || work.join("ready").exists()), "no start");
    let cgroup = run_cgroup(child.id());
    assert_eq!(attached_unix_connect(&cgroup), vec![pinned]);
    assert_eq!(
        entries(&dir),
        vec![inode(&cgroup)],
        "its entries, keyed by its cgroup"
    );
    std::fs::write(&go, "").unwrap();
    let out = child.wait_with_output().unwrap();
    denied(&out);
    assert!(!stderr(&out).contains("cached"), "{}", stderr(&out));
    assert!(entries(&dir).is_empty(), "the run left entries");
    assert!(host.accept().is_err(), "the host socket got a connection");

    // 3. A swapped program pin is detected: warned, removed, replaced.
    let sendmsg = obj_get(&dir.join("prog_unix_sendmsg"));
    std::fs::remove_file(dir.join("prog_unix_connect")).unwrap();
    obj_pin(&sendmsg, &dir.join("prog_unix_connect"));
    let out = run_once(&host_path);
    denied(&out);
    let warned = stderr(&out);
    assert!(
        warned.contains("failed to reuse the cached programs") && warned.contains("tag"),
        "{warned}"
    );
    let dir = cache_dir().expect("pinned again");
    let repinned = obj_id(&obj_get(&dir.join("prog_unix_connect")));
    assert_ne!(repinned, pinned);

    // 4. A changed map (the level) is detected too.
    set_u32(&obj_get(&dir.join("map_RUN_LEVEL")), 77);
    let out = run_once(&host_path);
    denied(&out);
    assert!(stderr(&out).contains("RUN_LEVEL is 77"), "{}", stderr(&out));
    let dir = cache_dir().expect("pinned again");
    let runs = obj_get(&dir.join("map_RUNS"));

    // 5. A SIGKILLed run leaves its entries; the next run removes them.
    denied(&run_once(&host_path));
    let work = Dir::new();
    let never = work.join("never");
    let mut killed = agent(&work, &host_path, Some(&never)).spawn().unwrap();
    assert!(eventually(20, || work.join("ready").exists()), "no start");
    let cgroup = run_cgroup(killed.id());
    let id = inode(&cgroup);
    assert_eq!(keys(&runs), vec![id]);
    killed.kill().unwrap();
    let _ = killed.wait();
    assert!(
        eventually(30, || !cgroup.exists()),
        "the killed run's cgroup stayed"
    );
    assert_eq!(entries(&dir), vec![id], "the killed run's entries are left");
    denied(&run_once(&host_path));
    assert!(
        entries(&dir).is_empty(),
        "the stale entries were not removed"
    );

    // 6. With the shared maps full of live runs (1,024 cgroups that
    // exist), a run gets programs of its own, still refuses, and leaves
    // the others' entries; once those cgroups are gone, the next run
    // removes them all.
    let fill = Fill::new(&runs);
    let out = run_once(&host_path);
    denied(&out);
    assert!(!stderr(&out).contains("cached"), "{}", stderr(&out));
    assert_eq!(keys(&runs).len(), fill.cgroups.len());
    drop(fill);
    denied(&run_once(&host_path));
    assert!(
        entries(&dir).is_empty(),
        "the stale entries were not removed"
    );

    // 7. `cache drop` leaves nothing mounted and nothing behind.
    drop(runs);
    drop_cache();
    assert!(!mounted(), "the bpffs is still mounted");
    assert!(!Path::new(PIN_ROOT).exists() && !Path::new(PIN_LOCK).exists());
    drop_cache();
}
