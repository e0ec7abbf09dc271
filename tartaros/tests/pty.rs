//! The agent's own pseudo-terminal: the test plays the user's terminal with a
//! pty pair of its own, starts `tartaros run` on its slave (session leader,
//! controlling terminal), types on the master and reads what comes back.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The user's terminal: the master end, and `tartaros run args...` on the slave.
struct Terminal {
    master: std::fs::File,
    slave_name: String,
    child: Child,
    seen: String,
}

fn set_size(fd: &impl AsRawFd, rows: u16, cols: u16) {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize that outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(rc, 0, "TIOCSWINSZ");
}

impl Terminal {
    fn start(args: &[&str], rows: u16, cols: u16) -> Self {
        let pair = nix::pty::openpty(None, None).expect("openpty");
        set_size(&pair.master, rows, cols);
        let slave_name = std::fs::read_link(format!("/proc/self/fd/{}", pair.slave.as_raw_fd()))
            .expect("slave name")
            .display()
            .to_string();
        let mut command = Command::new(bin());
        command.args(args).current_dir("/");
        on_terminal(&mut command, pair.slave);
        let child = command.spawn().expect("spawn tartaros");
        // SAFETY: O_NONBLOCK on our own master only.
        unsafe {
            let flags = libc::fcntl(pair.master.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(
                pair.master.as_raw_fd(),
                libc::F_SETFL,
                flags | libc::O_NONBLOCK,
            );
        }
        Self {
            master: std::fs::File::from(pair.master),
            slave_name,
            child,
            seen: String::new(),
        }
    }

    fn type_text(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).expect("type");
    }

