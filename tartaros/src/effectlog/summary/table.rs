//! The summary's file table: entries by path, held as a tree of the
//! paths' `/`-separated components, so the entries below a renamed
//! directory move with one relink. A map of full paths scanned every key
//! per rename and re-inserted each entry below the directory: N files
//! renamed with their directory M times cost N x M (adversarial round 24b).
//!
//! What a rename does to every entry below a directory is kept lazily:
//! - "deleted": the entries below a rename's destination that nothing
//!   moved over are gone (`Files::gone_below`). A node's `killed` epoch
//!   says every state below it last changed before that epoch is deleted;
//!   its `attached` epoch says kills above it older than its arrival
//!   there do not reach it.
//! - "renamed_from": a file of the tree keeps the name it had when it
//!   first moved with its directory. The paths of entries that may still
//!   need it are in `pending`, which never moves: an entry is settled
//!   when its directory moves, so no pending path goes stale unseen.
//!
//! All walks are loops, not recursion: a forged path of millions of
//! components must not exhaust the stack.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use super::files::{FileState, push};

#[derive(Default)]
struct Node {
    state: Option<FileState>,
    /// Epoch of the state's last change: a later kill deletes it.
    touched: u64,
    kids: BTreeMap<String, usize>,
    /// Epoch this node was put where it is.
    attached: u64,
    /// Every state below (and at) this node older than this is deleted.
    killed: u64,
}

/// Entries taken from below a directory: a detached node, if any.
pub(super) struct Below(Option<usize>);

pub(super) struct Table {
    /// Node 0 is the root: the empty sequence of components. Nodes are
    /// never freed (a merged-away node is left behind): their number is
    /// bounded by the components the log named.
    nodes: Vec<Node>,
    len: usize,
    epoch: u64,
    /// Paths whose entry may lack a `renamed_from` it would get by moving.
    pending: BTreeSet<String>,
    /// Nodes and paths a rename looked at: the tests bound the work.
    #[cfg(test)]
    pub(super) work: u64,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
            len: 0,
            epoch: 0,
            pending: BTreeSet::new(),
            #[cfg(test)]
            work: 0,
        }
    }
}

