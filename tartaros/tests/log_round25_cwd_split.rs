//! Adversarial round 25b, F3: a cwd some threads do not share. The log
//! names a relative path by a cwd model kept per process, but the kernel
//! keeps a cwd per `fs_struct`, and a thread can have one of its own
//! (`unshare(CLONE_FS)`, or `clone` without `CLONE_FS`), as can a
//! `CLONE_FS` child that has called `unshare` since. One thread's `chdir`
//! moved the model of every thread: the main thread's refused read of
//! `x/secret` was logged as a refused read of `y/secret`, `verify` ok.
//! Each test runs an agent that ends with a refused relative read of the
//! read-denied `x/secret` and checks its record: named `x/secret`, or
//! marked `cwd_unverified` (the agent's claim, counted by `verify`), never
//! another file without the mark. Needs root and gcc.

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char x[4096], y[4096];
static volatile int done;
static int up[2], down[2], hold[2];

/* The name on the stack, as an agent would build it. */
static int read_secret(void) {
    char n[16];
    strcpy(n, "secret");
    int fd = open(n, O_RDONLY);
    return fd < 0 ? 0 : 3;
}

static void *unshare_then_y(void *a) {
    if (unshare(CLONE_FS) || chdir(y)) exit(5);
    return 0;
}

static int thread_to_y(void *a) {
    if (chdir(y)) exit(5);
    done = 1;
    syscall(SYS_exit, 0);
    return 0;
}

static int child_unshare_to_y(void *a) {
    if (unshare(CLONE_FS) || chdir(y)) _exit(5);
    _exit(0);
}

static int child_to_x(void *a) { _exit(chdir(x) ? 5 : 0); }

/* Unshares, waits until a peer has moved the shared cwd, reads. */
static int child_unshare_wait_read(void *a) {
    char c;
    if (unshare(CLONE_FS)) _exit(5);
    if (write(up[1], "u", 1) != 1 || read(down[0], &c, 1) != 1) _exit(5);
    _exit(read_secret());
}

static int child_hold(void *a) {
    char c;
    _exit(read(hold[0], &c, 1) == 1 ? 0 : 5);
}

int main(int argc, char **argv) {
    const char *mode = argv[1];
    static char stack[3][65536];
    int status = 0;
    snprintf(x, sizeof x, "%s/x", argv[2]);
    snprintf(y, sizeof y, "%s/y", argv[2]);
    if (!strcmp(mode, "plain")) {
        if (chdir("x")) return 5;
        return read_secret();
    }
    if (!strcmp(mode, "clone-fs")) {
        /* The child's chdir moves the parent: it shares the fs_struct. */
        pid_t c = clone(child_to_x, stack[0] + 65536, CLONE_FS | SIGCHLD, 0);
        if (c < 0 || waitpid(c, &status, 0) < 0 || status) return 6;
        return read_secret();
    }
    if (chdir(x)) return 5;
    if (!strcmp(mode, "thread-unshare")) {
        pthread_t t;
        if (pthread_create(&t, 0, unshare_then_y, 0) || pthread_join(t, 0)) return 6;
    } else if (!strcmp(mode, "thread-without-fs")) {
        if (clone(thread_to_y, stack[0] + 65536,
                  CLONE_VM | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, 0) < 0) return 6;
        while (!done) usleep(1000);
        usleep(10000);
    } else if (!strcmp(mode, "child-unshare")) {
        pid_t c = clone(child_unshare_to_y, stack[0] + 65536, CLONE_FS | SIGCHLD, 0);
        if (c < 0 || waitpid(c, &status, 0) < 0 || status) return 6;
    } else if (!strcmp(mode, "peer-unshare")) {
        /* Three processes on one fs_struct; one leaves it, another moves
           the rest to y: the one that left reads from x. */
        char c;
        if (pipe(up) || pipe(down) || pipe(hold)) return 6;
        pid_t keep = clone(child_hold, stack[0] + 65536, CLONE_FS | SIGCHLD, 0);
        pid_t left = clone(child_unshare_wait_read, stack[1] + 65536, CLONE_FS | SIGCHLD, 0);
        if (keep < 0 || left < 0 || read(up[0], &c, 1) != 1) return 6;
        if (chdir(y) || write(down[1], "g", 1) != 1) return 6;
        if (waitpid(left, &status, 0) < 0) return 6;
        if (write(hold[1], "h", 1) != 1 || waitpid(keep, 0, 0) < 0) return 6;
        return WEXITSTATUS(status);
    } else {
        return 1;
    }
    return read_secret();
}
"#;

