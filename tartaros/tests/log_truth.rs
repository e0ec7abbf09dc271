//! Kernel-sourced paths (issue 13): the log names the file the kernel
//! changed, not the string the agent's memory held. Each test runs an
//! adversarial agent (C compiled here, or Python) under `tartaros run
//! --log` and checks the log against the tree seen from the host.
//! Needs root and gcc; skips with a reason otherwise (fails under CI=true).

mod common;

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::process::Command;

use common::lease::{HostLease, lease_waiter_is};
use common::logged::*;
use common::*;
use serde_json::Value;

/// Every `path`, `from` and `to` of allowed records (the kernel's names;
/// `claimed_*` are the agent's).
fn named_paths(records: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in records.iter().filter(|r| allowed(r)) {
        let kind = r["kind"].as_str().unwrap_or_default();
        if !matches!(
            kind,
            "create"
                | "write"
                | "unlink"
                | "rename"
                | "chmod"
                | "truncate"
                | "mkdir"
                | "rmdir"
                | "link"
                | "symlink"
                | "attrib"
                | "mknod"
        ) {
            continue;
        }
        for key in ["path", "from", "to"] {
            if let Some(p) = field(r, key) {
                out.push((kind.to_string(), p.to_string()));
            }
        }
    }
    out
}

const RACE: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each creator thread passes its own buffer to open(2) while a flipper
   thread of its own flips the first letter of the name between 'a' and
   'b'. */
struct creator {
    char buf[4096];
    size_t flip_at;
    int index, n, made;
    atomic_int done;
};

static void *flipper(void *arg) {
    struct creator *c = arg;
    while (!atomic_load(&c->done))
        ((volatile char *)c->buf)[c->flip_at] ^= 'a' ^ 'b';
    return NULL;
}

static void *create(void *arg) {
    struct creator *c = arg;
    for (int i = 0; i < c->n; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d_%05d", c->index, i);
        memcpy(c->buf + c->flip_at + 1, num, strlen(num));
        int fd = open(c->buf, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd >= 0) {
            c->made++;
            close(fd);
        }
    }
    atomic_store(&c->done, 1);
    return NULL;
}

