//! Adversarial round 10: the kernel's Landlock selftests
//! (tools/testing/selftests/landlock/fs_test.c: `layout1` rename_file,
//! rename_dir, reparent_exdev_layers_exchange, reparent_remove, truncate,
//! proc_unlinked_file) ported to this policy. Landlock is not what guards
//! a deny here, the mount plan is: a write-denied path is a read-only copy,
//! a read-denied one a mount of its own, and the ancestors of both are
//! bound onto themselves. So the same moves are tried against those mounts
//! from a writable root: exchanging a writable directory or file with a
//! denied one, moving a denied file out or a file in, exchanging or
//! renaming an ancestor of a deny, truncating a write-denied file by path,
//! by `O_TRUNC` and through `/proc/self/fd`. Held before this round (every
//! move EBUSY, EXDEV or EROFS); kept because no test tried
//! `RENAME_EXCHANGE` across a deny. Proved from the host: every denied
//! file's content and every name as they were.

mod common;
use common::*;

const AGENT: &str = r#"
import ctypes, errno, os, sys
W = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
def attempt(label, f):
    try:
        f()
        print(label, 'ok', flush=True)
    except OSError as e:
        print(label, errno.errorcode[e.errno], flush=True)
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def reopen_for_writing():
    fd = os.open(W + '/ro/f', os.O_RDONLY)
    os.close(os.open('/proc/self/fd/%d' % fd, os.O_WRONLY | os.O_TRUNC))
attempt('xchg-dir-ro', lambda: exchange(W + '/a', W + '/ro'))
attempt('xchg-file-ro', lambda: exchange(W + '/a/f', W + '/ro/f'))
attempt('xchg-file-rofile', lambda: exchange(W + '/a/f', W + '/ro_file'))
attempt('xchg-dir-secret', lambda: exchange(W + '/a', W + '/secret'))
attempt('xchg-ancestor', lambda: exchange(W + '/deep', W + '/a'))
attempt('xchg-inner-ancestor', lambda: exchange(W + '/deep/x', W + '/a/b'))
attempt('rename-ancestor', lambda: os.rename(W + '/deep/x', W + '/moved'))
attempt('rename-in-ro', lambda: os.rename(W + '/a/f', W + '/ro/new'))
attempt('rename-out-ro', lambda: os.rename(W + '/ro/f', W + '/a/g'))
attempt('link-out-ro', lambda: os.link(W + '/ro/f', W + '/a/h'))
attempt('unlink-rofile', lambda: os.unlink(W + '/ro_file'))
attempt('rmdir-secret', lambda: os.rmdir(W + '/secret'))
attempt('truncate-ro', lambda: os.truncate(W + '/ro/f', 0))
attempt('otrunc-ro', lambda: os.close(os.open(W + '/ro/f', os.O_WRONLY | os.O_TRUNC)))
attempt('proc-reopen-ro', reopen_for_writing)
attempt('truncate-git', lambda: os.truncate(W + '/deep/x/.git/config', 0))
"#;

#[test]
fn renames_and_exchanges_across_a_deny_leave_every_denied_name_as_it_was() {
    if !can_run("renames_and_exchanges_across_a_deny_leave_every_denied_name_as_it_was") {
        return;
    }
    let work = Dir::new();
    work.file("a/f", "A");
    work.file("a/b/keep", "B");
    work.file("ro/f", "RO");
    work.file("ro_file", "ROFILE");
    work.file("secret/key", "KEY");
    work.file("deep/x/.git/config", "CONFIG");
    let w = work.path().to_str().unwrap().to_owned();
    let (ro, ro_file, secret, git) = (
        format!("{w}/ro"),
        format!("{w}/ro_file"),
        format!("{w}/secret"),
        format!("{w}/deep/x/.git"),
    );
    let out = tartaros(
        &[
            "run",
            "--write",
            &w,
            "--write-deny",
            &ro,
            "--write-deny",
            &ro_file,
            "--write-deny",
            &git,
            "--read-deny",
            &secret,
            "--",
            "python3",
            "-c",
            AGENT,
            &w,
        ],
        work.path(),
    );
    let text = stdout(&out);
    let read = |p: &str| std::fs::read_to_string(work.join(p)).unwrap_or_else(|e| e.to_string());
    assert_eq!(read("ro/f"), "RO", "agent: {text}");
    assert_eq!(read("ro_file"), "ROFILE", "agent: {text}");
    assert_eq!(read("secret/key"), "KEY", "agent: {text}");
    assert_eq!(read("deep/x/.git/config"), "CONFIG", "agent: {text}");
    assert_eq!(read("a/f"), "A", "agent: {text}");
    assert_eq!(read("a/b/keep"), "B", "agent: {text}");
    for gone in ["moved", "ro/new", "a/g", "a/h"] {
        assert!(!work.join(gone).exists(), "{gone} exists; agent: {text}");
    }
    // A deny's own name is a mount point (EBUSY); across its mount is
    // EXDEV; through it, EROFS.
    for (label, errno) in [
        ("xchg-dir-ro", "EBUSY"),
        ("xchg-file-ro", "EXDEV"),
        ("xchg-file-rofile", "EBUSY"),
        ("xchg-dir-secret", "EBUSY"),
        ("xchg-ancestor", "EBUSY"),
        ("xchg-inner-ancestor", "EXDEV"),
        ("rename-ancestor", "EXDEV"),
        ("rename-in-ro", "EXDEV"),
        ("rename-out-ro", "EXDEV"),
        ("link-out-ro", "EXDEV"),
        ("unlink-rofile", "EBUSY"),
        ("rmdir-secret", "EBUSY"),
        ("truncate-ro", "EROFS"),
        ("otrunc-ro", "EROFS"),
        ("proc-reopen-ro", "EROFS"),
        ("truncate-git", "EROFS"),
    ] {
        expect(&out, label, errno);
    }
}
