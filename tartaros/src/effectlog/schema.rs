//! Record types and the schema checks shared by the writer (to catch a
//! supervisor bug before it reaches disk) and the verifier (to reject a line
//! that chains correctly but could not have come from the writer).

use serde_json::{Map, Value, json};

/// Effect record kinds, in the order the documentation lists them.
pub const EFFECT_KINDS: &[&str] = &[
    "exec", "exit", "fork", "open", "create", "write", "unlink", "rename", "chmod", "truncate",
    "mkdir", "rmdir", "link", "symlink", "chown", "connect", "sendto", "proxy", "broker", "signal",
    "mknod", "bind", "xattr", "utime", "setflags", "syscall", "attrib",
];

const GENESIS_KEYS: &[&str] = &[
    "guarantees",
    "kernel",
    "kind",
    "mono_ns",
    "policy",
    "policy_hash",
    "prev",
    "programs",
    "seq",
    "started",
    "version",
];
const GAP_KEYS: &[&str] = &[
    "count",
    "kind",
    "lost_kind",
    "mono_ns",
    "prev",
    "seq",
    "wall_ns",
];
pub(crate) const SEAL_KEYS: &[&str] = &[
    "cgroup_empty",
    "counts",
    "digest",
    "exit_status",
    "head",
    "kind",
    "lost",
    "mono_ns",
    "prev",
    "seq",
    "wall_ns",
];

/// Seal fields present only in some logs: the kernel-sourced `files`
/// list (sorted by path) and how many files it left out, and why the
/// agent never started (`not_started`: the genesis lists the guarantees
/// the run planned, and one of them failed to install), or why its end is
/// unknown (`end_unknown`: the init ended after the agent started without
/// reporting it; adversarial round 23b).
pub(crate) const SEAL_OPTIONAL: &[&str] = &["files", "files_omitted", "not_started", "end_unknown"];

/// The first record: what ran, on what, under which policy and guarantees.
#[derive(Debug, Clone, PartialEq)]
pub struct Genesis {
    /// tartaros version.
    pub version: String,
    /// Host kernel release (`uname -r`).
    pub kernel: String,
    /// The normalized policy; must hold no floats.
    pub policy: Value,
    /// Guarantees that are in force.
    pub installed: Vec<String>,
    /// Guarantees that were requested but could not be installed.
    pub degraded: Vec<String>,
    /// Tags of the loaded eBPF programs (may be empty).
    pub programs: Vec<String>,
    /// Wall time at start, ns since the Unix epoch (`started`).
    pub started_wall_ns: u64,
    /// CLOCK_MONOTONIC at start (`mono_ns`): the zero of `log show`'s times.
    pub started_mono_ns: u64,
}

impl Genesis {
    /// A genesis for this binary on this host, started now.
    pub fn new(
        policy: Value,
        installed: Vec<String>,
        degraded: Vec<String>,
        programs: Vec<String>,
    ) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            kernel: kernel_release(),
            policy,
            installed,
            degraded,
            programs,
            started_wall_ns: super::wall_now_ns(),
            started_mono_ns: super::mono_now_ns(),
        }
    }
}

// /proc/sys/kernel/osrelease is what uname(2) reports as the release, read
// without unsafe code; "unknown" keeps genesis writable on an odd host.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// How the agent ended: `{"code": N}` or `{"signal": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    pub(crate) fn to_json(self) -> Value {
        match self {
            ExitStatus::Code(c) => json!({ "code": c }),
            ExitStatus::Signal(s) => json!({ "signal": s }),
        }
    }
}

/// What the supervisor knows at the end; the writer adds counts, lost and head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    pub exit_status: ExitStatus,
    /// True only when the cgroup was verified empty after the kill and drain.
    pub cgroup_empty: bool,
}

/// The kernel's (or proxy's / broker's) verdict on an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
        }
    }
}

pub(crate) fn is_effect_kind(kind: &str) -> bool {
    EFFECT_KINDS.contains(&kind)
}

/// Checks the fields every effect record must carry (extra fields are allowed:
/// a kind may add context such as `cwd` or `comm`).
pub(crate) fn check_effect(m: &Map<String, Value>) -> Result<(), String> {
    for key in ["pid", "ppid", "uid"] {
        let v = uint(m, key)?;
        if v > u64::from(u32::MAX) {
            return Err(format!("`{key}` is out of range"));
        }
    }
    uint(m, "mono_ns")?;
    uint(m, "wall_ns")?;
    if !m.get("target").is_some_and(Value::is_object) {
        return Err("`target` is missing or not an object".into());
    }
    let errno = uint(m, "errno")?;
    match m.get("decision").and_then(Value::as_str) {
        Some("allowed") if errno != 0 => Err("`errno` must be 0 when allowed".into()),
        Some("allowed") | Some("denied") => Ok(()),
        _ => Err("`decision` must be \"allowed\" or \"denied\"".into()),
    }
}

