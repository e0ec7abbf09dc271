//! Escapes through a standard stream that is a file inside a writable
//! root but under a path the sandbox's mount tree denies there. Each is
//! proved from the host side (the file's content on the host, a leak file
//! the host reads), never the agent's own report, and each failed on the
//! binary before its fix (0654350).
//!
//! A stream inside a root used to be passed as the launcher's descriptor,
//! on the host's read-write mount: `open("/proc/self/fd/0", O_WRONLY)`
//! reopens the file through that mount, where neither the write deny's
//! read-only copy nor the read deny's cover exists (the same magic-link
//! reopen as bubblewrap's and firejail's inherited-descriptor advisories).

mod common;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// The agent reopens its stdin for writing and appends to it.
const REOPEN_STDIN: &str = "
import os
try:
    fd = os.open('/proc/self/fd/0', os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'PWNED\\n')
    print('reopen-write OK')
except OSError as e:
    print('reopen-write', e.errno)
";

fn run_with_stdin(flags: &[&str], cwd: &Path, stdin: Stdio, code: &str) -> std::process::Output {
    Command::new(bin())
        .arg("run")
        .args(flags)
        .args(["--", "python3", "-c", code])
        .current_dir(cwd)
        .stdin(stdin)
        .output()
        .unwrap()
}

/// `tartaros run --write W --write-deny W/.git -- agent < W/.git/config`:
/// the launcher opened the config read-only, and the agent rewrote it on
/// the host by reopening `/proc/self/fd/0` for writing. A stream under a
/// deny is now relayed through a pipe, like a file outside every root.
#[test]
fn a_write_denied_file_given_as_stdin_cannot_be_rewritten() {
    if !can_run("a_write_denied_file_given_as_stdin_cannot_be_rewritten") {
        return;
    }
    let work = Dir::new();
    let config = work.file(".git/config", "[core]\n");
    let w = work.path().to_str().unwrap();
    let deny = work.join(".git");
    let out = run_with_stdin(
        &["--write", w, "--write-deny", deny.to_str().unwrap()],
        work.path(),
        Stdio::from(std::fs::File::open(&config).unwrap()),
        &format!("import sys\nprint('read', sys.stdin.read().strip())\n{REOPEN_STDIN}"),
    );
    let after = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        after,
        "[core]\n",
        "the write-denied file changed on the host\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    // Still the agent's input.
    assert!(stdout(&out).contains("read [core]"), "{}", stdout(&out));
}

/// The same for a read deny: `>> W/.env` handed the agent a write-only
/// descriptor of the denied file, and reopening `/proc/self/fd/1` for
/// reading showed the secret the deny hides.
#[test]
fn a_read_denied_file_given_as_stdout_cannot_be_read_back() {
    if !can_run("a_read_denied_file_given_as_stdout_cannot_be_read_back") {
        return;
    }
    let work = Dir::new();
    let env = work.file(".env", "TOKEN=hunter2\n");
    let leak = work.join("leak");
    let w = work.path().to_str().unwrap();
    let code = format!(
        "
try:
    data = open('/proc/self/fd/1', 'rb').read()
except OSError as e:
    data = repr(e).encode()
open('{}', 'wb').write(data)
print('appended')
",
        leak.display()
    );
    let out = Command::new(bin())
        .args(["run", "--write", w, "--read-deny", env.to_str().unwrap()])
        .args(["--", "python3", "-c", &code])
        .current_dir(work.path())
        .stdout(std::fs::OpenOptions::new().append(true).open(&env).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let leaked = std::fs::read_to_string(&leak).unwrap_or_default();
    let env_now = std::fs::read_to_string(&env).unwrap();
    assert!(
        !leaked.contains("hunter2"),
        "the agent read the read-denied file: {leaked:?}\n{}",
        stderr(&out)
    );
    // The launcher's redirection still works: the output was appended.
    assert_eq!(env_now, "TOKEN=hunter2\nappended\n", "{}", stderr(&out));
}

/// The relay runs before a config file is read, so a deny given only
/// there is not seen by it: such a run is refused (78) instead of handing
/// the agent a descriptor past the deny.
#[test]
fn a_stream_under_a_deny_of_the_config_file_is_refused() {
    if !can_run("a_stream_under_a_deny_of_the_config_file_is_refused") {
        return;
    }
    let work = Dir::new();
    let config = work.file(".git/config", "[core]\n");
    let settings = tempfile::NamedTempFile::new().unwrap();
    let deny = work.join(".git");
    std::fs::write(
        settings.path(),
        format!("[policy]\nwrite_denies = [{:?}]\n", deny.to_str().unwrap()),
    )
    .unwrap();
    let w = work.path().to_str().unwrap();
    let out = run_with_stdin(
        &["--write", w, "--config", settings.path().to_str().unwrap()],
        work.path(),
        Stdio::from(std::fs::File::open(&config).unwrap()),
        REOPEN_STDIN,
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "[core]\n",
        "the write-denied file changed on the host\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("standard stream 0 is"),
        "{}",
        stderr(&out)
    );
    // Control: the same run with stdin from a pipe starts.
    let out = run_with_stdin(
        &["--write", w, "--config", settings.path().to_str().unwrap()],
        work.path(),
        Stdio::null(),
        "print('started')",
    );
    assert!(stdout(&out).contains("started"), "{}", stderr(&out));
}
