//! A read-denied path the host replaces during the run (adversarial round
//! 13). The deny's cover mount sits on the name's dentry, and the kernel
//! detaches it, in every mount namespace, when the host renames a file over
//! the name (`mv credentials.tmp credentials`, as aws, gh and editors save)
//! or removes the directory and makes a new one: the agent then read the
//! new secret through the read grant of the tree above. Landlock now grants
//! the siblings along the denied path instead of that tree, so whatever
//! inode later takes the name is readable by no rule.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Stdio};

const OLD: &str = "old-secret";
const NEW: &str = "new-secret";

/// The agent's script: say it runs, wait (bounded) for the host's `go`,
/// then run `then`; all output on stdout.
fn waiting(work: &Dir, then: &str) -> String {
    format!(
        "touch {ready}; i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; {{ {then} ; }} 2>&1",
        ready = work.join("ready").display(),
        go = work.join("go").display(),
    )
}

/// Runs `script` under `flags` and, once the agent runs, `host` on the
/// host side before letting the agent go on.
fn run_while_host(work: &Dir, flags: &[&str], script: &str, host: impl FnOnce()) -> String {
    let mut args = vec!["run", "--write", work.path().to_str().unwrap()];
    args.extend_from_slice(flags);
    args.extend(["--", "sh", "-c", script]);
    let mut run = KillOnDrop(Some(
        Command::new(bin())
            .args(&args)
            .current_dir(work.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tartaros"),
    ));
    assert!(
        eventually(30, || work.join("ready").exists()),
        "the agent never started"
    );
    host();
    std::fs::write(work.join("go"), "").unwrap();
    let out = run.take().wait_with_output().unwrap();
    let text = stdout(&out);
    eprintln!("{text}\n{}", stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    text
}

/// `path` written as a host tool saves: a temporary file beside it,
/// renamed over it.
fn replace_by_rename(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    chown(&tmp, NOBODY);
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_denied_file_the_host_renames_over_stays_unreadable() {
    if !can_run("a_denied_file_the_host_renames_over_stays_unreadable") {
        return;
    }
    let host = Dir::new();
    let work = Dir::new();
    let creds = host.file("creds", OLD);
    let other = host.file("other", "plain-other");
    let later = host.join("later");
    // A link beside the deny leads to the denied name, not to a rule.
    let alias = host.join("alias");
    std::os::unix::fs::symlink("creds", &alias).unwrap();
    let script = waiting(
        &work,
        &format!(
            "cat {c}; echo rc=$?; cat {a}; echo alias=$?; cat {o}; echo; echo listing=$(ls {h} | tr '\\n' ,); cat /etc/passwd >/dev/null; echo etc=$?; cat {l}; echo later=$?",
            c = creds.display(),
            a = alias.display(),
            o = other.display(),
            h = host.path().display(),
            l = later.display(),
        ),
    );
    let deny = creds.to_str().unwrap();
    let text = run_while_host(&work, &["--read-deny", deny], &script, || {
        replace_by_rename(&creds, NEW);
        // A name the host adds beside the deny during the run.
        std::fs::write(&later, "made-later").unwrap();
        chown(&later, NOBODY);
    });
    assert!(!text.contains(OLD) && !text.contains(NEW), "{text}");
    assert!(text.contains("Permission denied"), "{text}");
    assert!(text.contains("rc=1") && text.contains("alias=1"), "{text}");
    // Siblings, the directory's listing and the rest of the tree stay.
    assert!(text.contains("plain-other"), "{text}");
    assert!(
        text.contains("listing=alias,creds,") && text.contains("other,"),
        "{text}"
    );
    assert!(text.contains("etc=0"), "{text}");
    // Failing closed: a name the host creates beside a deny during the run
    // is under listing rights only (docs/architecture.md).
    assert!(
        !text.contains("made-later") && text.contains("later=1"),
        "{text}"
    );
}

#[test]
fn a_denied_directory_the_host_makes_anew_stays_unreadable() {
    if !can_run("a_denied_directory_the_host_makes_anew_stays_unreadable") {
        return;
    }
    let host = Dir::new();
    let work = Dir::new();
    host.file("d/f", OLD);
    let sibling = host.file("e/g", "plain-sibling");
    let denied = host.join("d");
    let f = denied.join("f");
    let script = waiting(
        &work,
        &format!(
            "cat {f}; echo rc=$?; cat {s}; echo",
            f = f.display(),
            s = sibling.display()
        ),
    );
    let deny = denied.to_str().unwrap();
    let text = run_while_host(&work, &["--read-deny", deny], &script, || {
        std::fs::remove_dir_all(&denied).unwrap();
        std::fs::create_dir(&denied).unwrap();
        chown(&denied, NOBODY);
        std::fs::write(&f, NEW).unwrap();
        chown(&f, NOBODY);
    });
    assert!(!text.contains(OLD) && !text.contains(NEW), "{text}");
    assert!(text.contains("rc=1"), "{text}");
    assert!(text.contains("plain-sibling"), "{text}");
}

#[test]
fn a_deny_inside_a_writable_root_keeps_its_mount_and_the_root_works() {
    if !can_run("a_deny_inside_a_writable_root_keeps_its_mount_and_the_root_works") {
        return;
    }
    let work = Dir::new();
    let env = work.file(".env", OLD);
    work.file("Cargo.lock", "v1");
    let w = work.path().display();
    // What a build does beside a denied file: replace a file by a rename,
    // and read what it made.
    let script = waiting(
        &work,
        &format!(
            "cat {e}; echo rc=$?; echo v2 > {w}/Cargo.lock.tmp && mv {w}/Cargo.lock.tmp {w}/Cargo.lock && cat {w}/Cargo.lock; mkdir {w}/target && echo built > {w}/target/out && cat {w}/target/out",
            e = env.display(),
        ),
    );
    let deny = env.to_str().unwrap();
    let text = run_while_host(&work, &["--read-deny", deny], &script, || {});
    assert!(!text.contains(OLD) && text.contains("rc=1"), "{text}");
    assert!(text.contains("v2") && text.contains("built"), "{text}");
}

#[test]
fn an_absent_deny_outside_the_roots_runs_strict_and_what_the_host_creates_there_is_unreadable() {
    if !can_run("an_absent_deny_outside_the_roots_runs_strict") {
        return;
    }
    // `--read-deny ~/.config/gh` before the first `gh auth login`: no
    // cover can be mounted, and Landlock holds the name all the same.
    let host = Dir::new();
    let work = Dir::new();
    let config = host.join("config");
    let token = config.join("hosts.yml");
    let script = waiting(&work, &format!("cat {t}; echo rc=$?", t = token.display()));
    let deny = config.to_str().unwrap();
    let text = run_while_host(&work, &["--strict", "--read-deny", deny], &script, || {
        std::fs::create_dir(&config).unwrap();
        chown(&config, NOBODY);
        std::fs::write(&token, NEW).unwrap();
        chown(&token, NOBODY);
    });
    assert!(!text.contains(NEW) && text.contains("rc=1"), "{text}");
}

/// Adversarial round 25a (F2): a `--bind` whose source holds the deny.
/// The target's grant held the source's inode, an ancestor of the denied
/// name, so once the host replaced the file the agent read it by both
/// names, under every read scope. The deny now holds at the target too.
#[test]
fn a_deny_under_a_bind_source_stays_unreadable_when_replaced() {
    if !can_run("a_deny_under_a_bind_source_stays_unreadable_when_replaced") {
        return;
    }
    for scope in ["all", "granted", "none"] {
        let host = Dir::new();
        let target = Dir::new();
        let work = Dir::new();
        let creds = host.file("s/key", OLD);
        host.file("s/other", "plain-other");
        let via_bind = target.join("s/key");
        let script = waiting(
            &work,
            &format!(
                "cat {b}; echo rc=$?; cat {c}; echo rc=$?; cat {o}; echo",
                b = via_bind.display(),
                c = creds.display(),
                o = target.join("s/other").display(),
            ),
        );
        let (src, dst) = (
            host.path().to_str().unwrap(),
            target.path().to_str().unwrap(),
        );
        let mut flags = vec![
            "--read-scope",
            scope,
            "--read-deny",
            creds.to_str().unwrap(),
        ];
        flags.extend(["--bind", src, dst]);
        if scope == "none" {
            // /bin, /lib and /lib64 lead into /usr here.
            flags.extend(["--exec-allow", "/usr"]);
        }
        let text = run_while_host(&work, &flags, &script, || replace_by_rename(&creds, NEW));
        assert!(
            !text.contains(OLD) && !text.contains(NEW),
            "{scope}: {text}"
        );
        assert_eq!(text.matches("rc=1").count(), 2, "{scope}: {text}");
        assert!(text.contains("plain-other"), "{scope}: {text}");
    }
}
