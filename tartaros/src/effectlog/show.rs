//! `tartaros log show`: a readable timeline or process tree, streamed with
//! bounded memory. It verifies first and prints a warning line before
//! anything else when the log does not verify; a damaged line is shown as
//! such and the rest still prints. Every string from the log is escaped
//! ([`super::escape`]) and cut to a bounded length.

pub(crate) mod filter;
pub(crate) mod lines;
pub(crate) mod names;
pub(crate) mod policy;
pub(crate) mod render;
pub(crate) mod tree;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value};

pub use filter::{Filter, FilterError, TimeBound, expand_kinds, glob_match, parse_time};
use lines::{Line, Lines};
use policy::PolicyView;
use tree::Tree;

use super::source::{LogFile, settle};
use super::{LogError, VERDICT_OK, Verdict, escape};

/// What [`show`] prints. A record is shown when it matches every filter;
/// `gap` records are shown whatever the filters, so a filtered view never
/// hides that events were lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShowOptions {
    pub filter: Filter,
    /// One JSON record per line (the log's own records, bidi and invisible
    /// characters `\u`-escaped), for jq and log shippers.
    pub json: bool,
    /// The process tree; with filters, only processes with matching
    /// records (and their ancestors), each with those records under it.
    /// `filter.pid` selects the subtree rooted at that process.
    pub tree: bool,
    /// The head the run printed: a log with another seal is tampered.
    pub head: Option<String>,
}

/// Records held back to put them in time order: proxy and broker records
/// are written when their connection ends, after records of later effects.
const REORDER_WINDOW: usize = 1024;

/// Prints the log at `path` to `out` as `opts` says and returns the log's
/// [`Verdict`] (the exit code of `show` is its `code`).
pub fn show(path: &Path, opts: &ShowOptions, out: &mut dyn Write) -> Result<Verdict, LogError> {
    let log = LogFile::open(path)?.expecting(opts.head.as_deref());
    let (verdict, verified) = log.verify()?;
    if verdict.code != VERDICT_OK {
        warn(&verdict, opts, out)?;
    }
    let read_err = |source| log.read_err(source);
    let mut lines = Lines::new(log.pass()?);
    let mut tree = Tree::default();
    let mut base: Option<i128> = None;
    let mut policy: Option<PolicyView> = None;
    let mut pending: BinaryHeap<Reverse<(i128, u64, String)>> = BinaryHeap::new();
    let tree_filter = Filter {
        pid: None,
        ..opts.filter.clone()
    };
    while let Some(line) = lines.next_line().map_err(read_err)? {
        let lineno = lines.lineno;
        let rec = match line {
            Line::Record(rec) => rec,
            Line::Unreadable(why) => {
                if !opts.tree && !opts.json {
                    flush_pending(&mut pending, 0, out)?;
                    writeln!(out, "line {lineno}: (not a readable record: {why})")
                        .map_err(out_err)?;
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
        let start = render::start_ns(&rec).map(i128::from);
        let rel = start.zip(base).map(|(m, b)| m - b);
        let is_gap = rec.get("kind").and_then(Value::as_str) == Some("gap");
        if opts.tree {
            if let Some(i) = tree.add(&rec)
                && !tree_filter.is_empty()
                && tree_filter.matches(&rec, rel)
            {
                tree.add_match(i, &rec, rel);
            }
            continue;
        }
        if !(is_gap || opts.filter.matches(&rec, rel)) {
            continue;
        }
        if opts.json {
            writeln!(out, "{}", json_line(&rec)).map_err(out_err)?;
            continue;
        }
        let text = render::timeline_line(&rec, rel, policy.as_ref());
        pending.push(Reverse((rel.unwrap_or(i128::MAX), lineno, text)));
        flush_pending(&mut pending, REORDER_WINDOW, out)?;
    }
    if opts.tree {
        tree.print(opts.filter.pid.map(u64::from), !tree_filter.is_empty(), out)
            .map_err(out_err)?;
    } else {
        flush_pending(&mut pending, 0, out)?;
    }
    let shown = log.finish(lines.into_inner())?;
    let settled = settle(verdict.clone(), verified, shown);
    if settled != verdict {
        // The timeline streams, so this can only come last; the exit code
        // says it too.
        warn(&settled, opts, out)?;
    }
    out.flush().map_err(out_err)?;
    Ok(settled)
}

/// Writes the warning line for a log that does not verify.
fn warn(verdict: &Verdict, opts: &ShowOptions, out: &mut dyn Write) -> Result<(), LogError> {
    let warning = warning_line(verdict);
    if opts.json {
        // Standard output stays pure JSON lines.
        let _ = writeln!(std::io::stderr(), "{warning}");
    } else {
        writeln!(out, "{warning}").map_err(out_err)?;
    }
    Ok(())
}

/// The first line of every reader's output when the log does not verify.
pub(crate) fn warning_line(verdict: &Verdict) -> String {
    let what = match verdict.code {
        1 => "this log has been TAMPERED with; nothing in it can be trusted",
        2 => "this log is UNSEALED or cut short; the run's end is missing",
        _ => "this log is INCOMPLETE; some effects are missing",
    };
    // The verdict's message is already escaped by the verifier; escaping
    // again would double its backslashes.
    format!(
        "WARNING: {what} (log verify exit {}: {})",
        verdict.code, verdict.message
    )
}

fn flush_pending(
    pending: &mut BinaryHeap<Reverse<(i128, u64, String)>>,
    keep: usize,
    out: &mut dyn Write,
) -> Result<(), LogError> {
    while pending.len() > keep {
        if let Some(Reverse((_, _, line))) = pending.pop() {
            writeln!(out, "{line}").map_err(out_err)?;
        }
    }
    Ok(())
}

/// A record as one JSON line. serde_json escapes only C0 controls and
/// writes the rest raw; C1 controls (`\u{9b}` is a CSI), bidi and invisible
/// characters are `\u`-escaped too, so the line is the same JSON value and
/// still cannot drive or reorder what a terminal shows.
pub(crate) fn json_line(rec: &Map<String, Value>) -> String {
    let unsafe_char = |c: char| c.is_control() || escape::is_invisible(c);
    let raw = serde_json::to_string(rec).unwrap_or_default();
    if !raw.chars().any(unsafe_char) {
        return raw;
    }
    let mut out = String::with_capacity(raw.len() + 16);
    for c in raw.chars() {
        if unsafe_char(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn out_err(source: std::io::Error) -> LogError {
    LogError::Output { source }
}

#[cfg(test)]
mod tests;
