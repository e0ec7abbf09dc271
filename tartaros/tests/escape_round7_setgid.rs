//! A setgid executable built without chmod (adversarial round 7). The
//! chmod family refuses S_ISGID (escape_privilege_bits.rs), but a creation
//! mode could carry it: `open(f, O_CREAT, 02745)` keeps the bit through
//! every write while group-execute is off, and a POSIX ACL `group::r-x`
//! set with setxattr then adds group-execute without chmod, keeping
//! S_ISGID for an owner in the file's group. Under `--user root` that left
//! a setgid-root `id` in the root: `su nobody -c W/sg` printed `egid=0`.
//! Proved from the host side: the modes of what the agent left.

mod common;
use std::os::unix::fs::PermissionsExt;

use common::*;

/// Every creation call whose mode is a register, by number (x86_64), with
/// a setgid mode; each then gets content and the ACL. The controls: the
/// same calls with an ordinary mode, and the ACL on an ordinary file.
const PLANT: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
W = sys.argv[1]
BIN = open('/bin/true', 'rb').read()
ACL = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', tag, perm, 0xffffffff)
                                      for tag, perm in ((1, 7), (4, 5), (0x20, 5)))
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])
    return r if r >= 0 else -ctypes.get_errno()
def finish(name, fd):
    p = os.path.join(W, name)
    if fd < 0 and os.path.exists(p):
        fd = os.open(p, os.O_WRONLY)
    if fd >= 0:
        os.write(fd, BIN); os.close(fd)
        try:
            os.setxattr(p, 'system.posix_acl_access', ACL)
        except OSError as e:
            print(name, 'acl', e.errno)
def path(name):
    return os.path.join(W, name).encode()
AT_FDCWD, O_CREAT, O_WRONLY, S_IFREG = -100, 0o100, 0o1, 0o100000
for mode, tag in ((0o2745, 'sg'), (0o745, 'plain')):
    r = sc(257, AT_FDCWD, path('openat-' + tag), O_CREAT | O_WRONLY, mode); print('openat', tag, r < 0 and -r)
    finish('openat-' + tag, r)
    r = sc(2, path('open-' + tag), O_CREAT | O_WRONLY, mode); print('open', tag, r < 0 and -r)
    finish('open-' + tag, r)
    r = sc(85, path('creat-' + tag), mode); print('creat', tag, r < 0 and -r)
    finish('creat-' + tag, r)
    r = sc(133, path('mknod-' + tag), S_IFREG | mode, 0); print('mknod', tag, r < 0 and -r)
    finish('mknod-' + tag, -1)
    r = sc(259, AT_FDCWD, path('mknodat-' + tag), S_IFREG | mode, 0); print('mknodat', tag, r < 0 and -r)
    finish('mknodat-' + tag, -1)
    # openat2: the mode sits in struct open_how, which seccomp cannot read.
    how = ctypes.create_string_buffer(struct.pack('QQQ', O_CREAT | O_WRONLY, mode, 0), 24)
    r = sc(437, AT_FDCWD, path('openat2-' + tag), how, 24); print('openat2', tag, r < 0 and -r)
    finish('openat2-' + tag, r)
print('done')
"#;

fn plant_and_check(out: &std::process::Output, work: &std::path::Path) {
    let said = format!("{}{}", stdout(out), stderr(out));
    assert!(
        stdout(out).contains("done"),
        "the agent did not finish: {said}"
    );
    let mut setgid = Vec::new();
    for entry in std::fs::read_dir(work).unwrap() {
        let entry = entry.unwrap();
        let mode = entry.metadata().unwrap().permissions().mode();
        if mode & 0o2000 != 0 {
            setgid.push(format!("{:?} {:o}", entry.file_name(), mode & 0o7777));
        }
    }
    assert_eq!(setgid, Vec::<String>::new(), "{said}");
    for call in ["openat", "open", "creat", "mknod", "mknodat"] {
        // Refused as a non-owner's chmod is, and the ordinary mode works.
        let refused = format!("{call} sg {}", libc::EPERM);
        assert!(stdout(out).contains(&refused), "{refused} missing: {said}");
        let plain = std::fs::metadata(work.join(format!("{call}-plain"))).unwrap();
        assert_eq!(
            plain.permissions().mode() & 0o7777,
            0o755,
            "{call}: the ACL control did not set group-execute: {said}"
        );
    }
    // ENOSYS, as for clone3: callers take it as an old kernel and fall back.
    for tag in ["sg", "plain"] {
        let line = format!("openat2 {tag} {}", libc::ENOSYS);
        assert!(stdout(out).contains(&line), "{line} missing: {said}");
    }
}

/// `--user root`: the agent is uid 0 without capabilities; a setgid file
/// it left would give every local user group root.
#[test]
fn an_agent_run_as_root_leaves_no_setgid_root_file_through_a_creation_mode() {
    if !can_run("an_agent_run_as_root_leaves_no_setgid_root_file_through_a_creation_mode") {
        return;
    }
    let (work, out) = plant(Planter::UserRoot, PLANT);
    plant_and_check(&out, work.path());
}

/// An ordinary user's run: a setgid file would hand the user's group to
/// every other account on the machine.
#[test]
fn an_ordinary_users_agent_leaves_no_setgid_file_through_a_creation_mode() {
    if !can_run("an_ordinary_users_agent_leaves_no_setgid_file_through_a_creation_mode") {
        return;
    }
    let (work, out) = plant(Planter::Ordinary(47_000 + 171), PLANT);
    plant_and_check(&out, work.path());
}
