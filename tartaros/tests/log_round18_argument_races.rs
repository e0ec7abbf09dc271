//! Adversarial round 18 on the log: arguments that are not paths. The
//! capture read a `bind`'s socket name, a symlink's contents, an
//! `FS_IOC_SETFLAGS` value and an xattr's name from the agent's memory
//! when the call started; the kernel copies them a moment later. A second
//! thread, or another process writing a `MAP_SHARED` page, flipped them in
//! between, and the records said what the call did not do while `verify`
//! said `ok`. Abstract binds also took later binds' create notifications,
//! so that socket files the kernel made were in no record.
//!
//! The agent races each argument (a thread for all; a forked process
//! sharing one page for the symlinks, xattrs and flags, the caller then
//! having memory and descriptors of its own), and the host checks every
//! record that presents a value as true against the tree: the link's
//! contents, the file's flags, the attributes it holds, the socket files
//! that exist (each must be named by a record). Needs root and gcc.

mod common;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

/// `race N OUTSIDE`: binds (every fourth after an abstract one), symlinks
/// and xattrs while a thread flips their arguments; a refused bind of OUTSIDE while the thread lives; then
/// symlinks, xattrs and inode flags while a forked process flips them in
/// a shared page.
const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
struct page { char tgt[64]; char xname[64]; int fl; };
struct xattr_args { unsigned long long value; unsigned int size; unsigned int flags; };
static struct page th = { "/AAAAAAAA", "user.AAAAAAAA", FS_NODUMP_FL };
static struct sockaddr_un sa;
/* 1 until the thread must stop. */
static volatile int stop_not = 1;
static void flip(volatile struct page *p, volatile char *sock, volatile int *run) {
    while (*run) {
        if (sock) sock[0] = 'B';
        p->tgt[1] = 'B'; p->xname[5] = 'B'; p->fl = FS_NOATIME_FL;
        if (sock) sock[0] = 'A';
        p->tgt[1] = 'A'; p->xname[5] = 'A'; p->fl = FS_NODUMP_FL;
    }
}
static void *flipper(void *a) {
    (void)a;
    flip(&th, sa.sun_path, (volatile int *)&stop_not);
    return 0;
}
"#;

/// The agent's `main`.
const AGENT_MAIN: &str = r#"
/* An abstract name makes no file. */
static void abstract(int i) {
    struct sockaddr_un ab = { AF_UNIX };
    snprintf(ab.sun_path + 1, sizeof ab.sun_path - 1, "r18-%d-%d", getpid(), i);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    bind(s, (struct sockaddr *)&ab, sizeof ab);
    close(s);
}
static void touch(const char *p) { close(open(p, O_CREAT | O_WRONLY, 0644)); }
static void setattr(const char *p, const char *name, int i) {
    struct xattr_args xa = { (unsigned long long)(unsigned long)"v", 1, 0 };
    if (i & 1) syscall(463, AT_FDCWD, p, 0, name, &xa, sizeof xa);
    else setxattr(p, name, "v", 1, 0);
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    char p[64];
    sa.sun_family = AF_UNIX;
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "y%05d", i); touch(p);
        snprintf(p, sizeof p, "x%05d", i); touch(p);
        snprintf(p, sizeof p, "f%05d", i); touch(p);
    }
    sa.sun_path[0] = 'A';
    pthread_t t;
    pthread_create(&t, 0, flipper, 0);
    for (int i = 0; i < n; i++) {
        char tail[16];
        snprintf(tail, sizeof tail, "%05d", i);
        memcpy(sa.sun_path + 1, tail, 6);
        if (i % 4 == 0) abstract(i);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        bind(s, (struct sockaddr *)&sa, sizeof sa);
        close(s);
    }
    struct sockaddr_un out = { AF_UNIX };
    strncpy(out.sun_path, argv[2], sizeof out.sun_path - 1);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(s, (struct sockaddr *)&out, sizeof out) == 0) printf("OUTSIDE BOUND\n");
    close(s);
    for (int i = 0; i < n; i++) { snprintf(p, sizeof p, "t%05d", i); symlink(th.tgt, p); }
    for (int i = 0; i < n; i++) { snprintf(p, sizeof p, "y%05d", i); setattr(p, th.xname, i); }
    stop_not = 0;
    pthread_join(t, 0);
    struct page *pg = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *pg = th;
    volatile int *run = (volatile int *)(pg + 1);
    *run = 1;
    pid_t c = fork();
    if (c == 0) { flip(pg, 0, run); _exit(0); }
    usleep(20000);
    for (int i = 0; i < n; i++) { snprintf(p, sizeof p, "s%05d", i); symlink(pg->tgt, p); }
    for (int i = 0; i < n; i++) { snprintf(p, sizeof p, "x%05d", i); setattr(p, pg->xname, i); }
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "f%05d", i);
        int fd = open(p, O_RDONLY);
        ioctl(fd, FS_IOC_SETFLAGS, &pg->fl);
        close(fd);
    }
    *run = 0;
    waitpid(c, 0, 0);
    printf("DONE\n");
    return 0;
}
"#;

