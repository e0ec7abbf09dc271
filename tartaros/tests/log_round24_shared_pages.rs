//! Adversarial round 23's F2, and the class behind it: an argument on a
//! page another process can write. The capture reads a path or an
//! attribute name when the call starts and the kernel copies it a moment
//! later; a forked child flipping one byte of a `MAP_SHARED` page in
//! between made the record name an attribute the call did not change,
//! `name_source: "kernel"`, `verify` ok (the caller was alone in its
//! memory, so nothing marked the name as rewritable). Now the capture
//! asks the kernel which mapping holds each argument (`bpf_find_vma`):
//! only a private anonymous one of a task alone in its memory is the
//! kernel's own string. Each test checks the records against the tree
//! from the host side. Needs root and gcc (fails under CI=true without).

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

/* `text` on a page this process and a forked child both map; the child
   flips the byte at `at` between 'A' and 'B' until it is killed. */
static char *flipped(const char *text, size_t at, pid_t *child) {
    char *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(2);
    strcpy(p, text);
    *child = fork();
    if (*child == 0) {
        volatile char *b = p + at;
        for (;;) { *b = 'B'; *b = 'A'; }
    }
    return p;
}

/* `text` on a private mapping of a file in `dir`; with `flip`, a forked
   child keeps the file open for writing and flips the byte at `at` with
   `pwrite`, which a private mapping shows until its first write. */
static char *in_file(const char *dir, const char *text, size_t at, int flip, pid_t *child) {
    char path[4096];
    snprintf(path, sizeof path, "%s/.names", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char page[4096] = {0};
    strcpy(page, text);
    if (fd < 0 || write(fd, page, sizeof page) != sizeof page) exit(2);
    close(fd);
    /* Mapped from a read-only open: the mapping holds no writer. */
    fd = open(path, O_RDONLY);
    char *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    if (fd < 0 || p == MAP_FAILED) exit(2);
    close(fd);
    if (flip) {
        /* The calls start once the child holds the file open. */
        int ready[2];
        char c;
        if (pipe(ready)) exit(2);
        *child = fork();
        if (*child == 0) {
            int w = open(path, O_WRONLY);
            if (w < 0 || write(ready[1], "r", 1) != 1) _exit(2);
            for (;;) { pwrite(w, "B", 1, at); pwrite(w, "A", 1, at); }
        }
        if (read(ready[0], &c, 1) != 1) exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    const char *mode = argv[1], *dir = argv[2];
    int n = atoi(argv[3]);
    char path[4096], value[16];
    pid_t child = 0;
    if (!strcmp(mode, "xattr-shared") || !strcmp(mode, "xattr-private")) {
        char own[16] = "user.A";
        char *name = !strcmp(mode, "xattr-shared") ? flipped("user.A", 5, &child) : own;
        if (argc > 4) name = in_file(dir, "user.A", 5, !strcmp(argv[4], "written"), &child);
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/x%05d", dir, i);
            snprintf(value, sizeof value, "evil%05d", i);
            if (setxattr(path, name, value, strlen(value), 0)) return 3;
        }
    } else if (!strcmp(mode, "create-shared")) {
        /* DIR/c00000A: the index written before each call, the last
           byte flipped. */
        char text[4096];
        snprintf(text, sizeof text, "%s/c00000A", dir);
        size_t base = strlen(dir) + 2;
        char *p = flipped(text, base + 5, &child);
        for (int i = 0; i < n; i++) {
            char idx[8];
            snprintf(idx, sizeof idx, "%05d", i);
            memcpy(p + base, idx, 5);
            close(open(p, O_CREAT | O_WRONLY, 0644));
        }
    } else {
        return 1;
    }
    if (child) { kill(child, SIGKILL); waitpid(child, 0, 0); }
    printf("DONE\n");
    return 0;
}
"#;

const FILES: usize = 400;

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated strings and a buffer of the size passed.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a value of the length passed.
    unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

/// `FILES` files in `root`, each with `user.A` and `user.B` = "host";
/// false when the filesystem keeps no user attributes.
fn files_with_both_names(root: &Dir) -> bool {
    (0..FILES).all(|i| {
        let f = root.file(&format!("x{i:05}"), "");
        set_xattr(&f, "user.A", b"host") && set_xattr(&f, "user.B", b"host")
    })
}

fn xattrs(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "xattr" && allowed(r))
        .collect()
}

fn run(root: &Dir, mode: &str, n: usize) -> (Vec<Value>, Option<i32>, String) {
    let (logs, bin) = (Dir::new(), Dir::open_to_all());
    let agent = compile(&bin, "agent", AGENT);
    let n = n.to_string();
    let dir = root.path().to_str().unwrap();
    // `xattr-private file` / `xattr-private written`: the name in a file.
    let (mode, file) = mode.split_once(' ').unwrap_or((mode, ""));
    let mut argv = vec![agent.to_str().unwrap(), mode, dir, &n];
    if !file.is_empty() {
        argv.push(file);
    }
    let (out, records, code, line) = run_logged_verdict(root, &logs, &argv);
    assert!(stdout(&out).contains("DONE"), "{}", stderr(&out));
    (records, code, line)
}

