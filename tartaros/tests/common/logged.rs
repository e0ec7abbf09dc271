//! Helpers of the tests that run an adversarial agent under `tartaros run
//! --log` and check the log against the tree seen from the host.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::*;

/// Whether the host can run these tests (root, gcc).
pub fn usable(test: &str) -> bool {
    if !can_run(test) {
        return false;
    }
    if !Path::new("/usr/bin/gcc").exists() {
        skip(test, "/usr/bin/gcc is missing");
        return false;
    }
    true
}

/// Compiles `source` into a directory the agent can read and execute.
pub fn compile(bin: &Dir, name: &str, source: &str) -> PathBuf {
    let c = bin.join(&format!("{name}.c"));
    std::fs::write(&c, source).expect("write C source");
    let exe = bin.join(name);
    let out = Command::new("/usr/bin/gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    chown(&exe, NOBODY);
    exe
}

/// Runs `argv` under `tartaros run --log` with `root` writable; returns
/// the run's output and the log's records. The log must verify `ok`.
pub fn run_logged(root: &Dir, logs: &Dir, argv: &[&str]) -> (std::process::Output, Vec<Value>) {
    let (out, records, code, line) = run_logged_verdict(root, logs, argv);
    assert_eq!(
        code,
        Some(0),
        "verify: {line}\nrun stderr: {}",
        stderr(&out)
    );
    (out, records)
}

/// [`run_logged`] without the check: also `verify`'s exit code and line.
#[allow(dead_code)]
pub fn run_logged_verdict(
    root: &Dir,
    logs: &Dir,
    argv: &[&str],
) -> (std::process::Output, Vec<Value>, Option<i32>, String) {
    let log = logs.join("effects.jsonl");
    let mut args = vec![
        "run",
        "--write",
        root.path().to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(argv);
    let out = tartaros(&args, root.path());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    (out, records, verify.status.code(), stdout(&verify))
}

pub fn field<'a>(r: &'a Value, key: &str) -> Option<&'a str> {
    r["target"][key].as_str()
}

pub fn allowed(r: &Value) -> bool {
    r["decision"] == "allowed"
}

pub fn seal(records: &[Value]) -> &Value {
    records
        .iter()
        .find(|r| r["kind"] == "seal")
        .expect("a seal record")
}

/// `None` when the seal lists `path` with the SHA-256 of the file on the
/// host now; else what it says, against the host's.
#[allow(dead_code)]
pub fn seal_mismatch(records: &[Value], path: &str) -> Option<String> {
    let hash = seal(records)["files"]
        .as_array()
        .and_then(|files| files.iter().find(|f| f["path"] == path))
        .and_then(|f| f["sha256"].as_str());
    let on_host = sha256_hex(&std::fs::read(path).unwrap());
    (hash != Some(on_host.as_str())).then(|| format!("sealed {hash:?}, host {on_host}"))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A run of `argv` with `root` writable and current and `deny` unreadable;
/// the records and `verify`'s exit code and line.
pub fn run_denying(root: &Dir, deny: &Path, argv: &[&str]) -> (Vec<Value>, Option<i32>, String) {
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let mut args = vec![
        "run",
        "-q",
        "--write",
        r,
        "--chdir",
        r,
        "--read-deny",
        deny.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(argv);
    let out = tartaros(&args, root.path());
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], Path::new("/"));
    // The run's status says what `verify` will: 122 for a log it calls
    // incomplete (the agent itself succeeded).
    let expected = match verify.status.code() {
        Some(3) => Some(122),
        _ => Some(0),
    };
    assert_eq!(out.status.code(), expected, "run: {}", stderr(&out));
    (records(&log), verify.status.code(), stdout(&verify))
}

/// A directory the agent may not read, holding `key`.
pub fn secret_dir() -> Dir {
    let dir = Dir::open_to_all();
    let key = dir.file("key", "the secret\n");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    dir
}

/// `tartaros run -q --write ROOT --log LOG -- sh -c SCRIPT`, from `/`.
#[allow(dead_code)]
pub fn run_sh_logged(root: &str, log: &Path, script: &str) -> std::process::Output {
    tartaros(
        &[
            "run",
            "-q",
            "--write",
            root,
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ],
        Path::new("/"),
    )
}

/// The allowed exec records with an argument that starts with `marker`.
#[allow(dead_code)]
pub fn execs_marked<'a>(records: &'a [Value], marker: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| {
            r["kind"] == "exec"
                && allowed(r)
                && r["target"]["argv"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|v| v.as_str().is_some_and(|s| s.starts_with(marker)))
                })
        })
        .collect()
}

/// `outer.sh`, whose `#!` interpreter is the script `inner.sh` (run by
/// `/bin/sh`), both executable, in `root`; returns outer's path.
#[allow(dead_code)]
pub fn nested_scripts(root: &Dir) -> String {
    let dir = root.path().to_str().unwrap();
    for (name, body) in [
        ("inner.sh", "#!/bin/sh\nexit 0\n".to_string()),
        ("outer.sh", format!("#!{dir}/inner.sh\nexit 0\n")),
    ] {
        let path = root.file(name, &body);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    format!("{dir}/outer.sh")
}

/// Every exec record of `execs` names `script` as the script it ran.
#[allow(dead_code)]
pub fn assert_scripts_named(execs: &[&Value], script: &str) {
    let unnamed: Vec<_> = execs
        .iter()
        .filter(|e| field(e, "script") != Some(script))
        .collect();
    assert!(
        unnamed.is_empty(),
        "{} of {} execs do not name {script}: {unnamed:#?}",
        unnamed.len(),
        execs.len()
    );
}

/// The summary line of `path` under "files changed" (`change [from ->]
/// path (actions) size hash`).
#[allow(dead_code)]
pub fn file_line<'a>(summary: &'a str, path: &str) -> Option<&'a str> {
    summary.lines().find(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let entry = if words.get(2) == Some(&"->") { 3 } else { 1 };
        words.get(entry) == Some(&path)
    })
}
