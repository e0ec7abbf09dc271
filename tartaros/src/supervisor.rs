//! The supervisor: owns the run from policy to teardown.
//!
//! The run is decided first (`decide.rs`: pure, from the host facts read
//! once), then carried out in order, each stage pushing what it created on
//! one undo stack (`undo.rs`) that the janitor mirrors:
//!
//! 1. facts: probe the host, warm up the eBPF work on threads;
//! 2. decide: guarantees, identity, mounts, Landlock, seccomp, cgroup,
//!    eBPF, gateways (a refusal here has created nothing);
//! 3. broker secrets and TLS client (refusals, still nothing created);
//! 4. placeholders (`--materialize`), the log file, the cgroup and limits;
//! 5. the eBPF programs, attached before any process joins the cgroup;
//! 6. the log's genesis;
//! 7. the init, its gateways and plan; wait while forwarding signals;
//! 8. unwind: kill and remove the cgroup, remove placeholders, drain the
//!    events, seal the log.

use std::path::PathBuf;

use crate::decide::{HostFacts, Request, RunPlan};
use crate::effectlog::{Genesis, LogWriter};
use crate::exit::{self, Refusal};
use crate::guarantee::{Guarantee, print_warnings};
use crate::host_facts::Host;
use crate::kernel_watch::KernelWatch;
use crate::policy::Policy;
use crate::undo::{Undo, UndoStack};

/// What to run and how.
pub struct RunRequest {
    pub policy: Policy,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub log: Option<PathBuf>,
    /// Size of the kernel ring buffer for captured events (`--log-buffer`).
    pub log_buffer: u32,
    /// The launcher's environment (read once, by the CLI).
    pub launcher_env: Vec<(String, String)>,
    /// Forked by the CLI before the runtime; cleans up if we are killed.
    pub janitor: Option<crate::janitor::Janitor>,
    /// Forked by the CLI before the runtime; clones the init without a
    /// second exec of our binary (zygote.rs).
    pub zygote: Option<crate::zygote::Zygote>,
    /// `--status-fd`: where `started` and `exited` go.
    pub status: Option<std::sync::Arc<crate::status::StatusChannel>>,
    /// `--label`, for the genesis and the status channel.
    pub label: Option<String>,
    /// `--setenv NAME=VALUE` pairs.
    pub setenv: Vec<(String, String)>,
    /// Give the agent its own pseudo-terminal (see pty.rs).
    pub pty: bool,
    /// When the command started, for `duration_ms`.
    pub started_at: std::time::Instant,
}

