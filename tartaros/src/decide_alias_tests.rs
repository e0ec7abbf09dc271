//! The other mounts of denied paths and of the log (`mount_aliases.rs`),
//! as the decision applies them.

use super::tests::{decide_with, policy, project, root_host};
use super::*;
use crate::mounts::MountOp;

#[test]
fn every_other_mount_of_a_deny_or_the_log_is_denied_the_same_way() {
    // The host shows /w again at /srv/w, and /logs at /w/logs.
    let table = "\
22 1 253:1 / / rw - ext4 /dev/vda1 rw
30 22 253:1 /w /srv/w rw - ext4 /dev/vda1 rw
31 22 253:1 /logs /w/logs rw - ext4 /dev/vda1 rw
";
    let files = project()
        .with("/srv/w", PathKind::Dir, 1000, 0o755)
        .with("/srv/w/.env", PathKind::File, 1000, 0o600)
        .with("/logs", PathKind::Dir, 0, 0o755)
        .with("/w/logs", PathKind::Dir, 0, 0o755);
    let policy = Policy {
        read_denies: vec!["/w/.env".into()],
        ..policy()
    };
    let argv = vec!["true".to_string()];
    let request = Request {
        policy: &policy,
        argv: &argv,
        cwd: Path::new("/w"),
        // Not there yet: the stage creates it, a file.
        log: Some(Path::new("/logs/effects.jsonl")),
        log_buffer: 1 << 20,
        launcher_env: &[],
        setenv: &[],
        pty: false,
    };
    let host = root_host();
    let mut facts = HostFacts {
        host: &host,
        current: Identity { uid: 0, gid: 0 },
        on_behalf: false,
        host_sockets: &[],
        shared_programs: false,
        files: &files,
        mount_table: Some(table),
        placeholder_registry: None,
    };
    let plan = decide(&request, &facts).unwrap();
    let mounts = &plan.init.mounts;
    let hidden = |f: &str| {
        mounts
            .iter()
            .any(|op| matches!(op, MountOp::DenyReadFile(p) if p == Path::new(f)))
    };
    for file in [
        "/w/.env",
        "/srv/w/.env",
        "/logs/effects.jsonl",
        "/w/logs/effects.jsonl",
    ] {
        assert!(hidden(file), "{file}: {mounts:?}");
    }
    // The other mount outside the root goes to Landlock too (it holds a
    // bind of /home at /srv/home; here /w's own rule still reaches it, as
    // rules attach to the directory's inode); the log is never replaced by
    // a rename, and the deny in the root keeps its mount alone.
    let landlock = plan.init.landlock.as_ref().unwrap();
    assert_eq!(landlock.read_denies, vec![PathBuf::from("/srv/w/.env")]);
    // A table that cannot be read: the deny is degraded, refused if strict.
    facts.mount_table = None;
    let plan = decide(&request, &facts).unwrap();
    assert!(!plan.ledger.installed(Guarantee::DenyMounts));
    let strict = Policy {
        strict: true,
        ..policy.clone()
    };
    let request = Request {
        policy: &strict,
        ..request
    };
    assert!(decide(&request, &facts).is_err());
}

#[test]
fn an_absent_deny_outside_the_roots_is_held_by_landlock() {
    // The name the host creates during the run (a first `gh auth login`)
    // lies under listing rights only (landlock_siblings.rs).
    let strict = Policy {
        read_denies: vec!["/home/u/.config/gh".into()],
        write_denies: vec!["/opt/tool/config".into()],
        strict: true,
        ..policy()
    };
    let mut plan = decide_with(&strict, &root_host(), &project(), None, &[]).unwrap();
    assert!(plan.ledger.names(false).is_empty());
    assert!(plan.materialize.is_empty());
    assert!(
        !plan
            .ledger
            .take_warnings()
            .iter()
            .any(|w| w.contains("does not exist"))
    );
    let landlock = plan.init.landlock.unwrap();
    assert_eq!(
        landlock.read_denies,
        vec![PathBuf::from("/home/u/.config/gh")]
    );
}
