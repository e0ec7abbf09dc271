//! The plan: everything the sandbox init needs, decided by the supervisor and
//! sent over an inherited pipe (fd 3), so the init parses no policy and
//! looks nothing up. It comes in two parts: the [`Plan`] as soon as the
//! init exists, so that it builds the sandbox while the eBPF programs are
//! verified, and the [`Late`] part, which depends on whether they
//! attached, once they are; the init starts the agent only after both.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::credentials::Identity;
use crate::landlock::LandlockPlan;
use crate::mounts::MountOp;
use crate::network::ListenSpec;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("failed to encode the sandbox plan: {0}")]
    Encode(serde_json::Error),
    #[error("failed to send the sandbox plan to the init: {0}")]
    Send(std::io::Error),
    #[error("failed to receive the sandbox plan (the supervisor is gone?): {0}")]
    Receive(std::io::Error),
    #[error("failed to decode the sandbox plan: {0}")]
    Decode(serde_json::Error),
}

/// Everything the init does, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The agent's command line; `argv[0]` is looked up in the agent's PATH.
    pub argv: Vec<String>,
    /// The agent's whole environment.
    pub env: Vec<(String, String)>,
    /// Where the agent starts.
    pub cwd: PathBuf,
    pub identity: Identity,
    /// The init runs in a user namespace (an unprivileged launcher).
    pub user_namespace: bool,
    pub mounts: Vec<MountOp>,
    /// The gateways' listeners, made by the init inside the network
    /// namespace and passed to the supervisor on fd 5.
    pub listeners: Vec<ListenSpec>,
    /// `None` when Landlock is unavailable and the run is not strict.
    pub landlock: Option<LandlockPlan>,
    /// `None` when seccomp is unavailable and the run is not strict.
    pub seccomp: Option<SeccompPlan>,
    /// Every requested guarantee is mandatory (`--strict`).
    pub strict: bool,
    /// The agent's pty slave is on fd 6 (`pty::PTY_FD`).
    #[serde(default)]
    pub pty: bool,
    /// `--tmpfs` and `--bind`, mounted after `mounts`.
    #[serde(default)]
    pub scope: crate::scope::ScopeMounts,
    /// In a user namespace: the launcher's own ids, which the agent keeps
    /// (see identity_map.rs).
    #[serde(default)]
    pub map_user: Option<Identity>,
    /// The run's v1 limit cgroups, which the init joins itself before
    /// anything else (`cgroup::join_v1_self`); set once they exist.
    #[serde(default)]
    pub limit_cgroups: Vec<PathBuf>,
    /// RLIMIT_NPROC of the agent, set once it is in its own user namespace
    /// (`map_user`), where the kernel counts only the run's tasks: the
    /// bound of a run with no pids cgroup (guarantee::tasks_by_rlimit).
    #[serde(default)]
    pub max_tasks: Option<u64>,
    /// The limits of the run's IPC namespace (`ipc_limits.rs`).
    #[serde(default)]
    pub ipc: crate::tmpfs_bounds::IpcBounds,
    /// In a user namespace: its share of the user's inotify counts
    /// (`user_counts.rs`).
    #[serde(default)]
    pub user_counts: Option<crate::user_counts::UserCounts>,
    /// A service caller's resource limits, umask, nice value and CPUs,
    /// which the agent takes on where they are lower (caller_attrs.rs).
    #[serde(default)]
    pub caller_attributes: Option<crate::caller_attrs::Attributes>,
    /// The agent's supplementary groups (`credentials::supplementary`);
    /// known once the stages run, as the caller's attributes.
    #[serde(default)]
    pub groups: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SeccompPlan {
    pub strict: bool,
    pub deny_unix: bool,
    /// Set by the supervisor when a standard stream is the launcher's
    /// terminal (`tty_state.rs`).
    #[serde(default)]
    pub host_terminal: bool,
}

