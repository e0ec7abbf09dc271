//! A `~` no shell expanded. A harness passing its argument list without a
//! shell (or a quoted `"~/.ssh"`) gave `--read-deny ~/.ssh` literally:
//! taken as a name under the working directory, the deny guarded an absent
//! `./~/.ssh`, the run started without a word (even under `--strict`), and
//! the agent read the real key.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const SECRET: &str = "PRIVATE-KEY-c5tilde";

#[test]
fn a_deny_given_with_an_unexpanded_tilde_never_leaves_the_key_readable() {
    if !common::can_run("a_deny_given_with_an_unexpanded_tilde_never_leaves_the_key_readable") {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("tt-c5tilde-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh).unwrap();
    std::fs::write(ssh.join("id"), SECRET).unwrap();
    std::fs::set_permissions(ssh.join("id"), std::fs::Permissions::from_mode(0o644)).unwrap();
    for flag in ["--read-deny", "--write-deny"] {
        // No shell: the argument list as a harness builds it.
        let out = Command::new(common::bin())
            .current_dir(home.path())
            .env("HOME", home.path())
            .args(["run", "-q", "--strict", flag, "~/.ssh", "--", "cat"])
            .arg(ssh.join("id"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stdout.contains(SECRET),
            "{flag} ~/.ssh left the key readable: {stdout}"
        );
        assert_eq!(out.status.code(), Some(78), "{flag}: {stderr}");
        assert!(stderr.contains("~"), "{stderr}");
    }
}
