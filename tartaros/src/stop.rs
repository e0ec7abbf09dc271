//! Stopping a run: termination signals sent to `tartaros` are forwarded to
//! the sandbox init (which passes them to the agent's process group); if the
//! agent has not exited `--kill-after` later (default 10 s), or at once on a
//! second SIGINT (a second Ctrl-C), the whole cgroup is killed
//! (`cgroup.kill`). `--timeout` sends SIGTERM when the run has lasted that
//! long and escalates the same way; a timed-out run exits 124, as
//! timeout(1) does.
//!
//! The decisions are a pure state machine ([`Escalation`]); [`supervise`]
//! only feeds it signals and deadlines and carries out what it says.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use crate::effectlog::Record;
use crate::events::EffectSender;

pub use crate::policy::DEFAULT_KILL_AFTER;

/// The exit status of a run that `--timeout` ended (timeout(1)'s).
pub const TIMEOUT_EXIT: i32 = 124;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StopError {
    #[error(
        "failed to read the duration {0:?}; write a number with an optional unit: 500ms, 30s, 5m, 2h (a bare number is seconds)"
    )]
    Duration(String),
}

/// When to stop a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopPolicy {
    /// Grace period between a forwarded signal and the kill.
    pub kill_after: Duration,
    /// Wall-clock bound on the run (`--timeout`).
    pub timeout: Option<Duration>,
}

impl StopPolicy {
    /// The stop settings of a normalized policy.
    pub fn of(policy: &crate::policy::Policy) -> Self {
        Self {
            kill_after: policy
                .kill_after_ms
                .map_or(DEFAULT_KILL_AFTER, Duration::from_millis),
            timeout: policy.timeout_ms.map(Duration::from_millis),
        }
    }
}

impl Default for StopPolicy {
    fn default() -> Self {
        Self {
            kill_after: DEFAULT_KILL_AFTER,
            timeout: None,
        }
    }
}

/// Why the supervisor killed the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The agent outlived the grace period after a forwarded signal.
    GraceExpired,
    /// A second SIGINT.
    SecondInterrupt,
    /// `--timeout`, then the grace period.
    Timeout,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::GraceExpired => "grace-expired",
            StopReason::SecondInterrupt => "second-interrupt",
            StopReason::Timeout => "timeout",
        }
    }
}

/// What the supervisor must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pass this signal on to the sandbox init.
    Forward(i32),
    /// `--timeout` fired: send SIGTERM to the sandbox init.
    Terminate,
    /// Kill every process of the run.
    Kill(StopReason),
}

/// The escalation state of one run.
#[derive(Debug, Clone)]
pub struct Escalation {
    policy: StopPolicy,
    timeout_at: Option<Instant>,
    timed_out: bool,
    /// Set by the first forwarded signal (or the timeout).
    kill_at: Option<Instant>,
    interrupts: u32,
    killed: Option<StopReason>,
}

impl Escalation {
    pub fn new(policy: StopPolicy, started: Instant) -> Self {
        Self {
            policy,
            timeout_at: policy.timeout.map(|t| started + t),
            timed_out: false,
            kill_at: None,
            interrupts: 0,
            killed: None,
        }
    }

    /// A termination signal reached the supervisor.
    pub fn on_signal(&mut self, signal: i32, now: Instant) -> Vec<Action> {
        if self.killed.is_some() {
            return Vec::new();
        }
        if signal == libc::SIGINT {
            self.interrupts += 1;
            if self.interrupts >= 2 {
                return self.kill(StopReason::SecondInterrupt);
            }
        }
        self.arm(now);
        let mut actions = vec![Action::Forward(signal)];
        actions.extend(self.on_tick(now));
        actions
    }

    /// Time passed; call at [`Self::next_deadline`].
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        if self.killed.is_some() {
            return Vec::new();
        }
        if let Some(kill_at) = self.kill_at
            && now >= kill_at
        {
            let reason = if self.timed_out {
                StopReason::Timeout
            } else {
                StopReason::GraceExpired
            };
            return self.kill(reason);
        }
        if !self.timed_out
            && let Some(timeout_at) = self.timeout_at
            && now >= timeout_at
        {
            self.timed_out = true;
            // The timeout owns the grace period from here, even if a
            // signal armed an earlier one.
            self.kill_at = Some(now + self.policy.kill_after);
            let mut actions = vec![Action::Terminate];
            actions.extend(self.on_tick(now));
            return actions;
        }
        Vec::new()
    }

    /// The next instant at which [`Self::on_tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.killed.is_some() {
            return None;
        }
        let timeout = self.timeout_at.filter(|_| !self.timed_out);
        match (self.kill_at, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `--timeout` fired (the run then exits [`TIMEOUT_EXIT`]).
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    pub fn killed(&self) -> Option<StopReason> {
        self.killed
    }

    fn arm(&mut self, now: Instant) {
        if self.kill_at.is_none() {
            self.kill_at = Some(now + self.policy.kill_after);
        }
    }

    fn kill(&mut self, reason: StopReason) -> Vec<Action> {
        self.killed = Some(reason);
        vec![Action::Kill(reason)]
    }
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `1d` or a bare number of seconds.
pub fn parse_duration(raw: &str) -> Result<Duration, StopError> {
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || StopError::Duration(raw.to_string());
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let millis = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    millis.map(Duration::from_millis).ok_or_else(bad)
}

/// How the sandbox init ended, and whether we stopped it.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The init's wait status, described.
    pub status: String,
    pub killed: Option<StopReason>,
    pub timed_out: bool,
}

