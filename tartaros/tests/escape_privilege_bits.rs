//! Privilege bits planted in a writable root: a file the agent leaves
//! setuid (or setgid and group-executable) runs, after the run and outside
//! every sandbox, with the agent's uid (or gid) for whichever local user
//! executes it. For an ordinary user's run that uid is the user's own, so
//! any other account on the machine gets the user's identity. Proved from
//! the host side: the file's mode after the run, never the agent's report.

mod common;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;

/// The chmod family, by number (x86_64), on a copy of /bin/true: the only
/// way to make a file with content setuid, since the kernel clears S_ISUID
/// on every write, truncate or allocation by a caller without CAP_FSETID
/// (and a setuid creation mode is refused, round 8).
const PLANT: &str = r#"
import ctypes, os, shutil, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
W = sys.argv[1]
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a])
    return 0 if r >= 0 else ctypes.get_errno()
def plain(name):
    p = os.path.join(W, name)
    shutil.copyfile('/bin/true', p)
    os.chmod(p, 0o755)
    return p
AT_FDCWD = -100
for bits, tag in ((0o4755, 'u'), (0o2755, 'g')):
    p = plain('chmod-' + tag); print('chmod', tag, sc(90, p.encode(), bits))
    p = plain('fchmod-' + tag); fd = os.open(p, os.O_RDONLY)
    print('fchmod', tag, sc(91, fd, bits))
    p = plain('fchmodat-' + tag); print('fchmodat', tag, sc(268, AT_FDCWD, p.encode(), bits))
    p = plain('fchmodat2-' + tag); print('fchmodat2', tag, sc(452, AT_FDCWD, p.encode(), bits, 0))
# A setuid creation mode: refused since round 8 (an empty file kept the
# bit; escape_round8_setuid_create.rs), before that cleared by the write.
try:
    fd = os.open(os.path.join(W, 'created-u'), os.O_CREAT | os.O_WRONLY, 0o4755)
    os.write(fd, open('/bin/true', 'rb').read()); os.close(fd)
except OSError as e:
    print('created u', e.errno)
# Controls: ordinary modes, a sticky directory and a plain create work.
p = plain('control'); os.chmod(p, 0o750)
os.mkdir(os.path.join(W, 'shared')); os.chmod(os.path.join(W, 'shared'), 0o1777)
os.close(os.open(os.path.join(W, 'made'), os.O_CREAT | os.O_WRONLY, 0o640))
print('done')
"#;

/// The files in `dir` that run with their owner's or group's identity.
fn privileged(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        let mode = meta.permissions().mode();
        let setgid_exec = mode & 0o2010 == 0o2010;
        if meta.is_file() && (mode & 0o4000 != 0 || setgid_exec) {
            found.push(format!("{:?} {:o}", entry.file_name(), mode & 0o7777));
        }
    }
    found
}

fn check(work: &Path, out: &std::process::Output) {
    let said = format!("{}{}", stdout(out), stderr(out));
    assert!(
        stdout(out).contains("done"),
        "the agent did not finish: {said}"
    );
    assert_eq!(privileged(work), Vec::<String>::new(), "{said}");
    let mode = |name: &str| {
        std::fs::metadata(work.join(name))
            .unwrap()
            .permissions()
            .mode()
    };
    assert_eq!(
        mode("control") & 0o7777,
        0o750,
        "an ordinary chmod failed: {said}"
    );
    assert_eq!(
        mode("shared") & 0o7777,
        0o1777,
        "a sticky directory failed: {said}"
    );
    assert_eq!(
        mode("made") & 0o7777,
        0o640,
        "a plain create failed: {said}"
    );
    // Refused as a non-owner's chmod is: EPERM, which tools report.
    for line in ["chmod u 1", "fchmod g 1", "fchmodat u 1", "fchmodat2 g 1"] {
        assert!(stdout(out).contains(line), "{line} missing: {said}");
    }
}

/// Root launcher: the agent is nobody, and every local user could become
/// nobody (outside the sandbox, on the host's network) through its files.
#[test]
fn the_agent_leaves_no_setuid_or_setgid_file_in_a_root() {
    if !can_run("the_agent_leaves_no_setuid_or_setgid_file_in_a_root") {
        return;
    }
    let (work, out) = plant(Planter::Nobody, PLANT);
    check(work.path(), &out);
}

/// An ordinary user's run: the agent is that user, so a setuid file would
/// hand the user's identity to every other account.
#[test]
fn an_ordinary_users_agent_leaves_no_setuid_file_of_that_user() {
    if !can_run("an_ordinary_users_agent_leaves_no_setuid_file_of_that_user") {
        return;
    }
    let (work, out) = plant(Planter::Ordinary(47_000 + 131), PLANT);
    check(work.path(), &out);
}

/// `--user root`: the agent is uid 0 without capabilities, and a setuid
/// file it left would be setuid root, a root shell for every local user.
#[test]
fn an_agent_run_as_root_leaves_no_setuid_root_file() {
    if !can_run("an_agent_run_as_root_leaves_no_setuid_root_file") {
        return;
    }
    let (work, out) = plant(Planter::UserRoot, PLANT);
    check(work.path(), &out);
}
