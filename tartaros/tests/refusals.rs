//! Every refusal exits 78 with one `tartaros:` line, and the agent never
//! runs: each agent below would create a marker file.

mod common;
use std::path::Path;

use common::*;

/// Runs `tartaros run <flags> -- touch MARKER` and asserts a refusal that
/// mentions `needle`.
#[track_caller]
fn assert_refused(work: &Dir, flags: &[&str], needle: &str) {
    let marker = work.join("agent-ran");
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "touch", marker.to_str().unwrap()]);
    let out = tartaros(&args, work.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "flags {flags:?}: {err}");
    assert!(err.starts_with("tartaros: "), "{err}");
    // One line, or for a flag clap refuses, clap's whole text (tips, usage).
    let clap_text =
        err.contains("\nUsage: tartaros ") || err.contains("\nFor more information, try");
    assert!(err.lines().count() == 1 || clap_text, "one line: {err}");
    assert!(
        !err.lines().skip(1).any(|l| l.starts_with("tartaros:")),
        "{err}"
    );
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(!marker.exists(), "the agent ran despite the refusal");
}

fn config(work: &Dir, text: &str) -> String {
    let path = work.join("policy.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn bad_policies_are_refused_before_the_agent_runs() {
    if !can_run("refusals") {
        return;
    }
    let work = Dir::new();
    let w = work.path().to_str().unwrap();
    let absent = format!("{w}/.env");
    assert_refused(
        &work,
        &["--strict", "--write", w, "--read-deny", &absent],
        "--materialize",
    );
    assert_refused(
        &work,
        &["--write", "/nonexistent/tartaros-root"],
        "does not exist",
    );
    assert_refused(&work, &["--max-procs", "0"], "--max-procs");
    assert_refused(&work, &["--port", "70000"], "--port");
    assert_refused(&work, &["--port", "0"], "--port");
    assert_refused(&work, &["--user", "no-such-user-tartaros"], "--user");
    assert_refused(&work, &["--write", w, "--write-deny", w], "--write-deny");
    assert_refused(&work, &["--read-scope", "some"], "read-scope");
    assert_refused(&work, &["--allow-domain", "1.2.3.4"], "IP literal");
    let c = config(&work, "[policy]\nwritable_rootz = [\"/tmp\"]\n");
    assert_refused(&work, &["--config", &c], "writable_rootz");
    let c = config(&work, "[policy]\nisolate_pids = maybe\n");
    assert_refused(&work, &["--config", &c], "line 2, column");
    let c = config(&work, "[policy]\nwritable_roots = [\"relative/dir\"]\n");
    assert_refused(&work, &["--config", &c], "relative path");
    let c = config(&work, "[policy]\nglob_denies = [\"**/*.pem\"]\n");
    assert_refused(&work, &["--config", &c], "glob");
    let c = config(
        &work,
        "[policy]\nallow_unix_socket_paths = [\"/run/x.sock\"]\n",
    );
    assert_refused(&work, &["--config", &c], "allow_unix_socket_paths");
    let c = config(
        &work,
        "[broker]\nport = 9999\ntoken_env = \"TARTAROS_TEST_ABSENT_TOKEN\"\n",
    );
    assert_refused(&work, &["--config", &c], "TARTAROS_TEST_ABSENT_TOKEN");
    assert_refused(
        &work,
        &["--config", "/nonexistent/policy.toml"],
        "failed to read config",
    );
}

#[test]
fn an_existing_log_file_is_never_overwritten() {
    if !can_run("log_exists") {
        return;
    }
    let work = Dir::new();
    let log = work.file("effects.jsonl", "precious\n");
    assert_refused(&work, &["--log", log.to_str().unwrap()], "already exists");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "precious\n");
    assert!(Path::new(&log).exists());
}
