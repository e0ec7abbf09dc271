use super::*;
use serde_json::Map;
use tartaros_common::capture::{ADDR_BYTES, ARGV_BYTES, KernelFile, UNIX_PATH_BYTES, file_status};

fn bytes_of<T: Plain>(v: &T) -> Vec<u8> {
    // SAFETY: `T: Plain` is repr(C) plain data without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn header(record: u16, effect: u16) -> EventHeader {
    let me = std::process::id();
    EventHeader {
        ktime_ns: 5_000,
        cgroup_id: 9,
        pid: me,
        tgid: me,
        uid: 1000,
        record,
        effect,
        ppid: 1,
        flags: 0,
    }
}

fn sys(record: u16, effect: u16, nr: u32, ret: i64) -> SysEvent {
    SysEvent {
        header: header(record, effect),
        nr,
        fd: AT_FDCWD,
        fd2: AT_FDCWD,
        len: 0,
        len2: 0,
        _pad: 0,
        ret,
        args: [0; 3],
    }
}

fn path_buf(s: &str) -> ([u8; PATH_BYTES], i32) {
    let mut b = [0u8; PATH_BYTES];
    b[..s.len()].copy_from_slice(s.as_bytes());
    (b, s.len() as i32 + 1)
}

fn effect_of(d: &mut Decoder, bytes: &[u8]) -> Record {
    match d.decode(bytes) {
        Decoded::Record(r) => r,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn target(e: &Record) -> Map<String, Value> {
    e.target.to_map()
}

#[test]
fn exec_splits_argv_and_flags_truncation() {
    let mut d = Decoder::new();
    let (filename, filename_len) = path_buf("/bin/echo");
    let mut args = [0u8; ARGV_BYTES];
    let raw = b"echo\0hello world\0";
    args[..raw.len()].copy_from_slice(raw);
    let ev = ExecEvent {
        header: header(record::EXEC, effect::EXEC),
        argc: 2,
        args_size: raw.len() as u32,
        filename_len,
        args_len: raw.len() as i32,
        filename,
        args,
        // What the kernel ran: /bin/echo is a link to /usr/bin/echo.
        file: kernel_file(&["echo", "bin", "usr"], file_status::COMPLETE),
    };
    let e = effect_of(&mut d, &bytes_of(&ev));
    assert_eq!(e.kind, "exec");
    assert_eq!(target(&e)["binary"], "/usr/bin/echo");
    assert_eq!(e.decision, Decision::Allowed);
    assert_eq!(e.pid, std::process::id());
    assert_eq!(target(&e)["path"], "/bin/echo");
    assert_eq!(
        target(&e)["argv"],
        serde_json::json!(["echo", "hello world"])
    );
    assert!(!target(&e).contains_key("argv_truncated"));
    assert!(e.wall_ns > 1_600_000_000_000_000_000);

    // Bytes that are not UTF-8 are shown as names are, never as U+FFFD.
    let mut odd = ev;
    let raw = b"rm\0\xff\0\\xff\0";
    odd.args = [0u8; ARGV_BYTES];
    odd.args[..raw.len()].copy_from_slice(raw);
    odd.args_len = raw.len() as i32;
    odd.argc = 3;
    let e = effect_of(&mut d, &bytes_of(&odd));
    assert_eq!(
        target(&e)["argv"],
        serde_json::json!(["rm", "\\xff", "\\\\xff"])
    );

    let mut cut = ev;
    cut.argc = 3;
    cut.header.flags = flag::ARGV_TRUNCATED;
    let e = effect_of(&mut d, &bytes_of(&cut));
    assert_eq!(target(&e)["argv_truncated"], true);
}

#[test]
fn relative_paths_are_resolved_against_the_cwd() {
    let mut d = Decoder::new();
    let (path, len) = path_buf("some/file");
    let mut s = sys(record::SYS_PATH, effect::CREATE, nr::OPENAT, 3);
    s.len = len;
    s.args = [0o1101, 0o644, 0];
    let e = effect_of(&mut d, &bytes_of(&SysPathEvent { sys: s, path }));
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(e.kind, "create");
    assert_eq!(target(&e)["path"], format!("{}/some/file", cwd.display()));
    assert_eq!(target(&e)["resolved_from"], "cwd");
    assert_eq!(target(&e)["mode"], 0o644);

    // A process that is gone: kept relative, flagged.
    let mut gone = s;
    gone.header.tgid = u32::MAX - 1;
    gone.header.pid = u32::MAX - 1;
    let e = effect_of(&mut d, &bytes_of(&SysPathEvent { sys: gone, path }));
    assert_eq!(target(&e)["path"], "some/file");
    assert_eq!(target(&e)["path_relative"], true);
}

#[test]
fn failed_calls_are_denied_with_their_errno() {
    let mut d = Decoder::new();
    let (path, len) = path_buf("/etc/shadow");
    let mut s = sys(record::SYS_PATH, effect::OPEN, nr::OPENAT, -13);
    s.len = len;
    let e = effect_of(&mut d, &bytes_of(&SysPathEvent { sys: s, path }));
    assert_eq!(e.decision, Decision::Denied);
    assert_eq!(e.errno, 13);
    assert_eq!(target(&e)["flags"], 0);

    let mut s = sys(record::SYS_PATH, effect::UNLINK, nr::UNLINK, -514);
    s.header.flags = flag::PATH_UNREADABLE;
    s.len = -14;
    let e = effect_of(&mut d, &bytes_of(&SysPathEvent { sys: s, path }));
    assert_eq!(e.errno, EINTR, "restart codes are reported as EINTR");
    assert_eq!(target(&e)["path"], "");
    assert_eq!(target(&e)["path_unreadable"], true);
}

#[test]
fn rename_and_symlink_name_their_two_paths() {
    let mut d = Decoder::new();
    let (a, la) = path_buf("/w/a");
    let (b, lb) = path_buf("/w/b");
    let mut s = sys(record::SYS_PATH2, effect::RENAME, nr::RENAMEAT2, 0);
    s.len = la;
    s.len2 = lb;
    let e = effect_of(
        &mut d,
        &bytes_of(&SysPath2Event {
            sys: s,
            path: a,
            path2: b,
        }),
    );
    assert_eq!(
        (target(&e)["from"].clone(), target(&e)["to"].clone()),
        ("/w/a".into(), "/w/b".into())
    );
    let (rel, lrel) = path_buf("../x");
    let mut s = sys(record::SYS_PATH2, effect::SYMLINK, nr::SYMLINK, 0);
    s.len = lrel;
    s.len2 = lb;
    let e = effect_of(
        &mut d,
        &bytes_of(&SysPath2Event {
            sys: s,
            path: rel,
            path2: b,
        }),
    );
    assert_eq!(
        target(&e)["target"],
        "../x",
        "link contents are not resolved"
    );
    assert_eq!(target(&e)["path"], "/w/b");
}

fn addr_event(effect: u16, ret: i64, addr: &[u8]) -> SysAddrEvent {
    let mut s = sys(record::SYS_ADDR, effect, nr::CONNECT, ret);
    s.len = addr.len() as i32;
    let mut buf = [0u8; ADDR_BYTES];
    buf[..addr.len()].copy_from_slice(addr);
    SysAddrEvent { sys: s, addr: buf }
}

#[test]
fn socket_addresses_are_decoded() {
    let mut d = Decoder::new();
    let mut v4 = vec![0u8; 16];
    v4[..2].copy_from_slice(&AF_INET.to_ne_bytes());
    v4[2..4].copy_from_slice(&443u16.to_be_bytes());
    v4[4..8].copy_from_slice(&[1, 1, 1, 1]);
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, -1, &v4)));
    assert_eq!(e.kind, "connect");
    assert_eq!(e.decision, Decision::Denied);
    assert_eq!(target(&e)["addr"], "1.1.1.1");
    assert_eq!(target(&e)["port"], 443);
    assert_eq!(target(&e)["family"], "inet");

    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, -115, &v4)));
    assert_eq!(e.decision, Decision::Allowed, "EINPROGRESS is not a denial");

    let mut v6 = vec![0u8; 28];
    v6[..2].copy_from_slice(&AF_INET6.to_ne_bytes());
    v6[2..4].copy_from_slice(&53u16.to_be_bytes());
    v6[23] = 1;
    // Sent, but no hook of the kernel saw the address: it was not used.
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::SENDTO, 1, &v6)));
    assert_eq!(
        (e.kind, target(&e)["claimed_addr"].clone()),
        ("sendto", "::1".into())
    );
    assert_eq!(target(&e)["addr_unused"], true);
    assert!(!target(&e).contains_key("addr"));

    // The kernel's hook saw another destination than the agent's
    // sockaddr said: the record names the kernel's.
    let mut note = ConnectEvent::ZERO;
    (note.kind, note.family, note.port) = (kind::CONNECT4, AF_INET, 80);
    note.verdict = verdict::ALLOW | verdict::DESTINATION_NOTE;
    note.pid = std::process::id();
    note.addr[..4].copy_from_slice(&[10, 0, 0, 9]);
    assert!(matches!(d.decode(&bytes_of(&note)), Decoded::Skip));
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, 0, &v4)));
    let t = target(&e);
    assert_eq!((&t["addr"], &t["port"]), (&"10.0.0.9".into(), &80.into()));
    assert_eq!(
        (&t["claimed_addr"], &t["claimed_port"]),
        (&"1.1.1.1".into(), &443.into())
    );
    assert_eq!(t["addr_source"], "kernel");

    let mut un = AF_UNIX.to_ne_bytes().to_vec();
    un.extend_from_slice(b"\0hidden");
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, 0, &un)));
    assert_eq!(target(&e)["path"], "@hidden");
    let mut un = AF_UNIX.to_ne_bytes().to_vec();
    un.extend_from_slice(b"/run/x.sock\0");
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, -1, &un)));
    assert_eq!(
        (target(&e)["family"].clone(), target(&e)["path"].clone()),
        ("unix".into(), "/run/x.sock".into())
    );
}