/// The part of the plan that waits for the eBPF attach: sent once the
/// programs are attached to the init's cgroup (or have failed to), the
/// fanotify marks are placed and the genesis is written. The init makes
/// the hiding before the scope and the mirrors after it, then starts the agent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Late {
    /// The unix policy's directories, in slot order, mirrored after the
    /// scope (`unix_mirror.rs`); empty without the eBPF unix policy.
    pub unix_mirrors: Vec<PathBuf>,
    /// The host's listening sockets to hide because the unix policy was
    /// planned but did not attach (`decide::RunPlan::unix_policy_lost`).
    pub hide_sockets: Vec<MountOp>,
}

impl Plan {
    pub fn send(&self, to: impl Write) -> Result<(), PlanError> {
        send_line(self, to)
    }

    pub fn receive(from: &mut impl BufRead) -> Result<Self, PlanError> {
        receive_line(from)
    }
}

impl Late {
    pub fn send(&self, to: impl Write) -> Result<(), PlanError> {
        send_line(self, to)
    }

    /// The same reader as the [`Plan`]'s: it may hold both lines.
    pub fn receive(from: &mut impl BufRead) -> Result<Self, PlanError> {
        receive_line(from)
    }
}

/// One JSON line (compact JSON has no newline).
fn send_line(value: &impl Serialize, mut to: impl Write) -> Result<(), PlanError> {
    let mut bytes = serde_json::to_vec(value).map_err(PlanError::Encode)?;
    bytes.push(b'\n');
    to.write_all(&bytes).map_err(PlanError::Send)
}

fn receive_line<T: serde::de::DeserializeOwned>(from: &mut impl BufRead) -> Result<T, PlanError> {
    let mut bytes = Vec::new();
    from.read_until(b'\n', &mut bytes)
        .map_err(PlanError::Receive)?;
    serde_json::from_slice(&bytes).map_err(PlanError::Decode)
}

/// What the init reports back on fd 4, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// The agent has been started.
    Started,
    /// The sandbox could not be set up or the agent not executed; `code` is
    /// the exit status to use (125, 126, 127 or 78).
    Failed { code: i32, message: String },
    /// The agent exited with `code` or died of `signal`.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

impl Report {
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    pub fn parse_all(bytes: &[u8]) -> Vec<Report> {
        bytes
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips_and_reports_parse() {
        let plan = Plan {
            argv: vec!["true".into()],
            env: vec![("PATH".into(), "/bin".into())],
            cwd: "/".into(),
            identity: crate::credentials::NOBODY,
            user_namespace: false,
            mounts: vec![MountOp::MakePrivate],
            listeners: Vec::new(),
            landlock: None,
            seccomp: Some(SeccompPlan {
                strict: false,
                deny_unix: true,
                host_terminal: false,
            }),
            strict: true,
            pty: false,
            scope: Default::default(),
            map_user: None,
            max_tasks: None,
            ipc: Default::default(),
            user_counts: None,
            caller_attributes: None,
            groups: Vec::new(),
            limit_cgroups: vec![PathBuf::from("/sys/fs/cgroup/pids/run")],
        };
        let late = Late {
            unix_mirrors: vec![PathBuf::from("/work")],
            hide_sockets: vec![MountOp::HideSocket("/run/x.sock".into())],
        };
        // Both lines in one buffer: the reader must not lose the second.
        let mut buf = Vec::new();
        plan.send(&mut buf).unwrap();
        late.send(&mut buf).unwrap();
        let mut from = std::io::BufReader::new(&buf[..]);
        let back = Plan::receive(&mut from).unwrap();
        assert_eq!(back.argv, plan.argv);
        assert_eq!(back.limit_cgroups, plan.limit_cgroups);
        let back = Late::receive(&mut from).unwrap();
        assert_eq!(back.unix_mirrors, late.unix_mirrors);
        assert_eq!(back.hide_sockets.len(), 1);
        let mut lines = Report::Started.to_line();
        lines.extend(
            Report::Exited {
                code: Some(3),
                signal: None,
            }
            .to_line(),
        );
        assert_eq!(Report::parse_all(&lines).len(), 2);
    }
}
