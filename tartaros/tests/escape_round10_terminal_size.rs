//! Adversarial round 10: the launcher's terminal's window size.
//!
//! Without a pty of its own (`tartaros run -- cmd > out.txt` at a prompt)
//! the agent holds the launcher's terminal as a standard stream.
//! `TIOCSWINSZ` on it needs no controlling terminal: the kernel stores the
//! new size in the terminal and sends SIGWINCH to the terminal's
//! foreground process group, which is the launcher's job on the host (the
//! supervisor, and `less` in `tartaros run ... | less`). The size is the
//! terminal's, so it outlives the run: the user's shell and editor draw
//! for a 1x1 window until the next real resize. Proved from the host: the
//! size read through the master the test keeps, and the SIGWINCHes a host
//! process in the terminal's foreground group received.

mod common;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::*;

/// A host process that is the terminal's session leader and foreground
/// group, and counts the SIGWINCHes it gets in a file.
const WITNESS: &str = r#"
import signal, sys
count = open(sys.argv[1], 'a')
def winch(*_):
    count.write('w')
    count.flush()
signal.signal(signal.SIGWINCH, winch)
print('ready', flush=True)
while True:
    signal.pause()
"#;

const AGENT: &str = r#"
import errno, fcntl, struct, termios
try:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack('HHHH', 1, 1, 0, 0))
    print('winsz ok', flush=True)
except OSError as e:
    print('winsz', errno.errorcode[e.errno], flush=True)
"#;

fn window_size(fd: i32) -> (u16, u16) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
    assert_eq!(rc, 0, "TIOCGWINSZ");
    (size.ws_row, size.ws_col)
}

/// The agent resized the launcher's terminal to 1x1 and signalled its
/// foreground group. `TIOCSWINSZ` was then refused (EPERM) in a run that
/// hands the agent a host terminal; since round 23b no such run hands
/// one over (the terminal is relayed, and the agent gets ENOTTY).
#[test]
fn the_agent_cannot_resize_the_launchers_terminal_or_signal_its_job() {
    if !can_run("the_agent_cannot_resize_the_launchers_terminal_or_signal_its_job") {
        return;
    }
    let work = Dir::new();
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let count = work.join("winch-count");
    std::fs::write(&count, "").unwrap();
    let witness_tty = slave.try_clone().unwrap();
    let mut witness = Command::new("python3");
    witness
        .arg("-c")
        .arg(WITNESS)
        .arg(&count)
        .stdin(witness_tty)
        .stdout(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        witness.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut witness = witness.spawn().unwrap();
    let mut ready = String::new();
    BufReader::new(witness.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready", "the witness did not start");

    let w = work.path().to_str().unwrap();
    // stdout is a pipe, so the run makes no pty: stdin is the terminal.
    let out = Command::new(bin())
        .args(["run", "--write", w, "--", "python3", "-c", AGENT])
        .current_dir(work.path())
        .stdin(slave.try_clone().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = window_size(pty.master.as_raw_fd());
    let _ = witness.kill();
    let _ = witness.wait();
    let signals = std::fs::read_to_string(&count).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("winsz"), "the agent did not run");
    assert_eq!(
        after,
        (24, 80),
        "the agent resized the launcher's terminal; agent said: {}",
        stdout(&out)
    );
    assert_eq!(
        signals.len(),
        0,
        "a host process in the terminal's foreground group got SIGWINCH"
    );
    // Since adversarial round 23b the terminal is relayed: the agent's
    // stdin is a pipe, which has no window size (tests/terminal_round23.rs).
    expect(&out, "winsz", "ENOTTY");
}