pub(crate) fn check_genesis(m: &Map<String, Value>) -> Result<(), String> {
    // `run` (run id and label) is optional: logs before it had none.
    match m.get("run") {
        None => exact_keys(m, GENESIS_KEYS)?,
        Some(run) => {
            let mut keys = GENESIS_KEYS.to_vec();
            keys.push("run");
            exact_keys(m, &keys)?;
            let run = run.as_object().ok_or("`run` is not an object")?;
            exact_keys(run, &["id", "label"]).map_err(|e| format!("run: {e}"))?;
            string(run, "id")?;
            if !matches!(run.get("label"), Some(Value::String(_) | Value::Null)) {
                return Err("`run.label` is neither a string nor null".into());
            }
        }
    }
    string(m, "version")?;
    string(m, "kernel")?;
    uint(m, "started")?;
    uint(m, "mono_ns")?;
    strings(m.get("programs"), "programs")?;
    let g = m
        .get("guarantees")
        .and_then(Value::as_object)
        .ok_or("`guarantees` is not an object")?;
    exact_keys(g, &["degraded", "installed"]).map_err(|e| format!("guarantees: {e}"))?;
    strings(g.get("installed"), "guarantees.installed")?;
    strings(g.get("degraded"), "guarantees.degraded")?;
    let policy = m.get("policy").ok_or("`policy` is missing")?;
    let want = super::policy_hash(policy).map_err(|_| "`policy` holds a float".to_string())?;
    if m.get("policy_hash").and_then(Value::as_str) != Some(want.as_str()) {
        return Err("`policy_hash` does not match the policy".into());
    }
    Ok(())
}

/// Returns the lost count.
pub(crate) fn check_gap(m: &Map<String, Value>) -> Result<u64, String> {
    exact_keys(m, GAP_KEYS)?;
    uint(m, "mono_ns")?;
    uint(m, "wall_ns")?;
    if string(m, "lost_kind")?.is_empty() {
        return Err("`lost_kind` is empty".into());
    }
    match uint(m, "count")? {
        0 => Err("`count` is 0".into()),
        n => Ok(n),
    }
}

/// Shape of the seal; its values (head, counts, lost, digest) are checked by
/// the verifier, which knows the records before it.
pub(crate) fn check_seal_shape(m: &Map<String, Value>) -> Result<(), String> {
    let mut required = m.clone();
    required.retain(|k, _| !SEAL_OPTIONAL.contains(&k.as_str()));
    exact_keys(&required, SEAL_KEYS)?;
    check_seal_files(m)?;
    uint(m, "lost")?;
    uint(m, "mono_ns")?;
    uint(m, "wall_ns")?;
    if !m.get("cgroup_empty").is_some_and(Value::is_boolean) {
        return Err("`cgroup_empty` is not a boolean".into());
    }
    let st = m
        .get("exit_status")
        .and_then(Value::as_object)
        .ok_or("`exit_status` is not an object")?;
    let ok = st.len() == 1
        && ["code", "signal"]
            .iter()
            .any(|k| st.get(*k).and_then(Value::as_i64).is_some());
    if !ok {
        return Err("`exit_status` must be {\"code\": N} or {\"signal\": N}".into());
    }
    let counts = m
        .get("counts")
        .and_then(Value::as_object)
        .ok_or("`counts` is not an object")?;
    if counts.values().any(|v| v.as_u64().is_none()) {
        return Err("`counts` holds a non-integer".into());
    }
    Ok(())
}

/// `files`: objects with a string `path` in increasing order, a
/// `size`, and a hex `sha256` or null with a `skipped` reason.
fn check_seal_files(m: &Map<String, Value>) -> Result<(), String> {
    for key in ["not_started", "end_unknown"] {
        if m.get(key).is_some_and(|v| !v.is_string()) {
            return Err(format!("`{key}` is not a string"));
        }
    }
    if m.get("not_started").is_some() && m.get("end_unknown").is_some() {
        return Err("`not_started` and `end_unknown` both".into());
    }
    if let Some(omitted) = m.get("files_omitted")
        && omitted.as_u64().is_none()
    {
        return Err("`files_omitted` is not a non-negative integer".into());
    }
    let Some(files) = m.get("files") else {
        return Ok(());
    };
    let files = files.as_array().ok_or("`files` is not a list")?;
    let mut last: Option<&str> = None;
    for f in files {
        let f = f.as_object().ok_or("`files` holds a non-object")?;
        let path = f
            .get("path")
            .and_then(Value::as_str)
            .ok_or("a `files` entry has no string `path`")?;
        if last.is_some_and(|l| l > path) {
            return Err("`files` is not sorted by path".into());
        }
        last = Some(path);
        uint(f, "size").map_err(|e| format!("files: {e}"))?;
        match f.get("sha256") {
            Some(Value::String(h)) if h.len() == 64 => {}
            Some(Value::Null) if f.get("skipped").is_some_and(Value::is_string) => {}
            _ => return Err("a `files` entry has neither a sha256 nor a `skipped` reason".into()),
        }
    }
    Ok(())
}

fn exact_keys(m: &Map<String, Value>, want: &[&str]) -> Result<(), String> {
    if let Some(k) = m.keys().find(|k| !want.contains(&k.as_str())) {
        // The name comes from the file: escaped before it is printed.
        return Err(format!(
            "unexpected field `{}`",
            super::escape::terminal_capped(k, 64)
        ));
    }
    if let Some(k) = want.iter().find(|k| !m.contains_key(**k)) {
        return Err(format!("missing field `{k}`"));
    }
    Ok(())
}

pub(crate) fn uint(m: &Map<String, Value>, key: &str) -> Result<u64, String> {
    m.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("`{key}` is missing or not a non-negative integer"))
}

fn string<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    m.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{key}` is missing or not a string"))
}

fn strings(v: Option<&Value>, name: &str) -> Result<(), String> {
    match v.and_then(Value::as_array) {
        Some(items) if items.iter().all(Value::is_string) => Ok(()),
        _ => Err(format!("`{name}` is not a list of strings")),
    }
}
