//! The `run` flags for harnesses and terminals: the status channel, a label,
//! the agent's working directory and variables (`--chdir`, `--setenv`),
//! `--quiet` and `--tty`. (The per-call scope, `--tmpfs`, `--bind` and
//! `--exec-allow`, is policy: `crate::policy::FlagPolicy`.)

use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Debug, Clone, Default, Args)]
pub struct HarnessArgs {
    /// Write JSON status lines (started, refused, failed, exited) to this
    /// open descriptor; the agent cannot write it (docs/harness.md).
    #[arg(long = "status-fd", value_name = "N")]
    pub status_fd: Option<i32>,
    /// A label for this run, recorded in the log's genesis and the status channel.
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Silence TartarOS's own warnings (errors are still printed).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// The agent's working directory (default: the current one).
    #[arg(long, value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Set a variable in the agent's environment (repeatable).
    #[arg(long = "setenv", value_name = "NAME=VALUE", value_parser = parse_setenv)]
    pub setenv: Vec<(String, String)>,
    /// Give the agent its own pseudo-terminal even when stdin and stdout are not terminals.
    #[arg(long, conflicts_with = "no_tty")]
    pub tty: bool,
    /// Never give the agent a pseudo-terminal, even at a terminal.
    #[arg(long = "no-tty")]
    pub no_tty: bool,
}

/// Longest label we record: enough for a tool-call id and a name.
const MAX_LABEL: usize = 256;

fn parse_setenv(raw: &str) -> Result<(String, String), String> {
    let (name, value) = raw
        .split_once('=')
        .ok_or_else(|| format!("{raw:?} is not NAME=VALUE"))?;
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!(
            "{name:?} is not a variable name (letters, digits, _)"
        ));
    }
    if value.contains('\0') {
        return Err(format!("the value of {name} holds a NUL byte"));
    }
    Ok((name.to_string(), value.to_string()))
}

impl HarnessArgs {
    /// Checks the label: printable, one line, bounded.
    pub fn checked_label(&self) -> Result<Option<String>, String> {
        let Some(label) = &self.label else {
            return Ok(None);
        };
        if label.len() > MAX_LABEL {
            return Err(format!(
                "--label is {} bytes long; keep it to {MAX_LABEL}",
                label.len()
            ));
        }
        if label.chars().any(char::is_control) {
            return Err("--label holds a control character; use printable text".into());
        }
        Ok(Some(label.clone()))
    }

    /// The agent's working directory: `--chdir` resolved against `cwd`,
    /// which must be an existing directory.
    pub fn working_dir(&self, cwd: &Path) -> Result<PathBuf, String> {
        let Some(dir) = &self.chdir else {
            return Ok(cwd.to_path_buf());
        };
        let dir = crate::policy::resolve(dir, cwd);
        // With the service caller's file access, as `resolve`.
        if !crate::caller::as_caller(|| dir.is_dir()) {
            return Err(format!(
                "--chdir {} is not an existing directory; create it or name another",
                dir.display()
            ));
        }
        Ok(dir)
    }

    /// Whether the agent gets a pseudo-terminal: `--tty`, or stdin and
    /// stdout are a terminal and `--no-tty` was not given.
    pub fn wants_pty(&self, stdin_is_tty: bool) -> bool {
        !self.no_tty && (self.tty || stdin_is_tty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setenv_needs_a_name_and_an_equals_sign() {
        assert_eq!(
            parse_setenv("A_1=x=y"),
            Ok(("A_1".to_string(), "x=y".to_string()))
        );
        assert!(parse_setenv("novalue").is_err());
        assert!(parse_setenv("1A=x").is_err());
        assert!(parse_setenv("A-B=x").is_err());
        assert_eq!(parse_setenv("E="), Ok(("E".into(), String::new())));
    }

    #[test]
    fn labels_are_one_printable_line() {
        let mut args = HarnessArgs {
            label: Some("tool-call 7: grep".into()),
            ..Default::default()
        };
        assert_eq!(
            args.checked_label().unwrap().as_deref(),
            Some("tool-call 7: grep")
        );
        args.label = Some("a\nb".into());
        assert!(args.checked_label().is_err());
        args.label = Some("x".repeat(300));
        assert!(args.checked_label().is_err());
    }

    #[test]
    fn pty_follows_the_terminal_unless_told() {
        let mut args = HarnessArgs::default();
        assert!(args.wants_pty(true));
        assert!(!args.wants_pty(false));
        args.tty = true;
        assert!(args.wants_pty(false));
        args.tty = false;
        args.no_tty = true;
        assert!(!args.wants_pty(true));
    }
}
