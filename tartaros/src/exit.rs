//! Exit codes of the `tartaros` command (see README "Exit status").

/// TartarOS refused to run: bad policy, or a guarantee `--strict` requires
/// that this host cannot install. The agent never started.
pub const REFUSED: i32 = 78;
/// TartarOS itself failed to start the sandbox.
pub const START_FAILURE: i32 = 125;
/// The agent command exists but cannot be executed.
pub const CANNOT_EXECUTE: i32 = 126;
/// The agent command was not found.
pub const NOT_FOUND: i32 = 127;

/// A run that ended before or instead of the agent, or (`after_start`)
/// whose init ended while the agent ran: the CLI prints
/// `tartaros: <message>` and exits with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
    /// The init had reported the agent's start (the status channel said
    /// `started`) before the run failed: the agent ran, so the log must
    /// not say it never started (adversarial round 23b).
    pub after_start: bool,
}

impl Refusal {
    pub fn new(code: i32, message: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string(),
            after_start: false,
        }
    }

    /// A failure once the agent had started: its own end is unknown.
    pub fn after_start(code: i32, message: impl std::fmt::Display) -> Self {
        Self {
            after_start: true,
            ..Self::new(code, message)
        }
    }
}

/// The agent exited 0 but its `--log` could not be completed (events lost,
/// the log's filesystem full, capture degraded, the seal not written):
/// `tartaros log verify` will not say `ok`. A non-zero agent status is
/// kept as it is; a line starting `tartaros:` says why either way.
pub const LOG_INCOMPLETE: i32 = 122;

/// The exit status of a run whose agent ended with `code`: `code`, unless
/// it is 0 and the log is not complete.
pub fn with_log(code: i32, log_complete: bool) -> i32 {
    if code == 0 && !log_complete {
        LOG_INCOMPLETE
    } else {
        code
    }
}

/// Maps a wait status of the agent to our exit status: its own code, or
/// 128+N when it died of signal N (the shell convention).
pub fn from_wait(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => START_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incomplete_log_fails_a_successful_run_only() {
        assert_eq!(with_log(0, false), LOG_INCOMPLETE);
        assert_eq!(with_log(3, false), 3);
        assert_eq!(with_log(0, true), 0);
    }

    #[test]
    fn signal_maps_to_128_plus_n() {
        assert_eq!(from_wait(None, Some(9)), 137);
        assert_eq!(from_wait(Some(3), None), 3);
    }
}