/// Runs the agent under `request` and returns the exit status to use.
pub async fn run(mut request: RunRequest) -> Result<i32, Refusal> {
    let signals = crate::stop::Signals::install();
    raise_fd_limit();
    let host = Host::probe();
    if host.root || host.cgroup_v2_writable {
        // Cgroups of earlier runs whose supervisor and janitor were both
        // killed: one readdir per parent.
        for removed in crate::debris::sweep_own() {
            eprintln!(
                "tartaros: removed the leftover cgroup {} of a killed run",
                removed.display()
            );
        }
    }
    request.policy =
        crate::limits::apply_host_defaults(&request.policy, &host, request.log.is_some());
    let mut preload = None;
    if host.root && crate::guarantee::wants_bpf(&request.policy, request.log.is_some(), true) {
        // Parses the kernel's BTF on a thread while we decide the rest.
        crate::ebpf::warm_up_capture();
        if request.log.is_some() {
            // And creates the capture's ring buffer on another.
            // A ring in the pin cache's `EVENTS` is the janitor's to take
            // out after the run, from the moment it is this run's.
            let bytes = request.log_buffer;
            let janitor = &mut request.janitor;
            crate::ebpf::prepare_ring(bytes, &mut |left| {
                if let Some(janitor) = janitor.as_mut() {
                    janitor.ring(left);
                }
            });
        }
        // Loading and verifying the programs needs no cgroup: on a thread,
        // while the run is decided, the host objects made and the init
        // started. For what the run will most likely ask: should the
        // decision drop a part, the attach throws this away and starts
        // afresh.
        preload = crate::ebpf::preload(&crate::kernel_watch::options(
            &request.policy,
            request.log.is_some(),
            request.log_buffer,
        ));
    }
    let host_sockets = crate::mounts::host_sockets(&request.policy);
    // For the other mounts of denied paths (the log is denied too) and of
    // hidden sockets.
    let policy = &request.policy;
    let registry = crate::materialize::ensure_registry();
    // The registry is denied too where the agent may own it (decide.rs).
    let agent_may_own_registry =
        registry.is_some() && (!nix::unistd::geteuid().is_root() || policy.user.is_some());
    let needs_table = !policy.read_denies.is_empty()
        || !policy.write_denies.is_empty()
        || request.log.is_some()
        || !host_sockets.is_empty()
        || agent_may_own_registry;
    let mount_table = if needs_table {
        std::fs::read_to_string("/proc/self/mountinfo")
    } else {
        Ok(String::new())
    };
    // Run by the service for a caller, the agent is that caller.
    let current = crate::caller::launcher_identity();
    let facts = HostFacts {
        host: &host,
        current,
        on_behalf: crate::caller::caller().is_some(),
        host_sockets: &host_sockets,
        shared_programs: crate::ebpf::shared::adopted(),
        files: &crate::decide::HostFiles,
        mount_table: mount_table.as_deref().ok(),
        placeholder_registry: registry.as_deref(),
    };
    let decided = crate::decide::decide(
        &Request {
            policy: &request.policy,
            argv: &request.argv,
            cwd: &request.cwd,
            log: request.log.as_deref(),
            log_buffer: request.log_buffer,
            launcher_env: &request.launcher_env,
            setenv: &request.setenv,
            pty: request.pty,
        },
        &facts,
    );
    let mut run = decided?;
    print_warnings(&mut run.ledger);
    if !run.init.user_namespace {
        let program = request.argv.first().map_or("", String::as_str);
        crate::harness::warn_unreachable_path(&run.init.env, program, run.init.identity);
    }
    let broker = crate::egress::BrokerSetup::load(&request.policy)
        .map_err(|e| Refusal::new(exit::REFUSED, e))?;
    // Run by the service, a bind (or a root kept in a private /tmp, or a
    // grant) of what the caller cannot reach would show it what root sees
    // (checked by the CLI too; here for any other way in).
    crate::caller::check_visible(&request.policy).map_err(|m| Refusal::new(exit::REFUSED, m))?;
    // A stream under a deny reaches the file through the host's mount.
    crate::stdio_relay::check_passed_streams(&request.policy)
        .map_err(|m| Refusal::new(exit::REFUSED, m))?;

    // Without a pty of its own a terminal still on a standard stream (one
    // a service client passed unrelayed; the CLI relays them) reaches the
    // agent, and its modes outlive the run (tty_state.rs).
    let terminals = if request.pty {
        crate::tty_state::Saved::default()
    } else {
        crate::tty_state::save()
    };
    if let Some(seccomp) = run.init.seccomp.as_mut() {
        seccomp.host_terminal = !terminals.is_empty();
    }
    // Before anything is made on the host: a refusal needs no undo.
    run.init.groups = crate::credentials::supplementary(run.init.identity, run.init.user_namespace)
        .map_err(|e| Refusal::new(exit::START_FAILURE, e))?;
    let pty = crate::harness::pty_channel(request.pty)
        .map_err(|e| Refusal::new(exit::START_FAILURE, e))?;
    let id = run_id();
    let mut undo = UndoStack::new(request.janitor.take());
    let created = create_on_host(&request, &run, &id, &mut undo);
    let mut log = match created {
        Ok(log) => log,
        Err(refusal) => {
            let _ = undo.unwind();
            return Err(refusal);
        }
    };

    // The init first: it waits for its plan while the eBPF programs load.
    if let Some(cgroup) = undo.cgroup() {
        run.init.limit_cgroups = cgroup.v1_paths().to_vec();
    }
    run.init.caller_attributes = crate::caller::attributes().cloned();
    let init_pid = crate::runlog::InitPid::default();
    let zygote = request.zygote.take();
    let spawned = match crate::launch::spawn(undo.cgroup(), &run, pty, &init_pid, zygote) {
        Ok(spawned) => spawned,
        Err(refusal) => {
            let _ = undo.unwind();
            return Err(refusal);
        }
    };
    let (effects, effects_rx) = crate::runlog::channel();
    let mut watch = match start_watch(&mut run, undo.cgroup(), preload, &effects) {
        Ok(watch) => watch,
        Err(refusal) => {
            // Killed and its cgroup join ended before the cgroups go.
            drop(spawned);
            let _ = undo.unwind();
            return Err(refusal);
        }
    };
    if let Some(watch) = watch.as_mut() {
        undo.leave_ring(|| watch.leave_ring());
    }
    let truth = match start_truth(
        &mut run,
        &request,
        undo.cgroup(),
        log.is_some() && watch.is_some(),
    ) {
        Ok(truth) => truth,
        Err(refusal) => {
            drop(spawned);
            let _ = undo.unwind();
            return Err(refusal);
        }
    };
    let marks = truth.as_ref().map(crate::fswatch::FsWatch::marks);
    let drain = match log.take() {
        Some(mut writer) => {
            let genesis = Genesis::new(
                serde_json::to_value(&request.policy).unwrap_or_default(),
                run.ledger.names(true),
                run.ledger.names(false),
                watch.as_ref().map(KernelWatch::tags).unwrap_or_default(),
            );
            writer.set_secrets(crate::egress::secret_values(&request.policy));
            writer.set_run(&id, request.label.as_deref());
            if let Err(e) = writer.genesis(genesis).and_then(|_| writer.flush()) {
                drop(spawned);
                let _ = undo.unwind();
                return Err(Refusal::new(exit::START_FAILURE, e));
            }
            undo.keep_log();
            Some(tokio::spawn(crate::runlog::drain_with(
                writer,
                effects_rx,
                truth,
                init_pid.clone(),
            )))
        }
        None => {
            // Nothing reads a run's records without a log. The channel is
            // unbounded (a slow disk must not block the proxy), so left
            // open it kept every gateway record in root's memory, outside
            // the run's cgroup, until the run ended: an agent flooding the
            // proxy grew the supervisor by 1.3 KiB a request. Closed, each
            // send fails at once and the record is dropped.
            drop(effects_rx);
            None
        }
    };

    let original_dst = watch.as_ref().and_then(KernelWatch::original_dst);
    let owner = watch.as_ref().and_then(KernelWatch::connection_owner);
    let announce = crate::harness::Announce {
        status: request.status.clone(),
        run_id: id.clone(),
        label: request.label.clone(),
    };
    // A stopped job stops the agent too (job_control.rs).
    let stops = crate::job_control::follow_stops(undo.cgroup().map(|c| c.path()));
    let outcome = crate::launch::start_and_wait(
        spawned,
        undo.cgroup(),
        &run,
        &request.policy,
        crate::launch::Extras {
            broker: broker.as_ref(),
            original_dst,
            owner,
            signals,
            announce: &announce,
        },
        &effects,
    )
    .await;
    drop(stops);
    let (outcome, relay) = match outcome {
        Ok((end, relay)) => (Ok(end), relay),
        Err(refusal) => (Err(refusal), None),
    };

    // Without a cgroup, the end of the init (PID 1 of the namespace) has
    // already ended every process of the sandbox. The emptied cgroup is
    // removed only after the drain (`cgroup::kill_and_wait`).
    let emptied = undo.empty_cgroup();
    terminals.restore();
    // Only once the sandbox is empty: a process left behind (teardown
    // failed) keeps being watched until the log is sealed.
    if let Some(marks) = marks.filter(|_| emptied.is_ok()) {
        marks.remove();
    }
    if let Some(relay) = relay {
        relay.finish(std::time::Duration::from_secs(2));
    }
    // The cgroup is empty: every event is in the ring buffer. Drain it.
    let release = match watch {
        Some(watch) => Some(watch.finish().await.1),
        None => None,
    };
    let teardown = emptied.and(undo.unwind());
    if let Err(e) = &teardown {
        crate::warn::say(format_args!("{e}"));
    }
    let code = match &outcome {
        Ok(end) if end.timed_out => crate::stop::TIMEOUT_EXIT,
        Ok(end) => exit::from_wait(end.code, end.signal),
        Err(refusal) => refusal.code,
    };
    drop(effects);
    let mut log_head = None;
    let mut log_complete = true;
    if let Some(drain) = drain {
        let log = match drain.await {
            Ok(writer) => {
                // A timed-out run is sealed with its status (124); the
                // supervisor's `signal` records before the seal say why.
                let signal = outcome
                    .as_ref()
                    .ok()
                    .filter(|end| !end.timed_out)
                    .and_then(|end| end.signal);
                // As the genesis says it (what `log verify` reads).
                let degraded = run
                    .ledger
                    .names(false)
                    .iter()
                    .any(|g| g == Guarantee::EbpfCapture.name());
                // A failure after the init reported the start is no
                // "never started": the agent ran (adversarial round 23b).
                let no_end = outcome.as_ref().err().map(|r| {
                    if r.after_start {
                        crate::runlog::NoAgentEnd::Unknown(&r.message)
                    } else {
                        crate::runlog::NoAgentEnd::NotStarted(&r.message)
                    }
                });
                crate::runlog::finish(writer, code, signal, teardown.is_ok(), degraded, no_end)
            }
            Err(e) => crate::runlog::LogOutcome {
                head: None,
                incomplete: Some(format!(
                    "the effect log task failed: {e}; the log is unsealed"
                )),
            },
        };
        if let Some(head) = &log.head
            && !crate::warn::quiet()
        {
            crate::warn::say(format_args!("effect log sealed, head {head}"));
        }
        if let Some(why) = &log.incomplete {
            crate::warn::say(format_args!("the effect log is incomplete: {why}"));
            log_complete = false;
        }
        log_head = log.head;
    }
    let code = match (&outcome, &teardown) {
        (Ok(_), Ok(())) => exit::with_log(code, log_complete),
        _ => code,
    };
    if let Ok(end) = &outcome {
        let status = match &teardown {
            Ok(()) => code,
            Err(_) => code.max(1),
        };
        crate::harness::announce_exit(
            &announce,
            crate::harness::Exit {
                code: end.code,
                signal: end.signal,
                status,
                started_at: request.started_at,
                log_complete: request
                    .log
                    .as_ref()
                    .map(|_| log_head.is_some() && log_complete),
                log_head,
            },
        );
    }
    if let Some(release) = release {
        release.wait();
    }
    match (outcome, teardown) {
        (Ok(_), Err(_)) => Ok(code.max(1)),
        (Ok(_), Ok(())) => Ok(code),
        (Err(refusal), _) => Err(refusal),
    }
}

