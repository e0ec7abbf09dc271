//! The status channel (`--status-fd N`): one JSON object per line, written
//! by the supervisor only, so a harness can tell TartarOS's own refusal from
//! an agent that prints `tartaros: ...` and exits 78.
//!
//! The launcher opens the descriptor; [`StatusChannel::adopt`] marks it
//! close-on-exec at once, so the sandbox init (an `execve`) and therefore the
//! agent never hold it. Lines are shorter than `PIPE_BUF` in practice and
//! written with one `write(2)` each, so a reader sees whole lines.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(
        "--status-fd {0} is not an open descriptor; open it in the launcher (e.g. `3>status.jsonl`) or drop --status-fd"
    )]
    NotOpen(RawFd),
    #[error("--status-fd {0} is one of stdin, stdout or stderr; pass a descriptor of 3 or more")]
    Stdio(RawFd),
    #[error(
        "--status-fd {fd} is {how}, which no status line can be written to; open it for writing (e.g. `3>>status.jsonl`, or a pipe's write end)"
    )]
    NotWritable { fd: RawFd, how: &'static str },
    #[error(
        "--status-fd {fd} is the same file as standard stream {stream}, which the agent writes too; give the status channel a pipe of its own"
    )]
    SharedStream { fd: RawFd, stream: RawFd },
    #[error(
        "--status-fd {fd} is {path}, inside the writable root {root}, where the agent could write status lines itself; put the status file outside the writable roots, or use a pipe"
    )]
    InRoot {
        fd: RawFd,
        path: String,
        root: String,
    },
    #[error(
        "--status-fd {fd} is a file tartaros cannot place outside the writable root {root} (another hard link, a mount under the root, or a name that no longer leads to it); put the status file outside the writable roots, or use a pipe"
    )]
    MaybeInRoot { fd: RawFd, root: String },
    #[error(
        "--status-fd {fd} is a unix socket whose {side} {path} is inside the writable root {root}, where the agent could connect or send to it and forge status lines; bind the reader's socket outside the writable roots, or use a pipe or a socketpair"
    )]
    SocketInRoot {
        fd: RawFd,
        side: &'static str,
        path: String,
        root: String,
    },
    #[error(
        "--status-fd {fd} is a unix socket whose {side} {path} tartaros cannot place outside the writable roots ({why}); bind the reader's socket at an absolute path outside the writable roots, or use a pipe or a socketpair"
    )]
    SocketUnplaced {
        fd: RawFd,
        side: &'static str,
        path: String,
        why: String,
    },
    #[error(
        "--status-fd {fd} is a TCP socket whose {side} has port {port}, which --port {port} relays the agent's connections to; give the reader a port the run does not relay, or use a pipe or a socketpair"
    )]
    SocketRelayed {
        fd: RawFd,
        side: &'static str,
        port: u16,
    },
    #[error("failed to mark --status-fd {fd} close-on-exec: {source}")]
    Cloexec { fd: RawFd, source: nix::Error },
}

/// One event of the channel; the field names are a contract with harnesses
/// (see docs/harness.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// The agent's command has been executed in the sandbox.
    Started {
        /// The sandbox init's pid on the host.
        pid: i32,
        run_id: String,
        label: Option<String>,
    },
    /// TartarOS refused the run (exit 78); the agent never started.
    Refused {
        code: i32,
        reason: String,
        /// The guarantee or policy field the refusal is about, when known.
        field: Option<String>,
    },
    /// TartarOS failed to start the sandbox or the command (125, 126, 127).
    Failed { code: i32, reason: String },
    /// The run ended after the agent started.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        /// The exit status of `tartaros` itself.
        status: i32,
        duration_ms: u64,
        log_head: Option<String>,
        log_complete: Option<bool>,
    },
}

