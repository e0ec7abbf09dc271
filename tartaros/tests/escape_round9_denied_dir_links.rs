//! Hard links out of a read-denied directory (adversarial round 9). A deny
//! guards names: a file under `--read-deny DIR` that has another name
//! elsewhere in the read scope (planted by the host or by an earlier run
//! with a broader policy) was read through that name, and only files named
//! by the policy were checked for other links. Proved from the host side:
//! the exit status, and whether the agent's copy of the secret exists.

mod common;
use common::*;

const SECRET: &str = "TOKEN=hunter2";

/// A root `W` with a denied directory `W/secrets` holding `key`, whose
/// other name is `other` (inside `W`, or outside every root).
fn planted(other_inside: bool) -> (Dir, Dir, std::path::PathBuf) {
    let work = Dir::new();
    let elsewhere = Dir::new();
    std::fs::create_dir(work.join("secrets")).unwrap();
    let key = work.file("secrets/key", SECRET);
    let other = if other_inside {
        work.join("notes.txt")
    } else {
        elsewhere.join("notes.txt")
    };
    std::fs::hard_link(&key, &other).unwrap();
    (work, elsewhere, other)
}

fn run_reading(work: &Dir, other: &std::path::Path, strict: bool) -> std::process::Output {
    let copy = work.join("copy");
    let script = format!("cat {} > {}", other.display(), copy.display());
    let secrets = work.join("secrets");
    let mut args = vec!["run"];
    if strict {
        args.push("--strict");
    }
    args.extend([
        "--write",
        work.path().to_str().unwrap(),
        "--read-deny",
        secrets.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    tartaros(&args, work.path())
}

#[test]
fn a_file_of_a_denied_directory_with_another_name_refuses_a_strict_run() {
    if !can_run("a_file_of_a_denied_directory_with_another_name_refuses_a_strict_run") {
        return;
    }
    for other_inside in [true, false] {
        let (work, _elsewhere, other) = planted(other_inside);
        let out = run_reading(&work, &other, true);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "inside {other_inside}: {err}");
        assert!(err.contains("has 2 hard links"), "{err}");
        assert!(
            !work.join("copy").exists(),
            "the agent read the denied key through {}",
            other.display()
        );
        // Without --strict the run goes on, and says the deny is degraded.
        let out = run_reading(&work, &other, false);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("has 2 hard links"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_denied_directory_without_other_links_runs_strict() {
    if !can_run("a_denied_directory_without_other_links_runs_strict") {
        return;
    }
    let work = Dir::new();
    std::fs::create_dir_all(work.join("secrets/deeper")).unwrap();
    work.file("secrets/key", SECRET);
    work.file("secrets/deeper/key", SECRET);
    std::os::unix::fs::symlink("/etc/passwd", work.join("secrets/link")).unwrap();
    let other = work.file("notes.txt", "plain");
    let out = run_reading(&work, &other, true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(work.join("copy")).unwrap(), "plain");
}

/// A denied tree larger than the walk's bound is not looked through in
/// full, and the run says so (and a strict run refuses): the check must
/// not silently pass what it did not see.
#[test]
fn a_denied_directory_too_large_to_walk_is_said_to_be_unchecked() {
    if !can_run("a_denied_directory_too_large_to_walk_is_said_to_be_unchecked") {
        return;
    }
    let work = Dir::new();
    let secrets = work.join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    for i in 0..20_001 {
        std::fs::File::create(secrets.join(i.to_string())).unwrap();
    }
    let other = work.file("notes.txt", "plain");
    let out = run_reading(&work, &other, true);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("more than 20000 entries"), "{err}");
    assert!(!work.join("copy").exists());
}
