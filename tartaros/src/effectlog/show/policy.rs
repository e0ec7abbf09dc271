//! Which rule of the run's policy (from the genesis record) explains a
//! filesystem refusal. The kernel's EACCES is the same number for Landlock
//! and for file permissions; the policy tells a reviewer whether the path
//! was denied by a rule (`read_denies /home/u/.ssh`, outside the writable
//! roots) or was not denied by any, so the EACCES came from the file's own
//! modes (or a mechanism the log does not name).

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
    writable: Vec<String>,
    read_denies: Vec<String>,
    read_allows: Vec<String>,
    write_denies: Vec<String>,
    granted: bool,
}

fn list(policy: &Value, key: &str) -> Vec<String> {
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
        if let Some(r) = self.read_denies.iter().find(|r| under(path, r)) {
            return Some(show("read_denies", r));
        }
        if writes {
            if let Some(r) = self.write_denies.iter().find(|r| under(path, r)) {
                return Some(show("write_denies", r));
            }
            if !self.writable.iter().any(|r| under(path, r)) {
                return Some("outside the writable roots".to_string());
            }
        } else if self.granted {
            let readable = GRANTED_BASES.iter().any(|b| under(path, b))
                || self
                    .writable
                    .iter()
                    .chain(&self.read_allows)
                    .any(|r| under(path, r));
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
}