/// Stage 4: everything the run makes on the host before any process
/// exists, each pushed on the undo stack. Returns the (empty) log.
fn create_on_host(
    request: &RunRequest,
    run: &RunPlan,
    id: &str,
    undo: &mut UndoStack,
) -> Result<Option<LogWriter>, Refusal> {
    // The service creates them for its caller only where the caller could.
    use crate::caller::as_caller;
    let owner = (!run.init.user_namespace).then_some(run.init.identity);
    let placeholders =
        crate::materialize::materialize(&request.policy, owner, &mut |p| undo.announce(p))
            .map_err(|e| Refusal::new(e.code(), e))?;
    undo.push(Undo::Placeholders(placeholders));
    // Created before the init mounts, so that its plan can hide the log.
    let log = match &request.log {
        Some(path) => {
            let (mut writer, created) = as_caller(|| LogWriter::create_undoable(path))
                .map_err(|e| Refusal::new(exit::REFUSED, e))?;
            // Before the flag: see `Janitor::log`.
            undo.announce_log(writer.raw_fd(), path);
            // As the supervisor: the caller lacks CAP_LINUX_IMMUTABLE. An
            // ordinary user's own run (no service) cannot either.
            match writer.hold_append_only() {
                Ok(()) => {}
                Err(_) if run.init.user_namespace => {}
                Err(e) => {
                    let cause = std::error::Error::source(&e)
                        .map(|s| format!(": {s}"))
                        .unwrap_or_default();
                    crate::tt_warn!("{e}{cause}");
                }
            }
            writer.set_batch_bytes(crate::runlog::BATCH_BYTES);
            undo.push(Undo::UnwrittenLog(created));
            Some(writer)
        }
        None => None,
    };
    if let Some(limits) = run.cgroup {
        // Under the service's parent cgroup when its programs are shared.
        let created = match crate::ebpf::shared::adopted_parent() {
            Some(parent) => crate::cgroup::RunCgroup::create_in(&parent, id),
            None => crate::cgroup::RunCgroup::create(id),
        };
        let mut cgroup = created.map_err(|e| Refusal::new(exit::START_FAILURE, e))?;
        let limited = cgroup.set_limits(limits);
        undo.push(Undo::Cgroup(cgroup));
        if let Err(e) = limited {
            let code = if request.policy.strict {
                exit::REFUSED
            } else {
                exit::START_FAILURE
            };
            return Err(Refusal::new(code, e));
        }
    }
    Ok(log)
}