    /// Reads until `needle` has been printed (after what was already
    /// matched), for up to 10 s.
    #[track_caller]
    fn expect(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        loop {
            if let Some(at) = self.seen.find(needle) {
                self.seen.drain(..at + needle.len());
                return;
            }
            if Instant::now() > deadline {
                panic!("{needle:?} never came; the terminal shows:\n{}", self.seen);
            }
            match self.master.read(&mut buf) {
                Ok(0) => std::thread::sleep(Duration::from_millis(10)),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Waits for tartaros to end (draining the terminal meanwhile).
    fn wait(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = self.master.read(&mut buf) {
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // What it wrote between our last read and its exit (the
                // seal line, say) is still in the terminal: read it too.
                while let Ok(n) = self.master.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
                return (status.code(), std::mem::take(&mut self.seen));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("tartaros did not end; the terminal shows:\n{}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_agent_gets_its_own_terminal_and_its_exit_status_comes_back() {
    if !can_run("pty_exit") {
        return;
    }
    let mut term = Terminal::start(
        &[
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            "test -t 0 && test -t 1 && echo IS-A-TTY; echo NAME=$(tty); stty size; exit 7",
        ],
        33,
        101,
    );
    term.expect("IS-A-TTY");
    term.expect("NAME=/dev/pts/");
    // The size the user's terminal had at the start.
    term.expect("33 101");
    let outer = term.slave_name.clone();
    // A pty's settings read through its master are the slave's (the slave
    // itself is hung up once its session leader, tartaros, has exited).
    let user_side = term.master.try_clone().unwrap();
    let (code, rest) = term.wait();
    assert_eq!(code, Some(7), "{rest}");
    // tartaros gave the user's terminal back as it found it (not raw).
    let mode = nix::sys::termios::tcgetattr(&user_side).expect("tcgetattr");
    use nix::sys::termios::LocalFlags;
    assert!(
        mode.local_flags
            .contains(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG)
    );
    // Its own pty, not the user's terminal.
    assert!(!rest.contains(&format!("NAME={outer}\r")), "{rest}");
}

#[test]
fn job_control_stops_only_the_job() {
    if !can_run("pty_job_control") {
        return;
    }
    let mut term = Terminal::start(
        &["run", "-q", "--", "bash", "--norc", "--noprofile", "-i"],
        24,
        80,
    );
    term.type_text("echo READY-$((40+2))\n");
    term.expect("READY-42");
    // Seen from the host: the job's state letter in /proc (R/S running, T stopped).
    let job_state = || {
        processes_with("61.25").first().and_then(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            stat.rsplit(") ").next()?.chars().next()
        })
    };
    term.type_text("sleep 61.25\n");
    assert!(
        eventually(10, || matches!(job_state(), Some('S' | 'R'))),
        "the job never ran"
    );
    term.type_text("\x1a");
    term.expect("Stopped");
    assert!(
        eventually(5, || job_state() == Some('T')),
        "Ctrl-Z did not stop the job"
    );
    // The shell (and the sandbox) still runs and answers.
    term.type_text("echo ALIVE-$((1+1))\n");
    term.expect("ALIVE-2");
    term.type_text("fg\n");
    assert!(
        eventually(5, || matches!(job_state(), Some('S' | 'R'))),
        "fg did not resume the job"
    );
    // Let bash hand the terminal to the job before Ctrl-C.
    std::thread::sleep(Duration::from_millis(200));
    // Ctrl-C ends the foreground job only.
    term.type_text("\x03");
    assert!(
        eventually(5, || job_state().is_none()),
        "Ctrl-C did not end the job"
    );
    term.type_text("echo AFTER-$((2+3))\n");
    term.expect("AFTER-5");
    term.type_text("exit 5\n");
    let (code, seen) = term.wait();
    assert_eq!(code, Some(5), "{seen}");
    assert!(!seen.contains("no job control"), "{seen}");
    assert!(
        !seen.contains("cannot set terminal process group"),
        "{seen}"
    );
}

#[test]
fn a_resize_reaches_the_agent() {
    if !can_run("pty_resize") {
        return;
    }
    let mut term = Terminal::start(
        &[
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            "trap 'echo SIZE=$(stty size); exit 0' WINCH; echo READY; while :; do sleep 0.05; done",
        ],
        24,
        80,
    );
    term.expect("READY");
    // What a terminal emulator does on resize: the kernel then signals
    // SIGWINCH to tartaros, the foreground process of this terminal.
    set_size(&term.master, 50, 132);
    term.expect("SIZE=50 132");
    let (code, seen) = term.wait();
    assert_eq!(code, Some(0), "{seen}");
}

#[test]
fn tiocsti_cannot_reach_the_users_terminal() {
    if !can_run("pty_tiocsti") {
        return;
    }
    let code = "import fcntl, termios, os, sys\n\
        try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('TIOCSTI OK')\n\
        except OSError as e: print('TIOCSTI', e.errno)\n\
        print('TTY', os.ttyname(0))\n\
        print('FDS', ' '.join(sorted(os.listdir('/proc/self/fd'))))\n\
        sys.stdout.flush()\n";
    let mut term = Terminal::start(&["run", "-q", "--", "python3", "-c", code], 24, 80);
    // Refused (EPERM) even on its own pty, by seccomp.
    term.expect("TIOCSTI 1\r");
    term.expect("TTY /dev/pts/");
    let outer = term.slave_name.clone();
    let (status, seen) = term.wait();
    assert_eq!(status, Some(0), "{seen}");
    // Its terminal is its own pty; it holds no other descriptor (0-2 and
    // the one listdir opens) through which it could reach the user's.
    assert!(!seen.contains(&format!("TTY {outer}\r")), "{seen}");
    assert!(seen.contains("FDS 0 1 2 3\r"), "{seen}");
}

#[test]
fn tty_forces_a_pty_for_piped_input_and_output_stays_plain_without_it() {
    if !can_run("pty_forced") {
        return;
    }
    let run = |flags: &[&str]| {
        let mut child = Command::new(bin())
            .args(["run", "-q"])
            .args(flags)
            .args(["--", "sh", "-c", "if [ -t 0 ]; then echo TTY; else echo NOTTY; fi; read line; echo got-$line; exit 4"])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child.stdin.take().unwrap().write_all(b"abc\n").unwrap();
        child.wait_with_output().expect("wait")
    };
    let forced = run(&["--tty"]);
    assert_eq!(forced.status.code(), Some(4), "{}", stderr(&forced));
    let text = stdout(&forced);
    assert!(
        text.contains("TTY\r\n") && text.contains("got-abc\r\n"),
        "{text:?}"
    );
    // Without a terminal and without --tty: plain pipes, no CRLF.
    let plain = run(&[]);
    assert_eq!(plain.status.code(), Some(4));
    assert_eq!(stdout(&plain), "NOTTY\ngot-abc\n");
}

#[test]
fn the_agents_display_state_does_not_hide_tartaros_s_own_lines() {
    if !can_run("pty_display_reset") {
        return;
    }
    // Round 20: the agent left concealed black-on-black text behind, and
    // the real `effect log sealed` line that followed was invisible.
    let work = Dir::new();
    let log = work.join("effects.jsonl");
    let log = log.to_str().unwrap();
    let term = Terminal::start(
        &["run", "--log", log, "--", "printf", "\\033[8;30;40mhidden"],
        24,
        80,
    );
    let (code, shown) = term.wait();
    assert_eq!(code, Some(0), "{shown}");
    let sealed = shown
        .find("tartaros: effect log sealed")
        .unwrap_or_else(|| panic!("no seal line: {shown:?}"));
    assert!(
        shown[..sealed].ends_with("\u{1b}[0m\u{1b}(B"),
        "the line is not preceded by a reset: {shown:?}"
    );
}