/// Whether a moved entry takes the name it moved from.
fn pending(f: &FileState) -> bool {
    !f.created && f.renamed_from.is_none()
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn tick(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    #[cfg(test)]
    fn count(&mut self, n: usize) {
        self.work += n as u64;
    }

    #[cfg(not(test))]
    fn count(&mut self, _: usize) {}

    /// The kill in force at `id` given the one in force above it.
    fn eff(&self, id: usize, above: u64) -> u64 {
        let n = &self.nodes[id];
        let above = if above > n.attached { above } else { 0 };
        above.max(n.killed)
    }

    /// The node of `path` and the kill in force above it.
    fn find(&self, path: &str) -> Option<(usize, u64)> {
        self.find_from(0, 0, path)
    }

    fn find_from(&self, start: usize, above: u64, path: &str) -> Option<(usize, u64)> {
        let (mut id, mut kill) = (start, above);
        for part in path.split('/') {
            let next = *self.nodes[id].kids.get(part)?;
            kill = self.eff(id, kill);
            id = next;
        }
        Some((id, kill))
    }

    /// The node of `path`, made if missing, its parent and the kill in
    /// force above it.
    fn make(&mut self, path: &str) -> (usize, usize, u64) {
        let (mut id, mut parent, mut kill) = (0, 0, 0);
        for part in path.split('/') {
            let next = match self.nodes[id].kids.get(part) {
                Some(&n) => n,
                None => {
                    let n = self.nodes.len();
                    self.nodes.push(Node::default());
                    self.nodes[id].kids.insert(part.to_string(), n);
                    n
                }
            };
            kill = self.eff(id, kill);
            parent = id;
            id = next;
        }
        (id, parent, kill)
    }

    /// The state of `id` taken out, deleted if a kill reached it.
    fn take_state(&mut self, id: usize, above: u64) -> Option<FileState> {
        let kill = self.eff(id, above);
        let n = &mut self.nodes[id];
        let mut f = n.state.take()?;
        if n.touched < kill {
            f.deleted = true;
        }
        Some(f)
    }

    pub(super) fn contains_key(&self, path: &str) -> bool {
        self.get(path).is_some()
    }

    /// The entry of `path`; its `deleted` may lag a kill (use `get_mut`).
    pub(super) fn get(&self, path: &str) -> Option<&FileState> {
        let (id, _) = self.find(path)?;
        self.nodes[id].state.as_ref()
    }

    pub(super) fn get_mut(&mut self, path: &str) -> Option<&mut FileState> {
        let (id, above) = self.find(path)?;
        let f = self.take_state(id, above)?;
        let now = self.tick();
        let n = &mut self.nodes[id];
        n.touched = now;
        Some(n.state.insert(f))
    }

    pub(super) fn insert(&mut self, path: &str, f: FileState) {
        let (id, _, _) = self.make(path);
        if pending(&f) {
            self.pending.insert(path.to_string());
        }
        let now = self.tick();
        let n = &mut self.nodes[id];
        n.touched = now;
        if n.state.replace(f).is_none() {
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, path: &str) -> Option<FileState> {
        let (id, above) = self.find(path)?;
        let f = self.take_state(id, above)?;
        self.len -= 1;
        Some(f)
    }

    /// The entries below `dir` (not `dir` itself), taken out: the keys
    /// that start with `dir/`, which are the components below its node.
    pub(super) fn take_under(&mut self, dir: &str) -> Below {
        let Some((id, above)) = self.find(dir.trim_end_matches('/')) else {
            return Below(None);
        };
        if self.nodes[id].kids.is_empty() {
            return Below(None);
        }
        let killed = self.eff(id, above);
        let kids = std::mem::take(&mut self.nodes[id].kids);
        self.nodes.push(Node {
            kids,
            killed,
            ..Node::default()
        });
        Below(Some(self.nodes.len() - 1))
    }

    /// Puts entries taken from below `from` at the same places below `to`;
    /// a file of the tree among them takes the name it moved from.
    pub(super) fn put_under(&mut self, from: &str, to: &str, below: Below) {
        let Some(x) = below.0 else {
            return;
        };
        let prefix = format!("{}/", from.trim_end_matches('/'));
        let paths: Vec<String> = self
            .pending
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .take_while(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        self.count(paths.len());
        for path in paths {
            self.pending.remove(&path);
            let found = self.find_from(x, 0, &path[prefix.len()..]);
            if let Some(f) = found.and_then(|(id, _)| self.nodes[id].state.as_mut())
                && pending(f)
            {
                f.renamed_from = Some(path);
            }
        }
        let to = to.trim_end_matches('/');
        let (t, parent, above) = self.make(to);
        if !self.nodes[t].kids.is_empty() {
            // `to` had entries below it still (a forged rename into its
            // own source's subtree): each goes in one by one, replacing.
            for (rel, f) in self.drain(x) {
                self.insert(&format!("{to}/{rel}"), f);
            }
            return;
        }
        // The taken node goes in `to`'s place, with `to`'s own state.
        let state = self.take_state(t, above);
        let (attached, touched) = (self.tick(), self.tick());
        let n = &mut self.nodes[x];
        n.state = state;
        n.touched = touched;
        n.attached = attached;
        let name = to.rsplit('/').next().unwrap_or_default();
        self.nodes[parent].kids.insert(name.to_string(), x);
    }

    /// Entries taken from below a rename's destination, put back: where a
    /// moved entry now is, it notes the one it replaced; elsewhere each is
    /// gone (deleted). Merged smaller into larger, level by level, and the
    /// larger side's unmatched entries deleted by one kill epoch.
    pub(super) fn gone_below(&mut self, to: &str, below: Below) {
        let Some(b) = below.0 else {
            return;
        };
        let to = to.trim_end_matches('/');
        let (t, parent, above) = self.make(to);
        let name = to.rsplit('/').next().unwrap_or_default().to_string();
        let mut work = vec![(t, b, above, 0, parent, name)];
        while let Some((a, b, ka, kb, parent, name)) = work.pop() {
            let (ea, eb) = (self.eff(a, ka), self.eff(b, kb));
            let state = match (self.take_state(a, ka), self.take_state(b, kb)) {
                (Some(mut sa), Some(sb)) => {
                    push(
                        &mut sa.actions,
                        if sb.deleted { "delete" } else { "replaced" },
                    );
                    self.len -= 1;
                    Some(sa)
                }
                (None, Some(mut sb)) => {
                    sb.deleted = true;
                    Some(sb)
                }
                (sa, None) => sa,
            };
            let a_kids = std::mem::take(&mut self.nodes[a].kids);
            let b_kids = std::mem::take(&mut self.nodes[b].kids);
            self.count(1 + a_kids.len().min(b_kids.len()));
            let (r, mut kids) = if a_kids.len() >= b_kids.len() {
                // Kept: `a`'s kids, under the kill they had.
                self.nodes[a].killed = ea;
                let mut kids = a_kids;
                for (n, bk) in b_kids {
                    match kids.get(&n) {
                        Some(&ak) => work.push((ak, bk, ea, eb, a, n)),
                        None => {
                            let e = self.tick();
                            self.nodes[bk].attached = e;
                            self.nodes[bk].killed = e;
                            kids.insert(n, bk);
                        }
                    }
                }
                (a, kids)
            } else {
                // Kept: `b`'s kids, all deleted but those `a` brings.
                let kill = self.tick();
                self.nodes[b].killed = kill;
                let mut kids = b_kids;
                for (n, ak) in a_kids {
                    match kids.get(&n) {
                        Some(&bk) => work.push((ak, bk, ea, eb, b, n)),
                        None => {
                            let killed = self.eff(ak, ea);
                            let e = self.tick();
                            self.nodes[ak].attached = e;
                            self.nodes[ak].killed = killed;
                            kids.insert(n, ak);
                        }
                    }
                }
                (b, kids)
            };
            let (touched, attached) = (self.tick(), self.tick());
            let node = &mut self.nodes[r];
            node.state = state;
            node.touched = touched;
            node.attached = attached;
            std::mem::swap(&mut node.kids, &mut kids);
            self.nodes[parent].kids.insert(name, r);
        }
    }

    /// The entries below `start` (a detached node), by path relative to
    /// it, taken out.
    fn drain(&mut self, start: usize) -> Vec<(String, FileState)> {
        let mut out = Vec::new();
        let mut stack = vec![(start, String::new(), 0)];
        while let Some((id, path, above)) = stack.pop() {
            let kill = self.eff(id, above);
            if id != start
                && let Some(f) = self.take_state(id, above)
            {
                self.len -= 1;
                out.push((path.clone(), f));
            }
            for (name, kid) in std::mem::take(&mut self.nodes[id].kids) {
                let p = if id == start {
                    name
                } else {
                    format!("{path}/{name}")
                };
                stack.push((kid, p, kill));
            }
        }
        self.count(out.len());
        out
    }

    /// Every entry, sorted by path.
    pub(super) fn into_sorted(mut self) -> Vec<(String, FileState)> {
        let mut out = self.drain(0);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