/// A name for the run's cgroup, unique on this host.
fn run_id() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// Stage 5: attaches the eBPF programs to the run's cgroup (before the init
/// exists). What fails to attach is lost through the ledger: refused
/// under `--strict`, degraded otherwise.
fn start_watch(
    run: &mut RunPlan,
    cgroup: Option<&crate::cgroup::RunCgroup>,
    preload: Option<crate::ebpf::Preload>,
    effects: &crate::events::EffectSender,
) -> Result<Option<KernelWatch>, Refusal> {
    let (Some(options), Some(cgroup)) = (run.watch.as_mut(), cgroup) else {
        return Ok(None);
    };
    let mut started = KernelWatch::start(cgroup.path(), options, preload, effects);
    if let Err(crate::ebpf::EbpfError::Transparent(e)) = &started {
        // Without interception the explicit proxy still works; tools that
        // ignore HTTP(S)_PROXY get EPERM instead of being filtered.
        run.ledger
            .lose(Guarantee::TransparentInterception, e.to_string())?;
        print_warnings(&mut run.ledger);
        options.transparent_port = None;
        started = KernelWatch::start(cgroup.path(), options, None, effects);
    }
    match started {
        Ok(watch) => Ok(Some(watch)),
        Err(e) => {
            let why = format!("the eBPF programs did not attach: {e}");
            for guarantee in [
                Guarantee::ConnectFilter,
                Guarantee::UnixSocketPolicy,
                Guarantee::EbpfCapture,
                Guarantee::TransparentInterception,
            ] {
                run.ledger.lose(guarantee, &why)?;
            }
            run.unix_policy_lost();
            print_warnings(&mut run.ledger);
            Ok(None)
        }
    }
}