struct Run {
    root: Dir,
    refused: Value,
    code: Option<i32>,
    line: String,
}

/// `root` with `x/secret` (read-denied) and `y/secret` (readable); the
/// agent's one refused open and `verify`'s verdict.
fn run(mode: &str) -> Run {
    let (root, bin) = (Dir::new(), Dir::open_to_all());
    for dir in ["x", "y"] {
        std::fs::create_dir(root.join(dir)).unwrap();
        root.file(&format!("{dir}/secret"), "TOPSECRET\n");
    }
    let agent = compile(&bin, "agent", AGENT);
    let deny = root.join("x/secret");
    let argv = [agent.to_str().unwrap(), mode, root.path().to_str().unwrap()];
    let (records, code, line) = run_denying(&root, &deny, &argv);
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "open" && r["decision"] == "denied")
        .collect();
    assert_eq!(refused.len(), 1, "{mode}: {records:#?}");
    eprintln!("{mode}: {} ({line})", refused[0]["target"]);
    Run {
        refused: refused[0].clone(),
        root,
        code,
        line,
    }
}

/// The refused read names `x/secret`, or says its cwd is unverified.
fn never_another_file(r: &Run) {
    let t = &r.refused["target"];
    let secret = r.root.join("x/secret");
    assert_eq!(t["resolved_from"], "cwd", "{t}");
    assert!(
        t["path"].as_str() == secret.to_str() || t["cwd_unverified"] == true,
        "another file, vouched for: {t}"
    );
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
    if t["cwd_unverified"] == true {
        assert!(r.line.contains("agent's string alone"), "{}", r.line);
    }
}

#[test]
fn a_thread_that_unshares_its_cwd_does_not_move_the_main_threads() {
    if !usable("r25_thread_unshare") {
        return;
    }
    let r = run("thread-unshare");
    never_another_file(&r);
    // The second thread's chdir showed a process split: unverified.
    assert_eq!(r.refused["target"]["cwd_unverified"], true, "{}", r.refused);
}

#[test]
fn a_thread_cloned_without_clone_fs_does_not_move_the_main_threads() {
    if !usable("r25_thread_without_fs") {
        return;
    }
    let r = run("thread-without-fs");
    never_another_file(&r);
    assert_eq!(r.refused["target"]["cwd_unverified"], true, "{}", r.refused);
}

#[test]
fn a_clone_fs_child_that_unshares_moves_alone() {
    if !usable("r25_child_unshare") {
        return;
    }
    // The child was alone in its fs_struct when it moved: the parent's
    // model stays in x, and is still vouched for.
    let r = run("child-unshare");
    never_another_file(&r);
    let t = &r.refused["target"];
    assert_eq!(t["path"].as_str(), r.root.join("x/secret").to_str(), "{t}");
    assert!(t.get("cwd_unverified").is_none(), "{t}");
}

#[test]
fn a_clone_fs_peer_that_unshared_is_not_vouched_for_when_the_others_move() {
    if !usable("r25_peer_unshare") {
        return;
    }
    never_another_file(&run("peer-unshare"));
}

#[test]
fn a_single_threaded_cd_still_names_the_secret() {
    if !usable("r25_plain") {
        return;
    }
    let r = run("plain");
    let t = &r.refused["target"];
    assert_eq!(t["path"].as_str(), r.root.join("x/secret").to_str(), "{t}");
    assert_eq!(t["resolved_from"], "cwd", "{t}");
    assert!(t.get("cwd_unverified").is_none(), "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
}

#[test]
fn a_clone_fs_childs_chdir_still_moves_the_parent() {
    if !usable("r25_clone_fs") {
        return;
    }
    // Moved, but a peer's move is unverified: a count of users cannot
    // tell which peer still shares the fs_struct.
    let r = run("clone-fs");
    let t = &r.refused["target"];
    assert_eq!(t["path"].as_str(), r.root.join("x/secret").to_str(), "{t}");
    assert_eq!(r.code, Some(0), "verify: {}", r.line);
}
