//! Everyday use of the command line: clap's full messages behind our prefix,
//! a closed stdout, `doctor --json`, completions, man pages, the package,
//! `--quiet`, and the agent's own PATH.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

#[test]
fn a_misspelled_flag_keeps_clap_tip_and_usage_and_exits_78() {
    let out = tartaros(&["run", "--wrte", "x", "--", "true"], Path::new("/"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.starts_with("tartaros: unexpected argument '--wrte'"),
        "{err}"
    );
    assert!(
        err.contains("tip: a similar argument exists: '--write'"),
        "{err}"
    );
    assert!(err.contains("Usage: tartaros run"), "{err}");
}

#[test]
fn a_missing_command_names_what_is_missing() {
    let out = tartaros(&["run"], Path::new("/"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.starts_with("tartaros: the following required arguments were not provided:\n  <CMD>"),
        "{err}"
    );
    assert!(err.contains("Usage: tartaros run"), "{err}");
}

/// Runs `tartaros args` with stdout a pipe whose reader is already gone.
fn with_closed_stdout(args: &[&str]) -> std::process::Output {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    Command::new(bin())
        .args(args)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .expect("run tartaros")
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let work = Dir::new();
    let log = work.join("l.jsonl");
    if nix::unistd::geteuid().is_root() {
        let out = tartaros(
            &["run", "--log", log.to_str().unwrap(), "--", "true"],
            work.path(),
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let log = log.to_str().unwrap();
    let mut commands: Vec<Vec<&str>> = vec![
        vec!["doctor"],
        vec!["doctor", "--json"],
        vec!["completions", "bash"],
        vec!["manpage"],
        vec!["--help"],
        vec!["--version"],
    ];
    if Path::new(log).exists() {
        commands.push(vec!["log", "show", log]);
        commands.push(vec!["log", "verify", log]);
    }
    for args in commands {
        let out = with_closed_stdout(&args);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        let code = out.status.code();
        // doctor says 1 when a guarantee is missing here; verify says 0.
        assert!(
            matches!(code, Some(0) | Some(1)),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

#[test]
fn doctor_json_lists_what_an_ordinary_user_lacks() {
    let out = tartaros(&["doctor", "--json"], Path::new("/"));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(report["kernel"].is_string());
    let user = report["missing"]["ordinary_user"].as_array().expect("list");
    let names: Vec<&str> = user
        .iter()
        .filter_map(|m| m["guarantee"].as_str())
        .collect();
    // Capture needs eBPF (root, or the service); gateways do not need root
    // (the init makes their listeners). The report says how to get each.
    assert!(names.contains(&"ebpf-capture"), "{names:?}");
    assert!(!names.contains(&"gateways"), "{names:?}");
    assert!(
        user.iter()
            .all(|m| !m["how_to_get_it"].as_str().unwrap_or_default().is_empty())
    );
    let text = tartaros(&["doctor"], Path::new("/"));
    assert!(
        stdout(&text)
            .lines()
            .any(|l| l.starts_with("as ordinary user") && l.contains("missing ebpf-capture")),
        "{}",
        stdout(&text)
    );
}

#[test]
fn completions_and_man_pages_come_from_the_cli() {
    for shell in ["bash", "zsh", "fish"] {
        let out = tartaros(&["completions", shell], Path::new("/"));
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(stdout(&out).contains("status-fd"), "{shell}");
    }
    let out = tartaros(&["completions", "tcsh"], Path::new("/"));
    assert_eq!(out.status.code(), Some(78));
    let man = tartaros(&["manpage"], Path::new("/"));
    assert!(stdout(&man).contains(".TH tartaros 1"));
    let run = tartaros(&["manpage", "run"], Path::new("/"));
    assert!(stdout(&run).contains(".TH tartaros-run 1"));
    assert!(stdout(&run).contains("status\\-fd"));
}

#[test]
fn the_debian_package_builds_and_its_binary_runs() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(["run", "--quiet", "-p", "xtask", "--", "package", "--binary"])
        .arg(bin())
        .arg("--out")
        .arg(out_dir.path())
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo xtask package");
    assert!(
        built.status.success(),
        "{:?}\n{}\n{}",
        built.status,
        stdout(&built),
        stderr(&built)
    );
    let deb = stdout(&built)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(deb.ends_with(".deb"), "{deb}");
    let info = Command::new("dpkg-deb")
        .args(["--field", &deb, "Package", "Depends"])
        .output()
        .expect("dpkg-deb --field");
    assert!(
        stdout(&info).contains("Package: tartaros"),
        "{}",
        stdout(&info)
    );
    // Installed into a directory, not the system, and run from there.
    let root = out_dir.path().join("root");
    let unpacked = Command::new("dpkg")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .status()
        .expect("dpkg -x");
    assert!(unpacked.success());
    let installed = root.join("usr/bin/tartaros");
    let version = Command::new(&installed).arg("--version").output().unwrap();
    assert!(
        stdout(&version).starts_with("tartaros "),
        "{}",
        stdout(&version)
    );
    for file in [
        "usr/share/man/man1/tartaros.1.gz",
        "usr/share/man/man1/tartaros-run.1.gz",
        "usr/share/bash-completion/completions/tartaros",
        "usr/share/zsh/vendor-completions/_tartaros",
        "usr/share/fish/vendor_completions.d/tartaros.fish",
        "usr/share/man/man1/tartaros-service.1.gz",
        "lib/systemd/system/tartaros.socket",
        "lib/systemd/system/tartaros.service",
    ] {
        assert!(root.join(file).is_file(), "{file} is missing");
    }
    // The eBPF object is embedded: the installed binary loads it.
    if nix::unistd::geteuid().is_root() {
        let work = Dir::new();
        let log = work.join("l.jsonl");
        let run = Command::new(&installed)
            .args(["run", "--log", log.to_str().unwrap(), "--", "true"])
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", stderr(&run));
        let verify = Command::new(&installed)
            .args(["log", "verify", log.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    }
}

/// A directory only root can enter, holding an executable `name`.
fn private_tool(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tool = dir.path().join(name);
    std::fs::write(&tool, "#!/bin/sh\necho tool ran\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn the_command_is_looked_up_on_the_agents_path() {
    if !can_run("agent_path") {
        return;
    }
    let tools = private_tool("tt-tool");
    let path = format!("{}:/usr/bin:/bin", tools.path().display());
    let run = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .env("PATH", &path)
            .current_dir("/")
            .output()
            .expect("run")
    };
    // As root with the inherited PATH the tool is found, as `sh -c` would.
    let out = run(&["run", "--user", "root", "--inherit-env", "--", "tt-tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "tool ran");
    // As nobody it cannot be reached: a warning says why, and 127.
    let out = run(&["run", "--inherit-env", "--", "tt-tool"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("tartaros: warning: tt-tool is ") && err.contains("cannot reach"),
        "{err}"
    );
    // --quiet silences the warning, not the error.
    let out = run(&["run", "--quiet", "--inherit-env", "--", "tt-tool"]);
    let err = stderr(&out);
    assert!(!err.contains("warning"), "{err}");
    assert!(
        err.contains("tartaros: tt-tool: command not found"),
        "{err}"
    );
}

#[test]
fn every_tartaros_warning_has_the_prefix() {
    if !can_run("warning_prefix") {
        return;
    }
    let tools = private_tool("tt-other");
    let work = Dir::new();
    let out = Command::new(bin())
        .args(["run", "--", "true"])
        .env("PATH", format!("{}:/usr/bin:/bin", tools.path().display()))
        .current_dir(work.path())
        .output()
        .expect("run");
    let err = stderr(&out);
    assert!(err.contains("warning"), "{err}");
    for line in err.lines() {
        assert!(line.starts_with("tartaros: "), "{line}");
    }
}

#[test]
fn an_ordinary_users_agent_keeps_that_users_identity() {
    if !can_run("user_identity") {
        return;
    }
    const UID: u32 = 47_000 + 124;
    let work = Dir::new();
    chown(work.path(), UID);
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            bin(),
            "run",
            "-q",
            "--write",
            work.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "id -u; id -g; touch made; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status",
        ])
        .current_dir(work.path())
        .env_remove("SUDO_UID")
        .output()
        .expect("setpriv");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(UID.to_string().as_str()), "{text}");
    assert_eq!(lines.next(), Some(UID.to_string().as_str()), "{text}");
    for line in lines {
        assert!(
            line.ends_with("0000000000000000"),
            "capabilities left: {line}"
        );
    }
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(work.join("made")).unwrap().uid(), UID);
}

#[test]
fn a_closed_stderr_does_not_abort_a_run() {
    if !can_run("closed_stderr") {
        return;
    }
    let work = Dir::new();
    let log = work.join("l.jsonl");
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    // Warnings, the seal line and a refusal all go to a stderr nobody reads.
    let status = Command::new(bin())
        .args(["run", "--log", log.to_str().unwrap(), "--", "true"])
        .current_dir(work.path())
        .stderr(Stdio::from(write))
        .status()
        .expect("run");
    assert_eq!(status.code(), Some(0));
    let verify = tartaros(&["log", "verify", log.to_str().unwrap()], work.path());
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
}
