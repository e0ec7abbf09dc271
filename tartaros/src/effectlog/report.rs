//! `tartaros log report FILE -o report.html`: one self-contained HTML page
//! (inline CSS and script, a Content-Security-Policy that forbids every
//! fetch and allows only those two blocks, by hash) with the verify status, the summary, a filterable timeline and
//! the process tree. Every string from the log is escaped for HTML; the
//! page's script only reads attributes the report wrote and toggles
//! `hidden`, so no log text is ever interpreted as markup or code.
//!
//! Filters can be set in the URL fragment, so a reviewer can link a view:
//! `report.html#outcome=refused&group=file&q=/etc&pid=12`.

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::escape::entities;
use super::show::lines::{Line, Lines};
use super::show::names::{self, FILE_KINDS, NET_KINDS, Outcome, PROC_KINDS};
use super::show::policy::PolicyView;
use super::show::render;
use super::show::tree::{MAX_INDENT, Tree};
use super::source::{LogFile, settle};
use super::summary::{runs_on_host, summarize_log, summary_text};
use super::{LogError, VERDICT_OK, Verdict};

/// Timeline rows and tree lines in one page, past which the page says it
/// was cut (a browser slows down with more; `log show` has everything).
const MAX_ROWS: usize = 20_000;
/// Rows kept past [`MAX_ROWS`] for what a reviewer filters for: refusals,
/// gaps, unreadable lines, the seal, and changes to what the reviewer's
/// own `git` runs (hooks, a repository's `config`: the summary lists them
/// first). Keeping only the first rows let an agent that made 20,000 files
/// first push every later refusal, and its hook's write, off the page.
const MAX_NOTABLE_ROWS: usize = 20_000;
/// Allowed network connections kept past [`MAX_ROWS`], with a bound of
/// their own so that they cannot crowd refusals off the page either: a
/// `--port` relay that carried data after 20,000 file records was on no
/// row (adversarial round 20).
const MAX_NET_ROWS: usize = 10_000;

/// What a row past [`MAX_ROWS`] may be kept as.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    /// Only within [`MAX_ROWS`].
    Ordinary,
    /// Refusals, gaps, the seal, what git runs: [`MAX_NOTABLE_ROWS`].
    Notable,
    /// An allowed connection: [`MAX_NET_ROWS`].
    Connection,
}

/// Rows kept past [`MAX_ROWS`], by bound.
#[derive(Default)]
struct PastCut {
    notable: usize,
    connections: usize,
}

impl PastCut {
    /// Whether one more row fits, counting it when it does.
    fn take(&mut self, rows: usize, keep: Keep) -> bool {
        if rows < MAX_ROWS {
            return true;
        }
        let (n, max) = match keep {
            Keep::Ordinary => return false,
            Keep::Notable => (&mut self.notable, MAX_NOTABLE_ROWS),
            Keep::Connection => (&mut self.connections, MAX_NET_ROWS),
        };
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }
}

