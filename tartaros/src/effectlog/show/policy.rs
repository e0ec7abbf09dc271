//! Which rule of the run's policy (from the genesis record) explains a
//! filesystem refusal. The kernel's EACCES is the same number for Landlock
//! and for file permissions; the policy tells a reviewer whether the path
//! was denied by a rule (`read_denies /home/u/.ssh`, outside the writable
//! roots) or was not denied by any, so the EACCES came from the file's own
//! modes (or a mechanism the log does not name).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::names::text;
use super::names::{CHANGE_KINDS, opens_for_write};

/// Bases readable under `read_scope = "granted"` (DESIGN.md section 2).
const GRANTED_BASES: &[&str] = &[
    "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/dev", "/proc",
];

/// The path rules of a policy.
#[derive(Debug, Clone, Default)]
pub(crate) struct PolicyView {
    writable: Roots,
    read_denies: Roots,
    read_allows: Roots,
    write_denies: Roots,
    granted: bool,
}

/// A policy list of roots, looked up by the components of a path: a scan
/// of the list per record cost records x list length, and a forged
/// genesis holds as many roots as 16 MiB do (adversarial round 24b F3).
#[derive(Debug, Clone, Default)]
pub(crate) struct Roots {
    list: Vec<String>,
    /// The first place in `list` of the first root that is only slashes
    /// (or empty): every path is under it.
    all: Option<usize>,
    /// A trie of the roots' `/`-separated components (node 0 is the
    /// empty sequence), each node with the first place in `list` of a
    /// root that ends there: one hash per component of a path, where a
    /// hash of every prefix would cost its length squared.
    kids: Vec<HashMap<String, usize>>,
    ends: Vec<Option<usize>>,
}

impl Roots {
    pub(crate) fn new(list: Vec<String>) -> Self {
        let mut r = Self {
            kids: vec![HashMap::new()],
            ends: vec![None],
            ..Self::default()
        };
        for (i, root) in list.iter().enumerate() {
            // As `under` reads a root: trailing slashes do not count.
            let root = root.trim_end_matches('/');
            if root.is_empty() {
                r.all = r.all.or(Some(i));
                continue;
            }
            let mut node = 0;
            for part in root.split('/') {
                let next = r.kids.len();
                let kid = *r.kids[node].entry(part.to_string()).or_insert(next);
                if kid == next {
                    r.kids.push(HashMap::new());
                    r.ends.push(None);
                }
                node = kid;
            }
            r.ends[node] = r.ends[node].or(Some(i));
        }
        r.list = list;
        r
    }

    /// The first root of the list (in its order, as a scan found it)
    /// that `path` is under (`under(path, root)`).
    pub(crate) fn find(&self, path: &str) -> Option<&str> {
        let mut best = self.all;
        let mut node = 0;
        // After each component the node is the prefix of `path` up to a
        // `/` or its end: exactly the roots `under` accepts.
        for part in path.split('/') {
            let Some(kid) = self.kids.get(node).and_then(|k| k.get(part)) else {
                break;
            };
            node = *kid;
            if let Some(i) = self.ends.get(node).copied().flatten() {
                best = Some(best.map_or(i, |b| b.min(i)));
            }
        }
        best.and_then(|i| self.list.get(i)).map(String::as_str)
    }
}

fn list(policy: &Value, key: &str) -> Roots {
    Roots::new(list_of(policy, key))
}

