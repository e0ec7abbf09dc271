//! Calls that name their file by a descriptor only (`fsetxattr`,
//! `fremovexattr`, `setxattrat` / `removexattrat` with `AT_EMPTY_PATH`,
//! `futimens`, `futimesat(fd, NULL)`) are logged under the file the kernel
//! had behind the descriptor, not under what `/proc/<pid>/fd/<fd>` shows
//! when the record is read: by then the agent may have put another file at
//! that number, or exited. With the fd table shared by another thread, the
//! record does not assert a name at all (`path_unverified`), and the
//! kernel's file notification names what changed. Needs root and gcc.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

/// Each call on a descriptor of its own file, then the number reused for
/// `decoy`; mode `exit` leaves at once (nothing in /proc to look at), mode
/// `stay` lives on with the decoy at the number (what /proc would say).
const SWAP: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

struct xattr_args { uint64_t value; uint32_t size; uint32_t flags; };
static const char *dir;
static int fd_no = -1;

static int open_at_number(const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_RDONLY);
    if (fd < 0) { perror(p); exit(2); }
    if (fd_no < 0) fd_no = fd;
    if (fd != fd_no) { fprintf(stderr, "fd %d, not %d\n", fd, fd_no); exit(2); }
    return fd;
}

static void check(int rc, const char *what) {
    if (rc != 0) { perror(what); exit(3); }
}

static void calls(const char *tag) {
    char name[64];
    struct xattr_args a = { (uint64_t)(uintptr_t)"1", 1, 0 };
    int fd;
#define FILE_OF(call) (snprintf(name, sizeof name, "%s-%s", tag, call), name)
    fd = open_at_number(FILE_OF("fsetxattr"));
    check(fsetxattr(fd, "user.x", "1", 1, 0), "fsetxattr");
    close(fd);
    fd = open_at_number(FILE_OF("fremovexattr"));
    check(fremovexattr(fd, "user.y"), "fremovexattr");
    close(fd);
    fd = open_at_number(FILE_OF("setxattrat"));
    check((int)syscall(463, fd, "", AT_EMPTY_PATH, "user.x", &a, sizeof a), "setxattrat");
    close(fd);
    fd = open_at_number(FILE_OF("removexattrat"));
    check((int)syscall(466, fd, "", AT_EMPTY_PATH, "user.y"), "removexattrat");
    close(fd);
    fd = open_at_number(FILE_OF("futimens"));
    check(futimens(fd, NULL), "futimens");
    close(fd);
    fd = open_at_number(FILE_OF("futimesat"));
    check((int)syscall(SYS_futimesat, fd, NULL, NULL), "futimesat");
    close(fd);
    fd = open_at_number(FILE_OF("utimensat"));
    check(utimensat(fd, "", NULL, AT_EMPTY_PATH), "utimensat");
    close(fd);
    open_at_number("decoy");
}

int main(int argc, char **argv) {
    dir = argv[1];
    calls(argv[2]);
    if (strcmp(argv[2], "stay") == 0) sleep(1);
    printf("done %s\n", argv[2]);
    fflush(stdout);
    _exit(0);
}
"#;

/// The calls of [`SWAP`], by the name part of their file and kind.
const CALLS: [(&str, &str); 7] = [
    ("fsetxattr", "xattr"),
    ("fremovexattr", "xattr"),
    ("setxattrat", "xattr"),
    ("removexattrat", "xattr"),
    ("futimens", "utime"),
    ("futimesat", "utime"),
    ("utimensat", "utime"),
];

/// One thread sets an attribute on fd N in a loop while another `dup2`s
/// `target` and `locked` (root's: the call fails there) onto N.
const RACE: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/xattr.h>
#include <unistd.h>

#define N 40
static atomic_int stop, swaps;
static int a, b;

