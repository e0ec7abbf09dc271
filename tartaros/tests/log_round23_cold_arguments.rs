//! Adversarial round 23: arguments that are not paths (an attribute's
//! name, inode flags, a unix socket's address) on a page the capture
//! cannot fault in at `sys_enter` and the kernel's own copy then does.
//! The records said `name: ""`, no flags, no address, and `verify` said
//! ok, also for a POSIX ACL that opened a 0600 file to another user. Each
//! test checks the records and `verify` from the host side. Needs root
//! and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

/* `len` bytes of `data` on a page of a file mapping this process never
   touched: the page cache holds them, its page table does not, so the
   capture cannot read them and the kernel faults them in. */
static void *cold(const char *dir, const void *data, size_t len) {
    char name[4096];
    snprintf(name, sizeof name, "%s/.cold-%d-%zu", dir, getpid(), len);
    int h = open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    char page[4096] = {0};
    memcpy(page, data, len);
    if (h < 0 || write(h, page, sizeof page) != sizeof page) return 0;
    /* Mapped from a read-only open: a mapping of a file open for writing
       is one another process could rewrite (round 24), not only cold. */
    close(h);
    h = open(name, O_RDONLY);
    void *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE, h, 0);
    close(h);
    unlink(name);
    return p == MAP_FAILED ? 0 : p;
}

int main(int argc, char **argv) {
    const char *dir = argv[2];
    if (!strcmp(argv[1], "xattr")) {
        /* argv[3]: a file; set user.cold_set, then remove user.cold_gone
           (which the host put there), both names on cold pages. */
        const char *set = cold(dir, "user.cold_set", 14);
        const char *gone = cold(dir, "user.cold_gone", 15);
        if (!set || !gone) return 2;
        if (setxattr(argv[3], set, "v", 1, 0)) return 3;
        if (removexattr(argv[3], gone)) return 4;
        return 0;
    }
    if (!strcmp(argv[1], "setflags")) {
        int fd = open(argv[3], O_RDONLY), flags = 0;
        if (fd < 0 || ioctl(fd, FS_IOC_GETFLAGS, &flags)) return 5;
        flags |= FS_NODUMP_FL;
        int *p = cold(dir, &flags, sizeof flags);
        if (!p || ioctl(fd, FS_IOC_SETFLAGS, p)) return 6;
        return 0;
    }
    if (!strcmp(argv[1], "bind")) {
        /* argv[3]: a socket name outside the roots (refused). */
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        strncpy(a.sun_path, argv[3], sizeof a.sun_path - 1);
        struct sockaddr_un *p = cold(dir, &a, sizeof a);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (!p || s < 0) return 7;
        return bind(s, (struct sockaddr *)p, sizeof a) == 0 ? 8 : 0;
    }
    return 1;
}
"#;

fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

#[test]
fn attribute_names_on_a_cold_page_are_named_after_the_call() {
    if !usable("r23_cold_xattr") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    chown(root.path(), NOBODY);
    let agent = compile(&bin, "agent", AGENT);
    let file = root.file("tagged", "x");
    chown(&file, NOBODY);
    let _ = xattr_set(&file, "user.cold_gone");
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[
            agent.to_str().unwrap(),
            "xattr",
            root.path().to_str().unwrap(),
            file.to_str().unwrap(),
        ],
    );
    let xattrs = of_kind(&records, "xattr");
    let named = |name: &str, op: &str| {
        xattrs
            .iter()
            .find(|r| r["target"]["name"] == name && r["target"]["op"] == op)
            .copied()
    };
    let set = named("user.cold_set", "set").unwrap_or_else(|| panic!("{xattrs:#?}"));
    let gone = named("user.cold_gone", "remove").unwrap_or_else(|| panic!("{xattrs:#?}"));
    for r in [set, gone] {
        assert_eq!(r["decision"], "allowed", "{r}");
        assert_eq!(r["target"]["path"], file.to_str().unwrap(), "{r}");
        assert_eq!(r["target"]["name_read_after"], true, "{r}");
        assert!(r["target"].get("name_unreadable").is_none(), "{r}");
    }
    // The host agrees with the records.
    assert!(xattr_get(&file, "user.cold_set"), "set on the host");
    assert!(!xattr_get(&file, "user.cold_gone"), "removed on the host");
    assert_eq!(code, Some(0), "verify: {line}");
}

#[test]
fn inode_flags_on_a_cold_page_are_the_files_after_the_call() {
    if !usable("r23_cold_setflags") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    chown(root.path(), NOBODY);
    let agent = compile(&bin, "agent", AGENT);
    let file = root.file("flagged", "x");
    chown(&file, NOBODY);
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[
            agent.to_str().unwrap(),
            "setflags",
            root.path().to_str().unwrap(),
            file.to_str().unwrap(),
        ],
    );
    let set = of_kind(&records, "setflags");
    assert_eq!(set.len(), 1, "{records:#?}");
    let t = &set[0]["target"];
    const FS_NODUMP_FL: u64 = 0x40;
    let flags = t["flags"].as_u64().unwrap_or_else(|| panic!("{}", set[0]));
    assert_ne!(flags & FS_NODUMP_FL, 0, "{}", set[0]);
    assert_eq!(t["flags_source"], "kernel", "{}", set[0]);
    assert_eq!(code, Some(0), "verify: {line}");
}

#[test]
fn a_refused_bind_whose_address_no_one_could_read_is_not_ok() {
    if !usable("r23_cold_bind") {
        return;
    }
    let (root, bin, secret) = (Dir::new(), Dir::open_to_all(), secret_dir());
    chown(root.path(), NOBODY);
    let agent = compile(&bin, "agent", AGENT);
    // Outside every root: the read-only base mount refuses it.
    let outside = bin.join("sock");
    let (records, code, line) = run_denying(
        &root,
        secret.path(),
        &[
            agent.to_str().unwrap(),
            "bind",
            root.path().to_str().unwrap(),
            outside.to_str().unwrap(),
        ],
    );
    assert!(!outside.exists(), "the bind outside the roots was refused");
    let binds = of_kind(&records, "bind");
    assert_eq!(binds.len(), 1, "{records:#?}");
    assert_eq!(binds[0]["decision"], "denied", "{}", binds[0]);
    assert_eq!(binds[0]["target"]["addr_unreadable"], true, "{}", binds[0]);
    assert_eq!(code, Some(3), "verify: {line}");
}

fn xattr_set(path: &std::path::Path, name: &str) -> bool {
    let (p, n) = c_strings(path, name);
    // SAFETY: NUL-terminated strings and a one-byte value that outlive the call.
    unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), c"v".as_ptr().cast(), 1, 0) == 0 }
}

fn xattr_get(path: &std::path::Path, name: &str) -> bool {
    let (p, n) = c_strings(path, name);
    // SAFETY: NUL-terminated strings; a NULL buffer of size 0 asks the size.
    unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn c_strings(path: &std::path::Path, name: &str) -> (std::ffi::CString, std::ffi::CString) {
    use std::os::unix::ffi::OsStrExt as _;
    (
        std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap(),
        std::ffi::CString::new(name).unwrap(),
    )
}