impl Event {
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The harness's descriptor, owned by the supervisor.
#[derive(Debug)]
pub struct StatusChannel {
    file: Mutex<std::fs::File>,
    /// What the harness opened: in a service worker the caller's file,
    /// not the pipe that stands for it here.
    origin: Option<crate::status_guard::Origin>,
}

impl StatusChannel {
    /// Takes over `fd` (inherited from the launcher) and marks it
    /// close-on-exec so that no process of the sandbox inherits it.
    pub fn adopt(fd: RawFd) -> Result<Self, StatusError> {
        if (0..=2).contains(&fd) {
            return Err(StatusError::Stdio(fd));
        }
        // SAFETY: F_GETFD only reads the descriptor's flags.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(StatusError::NotOpen(fd));
        }
        check_own_file(fd)?;
        // SAFETY: F_SETFD on an open descriptor only changes its flags.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            return Err(StatusError::Cloexec {
                fd,
                source: nix::errno::Errno::last(),
            });
        }
        // SAFETY: the launcher handed us this open descriptor; from here on
        // nothing else in this process uses the number.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            file: Mutex::new(std::fs::File::from(owned)),
            origin: crate::status_guard::caller_status()
                .or_else(|| crate::status_guard::Origin::of(fd)),
        })
    }

    /// Refuses a status file or socket the agent could write through one
    /// of `roots`, the run's writable roots, or through a `--port` relay
    /// to one of `local_ports` (status_guard.rs).
    pub fn check_outside_roots(
        &self,
        roots: &[std::path::PathBuf],
        local_ports: &[u16],
    ) -> Result<(), StatusError> {
        match (&self.origin, self.raw()) {
            (Some(origin), Some(fd)) => {
                crate::status_guard::check_outside_roots(origin, fd, roots, local_ports)
            }
            _ => Ok(()),
        }
    }

    pub fn raw(&self) -> Option<RawFd> {
        self.file.lock().ok().map(|f| f.as_raw_fd())
    }

    /// Writes one event. A harness that closed its end loses the events;
    /// the run goes on (the log, not the channel, is the record).
    pub fn send(&self, event: &Event) {
        if let Ok(mut file) = self.file.lock() {
            let _ = file.write_all(&event.to_line());
        }
    }
}

/// Refuses a status descriptor that cannot be written: an `O_PATH`
/// descriptor, a directory, a read-only open, a pipe's read end. Accepted,
/// each lost every line while the run exited 0, and a harness waited for
/// an `exited` that never came (adversarial round 22).
fn check_writable(fd: RawFd) -> Result<(), StatusError> {
    // SAFETY: F_GETFL only reads the open file's status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(StatusError::NotOpen(fd));
    }
    let how = if flags & libc::O_PATH != 0 {
        "an O_PATH descriptor"
    } else if flags & libc::O_ACCMODE == libc::O_RDONLY {
        "open for reading only"
    } else {
        return Ok(());
    };
    Err(StatusError::NotWritable { fd, how })
}

/// Refuses a status descriptor that is the same file (pipe, socket,
/// terminal, regular file, FIFO) as one of the standard streams, which the
/// agent inherits: `3>&1`, or through the service `--status-fd 1` (a number
/// the worker renumbers), let the agent print `{"event":"exited",...}`
/// lines that the harness read as ours. The streams are compared as they
/// are and as `main` found them: the relay (stdio_relay.rs) puts pipes in
/// place of files, and `>> out.txt 3>> out.txt` is two opens of one file.
/// The null device is no channel to forge.
pub fn check_own_file(fd: RawFd) -> Result<(), StatusError> {
    use crate::status_guard::{id_of, original_streams};
    check_writable(fd)?;
    let Some(ours) = id_of(fd) else {
        return Ok(());
    };
    let originals = original_streams();
    let shared = |stream: &RawFd| {
        id_of(*stream) == Some(ours) || originals.get(*stream as usize) == Some(&Some(ours))
    };
    match (0..=2).find(shared) {
        Some(stream) => Err(StatusError::SharedStream { fd, stream }),
        None => Ok(()),
    }
}

/// Sends `event` when there is a channel.
pub fn send(channel: Option<&StatusChannel>, event: Event) {
    if let Some(channel) = channel {
        channel.send(&event);
    }
}

/// Command-line flags and the policy fields they set, for naming the field
/// of a refusal.
const FLAG_FIELDS: &[(&str, &str)] = &[
    ("--write-deny", "write_denies"),
    ("--write", "writable_roots"),
    ("--read-deny", "read_denies"),
    ("--read-allow", "read_allows"),
    ("--exec-allow", "exec_allows"),
    ("--read-scope", "read_scope"),
    ("--port", "local_ports"),
    ("--allow-domain", "allow_domains"),
    ("--max-procs", "max_processes"),
    ("--max-memory", "max_memory"),
    ("--materialize", "materialize_absent_handoff"),
    ("--env", "env_passthrough"),
    ("--tmpfs", "tmpfs"),
    ("--bind", "binds"),
];