#[test]
fn an_attribute_name_on_a_shared_page_is_never_presented_as_the_kernels() {
    if !usable("r24_shared_xattr") {
        return;
    }
    let root = Dir::new();
    if !files_with_both_names(&root) {
        return skip(
            "r24_shared_xattr",
            "the test directory keeps no user xattrs",
        );
    }
    let (records, code, line) = run(&root, "xattr-shared", FILES);
    let calls = xattrs(&records);
    assert_eq!(calls.len(), FILES, "{records:#?}");
    for r in &calls {
        // Whatever the race did: the name is marked as one another
        // process could rewrite, and never presented as the kernel's.
        assert_eq!(r["target"]["name_shared"], true, "{r}");
        assert_ne!(r["target"]["name_source"], "kernel", "{r}");
        assert_eq!(r["target"]["name_unproven"], true, "{r}");
    }
    // The calls did change attributes: such a log is not complete.
    assert_eq!(code, Some(3), "verify: {line}");
    let changed = (0..FILES)
        .filter(|i| {
            let f = root.join(&format!("x{i:05}"));
            let evil = format!("evil{i:05}").into_bytes();
            [xattr(&f, "user.A"), xattr(&f, "user.B")].contains(&Some(evil))
        })
        .count();
    assert_eq!(changed, FILES, "every call changed one of the two");
}

#[test]
fn an_attribute_name_in_private_memory_is_the_kernels() {
    if !usable("r24_private_xattr") {
        return;
    }
    let root = Dir::new();
    if !files_with_both_names(&root) {
        return skip(
            "r24_private_xattr",
            "the test directory keeps no user xattrs",
        );
    }
    let (records, code, line) = run(&root, "xattr-private", FILES);
    let calls = xattrs(&records);
    assert_eq!(calls.len(), FILES, "{records:#?}");
    for r in &calls {
        assert!(r["target"].get("name_shared").is_none(), "{r}");
        assert_eq!(r["target"]["name_source"], "kernel", "{r}");
        assert_eq!(r["target"]["name"], "user.A", "{r}");
    }
    assert_eq!(code, Some(0), "verify: {line}");
    for i in 0..FILES {
        let f = root.join(&format!("x{i:05}"));
        assert_eq!(
            xattr(&f, "user.A"),
            Some(format!("evil{i:05}").into_bytes())
        );
    }
}

#[test]
fn paths_on_a_shared_page_name_the_files_the_kernel_made() {
    if !usable("r24_shared_paths") {
        return;
    }
    let root = Dir::new();
    let n = 1500;
    let (records, code, line) = run(&root, "create-shared", n);
    let made: std::collections::BTreeSet<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .collect();
    assert_eq!(made.len(), n, "one file per call");
    let creates: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "create" && allowed(r))
        .collect();
    let mut named = std::collections::BTreeSet::new();
    for r in &creates {
        let path = r["target"]["path"].as_str().unwrap_or_default().to_string();
        if r["target"]["path_source"] == "kernel" {
            assert!(
                made.contains(&path),
                "a record names a file never made: {r}"
            );
        }
        assert_eq!(r["target"]["name_shared"], true, "{r}");
        named.insert(path);
    }
    let unnamed: Vec<_> = made.difference(&named).collect();
    // A file no record names makes the log incomplete, never ok.
    assert!(
        unnamed.is_empty() || code == Some(3),
        "{unnamed:?}; verify {code:?} {line}"
    );
    assert!(matches!(code, Some(0 | 3)), "verify: {line}");
}

#[test]
fn an_attribute_name_in_a_file_someone_writes_is_shared_and_in_one_nobody_writes_is_not() {
    if !usable("r24_file_xattr") {
        return;
    }
    for (how, shared) in [("written", true), ("file", false)] {
        let root = Dir::new();
        if !files_with_both_names(&root) {
            return skip("r24_file_xattr", "the test directory keeps no user xattrs");
        }
        let (records, code, line) = run(&root, &format!("xattr-private {how}"), FILES);
        let calls = xattrs(&records);
        assert_eq!(calls.len(), FILES, "{how}: {records:#?}");
        for r in &calls {
            assert_eq!(
                r["target"].get("name_shared").is_some(),
                shared,
                "{how}: {r}"
            );
            assert_eq!(
                r["target"].get("name_unproven").is_some(),
                shared,
                "{how}: {r}"
            );
        }
        // A library's names (`cp -a`'s ACLs): proven, the log ok.
        assert_eq!(code, Some(if shared { 3 } else { 0 }), "{how}: {line}");
    }
}
