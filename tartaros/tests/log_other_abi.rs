//! Calls of another ABI are attempts in the log (issue 13): the seccomp
//! filter refuses every 32-bit entry (`int 0x80` from a 64-bit process)
//! and every x32 number with EPERM, and the capture records each refused
//! attempt under its ABI and number, beside a native refused call.
//! Needs root (`tartaros run --log`).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

#[track_caller]
fn syscall_record<'a>(log: &'a [Value], what: &str, p: impl Fn(&Value) -> bool) -> &'a Value {
    log.iter()
        .find(|r| r["kind"] == "syscall" && p(&r["target"]))
        .unwrap_or_else(|| {
            for r in log {
                eprintln!("{r}");
            }
            panic!("no syscall record: {what}")
        })
}

#[track_caller]
fn refused(r: &Value) {
    assert_eq!(
        (r["decision"].as_str(), r["errno"].as_u64()),
        (Some("denied"), Some(libc::EPERM as u64)),
        "{r}"
    );
    assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn refused_calls_of_the_32_bit_entry_and_of_x32_are_records() {
    if !can_run("log_other_abi") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let code = format!(
        "{ATTEMPT}
import mmap
def int80(nr):
    # mov eax, nr; int 0x80; ret
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(b'\\xb8' + nr.to_bytes(4, 'little') + b'\\xcd\\x80\\xc3')
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    r = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
    if r < 0:
        raise OSError(-r, os.strerror(-r))
libc.syscall.restype = ctypes.c_long
attempt('ia32-open', lambda: int80(5))
attempt('ia32-getpid', lambda: int80(20))
attempt('x32-getpid', lambda: checked(libc.syscall(0x40000000 | 39)))
attempt('x32-unlink', lambda: checked(libc.syscall(0x40000000 | 87, b'{w}/keep')))
attempt('native-refused', lambda: checked(libc.syscall(425, 8, None)))
attempt('control', lambda: os.getpid())",
        w = work.path().display()
    );
    std::fs::write(work.join("keep"), "k").unwrap();
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "ia32-open", "EPERM");
    expect(&out, "ia32-getpid", "EPERM");
    expect(&out, "x32-getpid", "EPERM");
    expect(&out, "x32-unlink", "EPERM");
    expect(&out, "native-refused", "EPERM");
    expect(&out, "control", "OK");
    assert!(work.join("keep").exists());

    let log = records(&log);
    let ia32 = |nr: u64| move |t: &Value| t["abi"] == "ia32" && t["nr"].as_u64() == Some(nr);
    for nr in [5, 20] {
        let r = syscall_record(&log, "ia32", ia32(nr));
        refused(r);
        assert_eq!(r["target"]["syscall"], format!("ia32 #{nr}"), "{r}");
    }
    let x32 = |nr: u64| move |t: &Value| t["abi"] == "x32" && t["nr"].as_u64() == Some(nr);
    let r = syscall_record(&log, "x32 getpid", x32(0x4000_0000 | 39));
    refused(r);
    assert_eq!(r["target"]["syscall"], "x32 getpid", "{r}");
    refused(syscall_record(&log, "x32 unlink", x32(0x4000_0000 | 87)));
    // The native refused call keeps its own name and no ABI.
    let native = syscall_record(&log, "io_uring_setup", |t| t["syscall"] == "io_uring_setup");
    refused(native);
    assert!(native["target"].get("abi").is_none(), "{native}");
    let verify = tartaros(
        &[
            "log",
            "verify",
            work.join("effects.jsonl").to_str().unwrap(),
        ],
        Path::new("/"),
    );
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
