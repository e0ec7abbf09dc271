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

/// A run that ended before or instead of the agent: the CLI prints
/// `tartaros: <message>` and exits with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
}

impl Refusal {
    pub fn new(code: i32, message: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string(),
        }
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
    fn signal_maps_to_128_plus_n() {
        assert_eq!(from_wait(None, Some(9)), 137);
        assert_eq!(from_wait(Some(3), None), 3);
    }
}
