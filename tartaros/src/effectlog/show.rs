//! `tartaros log show`: a readable timeline or process tree. It does not
//! verify (run `log verify` for that) and is best-effort on a damaged file:
//! an unreadable line is shown as such and the rest still prints.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use serde_json::{Map, Value};

use super::{LogError, MAX_LINE_BYTES};

/// Filters for [`show`]. A record is shown when it matches every filter set.
/// With `tree`, `kind` and `denied` are ignored and `pid` selects the subtree
/// rooted at that process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShowOptions {
    /// Only records of this kind (`exec`, `open`, `gap`, ...).
    pub kind: Option<String>,
    /// Only denied effects.
    pub denied: bool,
    /// Only records of this process.
    pub pid: Option<u32>,
    /// Print the process tree instead of the timeline.
    pub tree: bool,
}

/// Prints the log at `path` to `out`: one line per record (ms since genesis,
/// pid, kind, target, decision with the errno name when denied), or with
/// `opts.tree` the process tree built from fork / exec / exit records.
pub fn show(path: &Path, opts: &ShowOptions, out: &mut dyn Write) -> Result<(), LogError> {
    let read_err = |source| LogError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(read_err)?);
    let mut tree = Tree::default();
    let mut base: Option<i128> = None;
    let mut buf = Vec::new();
    let mut lineno = 0u64;
    loop {
        buf.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(read_err)?;
        if n == 0 {
            break;
        }
        lineno += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let record = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|v| v.as_object().cloned());
        let Some(rec) = record else {
            if !opts.tree {
                writeln!(out, "line {lineno}: (not a readable record)").map_err(out_err)?;
            }
            continue;
        };
        let mono = rec.get("mono_ns").and_then(Value::as_u64).map(i128::from);
        if base.is_none() {
            base = mono;
        }
        if opts.tree {
            tree.add(&rec);
        } else if matches(&rec, opts) {
            let line = timeline_line(&rec, mono.zip(base).map(|(m, b)| m - b));
            writeln!(out, "{line}").map_err(out_err)?;
        }
    }
    if opts.tree {
        tree.print(opts.pid.map(u64::from), out).map_err(out_err)?;
    }
    Ok(())
}

fn out_err(source: std::io::Error) -> LogError {
    LogError::Output { source }
}

fn matches(rec: &Map<String, Value>, opts: &ShowOptions) -> bool {
    if let Some(k) = &opts.kind
        && rec.get("kind").and_then(Value::as_str) != Some(k.as_str())
    {
        return false;
    }
    if opts.denied && rec.get("decision").and_then(Value::as_str) != Some("denied") {
        return false;
    }
    if let Some(p) = opts.pid
        && rec.get("pid").and_then(Value::as_u64) != Some(u64::from(p))
    {
        return false;
    }
    true
}

fn timeline_line(rec: &Map<String, Value>, rel_ns: Option<i128>) -> String {
    let time = rel_ns.map_or_else(|| "?".to_string(), format_ms);
    let pid = rec
        .get("pid")
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_string(), |p| p.to_string());
    let kind = rec.get("kind").and_then(Value::as_str).unwrap_or("?");
    let what = match kind {
        "genesis" => genesis_summary(rec),
        "gap" => format!(
            "{} {} events lost",
            rec.get("count").and_then(Value::as_u64).unwrap_or(0),
            sanitize(rec.get("lost_kind").and_then(Value::as_str).unwrap_or("?"))
        ),
        "seal" => seal_summary(rec),
        _ => {
            let target = rec
                .get("target")
                .map_or_else(String::new, |t| describe(kind, t));
            format!("{target}  {}", decision(rec))
        }
    };
    format!("{time:>12} {pid:>7} {:<8} {what}", sanitize(kind))
}

fn format_ms(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}ms", a / 1_000_000, (a % 1_000_000) / 1_000)
}

fn decision(rec: &Map<String, Value>) -> String {
    match rec.get("decision").and_then(Value::as_str) {
        Some("denied") => {
            let errno = rec.get("errno").and_then(Value::as_u64).unwrap_or(0);
            if errno == 0 {
                "denied".to_string()
            } else {
                format!("denied ({})", errno_name(errno))
            }
        }
        Some(d) => sanitize(d),
        None => "?".to_string(),
    }
}

fn errno_name(errno: u64) -> String {
    match i32::try_from(errno).map(nix::errno::Errno::from_raw) {
        Ok(e) if e != nix::errno::Errno::UnknownErrno => format!("{e:?}"),
        _ => format!("errno {errno}"),
    }
}

fn genesis_summary(rec: &Map<String, Value>) -> String {
    let s = |k: &str| sanitize(rec.get(k).and_then(Value::as_str).unwrap_or("?"));
    let g = rec.get("guarantees");
    let list = |k: &str| g.and_then(|g| g.get(k)).map_or_else(String::new, render);
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
    format!("{status}, {lost} events lost, {empty}")
}

fn exit_text(v: &Value) -> String {
    if let Some(c) = v.get("code").and_then(Value::as_i64) {
        format!("exit code {c}")
    } else if let Some(s) = v.get("signal").and_then(Value::as_i64) {
        format!("killed by signal {s}")
    } else {
        format!("exit {}", render(v))
    }
}

fn describe(kind: &str, target: &Value) -> String {
    match kind {
        "exec" => exec_text(target),
        "exit" => exit_text(target),
        "fork" => match target.get("child").and_then(Value::as_u64) {
            Some(c) => format!("child {c}"),
            None => render_target(target),
        },
        _ => render_target(target),
    }
}

