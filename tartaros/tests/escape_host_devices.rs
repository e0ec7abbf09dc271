//! Host device nodes outside /dev. The sandbox's /dev is a tmpfs of its own
//! with a handful of nodes, but a device node elsewhere in the host's tree
//! (a chroot's or a VM image's `dev/sda`, a backup of /dev) opened for
//! reading on the read-only base: a read-only mount stops writes to
//! regular files, not opens of devices, and Landlock grants reads of the
//! whole tree. Here a loop device over a root-only file stands for the
//! user's disk: the agent read the file's bytes through the node.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const SECRET: &str = "DISK-BYTES-c5dev";

/// A read-only loop device over `file`, detached when dropped.
struct Loop(String);

impl Loop {
    fn new(file: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["-r", "-f", "--show"])
            .arg(file)
            .output()
            .expect("losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn minor(&self) -> u32 {
        self.0
            .trim_start_matches("/dev/loop")
            .parse()
            .expect("a /dev/loopN name")
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A world-readable block node for a loop device over a root-only file,
/// outside /dev: the file itself cannot be read by the agent, the node can
/// unless the sandbox refuses devices outside its own /dev.
fn node_over_secret(base: &Path) -> (Loop, std::path::PathBuf) {
    let store = base.join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = store.join("disk.img");
    let mut bytes = SECRET.as_bytes().to_vec();
    bytes.resize(64 * 1024, b'\n');
    std::fs::write(&file, bytes).unwrap();
    let dev = Loop::new(&file);
    let node = base.join("disk");
    let made = Command::new("mknod")
        .args(["-m", "0644"])
        .arg(&node)
        .args(["b", "7", &dev.minor().to_string()])
        .status()
        .expect("mknod");
    assert!(made.success());
    (dev, node)
}

fn base_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tt-c5dev-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn a_host_device_node_outside_dev_cannot_be_opened() {
    if !common::can_run("a_host_device_node_outside_dev_cannot_be_opened") {
        return;
    }
    let base = base_dir();
    let (_dev, node) = node_over_secret(base.path());
    let script = format!(
        "head -c 64 {}; echo; head -c 3 /dev/zero | wc -c; echo x > /dev/null && echo null-ok",
        node.display()
    );
    let out = Command::new(common::bin())
        .args(["run", "-q", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(SECRET),
        "the agent read a host block device outside /dev: {stdout}"
    );
    assert!(
        stderr.contains("Permission denied"),
        "the open of the node did not fail with EACCES: {stderr}"
    );
    // The sandbox's own devices still work.
    assert!(
        stdout.contains("3\n") && stdout.contains("null-ok"),
        "{stdout} / {stderr}"
    );
}

#[test]
fn an_ordinary_users_run_cannot_open_a_host_device_node_either() {
    if !common::can_run("an_ordinary_users_run_cannot_open_a_host_device_node_either") {
        return;
    }
    let base = base_dir();
    let (_dev, node) = node_over_secret(base.path());
    let script = format!(
        "head -c 64 {}; echo; head -c 3 /dev/zero | wc -c",
        node.display()
    );
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::bin())
        .args(["run", "-q", "--", "sh", "-c", &script])
        .current_dir(base.path())
        .env("HOME", base.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(SECRET),
        "an ordinary user's agent read a host block device outside /dev: {stdout}"
    );
    assert!(stdout.contains("3\n"), "{stdout} / {stderr}");
}

#[test]
fn a_host_device_node_inside_a_writable_root_cannot_be_opened() {
    if !common::can_run("a_host_device_node_inside_a_writable_root_cannot_be_opened") {
        return;
    }
    let base = base_dir();
    let (_dev, node) = node_over_secret(base.path());
    let script = format!("head -c 64 {}; echo", node.display());
    let out = Command::new(common::bin())
        .args(["run", "-q", "--write"])
        .arg(base.path())
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(SECRET),
        "the agent read a host block device in its writable root: {stdout}"
    );
    assert!(stderr.contains("Permission denied"), "{stderr}");
}
