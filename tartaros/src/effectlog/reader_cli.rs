//! The `tartaros log` subcommands: argument checks, printing and exit
//! codes over the library readers. `show`, `summary` and `report` exit with
//! the log's verify code (0 ok, 1 tampered, 2 unsealed, 3 incomplete), so a
//! script that only reads the summary still learns whether to trust it. A
//! reader whose output is closed (`show | head`) stops quietly.

use std::io::{ErrorKind, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::exit;

use super::{
    Filter, LogError, ShowOptions, VERDICT_UNSEALED, escape, expand_kinds, parse_time, report,
    show, summarize, summary_json, summary_text, verify_file_with_head,
};

/// `tartaros log ...`.
#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Check the hash chain and seal: 0 ok, 1 tampered, 2 unsealed, 3 incomplete.
    Verify {
        file: PathBuf,
        /// The head the run printed when it sealed the log: any other seal is tampered.
        #[arg(long, value_name = "HEX")]
        head: Option<String>,
    },
    /// Print a readable timeline (or --tree); exits with verify's code.
    Show(Box<ShowArgs>),
    /// What changed, where it connected, what was refused; exits with verify's code.
    Summary {
        file: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// The head the run printed when it sealed the log: any other seal is tampered.
        #[arg(long, value_name = "HEX")]
        head: Option<String>,
    },
    /// Write one self-contained HTML page; exits with verify's code.
    Report {
        file: PathBuf,
        /// The HTML file to write (replaced if it exists).
        #[arg(short = 'o', long = "output", value_name = "HTML")]
        output: PathBuf,
        /// The head the run printed when it sealed the log: any other seal is tampered.
        #[arg(long, value_name = "HEX")]
        head: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    pub file: PathBuf,
    /// Only these kinds (repeatable, or comma-separated); groups: file, net, proc.
    #[arg(long, value_name = "KIND")]
    pub kind: Vec<String>,
    /// Only effects the sandbox refused (EACCES/EPERM/EROFS, proxy and broker denials).
    #[arg(long)]
    pub denied: bool,
    /// Only ordinary failures (ENOENT, EEXIST, EXDEV...), not refusals.
    #[arg(long)]
    pub failed: bool,
    /// Only records of this process (with --tree: its subtree).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only records naming a path that matches (`*` within a directory, `**` across).
    #[arg(long, value_name = "GLOB")]
    pub path: Option<String>,
    /// From this time: seconds after the start (90, 1.5, 250ms) or RFC 3339.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Up to this time: seconds after the start or RFC 3339.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// One JSON record per line (for jq and log shippers).
    #[arg(long, conflicts_with = "tree")]
    pub json: bool,
    /// The process tree (with filters: the processes with matching records).
    #[arg(long)]
    pub tree: bool,
    /// The head the run printed when it sealed the log: any other seal is tampered.
    #[arg(long, value_name = "HEX")]
    pub head: Option<String>,
}

/// Exit code when the report cannot be written.
const WRITE_FAILED: i32 = 125;

fn fail(code: i32, message: impl std::fmt::Display) -> i32 {
    eprintln!("tartaros: {message}");
    code
}

fn is_broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::BrokenPipe
}

/// Writes `text` to standard output; a closed pipe is not an error.
fn print(text: &str) -> Result<(), std::io::Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if !is_broken_pipe(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Runs one `tartaros log` subcommand; returns its exit code.
pub fn run(command: LogCommand) -> i32 {
    match command {
        LogCommand::Verify { file, head } => {
            let verdict = verify_file_with_head(&file, head.as_deref());
            match print(&format!("{}\n", verdict.message)) {
                Ok(()) => i32::from(verdict.code),
                Err(e) => fail(WRITE_FAILED, format!("failed to print the verdict: {e}")),
            }
        }
        LogCommand::Show(args) => show_command(*args),
        LogCommand::Summary { file, json, head } => match summarize(&file, head.as_deref()) {
            Ok(s) => {
                let text = if json {
                    format!("{}\n", summary_json(&s))
                } else {
                    summary_text(&s)
                };
                match print(&text) {
                    Ok(()) => i32::from(s.verify_code),
                    Err(e) => fail(WRITE_FAILED, format!("failed to print the summary: {e}")),
                }
            }
            Err(e) => read_failure(&e),
        },
        LogCommand::Report { file, output, head } => {
            match report(&file, &output, head.as_deref()) {
                Ok(code) => {
                    eprintln!(
                        "tartaros: wrote {}",
                        escape::terminal(&output.to_string_lossy())
                    );
                    i32::from(code)
                }
                Err(super::ReportError::Log(e)) => read_failure(&e),
                Err(
                    e @ (super::ReportError::SameFile { .. } | super::ReportError::NotAFile { .. }),
                ) => fail(exit::REFUSED, e),
                Err(e) => fail(
                    WRITE_FAILED,
                    format!("{e}; check the directory and free space"),
                ),
            }
        }
    }
}

fn read_failure(e: &LogError) -> i32 {
    match e {
        LogError::NotAFile { .. } => fail(i32::from(VERDICT_UNSEALED), e),
        _ => fail(
            i32::from(VERDICT_UNSEALED),
            format!("{e}; check the path and permissions"),
        ),
    }
}

fn show_command(args: ShowArgs) -> i32 {
    let filter = match show_filter(&args) {
        Ok(f) => f,
        Err(e) => return fail(exit::REFUSED, e),
    };
    let options = ShowOptions {
        filter,
        json: args.json,
        tree: args.tree,
        head: args.head.clone(),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match show(&args.file, &options, &mut out) {
        Ok(verdict) => i32::from(verdict.code),
        Err(LogError::Output { source }) if is_broken_pipe(&source) => {
            // The reader stopped reading (`| head`): nothing to report, and
            // the buffered rest must not be written on drop either.
            let _ = out.into_parts();
            0
        }
        Err(LogError::Output { source }) => fail(
            WRITE_FAILED,
            format!("failed to write the timeline: {source}"),
        ),
        Err(e) => read_failure(&e),
    }
}

fn show_filter(args: &ShowArgs) -> Result<Filter, super::FilterError> {
    Ok(Filter {
        kinds: expand_kinds(&args.kind)?,
        denied: args.denied,
        failed: args.failed,
        pid: args.pid,
        path: args.path.clone(),
        since: args
            .since
            .as_deref()
            .map(|v| parse_time("--since", v))
            .transpose()?,
        until: args
            .until
            .as_deref()
            .map(|v| parse_time("--until", v))
            .transpose()?,
    })
}