#[test]
fn exit_status_and_signals() {
    let mut d = Decoder::new();
    let ev = ExitEvent {
        header: header(record::EXIT, effect::EXIT),
        status: 3 << 8,
        _pad: 0,
    };
    assert_eq!(target(&effect_of(&mut d, &bytes_of(&ev)))["code"], 3);
    let ev = ExitEvent { status: 9, ..ev };
    assert_eq!(target(&effect_of(&mut d, &bytes_of(&ev)))["signal"], 9);

    let mut s = sys(record::SYS, effect::SIGNAL, nr::KILL, 0);
    s.fd = -1;
    s.args = [1, 15, 0];
    let e = effect_of(&mut d, &bytes_of(&s));
    assert_eq!(
        (target(&e)["to"].clone(), target(&e)["signal"].clone()),
        (1.into(), 15.into())
    );
    assert_eq!(
        target(&e)["outside"],
        true,
        "pid 1 is not a sandbox process"
    );
    assert!(!target(&e).contains_key("path"));
    s.args = [0, 15, 0];
    assert_eq!(target(&effect_of(&mut d, &bytes_of(&s)))["group"], true);
}

#[test]
fn policy_records_and_garbage() {
    let mut d = Decoder::new();
    let mut ev = ConnectEvent::ZERO;
    ev.kind = kind::CONNECT4;
    ev.verdict = verdict::DENY;
    ev.family = AF_INET;
    ev.port = 22;
    ev.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    let e = effect_of(&mut d, &bytes_of(&ev));
    assert_eq!((e.kind, e.errno), ("connect", EPERM));
    assert_eq!(target(&e)["port"], 22);

    let mut path = [0u8; UNIX_PATH_BYTES];
    path[..9].copy_from_slice(b"/run/d.so");
    let un = UnixEvent {
        header: header(record::UNIX, effect::CONNECT),
        hook: unix_hook::CONNECT,
        verdict: unix_verdict::DENY,
        addr_len: 2 + 9,
        path,
    };
    let e = effect_of(&mut d, &bytes_of(&un));
    assert_eq!(target(&e)["path"], "/run/d.so");
    assert_eq!(e.decision, Decision::Denied);

    // An allowed unix name the kernel copied after the agent's sockaddr
    // changed: the record names the kernel's, and keeps the agent's.
    let note = UnixEvent {
        verdict: unix_verdict::ALLOW | unix_verdict::DESTINATION_NOTE,
        ..un
    };
    assert!(matches!(d.decode(&bytes_of(&note)), Decoded::Skip));
    let mut claimed = AF_UNIX.to_ne_bytes().to_vec();
    claimed.extend_from_slice(b"/run/a.so\0");
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, 0, &claimed)));
    let t = target(&e);
    assert_eq!(
        (&t["path"], &t["claimed_path"], &t["addr_source"]),
        (&"/run/d.so".into(), &"/run/a.so".into(), &"kernel".into())
    );

    assert!(matches!(d.decode(&[0u8; 10]), Decoded::Invalid));
    let mut unknown = vec![0u8; 64];
    unknown[28] = 0x7f;
    assert!(matches!(d.decode(&unknown), Decoded::Invalid));
}

