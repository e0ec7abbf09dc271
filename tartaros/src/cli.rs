//! The command line: `tartaros run | doctor | log`.
//!
//! Bad input of any kind exits 78 with one `tartaros:` line, so a harness can
//! tell a refusal from the agent's own failure.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::effectlog::reader_cli::LogCommand;
use crate::exit;
use crate::policy::{FlagPolicy, ReadScope};
use crate::supervisor::{RunRequest, run};

#[derive(Debug, Parser)]
#[command(
    name = "tartaros",
    version,
    about = "A sandbox for AI coding agents, with a verifiable effect log"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in the sandbox: `tartaros run [flags] -- cmd args...`
    Run(Box<RunArgs>),
    /// Print what this host can enforce.
    Doctor(crate::cli_extra::DoctorArgs),
    /// Print a shell completion script: `tartaros completions bash > ...`.
    Completions(crate::cli_extra::CompletionsArgs),
    /// Print the man page (roff), generated from this command line.
    #[command(hide = true)]
    Manpage {
        /// A subcommand's page (`tartaros-run`) instead of the main one.
        subcommand: Option<String>,
    },
    /// Run the root service that runs sandboxes for ordinary users (foreground).
    Service {
        /// The unix socket to listen on.
        #[arg(long, value_name = "PATH", default_value = crate::service::DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Verify or read an effect log.
    #[command(subcommand)]
    Log(LogCommand),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Make every requested guarantee mandatory: refuse (exit 78) rather than degrade.
    #[arg(long)]
    pub strict: bool,
    /// Policy file with a [policy] (and optional [broker]) table; flags add to it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = parse_size)]
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
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub timeout: Option<u64>,
    /// Grace period after SIGTERM/SIGINT/SIGHUP or --timeout before every process is killed (default 10s).
    #[arg(long = "kill-after", value_name = "DURATION", value_parser = parse_duration_ms)]
    pub kill_after: Option<u64>,
    /// Write the effect log to FILE (must not exist).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Kernel ring buffer for captured events (rounded up to a power of two; default 8M).
    #[arg(long = "log-buffer", value_name = "SIZE", value_parser = parse_size)]
    pub log_buffer: Option<u64>,
    #[command(flatten)]
    pub harness: crate::run_options::HarnessArgs,
    /// The agent's command and arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn parse_size(raw: &str) -> Result<u64, String> {
    crate::config::parse_size(raw)
}

fn parse_duration_ms(raw: &str) -> Result<u64, String> {
    let duration = crate::stop::parse_duration(raw).map_err(|e| e.to_string())?;
    u64::try_from(duration.as_millis()).map_err(|_| format!("{raw:?} is too long"))
}

/// The ring buffer size: a power of two the kernel accepts, 64 KiB to 1 GiB.
fn ring_size(requested: Option<u64>) -> Result<u32, String> {
    const DEFAULT: u64 = crate::ebpf::DEFAULT_RING_BYTES as u64;
    let size = requested.unwrap_or(DEFAULT);
    if !(64 << 10..=1 << 30).contains(&size) {
        return Err(format!(
            "--log-buffer {size} is out of range; use 64K to 1G"
        ));
    }
    u32::try_from(size.next_power_of_two()).map_err(|_| format!("--log-buffer {size} is too large"))
}

/// Prints `tartaros: <message>` and returns `code`.
fn fail(code: i32, message: impl std::fmt::Display) -> i32 {
    crate::warn::say(format_args!("{message}"));
    code
}

/// Parses the command line and runs it; returns the process exit status.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let status_fd = crate::cli_extra::status_fd_in(&args);
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return crate::cli_extra::usage_error(&e, status_fd),
    };
    match cli.command {
        Command::Run(args) => run_command(*args),
        Command::Doctor(args) => crate::cli_extra::doctor(&args),
        Command::Completions(args) => {
            crate::cli_extra::completions(&args, <Cli as clap::CommandFactory>::command())
        }
        Command::Manpage { subcommand } => crate::cli_extra::manpage(
            subcommand.as_deref(),
            <Cli as clap::CommandFactory>::command(),
        ),
        Command::Service { socket } => match crate::service::server::serve(&socket) {
            Ok(()) => 0,
            Err(e) => fail(exit::START_FAILURE, e),
        },
        Command::Log(command) => crate::effectlog::reader_cli::run(command),
    }
}