static void *swapper(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        dup2(a, N);
        dup2(b, N);
        atomic_fetch_add(&swaps, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    char p[4096];
    snprintf(p, sizeof p, "%s/target", argv[1]);
    a = open(p, O_RDONLY);
    snprintf(p, sizeof p, "%s/locked", argv[1]);
    b = open(p, O_RDONLY);
    if (a < 0 || b < 0 || dup2(a, N) != N) { perror("open"); return 2; }
    pthread_t t;
    pthread_create(&t, NULL, swapper, NULL);
    while (atomic_load(&swaps) < 10) usleep(100);
    /* Until both files were hit often enough, within a bound that keeps
       the records well below what the ring holds between two drains. */
    int ok = 0, failed = 0, calls = 0;
    while (calls < 20000 && (ok < 300 || failed < 300)) {
        if (fsetxattr(N, "user.race", "1", 1, 0) == 0) ok++; else failed++;
        calls++;
        if (calls % 200 == 0) usleep(1000);
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("race %d %d %d\n", calls, ok, failed);
    return 0;
}
"#;

/// Files for [`SWAP`] with `tag`, each with `user.y` to remove.
fn prepare(work: &Dir, tag: &str) {
    for (call, _) in CALLS {
        let f = work.file(&format!("{tag}-{call}"), "x");
        xattr::set(&f, "user.y", b"1");
    }
}

mod xattr {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    pub fn set(path: &Path, name: &str, value: &[u8]) {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        // SAFETY: valid C strings and a buffer of `value.len()` bytes.
        let rc = unsafe {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(
            rc,
            0,
            "setxattr {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }

    pub fn has(path: &Path, name: &str) -> bool {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        // SAFETY: valid C strings; a NULL buffer of size 0 asks the size.
        unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
    }
}

/// Every record of `kind` in `log` that names `file` anywhere
/// (`path`, `claimed_path`, `fd_path_at_exit`).
fn naming<'a>(log: &'a [Value], file: &Path) -> Vec<&'a Value> {
    let p = file.to_str().unwrap();
    log.iter()
        .filter(|r| {
            ["path", "claimed_path", "fd_path_at_exit"]
                .iter()
                .any(|k| r["target"][*k] == p)
        })
        .collect()
}

#[test]
fn descriptor_calls_name_the_file_the_kernel_had() {
    if !usable("log_fd_swap") {
        return;
    }
    let work = Dir::new();
    let bin = Dir::new();
    let exe = compile(&bin, "swap", SWAP);
    for tag in ["exit", "stay"] {
        prepare(&work, tag);
    }
    work.file("decoy", "d");
    let logs = Dir::new();
    let w = work.path().to_str().unwrap();
    let exe = exe.to_str().unwrap();
    let script = format!("{exe} {w} exit && {exe} {w} stay");
    let (out, log) = run_logged(&work, &logs, &["sh", "-c", &script]);
    eprintln!("{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("done exit") && stdout(&out).contains("done stay"));

    let decoy = work.join("decoy");
    let wrong = naming(&log, &decoy);
    let mut failures = Vec::new();
    for tag in ["exit", "stay"] {
        for (call, kind) in CALLS {
            let file = work.join(&format!("{tag}-{call}"));
            let meta = std::fs::metadata(&file).expect("stat");
            let p = file.to_str().unwrap();
            let found = log
                .iter()
                .find(|r| r["kind"] == kind && r["target"]["path"] == p);
            let ok = found.is_some_and(|r| {
                let t = &r["target"];
                allowed(r)
                    && t["path_source"] == "kernel"
                    && t["ino"].as_u64() == Some(meta.ino())
                    && t["dev"].as_u64() == Some(meta.dev())
                    && t.get("path_unverified").is_none()
                    && t.get("claimed_path").is_none()
            });
            if !ok {
                failures.push(format!("{tag}-{call}: {found:?}"));
            }
        }
    }
    let calls: Vec<&Value> = log
        .iter()
        .filter(|r| matches!(r["kind"].as_str(), Some("xattr" | "utime")))
        .collect();
    assert!(
        failures.is_empty() && wrong.is_empty(),
        "{} of 14 calls not named by the kernel's file, {} records name the decoy:\n{}\nall: {calls:#?}",
        failures.len(),
        wrong.len(),
        failures.join("\n")
    );
    let names: Vec<&str> = calls
        .iter()
        .filter(|r| r["kind"] == "xattr")
        .filter_map(|r| r["target"]["name"].as_str())
        .collect();
    assert!(
        names.iter().filter(|n| **n == "user.x").count() >= 4,
        "{names:?}"
    );
    assert!(
        names.iter().filter(|n| **n == "user.y").count() >= 4,
        "{names:?}"
    );
}

#[test]
fn a_descriptor_swapped_by_another_thread_is_never_asserted() {
    if !usable("log_fd_swap") {
        return;
    }
    let work = Dir::new();
    let bin = Dir::new();
    let exe = compile(&bin, "race", RACE);
    let target = work.file("target", "t");
    // Root's, read-only to the agent: setting an attribute there fails.
    let locked = work.join("locked");
    std::fs::write(&locked, "l").expect("write");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let logs = Dir::new();
    let (out, log, code, line) = run_logged_verdict(
        &work,
        &logs,
        &[exe.to_str().unwrap(), work.path().to_str().unwrap()],
    );
    // The refused calls name no file the kernel vouches for (session 15):
    // the log says so instead of `ok`.
    assert_eq!(code, Some(3), "verify: {line}");
    assert!(line.contains("shared descriptor"), "{line}");
    let said = stdout(&out);
    eprintln!("{said}\n{}", stderr(&out));
    let counts: Vec<usize> = said
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(counts.len(), 3, "{said}");
    assert!(
        counts[1] > 0 && counts[2] > 0,
        "the race did not happen: {said}"
    );
    assert!(xattr::has(&target, "user.race") && !xattr::has(&locked, "user.race"));

    let xattrs: Vec<&Value> = log.iter().filter(|r| r["kind"] == "xattr").collect();
    assert_eq!(xattrs.len(), counts[0], "one record per call");
    let denied = xattrs.iter().filter(|r| !allowed(r)).count();
    assert_eq!(denied, counts[2], "the kernel's verdicts");
    let (t, l) = (target.to_str().unwrap(), locked.to_str().unwrap());
    let mut asserted = Vec::new();
    for r in &xattrs {
        let x = &r["target"];
        // What the record may say: the file at the number at exit, marked
        // as unverified; never a path of its own.
        let unverified = x["path_unverified"] == true && x["fd_shared"] == true;
        if !unverified || x.get("path").is_some() {
            asserted.push(*r);
        }
        if let Some(at_exit) = x["fd_path_at_exit"].as_str() {
            assert!(at_exit == t || at_exit == l, "{r}");
        }
    }
    assert!(
        asserted.is_empty(),
        "{} of {} records assert a path: {:#?}",
        asserted.len(),
        xattrs.len(),
        &asserted[..asserted.len().min(5)]
    );
    // What changed is named by the kernel; the locked file never is.
    let kernel_named = |p: &str| {
        log.iter().any(|r| {
            allowed(r) && r["target"]["path"] == p && r["target"]["path_source"] == "kernel"
        })
    };
    assert!(kernel_named(t), "the target's change is not in the log");
    assert!(!kernel_named(l), "a change of the locked file is logged");
    let wrong: Vec<&Value> = log
        .iter()
        .filter(|r| allowed(r) && r["target"]["path"] == l)
        .collect();
    assert!(
        wrong.is_empty(),
        "allowed records name the locked file: {wrong:#?}"
    );
}
