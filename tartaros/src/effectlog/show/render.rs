//! One record as one readable, escaped, bounded line of text.

use serde_json::{Map, Value};

pub(crate) use super::names::text;
use super::names::{self, Mechanism, Outcome};
use super::policy::PolicyView;

/// Longest string (in characters) printed from a record; the rest is cut
/// with a visible marker (`log show --json` prints records whole).
pub(crate) const MAX_TEXT_CHARS: usize = 4096;
/// Fields of one target printed; the rest are counted.
const MAX_FIELDS: usize = 32;

fn str_field<'a>(m: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    m.get(k).and_then(Value::as_str)
}

/// The time a record's effect started: proxy and broker records are
/// written when the connection ends and carry its duration.
pub(crate) fn start_ns(rec: &Map<String, Value>) -> Option<u64> {
    let mono = rec.get("mono_ns").and_then(Value::as_u64)?;
    let took = rec
        .get("target")
        .and_then(|t| t.get("duration_us"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(mono.saturating_sub(took.saturating_mul(1000)))
}

pub(crate) fn format_ms(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}ms", a / 1_000_000, (a % 1_000_000) / 1_000)
}

/// `allowed`, `REFUSED (EACCES, filesystem: read_denies /home/u/.ssh)`,
/// `failed (EEXIST)`. With the run's policy, a filesystem refusal says
/// which rule explains it.
pub(crate) fn verdict(rec: &Map<String, Value>, policy: Option<&PolicyView>) -> String {
    let errno = rec.get("errno").and_then(Value::as_u64).unwrap_or(0);
    let name = (errno != 0).then(|| names::errno(errno));
    match names::outcome(rec) {
        Outcome::Allowed => match str_field(rec, "decision") {
            Some("allowed") => "allowed".to_string(),
            Some(other) => text(other, 64),
            None => "?".to_string(),
        },
        Outcome::Refused(m) => {
            let why = match (m, policy, rec.get("target").and_then(Value::as_object)) {
                (Mechanism::Filesystem, Some(p), Some(t)) => {
                    let kind = str_field(rec, "kind").unwrap_or("");
                    format!(": {}", p.reason(kind, t, errno))
                }
                _ => String::new(),
            };
            match name {
                Some(n) => format!("REFUSED ({n}, {}{why})", m.as_str()),
                None => format!("REFUSED ({}{why})", m.as_str()),
            }
        }
        Outcome::Failed => format!("failed ({})", name.unwrap_or_default()),
    }
}

/// The kind column: a `create` record that may have opened an existing
/// file (no `O_EXCL`) is shown as the `open` it was.
pub(crate) fn kind_label(rec: &Map<String, Value>) -> String {
    let kind = str_field(rec, "kind").unwrap_or("?");
    let flags = rec
        .get("target")
        .and_then(|t| t.get("flags"))
        .and_then(Value::as_u64);
    if kind == "create" && names::open_action(kind, flags) != "create" {
        return "open".to_string();
    }
    text(kind, 64)
}

/// One timeline line (without the newline).
pub(crate) fn timeline_line(
    rec: &Map<String, Value>,
    rel_ns: Option<i128>,
    policy: Option<&PolicyView>,
) -> String {
    let [time, pid, kind, what] = timeline_parts(rec, rel_ns, policy);
    format!("{time:>12} {pid:>7} {kind:<8} {what}")
}

/// The columns of a timeline line: time, pid, kind, effect and verdict.
pub(crate) fn timeline_parts(
    rec: &Map<String, Value>,
    rel_ns: Option<i128>,
    policy: Option<&PolicyView>,
) -> [String; 4] {
    let time = rel_ns.map_or_else(|| "?".to_string(), format_ms);
    let pid = rec
        .get("pid")
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_string(), |p| p.to_string());
    let kind = str_field(rec, "kind").unwrap_or("?");
    let what = match kind {
        "genesis" => genesis_summary(rec),
        "gap" => format!(
            "{} {} events LOST",
            rec.get("count").and_then(Value::as_u64).unwrap_or(0),
            text(str_field(rec, "lost_kind").unwrap_or("?"), 64)
        ),
        "seal" => seal_summary(rec),
        _ => {
            let target = rec
                .get("target")
                .map_or_else(String::new, |t| describe(kind, t));
            format!("{target}  {}", verdict(rec, policy))
        }
    };
    [time, pid, kind_label(rec), what]
}