int main(int argc, char **argv) {
    const char *dir = argv[1];
    int n = atoi(argv[2]), threads = atoi(argv[3]), made = 0;
    static struct creator cs[8];
    pthread_t ct[8], ft[8];
    for (int t = 0; t < threads; t++) {
        snprintf(cs[t].buf, sizeof cs[t].buf, "%s/a%d_00000", dir, t);
        cs[t].flip_at = strlen(dir) + 1;
        cs[t].index = t;
        cs[t].n = n / threads;
        pthread_create(&ft[t], NULL, flipper, &cs[t]);
        pthread_create(&ct[t], NULL, create, &cs[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(ct[t], NULL);
        pthread_join(ft[t], NULL);
        made += cs[t].made;
    }
    printf("made %d\n", made);
    return 0;
}
"#;

#[test]
fn racing_creates_are_logged_under_their_real_names() {
    if !usable("racing_creates") {
        return;
    }
    let (bin, root, logs) = (Dir::new(), Dir::new(), Dir::new());
    let exe = compile(&bin, "race", RACE);
    let dir = root.path().to_str().unwrap();
    // Two creating threads of one process, each with its own flipper.
    let n = 3000;
    let (out, records) = run_logged(
        &root,
        &logs,
        &[exe.to_str().unwrap(), dir, &n.to_string(), "2"],
    );
    assert!(
        stdout(&out).contains(&format!("made {n}")),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let on_disk: BTreeSet<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .collect();
    assert_eq!(on_disk.len(), n);
    let creates: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "create" && allowed(r))
        .collect();
    // Only the root's: the init's own setup (the nodes of the sandbox's
    // private /dev) is in the log too, truthfully, outside the root.
    let root_prefix = format!("{}/", root.path().display());
    let logged: BTreeSet<String> = creates
        .iter()
        .filter_map(|r| field(r, "path"))
        .filter(|p| p.starts_with(&root_prefix))
        .map(str::to_string)
        .collect();
    let never = logged.difference(&on_disk).take(5).collect::<Vec<_>>();
    assert!(
        never.is_empty(),
        "records name files that never existed: {never:?}"
    );
    // Nothing was deleted: a file any record names in the root exists.
    let prefix = format!("{dir}/");
    let phantom: Vec<&Value> = records
        .iter()
        .filter(|r| field(r, "path").is_some_and(|p| p.starts_with(&prefix)))
        .filter(|r| !on_disk.contains(field(r, "path").unwrap()))
        .take(5)
        .collect();
    assert!(
        phantom.is_empty(),
        "records name phantom files: {phantom:?}"
    );
    let missing = on_disk.difference(&logged).take(5).collect::<Vec<_>>();
    assert!(
        missing.is_empty(),
        "created files missing from the log: {missing:?}"
    );
    let in_root = creates
        .iter()
        .filter(|r| field(r, "path").is_some_and(|p| p.starts_with(&root_prefix)))
        .count();
    assert_eq!(in_root, n, "one create record per created file");
    assert!(
        creates
            .iter()
            .filter(|r| field(r, "path").is_some_and(|p| p.starts_with(&root_prefix)))
            .all(|r| field(r, "path_source") == Some("kernel")),
        "every create in the root is named by the kernel"
    );
    let claims = creates
        .iter()
        .filter(|r| field(r, "claimed_path").is_some())
        .count();
    eprintln!("{claims} of {n} creates had an agent string that disagreed with the kernel");
    let sealed: BTreeSet<String> = seal(&records)["files"]
        .as_array()
        .expect("seal files")
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(sealed, on_disk, "the seal lists every created file");
}

/// The agent: opens the target for writing, which the host's lease holds
/// blocked in the kernel, while a thread rewrites the path buffer to the
/// decoy.
const LEASE: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char buf[4096];
static const char *decoy;

static void *rewrite(void *arg) {
    (void)arg;
    usleep(150000);
    strcpy(buf, decoy);
    return NULL;
}

int main(int argc, char **argv) {
    const char *target = argv[1];
    decoy = argv[2];
    strcpy(buf, target);
    pthread_t t;
    pthread_create(&t, NULL, rewrite, NULL);
    int fd = open(buf, O_WRONLY | O_TRUNC);
    if (fd < 0) { perror("open"); return 3; }
    if (write(fd, "evil\n", 5) != 5) return 5;
    close(fd);
    pthread_join(t, NULL);
    printf("buffer now %s\n", buf);
    return 0;
}
"#;

#[test]
fn a_blocked_open_whose_path_is_rewritten_names_the_real_file() {
    if !usable("blocked_open") {
        return;
    }
    let (bin, root, logs) = (Dir::new(), Dir::new(), Dir::new());
    let exe = compile(&bin, "lease", LEASE);
    let hook = root.file(".git/hooks/pre-commit", "#!/bin/sh\n");
    let notes = root.file("src/notes.txt", "notes\n");
    chown_tree(root.path());
    // The lease is the host's, taken before the run starts: the sandbox
    // refuses F_SETLEASE.
    let lease = HostLease::take(&[&hook]);
    let argv = [
        exe.to_str().unwrap(),
        hook.to_str().unwrap(),
        notes.to_str().unwrap(),
    ];
    let ((out, records), blocked) = std::thread::scope(|s| {
        let run = s.spawn(|| run_logged(&root, &logs, &argv));
        // Seen from the host: the agent's open waits on the lease.
        let mut seen = false;
        eventually(30, || {
            seen = lease_waiter_is("lease");
            seen || run.is_finished()
        });
        (run.join().unwrap(), seen)
    });
    assert_eq!(lease.released(), 1, "the agent's open broke the lease");
    assert!(blocked, "the agent's open never waited on the host's lease");
    assert!(
        stdout(&out).contains("buffer now"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&hook).unwrap(), "evil\n");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "notes\n");
    let hook_s = hook.to_str().unwrap();
    let notes_s = notes.to_str().unwrap();
    let truncate = records
        .iter()
        .find(|r| r["kind"] == "truncate" && allowed(r))
        .unwrap_or_else(|| panic!("no truncate record: {records:#?}"));
    assert_eq!(field(truncate, "path"), Some(hook_s), "{truncate}");
    assert_eq!(field(truncate, "path_source"), Some("kernel"), "{truncate}");
    let write = records
        .iter()
        .find(|r| r["kind"] == "write" && field(r, "path") == Some(hook_s))
        .unwrap_or_else(|| panic!("no write record for the hook: {records:#?}"));
    assert_eq!(field(write, "path_source"), Some("kernel"));
    let wrong: Vec<_> = named_paths(&records)
        .into_iter()
        .filter(|(_, p)| p == notes_s)
        .collect();
    assert!(
        wrong.is_empty(),
        "records name the untouched decoy: {wrong:?}"
    );
}

const CWD: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static char stack[65536];

static int into_hooks(void *arg) {
    (void)arg;
    return chdir(".git/hooks") ? 1 : 0;
}

static void make(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) { perror(name); exit(1); }
    close(fd);
}