fn list_of(policy: &Value, key: &str) -> Vec<String> {
    policy
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `path` is `root` or below it.
pub(crate) fn under(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    root.is_empty()
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl PolicyView {
    /// The policy of a genesis record.
    pub(crate) fn from_genesis(rec: &Map<String, Value>) -> Option<Self> {
        let policy = rec.get("policy")?;
        Some(Self {
            writable: list(policy, "writable_roots"),
            read_denies: list(policy, "read_denies"),
            read_allows: list(policy, "read_allows"),
            write_denies: list(policy, "write_denies"),
            granted: policy.get("read_scope").and_then(Value::as_str) == Some("granted"),
        })
    }

    /// Why the policy refuses the file effect `kind` on `target` with
    /// `errno`: the rule, or a note that no rule covers it.
    pub(crate) fn reason(&self, kind: &str, target: &Map<String, Value>, errno: u64) -> String {
        const EROFS: u64 = 30;
        let flags = target.get("flags").and_then(Value::as_u64);
        let writes =
            CHANGE_KINDS.contains(&kind) || (kind == "open" && flags.is_some_and(opens_for_write));
        // A refused script's interpreter is what the refusal was on.
        let paths: Vec<&str> = ["interpreter", "path", "from", "to"]
            .iter()
            .filter_map(|k| target.get(*k).and_then(Value::as_str))
            .collect();
        for path in &paths {
            if let Some(rule) = self.rule(path, writes) {
                return rule;
            }
        }
        // With no name, no rule can be matched, and guessing file
        // permissions told the reviewer a refusal was harmless (round 20).
        let unreadable = ["path", "from", "to", "interpreter"].iter().any(|k| {
            target
                .get(&format!("{k}_unreadable"))
                .and_then(Value::as_bool)
                == Some(true)
        });
        if unreadable {
            return "name unreadable: no rule can be matched".to_string();
        }
        const EACCES: u64 = 13;
        match errno {
            EROFS => "the read-only base mount".to_string(),
            EACCES => "no policy rule: file permissions?".to_string(),
            _ => "no policy rule".to_string(),
        }
    }

    fn rule(&self, path: &str, writes: bool) -> Option<String> {
        let show = |rule: &str, root: &str| format!("{rule} {}", text(root, 256));
        if let Some(r) = self.read_denies.find(path) {
            return Some(show("read_denies", r));
        }
        if writes {
            if let Some(r) = self.write_denies.find(path) {
                return Some(show("write_denies", r));
            }
            if self.writable.find(path).is_none() {
                return Some("outside the writable roots".to_string());
            }
        } else if self.granted {
            let readable = GRANTED_BASES.iter().any(|b| under(path, b))
                || self.writable.find(path).is_some()
                || self.read_allows.find(path).is_some();
            if !readable {
                return Some("read_scope granted".to_string());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refusals_are_explained_by_the_rule_or_not_at_all() {
        let g = json!({"policy": {"writable_roots": ["/work"], "read_denies": ["/home/u/.ssh"],
            "write_denies": ["/work/.git/hooks"], "read_scope": "all"}});
        let p = PolicyView::from_genesis(g.as_object().unwrap()).unwrap();
        let t = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(
            p.reason(
                "open",
                &t(json!({"path": "/home/u/.ssh/id", "flags": 0})),
                13
            ),
            "read_denies /home/u/.ssh"
        );
        assert_eq!(
            p.reason("create", &t(json!({"path": "/etc/x", "flags": 577})), 13),
            "outside the writable roots"
        );
        assert_eq!(
            p.reason(
                "open",
                &t(json!({"path": "/work/.git/hooks/pre-commit", "flags": 1})),
                13
            ),
            "write_denies /work/.git/hooks"
        );
        assert_eq!(
            p.reason("rename", &t(json!({"from": "/work/a", "to": "/etc/a"})), 13),
            "outside the writable roots"
        );
        assert_eq!(
            p.reason("exec", &t(json!({"path": "/root/.cargo/bin/as"})), 13),
            "no policy rule: file permissions?"
        );
        assert_eq!(
            p.reason("unlink", &t(json!({"path": "/work2/x"})), 30),
            "outside the writable roots"
        );
        assert!(!under("/work2/x", "/work") && under("/work/x", "/work/") && under("/x", "/"));
        let granted = json!({"policy": {"writable_roots": ["/work"], "read_scope": "granted"}});
        let p = PolicyView::from_genesis(granted.as_object().unwrap()).unwrap();
        assert_eq!(
            p.reason("open", &t(json!({"path": "/home/u/x", "flags": 0})), 13),
            "read_scope granted"
        );
    }

    /// The lookup finds what a scan of the list in order found: the first
    /// root `under` accepts (round 24b made it a trie).
    #[test]
    fn roots_find_the_first_listed_root_a_path_is_under() {
        let list: Vec<String> = ["/w/d2", "/w/d/", "/w", "/w/d", "w/x", "//", "/a//b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let roots = Roots::new(list.clone());
        let paths = [
            "/w/d/x", "/w/d", "/w/d2", "/w/d2x", "/w", "/wx", "w/x/y", "w", "/a//b/c", "/a/b", "",
            "/", "/w/d//", "x",
        ];
        for cut in 0..list.len() {
            let roots = Roots::new(list[cut..].to_vec());
            for p in paths {
                let scan = list[cut..].iter().find(|r| under(p, r)).map(String::as_str);
                assert_eq!(roots.find(p), scan, "{p} with roots from {cut}");
            }
        }
        assert_eq!(roots.find("/w/d/x"), Some("/w/d/"));
        assert_eq!(Roots::default().find("/x"), None);
    }
}
