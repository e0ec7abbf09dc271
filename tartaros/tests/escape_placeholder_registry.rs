//! The placeholder registry of an ordinary user's runs (`--materialize`,
//! `/tmp/tartaros-<uid>/placeholders` without `$XDG_RUNTIME_DIR`) belongs
//! to the user, and so to every agent of theirs: an agent that took the
//! registry lock stalled the user's other runs for as long as it liked, and
//! with the registry in a writable root (`--write /tmp`) it could replace
//! another run's marker. Every run now hides the registry from its agent.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn as_nobody(home: &std::path::Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::bin())
        .env_remove("XDG_RUNTIME_DIR")
        .env("HOME", home)
        .current_dir(home);
    cmd
}

#[test]
fn an_agent_cannot_lock_its_users_placeholder_registry() {
    if !common::can_run("an_agent_cannot_lock_its_users_placeholder_registry") {
        return;
    }
    let work = common::Dir::new();
    let registry = std::path::Path::new("/tmp/tartaros-65534/placeholders");
    // A first run makes the registry, as any --materialize run would.
    let made = as_nobody(work.path())
        .args(["run", "-q", "--materialize", "--write"])
        .arg(work.path())
        .arg("--read-deny")
        .arg(work.path().join(".env"))
        .args(["--", "true"])
        .status()
        .unwrap();
    assert!(made.success());
    assert!(registry.join("registry.lock").exists());
    // The agent holds the registry lock for 6 s...
    let mut holder = as_nobody(work.path())
        .args(["run", "-q", "--write"])
        .arg(work.path())
        .args([
            "--",
            "sh",
            "-c",
            "flock -x /tmp/tartaros-65534/placeholders/registry.lock sleep 6; sleep 6",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // ... while the user starts another run that materializes a deny.
    let started = Instant::now();
    let other = as_nobody(work.path())
        .args(["run", "-q", "--materialize", "--write"])
        .arg(work.path())
        .arg("--read-deny")
        .arg(work.path().join(".env2"))
        .args(["--", "true"])
        .status()
        .unwrap();
    let took = started.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(other.success());
    assert!(
        took < Duration::from_secs(3),
        "another run of the user waited {took:?} on a lock the agent held"
    );
}