const CALLS: usize = 1500;
/// `FS_IOC_GETFLAGS` and the bits a caller may set (`FS_FL_USER_MODIFIABLE`).
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const USER_MODIFIABLE: u64 = 0x0003_80ff;

fn target(r: &Value) -> &Value {
    &r["target"]
}

fn flag(r: &Value, key: &str) -> bool {
    target(r)[key].as_bool() == Some(true)
}

fn calls<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["kind"] == kind && allowed(r) && !flag(r, "uncaptured"))
        .collect()
}

/// Whether `path` holds the attribute `name` (no link followed).
fn has_xattr(path: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (CString::new(path), CString::new(name)) else {
        return false;
    };
    // SAFETY: two NUL-terminated strings that outlive the call; a NULL
    // buffer of size 0 asks for the value's size only.
    unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

/// The inode flags of the regular file `path`.
fn inode_flags(path: &str) -> Option<u64> {
    let f = std::fs::File::open(path).ok()?;
    let mut flags: libc::c_long = 0;
    // SAFETY: the kernel writes at most a `long` into `flags`, which
    // outlives the call; `f` is open.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            FS_IOC_GETFLAGS,
            &mut flags,
        )
    };
    (rc == 0).then_some(flags as u64 & 0xffff_ffff)
}

/// Records whose value the log presents as true but the tree contradicts,
/// by kind; and how many records each check read.
fn wrong_records(work: &Path, records: &[Value]) -> (Vec<String>, Vec<(&'static str, usize)>) {
    let mut wrong = Vec::new();
    let mut checked = Vec::new();
    let kernel = |r: &Value| field(r, "path_source") == Some("kernel");
    // Symlinks: contents not marked as the agent's are the link's.
    let links: Vec<_> = calls(records, "symlink")
        .into_iter()
        .filter(|r| kernel(r) && field(r, "target_source") != Some("agent"))
        .collect();
    checked.push(("symlink", links.len()));
    for r in links {
        let path = field(r, "path").unwrap_or_default();
        let real = std::fs::read_link(path).ok();
        let said = field(r, "target").map(std::path::PathBuf::from);
        if real != said {
            wrong.push(format!("symlink: {path} holds {real:?}: {r}"));
        }
    }
    // Xattrs: a name not marked as the agent's is on (set) or off
    // (remove) the file.
    let attrs: Vec<_> = calls(records, "xattr")
        .into_iter()
        .filter(|r| kernel(r) && field(r, "name_source") != Some("agent"))
        .collect();
    checked.push(("xattr", attrs.len()));
    for r in attrs {
        let path = field(r, "path").unwrap_or_default();
        let name = field(r, "name").unwrap_or_default();
        if has_xattr(path, name) != (field(r, "op") == Some("set")) {
            wrong.push(format!("xattr: {path} says otherwise of {name}: {r}"));
        }
    }
    // Flags: flags not marked as the agent's are the file's.
    let flagged: Vec<_> = calls(records, "setflags")
        .into_iter()
        .filter(|r| kernel(r) && field(r, "flags_source") != Some("agent"))
        .filter(|r| !flag(r, "path_unverified"))
        .collect();
    checked.push(("setflags", flagged.len()));
    for r in flagged {
        let path = field(r, "path").unwrap_or_default();
        let said = target(r)["flags"].as_u64();
        let real = inode_flags(path);
        if real
            .zip(said)
            .is_none_or(|(a, b)| (a ^ b) & USER_MODIFIABLE != 0)
        {
            wrong.push(format!("setflags: {path} has {real:?}: {r}"));
        }
    }
    // Binds: a pathname bind not marked as a claim names a socket file.
    let binds: Vec<_> = calls(records, "bind")
        .into_iter()
        .filter(|r| field(r, "family") == Some("unix") && !flag(r, "abstract"))
        .filter(|r| !flag(r, "claim_unproven"))
        .collect();
    checked.push(("bind", binds.len()));
    for r in binds {
        let path = field(r, "path").unwrap_or_default();
        let socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
        if !socket {
            wrong.push(format!("bind: no socket file at {path}: {r}"));
        }
    }
    // Every socket file the kernel made is named by a record.
    let named: BTreeSet<&str> = records
        .iter()
        .filter(|r| kernel(r) && allowed(r))
        .filter_map(|r| field(r, "path"))
        .collect();
    let mut sockets = 0;
    for entry in std::fs::read_dir(work).expect("list the root").flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_socket()) {
            continue;
        }
        sockets += 1;
        let path = entry.path();
        let shown = String::from_utf8_lossy(path.as_os_str().as_bytes()).into_owned();
        if !named.contains(shown.as_str()) {
            wrong.push(format!("socket file {shown} is in no record"));
        }
    }
    checked.push(("socket file", sockets));
    (wrong, checked)
}

