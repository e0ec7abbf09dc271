//! The command line: `tartaros run | doctor | log`.
//!
//! Bad input of any kind exits 78 with one `tartaros:` line, so a harness can
//! tell a refusal from the agent's own failure.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::effectlog::reader_cli::LogCommand;
use crate::exit;
use crate::policy::FlagPolicy;
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
        /// Runs one user may have in progress at once (the rest are refused).
        #[arg(long, value_name = "N", default_value_t = crate::service::running::DEFAULT_PER_USER,
              value_parser = clap::value_parser!(u16).range(1..=i64::from(tartaros_common::MAX_RUNS)))]
        max_runs_per_user: u16,
    },
    /// Verify or read an effect log.
    #[command(subcommand)]
    Log(LogCommand),
    /// Manage what runs leave on the host to start faster.
    #[command(subcommand)]
    Cache(crate::cli_extra::CacheCommand),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Policy file with a [policy] (and optional [broker]) table; flags add to it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub policy: FlagPolicy,
    /// Write the effect log to FILE (must not exist).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Kernel ring buffer for captured events (rounded up to a power of two; default 8M, at most 8M through the service).
    #[arg(long = "log-buffer", value_name = "SIZE", value_parser = crate::config::parse_size)]
    pub log_buffer: Option<u64>,
    #[command(flatten)]
    pub harness: crate::run_options::HarnessArgs,
    /// The agent's command and arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
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
    let ring = u32::try_from(size.next_power_of_two())
        .map_err(|_| format!("--log-buffer {size} is too large"))?;
    // Through the service the ring is root's memory, allocated whole at
    // the start and charged to the service, never to the caller: at 1G a
    // run, any user could have root pin a gigabyte per run it holds. The
    // default is what the bound on a caller's runs already counts.
    if crate::caller::caller().is_some() && u64::from(ring) > DEFAULT {
        return Err(format!(
            "--log-buffer {size}: through the service a run's log buffer is at most {} MiB (the service's memory, not yours); ask for less, or run as root",
            DEFAULT >> 20
        ));
    }
    Ok(ring)
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
        Command::Service {
            socket,
            max_runs_per_user,
        } => match crate::service::server::serve(&socket, usize::from(max_runs_per_user)) {
            Ok(()) => 0,
            Err(e) => fail(exit::START_FAILURE, e),
        },
        Command::Log(command) => crate::effectlog::reader_cli::run(command),
        Command::Cache(command) => crate::cli_extra::cache(&command),
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
    // A service run's agent is its caller, whose HOME the worker holds.
    let launcher = crate::caller::launcher_identity();
    let home = crate::credentials::tilde_home(
        args.policy.user.as_deref(),
        launcher,
        &|name| std::env::var(name).ok(),
        &crate::credentials::passwd_home,
    );
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
    let flags = std::mem::take(&mut args.policy);
    let launcher_env = crate::caller::launcher_environment();
    let env_is_set = |name: &str| launcher_env.iter().any(|(k, _)| k == name);
    let policy = match crate::policy::build(file, flags, &cwd, &env_is_set) {
        Ok(policy) => policy,
        Err(e) => return end(exit::REFUSED, e.to_string()),
    };
    // Only now are the writable roots known (a config file may name them);
    // a status file under one is the agent's to append to, and so is a
    // socket whose peer is bound there or listens on a `--port`.
    if let Some(Err(e)) = status
        .as_deref()
        .map(|s| s.check_outside_roots(&policy.writable_roots, &policy.local_ports))
    {
        return end(exit::REFUSED, e.to_string());
    }
    // Run by the service, what the policy names is looked up with the
    // caller's file access (so are the lookups in `build`): an answer must
    // not tell the caller what lies where it cannot look itself.
    if let Err(e) = crate::caller::check_visible(&policy) {
        return end(exit::REFUSED, e);
    }
    if let Some(log) = &args.log
        && let Err(e) = log_is_new(log, &cwd)
    {
        return end(exit::REFUSED, e);
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
    // Also before the runtime: the init is cloned from it and runs our code
    // without a second exec. Without it the init is exec'd.
    let zygote = crate::zygote::Zygote::fork().ok();
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
        zygote,
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

/// Refuses a `--log` path that exists, or that the caller (the service's,
/// with its own file access) cannot look at: the same line whether or not
/// something is there behind a directory it may not search. A path through
/// a symlink is refused too: the log's own name and the real directories
/// above it cannot be moved by the agent (mount points in its namespace),
/// but a link in a writable root can be re-pointed, and the name the user
/// reads the log by afterwards then holds the agent's file.
fn log_is_new(log: &Path, cwd: &Path) -> Result<(), String> {
    let named = crate::path_checks::lexical(log, cwd);
    if let Some(found) =
        crate::path_checks::first_symlink(&named, &crate::path_checks::host_read_link)
    {
        let resolved = crate::policy::resolve(&named, cwd);
        return Err(crate::path_checks::symlink_refusal(
            "--log", &named, &found, &resolved,
        ));
    }
    match crate::caller::as_caller(|| std::fs::symlink_metadata(log)) {
        Ok(_) => Err(format!(
            "--log {} already exists; choose a new file (the log is append-only and never overwritten)",
            log.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "--log {}: failed to look it up ({e}); choose a new file in a directory you can write",
            log.display()
        )),
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
