//! Started by an ordinary user, tartaros still confines the agent: a user
//! namespace carries the mount, PID, network, IPC and UTS namespaces;
//! Landlock and seccomp are unchanged; cgroup features degrade with a
//! warning (or are refused under --strict), except the task bound, which
//! the agent's own user namespace keeps (containment_user_tasks.rs).

mod common;

use common::*;

/// A uid with no passwd entry: nothing to create or remove on the host.
const TEST_UID: u32 = 47_000 + 123;

fn as_user(args: &[&str], cwd: &std::path::Path) -> std::process::Output {
    run_as(TEST_UID, args, cwd)
}

#[test]
fn an_ordinary_user_gets_the_same_filesystem_walls_and_no_capabilities() {
    if !can_run("unprivileged") {
        return;
    }
    let work = Dir::new();
    chown(work.path(), TEST_UID);
    let secret = work.join("secret.txt");
    std::fs::write(&secret, "s3cr3t").unwrap();
    chown(&secret, TEST_UID);
    let outside = Dir::open_to_all();
    let code = format!(
        "{ATTEMPT}
attempt('inside', lambda: open('{w}/made', 'w').write('x'))
attempt('outside', lambda: open('{o}/escape', 'w'))
attempt('secret', lambda: open('{w}/secret.txt').read())
attempt('unshare', lambda: checked(libc.unshare(0x10000000)))
print('caps', [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])
print('procs', len([p for p in os.listdir('/proc') if p.isdigit()]))",
        w = work.path().display(),
        o = outside.path().display()
    );
    let out = as_user(
        &[
            "run",
            "--write",
            work.path().to_str().unwrap(),
            "--read-deny",
            secret.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
        ],
        work.path(),
    );
    expect(&out, "inside", "OK");
    // The read-only base answers before Landlock does.
    expect(&out, "outside", "EROFS");
    expect(&out, "secret", "EACCES");
    expect(&out, "unshare", "EPERM");
    expect(&out, "caps", "0000000000000000");
    let procs: u32 = stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix("procs "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(procs <= 3, "sees host processes: {procs}");
    assert!(!outside.join("escape").exists());
    // The file the agent made belongs to the user outside.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(work.join("made")).unwrap().uid(),
        TEST_UID
    );
}

#[test]
fn cgroup_features_degrade_with_a_warning_and_are_refused_under_strict() {
    if !can_run("unprivileged_degrade") {
        return;
    }
    let work = Dir::new();
    chown(work.path(), TEST_UID);
    // Memory needs the cgroup; tasks do not (the agent's own user
    // namespace bounds them: containment_user_tasks.rs).
    let out = as_user(&["run", "--max-memory", "100M", "--", "true"], work.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: max-memory not installed"),
        "{}",
        stderr(&out)
    );
    let strict = as_user(
        &[
            "run",
            "--strict",
            "--max-memory",
            "100M",
            "--",
            "touch",
            "agent-ran",
        ],
        work.path(),
    );
    assert_eq!(strict.status.code(), Some(78), "{}", stderr(&strict));
    assert!(stderr(&strict).starts_with("tartaros: "));
    assert!(!work.join("agent-ran").exists());
}