fn run_command(mut args: RunArgs) -> i32 {
    let started_at = std::time::Instant::now();
    crate::warn::set_quiet(args.harness.quiet);
    let status = match args
        .harness
        .status_fd
        .map(crate::status::StatusChannel::adopt)
    {
        Some(Ok(channel)) => Some(std::sync::Arc::new(channel)),
        Some(Err(e)) => return fail(exit::REFUSED, e),
        None => None,
    };
    // Every end before the agent starts is also a status line.
    let end = |code: i32, message: String| {
        crate::cli_extra::report_end(status.as_deref(), code, &message);
        fail(code, message)
    };
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(e) => {
            return end(
                exit::REFUSED,
                format!(
                    "failed to read the working directory: {e}; run from an existing directory"
                ),
            );
        }
    };
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = match &args.config {
        // Read with the caller's file access when the service runs this.
        Some(path) => match crate::caller::as_caller(|| {
            crate::config::load(path, std::io::stdin().lock(), home.as_deref())
        }) {
            Ok(file) => Some(file),
            Err(e) => return end(exit::REFUSED, e.to_string()),
        },
        None => None,
    };
    let label = match args.harness.checked_label() {
        Ok(label) => label,
        Err(e) => return end(exit::REFUSED, e),
    };
    let workdir = match args.harness.working_dir(&cwd) {
        Ok(dir) => dir,
        Err(e) => return end(exit::REFUSED, e),
    };
    let harness = std::mem::take(&mut args.harness);
    let flags = FlagPolicy {
        write: args.write,
        read_deny: args.read_deny,
        read_allow: args.read_allow,
        read_scope: args.read_scope,
        write_deny: args.write_deny,
        port: args.port,
        allow_domain: args.allow_domain,
        isolate_pids: args.isolate_pids,
        isolate_proc: args.isolate_proc,
        seccomp_strict: args.seccomp_strict,
        materialize: args.materialize,
        max_procs: args.max_procs,
        max_memory: args.max_memory,
        inherit_env: args.inherit_env,
        env: args.env,
        private_tmp: args.private_tmp,
        deny_unix: args.deny_unix,
        strict: args.strict,
        user: args.user,
        timeout_ms: args.timeout,
        kill_after_ms: args.kill_after,
        exec_allow: harness.exec_allow.clone(),
        tmpfs: harness.tmpfs.clone(),
        bind: harness.bind_pairs(),
    };
    let launcher_env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let env_is_set = |name: &str| launcher_env.iter().any(|(k, _)| k == name);
    let policy = match crate::policy::build(file, flags, &cwd, &env_is_set) {
        Ok(policy) => policy,
        Err(e) => return end(exit::REFUSED, e.to_string()),
    };
    if let Some(log) = &args.log
        && std::fs::symlink_metadata(log).is_ok()
    {
        return end(
            exit::REFUSED,
            format!(
                "--log {} already exists; choose a new file (the log is append-only and never overwritten)",
                log.display()
            ),
        );
    }
    let log_buffer = match ring_size(args.log_buffer) {
        Ok(size) => size,
        Err(e) => return end(exit::REFUSED, e),
    };
    // Forked while we are still single-threaded, before the runtime.
    let janitor = match crate::janitor::Janitor::fork() {
        Ok(janitor) => Some(janitor),
        Err(e) => {
            crate::tt_warn!("{e}; a crash of tartaros would leave its cgroup behind");
            None
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return end(
                exit::START_FAILURE,
                format!("failed to start the async runtime: {e}"),
            );
        }
    };
    let log = args.log.map(|log| crate::policy::resolve(&log, &cwd));
    // Both ends a terminal: with output redirected, a pty would turn
    // newlines into CRLF and merge stderr into stdout.
    let at_terminal =
        nix::unistd::isatty(0).unwrap_or(false) && nix::unistd::isatty(1).unwrap_or(false);
    let pty = harness.wants_pty(at_terminal);
    let request = RunRequest {
        policy,
        argv: args.command,
        cwd: workdir,
        log,
        log_buffer,
        launcher_env,
        janitor,
        status: status.clone(),
        label,
        setenv: harness.setenv,
        pty,
        started_at,
    };
    match runtime.block_on(run(request)) {
        Ok(code) => code,
        Err(refusal) => end(refusal.code, refusal.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_round_up_and_stay_in_range() {
        assert_eq!(ring_size(None), Ok(8 << 20));
        assert_eq!(ring_size(Some(100_000)), Ok(1 << 17));
        assert!(ring_size(Some(1)).is_err());
        assert!(ring_size(Some(4 << 30)).is_err());
    }

    #[test]
    fn run_needs_a_command_after_dashes() {
        assert!(Cli::try_parse_from(["tartaros", "run", "--", "true"]).is_ok());
        assert!(Cli::try_parse_from(["tartaros", "run"]).is_err());
        assert!(Cli::try_parse_from(["tartaros", "run", "--port", "70000", "--", "true"]).is_err());
        assert!(Cli::try_parse_from(["tartaros", "run", "--port", "0", "--", "true"]).is_err());
    }

    #[test]
    fn clap_text_keeps_tip_and_usage_behind_our_prefix() {
        let error = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(["tartaros", "run", "--wrte", "x", "--", "true"])
            .unwrap_err();
        let text = crate::cli_extra::prefixed(&error.render().to_string());
        assert!(
            text.starts_with("tartaros: unexpected argument '--wrte'"),
            "{text}"
        );
        assert!(
            text.contains("tip: a similar argument exists: '--write'"),
            "{text}"
        );
        assert!(text.contains("Usage: tartaros run"), "{text}");
    }

    #[test]
    fn completions_and_man_page_render() {
        let mut command = <Cli as clap::CommandFactory>::command();
        let mut buffer = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut command,
            "tartaros",
            &mut buffer,
        );
        assert!(String::from_utf8_lossy(&buffer).contains("--status-fd"));
        let mut man = Vec::new();
        clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
            .render(&mut man)
            .unwrap();
        assert!(String::from_utf8_lossy(&man).contains(".TH tartaros"));
    }
}
