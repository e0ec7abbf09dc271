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
