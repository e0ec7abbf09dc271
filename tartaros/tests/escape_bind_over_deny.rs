//! `--bind` against the denies (adversarial round 4). Scope mounts land on
//! top of the denies (scope.rs), so a bind whose target holds a read-denied
//! path showed the source's file under the denied name, and the run said
//! nothing. `--tmpfs` over a deny was already refused; a bind now is too,
//! with the source's path to deny instead, and denying that path holds in
//! the bind, outside the writable roots. Inside one it is refused (round
//! 25a): the root's grant reaches the bind through its mount, and once the
//! host replaced the denied file the agent read the new one there.

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
    let (work, src, outside) = (Dir::new(), source_with_secret(), Dir::new());
    std::fs::create_dir(work.join("b")).unwrap();
    let w = work.path().to_str().unwrap();
    let deny = src.join("secret");
    let run = |target: &std::path::Path| {
        let seen = target.join("secret");
        tartaros(
            &[
                "run",
                "-q",
                "--write",
                w,
                "--read-deny",
                deny.to_str().unwrap(),
                "--bind",
                src.path().to_str().unwrap(),
                target.to_str().unwrap(),
                "--",
                "cat",
                seen.to_str().unwrap(),
            ],
            work.path(),
        )
    };
    let out = run(outside.path());
    assert!(!stdout(&out).contains("SECRET"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    // Inside the writable root: refused before the start.
    let out = run(&work.join("b"));
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(stderr(&out).contains("writable root"), "{}", stderr(&out));
}
