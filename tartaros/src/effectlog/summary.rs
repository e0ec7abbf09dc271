//! `tartaros log summary`: what a reviewer asks first, from one streamed
//! pass over the log. Can the log be trusted (the verify verdict)? What did
//! the run change (files with their final size and SHA-256 from the seal)?
//! Where did it connect (destinations, allowed and refused, bytes)? What
//! did it try that the sandbox refused (by mechanism, with the process, its
//! command line and ancestry)? Every table is bounded; what did not fit is
//! counted.

mod files;
mod print;
mod rank;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

pub(crate) use print::runs_on_host;
pub use print::summary_text;

use super::show::lines::{Line, Lines};
use super::show::names::{self, Mechanism, Outcome};
use super::show::policy::PolicyView;
use super::show::render::{self, text};
use super::show::tree::{SANDBOX_INIT, Tree};
use super::source::{LogFile, PassDigest, settle};
use super::{LogError, Verdict};
use files::Files;
use rank::Programs;

/// Distinct entries kept per table; more are counted in `*_more`.
const MAX_DESTINATIONS: usize = 10_000;
/// Destinations reached or that moved bytes, kept past
/// [`MAX_DESTINATIONS`]: refused decoys first filled the table.
const MAX_REACHED_PAST: usize = 1_000;
const MAX_REFUSALS: usize = 10_000;
/// Refusals by a deny rule of the policy kept past [`MAX_REFUSALS`].
const MAX_DENIED_PAST: usize = 1_000;
const MAX_STRING: usize = 1024;
const ANCESTORS: usize = 4;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `log verify`'s exit code and line.
    pub verify_code: u8,
    pub verify: String,
    pub run: Run,
    /// Whether the seal lists the changed files with their hashes.
    pub seal_has_files: bool,
    /// Changed files: what git runs, then the tree's own files the run
    /// changed, then the uncertain, then those it created; by path within.
    pub files: Vec<FileChange>,
    pub files_more: u64,
    pub destinations: Vec<Destination>,
    pub destinations_more: u64,
    pub refusals: Vec<Refusal>,
    pub refusals_more: u64,
    /// Ordinary failures (not refusals) by errno name.
    pub failures: BTreeMap<String, u64>,
    pub processes: Processes,
    /// Records of each kind, as read.
    pub counts: BTreeMap<String, u64>,
    /// Lines that are not readable records.
    pub unreadable_lines: u64,
    /// Sum of the gap records' counts.
    pub lost: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Run {
    pub version: Option<String>,
    pub kernel: Option<String>,
    pub installed: Vec<String>,
    pub degraded: Vec<String>,
    pub writable_roots: Vec<String>,
    /// The run's own tmpfs mounts (the private `/tmp`, `--tmpfs`): what
    /// was written there was discarded with the run (adversarial round
    /// 22: their files showed as changes beside the roots' own).
    pub discarded: Vec<String>,
    pub exit: Option<String>,
    pub duration_ms: Option<u64>,
    pub cgroup_empty: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileChange {
    pub path: String,
    /// `created` (`O_EXCL`, mkdir, symlink, link), `written` (opened with
    /// `O_CREAT` but not `O_EXCL`: created or changed, the record cannot
    /// tell), `modified`, `deleted`, `renamed`, `exchanged` (one side of a
    /// `RENAME_EXCHANGE`: `renamed_from` is the other name, whose file it now
    /// holds) or `seal-only` (in the seal's list, with no record of the
    /// change). A `RENAME_WHITEOUT`'s old name is `created` (`whiteout`).
    pub change: &'static str,
    /// What was done, in order: `create`, `append`, `overwrite`, `write`,
    /// `truncate`, `chmod 0755`, `chown`, `mkdir`, `symlink`, `link`,
    /// `delete`, `rename` (deduplicated); `claimed chmod 0755` where no
    /// notification proved the agent's name (the kernel may have changed
    /// another file: a symlink's target).
    pub actions: Vec<String>,
    pub renamed_from: Option<String>,
    pub size: Option<u64>,
    pub sha256: Option<String>,
    /// Why the seal has no hash for it (e.g. `too large`).
    pub skipped: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Destination {
    /// `connect`, `sendto`, `proxy`, `broker` or `relay` (`--port`).
    pub via: String,
    pub dest: String,
    pub allowed: u64,
    pub refused: u64,
    pub failed: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub mechanism: &'static str,
    pub kind: String,
    pub target: String,
    /// Errno name, or null for a proxy / broker refusal.
    pub errno: Option<String>,
    /// For a filesystem refusal: the policy rule that explains it, or that
    /// none does (then the EACCES came from file permissions).
    pub why: Option<String>,
    pub count: u64,
    pub pid: Option<u64>,
    /// The process's command line (its latest exec before the refusal).
    pub command: Option<String>,
    /// Parents, nearest first: `pid command`.
    pub ancestry: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Processes {
    pub processes: u64,
    pub execs: u64,
    pub max_depth: u64,
    /// Programs run: those outside the system's directories first (fewest
    /// runs first), then the system's tools, most run first.
    pub programs: Vec<(String, u64)>,
    /// Programs left out of `programs`, and execs of programs not tracked.
    pub programs_more: u64,
    /// The first process's command line.
    pub first: Option<String>,
}

/// Reads and summarizes the log at `path`.
/// `head`: the head the run printed; a log with another seal is tampered.
pub fn summarize(path: &Path, head: Option<&str>) -> Result<Summary, LogError> {
    Ok(summarize_log(&LogFile::open(path)?.expecting(head))?.0)
}

/// Summarizes `log` from the bytes its verify pass read (the verdict says
/// otherwise when they changed), and returns that pass's digest for the
/// report's own pass.
pub(crate) fn summarize_log(log: &LogFile) -> Result<(Summary, PassDigest), LogError> {
    let (verdict, verified) = log.verify()?;
    let mut lines = Lines::new(log.pass()?);
    let mut c = Collector::new(verdict);
    while let Some(line) = lines.next_line().map_err(|e| log.read_err(e))? {
        match line {
            Line::Record(rec) => c.add(&rec),
            Line::Unreadable(_) => c.unreadable += 1,
        }
    }
    let shown = log.finish(lines.into_inner())?;
    c.verdict = settle(c.verdict, verified, shown);
    Ok((c.finish(), verified))
}

/// The summary as one JSON object (for `--json`).
pub fn summary_json(s: &Summary) -> String {
    serde_json::to_string_pretty(s).unwrap_or_else(|_| "{}".to_string())
}

/// A refusal is counted once per process and program: the tree's node (a
/// pid reused after an exit is a new node) and the command it ran then. A
/// key of the pid alone counted a later process's refusals, and those made
/// after an exec, under the first command seen (`×2 by 11 evil`).
type RefusalKey = (
    Mechanism,
    String,
    String,
    Option<String>,
    Option<u64>,
    Option<usize>,
    Option<String>,
);

struct Collector {
    verdict: Verdict,
    run: Run,
    genesis_mono: Option<u64>,
    policy: Option<PolicyView>,
    tree: Tree,
    files: Files,
    seal_files: Option<Vec<Value>>,
    dests: HashMap<(String, String), Destination>,
    dests_more: u64,
    refusals: HashMap<RefusalKey, Refusal>,
    refusal_order: Vec<RefusalKey>,
    refusals_more: u64,
    failures: BTreeMap<String, u64>,
    programs: Programs,
    execs: u64,
    counts: BTreeMap<String, u64>,
    unreadable: u64,
    lost: u64,
}

fn s_of(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(|s| text(s, MAX_STRING))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|s| text(s, MAX_STRING))
                .collect()
        })
        .unwrap_or_default()
}

