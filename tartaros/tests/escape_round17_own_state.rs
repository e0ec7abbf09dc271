//! Adversarial round 17: tartaros's own state on the host. An agent run
//! as `--user root` (uid 0, no capabilities) owns every root-owned file
//! it can read, and two of them are tartaros's: `flock(LOCK_EX)` on the
//! pin cache's lock (`/run/tartaros/bpf.lock`, readable to uid 0) blocked
//! every later `--log` run until the agent's run ended, and a write lease
//! on the kernel layout cache made the next run's start wait 45 s. The
//! sandbox no longer shows `/run/tartaros` at all (as `/sys/fs/cgroup`).
//! Asserted from the host: the agent cannot open either file, and the host
//! takes the lock at once while the agent runs.

mod common;
use std::path::Path;

use common::*;

#[test]
fn an_agent_run_as_root_reaches_none_of_tartaros_s_state() {
    if !can_run("escape_round17_own_state") {
        return;
    }
    // A plain root run and a `--log` run: the lock and the layout cache
    // exist on the host.
    let first = tartaros(&["run", "--", "true"], Path::new("/"));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let lock = Path::new("/run/tartaros/bpf.lock");
    assert!(lock.exists(), "no pin cache lock after a root run");
    let layout = std::fs::read_dir("/run/tartaros")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("kernel-layout"))
        .expect("the kernel layout cache");
    let work = Dir::open_to_all();
    let (l, k, w) = (lock.display(), layout.display(), work.path().display());
    let agent = format!(
        "import fcntl, time
def hold(path, how):
    fd = os.open(path, os.O_RDONLY)
    how(fd)
attempt('lock', lambda: hold('{l}', lambda fd: fcntl.flock(fd, fcntl.LOCK_EX)))
attempt('layout', lambda: hold('{k}', lambda fd: None))
attempt('list', lambda: os.listdir('/run/tartaros'))
open('{w}/ready', 'w').close()
time.sleep(2)
attempt('done', lambda: None)
"
    );
    let code = format!("{ATTEMPT}{agent}");
    let child = std::process::Command::new(bin())
        .args(["run", "--user", "root", "--write"])
        .arg(work.path())
        .args(["--", "python3", "-c", &code])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(20, || work.join("ready").exists()), "no start");
    // While the agent runs, the host takes the lock without waiting.
    let file = std::fs::File::open(lock).unwrap();
    assert!(file.try_lock().is_ok(), "the pin cache's lock is held");
    drop(file);
    let out = child.wait_with_output().unwrap();
    for label in ["lock", "layout", "list"] {
        expect(&out, label, "EACCES");
    }
    expect(&out, "done", "OK");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