#[test]
fn the_cwd_model_follows_forks_and_chdirs() {
    let mut d = Decoder::new();
    let me = std::process::id();
    let gone = u32::MAX - 7;
    let fork = ForkEvent {
        header: header(record::FORK, effect::FORK),
        child: gone,
        _pad: 0,
    };
    effect_of(&mut d, &bytes_of(&fork));
    let (rel, len) = path_buf("../x/./y");
    let mut cd = sys(record::SYS_PATH, effect::CHDIR, nr::CHDIR, 0);
    cd.header.tgid = gone;
    cd.header.pid = gone;
    cd.len = len;
    assert!(matches!(
        d.decode(&bytes_of(&SysPathEvent { sys: cd, path: rel })),
        Decoded::Skip
    ));
    let (file, flen) = path_buf("f");
    let mut s = sys(record::SYS_PATH, effect::UNLINK, nr::UNLINK, 0);
    s.header.tgid = gone;
    s.header.pid = gone;
    s.len = flen;
    let e = effect_of(&mut d, &bytes_of(&SysPathEvent { sys: s, path: file }));
    let cwd = std::env::current_dir().unwrap().display().to_string();
    // `..` is kept: through a symlink it is not the lexical parent.
    assert_eq!(
        target(&e)["path"],
        format!("{}/../x/y/f", cwd.trim_end_matches('/'))
    );
    assert_eq!(target(&e)["resolved_from"], "cwd");
    assert_eq!(join("/w/", "./x/../y/."), "/w/x/../y");
    assert_eq!(join("/", ""), "/");
    let _ = me;
}