impl Collector {
    fn new(verdict: Verdict) -> Self {
        Self {
            verdict,
            run: Run::default(),
            genesis_mono: None,
            policy: None,
            tree: Tree::default(),
            files: Files::default(),
            seal_files: None,
            dests: HashMap::new(),
            dests_more: 0,
            refusals: HashMap::new(),
            refusal_order: Vec::new(),
            refusals_more: 0,
            failures: BTreeMap::new(),
            programs: Programs::default(),
            execs: 0,
            counts: BTreeMap::new(),
            unreadable: 0,
            lost: 0,
        }
    }

    fn add(&mut self, rec: &Map<String, Value>) {
        let kind = rec.get("kind").and_then(Value::as_str).unwrap_or("?");
        if self.counts.len() < 256 || self.counts.contains_key(kind) {
            *self.counts.entry(text(kind, 64)).or_insert(0) += 1;
        }
        let target = rec.get("target").and_then(Value::as_object);
        match kind {
            "genesis" => self.genesis(rec),
            "seal" => self.seal(rec),
            "gap" => {
                let n = rec.get("count").and_then(Value::as_u64).unwrap_or(0);
                self.lost = self.lost.saturating_add(n);
            }
            _ => {}
        }
        let node = self.tree.add(rec);
        if kind == "exec" && rec.get("decision").and_then(Value::as_str) == Some("allowed") {
            self.execs += 1;
            let init = node.is_some_and(|i| self.tree.is_init(i));
            if let Some(p) = target.and_then(|t| t.get("path")).and_then(Value::as_str)
                && !init
            {
                // The name run, and what the kernel ran where that differs.
                let name = match target.and_then(|t| render::ran_other_than(t, p, 256)) {
                    Some(ran) => format!("{} -> {ran}", render::argument(p, 256)),
                    None => render::argument(p, 256),
                };
                // A common tool by name and by what the kernel ran (a
                // link in /usr/bin to the agent's file is not one).
                let at = |k: &str| target.and_then(|t| t.get(k));
                let binary = at("binary").or(at("binary_tail")).and_then(Value::as_str);
                let common = rank::common_tool(p)
                    && at("binary_deleted").is_none()
                    && binary.is_none_or(rank::common_tool);
                self.programs.add(name, common);
            }
        }
        let Some(t) = target else {
            return;
        };
        let outcome = names::outcome(rec);
        if outcome == Outcome::Allowed {
            self.files.effect(kind, t);
        }
        self.destination(kind, t, outcome);
        match outcome {
            Outcome::Refused(m) => self.refusal(m, kind, rec, t, node),
            Outcome::Failed => {
                let errno = rec.get("errno").and_then(Value::as_u64).unwrap_or(0);
                *self.failures.entry(names::errno(errno)).or_insert(0) += 1;
            }
            Outcome::Allowed => {}
        }
    }