int main(int argc, char **argv) {
    const char *root = argv[1];
    /* A child sharing our fs_struct moves our cwd. */
    pid_t c = clone(into_hooks, stack + sizeof stack, CLONE_FS | SIGCHLD, NULL);
    if (c < 0 || waitpid(c, NULL, 0) < 0) return 2;
    make(AT_FDCWD, "clone_fs");
    if (chdir(root)) return 3;
    /* fchdir to a descriptor closed right after. */
    int d = open(".git/hooks", O_DIRECTORY | O_RDONLY);
    if (d < 0 || fchdir(d)) return 4;
    close(d);
    make(AT_FDCWD, "fchdir");
    if (chdir(root)) return 5;
    /* A dirfd replaced by dup2, and replaced again before anyone looks. */
    int src = open("src", O_DIRECTORY | O_RDONLY);
    int hooks = open(".git/hooks", O_DIRECTORY | O_RDONLY);
    if (src < 0 || hooks < 0 || dup2(hooks, src) < 0) return 6;
    make(src, "dup2");
    int again = open("src", O_DIRECTORY | O_RDONLY);
    dup2(again, src);
    /* chdir through a symlink and .. (the physical parent, not the lexical one). */
    if (chdir("link/..")) return 7;
    make(AT_FDCWD, "dotdot");
    printf("done\n");
    return 0;
}
"#;