/// `cargo test --release -p tartaros --lib decode_throughput -- --ignored --nocapture`
#[test]
#[ignore = "benchmark"]
fn decode_throughput() {
    let mut d = Decoder::new();
    let (path, len) = path_buf("/nonexistent-tartaros-bench");
    let mut s = sys(record::SYS_PATH, effect::UNLINK, nr::UNLINK, -2);
    s.len = len;
    let bytes = bytes_of(&SysPathEvent { sys: s, path });
    let n = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let mut w = crate::runlog::open(
        &dir.path().join("log"),
        crate::effectlog::Genesis::new(serde_json::json!({}), vec![], vec![], vec![]),
    )
    .unwrap();
    let (mut t_decode, mut t_log) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for _ in 0..n / 1000 {
        let t = std::time::Instant::now();
        let mut records = Vec::with_capacity(1000);
        for _ in 0..1000 {
            if let Decoded::Record(r) = d.decode(&bytes) {
                records.push(r);
            }
        }
        t_decode += t.elapsed();
        let t = std::time::Instant::now();
        for mut r in records {
            w.record(&mut r).unwrap();
        }
        w.flush().unwrap();
        t_log += t.elapsed();
    }
    eprintln!(
        "decode: {:.0} ns/record",
        t_decode.as_nanos() as f64 / n as f64
    );
    eprintln!(
        "log append: {:.0} ns/record",
        t_log.as_nanos() as f64 / n as f64
    );
}

/// The decoder names every captured syscall (tartaros-common's
/// `syscall_table` test holds the prefilter against the syscall table).
#[test]
fn every_captured_syscall_decodes_to_its_table_kind() {
    use tartaros_common::capture::nr::is_captured;
    use tartaros_common::syscalls::{Class, TABLE};
    for (n, name, class) in TABLE {
        let kind = match class {
            Class::Captured(k) => effect::name(*k),
            Class::Refused => "syscall",
            _ => {
                assert!(!is_captured(u64::from(*n)), "{name}");
                continue;
            }
        };
        assert!(is_captured(u64::from(*n)), "{name}");
        if kind == "chdir" {
            continue;
        }
        let e = tartaros_common::capture::effect_of(*n);
        let s = sys(record::SYS, e, *n, -1);
        let record = Decoder::new().sys(&s, None, None, None).expect(name);
        assert_eq!(record.kind, kind, "{name}");
    }
    assert!(!is_captured(u64::MAX), "-1: no syscall");
}

/// `sys_exit` returns before classifying any syscall that
/// `nr::is_captured` rejects, so a syscall added to the classification
/// but not to the prefilter would go unrecorded without an error. The eBPF
/// code cannot run here; its source names every number it classifies in
/// code (the ones the descriptor table holds are checked against the
/// prefilter by `call_shape`'s own tests).
#[test]
fn every_syscall_the_capture_classifies_passes_the_prefilter() {
    let capture = [
        include_str!("../../../tartaros-ebpf/src/syscalls.rs"),
        include_str!("../../../tartaros-ebpf/src/classify.rs"),
    ]
    .concat();
    let common = include_str!("../../../tartaros-common/src/capture/syscall_numbers.rs");
    let start = common.find("pub const fn is_effect").unwrap();
    let prefilter = &common[start..];
    let prefilter = &prefilter[..prefilter.find("\n    }\n").unwrap()];
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let classified: std::collections::BTreeSet<&str> = capture
        .split("nr::")
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| !word(c)).next())
        .filter(|name| !name.is_empty() && !name.starts_with("is_"))
        .collect();
    assert!(classified.len() >= 12, "found only {classified:?}");
    for name in classified {
        assert!(
            prefilter.split(|c: char| !word(c)).any(|w| w == name),
            "nr::{name} is classified by sys_exit but rejected by nr::is_captured"
        );
    }
}

#[path = "decode_file_tests.rs"]
mod file_tests;
use file_tests::kernel_file;

#[path = "decode_net_tests.rs"]
mod net_tests;