#[test]
fn arguments_the_log_presents_as_true_are_the_kernels() {
    let test = "log_round18_argument_races";
    if !usable(test) {
        return;
    }
    let work = Dir::new();
    chown(work.path(), NOBODY);
    let logs = Dir::new();
    let bin = Dir::new();
    let outside = Dir::open_to_all();
    let refused = outside.join("sock");
    let source = format!("{AGENT}{AGENT_MAIN}");
    let agent = compile(&bin, "race", &source);
    let n = CALLS.to_string();
    let argv = [agent.to_str().unwrap(), &n, refused.to_str().unwrap()];
    let (out, records, code, line) = run_logged_verdict(&work, &logs, &argv);
    assert!(
        stdout(&out).contains("DONE"),
        "the agent ran: {} {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(!refused.exists(), "the bind outside the root was refused");
    let (wrong, checked) = wrong_records(work.path(), &records);
    let by_kind = |k: &str| wrong.iter().filter(|w| w.starts_with(k)).count();
    assert!(
        wrong.is_empty(),
        "{} records contradict the tree (symlink {}, xattr {}, setflags {}, bind {}, \
         unnamed socket files {}; verify {code:?} {line}); first: {}",
        wrong.len(),
        by_kind("symlink"),
        by_kind("xattr"),
        by_kind("setflags"),
        by_kind("bind"),
        by_kind("socket"),
        wrong[0]
    );
    // An attribute name the file does not show is no plain `ok`.
    let unshown = calls(&records, "xattr")
        .iter()
        .filter(|r| flag(r, "name_unproven"))
        .count();
    assert!(
        unshown == 0 || code == Some(3),
        "{unshown} xattr names unproven, verify {code:?}: {line}"
    );
    // A refused bind whose name another task could rewrite says so.
    let denied: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "bind" && !allowed(r))
        .collect();
    assert!(!denied.is_empty(), "the refused bind is recorded");
    for r in &denied {
        assert!(flag(r, "name_shared"), "refused bind, thread alive: {r}");
    }
    for kind in ["symlink", "xattr", "setflags"] {
        let made = calls(&records, kind).len();
        assert!(
            made >= CALLS * 2 - 2 || kind == "setflags",
            "{kind}: {made} records"
        );
    }
    eprintln!("checked {checked:?}; verify {code:?}: {line}");
}