#[test]
fn files_made_after_cwd_and_dirfd_tricks_are_logged_where_they_are() {
    if !usable("cwd_tricks") {
        return;
    }
    let (bin, root, logs) = (Dir::new(), Dir::new(), Dir::new());
    let exe = compile(&bin, "cwd", CWD);
    root.file(".git/hooks/sub/keep", "");
    root.file("src/keep", "");
    chown_tree(root.path());
    let link = root.join("link");
    std::os::unix::fs::symlink(".git/hooks/sub", &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    let dir = root.path().to_str().unwrap();
    let (out, records) = run_logged(&root, &logs, &[exe.to_str().unwrap(), dir]);
    assert!(
        stdout(&out).contains("done"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let named = named_paths(&records);
    for name in ["clone_fs", "fchdir", "dup2", "dotdot"] {
        let real = root.join(&format!(".git/hooks/{name}"));
        assert!(real.exists(), "{name} was not made in .git/hooks");
        let real = real.to_str().unwrap();
        let create = records
            .iter()
            .find(|r| r["kind"] == "create" && allowed(r) && field(r, "path") == Some(real))
            .unwrap_or_else(|| panic!("no create record names {real}: {named:#?}"));
        assert_eq!(field(create, "path_source"), Some("kernel"), "{create}");
        let elsewhere: Vec<_> = named
            .iter()
            .filter(|(_, p)| p.ends_with(&format!("/{name}")) && p != real)
            .collect();
        assert!(
            elsewhere.is_empty(),
            "{name} logged elsewhere: {elsewhere:?}"
        );
    }
}

#[test]
fn a_write_through_proc_self_fd_logs_the_real_file() {
    if !usable("proc_self_fd") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let real = root.join("real.txt");
    let code = format!(
        "import os\n\
         fd = os.open('{r}', os.O_CREAT | os.O_WRONLY, 0o644)\n\
         again = os.open('/proc/self/fd/%d' % fd, os.O_WRONLY)\n\
         for _ in range(50):\n    os.write(again, b'x' * 100)\n\
         os.close(again)\n\
         os.close(fd)\n",
        r = real.display()
    );
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    assert_eq!(std::fs::metadata(&real).unwrap().len(), 5000);
    let real_s = real.to_str().unwrap();
    let writes: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "write" && allowed(r))
        .collect();
    assert_eq!(
        writes.len(),
        1,
        "one write record for the file: {writes:#?}"
    );
    let w = writes[0];
    assert_eq!(field(w, "path"), Some(real_s), "{w}");
    assert_eq!(field(w, "path_source"), Some("kernel"));
    let count = w["target"]["count"].as_u64().unwrap();
    assert!((1..=50).contains(&count), "{w}");
    assert_eq!(w["target"]["size"], 5000, "{w}");
    assert!(
        !named_paths(&records)
            .iter()
            .any(|(k, p)| k != "open" && p.starts_with("/proc/")),
        "no change is named by a /proc alias"
    );
}

#[test]
fn writes_through_an_inherited_descriptor_name_the_file() {
    if !usable("inherited_fd") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let out_file = root.file("out.txt", "");
    let log = logs.join("effects.jsonl");
    // stdout is a file in the root that the launcher opened: the agent
    // makes no open(2) for it, only write(2) calls.
    let status = Command::new(bin())
        .args([
            "run",
            "--write",
            root.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "for i in 1 2 3; do echo line$i; done",
        ])
        .current_dir(root.path())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .status()
        .expect("run tartaros");
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        "line1\nline2\nline3\n"
    );
    let records: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let out_s = out_file.to_str().unwrap();
    let w = records
        .iter()
        .find(|r| r["kind"] == "write" && field(r, "path") == Some(out_s))
        .unwrap_or_else(|| panic!("no write record for the inherited stdout: {records:#?}"));
    assert_eq!(field(w, "path_source"), Some("kernel"));
    assert_eq!(w["target"]["size"], 18);
    let sealed = seal(&records)["files"].as_array().unwrap().clone();
    assert_eq!(sealed.len(), 1, "{sealed:?}");
    assert_eq!(sealed[0]["path"], out_s);
    assert_eq!(sealed[0]["sha256"], sha256_hex(b"line1\nline2\nline3\n"));
}

#[test]
fn the_seal_lists_what_changed_with_hashes_and_bounds_the_cost() {
    if !usable("seal_files") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let kept = root.file("kept.txt", "old\n");
    let untouched = root.file("untouched.txt", "same\n");
    let r = root.path().display();
    let big = tartaros::fswatch::MAX_FILE_BYTES + 1;
    let code = format!(
        "import os\n\
         open('{r}/kept.txt', 'a').write('new\\n')\n\
         open('{r}/gone.txt', 'w').write('bye')\n\
         os.unlink('{r}/gone.txt')\n\
         os.mkdir('{r}/d')\n\
         open('{r}/d/f', 'w').write('f')\n\
         os.rename('{r}/d', '{r}/e')\n\
         with open('{r}/big.bin', 'wb') as f:\n    f.truncate({big})\n\
         os.symlink('/etc/passwd', '{r}/link')\n"
    );
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    let files = seal(&records)["files"].as_array().expect("files").clone();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    let want = [
        format!("{r}/big.bin"),
        format!("{r}/e/f"),
        kept.display().to_string(),
    ];
    assert_eq!(paths, want.iter().map(String::as_str).collect::<Vec<_>>());
    let kept_entry = &files[2];
    assert_eq!(kept_entry["size"], 8);
    assert_eq!(
        kept_entry["sha256"],
        sha256_hex(&std::fs::read(&kept).unwrap()),
        "the hash is the file's"
    );
    assert_eq!(files[0]["sha256"], Value::Null);
    assert_eq!(files[0]["skipped"], "too large");
    let log = logs.join("effects.jsonl");
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    assert!(
        stdout(&verify).contains("the seal has no hash for 1 changed files"),
        "verify says which files the tree check cannot cover: {}",
        stdout(&verify)
    );
    assert_eq!(files[0]["size"], big);
    assert!(!paths.contains(&untouched.to_str().unwrap()));
}

#[test]
fn files_whose_names_are_not_utf8_stay_distinct_in_the_seal() {
    if !usable("seal_non_utf8") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let r = root.path().display();
    let code = format!(
        "import os\n\
         for name, data in ((b'\\xff', b'one'), (b'\\xfe', b'two')):\n    \
         fd = os.open(b'{r}/' + name, os.O_CREAT | os.O_WRONLY, 0o644)\n    \
         os.write(fd, data)\n    \
         os.close(fd)\n"
    );
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    let files = seal(&records)["files"].as_array().expect("files").clone();
    let shown: Vec<(&str, &str)> = files
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["sha256"].as_str().unwrap()))
        .collect();
    let fe = format!("{r}/\\xfe");
    let ff = format!("{r}/\\xff");
    assert_eq!(
        shown,
        vec![
            (fe.as_str(), sha256_hex(b"two").as_str()),
            (ff.as_str(), sha256_hex(b"one").as_str()),
        ]
    );
}

