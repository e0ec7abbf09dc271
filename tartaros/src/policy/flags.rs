//! The policy's command-line flags, defined once: `tartaros run` flattens
//! [`FlagPolicy`] into its arguments, and [`super::build`] merges it with the
//! config file's `[policy]` (list flags add to the file's lists, scalar
//! flags win). The field list is checked against the runner's
//! (`tests/policy_fields.rs`).

use std::path::PathBuf;

use clap::Args;

use super::ReadScope;

/// What the command line asked for.
#[derive(Debug, Default, Clone, Args)]
pub struct FlagPolicy {
    /// Make every requested guarantee mandatory: refuse (exit 78) rather than degrade.
    #[arg(long)]
    pub strict: bool,
    /// Writable root (repeatable).
    #[arg(long = "write", value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Path the agent cannot read, even inside granted trees (repeatable).
    #[arg(long = "read-deny", value_name = "PATH")]
    pub read_deny: Vec<PathBuf>,
    /// Extra readable path under --read-scope granted or none (under none: not executable) (repeatable).
    #[arg(long = "read-allow", value_name = "PATH")]
    pub read_allow: Vec<PathBuf>,
    /// "all" (default): read everywhere; "granted": only system dirs, roots and read-allows;
    /// "none": only what is named (roots, --exec-allow, --read-allow, --tmpfs, --bind).
    #[arg(long = "read-scope", value_name = "SCOPE")]
    pub read_scope: Option<ReadScope>,
    /// Path inside a writable root that stays read-only (repeatable).
    #[arg(long = "write-deny", value_name = "PATH")]
    pub write_deny: Vec<PathBuf>,
    /// Local TCP port the agent may use (repeatable).
    #[arg(long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Vec<u16>,
    /// Domain the agent may reach through the egress proxy (repeatable; *.suffix allowed).
    #[arg(long = "allow-domain", value_name = "HOST")]
    pub allow_domain: Vec<String>,
    /// The agent sees only its own processes.
    #[arg(long)]
    pub isolate_pids: bool,
    /// A fresh /proc with no view of host processes.
    #[arg(long)]
    pub isolate_proc: bool,
    /// Tighter seccomp filter (see docs/seccomp.md).
    #[arg(long)]
    pub seccomp_strict: bool,
    /// Create absent denied paths as empty placeholders for the run.
    #[arg(long)]
    pub materialize: bool,
    /// Maximum number of processes in the sandbox.
    #[arg(long = "max-procs", value_name = "N")]
    pub max_procs: Option<u64>,
    /// Memory limit, in bytes or with K/M/G.
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = crate::config::parse_size)]
    pub max_memory: Option<u64>,
    /// Pass the launcher's whole environment.
    #[arg(long)]
    pub inherit_env: bool,
    /// Pass one variable of the launcher's environment (repeatable).
    #[arg(long = "env", value_name = "NAME")]
    pub env: Vec<String>,
    /// A fresh tmpfs on /tmp.
    #[arg(long)]
    pub private_tmp: bool,
    /// Refuse every AF_UNIX socket.
    #[arg(long)]
    pub deny_unix: bool,
    /// User the agent runs as when tartaros runs as root (default: $SUDO_UID, else nobody).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Kill the run after DURATION (SIGTERM, then the cgroup after --kill-after); exit 124.
    #[arg(long = "timeout", value_name = "DURATION", value_parser = duration_ms)]
    pub timeout_ms: Option<u64>,
    /// Grace period after SIGTERM/SIGINT/SIGHUP or --timeout before every process is killed (default 10s).
    #[arg(long = "kill-after", value_name = "DURATION", value_parser = duration_ms)]
    pub kill_after_ms: Option<u64>,
    /// A path the agent may read and execute from, under any read scope (repeatable).
    #[arg(long = "exec-allow", value_name = "PATH")]
    pub exec_allow: Vec<PathBuf>,
    /// A fresh tmpfs the agent may write, on an existing directory (repeatable).
    #[arg(long = "tmpfs", value_name = "PATH")]
    pub tmpfs: Vec<PathBuf>,
    /// Bind SRC read-only onto the existing DST (repeatable).
    #[arg(long = "bind", num_args = 2, value_names = ["SRC", "DST"], action = clap::ArgAction::Append)]
    pub bind: Vec<PathBuf>,
}

impl FlagPolicy {
    /// The `--bind SRC DST` pairs (read-only binds, source and target).
    pub fn bind_pairs(&self) -> impl Iterator<Item = (&PathBuf, &PathBuf)> {
        self.bind.chunks_exact(2).map(|pair| (&pair[0], &pair[1]))
    }
}

fn duration_ms(raw: &str) -> Result<u64, String> {
    let duration = crate::stop::parse_duration(raw).map_err(|e| e.to_string())?;
    u64::try_from(duration.as_millis()).map_err(|_| format!("{raw:?} is too long"))
}
