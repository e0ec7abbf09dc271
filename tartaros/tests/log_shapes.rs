//! Every syscall whose record fields the capture takes from its descriptor
//! table (`capture::call_shape`, not code of its own) is recorded with the
//! path, the descriptor and the arguments it was called with. Each call is
//! made raw, with its own number, so none hides behind the C library's
//! choice of `*at` variant; the files it made are checked from the host.
//! Needs root (runs `tartaros run --log`).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

const AGENT: &str = r#"
W = sys.argv[1]
os.chdir(W)
b = lambda s: s.encode()
S = lambda *a: checked(libc.syscall(*a))
open(W + '/f', 'w').close()
attempt('chmod', lambda: S(90, b(W + '/f'), 0o640))
attempt('mkdir', lambda: S(83, b(W + '/d'), 0o750))
attempt('mkdirat', lambda: S(258, -100, b'd2', 0o700))
attempt('mknod', lambda: S(133, b(W + '/fifo'), 0o10600, 0))
attempt('mknodat', lambda: S(259, -100, b'fifo2', 0o10640, 0))
attempt('rename', lambda: S(82, b(W + '/fifo'), b(W + '/fifo3')))
attempt('link', lambda: S(86, b(W + '/f'), b(W + '/hard')))
attempt('symlink', lambda: S(88, b'f', b(W + '/sym')))
attempt('symlinkat', lambda: S(266, b'f', -100, b'sym2'))
attempt('truncate', lambda: S(76, b(W + '/f'), 3))
attempt('setxattr', lambda: S(188, b(W + '/f'), b'user.a', b'v', 1, 0))
attempt('removexattr', lambda: S(197, b(W + '/f'), b'user.a'))
attempt('utimes', lambda: S(235, b(W + '/f'), None))
attempt('futimesat', lambda: S(261, -100, b'f', None))
attempt('renameat', lambda: S(264, -100, b'hard', -100, b'hard2'))
attempt('renameat2', lambda: S(316, -100, b'hard2', -100, b'hard3', 0))
attempt('linkat', lambda: S(265, -100, b'f', -100, b'hard4', 0))
attempt('unlink', lambda: S(87, b(W + '/hard4')))
attempt('rmdir', lambda: S(84, b(W + '/d')))
attempt('fchmodat', lambda: S(268, -100, b'f', 0o600))
fd = os.open(W + '/f', os.O_RDONLY)
attempt('fchmod', lambda: S(91, fd, 0o604))
attempt('ftruncate', lambda: S(77, os.open(W + '/f', os.O_WRONLY), 2))
attempt('tgkill', lambda: S(234, os.getpid(), os.getpid(), 0))
# Refused outside the root: no kernel object, so the records carry the
# agent's strings, which must be the ones passed.
E = '/etc/hostname'
attempt('x_rename', lambda: S(82, b(E), b'/etc/x-rename'))
attempt('x_renameat', lambda: S(264, -100, b(E), -100, b'/etc/x-renameat'))
attempt('x_renameat2', lambda: S(316, -100, b(E), -100, b'/etc/x-renameat2', 0))
attempt('x_link', lambda: S(86, b(E), b'/etc/x-link'))
attempt('x_linkat', lambda: S(265, -100, b(E), -100, b'/etc/x-linkat', 0))
attempt('x_symlink', lambda: S(88, b'dest', b'/etc/x-symlink'))
attempt('x_symlinkat', lambda: S(266, b'dest', -100, b'/etc/x-symlinkat'))
attempt('x_mkdirat', lambda: S(258, -100, b'/etc/x-mkdirat', 0o700))
attempt('x_chmod', lambda: S(90, b(E), 0o666))
attempt('x_lsetxattr', lambda: S(189, b(E), b'user.x', b'v', 1, 0))
attempt('x_lremovexattr', lambda: S(198, b(E), b'user.y'))
"#;

/// What a record must hold.
type Check<'a> = Box<dyn Fn(&Value) -> bool + 'a>;

fn t<'a>(r: &'a Value, key: &str) -> &'a Value {
    &r["target"][key]
}