/// Whether a file record names a file that git runs or obeys on the host.
fn names_what_git_runs(rec: &serde_json::Map<String, Value>) -> bool {
    let Some(target) = rec.get("target").and_then(Value::as_object) else {
        return false;
    };
    ["path", "from", "to", "written_as"]
        .iter()
        .filter_map(|k| target.get(*k).and_then(Value::as_str))
        .any(runs_on_host)
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Log(#[from] LogError),
    /// Writing the page over the log would destroy the evidence.
    #[error("failed to write the report: {} is the log itself; choose another -o path", crate::effectlog::escape::terminal(&path.to_string_lossy()))]
    SameFile { path: PathBuf },
    /// A link (planted beside the log: `run.html -> ~/.bashrc`), a device
    /// (`/dev/stdout`) or a directory: neither written through nor replaced.
    #[error("failed to write the report: {} exists and is not a regular file (a link?); remove it or choose another -o path", crate::effectlog::escape::terminal(&path.to_string_lossy()))]
    NotAFile { path: PathBuf },
    #[error("failed to write the report {}", crate::effectlog::escape::terminal(&path.to_string_lossy()))]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
.verdict{padding:.6em 1em;border-radius:4px;font-weight:600}
.ok{background:#e3f5e1;border:1px solid #5a5}.bad{background:#fde2e1;border:1px solid #c33}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%}td,th{padding:2px 6px;text-align:left;vertical-align:top;font-family:monospace;font-size:12px}
tr:nth-child(even){background:#fafafa}tr.refused td{background:#fde2e1}tr.failed td{color:#a60}
.controls{margin:.6em 0}.controls>*{margin-right:1em}.proc{font-family:monospace;font-size:12px;white-space:pre-wrap}";

const SCRIPT: &str = r#"(function(){
var rows=Array.prototype.slice.call(document.querySelectorAll('#records tr[data-kind]'));
var q=document.getElementById('q'),g=document.getElementById('group'),o=document.getElementById('outcome'),p=document.getElementById('pid');
function fromHash(){var h=new URLSearchParams(location.hash.replace(/^#/,''));
q.value=h.get('q')||'';g.value=h.get('group')||'';o.value=h.get('outcome')||'';p.value=h.get('pid')||'';}
function apply(){var n=0,t=q.value.toLowerCase();
rows.forEach(function(r){var ok=(!g.value||r.dataset.group===g.value)&&(!o.value||r.dataset.outcome===o.value)
&&(!p.value||r.dataset.pid===p.value)&&(!t||r.textContent.toLowerCase().indexOf(t)>=0);
r.hidden=!ok;if(ok)n++;});
var s=document.getElementById('shown');s.textContent=n+' of '+rows.length+' records shown';s.setAttribute('data-shown',String(n));}
[q,g,o,p].forEach(function(e){e.addEventListener('input',apply);});
window.addEventListener('hashchange',function(){fromHash();apply();});
fromHash();apply();})();"#;

fn group_of(kind: &str) -> &'static str {
    if FILE_KINDS.contains(&kind) {
        "file"
    } else if NET_KINDS.contains(&kind) {
        "net"
    } else if PROC_KINDS.contains(&kind) {
        "proc"
    } else {
        "log"
    }
}

/// Writes the report of the log at `log` to `out_path` (created or
/// replaced) and returns the log's verify code (against `head`, the head
/// the run printed, when given).
pub fn report(log: &Path, out_path: &Path, head: Option<&str>) -> Result<u8, ReportError> {
    if same_file(log, out_path) {
        return Err(ReportError::SameFile {
            path: out_path.to_path_buf(),
        });
    }
    if std::fs::symlink_metadata(out_path).is_ok_and(|m| !m.file_type().is_file()) {
        return Err(ReportError::NotAFile {
            path: out_path.to_path_buf(),
        });
    }
    let file = LogFile::open(log)?.expecting(head);
    let (mut summary, verified) = summarize_log(&file)?;
    let read_err = |source| file.read_err(source);
    let mut lines = Lines::new(file.pass()?);
    let mut rows: Vec<(i128, u64, String)> = Vec::new();
    let mut past_cut = PastCut::default();
    let mut total = 0u64;
    let mut tree = Tree::default();
    let mut base: Option<i128> = None;
    let mut policy: Option<PolicyView> = None;
    while let Some(line) = lines.next_line().map_err(read_err)? {
        let lineno = lines.lineno;
        total += 1;
        let rec = match line {
            Line::Record(rec) => rec,
            Line::Unreadable(why) => {
                if past_cut.take(rows.len(), Keep::Notable) {
                    let row = format!(
                        "<tr data-kind=\"unreadable\" data-group=\"log\" data-outcome=\"\" data-pid=\"\"><td></td><td></td><td>line {lineno}</td><td>(not a readable record: {why})</td><td></td></tr>"
                    );
                    rows.push((i128::MAX, lineno, row));
                }
                continue;
            }
        };
        if base.is_none() {
            base = rec.get("mono_ns").and_then(Value::as_u64).map(i128::from);
        }
        if rec.get("kind").and_then(Value::as_str) == Some("genesis") {
            policy = PolicyView::from_genesis(&rec);
        }
        tree.add(&rec);
        let kind = rec.get("kind").and_then(Value::as_str).unwrap_or("?");
        let outcome = match names::outcome(&rec) {
            Outcome::Allowed => "allowed",
            Outcome::Refused(_) => "refused",
            Outcome::Failed => "failed",
        };
        let outcome = if matches!(kind, "genesis" | "seal" | "gap") {
            ""
        } else {
            outcome
        };
        let keep = if outcome == "refused"
            || matches!(kind, "seal" | "gap")
            || (FILE_KINDS.contains(&kind) && names_what_git_runs(&rec))
        {
            Keep::Notable
        } else if outcome == "allowed" && matches!(kind, "connect" | "sendto" | "proxy" | "broker")
        {
            Keep::Connection
        } else {
            Keep::Ordinary
        };
        if !past_cut.take(rows.len(), keep) {
            continue;
        }
        let start = render::start_ns(&rec).map(i128::from);
        let rel = start.zip(base).map(|(m, b)| m - b);
        let pid = rec
            .get("pid")
            .and_then(Value::as_u64)
            .map_or_else(String::new, |p| p.to_string());
        // timeline_parts escapes for a terminal; entities() makes it HTML.
        let [time, _, label, what] = render::timeline_parts(&rec, rel, policy.as_ref());
        let row = format!(
            "<tr class=\"{outcome}\" data-kind=\"{}\" data-group=\"{}\" data-outcome=\"{outcome}\" data-pid=\"{pid}\"><td>{}</td><td>{pid}</td><td>{}</td><td>{}</td></tr>",
            entities(&render::text(kind, 64)),
            group_of(kind),
            entities(&time),
            entities(&label),
            entities(&what),
        );
        rows.push((rel.unwrap_or(i128::MAX), lineno, row));
    }
    rows.sort_by_key(|r| (r.0, r.1));
    let shown = file.finish(lines.into_inner())?;
    let verdict = Verdict {
        code: summary.verify_code,
        message: summary.verify.clone(),
    };
    let settled = settle(verdict, verified, shown);
    summary.verify_code = settled.code;
    summary.verify = settled.message;
    let mut tree_text = Vec::new();
    // An in-memory buffer: writing to it cannot fail.
    let _ = tree.print(None, false, &mut tree_text);
    let page = page(&summary, summary_text(&summary), &rows, total, &tree_text);
    replace_with(out_path, page.as_bytes()).map_err(|source| ReportError::Write {
        path: out_path.to_path_buf(),
        source,
    })?;
    Ok(summary.verify_code)
}

/// Puts `bytes` at `path` as a new file: written beside it under a fresh
/// name, then renamed over it. The report often goes next to the log it
/// was handed, where the sender may have left a link named like the report
/// to a file of the reviewer's (`run.html -> ~/.bashrc`): opening the path
/// for writing would follow it and overwrite that file. Such a path is
/// refused before ([`ReportError::NotAFile`]); a rename never follows a
/// link put there since.
fn replace_with(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    // O_EXCL: never a file or link already there.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let written = (|| {
        let mut out = BufWriter::new(file);
        out.write_all(bytes)?;
        out.flush()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Ours: created above.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The page's style: [`STYLE`] and one indentation class per tree level
/// (classes, not `style` attributes, so the policy can pin the one
/// stylesheet by its hash).
fn page_style() -> String {
    let mut style = STYLE.to_string();
    for d in 0..=MAX_INDENT {
        let _ = write!(style, "\n.d{d}{{padding-left:{}em}}", d * 2);
    }
    style
}

/// The Content-Security-Policy source of an inline block: only the page's
/// own style and script can run, even if a log string ever escaped its
/// escaping.
fn csp_hash(block: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(super::canonical::sha256(block.as_bytes()))
}

/// Whether both paths name one existing file (through links too).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn page(
    s: &super::Summary,
    summary: String,
    rows: &[(i128, u64, String)],
    total: u64,
    tree: &[u8],
) -> String {
    let mut h = String::with_capacity(64 * 1024 + rows.len() * 256);
    let style = page_style();
    let ok = s.verify_code == VERDICT_OK;
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-{}'; script-src 'sha256-{}'\">\
<title>TartarOS effect log report</title><style>{style}</style></head><body>\n\
<h1>TartarOS effect log report</h1>\n<p id=\"verdict\" class=\"verdict {}\" data-code=\"{}\">{}</p>\n",
        csp_hash(&style),
        csp_hash(SCRIPT),
        if ok { "ok" } else { "bad" },
        s.verify_code,
        entities(&if ok {
            format!("verify: {}", s.verify)
        } else {
            crate::effectlog::show::warning_line(&crate::effectlog::Verdict {
                code: s.verify_code,
                message: s.verify.clone(),
            })
        })
    );
    let _ = write!(
        h,
        "<h2>Summary</h2>\n<pre id=\"summary\">{}</pre>\n",
        entities(&summary)
    );
    let _ = write!(
        h,
        "<h2>Timeline</h2>\n<div class=\"controls\"><input id=\"q\" placeholder=\"text filter\">\
<select id=\"group\"><option value=\"\">all kinds</option><option value=\"file\">file</option>\
<option value=\"net\">net</option><option value=\"proc\">proc</option><option value=\"log\">log</option></select>\
<select id=\"outcome\"><option value=\"\">any outcome</option><option value=\"refused\">refused by the sandbox</option>\
<option value=\"failed\">ordinary failures</option><option value=\"allowed\">allowed</option></select>\
<input id=\"pid\" placeholder=\"pid\" size=\"7\"><span id=\"shown\" data-shown=\"\"></span></div>\n"
    );
    if total > rows.len() as u64 {
        let _ = writeln!(
            h,
            "<p class=\"bad\" id=\"cut\">The timeline shows {} of {total} lines: the first {MAX_ROWS}, then only refusals, gaps, changes to git hooks and configs, and the seal (up to {MAX_NOTABLE_ROWS} more) and allowed network connections (up to {MAX_NET_ROWS} more); run <code>tartaros log show</code> for all.</p>",
            rows.len()
        );
    }
    h.push_str("<table id=\"records\"><tr><th>time</th><th>pid</th><th>kind</th><th>effect and verdict</th></tr>\n");
    for (_, _, row) in rows {
        h.push_str(row);
        h.push('\n');
    }
    h.push_str("</table>\n<h2>Process tree</h2>\n<div id=\"tree\">\n");
    let tree = String::from_utf8_lossy(tree);
    for (n, line) in tree.lines().enumerate() {
        if n == MAX_ROWS {
            let _ = writeln!(
                h,
                "<p class=\"bad\">… the tree is cut here; run <code>tartaros log show --tree</code>.</p>"
            );
            break;
        }
        let spaces = line.len() - line.trim_start().len();
        let depth = (spaces / 2).min(MAX_INDENT);
        let _ = writeln!(
            h,
            "<div class=\"proc d{depth}\">{}</div>",
            entities(line.trim_start())
        );
    }
    let _ = write!(h, "</div>\n<script>{SCRIPT}</script>\n</body></html>\n");
    h
}

#[cfg(test)]
mod tests;
