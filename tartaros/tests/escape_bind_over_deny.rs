//! `--bind` against the denies (adversarial round 4). Scope mounts land on
//! top of the denies (scope.rs), so a bind whose target holds a read-denied
//! path showed the source's file under the denied name, and the run said
//! nothing. `--tmpfs` over a deny was already refused; a bind now is too,
//! with the source's path to deny instead, and denying that path holds in
//! the bind.

mod common;

use common::*;

fn source_with_secret() -> Dir {
    let src = Dir::new();
    src.file("secret", "BOUND-SECRET\n");
    src
}

#[test]
fn a_bind_over_a_read_denied_path_is_refused_before_the_agent_reads_it() {
    if !can_run("escape_bind_over_deny") {
        return;
    }
    let (work, src) = (Dir::new(), source_with_secret());
    work.file("b/secret", "HOST-SECRET\n");
    let w = work.path().to_str().unwrap();
    let target = work.join("b");
    let denied = work.join("b/secret");
    for strict in [false, true] {
        let mut args = vec![
            "run",
            "-q",
            "--write",
            w,
            "--read-deny",
            denied.to_str().unwrap(),
            "--bind",
            src.path().to_str().unwrap(),
            target.to_str().unwrap(),
        ];
        if strict {
            args.push("--strict");
        }
        args.extend_from_slice(&["--", "cat", denied.to_str().unwrap()]);
        let out = tartaros(&args, work.path());
        assert!(
            !stdout(&out).contains("SECRET"),
            "the agent read the denied path (strict {strict}): {}",
            stdout(&out)
        );
        assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
        let want = src.join("secret");
        assert!(
            stderr(&out).contains(&format!("deny {} instead", want.display())),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_read_deny_of_the_bind_source_holds_in_the_bind() {
    if !can_run("escape_bind_over_deny") {
        return;
    }
    let (work, src) = (Dir::new(), source_with_secret());
    std::fs::create_dir(work.join("b")).unwrap();
    let w = work.path().to_str().unwrap();
    let target = work.join("b");
    let out = tartaros(
        &[
            "run",
            "-q",
            "--write",
            w,
            "--read-deny",
            src.join("secret").to_str().unwrap(),
            "--bind",
            src.path().to_str().unwrap(),
            target.to_str().unwrap(),
            "--",
            "cat",
            work.join("b/secret").to_str().unwrap(),
        ],
        work.path(),
    );
    assert!(!stdout(&out).contains("SECRET"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
}
