//! Adversarial round 13 on the log: an inode's generation. The kernel's
//! file handles (fanotify's, the join's) carry it, and ext4 lets a file's
//! owner change it (`FS_IOC_SETVERSION`, no capability). An agent that
//! changed the generation of a directory it had just written in made
//! every queued handle of it stop opening (`ESTALE`): the join took the
//! live directory for a removed one, the writes there got no record, its
//! creates fell back to the agent's own string (`L/../x`) and the seal
//! left the files out, while `verify` said `ok` (5 of 5 runs).
//!
//! The ioctl is refused (EPERM) on every run, in both encodings, and each
//! refused attempt is a `syscall` record; the writes of the directory are
//! named by the kernel and sealed. Needs root and python3.

mod common;

use common::*;
use serde_json::Value;

const AGENT: &str = r#"
import fcntl, struct
W = sys.argv[1]
os.mkdir(W + '/D1')
with open(W + '/D1/existing', 'w') as f:
    f.write('EVIL1\n')
d = os.open(W + '/D1', os.O_RDONLY)
f = os.open(W + '/D1/existing', os.O_RDONLY)
for label, fd in (('dir', d), ('file', f)):
    for name, cmd in (('64', 0x40087602), ('32', 0x40047602)):
        attempt('setversion-%s-%s' % (label, name),
                lambda: fcntl.ioctl(fd, cmd, struct.pack('l', 12345)))
# With upper bits set: the kernel reads the low 32 bits of the command.
attempt('setversion-upper', lambda: checked(libc.ioctl(d, ctypes.c_ulong(0x1_4008_7602), ctypes.byref(ctypes.c_long(7)))))
os.close(d)
os.close(f)
with open(W + '/D1/after', 'w') as f:
    f.write('EVIL2\n')
print('done OK')
"#;

#[test]
fn an_inode_generation_cannot_be_changed_and_the_attempts_are_logged() {
    if !can_run("log_round13_generation") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let out = logged_agent(&work, &log, AGENT);
    for label in [
        "setversion-dir-64",
        "setversion-dir-32",
        "setversion-file-64",
        "setversion-file-32",
        "setversion-upper",
    ] {
        expect(&out, label, "EPERM");
    }
    expect(&out, "done", "OK");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));

    let log = records(&log);
    let refused: Vec<&Value> = log
        .iter()
        .filter(|r| r["kind"] == "syscall" && r["target"]["syscall"] == "ioctl")
        .collect();
    let named = |cmd: &str| {
        refused
            .iter()
            .filter(|r| r["target"]["cmd"] == cmd)
            .inspect(|r| {
                assert_eq!(r["decision"], "denied", "{r}");
                assert_eq!(r["errno"], libc::EPERM, "{r}");
                assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
            })
            .count()
    };
    assert_eq!(named("FS_IOC_SETVERSION"), 3, "{refused:#?}");
    assert_eq!(named("FS_IOC32_SETVERSION"), 2, "{refused:#?}");

    // The directory lives: its files are named by the kernel and sealed.
    let w = work.path().to_str().unwrap();
    for file in ["existing", "after"] {
        let path = format!("{w}/D1/{file}");
        let write = log
            .iter()
            .find(|r| r["kind"] == "write" && r["target"]["path"] == path.as_str())
            .unwrap_or_else(|| panic!("no write record of {path}"));
        assert_eq!(write["target"]["path_source"], "kernel", "{write}");
        assert_eq!(write["target"].get("deleted"), None, "{write}");
        let create = log
            .iter()
            .find(|r| r["kind"] == "create" && r["target"]["path"] == path.as_str())
            .unwrap_or_else(|| panic!("no create record of {path}"));
        assert_eq!(create["target"]["path_source"], "kernel", "{create}");
    }
    let seal = log.iter().find(|r| r["kind"] == "seal").expect("a seal");
    let files = seal["files"].to_string();
    for file in ["existing", "after"] {
        assert!(files.contains(&format!("{w}/D1/{file}")), "{seal}");
    }
}