/// Keys a reader looks for first; the rest follow in name order.
const LEADING_KEYS: &[&str] = &[
    "path", "from", "to", "target", "method", "host", "addr", "port",
];

/// `{"path": "/x"}` prints as `/x`; several fields as `k=v k=v`, the
/// important ones first, values with spaces quoted.
fn render_target(v: &Value) -> String {
    match v.as_object() {
        Some(m) if m.len() == 1 => m.values().map(render).collect(),
        Some(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            let rank = |k: &str| LEADING_KEYS.iter().position(|x| *x == k);
            entries.sort_by_key(|(k, _)| (rank(k).unwrap_or(usize::MAX), k.as_str()));
            entries
                .iter()
                .map(|(k, v)| {
                    let text = render(v);
                    if text.is_empty() || text.contains(char::is_whitespace) {
                        format!("{}={text:?}", sanitize(k))
                    } else {
                        format!("{}={text}", sanitize(k))
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
        None => render(v),
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => sanitize(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(render).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(_) => format!("{{{}}}", render_target(v)),
        other => other.to_string(),
    }
}

/// Paths and argv come from the agent: escape control characters and bidi
/// overrides so a file name cannot rewrite the reviewer's terminal.
fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Default)]
struct Tree {
    nodes: Vec<Proc>,
    // pid -> newest node with that pid (pids are reused over a long run).
    live: HashMap<u64, usize>,
}

struct Proc {
    pid: u64,
    ppid: Option<u64>,
    parent: Option<usize>,
    children: Vec<usize>,
    execs: Vec<String>,
    exit: Option<String>,
}

impl Tree {
    fn add(&mut self, rec: &Map<String, Value>) {
        let (Some(pid), Some(kind)) = (
            rec.get("pid").and_then(Value::as_u64),
            rec.get("kind").and_then(Value::as_str),
        ) else {
            return;
        };
        let ppid = rec.get("ppid").and_then(Value::as_u64);
        let target = rec.get("target");
        match kind {
            "fork" => {
                let parent = self.node(pid, ppid);
                if let Some(child) = target.and_then(|t| t.get("child")).and_then(Value::as_u64) {
                    self.spawn(child, Some(pid), Some(parent));
                }
            }
            "exec" => {
                let i = self.node(pid, ppid);
                let what = target.map_or_else(String::new, exec_text);
                let what = match rec.get("decision").and_then(Value::as_str) {
                    Some("denied") => format!("{what} ({})", decision(rec)),
                    _ => what,
                };
                self.nodes[i].execs.push(what);
            }
            "exit" => {
                let i = self.node(pid, ppid);
                self.nodes[i].exit = Some(target.map_or_else(|| "?".to_string(), exit_text));
                // The pid is free again: its next use is a new process.
                self.live.remove(&pid);
            }
            _ => {}
        }
    }

    fn node(&mut self, pid: u64, ppid: Option<u64>) -> usize {
        match self.live.get(&pid) {
            Some(&i) => i,
            None => {
                let parent = ppid.and_then(|p| self.live.get(&p).copied());
                self.spawn(pid, ppid, parent)
            }
        }
    }

    fn spawn(&mut self, pid: u64, ppid: Option<u64>, parent: Option<usize>) -> usize {
        let i = self.nodes.len();
        self.nodes.push(Proc {
            pid,
            ppid,
            parent,
            children: Vec::new(),
            execs: Vec::new(),
            exit: None,
        });
        if let Some(p) = parent {
            self.nodes[p].children.push(i);
        }
        self.live.insert(pid, i);
        i
    }

    fn print(&self, only: Option<u64>, out: &mut dyn Write) -> std::io::Result<()> {
        let roots: Vec<usize> = match only {
            Some(pid) => (0..self.nodes.len())
                .filter(|&i| self.nodes[i].pid == pid)
                .collect(),
            None => (0..self.nodes.len())
                .filter(|&i| self.nodes[i].parent.is_none())
                .collect(),
        };
        for r in roots {
            self.print_node(r, 0, out)?;
        }
        Ok(())
    }

    fn print_node(&self, i: usize, depth: usize, out: &mut dyn Write) -> std::io::Result<()> {
        // An explicit stack would avoid deep recursion, but fork depth is
        // bounded by the sandbox's process limit, so recursion is fine.
        let p = &self.nodes[i];
        let parent = match (depth, p.ppid) {
            (0, Some(pp)) => format!(" (parent {pp})"),
            _ => String::new(),
        };
        let execs = if p.execs.is_empty() {
            "(no exec)".to_string()
        } else {
            p.execs.join(" ; ")
        };
        let exit = p.exit.as_deref().unwrap_or("no exit recorded");
        writeln!(
            out,
            "{:indent$}{}{parent}: {execs} [{exit}]",
            "",
            p.pid,
            indent = depth * 2
        )?;
        for &c in &p.children {
            self.print_node(c, depth + 1, out)?;
        }
        Ok(())
    }
}

fn exec_text(target: &Value) -> String {
    let argv: Vec<String> = target
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(render).collect())
        .unwrap_or_default();
    match target.get("path") {
        // argv[0] is whatever the caller chose; the path is what ran.
        Some(path) => std::iter::once(render(path))
            .chain(argv.into_iter().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        None if !argv.is_empty() => argv.join(" "),
        None => render_target(target),
    }
}

#[cfg(test)]
mod tests;
