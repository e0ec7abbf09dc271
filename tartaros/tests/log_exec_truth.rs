//! What an exec record says about the process: its arguments as the
//! kernel put them in the new image, the file the kernel ran, and the
//! process (host pid, parent) whatever the caller was (a thread other than
//! the leader, a `vfork` child, a `CLONE_PARENT` child).
//! Needs root, gcc and python3; skips with a reason otherwise (fails under
//! CI=true).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

fn execs(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["kind"] == "exec" && allowed(r))
        .collect()
}

fn argv(r: &Value) -> Vec<&str> {
    r["target"]["argv"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Arguments that are not UTF-8 stay distinct, shown as the log shows
/// names (`\xNN` for a byte that is not UTF-8, `\\` for a backslash).
/// Before, each such byte was U+FFFD: `rm $'\xff'` and `rm $'\xfe'` (or
/// `rm $'\xff\xfe'`) had one record, and a reviewer could not tell
/// which file an argument named.
#[test]
fn arguments_that_are_not_utf8_stay_distinct() {
    if !usable("exec_argv_bytes") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let code = "import os\n\
        for a in [b'\\xff', b'\\xfe', b'\\xff\\xfe', b'\\\\xff', b'plain']:\n\
        \x20   pid = os.fork()\n\
        \x20   if pid == 0:\n\
        \x20       os.execv(b'/usr/bin/true', [b'true', b'marker', a])\n\
        \x20   os.waitpid(pid, 0)\n";
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", code]);
    let shown: Vec<String> = execs(&records)
        .into_iter()
        .filter(|r| argv(r).get(1) == Some(&"marker"))
        .map(|r| argv(r).get(2).copied().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        shown,
        [r"\xff", r"\xfe", r"\xff\xfe", r"\\xff", "plain"],
        "{records:#?}"
    );
}

/// The readers call the sandbox's own init `(sandbox init)` and leave it
/// out of ancestries and of the programs run. They knew it by a string in
/// its exec (`__tartaros_sandbox_init`) anywhere in the exec text, and an
/// agent could write that string itself: `sh -c '... __tartaros_sandbox_init'`
/// was relabelled as the init, so the summary's `first:` command was a
/// later one, the refusals' ancestries skipped the agent's own shells, and
/// a script named `__tartaros_sandbox_init` was missing from `ran:`. The
/// init is only the log's first exec, with exactly the init's arguments.
#[test]
fn an_agent_naming_itself_like_the_init_is_not_taken_for_it() {
    if !usable("exec_named_like_init") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && echo 'cat /etc/shadow' > __tartaros_sandbox_init && sh __tartaros_sandbox_init; true"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = tartaros(
        &["log", "summary", "--json", log.to_str().unwrap()],
        std::path::Path::new("/"),
    );
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let json: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let first = json["processes"]["first"].as_str().unwrap_or_default();
    assert!(
        first.contains("-c") && first.contains("cat /etc/shadow"),
        "the first command is the agent's: {first}"
    );
    let programs = json["processes"]["programs"].to_string();
    assert!(programs.contains("\"/usr/bin/cat\""), "{programs}");
    let sh_runs: u64 = json["processes"]["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p[0].as_str()
                .is_some_and(|n| n.ends_with("/sh -> /usr/bin/dash") || n.ends_with("/sh"))
        })
        .filter_map(|p| p[1].as_u64())
        .sum();
    assert_eq!(sh_runs, 2, "both shells ran: {programs}");
    let cat = json["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["target"]
                .as_str()
                .is_some_and(|t| t.contains("/etc/shadow"))
        })
        .unwrap_or_else(|| panic!("no refusal of /etc/shadow: {}", json["refusals"]));
    let ancestry: Vec<&str> = cat["ancestry"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        ancestry
            .first()
            .is_some_and(|a| a.ends_with("] __tartaros_sandbox_init")),
        "the script's shell is the parent: {ancestry:?}"
    );
    assert!(
        !ancestry.iter().any(|a| a.ends_with("(sandbox init)")),
        "{ancestry:?}"
    );
}

/// A program's name is quoted when it holds a space or a quote, as its
/// arguments are: a file named `build.sh --dry-run` showed as
/// `/w/build.sh --dry-run x`, which reads as a dry run of `build.sh`.
#[test]
fn a_program_whose_name_holds_spaces_is_quoted() {
    if !usable("exec_name_with_spaces") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let log = logs.join("effects.jsonl");
    let r = root.path().to_str().unwrap();
    let script = format!(
        "cd {r} && printf '#!/bin/sh\\necho ran\\n' > 'build.sh --dry-run' && chmod 755 'build.sh --dry-run' && './build.sh --dry-run' x"
    );
    let out = run_sh_logged(r, &log, &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&tartaros(
        &["log", "show", "--kind", "exec", log.to_str().unwrap()],
        std::path::Path::new("/"),
    ));
    let line = shown
        .lines()
        .find(|l| l.contains("--dry-run") && l.contains("[runs ") && !l.contains("chmod"))
        .unwrap_or_else(|| panic!("no exec of the script:\n{shown}"));
    assert!(
        line.contains(&format!("\"{r}/build.sh --dry-run\"")),
        "the name is not quoted: {line}"
    );
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        std::path::Path::new("/"),
    ));
    let ran = summary
        .lines()
        .find(|l| l.trim_start().starts_with("ran:"))
        .unwrap_or_default();
    assert!(
        ran.contains(&format!("\"{r}/build.sh --dry-run\"")),
        "the name is not quoted: {ran}"
    );
}

/// A signal to one of the agent's own processes is never reported as sent
/// outside the sandbox. The target (a pid of the sandbox's namespace) was
/// matched against the namespace pids of the known sandbox processes,
/// read from `/proc` when the record was decoded: a child killed and
/// reaped by then had no `/proc` entry left, matched nothing, and the
/// record said `outside: true`, allowed, as if the agent had signalled a
/// host process.
#[test]
fn a_signal_to_a_child_reaped_at_once_is_not_outside() {
    if !usable("signal_reaped_child") {
        return;
    }
    let (root, logs) = (Dir::new(), Dir::new());
    let code = "import os, signal, time\n\
        kids = []\n\
        for i in range(20):\n\
        \x20   pid = os.fork()\n\
        \x20   if pid == 0:\n\
        \x20       time.sleep(30)\n\
        \x20       os._exit(0)\n\
        \x20   kids.append(pid)\n\
        time.sleep(0.2)\n\
        for pid in kids:\n\
        \x20   os.kill(pid, signal.SIGKILL)\n\
        \x20   os.waitpid(pid, 0)\n";
    let (_, records) = run_logged(&root, &logs, &["python3", "-c", code]);
    let signals: Vec<&Value> = records.iter().filter(|r| r["kind"] == "signal").collect();
    assert_eq!(signals.len(), 20, "{signals:#?}");
    let outside: Vec<&&Value> = signals
        .iter()
        .filter(|r| r["target"]["outside"] == true)
        .collect();
    assert!(
        outside.is_empty(),
        "signals to its own children: {outside:#?}"
    );
}
