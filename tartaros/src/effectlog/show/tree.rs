//! The process tree of a log, built from `fork` / `exec` / `exit` records
//! and printed without recursion: a fork chain 60,000 deep prints one short
//! line per process, indented by number (`[depth 60000]`) past
//! [`MAX_INDENT`] levels. Each process keeps a bounded number of execs and
//! matching records, so memory grows with processes, not with records.

use std::collections::HashMap;
use std::io::Write;

use serde_json::{Map, Value};

use super::policy::PolicyView;
use super::render::{self, exec_text, exit_text, format_ms, verdict};

/// Levels indented by spaces; deeper ones say their depth instead.
pub(crate) const MAX_INDENT: usize = 16;
const MAX_EXECS: usize = 2;
const MAX_MATCHES: usize = 10;
/// Matching records kept for the whole tree, past which only counts are.
const MAX_MATCHES_TOTAL: usize = 50_000;
const TREE_TEXT_CHARS: usize = 512;
/// What the sandbox's own init (PID 1 of the agent) is called.
pub(crate) const SANDBOX_INIT: &str = "(sandbox init)";

#[derive(Default)]
pub(crate) struct Tree {
    nodes: Vec<Proc>,
    // pid -> newest node with that pid (pids are reused over a long run).
    live: HashMap<u64, usize>,
    kept_matches: usize,
    /// The run's policy, from the genesis record.
    policy: Option<PolicyView>,
    /// Whether an allowed exec was seen: only the first can be the init's.
    exec_seen: bool,
    /// The sandbox's own init, when its exec is in the log.
    init: Option<usize>,
}

/// Whether an allowed exec is the sandbox init's: the log's first, with
/// exactly the init's arguments. Anything looser is the agent's to forge:
/// its own exec holding `__tartaros_sandbox_init` anywhere (a `sh -c`
/// string, a script of that name) was taken for the init and left out of
/// ancestries, `first:` and `ran:`.
pub(crate) fn is_init_exec(target: Option<&Value>, first: bool) -> bool {
    let argv = target.and_then(|t| t.get("argv")).and_then(Value::as_array);
    first && argv.is_some_and(|a| a.len() == 2 && a[1].as_str() == Some(crate::init::INIT_ARG))
}

pub(crate) struct Proc {
    pub(crate) pid: u64,
    ppid: Option<u64>,
    /// Always a smaller index: a parent exists before its children.
    pub(crate) parent: Option<usize>,
    children: Vec<usize>,
    pub(crate) execs: Vec<String>,
    pub(crate) exec_count: u64,
    /// The program it runs now: its latest allowed exec.
    pub(crate) program: Option<String>,
    exit: Option<String>,
    matches: Vec<String>,
    match_count: u64,
}

impl Tree {
    /// Adds the process facts of `rec`; returns the process's node.
    pub(crate) fn add(&mut self, rec: &Map<String, Value>) -> Option<usize> {
        if rec.get("kind").and_then(Value::as_str) == Some("genesis") {
            self.policy = PolicyView::from_genesis(rec);
        }
        let pid = rec.get("pid").and_then(Value::as_u64)?;
        let kind = rec.get("kind").and_then(Value::as_str)?;
        let ppid = rec.get("ppid").and_then(Value::as_u64);
        let target = rec.get("target");
        let i = self.node(pid, ppid);
        match kind {
            "fork" => {
                if let Some(child) = target.and_then(|t| t.get("child")).and_then(Value::as_u64) {
                    self.spawn(child, Some(pid), Some(i));
                }
            }
            "exec" => {
                let what = target.map_or_else(String::new, |t| exec_text(t, TREE_TEXT_CHARS));
                let p = &mut self.nodes[i];
                let denied = rec.get("decision").and_then(Value::as_str) == Some("denied");
                let first = !denied && !std::mem::replace(&mut self.exec_seen, true);
                let what = if denied {
                    format!("{what} ({})", verdict(rec, self.policy.as_ref()))
                } else if is_init_exec(target, first) {
                    self.init = Some(i);
                    p.program = Some(SANDBOX_INIT.to_string());
                    what
                } else {
                    p.program = Some(what.clone());
                    what
                };
                p.exec_count += 1;
                if p.execs.len() < MAX_EXECS {
                    p.execs.push(what);
                } else if let Some(last) = p.execs.last_mut() {
                    // Keep the first and the latest.
                    *last = what;
                }
            }
            "exit" => {
                self.nodes[i].exit = Some(target.map_or_else(|| "?".to_string(), exit_text));
                // The pid is free again: its next use is a new process.
                self.live.remove(&pid);
            }
            _ => {}
        }
        Some(i)
    }

    /// Whether node `i` is the sandbox's own init (see [`is_init_exec`]).
    pub(crate) fn is_init(&self, i: usize) -> bool {
        self.init == Some(i)
    }

