//! A config file's `~` under sudo. `sudo` sets HOME to /root, but the agent
//! runs as the user who ran it (`SUDO_UID`), or as `--user`: a config's
//! `read_denies = ["~/.ssh"]` guarded /root/.ssh while the agent read the
//! user's own key, with no word of warning. The shell expands a `~` on the
//! command line before sudo, to the user's home, so the same policy given as
//! flags held.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const SECRET: &str = "PRIVATE-KEY-c5";

/// A user of its own whose home is `home`, removed when dropped.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn new(home: &Path, tag: char) -> Self {
        let name = format!("tt-c5{tag}{}", std::process::id() % 100_000);
        let _ = Command::new("userdel")
            .arg(&name)
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", "--home-dir"])
            .arg(home)
            .arg(&name)
            .status()
            .expect("useradd");
        assert!(ok.success(), "useradd {name}");
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().expect("id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("numeric id")
        };
        let (uid, gid) = (id("-u"), id("-g"));
        TestUser { name, uid, gid }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// A home with `.ssh/id` (mode 0600, the user's) and a config that denies
/// `~/.ssh`.
fn home_with_key(base: &Path, user: &TestUser) -> std::path::PathBuf {
    let home = base.join("home");
    let ssh = home.join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id"), SECRET).unwrap();
    std::fs::set_permissions(ssh.join("id"), std::fs::Permissions::from_mode(0o600)).unwrap();
    for p in [&home, &ssh, &ssh.join("id")] {
        std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid)).unwrap();
    }
    std::fs::write(
        base.join("policy.toml"),
        "[policy]\nread_denies = [\"~/.ssh\"]\n",
    )
    .unwrap();
    home
}

fn base_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tt-c5home-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn assert_key_unread(out: &std::process::Output, how: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(SECRET),
        "{how}: the agent read the key a config's ~/.ssh deny names: {stdout} / {stderr}"
    );
}

#[test]
fn a_config_tilde_under_sudo_is_the_agents_home_not_roots() {
    if !common::can_run("a_config_tilde_under_sudo_is_the_agents_home_not_roots") {
        return;
    }
    let base = base_dir();
    let home = base.path().join("home");
    let user = TestUser::new(&home, 's');
    home_with_key(base.path(), &user);
    let key = home.join(".ssh/id");
    // What `sudo tartaros run --config policy.toml` gives: HOME is root's,
    // SUDO_UID and SUDO_GID the user's.
    let out = Command::new(common::bin())
        .current_dir(base.path())
        .env("HOME", "/root")
        .env("SUDO_UID", user.uid.to_string())
        .env("SUDO_GID", user.gid.to_string())
        .arg("run")
        .arg("-q")
        .arg("--config")
        .arg(base.path().join("policy.toml"))
        .args(["--", "cat"])
        .arg(&key)
        .output()
        .unwrap();
    assert_key_unread(&out, "sudo");
    assert!(
        !out.status.success(),
        "cat of the denied key succeeded: {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_config_tilde_with_user_is_that_users_home() {
    if !common::can_run("a_config_tilde_with_user_is_that_users_home") {
        return;
    }
    let base = base_dir();
    let home = base.path().join("home");
    let user = TestUser::new(&home, 'u');
    home_with_key(base.path(), &user);
    let key = home.join(".ssh/id");
    let out = Command::new(common::bin())
        .current_dir(base.path())
        .env("HOME", "/root")
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .arg("run")
        .arg("-q")
        .args(["--user", &user.name])
        .arg("--config")
        .arg(base.path().join("policy.toml"))
        .args(["--", "cat"])
        .arg(&key)
        .output()
        .unwrap();
    assert_key_unread(&out, "--user");
    assert!(!out.status.success());
}
