//! The everyday parts of the command line: clap's messages with our prefix
//! and exit status, `doctor --json`, completions, the man page, and the
//! status line for a run that ends before its agent starts.

use std::ffi::OsString;
use std::io::Write;

use clap::Args;

use crate::exit;
use crate::status::{Event, StatusChannel};

#[derive(Debug, Clone, Default, Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also remove the cgroups of killed runs (never a live run's).
    #[arg(long)]
    pub clean: bool,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum CacheCommand {
    /// Unmount and remove the verified programs (and spare rings) pinned in /run/tartaros/bpf.
    Drop,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// The `--status-fd N` of a command line clap refused, so that the refusal
/// still reaches the harness.
pub fn status_fd_in(args: &[OsString]) -> Option<i32> {
    let mut iter = args.iter().filter_map(|a| a.to_str());
    while let Some(arg) = iter.next() {
        if arg == "--" {
            return None;
        }
        if arg == "--status-fd" {
            return iter.next().and_then(|n| n.parse().ok());
        }
        if let Some(n) = arg.strip_prefix("--status-fd=") {
            return n.parse().ok();
        }
    }
    None
}

/// Prints clap's whole message (tips, usage) with `tartaros:` in place of
/// `error:`, and returns 78; help and version go to stdout with 0.
pub fn usage_error(error: &clap::Error, status_fd: Option<i32>) -> i32 {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            return exit::REFUSED;
        }
        _ => {}
    }
    let rendered = error.render().to_string();
    let text = prefixed(&rendered);
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    if let Some(fd) = status_fd
        && let Ok(channel) = StatusChannel::adopt(fd)
    {
        let first = text.lines().next().unwrap_or_default();
        report_end(
            Some(&channel),
            exit::REFUSED,
            first.trim_start_matches("tartaros: "),
        );
    }
    exit::REFUSED
}

/// `error: X\n...` becomes `tartaros: X\n...`, ending in one newline.
pub fn prefixed(rendered: &str) -> String {
    let body = rendered.strip_prefix("error: ").unwrap_or(rendered);
    let mut text = format!("tartaros: {}", body.trim_end());
    text.push('\n');
    text
}

/// Sends the status line of a run that ended before its agent started:
/// `refused` for 78, `failed` otherwise.
pub fn report_end(channel: Option<&StatusChannel>, code: i32, message: &str) {
    let reason = one_line(message);
    let event = if code == exit::REFUSED {
        Event::Refused {
            code,
            field: crate::status::field_of(&reason),
            reason,
        }
    } else {
        Event::Failed { code, reason }
    };
    crate::status::send(channel, event);
}

fn one_line(message: &str) -> String {
    message.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// `tartaros doctor [--json]`.
pub fn doctor(args: &DoctorArgs) -> i32 {
    if !args.json {
        return crate::doctor::print(args.clean);
    }
    let (report, code) = crate::doctor_report::collect();
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer_pretty(&mut out, &report)
        .and_then(|()| out.write_all(b"\n").map_err(serde_json::Error::io))
    {
        Ok(()) => code,
        Err(e) if e.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe) => 0,
        Err(e) => {
            crate::warn::say(format_args!("failed to write the doctor report: {e}"));
            1
        }
    }
}

/// `tartaros cache drop`: the next plain root run loads its programs
/// afresh (and pins them again).
pub fn cache(command: &CacheCommand) -> i32 {
    match command {
        CacheCommand::Drop => match crate::ebpf::drop_cache() {
            Ok(_) => 0,
            Err(e) => {
                crate::warn::say(format_args!("{e}"));
                1
            }
        },
    }
}

/// `tartaros completions SHELL`, for `command` (the CLI's definition).
pub fn completions(args: &CompletionsArgs, mut command: clap::Command) -> i32 {
    let mut buffer = Vec::new();
    clap_complete::generate(args.shell, &mut command, "tartaros", &mut buffer);
    write_stdout(&buffer)
}

/// `tartaros manpage [SUBCOMMAND]`: a man page of `main` (the CLI's
/// definition), for packaging.
pub fn manpage(subcommand: Option<&str>, main: clap::Command) -> i32 {
    let command = match subcommand {
        None => main,
        Some(name) => match (main.find_subcommand(name), page_name(name)) {
            (Some(sub), Some(page)) => sub.clone().name(page),
            _ => {
                crate::warn::say(format_args!("no subcommand {name:?}; see tartaros --help"));
                return exit::REFUSED;
            }
        },
    };
    let mut buffer = Vec::new();
    if let Err(e) = clap_mangen::Man::new(command).render(&mut buffer) {
        crate::warn::say(format_args!("failed to render the man page: {e}"));
        return 1;
    }
    write_stdout(&buffer)
}

fn page_name(subcommand: &str) -> Option<&'static str> {
    Some(match subcommand {
        "run" => "tartaros-run",
        "doctor" => "tartaros-doctor",
        "log" => "tartaros-log",
        "completions" => "tartaros-completions",
        "service" => "tartaros-service",
        _ => return None,
    })
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> i32 {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            crate::warn::say(format_args!("failed to write to stdout: {e}"));
            1
        }
    }
}

/// A writer for a command's output: when the reader has gone away (`| head`)
/// the command has nothing left to do, so it ends at once with 0.
pub struct QuietPipe<W: Write>(pub W);

impl<W: Write> Write for QuietPipe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).inspect_err(end_on_broken_pipe)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().inspect_err(end_on_broken_pipe)
    }
}

fn end_on_broken_pipe(e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
}

/// Makes a closed stdout end the process quietly: `print!` panics on
/// EPIPE (Rust ignores SIGPIPE), which would abort with 134.
pub fn quiet_broken_pipe() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fd_is_found_before_dashes_only() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            status_fd_in(&args(&["t", "run", "--status-fd", "5"])),
            Some(5)
        );
        assert_eq!(status_fd_in(&args(&["t", "run", "--status-fd=6"])), Some(6));
        assert_eq!(
            status_fd_in(&args(&["t", "run", "--", "x", "--status-fd", "5"])),
            None
        );
    }
}