/// Changes through shared mappings send no notification, so the seal
/// learns of them from the opens: it must follow a file that
/// `RENAME_EXCHANGE` moves (two renames, `a` to `b` and `b` to `a`), and
/// open a file whose name is not UTF-8 by its own bytes.
#[test]
fn mapped_changes_are_sealed_after_an_exchange_and_under_odd_names() {
    if !usable("seal_exchange_odd") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    root.file("a", "clean a\n");
    root.file("b", "clean b\n");
    root.file("d/f", "clean f\n");
    root.file("e/f", "clean g\n");
    let odd = root.path().join(std::ffi::OsStr::from_bytes(b"odd\xff"));
    std::fs::write(&odd, "clean o\n").unwrap();
    chown(&odd, NOBODY);
    // A UTF-8 name that spells the escape of the other one.
    let spelled = root.file("odd\\xff", "clean u\n");
    chown(&spelled, NOBODY);
    let r = root.path().display();
    let code = format!(
        "import ctypes, mmap, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def change(path):\n    \
         fd = os.open(path, os.O_RDWR)\n    \
         with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:\n        \
         m[:4] = b'EVIL'\n    \
         os.close(fd)\n\
         def exchange(x, y):\n    \
         if libc.renameat2(-100, x, -100, y, 2) != 0:\n        \
         raise OSError(ctypes.get_errno(), 'renameat2')\n\
         change(b'{r}/a')\n\
         exchange(b'{r}/a', b'{r}/b')\n\
         change(b'{r}/d/f')\n\
         exchange(b'{r}/d', b'{r}/e')\n\
         change(b'{r}/odd\\xff')\n\
         fd = os.open(b'{r}/odd\\\\xff', os.O_WRONLY | os.O_TRUNC)\n\
         os.write(fd, b'plain u\\n')\n\
         os.close(fd)\n"
    );
    let (out, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sealed: Vec<(String, String)> = seal(&records)["files"]
        .as_array()
        .expect("seal files")
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let has = |name: &str, content: &[u8]| {
        let want = (format!("{r}/{name}"), sha256_hex(content));
        assert!(
            sealed.contains(&want),
            "{want:?} not in the seal: {sealed:#?}"
        );
    };
    has("b", b"EVILn a\n");
    has("e/f", b"EVILn f\n");
    has("odd\\xff", b"EVILn o\n");
    has("odd\\\\xff", b"plain u\n");
    // The written file is named as itself, with its size; the mapped one
    // has no write record (a mapping makes no modify notification).
    let writes: Vec<&Value> = records.iter().filter(|r| r["kind"] == "write").collect();
    let spelled = format!("{r}/odd\\\\xff");
    assert!(
        writes
            .iter()
            .any(|w| field(w, "path") == Some(spelled.as_str()) && w["target"]["size"] == 8),
        "{writes:#?}"
    );
    let odd = format!("{r}/odd\\xff");
    assert!(
        !writes
            .iter()
            .any(|w| field(w, "path") == Some(odd.as_str())),
        "{writes:#?}"
    );
    assert_eq!(std::fs::read(root.join("b")).unwrap(), b"EVILn a\n");
    // Each exchange is one record, named by the kernel: its second rename
    // notification is not an effect the capture missed.
    let renames: Vec<&Value> = records.iter().filter(|r| r["kind"] == "rename").collect();
    assert_eq!(renames.len(), 2, "{renames:#?}");
    assert!(
        renames
            .iter()
            .all(|r| field(r, "path_source") == Some("kernel")
                && r["target"]["uncaptured"].is_null()),
        "{renames:#?}"
    );
}

#[test]
fn changes_capture_does_not_see_are_still_logged_by_the_kernel() {
    if !usable("uncaptured") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let target = root.file("stamp", "s");
    let r = root.path().display();
    let code = format!(
        "import os, stat\n\
         os.mknod('{r}/node', stat.S_IFREG | 0o600)\n\
         os.utime('{r}/stamp', (0, 0))\n"
    );
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    let node = format!("{r}/node");
    let made = records
        .iter()
        .find(|r| allowed(r) && field(r, "path") == Some(node.as_str()))
        .unwrap_or_else(|| panic!("no record for the mknod: {records:#?}"));
    assert!(
        matches!(made["kind"].as_str(), Some("create" | "mknod")),
        "{made}"
    );
    assert_eq!(field(made, "path_source"), Some("kernel"));
    let stamp = target.to_str().unwrap();
    let touched = records
        .iter()
        .find(|r| allowed(r) && field(r, "path") == Some(stamp) && r["kind"] != "open")
        .unwrap_or_else(|| panic!("no record for the utime: {records:#?}"));
    assert_eq!(field(touched, "path_source"), Some("kernel"), "{touched}");
}

const MAPPED_RACE: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Each opener thread opens existing files for writing through a buffer
   whose first letter a flipper thread flips between 'a' and 'b', then
   changes the file through a shared mapping: no write(2), so no modify
   notification. Both names exist, so every open succeeds and opens one
   of the two twins: a log that names an open from the buffer names the
   twin the kernel did not open. */
struct opener {
    char buf[4096];
    size_t flip_at;
    int index, n, done_files;
    atomic_int done;
};

static void *flipper(void *arg) {
    struct opener *o = arg;
    while (!atomic_load(&o->done))
        ((volatile char *)o->buf)[o->flip_at] ^= 'a' ^ 'b';
    return NULL;
}

static void *opener(void *arg) {
    struct opener *o = arg;
    for (int i = 0; i < o->n; i++) {
        char num[16];
        snprintf(num, sizeof num, "%d_%05d", o->index, i);
        memcpy(o->buf + o->flip_at + 1, num, strlen(num));
        int fd = open(o->buf, O_RDWR);
        if (fd < 0) continue;
        char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) continue;
        memcpy(p, "EVIL", 4);
        munmap(p, 4096);
        o->done_files++;
    }
    atomic_store(&o->done, 1);
    return NULL;
}