#[test]
fn every_described_syscall_is_recorded_with_its_path_and_arguments() {
    if !can_run("log_shapes") {
        return;
    }
    let work = Dir::new();
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let out = logged_agent(&work, &log, AGENT);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Host side: the calls did what their records will say.
    assert!(work.join("d2").is_dir() && !work.join("d").exists());
    assert!(work.join("fifo3").exists() && work.join("hard3").exists());
    assert_eq!(
        std::fs::read_link(work.join("sym2")).unwrap(),
        Path::new("f")
    );
    let records = records(&log);
    let w = work.path().to_str().unwrap();
    let path = |p: &str| format!("{w}/{p}");
    let one = |kind: &str, what: &str, p: &dyn Fn(&Value) -> bool| -> Value {
        let found: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] == kind && p(r))
            .collect();
        if found.is_empty() {
            for r in &records {
                eprintln!("{r}");
            }
        }
        assert!(!found.is_empty(), "no {kind} record: {what}");
        assert_eq!(found[0]["decision"], "allowed", "{}", found[0]);
        found[0].clone()
    };
    let at = |r: &Value| t(r, "resolved_from") == "cwd";
    let cases: [(&str, &str, Check); 20] = [
        (
            "chmod",
            "chmod",
            Box::new(|r| t(r, "path") == path("f").as_str() && t(r, "mode") == 0o640 && !at(r)),
        ),
        (
            "mkdir",
            "mkdir",
            Box::new(|r| t(r, "path") == path("d").as_str() && t(r, "mode") == 0o750),
        ),
        (
            "mkdir",
            "mkdirat",
            Box::new(|r| t(r, "path") == path("d2").as_str() && t(r, "mode") == 0o700 && at(r)),
        ),
        (
            "mknod",
            "mknod",
            Box::new(|r| {
                t(r, "path") == path("fifo").as_str()
                    && t(r, "file_type") == "fifo"
                    && t(r, "mode") == 0o600
            }),
        ),
        (
            "mknod",
            "mknodat",
            Box::new(|r| t(r, "path") == path("fifo2").as_str() && t(r, "mode") == 0o640 && at(r)),
        ),
        (
            "rename",
            "rename",
            Box::new(|r| {
                t(r, "from") == path("fifo").as_str() && t(r, "to") == path("fifo3").as_str()
            }),
        ),
        (
            "link",
            "link",
            Box::new(|r| t(r, "from") == path("f").as_str() && t(r, "to") == path("hard").as_str()),
        ),
        (
            "symlink",
            "symlink",
            Box::new(|r| t(r, "path") == path("sym").as_str() && t(r, "target") == "f"),
        ),
        (
            "symlink",
            "symlinkat",
            Box::new(|r| t(r, "path") == path("sym2").as_str() && t(r, "target") == "f" && at(r)),
        ),
        (
            "truncate",
            "truncate",
            Box::new(|r| t(r, "path") == path("f").as_str() && t(r, "length") == 3),
        ),
        (
            "xattr",
            "setxattr",
            Box::new(|r| {
                t(r, "op") == "set"
                    && t(r, "name") == "user.a"
                    && t(r, "size") == 1
                    && t(r, "path") == path("f").as_str()
            }),
        ),
        (
            "xattr",
            "removexattr",
            Box::new(|r| t(r, "op") == "remove" && t(r, "name") == "user.a"),
        ),
        (
            "utime",
            "utimes",
            Box::new(|r| t(r, "path") == path("f").as_str() && !at(r)),
        ),
        (
            "utime",
            "futimesat",
            Box::new(|r| t(r, "path") == path("f").as_str() && at(r)),
        ),
        (
            "rename",
            "renameat",
            Box::new(|r| {
                t(r, "from") == path("hard").as_str() && t(r, "to") == path("hard2").as_str()
            }),
        ),
        (
            "rename",
            "renameat2",
            Box::new(|r| {
                t(r, "from") == path("hard2").as_str() && t(r, "to") == path("hard3").as_str()
            }),
        ),
        (
            "link",
            "linkat",
            Box::new(|r| {
                t(r, "to") == path("hard4").as_str() && t(r, "from_resolved_from") == "cwd"
            }),
        ),
        (
            "unlink",
            "unlink",
            Box::new(|r| t(r, "path") == path("hard4").as_str()),
        ),
        (
            "rmdir",
            "rmdir",
            Box::new(|r| t(r, "path") == path("d").as_str()),
        ),
        (
            "chmod",
            "fchmod",
            Box::new(|r| t(r, "mode") == 0o604 && t(r, "fd").is_u64()),
        ),
    ];
    for (kind, label, p) in &cases {
        expect(&out, label, "OK");
        one(kind, label, p.as_ref());
    }
    let truncated = one("truncate", "ftruncate", &|r| t(r, "length") == 2);
    assert!(t(&truncated, "fd").is_u64(), "{truncated}");
    let fchmodat = one("chmod", "fchmodat", &|r| t(r, "mode") == 0o600);
    assert!(at(&fchmodat), "{fchmodat}");
    let refused = |kind: &str, what: &str, p: &dyn Fn(&Value) -> bool| {
        let found = records.iter().find(|r| r["kind"] == kind && p(r));
        let r = found.unwrap_or_else(|| panic!("no {kind} record of the refused {what}"));
        assert!(r["errno"].as_u64().is_some_and(|e| e != 0), "{r}");
        assert_eq!(t(r, "path_source"), "agent", "{r}");
    };
    let from_to =
        |to: &'static str| move |r: &Value| t(r, "from") == "/etc/hostname" && t(r, "to") == to;
    for (kind, label, to) in [
        ("rename", "x_rename", "/etc/x-rename"),
        ("rename", "x_renameat", "/etc/x-renameat"),
        ("rename", "x_renameat2", "/etc/x-renameat2"),
        ("link", "x_link", "/etc/x-link"),
        ("link", "x_linkat", "/etc/x-linkat"),
    ] {
        refused(kind, label, &from_to(to));
    }
    for (label, link) in [
        ("x_symlink", "/etc/x-symlink"),
        ("x_symlinkat", "/etc/x-symlinkat"),
    ] {
        refused("symlink", label, &|r| {
            t(r, "path") == link && t(r, "target") == "dest"
        });
    }
    refused("mkdir", "x_mkdirat", &|r| {
        t(r, "path") == "/etc/x-mkdirat" && t(r, "mode") == 0o700
    });
    refused("chmod", "x_chmod", &|r| {
        t(r, "path") == "/etc/hostname" && t(r, "mode") == 0o666
    });
    refused("xattr", "x_lsetxattr", &|r| {
        t(r, "op") == "set" && t(r, "name") == "user.x" && t(r, "path") == "/etc/hostname"
    });
    refused("xattr", "x_lremovexattr", &|r| {
        t(r, "op") == "remove" && t(r, "name") == "user.y" && t(r, "path") == "/etc/hostname"
    });
    let signal = one("signal", "tgkill", &|r| t(r, "tid").is_u64());
    assert_eq!(
        (t(&signal, "signal"), t(&signal, "to")),
        (&Value::from(0), t(&signal, "tid")),
        "{signal}"
    );
}