/// Stage 5b: watches the writable roots for kernel-sourced paths (before
/// the init exists; see fswatch/). Without it the log's paths would only
/// be the agent's claims: the capture is lost through the ledger (refused
/// under `--strict`, degraded otherwise).
fn start_truth(
    run: &mut RunPlan,
    request: &RunRequest,
    cgroup: Option<&crate::cgroup::RunCgroup>,
    capturing: bool,
) -> Result<Option<crate::fswatch::FsWatch>, Refusal> {
    let Some(cgroup) = cgroup.filter(|_| capturing) else {
        return Ok(None);
    };
    if !run.ledger.installed(Guarantee::EbpfCapture) {
        return Ok(None);
    }
    match crate::fswatch::FsWatch::start(&request.policy.writable_roots, cgroup.path()) {
        Ok(truth) => {
            if !truth.reports_fid() {
                // Still exact by name and order; one name's notifications of
                // different files may merge (docs/ebpf.md, round 12).
                run.ledger.warn(
                    "kernel-sourced paths without file handles: the kernel refused \
                     FAN_REPORT_FID | FAN_REPORT_TARGET_FID (Linux 5.17)",
                );
                print_warnings(&mut run.ledger);
            }
            Ok(Some(truth))
        }
        Err(e) => {
            run.ledger
                .lose(Guarantee::EbpfCapture, format!("kernel-sourced paths: {e}"))?;
            print_warnings(&mut run.ledger);
            Ok(None)
        }
    }
}

/// Gateways hold several descriptors per connection: use the hard limit.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
