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
        say(format_args!("warning: {message}"));
    }
}

/// Prints `tartaros: <message>` on stderr. Unlike `eprintln!` it does not
/// panic when stderr is a closed pipe (`2>&1 | head`): a message nobody
/// reads must not abort a run in the middle of its teardown.
pub fn say(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{}tartaros: {message}", terminal_reset());
}

/// At a terminal, the display state the agent's output may have left
/// (round 20: `ESC[8;30;40m`, concealed black on black, hid the real
/// `effect log sealed` and `incomplete` lines after a forged one): every
/// attribute and colour off, and the ASCII character set back in G0.
/// Nothing else: no clearing, no cursor movement.
fn terminal_reset() -> &'static str {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        "\x1b[0m\x1b(B"
    } else {
        ""
    }
}

/// Prints a TartarOS warning (see [`emit`]).
#[macro_export]
macro_rules! tt_warn {
    ($($arg:tt)*) => {
        $crate::warn::emit(format_args!($($arg)*))
    };
}