/// The termination signals the supervisor handles, taken over from their
/// default action (which would kill `tartaros` and leave the sandbox to
/// the janitor) as early as possible. A signal that arrives before the
/// agent starts is kept and handled as soon as [`supervise`] runs.
pub struct Signals {
    streams: Vec<(i32, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Installs the handlers; must run inside the tokio runtime.
    pub fn install() -> Self {
        let mut streams = Vec::new();
        for kind in [
            SignalKind::interrupt(),
            SignalKind::terminate(),
            SignalKind::hangup(),
            SignalKind::quit(),
        ] {
            if let Ok(stream) = signal(kind) {
                streams.push((kind.as_raw_value(), stream));
            }
        }
        Self { streams }
    }
}

/// Forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the init `pid` and escalates
/// per `policy` until the init exits. `cgroup` is the run's v2 cgroup (the
/// kill empties it; without one, killing the init, PID 1 of the agent's
/// PID namespace, ends the rest).
pub async fn supervise(
    pid: i32,
    pidfd: &OwnedFd,
    cgroup: Option<&Path>,
    policy: StopPolicy,
    signals: Signals,
    effects: &EffectSender,
) -> Ended {
    let streams = signals.streams;
    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel::<i32>();
    let mut listeners = Vec::new();
    for (raw, mut stream) in streams {
        let tx = tx.clone();
        listeners.push(tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(raw).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut escalation = Escalation::new(policy, Instant::now());
    let exited = wait_exit(pidfd);
    tokio::pin!(exited);
    let status = loop {
        let deadline = escalation.next_deadline();
        let actions = tokio::select! {
            status = &mut exited => break status,
            Some(signal) = received.recv() => escalation.on_signal(signal, Instant::now()),
            _ = sleep_until(deadline), if deadline.is_some() => escalation.on_tick(Instant::now()),
        };
        for action in actions {
            carry_out(action, pid, cgroup, &policy, effects);
        }
    };
    for listener in listeners {
        listener.abort();
    }
    Ended {
        status,
        killed: escalation.killed(),
        timed_out: escalation.timed_out(),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline.into()).await;
    }
}

fn carry_out(
    action: Action,
    pid: i32,
    cgroup: Option<&Path>,
    policy: &StopPolicy,
    effects: &EffectSender,
) {
    let init = nix::unistd::Pid::from_raw(pid);
    let record = |signal: i32, reason: &str| {
        let effect = Record::new("signal")
            .with("signal", signal)
            .with("to", "sandbox")
            .with("by", "supervisor")
            .with("reason", reason)
            .with("decision", "allowed");
        let _ = effects.send(effect.into());
    };
    match action {
        Action::Forward(signal) => {
            if let Ok(sig) = nix::sys::signal::Signal::try_from(signal) {
                let _ = nix::sys::signal::kill(init, sig);
            }
            record(signal, "forwarded");
        }
        Action::Terminate => {
            eprintln!(
                "tartaros: the run reached --timeout {:?}; sending SIGTERM (kill after {:?})",
                policy.timeout.unwrap_or_default(),
                policy.kill_after
            );
            let _ = nix::sys::signal::kill(init, nix::sys::signal::Signal::SIGTERM);
            record(libc::SIGTERM, "timeout");
        }
        Action::Kill(reason) => {
            let why = match reason {
                StopReason::GraceExpired => format!(
                    "the agent did not exit within --kill-after {:?} of the signal",
                    policy.kill_after
                ),
                StopReason::SecondInterrupt => "second interrupt".to_string(),
                StopReason::Timeout => format!(
                    "the run reached --timeout {:?}",
                    policy.timeout.unwrap_or_default()
                ),
            };
            crate::warn::say(format_args!("{why}; killing every process of the run"));
            if let Some(cgroup) = cgroup {
                crate::cgroup::kill_all(cgroup);
            }
            let _ = nix::sys::signal::kill(init, nix::sys::signal::Signal::SIGKILL);
            record(libc::SIGKILL, reason.as_str());
        }
    }
}

/// Waits until the process behind `pidfd` exits, reaps it, and describes
/// its status.
pub async fn wait_exit(pidfd: &OwnedFd) -> String {
    // SAFETY: the pidfd stays open and unchanged for as long as this
    // AsyncFd lives (it is dropped before we return).
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd.as_fd(), tokio::io::Interest::READABLE) };
    if let Ok(fd) = registered
        && let Ok(mut guard) = fd.readable().await
    {
        guard.clear_ready();
    }
    // SAFETY: siginfo is plain data the kernel fills; P_PIDFD names our
    // child through a descriptor we own.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED,
        )
    };
    if rc != 0 {
        return format!("wait failed: {}", nix::errno::Errno::last());
    }
    // SAFETY: for CLD_* codes the kernel filled si_status.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => format!("exit status {status}"),
        _ => format!("killed by signal {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy(kill_after: u64, timeout: Option<u64>) -> StopPolicy {
        StopPolicy {
            kill_after: Duration::from_secs(kill_after),
            timeout: timeout.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_signal_is_forwarded_then_the_grace_period_kills() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(10, None), t0);
        assert_eq!(e.next_deadline(), None);
        assert_eq!(
            e.on_signal(libc::SIGTERM, t0),
            [Action::Forward(libc::SIGTERM)]
        );
        assert_eq!(e.next_deadline(), Some(t0 + 10 * SECOND));
        // A later signal is forwarded but does not extend the grace period.
        assert_eq!(
            e.on_signal(libc::SIGHUP, t0 + 5 * SECOND),
            [Action::Forward(libc::SIGHUP)]
        );
        assert_eq!(e.on_tick(t0 + 9 * SECOND), []);
        assert_eq!(
            e.on_tick(t0 + 10 * SECOND),
            [Action::Kill(StopReason::GraceExpired)]
        );
        assert_eq!(e.killed(), Some(StopReason::GraceExpired));
        assert!(!e.timed_out());
        // Nothing more once killed.
        assert_eq!(e.on_signal(libc::SIGINT, t0 + 11 * SECOND), []);
        assert_eq!(e.next_deadline(), None);
    }

    #[test]
    fn a_second_interrupt_kills_at_once() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(10, None), t0);
        assert_eq!(
            e.on_signal(libc::SIGINT, t0),
            [Action::Forward(libc::SIGINT)]
        );
        assert_eq!(
            e.on_signal(libc::SIGINT, t0 + SECOND),
            [Action::Kill(StopReason::SecondInterrupt)]
        );
    }

    #[test]
    fn terminate_then_interrupt_is_not_a_second_interrupt() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(10, None), t0);
        e.on_signal(libc::SIGTERM, t0);
        assert_eq!(
            e.on_signal(libc::SIGINT, t0),
            [Action::Forward(libc::SIGINT)]
        );
    }

    #[test]
    fn zero_grace_kills_with_the_first_signal() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(0, None), t0);
        assert_eq!(
            e.on_signal(libc::SIGTERM, t0),
            [
                Action::Forward(libc::SIGTERM),
                Action::Kill(StopReason::GraceExpired)
            ]
        );
    }

    #[test]
    fn the_timeout_terminates_then_kills() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(2, Some(5)), t0);
        assert_eq!(e.next_deadline(), Some(t0 + 5 * SECOND));
        assert_eq!(e.on_tick(t0 + 4 * SECOND), []);
        assert_eq!(e.on_tick(t0 + 5 * SECOND), [Action::Terminate]);
        assert!(e.timed_out());
        assert_eq!(e.next_deadline(), Some(t0 + 7 * SECOND));
        assert_eq!(
            e.on_tick(t0 + 7 * SECOND),
            [Action::Kill(StopReason::Timeout)]
        );
    }

    #[test]
    fn a_timeout_during_a_grace_period_counts_as_the_timeout() {
        let t0 = Instant::now();
        let mut e = Escalation::new(policy(10, Some(5)), t0);
        e.on_signal(libc::SIGTERM, t0 + 4 * SECOND);
        assert_eq!(e.next_deadline(), Some(t0 + 5 * SECOND));
        assert_eq!(e.on_tick(t0 + 5 * SECOND), [Action::Terminate]);
        assert_eq!(
            e.on_tick(t0 + 15 * SECOND),
            [Action::Kill(StopReason::Timeout)]
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10"), Ok(10 * SECOND));
        assert_eq!(parse_duration("10s"), Ok(10 * SECOND));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(120 * SECOND));
        assert_eq!(parse_duration("1h"), Ok(3600 * SECOND));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "s", "1.5s", "-1", "10x", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