    /// Remembers that a record of node `i` matched the filters.
    pub(crate) fn add_match(&mut self, i: usize, rec: &Map<String, Value>, rel: Option<i128>) {
        let p = &mut self.nodes[i];
        p.match_count += 1;
        if p.matches.len() < MAX_MATCHES && self.kept_matches < MAX_MATCHES_TOTAL {
            self.kept_matches += 1;
            let kind = render::kind_label(rec);
            let what = match rec.get("target") {
                Some(t) if kind == "exec" => exec_text(t, TREE_TEXT_CHARS),
                Some(t) => render::render_target(&kind, t),
                None => String::new(),
            };
            let what = render::text(&what, TREE_TEXT_CHARS * 2);
            let time = rel.map_or_else(|| "?".to_string(), format_ms);
            p.matches.push(format!(
                "{time} {kind} {what}  {}",
                verdict(rec, self.policy.as_ref())
            ));
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
        // A forked child runs its parent's program until it execs.
        let program = parent.and_then(|p| self.nodes[p].program.clone());
        self.nodes.push(Proc {
            pid,
            ppid,
            parent,
            children: Vec::new(),
            execs: Vec::new(),
            exec_count: 0,
            program,
            exit: None,
            matches: Vec::new(),
            match_count: 0,
        });
        if let Some(p) = parent {
            self.nodes[p].children.push(i);
        }
        self.live.insert(pid, i);
        i
    }

    pub(crate) fn nodes(&self) -> &[Proc] {
        &self.nodes
    }

    /// Depth of every node (roots are 0), in one pass.
    pub(crate) fn depths(&self) -> Vec<usize> {
        let mut d = vec![0usize; self.nodes.len()];
        for i in 0..self.nodes.len() {
            if let Some(p) = self.nodes[i].parent {
                d[i] = d[p] + 1;
            }
        }
        d
    }

    /// Prints the tree. `root_pid` selects the subtrees of that pid;
    /// `pruned` keeps only processes with matching records and their
    /// ancestors, each with its matching records under it.
    pub(crate) fn print(
        &self,
        root_pid: Option<u64>,
        pruned: bool,
        out: &mut dyn Write,
    ) -> std::io::Result<()> {
        let mut keep = vec![!pruned; self.nodes.len()];
        if pruned {
            for i in (0..self.nodes.len()).rev() {
                if self.nodes[i].match_count > 0 {
                    keep[i] = true;
                }
                if keep[i]
                    && let Some(p) = self.nodes[i].parent
                {
                    keep[p] = true;
                }
            }
        }
        let roots = (0..self.nodes.len()).filter(|&i| match root_pid {
            Some(pid) => self.nodes[i].pid == pid,
            None => self.nodes[i].parent.is_none(),
        });
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for r in roots {
            stack.push((r, 0));
            while let Some((i, depth)) = stack.pop() {
                if !keep[i] {
                    continue;
                }
                self.print_node(i, depth, out)?;
                for &c in self.nodes[i].children.iter().rev() {
                    stack.push((c, depth + 1));
                }
            }
        }
        Ok(())
    }

    fn print_node(&self, i: usize, depth: usize, out: &mut dyn Write) -> std::io::Result<()> {
        let p = &self.nodes[i];
        let parent = match (depth, p.ppid) {
            (0, Some(pp)) => format!(" (parent {pp})"),
            _ => String::new(),
        };
        let mut execs = if p.execs.is_empty() {
            "(no exec)".to_string()
        } else {
            p.execs.join(" ; ")
        };
        if p.exec_count > p.execs.len() as u64 {
            execs.push_str(&format!(
                " (+{} more execs)",
                p.exec_count - p.execs.len() as u64
            ));
        }
        let exit = p.exit.as_deref().unwrap_or("no exit recorded");
        let pad = indent(depth);
        writeln!(out, "{pad}{}{parent}: {execs} [{exit}]", p.pid)?;
        let inner = indent(depth + 1);
        for m in &p.matches {
            writeln!(out, "{inner}- {m}")?;
        }
        let more = p.match_count - p.matches.len() as u64;
        if more > 0 {
            writeln!(out, "{inner}- … {more} more matching records")?;
        }
        Ok(())
    }
}

/// Two spaces a level up to [`MAX_INDENT`], then the depth as a number.
pub(crate) fn indent(depth: usize) -> String {
    if depth <= MAX_INDENT {
        "  ".repeat(depth)
    } else {
        format!("{}[depth {depth}] ", "  ".repeat(MAX_INDENT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_first_exec_with_the_init_s_arguments_is_the_init() {
        let init =
            json!({"path": "/proc/self/exe", "argv": ["tartaros-init", crate::init::INIT_ARG]});
        assert!(is_init_exec(Some(&init), true));
        assert!(
            !is_init_exec(Some(&init), false),
            "a later exec is the agent's"
        );
        let script = json!({"argv": ["sh", crate::init::INIT_ARG, "x"]});
        assert!(!is_init_exec(Some(&script), true));
        let inside = json!({"argv": ["sh", format!("-c {}", crate::init::INIT_ARG)]});
        assert!(!is_init_exec(Some(&inside), true));
        assert!(!is_init_exec(None, true));
    }
}