    fn genesis(&mut self, rec: &Map<String, Value>) {
        self.run.version = s_of(rec.get("version"));
        self.run.kernel = s_of(rec.get("kernel"));
        let g = rec.get("guarantees");
        self.run.installed = strings(g.and_then(|g| g.get("installed")));
        self.run.degraded = strings(g.and_then(|g| g.get("degraded")));
        let roots = rec.get("policy").and_then(|p| p.get("writable_roots"));
        self.run.writable_roots = strings(roots);
        let policy = rec.get("policy");
        if policy
            .and_then(|p| p.get("private_tmp"))
            .and_then(Value::as_bool)
            == Some(true)
        {
            self.run.discarded.push("/tmp".into());
        }
        self.run
            .discarded
            .extend(strings(policy.and_then(|p| p.get("tmpfs"))));
        self.files.set_roots(
            roots
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str),
        );
        self.genesis_mono = rec.get("mono_ns").and_then(Value::as_u64);
        self.policy = PolicyView::from_genesis(rec);
    }

    fn seal(&mut self, rec: &Map<String, Value>) {
        self.run.exit = rec.get("exit_status").map(render::exit_text);
        self.run.cgroup_empty = rec.get("cgroup_empty").and_then(Value::as_bool);
        if let (Some(end), Some(start)) = (
            rec.get("mono_ns").and_then(Value::as_u64),
            self.genesis_mono,
        ) {
            self.run.duration_ms = Some(end.saturating_sub(start) / 1_000_000);
        }
        self.seal_files = rec.get("files").and_then(Value::as_array).cloned();
    }

    fn destination(&mut self, kind: &str, t: &Map<String, Value>, outcome: Outcome) {
        let str_of = |k: &str| t.get(k).and_then(Value::as_str);
        let num = |k: &str| t.get(k).and_then(Value::as_u64);
        let (via, dest) = match kind {
            "connect" | "sendto" => {
                if let Some(d) = str_of("dest") {
                    ("relay".to_string(), d.to_string())
                } else if t.get("socket").is_some() || t.get("addr_unused").is_some() {
                    // A send on a connected socket went to its peer, which
                    // its connect record names.
                    return;
                } else if t.get("transparent").is_some() {
                    // Sent to the transparent proxy: its record names
                    // where the connection went, if anywhere.
                    return;
                } else if str_of("family") == Some("unspec") && outcome == Outcome::Allowed {
                    // `connect(AF_UNSPEC)` dissolves an association.
                    return;
                } else {
                    let port = num("port").map(|p| format!(":{p}")).unwrap_or_default();
                    match (str_of("family"), str_of("addr"), str_of("path")) {
                        (Some("inet6"), Some(a), _) => (kind.to_string(), format!("[{a}]{port}")),
                        (_, Some(a), _) => (kind.to_string(), format!("{a}{port}")),
                        (_, None, Some(p)) => (kind.to_string(), format!("unix:{p}")),
                        _ => (kind.to_string(), "?".to_string()),
                    }
                }
            }
            "proxy" => {
                let port = num("port").map(|p| format!(":{p}")).unwrap_or_default();
                (
                    "proxy".to_string(),
                    format!("{}{port}", str_of("host").unwrap_or("?")),
                )
            }
            "broker" => {
                let host = str_of("host").or(str_of("capability")).unwrap_or("?");
                ("broker".to_string(), host.to_string())
            }
            _ => return,
        };
        let key = (via, text(&dest, 256));
        if !self.dests.contains_key(&key) {
            let bytes = num("bytes_up").unwrap_or(0) + num("bytes_down").unwrap_or(0);
            let room = if rank::reached(outcome == Outcome::Allowed, bytes) {
                MAX_DESTINATIONS + MAX_REACHED_PAST
            } else {
                MAX_DESTINATIONS
            };
            if self.dests.len() >= room {
                self.dests_more += 1;
                return;
            }
            self.dests.insert(
                key.clone(),
                Destination {
                    via: key.0.clone(),
                    dest: key.1.clone(),
                    allowed: 0,
                    refused: 0,
                    failed: 0,
                    bytes_up: 0,
                    bytes_down: 0,
                },
            );
        }
        if let Some(d) = self.dests.get_mut(&key) {
            match outcome {
                Outcome::Allowed => d.allowed += 1,
                Outcome::Refused(_) => d.refused += 1,
                Outcome::Failed => d.failed += 1,
            }
            d.bytes_up = d.bytes_up.saturating_add(num("bytes_up").unwrap_or(0));
            d.bytes_down = d.bytes_down.saturating_add(num("bytes_down").unwrap_or(0));
        }
    }

    fn refusal(
        &mut self,
        m: Mechanism,
        kind: &str,
        rec: &Map<String, Value>,
        t: &Map<String, Value>,
        node: Option<usize>,
    ) {
        let errno = rec.get("errno").and_then(Value::as_u64).filter(|&e| e != 0);
        let errno = errno.map(names::errno);
        // Records of the proxy and broker may not know the pid (0).
        let pid = rec.get("pid").and_then(Value::as_u64).filter(|&p| p != 0);
        let shown = render::kind_label(rec);
        let target = text(&render::render_target(kind, &Value::Object(t.clone())), 512);
        let nodes = self.tree.nodes();
        let command = node.and_then(|i| nodes[i].program.clone());
        let key = (
            m,
            shown.clone(),
            target.clone(),
            errno.clone(),
            pid,
            node,
            command.clone(),
        );
        if let Some(r) = self.refusals.get_mut(&key) {
            r.count += 1;
            return;
        }
        let why = match (m, &self.policy) {
            (Mechanism::Filesystem, Some(p)) => {
                let errno = rec.get("errno").and_then(Value::as_u64).unwrap_or(0);
                Some(p.reason(kind, t, errno))
            }
            _ => None,
        };
        let room = if refusal_rank(why.as_deref()) == 0 {
            MAX_REFUSALS + MAX_DENIED_PAST
        } else {
            MAX_REFUSALS
        };
        if self.refusals.len() >= room {
            self.refusals_more += 1;
            return;
        }
        let mut ancestry = Vec::new();
        let mut up = node.and_then(|i| nodes[i].parent);
        while let Some(p) = up {
            if ancestry.len() == ANCESTORS {
                ancestry.push("…".to_string());
                break;
            }
            let cmd = nodes[p].program.as_deref().unwrap_or("(no exec)");
            ancestry.push(format!("{} {cmd}", nodes[p].pid));
            up = nodes[p].parent;
        }
        self.refusal_order.push(key.clone());
        self.refusals.insert(
            key,
            Refusal {
                mechanism: m.as_str(),
                kind: shown,
                target,
                errno,
                why,
                count: 1,
                pid,
                command,
                ancestry,
            },
        );
    }

    fn finish(mut self) -> Summary {
        let seal_has_files = self.seal_files.is_some();
        let (files, files_more) = self
            .files
            .finish(self.seal_files.take().unwrap_or_default());
        let mut destinations: Vec<Destination> = self.dests.into_values().collect();
        rank::sort_destinations(&mut destinations);
        let mut refusals: Vec<Refusal> = Vec::new();
        for key in &self.refusal_order {
            if let Some(r) = self.refusals.remove(key) {
                refusals.push(r);
            }
        }
        refusals.sort_by_key(|r| {
            let mechanism = Mechanism::ALL
                .iter()
                .position(|m| m.as_str() == r.mechanism);
            (mechanism, refusal_rank(r.why.as_deref()))
        });
        let (programs, programs_more) = self.programs.finish();
        let nodes = self.tree.nodes();
        let processes = Processes {
            processes: nodes.len() as u64,
            execs: self.execs,
            max_depth: self.tree.depths().into_iter().max().unwrap_or(0) as u64,
            programs,
            programs_more,
            first: nodes
                .iter()
                .filter_map(|n| n.program.as_deref())
                .find(|p| *p != SANDBOX_INIT)
                .map(str::to_string),
        };
        Summary {
            verify_code: self.verdict.code,
            verify: self.verdict.message,
            run: self.run,
            seal_has_files,
            files,
            files_more,
            destinations,
            destinations_more: self.dests_more,
            refusals,
            refusals_more: self.refusals_more,
            failures: self.failures,
            processes,
            counts: self.counts,
            unreadable_lines: self.unreadable,
            lost: self.lost,
        }
    }
}

/// Where a refusal goes in its mechanism's list (which shows six): one by
/// a deny rule of the policy first (the policy named the path as
/// off-limits, and the agent tried it), one no rule explains last (a
/// file's own modes: a shell's PATH search through `/root`), the rest in
/// between, each in the order they came. In the order they came alone,
/// six refused writes outside the roots hid a refused read of a denied
/// secret behind `… and N more kinds of refusal`.
fn refusal_rank(why: Option<&str>) -> u8 {
    match why {
        Some(w) if w.starts_with("read_denies ") || w.starts_with("write_denies ") => 0,
        Some(w) if w.starts_with("no policy rule") => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_r20;
