//! The policy model: the neutral `[policy]` fields of a config file and the
//! command-line flags, combined and validated into one normalized [`Policy`].
//!
//! Everything here is pure (apart from looking at the filesystem to resolve
//! paths) so that every refusal can be unit-tested.

pub mod egress;
mod flags;
pub mod scope;

use egress::check_broker;
pub use egress::{BrokerCapability, BrokerConfig, ProxySettings, normalize_domain};
pub use flags::FlagPolicy;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A refusal of the policy; the CLI prints it as `tartaros: <message>` and
/// exits 78.
/// The explicit proxy inside the sandbox (`HTTP(S)_PROXY`).
pub const PROXY_PORT: u16 = 3128;
/// Where the eBPF connect programs send intercepted TCP connections.
pub const TRANSPARENT_PORT: u16 = 3129;
/// Ports no grant may take because a gateway holds them.
pub const RESERVED_PORTS: &[u16] = &[PROXY_PORT, TRANSPARENT_PORT];

/// The grace period between a forwarded SIGTERM (or `--timeout`) and the
/// kill of the whole cgroup, unless `--kill-after` says otherwise.
pub const DEFAULT_KILL_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("failed to read config {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to parse config {path}: {message}")]
    ParseConfig { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> PolicyError {
    PolicyError::Invalid(message.into())
}

/// Which part of the filesystem the agent may read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadScope {
    /// Read and execute everywhere except the read denies.
    #[default]
    All,
    /// Only the system directories, the writable roots and the read allows.
    Granted,
    /// Nothing but what is named: the writable roots, the read allows (read
    /// only) and the exec allows (read and execute), e.g. the store paths
    /// of one tool's packages.
    None,
}

impl std::str::FromStr for ReadScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Self::All),
            "granted" => Ok(Self::Granted),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown read scope {other:?}; use \"all\", \"granted\" or \"none\""
            )),
        }
    }
}

/// The directories a `read_scope = "granted"` sandbox can always read: what
/// any program needs to start.
pub const GRANTED_SYSTEM_DIRS: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/dev", "/proc",
];

/// The `[policy]` table of a config file, exactly as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFields {
    #[serde(default)]
    pub writable_roots: Vec<String>,
    #[serde(default)]
    pub read_denies: Vec<String>,
    #[serde(default)]
    pub read_allows: Vec<String>,
    pub read_scope: Option<ReadScope>,
    #[serde(default)]
    pub write_denies: Vec<String>,
    #[serde(default)]
    pub local_ports: Vec<u16>,
    #[serde(default)]
    pub allow_domains: Vec<String>,
    pub isolate_pids: Option<bool>,
    pub isolate_process_info: Option<bool>,
    pub harden_syscalls: Option<bool>,
    pub materialize_absent_handoff: Option<bool>,
    pub max_processes: Option<u64>,
    #[serde(default, deserialize_with = "crate::config::size")]
    pub max_memory: Option<u64>,
    pub inherit_env: Option<bool>,
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    pub private_tmp: Option<bool>,
    pub deny_unix: Option<bool>,
    pub glob_read_denies: Option<Vec<String>>,
    pub glob_denies: Option<Vec<String>>,
    pub allow_unix_socket_paths: Option<Vec<String>>,
    #[serde(default)]
    pub exec_allows: Vec<String>,
    #[serde(default)]
    pub tmpfs: Vec<String>,
    #[serde(default)]
    pub binds: Vec<scope::BindField>,
}

/// A config file (`--config policy.toml`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub policy: PolicyFields,
    pub broker: Option<BrokerConfig>,
    pub proxy: Option<ProxySettings>,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, PolicyError> {
        toml::from_str(text).map_err(|e| PolicyError::ParseConfig {
            path: path.to_path_buf(),
            message: describe_toml_error(text, &e),
        })
    }
}

/// Turns a TOML error into one line with line and column.
fn describe_toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().replace('\n', " ");
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// The normalized policy: absolute, resolved paths, sorted and deduplicated
/// lists. This is what the sandbox enforces and what the log's genesis
/// record hashes.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Policy {
    pub writable_roots: Vec<PathBuf>,
    pub read_denies: Vec<PathBuf>,
    pub read_allows: Vec<PathBuf>,
    pub read_scope: ReadScope,
    pub write_denies: Vec<PathBuf>,
    pub local_ports: Vec<u16>,
    pub allow_domains: Vec<String>,
    pub isolate_pids: bool,
    pub isolate_process_info: bool,
    pub harden_syscalls: bool,
    pub materialize_absent_handoff: bool,
    pub max_processes: Option<u64>,
    pub max_memory: Option<u64>,
    pub inherit_env: bool,
    pub env_passthrough: Vec<String>,
    pub private_tmp: bool,
    pub deny_unix: bool,
    pub strict: bool,
    pub user: Option<String>,
    pub broker: Option<BrokerConfig>,
    pub proxy: ProxySettings,
    /// Wall-clock bound on the run (`--timeout`); none by default.
    pub timeout_ms: Option<u64>,
    /// Grace period after a forwarded signal or the timeout before the
    /// cgroup is killed (`--kill-after`); the build fills in the default.
    pub kill_after_ms: Option<u64>,
    /// Readable and executable under any read scope.
    pub exec_allows: Vec<PathBuf>,
    /// A fresh tmpfs the agent may write on each of these directories.
    pub tmpfs: Vec<PathBuf>,
    /// Read-only binds of a host path onto a path of the sandbox.
    pub binds: Vec<scope::Bind>,
}

