//! Adversarial round 25a (F3): the agent lost its user's supplementary
//! groups, and a group can exclude: a file `root:G 0604` is readable by
//! everyone but G. An agent run as a member of G (`--user`, `sudo`'s
//! user, a service caller) read what its user cannot. The agent now has
//! its user's groups. Needs root (fails under CI=true without).

mod common;

use std::process::Command;

use common::*;

/// A throwaway user in a throwaway group, removed on drop.
struct Member {
    user: String,
    group: String,
}

impl Member {
    fn new() -> Self {
        let tag = std::process::id();
        let (user, group) = (format!("tt25u{tag}"), format!("tt25g{tag}"));
        let _ = Command::new("userdel").arg(&user).status();
        let _ = Command::new("groupdel").arg(&group).status();
        let made = Command::new("groupadd")
            .arg(&group)
            .status()
            .expect("groupadd");
        assert!(made.success(), "groupadd {group}");
        let made = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/bin/sh",
                "--groups",
                &group,
                &user,
            ])
            .status()
            .expect("useradd");
        assert!(made.success(), "useradd {user}");
        Self { user, group }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.user).status();
        let _ = Command::new("groupdel").arg(&self.group).status();
    }
}

#[test]
fn a_group_that_excludes_its_members_still_excludes_the_agent() {
    if !can_run("escape_round25_groups") {
        return;
    }
    let member = Member::new();
    let host = Dir::new();
    std::fs::set_permissions(
        host.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let secret = host.join("secret");
    std::fs::write(&secret, "NEGSECRET\n").unwrap();
    let chgrp = Command::new("chgrp")
        .arg(&member.group)
        .arg(&secret)
        .status()
        .unwrap();
    assert!(chgrp.success());
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o604)).unwrap();
    // The user itself cannot read it.
    let direct = Command::new("su")
        .args([&member.user, "-s", "/bin/sh", "-c"])
        .arg(format!("cat {}", secret.display()))
        .output()
        .unwrap();
    assert!(!direct.status.success(), "the member read it directly");
    let work = Dir::new();
    let script = format!("id; cat {}; echo rc=$?", secret.display());
    let w = work.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run",
            "--user",
            &member.user,
            "--write",
            w,
            "--",
            "sh",
            "-c",
            &script,
        ],
        work.path(),
    );
    let said = stdout(&out);
    assert!(
        !said.contains("NEGSECRET"),
        "the agent read what its user cannot: {said}"
    );
    assert!(said.contains("rc=1"), "{said}{}", stderr(&out));
    assert!(
        said.contains(&member.group),
        "the agent lacks its user's group: {said}"
    );
}
