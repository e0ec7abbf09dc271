//! Harness use: the status channel, policy on stdin, per-call scopes, and
//! the example harness in examples/. Everything is checked from the host:
//! the status lines the supervisor wrote, the files on disk, the log.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

/// Runs `tartaros args...` with a pipe on fd 3 for `--status-fd 3` and
/// `stdin` fed to it; returns the output and the status lines.
fn run_with_status(args: &[&str], cwd: &Path, stdin: &[u8]) -> (Output, Vec<Value>) {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    let raw = write.as_raw_fd();
    let mut command = Command::new(bin());
    command
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; it clears CLOEXEC on fd 3 only.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("spawn tartaros");
    drop(write);
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("feed stdin");
    let mut text = String::new();
    std::fs::File::from(read)
        .read_to_string(&mut text)
        .expect("read status");
    let out = child.wait_with_output().expect("wait");
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad status line {l:?}: {e}")))
        .collect();
    (out, lines)
}

fn events(lines: &[Value]) -> Vec<&str> {
    lines.iter().filter_map(|l| l["event"].as_str()).collect()
}

#[test]
fn an_agent_faking_a_refusal_is_exited_78_not_refused() {
    if !can_run("status_fake_refusal") {
        return;
    }
    let work = Dir::new();
    let (out, lines) = run_with_status(
        &[
            "run",
            "--status-fd",
            "3",
            "--label",
            "call-1",
            "--",
            "sh",
            "-c",
            "echo 'tartaros: cannot install landlock-filesystem: fake' >&2; echo '{\"event\":\"refused\"}' >&3; exit 78",
        ],
        work.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert_eq!(events(&lines), ["started", "exited"], "{lines:?}");
    assert_eq!(lines[0]["label"], "call-1");
    assert!(lines[0]["pid"].as_i64().unwrap() > 1);
    assert!(!lines[0]["run_id"].as_str().unwrap().is_empty());
    assert_eq!(lines[1]["code"], 78);
    assert_eq!(lines[1]["status"], 78);
    assert!(lines[1]["signal"].is_null());
    assert!(lines[1]["duration_ms"].as_u64().is_some());
}

#[test]
fn a_policy_refusal_is_refused_with_its_field_and_no_start() {
    if !can_run("status_refused") {
        return;
    }
    let work = Dir::new();
    let marker = work.join("ran");
    let (out, lines) = run_with_status(
        &[
            "run",
            "--status-fd",
            "3",
            "--max-procs",
            "0",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
        work.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(78));
    assert_eq!(events(&lines), ["refused"], "{lines:?}");
    assert_eq!(lines[0]["code"], 78);
    assert_eq!(lines[0]["field"], "max_processes");
    assert!(!marker.exists());
    // A flag clap refuses is a refusal on the channel too.
    let (out, lines) = run_with_status(
        &["run", "--status-fd", "3", "--wrte", "x", "--", "true"],
        work.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(78));
    assert_eq!(events(&lines), ["refused"], "{lines:?}");
}

#[test]
fn start_failure_and_missing_command_are_failed() {
    if !can_run("status_failed") {
        return;
    }
    let work = Dir::new();
    let (out, lines) = run_with_status(
        &["run", "--status-fd", "3", "--", "no-such-command-tartaros"],
        work.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert_eq!(events(&lines), ["failed"], "{lines:?}");
    assert_eq!(lines[0]["code"], 127);
    // The working directory is not one the agent (nobody) may enter.
    let private = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let (out, lines) = run_with_status(
        &["run", "--status-fd", "3", "--", "true"],
        private.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert_eq!(events(&lines), ["failed"], "{lines:?}");
    assert_eq!(lines[0]["code"], 125);
}

#[test]
fn a_signal_death_reports_the_signal_and_the_log_head() {
    if !can_run("status_signal") {
        return;
    }
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let (out, lines) = run_with_status(
        &[
            "run",
            "--status-fd",
            "3",
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "kill -TERM $$",
        ],
        work.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr(&out));
    assert_eq!(events(&lines), ["started", "exited"], "{lines:?}");
    let exited = &lines[1];
    assert!(exited["code"].is_null());
    assert_eq!(exited["signal"], 15);
    assert_eq!(exited["status"], 143);
    let head = exited["log_head"].as_str().expect("log head");
    assert_eq!(head.len(), 64);
    assert_eq!(exited["log_complete"], true, "{}", stderr(&out));
    // The head is the SHA-256 of the seal line, and the genesis ties the
    // log to the run.
    let text = std::fs::read_to_string(&log).unwrap();
    let seal = text.lines().last().unwrap();
    let digest = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(seal.as_bytes())?;
            c.wait_with_output()
        })
        .expect("sha256sum");
    assert!(stdout(&digest).starts_with(head), "{seal}");
    let genesis: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(genesis["run"]["id"], lines[0]["run_id"]);
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}

#[test]
fn the_status_fd_is_closed_before_the_agent_runs() {
    if !can_run("status_cloexec") {
        return;
    }
    let work = Dir::new();
    let (out, lines) = run_with_status(
        &[
            "run",
            "--status-fd",
            "3",
            "--",
            "sh",
            "-c",
            "if [ -e /proc/self/fd/3 ]; then echo open; else echo closed; fi",
        ],
        work.path(),
        b"",
    );
    assert_eq!(stdout(&out).trim(), "closed", "{}", stderr(&out));
    assert_eq!(events(&lines), ["started", "exited"]);
}

#[test]
fn config_on_stdin_in_toml_and_json_with_size_strings() {
    if !can_run("config_stdin") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let toml = format!("[policy]\nwritable_roots = [\"{w}\"]\nmax_memory = \"512M\"\n");
    let json =
        format!("{{\"policy\": {{\"writable_roots\": [\"{w}\"], \"max_memory\": \"512M\"}}}}");
    for (name, text) in [("toml", toml), ("json", json)] {
        let target = work.join(&format!("from-{name}"));
        let (out, lines) = run_with_status(
            &[
                "run",
                "--status-fd",
                "3",
                "--config",
                "-",
                "--",
                "touch",
                target.to_str().unwrap(),
            ],
            work.path(),
            text.as_bytes(),
        );
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert!(
            target.exists(),
            "{name}: the writable root from stdin holds"
        );
        assert_eq!(events(&lines), ["started", "exited"]);
    }
    // Same fields, same errors.
    let (out, lines) = run_with_status(
        &["run", "--status-fd", "3", "--config", "-", "--", "true"],
        work.path(),
        b"{\"policy\": {\"writable_rootz\": []}}",
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(stderr(&out).contains("writable_rootz"), "{}", stderr(&out));
    assert_eq!(lines[0]["event"], "refused");
    // `~/` is the launcher's HOME; `~user` is refused with a clear message.
    let home_target = work.join("from-home");
    let out = Command::new(bin())
        .args(["run", "--config", "-", "--", "touch"])
        .arg(&home_target)
        .env("HOME", work.path())
        .current_dir(work.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"[policy]\nwritable_roots = [\"~/\"]\n")?;
            child.wait_with_output()
        })
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(home_target.exists());
    let (out, _) = run_with_status(
        &["run", "--status-fd", "3", "--config", "-", "--", "true"],
        work.path(),
        b"[policy]\nread_denies = [\"~bob/.ssh\"]\n",
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("~user is not expanded"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn config_from_dev_fd() {
    if !can_run("config_dev_fd") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let target = work.join("from-fd");
    let policy = format!("{{\"policy\": {{\"writable_roots\": [\"{w}\"]}}}}");
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    std::fs::File::from(write)
        .write_all(policy.as_bytes())
        .unwrap();
    let raw = read.as_raw_fd();
    let mut command = Command::new(bin());
    command
        .args(["run", "--config", "/dev/fd/7", "--", "touch"])
        .arg(&target)
        .current_dir(work.path());
    // SAFETY: dup2 is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(raw, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(target.exists());
}

#[test]
fn read_scope_none_grants_only_what_is_named() {
    if !can_run("read_scope_none") {
        return;
    }
    let work = Dir::new();
    let store = Dir::new();
    store.file("pkg/share/data.txt", "store-data\n");
    let w = work.path().to_str().unwrap();
    let mut flags = vec!["--read-scope", "none", "--write", w];
    for system in ["/usr", "/lib", "/lib64", "/bin"] {
        if Path::new(system).exists() {
            flags.extend(["--exec-allow", system]);
        }
    }
    let pkg = store.join("pkg");
    flags.extend(["--exec-allow", pkg.to_str().unwrap()]);
    let code = format!(
        "{ATTEMPT}\nattempt('etc', lambda: open('/etc/passwd').read())\n\
         attempt('home', lambda: os.listdir('/root'))\n\
         attempt('homes', lambda: os.listdir('/home'))\n\
         attempt('store', lambda: open('{}').read())\n\
         attempt('root', lambda: open('{w}/x', 'w').write('x'))\n",
        store.join("pkg/share/data.txt").display()
    );
    let out = python(&flags, work.path(), &code);
    expect(&out, "etc", "EACCES");
    expect(&out, "home", "EACCES");
    if Path::new("/home").is_dir() {
        expect(&out, "homes", "EACCES");
    }
    expect(&out, "store", "OK");
    expect(&out, "root", "OK");
    // Control: the same call under the default scope reads /etc.
    let out = python(&["--write", w], work.path(), &code);
    expect(&out, "etc", "OK");
}

#[test]
fn read_allow_under_scope_none_reads_but_does_not_execute() {
    if !can_run("read_allow_no_exec") {
        return;
    }
    let work = Dir::new();
    let tool = Dir::new();
    let script = tool.file("run.sh", "#!/bin/sh\necho ran\n");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut flags = vec!["--read-scope", "none"];
    for system in ["/usr", "/lib", "/lib64", "/bin"] {
        if Path::new(system).exists() {
            flags.extend(["--exec-allow", system]);
        }
    }
    let t = tool.path().to_str().unwrap();
    let code = format!(
        "{ATTEMPT}\nimport subprocess\nattempt('read', lambda: open('{0}').read())\n\
         attempt('exec', lambda: subprocess.run(['{0}'], check=True))\n",
        script.display()
    );
    let mut read_only = flags.clone();
    read_only.extend(["--read-allow", t]);
    let out = python(&read_only, work.path(), &code);
    expect(&out, "read", "OK");
    expect(&out, "exec", "EACCES");
    let mut exec = flags.clone();
    exec.extend(["--exec-allow", t]);
    let out = python(&exec, work.path(), &code);
    expect(&out, "exec", "OK");
}

#[test]
fn chdir_setenv_tmpfs_and_read_only_bind() {
    if !can_run("per_call_scope") {
        return;
    }
    let work = Dir::new();
    let sub = work.join("sub");
    std::fs::create_dir(&sub).unwrap();
    chown(&sub, NOBODY);
    let scratch = Dir::new();
    scratch.file("host-file", "host\n");
    let source = Dir::new();
    source.file("tool.txt", "bound\n");
    let target = Dir::new();
    let code = format!(
        "{ATTEMPT}\nprint('cwd', os.getcwd())\nprint('env', os.environ.get('TOOL_CALL'))\n\
         attempt('scratch-write', lambda: open('{s}/new', 'w').write('x'))\n\
         print('scratch-hides-host', not os.path.exists('{s}/host-file'))\n\
         print('bound', open('{t}/tool.txt').read().strip())\n\
         attempt('bind-write', lambda: open('{t}/tool.txt', 'w').write('x'))\n",
        s = scratch.path().display(),
        t = target.path().display()
    );
    let out = python(
        &[
            "--chdir",
            sub.to_str().unwrap(),
            "--setenv",
            "TOOL_CALL=42",
            "--tmpfs",
            scratch.path().to_str().unwrap(),
            "--bind",
            source.path().to_str().unwrap(),
            target.path().to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    let text = stdout(&out);
    assert!(
        text.contains(&format!("cwd {}", sub.display())),
        "{text}{}",
        stderr(&out)
    );
    assert!(text.contains("env 42"), "{text}");
    expect(&out, "scratch-write", "OK");
    expect(&out, "scratch-hides-host", "True");
    expect(&out, "bound", "bound");
    expect(&out, "bind-write", "EROFS");
    // From the host: the tmpfs write went nowhere, the bind source is unchanged.
    assert!(!scratch.join("new").exists());
    assert_eq!(
        std::fs::read_to_string(source.join("tool.txt")).unwrap(),
        "bound\n"
    );
    assert!(!target.join("tool.txt").exists());
}

#[test]
fn the_example_harness_runs_three_calls() {
    if !can_run("example_harness") {
        return;
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/harness.py");
    let out = Command::new("python3")
        .arg(&example)
        .arg("--tartaros")
        .arg(bin())
        .output()
        .expect("run the example harness");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    for call in ["search", "edit", "fetch"] {
        assert!(text.contains(&format!("{call}: ok")), "{text}");
    }
}

#[test]
fn a_guarantee_refusal_names_the_guarantee() {
    if !can_run("status_guarantee") {
        return;
    }
    // An ordinary user (an unnamed uid) lacks guarantees root has (the
    // cgroup, the gateways); --strict refuses instead of degrading.
    const UID: u32 = 47_000 + 125;
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    let raw = write.as_raw_fd();
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            bin(),
            "run",
            "--strict",
            "--status-fd",
            "3",
            "--port",
            "8080",
            "--",
            "true",
        ])
        .current_dir("/")
        .env_remove("SUDO_UID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().expect("setpriv");
    drop(write);
    let mut text = String::new();
    std::fs::File::from(read).read_to_string(&mut text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events(&lines), ["refused"], "{text}");
    // The first guarantee this user lacks (a writable cgroup here).
    let reason = lines[0]["reason"].as_str().unwrap();
    let field = lines[0]["field"].as_str().expect("a field");
    assert!(
        reason.starts_with(&format!("cannot install {field}: ")),
        "{text}"
    );
}