int main(int argc, char **argv) {
    const char *dir = argv[1];
    int n = atoi(argv[2]), threads = atoi(argv[3]), changed = 0;
    static struct opener os[8];
    pthread_t ot[8], ft[8];
    for (int t = 0; t < threads; t++) {
        snprintf(os[t].buf, sizeof os[t].buf, "%s/a%d_00000", dir, t);
        os[t].flip_at = strlen(dir) + 1;
        os[t].index = t;
        os[t].n = n / threads;
        pthread_create(&ft[t], NULL, flipper, &os[t]);
        pthread_create(&ot[t], NULL, opener, &os[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(ot[t], NULL);
        pthread_join(ft[t], NULL);
        changed += os[t].done_files;
    }
    printf("changed %d\n", changed);
    return 0;
}
"#;

#[test]
fn racing_write_opens_and_mapped_changes_name_the_real_files() {
    if !usable("racing_write_opens") {
        return;
    }
    let (bin, root, logs) = (Dir::new(), Dir::new(), Dir::new());
    let exe = compile(&bin, "mapped", MAPPED_RACE);
    let dir = root.path().to_str().unwrap();
    let (n, threads) = (1000, 2);
    let mut files = BTreeSet::new();
    for t in 0..threads {
        for i in 0..n / threads {
            for twin in ["a", "b"] {
                let f = root.file(&format!("{twin}{t}_{i:05}"), "clean data\n");
                files.insert(f.to_string_lossy().into_owned());
            }
        }
    }
    let existed = files.clone();
    let (out, records) = run_logged(
        &root,
        &logs,
        &[
            exe.to_str().unwrap(),
            dir,
            &n.to_string(),
            &threads.to_string(),
        ],
    );
    // Every open finds one twin; the files changed are the ones the host
    // sees changed, one of each pair.
    let changed: usize = stdout(&out)
        .split_whitespace()
        .skip_while(|w| *w != "changed")
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{}{}", stdout(&out), stderr(&out)));
    assert_eq!(changed, n, "{}{}", stdout(&out), stderr(&out));
    files.retain(|f| std::fs::read_to_string(f).unwrap() == "EVILn data\n");
    assert_eq!(files.len(), changed);
    let prefix = format!("{dir}/");
    let opens: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "open" && allowed(r))
        .filter(|r| field(r, "path").is_some_and(|p| p.starts_with(&prefix)))
        .collect();
    let named: BTreeSet<String> = opens
        .iter()
        .map(|r| field(r, "path").unwrap().to_string())
        .collect();
    let never: Vec<_> = named.difference(&existed).take(5).collect();
    assert!(
        never.is_empty(),
        "opens name files that never existed: {never:?}"
    );
    let twins: Vec<_> = named.difference(&files).take(5).collect();
    assert!(
        twins.is_empty(),
        "opens name the twin the kernel did not open: {twins:?}"
    );
    assert_eq!(named, files, "every file opened is in the log by its name");
    assert_eq!(opens.len(), changed, "one open record per successful open");
    assert!(
        opens
            .iter()
            .all(|r| field(r, "path_source") == Some("kernel")),
        "every open is named by the kernel"
    );
    let claims = opens
        .iter()
        .filter(|r| field(r, "claimed_path").is_some())
        .count();
    eprintln!("{claims} of {n} write-opens had an agent string that disagreed with the kernel");
    // No write(2) happened: the seal's hashes are what shows the change.
    let evil = sha256_hex(b"EVILn data\n");
    let sealed: BTreeSet<String> = seal(&records)["files"]
        .as_array()
        .expect("seal files")
        .iter()
        .inspect(|f| assert_eq!(f["sha256"], evil.as_str(), "{f}"))
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sealed, files,
        "the seal lists every file changed through a mapping"
    );
}