fn genesis_summary(rec: &Map<String, Value>) -> String {
    let s = |k: &str| text(str_field(rec, k).unwrap_or("?"), 256);
    let g = rec.get("guarantees");
    let list = |k: &str| {
        g.and_then(|g| g.get(k))
            .map_or_else(String::new, |v| render("", "", v))
    };
    let hash = s("policy_hash");
    format!(
        "tartaros {} on kernel {}, policy {}, installed {}, degraded {}",
        s("version"),
        s("kernel"),
        hash.get(..12).unwrap_or(&hash),
        list("installed"),
        list("degraded")
    )
}

fn seal_summary(rec: &Map<String, Value>) -> String {
    let status = rec
        .get("exit_status")
        .map_or_else(|| "?".to_string(), exit_text);
    let lost = rec.get("lost").and_then(Value::as_u64).unwrap_or(0);
    let empty = match rec.get("cgroup_empty").and_then(Value::as_bool) {
        Some(true) => "cgroup empty",
        _ => "cgroup NOT empty",
    };
    let files = match rec.get("files").and_then(Value::as_array) {
        Some(f) => format!(", {} files hashed", f.len()),
        None => String::new(),
    };
    format!("{status}, {lost} events lost, {empty}{files}")
}

/// `exit code 2`, `killed by SIGKILL (core dumped)`.
pub(crate) fn exit_text(v: &Value) -> String {
    if let Some(c) = v.get("code").and_then(Value::as_i64) {
        format!("exit code {c}")
    } else if let Some(s) = v.get("signal").and_then(Value::as_i64) {
        let core = if v.get("core").and_then(Value::as_bool) == Some(true) {
            " (core dumped)"
        } else {
            ""
        };
        format!("killed by {}{core}", names::signal(s))
    } else {
        format!("exit {}", render("", "", v))
    }
}

fn describe(kind: &str, target: &Value) -> String {
    match kind {
        "exec" => exec_text(target, MAX_TEXT_CHARS),
        "exit" => exit_text(target),
        "fork" => match target.get("child").and_then(Value::as_u64) {
            Some(c) => format!("child {c}"),
            None => render_target(kind, target),
        },
        _ => render_target(kind, target),
    }
}

/// Keys a reader looks for first; the rest follow in name order.
const LEADING_KEYS: &[&str] = &[
    "path",
    "claimed_path",
    "path_source",
    "from",
    "to",
    "target",
    "method",
    "host",
    "addr",
    "dest",
    "port",
];

/// `{"path": "/x"}` prints as `/x`; several fields as `k=v k=v`, the
/// important ones first, numbers with names (flags, modes, signals).
pub(crate) fn render_target(kind: &str, v: &Value) -> String {
    match v.as_object() {
        Some(m) if m.len() == 1 && m.contains_key("path") => render(kind, "path", &m["path"]),
        Some(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            let rank = |k: &str| LEADING_KEYS.iter().position(|x| *x == k);
            entries.sort_by_key(|(k, _)| (rank(k).unwrap_or(usize::MAX), k.as_str()));
            // A forged record can hold any number of fields: the line stays
            // bounded (`--json` prints them all).
            let more = entries.len().saturating_sub(MAX_FIELDS);
            let shown = entries
                .iter()
                .take(MAX_FIELDS)
                .map(|(k, v)| {
                    let shown = render(kind, k, v);
                    let key = text(k, 64);
                    format!("{key}={}", crate::effectlog::escape::quoted(&shown))
                })
                .collect::<Vec<_>>()
                .join(" ");
            if more > 0 {
                format!("{shown} …{more} more fields")
            } else {
                shown
            }
        }
        None => render(kind, "", v),
    }
}

