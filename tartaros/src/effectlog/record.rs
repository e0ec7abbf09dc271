//! Effect records with typed common fields, serialized straight to their
//! canonical line. The eBPF capture produces up to ~250,000 of them a
//! second; building each as a `serde_json::Map` (a String per key, a tree
//! node per field) and sorting it again cost more than hashing and writing
//! the line, on the CPU the agent shares.
//!
//! It is also the record of the supervisor's own gateways (proxy, broker,
//! relays, signals): one type from every producer to the writer, so every
//! effect reaches the log through the same checks and the same line code.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::LogError;
use super::canonical::{write_entries, write_string};
use super::schema::Decision;

/// The `target` object of an effect record: what the effect was on.
/// Keys are unique (a second insert replaces the value, as in a map).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Target(Vec<(Cow<'static, str>, Value)>);

impl Target {
    pub fn new() -> Self {
        Self(Vec::with_capacity(8))
    }

    /// Sets `key` to `value`, replacing an earlier value of `key`.
    pub fn insert(&mut self, key: impl Into<Cow<'static, str>>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// Removes `key` (when a kernel-sourced path replaces a flag that
    /// said the agent's could not be resolved).
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let at = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(at).1)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_ref())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut (Cow<'static, str>, Value)> {
        self.0.iter_mut()
    }

    pub fn to_map(&self) -> Map<String, Value> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

impl From<Map<String, Value>> for Target {
    fn from(map: Map<String, Value>) -> Self {
        Self(map.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

/// One effect record before the writer gives it `seq` and `prev`.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// One of [`super::EFFECT_KINDS`].
    pub kind: &'static str,
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// CLOCK_MONOTONIC ns (the clock of `bpf_ktime_get_ns`).
    pub mono_ns: u64,
    /// Wall time, ns since the Unix epoch.
    pub wall_ns: u64,
    pub decision: Decision,
    /// Positive errno; must be 0 when allowed.
    pub errno: u64,
    pub target: Target,
}

impl Record {
    /// A record of `kind` by no known process, allowed, at the current
    /// time: what a gateway knows before it adds what it saw.
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            pid: 0,
            ppid: 0,
            uid: 0,
            mono_ns: super::mono_now_ns(),
            wall_ns: super::wall_now_ns(),
            decision: Decision::Allowed,
            errno: 0,
            target: Target::new(),
        }
    }

    /// Sets `key` (builder style); see [`Self::set`].
    pub fn with(mut self, key: impl Into<Cow<'static, str>>, value: impl Into<Value>) -> Self {
        self.set(key, value);
        self
    }