#[test]
fn a_directory_swapped_for_a_link_puts_no_host_file_in_the_log() {
    if !usable("swapped_dir") {
        return;
    }
    let (root, logs, host) = (Dir::new(), Dir::new(), Dir::new());
    // A host file the agent may not read, of a size and hash of its own.
    let secret = host.join("secret");
    std::fs::write(&secret, "host secret, 27 bytes long\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let r = root.path().display();
    let h = host.path().display();
    // The shell's own write of d/secret is counted until it exits; by then
    // d has moved and a link to the host directory stands in its place.
    let script = format!(
        "mkdir {r}/d && echo x > {r}/d/secret && mkdir {r}/e && echo y > {r}/e/secret && \
         rm {r}/e/secret && rmdir {r}/e && ln -s {h} {r}/e && mv {r}/d {r}/d2 && ln -s {h} {r}/d"
    );
    let (out, records) = run_logged(&root, &logs, &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(logs.join("effects.jsonl")).unwrap();
    let digest = sha256_hex(&std::fs::read(&secret).unwrap());
    assert!(
        !text.contains(&digest),
        "the host file's hash is in the log"
    );
    let files = seal(&records)["files"].as_array().unwrap().clone();
    let listed: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(listed, [format!("{r}/d2/secret")], "{files:?}");
    for w in records.iter().filter(|r| r["kind"] == "write") {
        assert_ne!(
            w["target"]["size"], 27,
            "a write record has the host file's size: {w}"
        );
    }
}

#[test]
fn an_exec_records_the_binary_the_kernel_ran() {
    if !usable("exec_binary") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let r = root.path().display();
    // A harmless-looking name for another program, and a program with no
    // name at all (a memfd run through /proc/self/fd).
    let code = format!(
        "import os\n\
         os.symlink('/usr/bin/true', '{r}/run-tests')\n\
         os.system('{r}/run-tests')\n\
         fd = os.memfd_create('payload')\n\
         os.write(fd, open('/usr/bin/true', 'rb').read())\n\
         os.execve(fd, ['payload'], {{}})\n"
    );
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", &code]);
    let execs: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "exec" && allowed(r))
        .collect();
    let link = format!("{r}/run-tests");
    let linked = execs
        .iter()
        .find(|e| field(e, "path") == Some(link.as_str()))
        .unwrap_or_else(|| panic!("no exec of the link: {execs:#?}"));
    let real = std::fs::canonicalize("/usr/bin/true").unwrap();
    assert_eq!(field(linked, "binary"), real.to_str(), "{linked}");
    let memfd = execs
        .iter()
        .find(|e| e["target"]["argv"][0] == "payload")
        .unwrap_or_else(|| panic!("no exec of the memfd: {execs:#?}"));
    assert_eq!(memfd["target"]["binary_deleted"], true, "{memfd}");
    assert_eq!(
        field(memfd, "binary_tail"),
        Some("memfd:payload"),
        "{memfd}"
    );
    assert_eq!(field(memfd, "binary"), None, "{memfd}");
}

/// Gives every directory below `dir` to the agent's uid.
fn chown_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            chown(&path, NOBODY);
            chown_tree(&path);
        }
    }
}
