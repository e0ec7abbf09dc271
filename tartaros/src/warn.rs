//! TartarOS's own warnings: every one starts `tartaros: warning:` (so it
//! cannot be mistaken for the agent's output), and `--quiet` silences them.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Silences (or restores) every warning of this process.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Prints `tartaros: warning: <message>` unless `--quiet`.
pub fn emit(message: std::fmt::Arguments<'_>) {
    if !quiet() {
        eprintln!("tartaros: warning: {message}");
    }
}

/// Prints a TartarOS warning (see [`emit`]).
#[macro_export]
macro_rules! tt_warn {
    ($($arg:tt)*) => {
        $crate::warn::emit(format_args!($($arg)*))
    };
}