impl Policy {
    /// Whether the agent gets any network beyond its private loopback.
    pub fn has_network_grant(&self) -> bool {
        !self.local_ports.is_empty() || !self.allow_domains.is_empty() || self.broker.is_some()
    }

    /// Whether `path` lies inside one of the writable roots (or a private
    /// /tmp), i.e. whether the agent could create it.
    pub fn is_writable(&self, path: &Path) -> bool {
        self.writable_roots
            .iter()
            .any(|root| path.starts_with(root))
            || (self.private_tmp && path.starts_with("/tmp"))
            || self.tmpfs.iter().any(|t| path.starts_with(t))
    }
}

/// Combines the config file and the flags, resolves paths against `cwd` and
/// checks everything that can be checked before touching the kernel.
/// `env_lookup` tells whether a launcher environment variable is set (the
/// broker's secrets are only checked for presence, never read here).
pub fn build(
    file: Option<ConfigFile>,
    flags: FlagPolicy,
    cwd: &Path,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<Policy, PolicyError> {
    let file = file.unwrap_or_default();
    let fields = file.policy;

    if fields.glob_read_denies.is_some() || fields.glob_denies.is_some() {
        return Err(invalid(
            "glob_read_denies / glob_denies are not enforced yet; list the paths in read_denies / write_denies instead",
        ));
    }
    if fields.allow_unix_socket_paths.is_some() {
        return Err(invalid(
            "allow_unix_socket_paths is not enforced yet; remove it (unix sockets are allowed unless --deny-unix)",
        ));
    }

    let resolve_file = |field: &str, raw: &[String]| -> Result<Vec<PathBuf>, PolicyError> {
        raw.iter()
            .map(|entry| {
                let path = Path::new(entry);
                if path.is_relative() {
                    Err(invalid(format!(
                        "config field {field} has the relative path {entry:?}; write it as an absolute path"
                    )))
                } else {
                    check_given(field, path, cwd)?;
                    Ok(resolve(path, cwd))
                }
            })
            .collect()
    };
    let resolve_flags = |flag: &str, raw: &[PathBuf]| -> Result<Vec<PathBuf>, PolicyError> {
        raw.iter()
            .map(|p| {
                check_given(flag, p, cwd)?;
                Ok(resolve(p, cwd))
            })
            .collect()
    };

    let mut writable_roots = resolve_file("writable_roots", &fields.writable_roots)?;
    writable_roots.extend(resolve_flags("--write", &flags.write)?);
    let mut read_denies = resolve_file("read_denies", &fields.read_denies)?;
    read_denies.extend(resolve_flags("--read-deny", &flags.read_deny)?);
    let mut read_allows = resolve_file("read_allows", &fields.read_allows)?;
    read_allows.extend(resolve_flags("--read-allow", &flags.read_allow)?);
    let mut write_denies = resolve_file("write_denies", &fields.write_denies)?;
    write_denies.extend(resolve_flags("--write-deny", &flags.write_deny)?);

    let mut local_ports = fields.local_ports.clone();
    local_ports.extend(&flags.port);
    if local_ports.contains(&0) {
        return Err(invalid("--port 0 is not a port; use 1 to 65535"));
    }
    let mut allow_domains = fields.allow_domains.clone();
    allow_domains.extend(flags.allow_domain.iter().cloned());
    let allow_domains = allow_domains
        .iter()
        .map(|d| normalize_domain(d))
        .collect::<Result<Vec<_>, _>>()?;

    let max_processes = flags.max_procs.or(fields.max_processes);
    if max_processes == Some(0) {
        return Err(invalid(
            "--max-procs 0 would not even let the agent start; use 1 or more",
        ));
    }
    let max_memory = flags.max_memory.or(fields.max_memory);
    if max_memory == Some(0) {
        return Err(invalid(
            "--max-memory 0 would not even let the agent start; give a size in bytes",
        ));
    }

    if flags.timeout_ms == Some(0) {
        return Err(invalid(
            "--timeout 0 would kill the run before it starts; leave --timeout out for no time limit",
        ));
    }

    let mut env_passthrough = fields.env_passthrough.clone();
    env_passthrough.extend(flags.env.iter().cloned());
    for name in &env_passthrough {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(invalid(format!("--env {name:?} is not a variable name")));
        }
    }

    if let Some(broker) = &file.broker {
        check_broker(broker, env_is_set)?;
    }
    let scope = scope::build(&fields, &flags, cwd)?;

    let policy = Policy {
        writable_roots: sorted(writable_roots),
        read_denies: sorted(read_denies),
        read_allows: sorted(read_allows),
        read_scope: flags.read_scope.or(fields.read_scope).unwrap_or_default(),
        write_denies: sorted(write_denies),
        local_ports: sorted(local_ports),
        allow_domains: sorted(allow_domains),
        isolate_pids: flags.isolate_pids || fields.isolate_pids.unwrap_or(false),
        isolate_process_info: flags.isolate_proc || fields.isolate_process_info.unwrap_or(false),
        harden_syscalls: flags.seccomp_strict || fields.harden_syscalls.unwrap_or(false),
        materialize_absent_handoff: flags.materialize
            || fields.materialize_absent_handoff.unwrap_or(false),
        max_processes,
        max_memory,
        inherit_env: flags.inherit_env || fields.inherit_env.unwrap_or(false),
        env_passthrough: sorted(env_passthrough),
        private_tmp: flags.private_tmp || fields.private_tmp.unwrap_or(false),
        deny_unix: flags.deny_unix || fields.deny_unix.unwrap_or(false),
        strict: flags.strict,
        user: flags.user,
        broker: file.broker,
        proxy: file.proxy.unwrap_or_default(),
        timeout_ms: flags.timeout_ms,
        kill_after_ms: Some(
            flags
                .kill_after_ms
                .unwrap_or(DEFAULT_KILL_AFTER.as_millis() as u64),
        ),
        exec_allows: scope.exec_allows,
        tmpfs: scope.tmpfs,
        binds: scope.binds,
    };
    check_paths(&policy)?;
    scope::check(&policy)?;
    check_ports(&policy)?;
    Ok(policy)
}

