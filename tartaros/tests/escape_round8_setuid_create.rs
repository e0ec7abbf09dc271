//! A setuid file left behind through a creation mode (adversarial round 8).
//! Round 7 refused S_ISGID in every creation mode whose mode is a register
//! and left S_ISUID there as harmless ("the first write clears it"). But a
//! file needs no content to be left behind: `mknod(W/s, S_IFREG | 04755)`
//! or `open(W/s, O_CREAT, 04755)` left a `-rwsr-xr-x` file of the agent's
//! uid in the root (root's, under `--user root`), which `find -perm -4000`
//! lists, and which keeps its bit when a process with CAP_FSETID (any root
//! process of the host: an install step, a `cp` over it) later writes it.
//! An O_TMPFILE with that mode, linked in, did the same. Proved from the
//! host side: the modes of what the agent left.

mod common;
use std::os::unix::fs::PermissionsExt;

use common::*;

/// Every creation call whose mode is a register (x86_64 numbers), with a
/// setuid mode, then an ordinary one (the control). Nothing is written to
/// the files: the bit must not get there at all.
const PLANT: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
W = sys.argv[1]
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])
    return r if r >= 0 else -ctypes.get_errno()
def path(name):
    return os.path.join(W, name).encode()
AT_FDCWD, O_CREAT, O_WRONLY, O_TMPFILE = -100, 0o100, 0o1, 0o20200000
S_IFREG, S_IFIFO = 0o100000, 0o10000
for mode, tag in ((0o4755, 'su'), (0o755, 'plain')):
    r = sc(257, AT_FDCWD, path('openat-' + tag), O_CREAT | O_WRONLY, mode); print('openat', tag, r < 0 and -r)
    r = sc(2, path('open-' + tag), O_CREAT | O_WRONLY, mode); print('open', tag, r < 0 and -r)
    r = sc(85, path('creat-' + tag), mode); print('creat', tag, r < 0 and -r)
    r = sc(133, path('mknod-' + tag), S_IFREG | mode, 0); print('mknod', tag, r < 0 and -r)
    r = sc(259, AT_FDCWD, path('mknodat-' + tag), S_IFREG | mode, 0); print('mknodat', tag, r < 0 and -r)
    r = sc(259, AT_FDCWD, path('fifo-' + tag), S_IFIFO | mode, 0); print('fifo', tag, r < 0 and -r)
    fd = sc(257, AT_FDCWD, W.encode(), O_TMPFILE | O_WRONLY, mode); print('tmpfile', tag, fd < 0 and -fd)
    if fd >= 0:
        # linkat(AT_SYMLINK_FOLLOW): Python's os.link would link the magic link.
        r = sc(265, AT_FDCWD, b'/proc/self/fd/%d' % fd, AT_FDCWD, path('tmpfile-' + tag), 0x400)
        print('tmpfile link', tag, r < 0 and -r)
print('done')
"#;

fn check(out: &std::process::Output, work: &std::path::Path) {
    let said = format!("{}{}", stdout(out), stderr(out));
    assert!(
        stdout(out).contains("done"),
        "the agent did not finish: {said}"
    );
    let mut privileged = Vec::new();
    for entry in std::fs::read_dir(work).unwrap() {
        let entry = entry.unwrap();
        let mode = entry.metadata().unwrap().permissions().mode();
        if mode & 0o6000 != 0 {
            privileged.push(format!("{:?} {:o}", entry.file_name(), mode & 0o7777));
        }
    }
    assert_eq!(privileged, Vec::<String>::new(), "{said}");
    for call in [
        "openat", "open", "creat", "mknod", "mknodat", "fifo", "tmpfile",
    ] {
        // Refused as a non-owner's chmod is, and the ordinary mode works.
        expect(out, &format!("{call} su"), &libc::EPERM.to_string());
        expect(out, &format!("{call} plain"), "False");
        let name = work.join(format!("{call}-plain"));
        assert!(
            std::fs::symlink_metadata(&name).is_ok(),
            "{call}: no control file: {said}"
        );
    }
}

/// `--user root`: a setuid-root file in a shared tree.
#[test]
fn an_agent_run_as_root_leaves_no_empty_setuid_root_file() {
    if !can_run("an_agent_run_as_root_leaves_no_empty_setuid_root_file") {
        return;
    }
    let work = Dir::new();
    chown(work.path(), 0);
    let w = work.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run", "-q", "--user", "root", "--write", w, "--", "python3", "-c", PLANT, w,
        ],
        work.path(),
    );
    check(&out, work.path());
}

/// The default root run (the agent is nobody) with the strict options.
#[test]
fn a_hardened_run_leaves_no_empty_setuid_file() {
    if !can_run("a_hardened_run_leaves_no_empty_setuid_file") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let out = tartaros(
        &[
            "run",
            "-q",
            "--isolate-pids",
            "--isolate-proc",
            "--seccomp-strict",
            "--write",
            w,
            "--",
            "python3",
            "-c",
            PLANT,
            w,
        ],
        work.path(),
    );
    check(&out, work.path());
}

/// An ordinary user's run: a file setuid to that user for every account.
#[test]
fn an_ordinary_users_agent_leaves_no_empty_setuid_file() {
    if !can_run("an_ordinary_users_agent_leaves_no_empty_setuid_file") {
        return;
    }
    const UID: u32 = 47_000 + 181;
    let work = owned_dir(UID);
    let w = work.path().to_str().unwrap();
    let out = run_as(
        UID,
        &["run", "-q", "--write", w, "--", "python3", "-c", PLANT, w],
        work.path(),
    );
    check(&out, work.path());
}
