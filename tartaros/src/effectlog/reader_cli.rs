//! The `tartaros log` subcommands: argument checks, printing and exit
//! codes over the library readers. `show`, `summary` and `report` exit with
//! the log's verify code (0 ok, 1 tampered, 2 unsealed, 3 incomplete), so a
//! script that only reads the summary still learns whether to trust it. A
//! reader whose output is closed (`show | head`) stops quietly.

use std::io::{ErrorKind, Write};

use crate::cli::{LogCommand, ShowArgs};
use crate::exit;

use super::{
    Filter, LogError, ShowOptions, VERDICT_UNSEALED, escape, expand_kinds, parse_time, report,
    show, summarize, summary_json, summary_text, verify_file,
};

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
        LogCommand::Verify { file } => {
            let verdict = verify_file(&file);
            match print(&format!("{}\n", verdict.message)) {
                Ok(()) => i32::from(verdict.code),
                Err(e) => fail(WRITE_FAILED, format!("failed to print the verdict: {e}")),
            }
        }
        LogCommand::Show(args) => show_command(*args),
        LogCommand::Summary { file, json } => match summarize(&file) {
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
        LogCommand::Report { file, output } => match report(&file, &output) {
            Ok(code) => {
                eprintln!(
                    "tartaros: wrote {}",
                    escape::terminal(&output.to_string_lossy())
                );
                i32::from(code)
            }
            Err(super::ReportError::Log(e)) => read_failure(&e),
            Err(e @ super::ReportError::SameFile { .. }) => fail(exit::REFUSED, e),
            Err(e) => fail(
                WRITE_FAILED,
                format!("{e}; check the directory and free space"),
            ),
        },
    }
}

fn read_failure(e: &LogError) -> i32 {
    fail(
        i32::from(VERDICT_UNSEALED),
        format!("{e}; check the path and permissions"),
    )
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
