//! Starting the sandbox and waiting for it: the init is cloned straight
//! into the run's cgroup and namespaces, gets its id map (user namespace),
//! the gateways and its plan, and is waited for while signals are
//! forwarded.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

use crate::cgroup::RunCgroup;
use crate::decide::RunPlan;
use crate::exit::{self, Refusal};
use crate::plan::Report;
use crate::policy::Policy;

/// How the agent ended.
#[derive(Debug, Clone, Copy)]
pub struct AgentEnd {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// `--timeout` fired: the run exits [`crate::stop::TIMEOUT_EXIT`].
    pub timed_out: bool,
}

/// Tasks that end with the run.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What the start needs besides the plan: the gateways' parts, the
/// signals taken at the start of the run, the status channel.
pub struct Extras<'a> {
    pub broker: Option<&'a crate::egress::BrokerSetup>,
    pub original_dst: Option<crate::proxy::OriginalDst>,
    /// Which sandbox process opened a gateway connection (for records).
    pub owner: Option<crate::events::ConnectionOwner>,
    pub signals: crate::stop::Signals,
    pub announce: &'a crate::harness::Announce,
}

/// The init, spawned and waiting for its plan ([`spawn`]). Dropped before
/// [`start_and_wait`] took it (a later stage refused the run), it kills
/// the init.
pub struct Spawned {
    init: crate::spawn::InitProcess,
    plan_write: Option<OwnedFd>,
    report_read: Option<OwnedFd>,
    gateway_read: Option<OwnedFd>,
    /// Our end of the pty channel.
    pty: Option<OwnedFd>,
    /// The id map and the start gate (user namespace) and the plan, done
    /// at spawn.
    sent: Result<(), String>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.plan_write.is_some() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.init.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Starts the init, straight into `cgroup` and new namespaces, gives it
/// its identity mapping (user namespace) and its plan. It builds the
/// sandbox and then waits for the late part of its plan, so later stages
/// may still change that part (and attach the eBPF programs to the cgroup
/// it is in) while it works.
pub fn spawn(
    cgroup: Option<&RunCgroup>,
    run: &RunPlan,
    pty: Option<crate::pty::Channel>,
    init_pid: &crate::runlog::InitPid,
    zygote: Option<crate::zygote::Zygote>,
) -> Result<Spawned, Refusal> {
    let start_failed = |what: &str, e: &dyn std::fmt::Display| {
        Refusal::new(exit::START_FAILURE, format!("failed to {what}: {e}"))
    };
    let (plan_read, plan_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the plan pipe", &e))?;
    let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the report pipe", &e))?;
    let (gate_read, gate_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the start gate", &e))?;
    // The init makes the gateways' listeners in its network namespace and
    // passes them back on this socket.
    let (gateway_read, gateway_write) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| start_failed("create the gateway socket", &e))?;
    let gated = run.init.user_namespace;
    let namespaces = crate::spawn::Namespaces {
        network: true,
        user: run.init.user_namespace,
        premade: false,
    };
    let fds = || crate::spawn::InitFds {
        plan: &plan_read,
        report: &report_write,
        gateway: &gateway_write,
        gate: gated.then_some(&gate_read),
        pty: pty.as_ref().map(|p| &p.theirs),
    };
    let cgroup_fd = cgroup.map(RunCgroup::fd);
    let exec = || {
        crate::spawn::spawn_init(
            "/proc/self/exe",
            &["tartaros-init", crate::init::INIT_ARG],
            cgroup_fd,
            namespaces,
            fds(),
        )
        .map_err(|e| Refusal::new(exit::START_FAILURE, e))
    };
    let init = match zygote.map(|z| z.spawn(cgroup_fd, namespaces, fds())) {
        Some(Ok(init)) => init,
        // The template is gone: the same init, exec'd.
        Some(Err(crate::zygote::ZygoteError::Request(_))) | None => exec()?,
        Some(Err(e)) => return Err(Refusal::new(exit::START_FAILURE, e)),
    };
    // Before the init gets its plan, so before any of its setup.
    init_pid.set(init.pid as u32);
    // Only the init may hold its end: EOF then means it is gone.
    let pty = pty.map(|p| p.ours);
    drop(plan_read);
    drop(report_write);
    drop(gateway_write);
    let mapped = if run.init.user_namespace {
        crate::spawn::map_root_to(
            init.pid,
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
        .map_err(|e| e.to_string())
    } else {
        Ok(())
    };
    let mapped = mapped.and_then(|()| {
        if gated {
            nix::unistd::write(&gate_write, b"g")
                .map(drop)
                .map_err(|e| format!("failed to open the start gate: {e}"))
        } else {
            Ok(())
        }
    });
    drop(gate_write);
    drop(gate_read);
    let mut plan_pipe = std::fs::File::from(plan_write);
    let sent = mapped.and_then(|()| run.init.send(&mut plan_pipe).map_err(|e| e.to_string()));
    Ok(Spawned {
        init,
        plan_write: Some(plan_pipe.into()),
        report_read: Some(report_read),
        gateway_read: Some(gateway_read),
        pty,
        sent,
    })
}

/// Sends the spawned init the late part of its plan, serves the gateways, relays the pty, forwards signals until it exits,
/// and reads how the agent ended.
pub async fn start_and_wait(
    mut spawned: Spawned,
    cgroup: Option<&RunCgroup>,
    run: &RunPlan,
    policy: &Policy,
    extras: Extras<'_>,
    effects: &crate::events::EffectSender,
) -> Result<(AgentEnd, Option<crate::pty::Relay>), Refusal> {
    let Extras {
        broker,
        original_dst,
        owner,
        signals,
        announce,
    } = extras;
    let pty = spawned.pty.take();
    let pty = pty.as_ref();
    // Read as they come, so `started` goes out while the agent runs.
    let report_read = spawned.report_read.take().ok_or_else(|| {
        Refusal::new(
            exit::START_FAILURE,
            "failed to start: the init was already started",
        )
    })?;
    let reports = crate::harness::read_reports(report_read, announce.clone(), spawned.init.pid)
        .map_err(|e| {
            Refusal::new(
                exit::START_FAILURE,
                format!(
                    "failed to start the thread reading the init's reports: {e}{}",
                    crate::process_limit::thread_hint(&e)
                ),
            )
        })?;
    let sent = std::mem::replace(&mut spawned.sent, Ok(()));
    let plan_write = spawned.plan_write.take();
    let sent = sent.and_then(|()| {
        let mut plan_pipe =
            std::fs::File::from(plan_write.ok_or_else(|| "the plan was already sent".to_string())?);
        run.late.send(&mut plan_pipe).map_err(|e| e.to_string())
    });
    let gateway_read = spawned
        .gateway_read
        .take()
        .ok_or_else(|| Refusal::new(exit::START_FAILURE, "failed to start: no gateway socket"))?;
    let init = &spawned.init;
    let gateways = match sent {
        Ok(()) => {
            let parts = GatewayParts {
                broker,
                original_dst,
                owner,
            };
            serve_gateways(&gateway_read, run, policy, parts, effects).await
        }
        Err(e) => Err(e),
    };
    drop(gateway_read);
    let gateways = match gateways {
        Ok(gateways) => gateways,
        Err(e) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(init.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = wait_exit(&init.pidfd).await;
            // The init's own report says best why it failed (a port it
            // could not bind, say).
            let failed = reports
                .join()
                .unwrap_or_default()
                .into_iter()
                .find_map(|r| match r {
                    Report::Failed { code, message } => Some(Refusal::new(code, message)),
                    _ => None,
                });
            return Err(failed.unwrap_or(Refusal::new(exit::START_FAILURE, e)));
        }
    };
    // Dropped when the run ends: the gateways close with it.
    let _gateways = AbortOnDrop(gateways);
    // The init opens the pty after its mounts and sends the master; a
    // failure there is reported by the init itself.
    let relay = crate::harness::start_relay(pty).unwrap_or_else(|e| {
        crate::tt_warn!("{e}");
        None
    });

    let ended = crate::stop::supervise(
        init.pid,
        &init.pidfd,
        cgroup.map(RunCgroup::path),
        crate::stop::StopPolicy::of(policy),
        signals,
        effects,
    )
    .await;
    let reports = reports.join().unwrap_or_default();
    let started = reports.contains(&Report::Started);
    for report in &reports {
        match report {
            Report::Failed { code, message } if started => {
                return Err(Refusal::after_start(*code, message));
            }
            Report::Failed { code, message } => return Err(Refusal::new(*code, message)),
            Report::Exited { code, signal } => {
                return Ok((
                    AgentEnd {
                        code: *code,
                        signal: *signal,
                        timed_out: ended.timed_out,
                    },
                    relay,
                ));
            }
            Report::Started => {}
        }
    }
    let init_status = ended.status;
    if ended.killed.is_some() {
        // We killed the init with the rest: the agent died of SIGKILL.
        return Ok((
            AgentEnd {
                code: None,
                signal: Some(libc::SIGKILL),
                timed_out: ended.timed_out,
            },
            relay,
        ));
    }
    // Whatever ended it (the kernel's RLIMIT_CPU kill, the OOM killer, a
    // host SIGKILL), the agent may have run: it must not read as never
    // started (adversarial round 23b). Its own exit status is lost, so the
    // run stays a tartaros failure (125).
    if started {
        return Err(Refusal::after_start(
            exit::START_FAILURE,
            format!(
                "the sandbox init ended ({init_status}) while the agent ran; \
                 how the agent ended is unknown"
            ),
        ));
    }
    Err(Refusal::new(
        exit::START_FAILURE,
        format!("the sandbox init ended without a report ({init_status})"),
    ))
}

/// What serving the gateways needs besides their listeners.
struct GatewayParts<'a> {
    broker: Option<&'a crate::egress::BrokerSetup>,
    original_dst: Option<crate::proxy::OriginalDst>,
    owner: Option<crate::events::ConnectionOwner>,
}

/// Receives the gateways' listeners from the init and serves them.
async fn serve_gateways(
    channel: &OwnedFd,
    run: &RunPlan,
    policy: &Policy,
    parts: GatewayParts<'_>,
    effects: &crate::events::EffectSender,
) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
    if run.gateways.is_empty() {
        return Ok(Vec::new());
    }
    // SAFETY: the socket stays open and unchanged while this AsyncFd lives.
    let registered =
        unsafe { AsyncFd::register_with_interest(channel.as_fd(), tokio::io::Interest::READABLE) };
    if let Ok(fd) = registered
        && let Ok(mut guard) = fd.readable().await
    {
        guard.clear_ready();
    }
    let listeners = crate::network::receive_listeners(channel.as_raw_fd(), run.gateways.len())
        .map_err(|e| e.to_string())?;
    crate::egress::serve(
        &run.gateways,
        listeners,
        policy,
        parts.broker,
        parts.original_dst,
        parts.owner,
        effects,
    )
    .map_err(|e| e.to_string())
}

/// Waits until the init behind `pidfd` exits, reaps it, and describes its
/// status (see [`crate::stop::wait_exit`]).
async fn wait_exit(pidfd: &OwnedFd) -> String {
    crate::stop::wait_exit(pidfd).await
}