/// The guarantee or policy field a refusal message is about: a guarantee
/// named in "cannot install NAME", a `[policy]` field name, a `[broker]` or
/// `[proxy]` table, or the field a flag sets. `None` when it names none.
pub fn field_of(reason: &str) -> Option<String> {
    if let Some(rest) = reason.strip_prefix("cannot install ") {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if !name.is_empty() {
            return Some(name);
        }
    }
    // The earliest mention wins: messages name their subject first.
    let mut best: Option<(usize, &str)> = None;
    let mut consider = |at: Option<usize>, field: &'static str| {
        if let Some(at) = at
            && best.is_none_or(|(b, _)| at < b)
        {
            best = Some((at, field));
        }
    };
    for (flag, field) in FLAG_FIELDS {
        consider(find_word(reason, flag), field);
        consider(find_word(reason, field), field);
    }
    for table in ["[broker]", "[proxy]"] {
        consider(
            reason.find(table),
            if table == "[broker]" {
                "broker"
            } else {
                "proxy"
            },
        );
    }
    for extra in [
        "glob_read_denies",
        "glob_denies",
        "allow_unix_socket_paths",
        "--user",
        "--log",
    ] {
        consider(find_word(reason, extra), extra.trim_start_matches("--"));
    }
    best.map(|(_, field)| field.to_string())
}

/// Finds `word` in `text` where it is not part of a longer flag or name.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let end = at + word.len();
        let before_ok = text[..at].chars().next_back().is_none_or(|c| !is_name(c));
        let after_ok = text[end..].chars().next().is_none_or(|c| !is_name(c));
        if before_ok && after_ok {
            return Some(at);
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_contract_shape() {
        let started = Event::Started {
            pid: 42,
            run_id: "1-2".into(),
            label: None,
        };
        assert_eq!(
            String::from_utf8(started.to_line()).unwrap(),
            "{\"event\":\"started\",\"pid\":42,\"run_id\":\"1-2\",\"label\":null}\n"
        );
        let exited = Event::Exited {
            code: None,
            signal: Some(9),
            status: 137,
            duration_ms: 5,
            log_head: None,
            log_complete: None,
        };
        let v: serde_json::Value = serde_json::from_slice(&exited.to_line()).unwrap();
        assert_eq!(v["event"], "exited");
        assert_eq!(v["signal"], 9);
        assert!(v["code"].is_null());
        let refused = Event::Refused {
            code: 78,
            reason: "x".into(),
            field: Some("landlock-filesystem".into()),
        };
        let v: serde_json::Value = serde_json::from_slice(&refused.to_line()).unwrap();
        assert_eq!(v["field"], "landlock-filesystem");
    }

    #[test]
    fn refusals_name_their_field() {
        assert_eq!(
            field_of("cannot install landlock-filesystem: Landlock ABI 3").as_deref(),
            Some("landlock-filesystem")
        );
        assert_eq!(
            field_of("--max-procs 0 would not even let the agent start").as_deref(),
            Some("max_processes")
        );
        assert_eq!(
            field_of("/w is both a writable root (--write) and write-denied (--write-deny)")
                .as_deref(),
            Some("writable_roots")
        );
        assert_eq!(
            field_of("failed to parse config p: line 2, column 1: unknown field `writable_rootz`, expected one of `writable_roots`").as_deref(),
            Some("writable_roots")
        );
        assert_eq!(
            field_of("[broker] token_env names X").as_deref(),
            Some("broker")
        );
        assert_eq!(field_of("something else entirely"), None);
    }

    #[test]
    fn stdio_and_closed_descriptors_are_refused() {
        assert!(matches!(
            StatusChannel::adopt(1),
            Err(StatusError::Stdio(1))
        ));
        assert!(matches!(
            StatusChannel::adopt(987_654),
            Err(StatusError::NotOpen(_))
        ));
    }

    #[test]
    fn descriptors_that_cannot_be_written_are_refused() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("status");
        std::fs::write(&file, "").unwrap();
        let refused =
            |fd: RawFd| matches!(check_writable(fd), Err(StatusError::NotWritable { .. }));
        let read_only = std::fs::File::open(&file).unwrap();
        assert!(refused(read_only.as_raw_fd()));
        let path = nix::fcntl::open(
            &file,
            nix::fcntl::OFlag::O_PATH,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        // SAFETY: a descriptor just opened, owned from here on.
        let path = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(path) };
        assert!(refused(path.as_raw_fd()));
        let (r, w) = nix::unistd::pipe().unwrap();
        assert!(refused(r.as_raw_fd()), "a pipe's read end");
        assert!(check_writable(w.as_raw_fd()).is_ok());
        let append = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        assert!(check_writable(append.as_raw_fd()).is_ok());
    }
}