fn sorted<T: Ord>(items: Vec<T>) -> Vec<T> {
    items
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Makes `path` absolute against `cwd`, folds `.` and `..` lexically, and
/// resolves symlinks in the longest existing prefix so that the mounts and
/// Landlock rules land on the object the agent will actually reach. Run by
/// the service, with the caller's file access: the longest prefix the
/// caller can reach, so that no symlink is followed (and shown in a
/// message) where the caller could not follow it itself.
pub fn resolve(path: &Path, cwd: &Path) -> PathBuf {
    crate::caller::as_caller(|| resolve_here(path, cwd))
}

fn resolve_here(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut lexical = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::Normal(part) => lexical.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut existing = lexical.clone();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            out.extend(rest.iter().rev());
            return out;
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return lexical,
        }
    }
}

/// See [`crate::path_checks::check_given`]: globs anywhere, symlinks in
/// roots and denies.
fn check_given(label: &str, given: &Path, cwd: &Path) -> Result<(), PolicyError> {
    crate::path_checks::check_given(label, given, cwd, &|p| resolve(p, cwd)).map_err(invalid)
}

/// Every gateway inside the sandbox needs a port of its own.
fn check_ports(policy: &Policy) -> Result<(), PolicyError> {
    let reserved = RESERVED_PORTS;
    for port in &policy.local_ports {
        if reserved.contains(port) {
            return Err(invalid(format!(
                "--port {port} conflicts with a port TartarOS uses inside the sandbox ({reserved:?}); serve the host side on another port"
            )));
        }
    }
    if let Some(broker) = &policy.broker
        && (reserved.contains(&broker.port) || policy.local_ports.contains(&broker.port))
    {
        return Err(invalid(format!(
            "[broker] port {} conflicts with --port or a port TartarOS uses inside the sandbox ({reserved:?}); choose another",
            broker.port
        )));
    }
    Ok(())
}

fn check_paths(policy: &Policy) -> Result<(), PolicyError> {
    for root in &policy.writable_roots {
        // With the caller's file access, as `resolve`: behind a directory
        // the caller may not search, whether it exists is not said.
        match crate::caller::as_caller(|| root.try_exists()) {
            Ok(true) => {}
            Ok(false) => {
                return Err(invalid(format!(
                    "writable root {} does not exist; create it first or drop --write {}",
                    root.display(),
                    root.display()
                )));
            }
            Err(e) => {
                return Err(invalid(format!(
                    "writable root {}: failed to look it up ({e}); name a directory you can reach, or drop --write {}",
                    root.display(),
                    root.display()
                )));
            }
        }
        if root == Path::new("/") {
            return Err(invalid(
                "--write / would let the agent write everywhere; grant the directories it needs",
            ));
        }
        if policy.write_denies.contains(root) {
            return Err(invalid(format!(
                "{} is both a writable root (--write) and write-denied (--write-deny); drop one",
                root.display()
            )));
        }
    }
    for deny in policy.read_denies.iter().chain(&policy.write_denies) {
        if deny == Path::new("/") {
            return Err(invalid(
                "a deny of / leaves nothing to run; deny narrower paths",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