    /// Sets a common field (`decision`, `errno`, `pid`, `ppid`, `uid`,
    /// `mono_ns`, `wall_ns`) or, for any other key, `target.key`; a
    /// `target` object is merged into `target`. `decision` is denied only
    /// for `"denied"`, and saying "allowed" clears `errno` (the schema
    /// wants 0 there). A value that does not fit its typed field is kept in
    /// `target` under its key, so nothing a producer reported is dropped.
    pub fn set(&mut self, key: impl Into<Cow<'static, str>>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match (key.as_ref(), value) {
            ("decision", value) => {
                if value.as_str() == Some("denied") {
                    self.decision = Decision::Denied;
                } else {
                    self.decision = Decision::Allowed;
                    self.errno = 0;
                }
            }
            ("target", Value::Object(entries)) => {
                for (k, v) in entries {
                    self.target.insert(k, v);
                }
            }
            (name, value) => {
                if !value.as_u64().is_some_and(|n| self.set_common(name, n)) {
                    self.target.insert(key, value);
                }
            }
        }
    }

    /// Sets the common integer field `key` to `n`; false when there is no
    /// such field or `n` does not fit it.
    fn set_common(&mut self, key: &str, n: u64) -> bool {
        let small = u32::try_from(n).ok();
        match (key, small) {
            ("errno", _) => self.errno = n,
            ("mono_ns", _) => self.mono_ns = n,
            ("wall_ns", _) => self.wall_ns = n,
            ("pid", Some(n)) => self.pid = n,
            ("ppid", Some(n)) => self.ppid = n,
            ("uid", Some(n)) => self.uid = n,
            _ => return false,
        }
        true
    }

    /// Sets `pid` (builder style).
    pub fn pid(mut self, pid: u32) -> Self {
        self.pid = pid;
        self
    }

    /// Marks the record denied with `errno` (0 when the refusal was not a
    /// syscall's, as for a proxy's 403).
    pub fn denied(mut self, errno: u64) -> Self {
        self.decision = Decision::Denied;
        self.errno = errno;
        self
    }

    /// Sets the times to now: a gateway's record is stamped when the
    /// effect is over and reported, not when its builder was made.
    pub fn stamp_now(&mut self) {
        self.mono_ns = super::mono_now_ns();
        self.wall_ns = super::wall_now_ns();
    }

    /// The record's common fields and `target` as a map (for tests and
    /// tools that compare a record to the map form of its line).
    pub fn to_fields(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("decision".into(), self.decision.as_str().into());
        m.insert("errno".into(), self.errno.into());
        m.insert("mono_ns".into(), self.mono_ns.into());
        m.insert("pid".into(), self.pid.into());
        m.insert("ppid".into(), self.ppid.into());
        m.insert("target".into(), Value::Object(self.target.to_map()));
        m.insert("uid".into(), self.uid.into());
        m.insert("wall_ns".into(), self.wall_ns.into());
        m
    }

    /// Appends the canonical line of this record with `seq` and `prev`
    /// (hex) to `out`: the same bytes as `to_canonical` of its map form.
    pub(crate) fn write_line(
        &self,
        seq: u64,
        prev: &str,
        out: &mut String,
    ) -> Result<(), LogError> {
        // The keys in byte order: decision, errno, kind, mono_ns, pid,
        // ppid, prev, seq, target, uid, wall_ns.
        let mut number = itoa::Buffer::new();
        out.push_str("{\"decision\":\"");
        out.push_str(self.decision.as_str());
        out.push_str("\",\"errno\":");
        out.push_str(number.format(self.errno));
        out.push_str(",\"kind\":");
        write_string(self.kind, out);
        out.push_str(",\"mono_ns\":");
        out.push_str(number.format(self.mono_ns));
        out.push_str(",\"pid\":");
        out.push_str(number.format(self.pid));
        out.push_str(",\"ppid\":");
        out.push_str(number.format(self.ppid));
        out.push_str(",\"prev\":\"");
        out.push_str(prev);
        out.push_str("\",\"seq\":");
        out.push_str(number.format(seq));
        out.push_str(",\"target\":");
        let mut entries: Vec<&(Cow<'static, str>, Value)> = self.target.0.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        write_entries(entries.into_iter().map(|(k, v)| (k.as_ref(), v)), out).map_err(
            |mut rev| {
                rev.push(".target".to_string());
                rev.push("$".to_string());
                rev.reverse();
                LogError::Float { at: rev.concat() }
            },
        )?;
        out.push_str(",\"uid\":");
        out.push_str(number.format(self.uid));
        out.push_str(",\"wall_ns\":");
        out.push_str(number.format(self.wall_ns));
        out.push('}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::to_canonical;

    fn sample() -> Record {
        let mut target = Target::new();
        target.insert("path", "/w/a \"b\"\n");
        target.insert("flags", 577u64);
        target.insert("argv", vec![Value::from("sh"), Value::from("-c")]);
        target.insert("resolved_from", "cwd");
        target.insert(String::from("to_relative"), true);
        target.insert("mode", -1i64);
        Record {
            kind: "create",
            pid: 7,
            ppid: 1,
            uid: 65534,
            mono_ns: 123,
            wall_ns: u64::MAX,
            decision: Decision::Denied,
            errno: 13,
            target,
        }
    }

    #[test]
    fn the_line_is_the_canonical_form_of_the_map() {
        let record = sample();
        let prev = "ab".repeat(32);
        let mut line = String::new();
        record.write_line(42, &prev, &mut line).unwrap();
        let mut m = record.to_fields();
        m.insert("seq".into(), 42.into());
        m.insert("prev".into(), prev.into());
        m.insert("kind".into(), "create".into());
        assert_eq!(line, to_canonical(&Value::Object(m)).unwrap());
    }

    #[test]
    fn an_empty_target_and_an_insert_that_replaces() {
        let mut record = sample();
        record.target = Target::new();
        let mut line = String::new();
        record.write_line(0, "0", &mut line).unwrap();
        assert!(line.contains(",\"target\":{},"), "{line}");
        record.target.insert("path", "/a");
        record.target.insert("path", "/b");
        assert_eq!(record.target.to_map().len(), 1);
        assert_eq!(record.target.get("path"), Some(&Value::from("/b")));
        assert_eq!(record.target.remove("path"), Some(Value::from("/b")));
        assert!(record.target.is_empty() && record.target.remove("path").is_none());
    }

    #[test]
    fn a_float_is_refused_with_its_place() {
        let mut record = sample();
        record.target.insert("ratio", 0.5);
        let mut line = String::new();
        match record.write_line(0, "0", &mut line) {
            Err(LogError::Float { at }) => assert_eq!(at, "$.target.ratio"),
            other => panic!("expected a float error, got {other:?}"),
        }
    }

    #[test]
    fn producer_fields_land_in_target_and_defaults_fill_the_rest() {
        let record = Record::new("proxy")
            .with("host", "crates.io")
            .with("port", 443)
            .with("errno", 1)
            .with("decision", "denied")
            .with("target", serde_json::json!({"mode": "explicit"}));
        assert_eq!(record.target.get("host"), Some(&Value::from("crates.io")));
        assert_eq!(record.target.get("mode"), Some(&Value::from("explicit")));
        assert_eq!((record.decision, record.errno), (Decision::Denied, 1));
        assert_eq!((record.pid, record.ppid, record.uid), (0, 0, 0));
        assert!(record.mono_ns > 0 && record.wall_ns > 0);
        let allowed = Record::new("proxy")
            .with("errno", 5)
            .with("decision", "allowed");
        assert_eq!(allowed.errno, 0, "allowed records carry no errno");
        let odd = Record::new("signal")
            .with("pid", -1)
            .with("decision", "maybe");
        assert_eq!(odd.decision, Decision::Allowed);
        assert_eq!(
            (odd.pid, odd.target.get("pid")),
            (0, Some(&Value::from(-1)))
        );
    }

    #[test]
    fn a_built_record_has_the_line_of_a_literal_one() {
        let built = Record::new("create")
            .pid(7)
            .with("ppid", 1)
            .with("uid", 65534)
            .with("mono_ns", 123)
            .with("wall_ns", u64::MAX)
            .denied(13)
            .with("path", "/w/a \"b\"\n")
            .with("flags", 577u64)
            .with("argv", vec![Value::from("sh"), Value::from("-c")])
            .with("resolved_from", "cwd")
            .with(String::from("to_relative"), true)
            .with("mode", -1i64);
        assert_eq!(built, sample());
    }
}