/// A value, with names for the numbers of known keys.
pub(crate) fn render(kind: &str, key: &str, v: &Value) -> String {
    match (key, v) {
        ("flags", Value::Number(n)) if matches!(kind, "open" | "create" | "truncate") => {
            n.as_u64().map_or_else(|| n.to_string(), names::open_flags)
        }
        ("mode", Value::Number(n)) => n.as_u64().map_or_else(|| n.to_string(), names::mode),
        ("signal", Value::Number(n)) => n.as_i64().map_or_else(|| n.to_string(), names::signal),
        (_, Value::String(s)) => text(s, MAX_TEXT_CHARS),
        (_, Value::Array(items)) => {
            let inner: Vec<String> = items.iter().take(64).map(|i| render(kind, "", i)).collect();
            let more = if items.len() > 64 {
                format!(", …{} more", items.len() - 64)
            } else {
                String::new()
            };
            format!("[{}{more}]", inner.join(", "))
        }
        (_, Value::Object(_)) => format!("{{{}}}", render_target(kind, v)),
        (_, other) => other.to_string(),
    }
}

/// An argument as a reader must see it: quoted when it holds spaces or is
/// empty, so `sh -c "make test; echo pwned"` is not read as five words,
/// or when it is one of the readers' own words (`<-`, `[runs`).
/// A program's name too: a file `build.sh --dry-run` read as a dry run.
pub(crate) fn argument(s: &str, max: usize) -> String {
    crate::effectlog::escape::quoted_word(&text(s, max))
}

/// What the kernel ran when it is not the file `path` names: the
/// `binary` (a link's target, a script's interpreter), or the leaf of one
/// in no directory (a memfd), with `(deleted)` when it has no link left,
/// and the `script` it ran when that is not `path` either;
/// shown like a program's name (at most `max` characters, quoted when it
/// holds a space).
pub(crate) fn ran_other_than(
    target: &serde_json::Map<String, Value>,
    path: &str,
    max: usize,
) -> Option<String> {
    let deleted = target.get("binary_deleted").and_then(Value::as_bool) == Some(true);
    let ran = target
        .get("binary")
        .or_else(|| target.get("binary_tail"))
        .and_then(Value::as_str)?;
    // A script the kernel ran under another name (a link re-pointed
    // since): the interpreter, then the script, as the kernel ran them.
    let script = target
        .get("script")
        .and_then(Value::as_str)
        .filter(|s| *s != path);
    if ran == path && !deleted && script.is_none() {
        return None;
    }
    let mut shown = argument(ran, max);
    if deleted {
        shown.push_str(" (deleted)");
    }
    if let Some(script) = script {
        shown.push(' ');
        shown.push_str(&argument(script, max));
    }
    Some(shown)
}

/// `/bin/sh -c "make test"`: the name that was run, then argv[1..]; a cut
/// argv always says so.
pub(crate) fn exec_text(target: &Value, max: usize) -> String {
    let argv = target.get("argv").and_then(Value::as_array);
    let mut words: Vec<String> = Vec::new();
    match target.get("path").and_then(Value::as_str) {
        // argv[0] is whatever the caller chose; the path is what ran.
        Some(path) => {
            words.push(argument(path, max));
            if let Some(ran) = target
                .as_object()
                .and_then(|t| ran_other_than(t, path, max))
            {
                words.push(format!("[runs {ran}]"));
            }
            if let Some(a) = argv {
                words.extend(a.iter().skip(1).take(256).map(|v| match v.as_str() {
                    Some(s) => argument(s, max),
                    None => render("exec", "", v),
                }));
            }
        }
        None => match argv {
            Some(a) if !a.is_empty() => {
                words.extend(a.iter().take(256).map(|v| match v.as_str() {
                    Some(s) => argument(s, max),
                    None => render("exec", "", v),
                }))
            }
            _ => return render_target("exec", target),
        },
    }
    let shown = argv.map_or(0, |a| a.len().min(256));
    let argc = target.get("argc").and_then(Value::as_u64);
    let truncated = target.get("argv_truncated").and_then(Value::as_bool) == Some(true)
        || argv.is_some_and(|a| a.len() > 256);
    if truncated {
        match argc {
            Some(n) => words.push(format!("[ARGV TRUNCATED: {shown} of {n} arguments shown]")),
            None => words.push("[ARGV TRUNCATED]".to_string()),
        }
    }
    if target.get("argv_unreadable").and_then(Value::as_bool) == Some(true) {
        words.push("[ARGV UNREADABLE]".to_string());
    }
    words.join(" ")
}
