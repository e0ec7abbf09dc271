//! The supervisor's side of harness and terminal use: the status lines of a
//! started run, the warning about a PATH the agent cannot use, and the pty.

use std::io::BufRead;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use crate::credentials::Identity;
use crate::plan::Report;
use crate::status::{Event, StatusChannel};

/// What `started` and `exited` carry besides the outcome.
#[derive(Debug, Clone)]
pub struct Announce {
    pub status: Option<Arc<StatusChannel>>,
    pub run_id: String,
    pub label: Option<String>,
}

/// Reads the init's reports as they arrive, sending `started` when the
/// agent has been executed; the thread returns every report at EOF. Fails
/// when the thread cannot start (the process limit).
pub fn read_reports(
    pipe: OwnedFd,
    announce: Announce,
    init_pid: i32,
) -> std::io::Result<std::thread::JoinHandle<Vec<Report>>> {
    std::thread::Builder::new().spawn(move || {
        let mut reports = Vec::new();
        let reader = std::io::BufReader::new(std::fs::File::from(pipe));
        for line in reader.split(b'\n').map_while(Result::ok) {
            let Some(report) = Report::parse_all(&line).pop() else {
                continue;
            };
            if report == Report::Started {
                crate::status::send(
                    announce.status.as_deref(),
                    Event::Started {
                        pid: init_pid,
                        run_id: announce.run_id.clone(),
                        label: announce.label.clone(),
                    },
                );
            }
            reports.push(report);
        }
        reports
    })
}

/// How a started run ended.
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub status: i32,
    pub started_at: std::time::Instant,
    pub log_head: Option<String>,
    /// With `--log`: whether the log is sealed and complete, as the writer
    /// knows it when it seals (no loss, cgroup empty, capture installed):
    /// what `tartaros log verify` will say, without reading the log again.
    pub log_complete: Option<bool>,
}

/// Sends `exited`.
pub fn announce_exit(announce: &Announce, exit: Exit) {
    let Some(status) = announce.status.as_deref() else {
        return;
    };
    let log_complete = exit.log_complete;
    status.send(&Event::Exited {
        code: exit.code,
        signal: exit.signal,
        status: exit.status,
        duration_ms: u64::try_from(exit.started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
        log_head: exit.log_head,
        log_complete,
    });
}

/// Warns (as root) about PATH directories the agent's user cannot reach,
/// e.g. a toolchain under a `0700` /root: its commands would be "not found".
/// Run by the service, the lookups are the caller's: a directory the
/// caller cannot tell is there counts as there, so that the warning says
/// nothing of what lies where the caller cannot look.
pub fn warn_unreachable_path(env: &[(String, String)], program: &str, identity: Identity) {
    use crate::caller::{as_caller, caller};
    let exists = |d: &Path| match as_caller(|| std::fs::metadata(d)) {
        Ok(meta) => meta.is_dir(),
        Err(e) => {
            caller().is_some() && !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
        }
    };
    let mut dirs = crate::environment::unreachable_path_dirs(env, &exists, &|d| {
        crate::environment::searchable_by(d, identity.uid, identity.gid)
    });
    dirs.sort();
    dirs.dedup();
    if dirs.is_empty() {
        return;
    }
    let listed: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    // The command itself, when only such a directory has it.
    let found = crate::environment::exec_candidates(program, path)
        .into_iter()
        .find(|c| as_caller(|| c.is_file()));
    match found {
        Some(file) if dirs.iter().any(|d| file.starts_with(d)) => crate::tt_warn!(
            "{} is {}, which the agent (uid {}) cannot reach; install it where that user can read it, or choose the user with --user",
            program,
            file.display(),
            identity.uid
        ),
        _ => crate::tt_warn!(
            "the agent (uid {}) cannot use these directories on its PATH: {}; commands there will not be found",
            identity.uid,
            listed.join(", ")
        ),
    }
}

/// The socket pair on which the init sends the agent's pty, when `wanted`.
pub fn pty_channel(wanted: bool) -> Result<Option<crate::pty::Channel>, crate::pty::PtyError> {
    wanted.then(crate::pty::channel).transpose()
}

/// Receives the pty from the init (after the plan was sent) and starts the
/// relay; `None` when there is no pty or the init ended first.
pub fn start_relay(
    ours: Option<&OwnedFd>,
) -> Result<Option<crate::pty::Relay>, crate::pty::PtyError> {
    let Some(ours) = ours else {
        return Ok(None);
    };
    match crate::pty::receive_master(ours)? {
        Some(master) => crate::pty::Relay::start(master).map(Some),
        None => Ok(None),
    }
}
