//! The supervisor: owns the run from policy to teardown.
//!
//! Order: probe the host and check the guarantees (refuse before anything
//! is created), materialize absent denies, create the cgroup, start the
//! janitor (cleans up if we are killed), start the sandbox init straight into
//! the cgroup and namespaces, send it the plan, forward signals, wait, then
//! kill whatever is left in the cgroup, wait until it is empty, remove it
//! and the placeholders.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use crate::cgroup::RunCgroup;
use crate::credentials::Identity;
use crate::effectlog::{Genesis, LogWriter};
use crate::exit;
use crate::kernel_watch::KernelWatch;
use crate::plan::{Plan, Report, SeccompPlan};
use crate::policy::Policy;
use crate::probe::{Guarantee, Host};

/// How long teardown may take to empty the cgroup before it reports failure.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// A run that ended before or instead of the agent: the CLI prints
/// `tartaros: <message>` and exits with `code`.
#[derive(Debug)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
}

fn refuse(code: i32, message: impl std::fmt::Display) -> Refusal {
    Refusal {
        code,
        message: message.to_string(),
    }
}

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
}

/// Everything checked and decided before any process or cgroup exists.
struct Prepared {
    plan: Plan,
    guarantees: Vec<Guarantee>,
    placeholders: Vec<PathBuf>,
    /// The log file, created (empty) before the mount plan so that the plan
    /// can hide it from the agent.
    log: Option<LogWriter>,
    /// Whether the run gets its own cgroup (degraded away for an ordinary
    /// user without a delegated subtree).
    use_cgroup: bool,
    /// The broker's secrets and TLS client, loaded before anything starts.
    broker: Option<crate::egress::BrokerSetup>,
}

fn prepare(request: &RunRequest, host: &Host) -> Result<Prepared, Refusal> {
    let policy = &request.policy;
    let guarantees = crate::probe::guarantees(policy, host, request.log.is_some());
    for missing in guarantees.iter().filter(|g| !g.installed) {
        if policy.strict || missing.name == "namespaces" {
            return Err(refuse(
                exit::REFUSED,
                format!("cannot install {}: {}", missing.name, missing.reason),
            ));
        }
        eprintln!(
            "tartaros: warning: {} not installed: {}",
            missing.name, missing.reason
        );
    }

    let current = Identity {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    let env_lookup = |name: &str| {
        request
            .launcher_env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    // An ordinary user gets a user namespace in which the init is root,
    // mapped to that user; the agent stays that user, without capabilities.
    let user_namespace = !host.root;
    if user_namespace && policy.user.is_some() {
        return Err(refuse(
            exit::REFUSED,
            "--user needs tartaros to run as root; drop --user",
        ));
    }
    let identity = if user_namespace {
        Identity { uid: 0, gid: 0 }
    } else {
        crate::credentials::choose(policy.user.as_deref(), current, &env_lookup)
            .map_err(|e| refuse(exit::REFUSED, e))?
    };
    if !user_namespace {
        warn_unwritable_roots(policy, identity);
    }

    let broker = crate::egress::BrokerSetup::load(policy).map_err(|e| refuse(exit::REFUSED, e))?;
    let placeholders = materialize(policy)?;
    let log = match &request.log {
        Some(path) => match LogWriter::create(path) {
            Ok(mut writer) => {
                writer.set_batch_bytes(crate::runlog::BATCH_BYTES);
                Some(writer)
            }
            Err(e) => {
                cleanup_placeholders(&placeholders);
                return Err(refuse(exit::REFUSED, e));
            }
        },
        None => None,
    };
    // The agent must not open, truncate, rename or delete the log, even
    // when it lies inside a writable root: it is denied like a secret.
    let mut mount_policy = policy.clone();
    mount_policy.read_denies.extend(request.log.iter().cloned());
    if !policy.deny_unix
        && let Ok(table) = std::fs::read_to_string("/proc/net/unix")
    {
        let sockets = crate::mounts::host_sockets_to_hide(&table, policy);
        mount_policy
            .read_denies
            .extend(sockets.into_iter().filter(|p| {
                use std::os::unix::fs::FileTypeExt;
                std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
            }));
    }
    let exists = |path: &Path| std::fs::metadata(path).ok().map(|m| m.is_dir());
    let installed = |name: &str| guarantees.iter().any(|g| g.name == name && g.installed);
    let plan = Plan {
        argv: request.argv.clone(),
        env: crate::environment::agent_env(policy, &request.launcher_env),
        cwd: request.cwd.clone(),
        identity,
        user_namespace,
        mounts: crate::mounts::plan(&mount_policy, &request.cwd, &exists),
        landlock: host
            .landlock_abi
            .filter(|_| installed("landlock-filesystem"))
            .map(|abi| crate::landlock::plan(policy, abi)),
        seccomp: installed("seccomp").then_some(SeccompPlan {
            strict: policy.harden_syscalls,
            deny_unix: policy.deny_unix,
        }),
        strict: policy.strict,
    };
    let use_cgroup = installed("cgroup");
    Ok(Prepared {
        plan,
        guarantees,
        placeholders,
        log,
        use_cgroup,
        broker,
    })
}

/// Creates an empty directory for each absent deny path the agent could
/// create (`--materialize`), so the deny has something to hold on to.
/// Without `--materialize` such a path is refused under `--strict`.
fn materialize(policy: &Policy) -> Result<Vec<PathBuf>, Refusal> {
    let mut created = Vec::new();
    let absent = policy
        .read_denies
        .iter()
        .chain(&policy.write_denies)
        .filter(|p| std::fs::symlink_metadata(p).is_err() && policy.is_writable(p));
    for path in absent {
        if !policy.materialize_absent_handoff {
            if policy.strict {
                cleanup_placeholders(&created);
                return Err(refuse(
                    exit::REFUSED,
                    format!(
                        "denied path {} does not exist, so the agent could create it; create it first or pass --materialize",
                        path.display()
                    ),
                ));
            }
            eprintln!(
                "tartaros: warning: deny of {} not installed: it does not exist (pass --materialize)",
                path.display()
            );
            continue;
        }
        // Create missing parents too, and remember each for removal.
        let mut missing: Vec<&Path> = path
            .ancestors()
            .take_while(|a| std::fs::symlink_metadata(a).is_err())
            .collect();
        missing.reverse();
        for dir in missing {
            if let Err(e) = std::fs::create_dir(dir) {
                cleanup_placeholders(&created);
                return Err(refuse(
                    exit::START_FAILURE,
                    format!("failed to materialize {}: {e}", dir.display()),
                ));
            }
            created.push(dir.to_path_buf());
        }
    }
    Ok(created)
}

/// Removes the placeholders that are still empty, innermost first, so the
/// tree is handed back as it was.
pub fn cleanup_placeholders(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
}

fn warn_unwritable_roots(policy: &Policy, identity: Identity) {
    use std::os::unix::fs::MetadataExt;
    for root in &policy.writable_roots {
        let Ok(meta) = std::fs::metadata(root) else {
            continue;
        };
        let mode = meta.mode();
        let writable = identity.uid == 0
            || (meta.uid() == identity.uid && mode & 0o200 != 0)
            || (meta.gid() == identity.gid && mode & 0o020 != 0)
            || mode & 0o002 != 0;
        if !writable {
            eprintln!(
                "tartaros: warning: the agent runs as uid {} and cannot write {} (owner uid {}); chown it, or choose the user with --user",
                identity.uid,
                root.display(),
                meta.uid()
            );
        }
    }
}

/// How the agent ended.
#[derive(Debug, Clone, Copy)]
struct AgentEnd {
    code: Option<i32>,
    signal: Option<i32>,
}

/// Runs the agent under `request` and returns the exit status to use.
pub async fn run(mut request: RunRequest) -> Result<i32, Refusal> {
    raise_fd_limit();
    let host = Host::probe();
    if host.root && crate::probe::wants_bpf(&request.policy, request.log.is_some()) {
        // Parses the kernel's BTF on a thread while we prepare the rest.
        crate::ebpf::warm_up_capture();
        if request.log.is_some() {
            // And creates the capture's ring buffer on another.
            crate::ebpf::prepare_ring(request.log_buffer);
        }
    }
    let mut prepared = prepare(&request, &host)?;
    let mut janitor = request.janitor.take();
    if let Some(janitor) = janitor.as_mut() {
        for placeholder in &prepared.placeholders {
            janitor.placeholder(placeholder);
        }
    }
    let id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let abandon = |prepared: &mut Prepared| {
        cleanup_placeholders(&prepared.placeholders);
        // Nothing was written yet: leave no empty log behind.
        if let (Some(writer), Some(path)) = (prepared.log.take(), &request.log) {
            drop(writer);
            let _ = std::fs::remove_file(path);
        }
    };
    let mut cgroup = None;
    if prepared.use_cgroup {
        let mut created = match RunCgroup::create(&id) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                abandon(&mut prepared);
                return Err(refuse(exit::START_FAILURE, e));
            }
        };
        let limits = crate::cgroup::Limits {
            max_procs: request.policy.max_processes,
            max_memory: request.policy.max_memory,
        };
        if let Err(e) = created.set_limits(limits) {
            let _ = created.kill_and_remove(TEARDOWN_TIMEOUT);
            abandon(&mut prepared);
            let code = if request.policy.strict {
                exit::REFUSED
            } else {
                exit::START_FAILURE
            };
            return Err(refuse(code, e));
        }
        if let Some(janitor) = janitor.as_mut() {
            janitor.cgroup(created.path());
            for v1 in created.v1_paths() {
                janitor.v1(v1);
            }
        }
        cgroup = Some(created);
    }

    let (effects, effects_rx) = crate::runlog::channel();
    let watch = match (&cgroup, installed(&prepared.guarantees, "connect-filter")) {
        (Some(cgroup_dir), true) => {
            match start_watch(&request, &mut prepared, cgroup_dir.path(), &effects) {
                Ok(watch) => watch,
                Err(refusal) => {
                    let _ = cgroup_dir.kill_and_remove(TEARDOWN_TIMEOUT);
                    abandon(&mut prepared);
                    return Err(refusal);
                }
            }
        }
        _ => None,
    };
    let truth = match (&cgroup, prepared.log.is_some() && watch.is_some()) {
        (Some(cgroup_dir), true) => match start_truth(&request, &mut prepared, cgroup_dir.path()) {
            Ok(truth) => truth,
            Err(refusal) => {
                let _ = cgroup_dir.kill_and_remove(TEARDOWN_TIMEOUT);
                abandon(&mut prepared);
                return Err(refusal);
            }
        },
        _ => None,
    };
    let drain = match prepared.log.take() {
        Some(mut writer) => {
            let genesis = Genesis::new(
                serde_json::to_value(&request.policy).unwrap_or_default(),
                names(&prepared.guarantees, true),
                names(&prepared.guarantees, false),
                watch.as_ref().map(KernelWatch::tags).unwrap_or_default(),
            );
            writer.set_secrets(crate::egress::secret_values(&request.policy));
            if let Err(e) = writer.genesis(genesis).and_then(|_| writer.flush()) {
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.kill_and_remove(TEARDOWN_TIMEOUT);
                }
                cleanup_placeholders(&prepared.placeholders);
                return Err(refuse(exit::START_FAILURE, e));
            }
            Some(tokio::spawn(crate::runlog::drain_with(
                writer, effects_rx, truth,
            )))
        }
        None => None,
    };

    let original_dst = watch.as_ref().and_then(KernelWatch::original_dst);
    let outcome = run_in(
        cgroup.as_ref(),
        &prepared,
        &request.policy,
        original_dst,
        &effects,
    )
    .await;

    // Without a cgroup, the end of the init (PID 1 of the namespace) has
    // already ended every process of the sandbox.
    let teardown = match &cgroup {
        Some(cgroup) => cgroup.kill_and_remove(TEARDOWN_TIMEOUT),
        None => Ok(()),
    };
    cleanup_placeholders(&prepared.placeholders);
    // The cgroup is empty: every event is in the ring buffer. Drain it.
    let release = match watch {
        Some(watch) => Some(watch.finish().await.1),
        None => None,
    };
    if let Some(janitor) = janitor
        && teardown.is_ok()
    {
        janitor.done();
    }
    if let Err(e) = &teardown {
        eprintln!("tartaros: {e}");
    }
    let code = match &outcome {
        Ok(end) => exit::from_wait(end.code, end.signal),
        Err(refusal) => refusal.code,
    };
    drop(effects);
    if let Some(drain) = drain {
        match drain.await {
            Ok(writer) => {
                let signal = outcome.as_ref().ok().and_then(|end| end.signal);
                match crate::runlog::seal(writer, code, signal, teardown.is_ok()) {
                    Ok(head) => eprintln!("tartaros: effect log sealed, head {head}"),
                    Err(e) => eprintln!("tartaros: failed to seal the effect log: {e}"),
                }
            }
            Err(e) => eprintln!("tartaros: the effect log task failed: {e}; the log is unsealed"),
        }
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

/// Watches the writable roots for kernel-sourced paths (before the init
/// exists). Without it the log's paths are only the agent's claims: a
/// strict run is refused, others say so and record capture as degraded.
fn start_truth(
    request: &RunRequest,
    prepared: &mut Prepared,
    cgroup: &Path,
) -> Result<Option<crate::fswatch::FsWatch>, Refusal> {
    let policy = &request.policy;
    if !installed(&prepared.guarantees, "ebpf-capture") {
        return Ok(None);
    }
    match crate::fswatch::FsWatch::start(&policy.writable_roots, cgroup) {
        Ok(truth) => Ok(Some(truth)),
        Err(e) if policy.strict => Err(refuse(
            exit::REFUSED,
            format!("cannot install kernel-sourced paths: {e}"),
        )),
        Err(e) => {
            let why = format!("kernel-sourced paths: {e}");
            eprintln!("tartaros: warning: {why}");
            degrade(&mut prepared.guarantees, "ebpf-capture", &why);
            Ok(None)
        }
    }
}

/// Attaches the eBPF programs to the run's cgroup (before the init exists).
/// A failure refuses a strict run and degrades the others, with a warning
/// and a `degraded` entry in the log's genesis.
fn start_watch(
    request: &RunRequest,
    prepared: &mut Prepared,
    cgroup: &Path,
    effects: &crate::events::EffectSender,
) -> Result<Option<KernelWatch>, Refusal> {
    let policy = &request.policy;
    let capture = installed(&prepared.guarantees, "ebpf-capture");
    let mut options = crate::kernel_watch::options(policy, capture, request.log_buffer);
    options.unix_policy &= installed(&prepared.guarantees, "unix-socket-policy");
    if options.unix_policy
        && let Err(why) = crate::kernel_watch::unix_roots_fit(&options)
    {
        if policy.strict {
            return Err(refuse(
                exit::REFUSED,
                format!("cannot install unix-socket-policy: {why}"),
            ));
        }
        eprintln!("tartaros: warning: unix-socket-policy not installed: {why}");
        degrade(&mut prepared.guarantees, "unix-socket-policy", &why);
        options.unix_policy = false;
    }
    let mut started = KernelWatch::start(cgroup, &options, effects);
    if let Err(crate::ebpf::EbpfError::Transparent(e)) = &started {
        // Without interception the explicit proxy still works; tools that
        // ignore HTTP(S)_PROXY get EPERM instead of being filtered.
        let why = e.to_string();
        if policy.strict {
            return Err(refuse(
                exit::REFUSED,
                format!("cannot install transparent interception: {why}"),
            ));
        }
        eprintln!("tartaros: warning: transparent interception not installed: {why}");
        options.transparent_port = None;
        started = KernelWatch::start(cgroup, &options, effects);
    }
    match started {
        Ok(watch) => Ok(Some(watch)),
        Err(e) => {
            let why = e.to_string();
            if policy.strict {
                return Err(refuse(
                    exit::REFUSED,
                    format!("cannot install the eBPF programs: {why}"),
                ));
            }
            eprintln!("tartaros: warning: eBPF programs not installed: {why}");
            for name in ["connect-filter", "unix-socket-policy", "ebpf-capture"] {
                degrade(&mut prepared.guarantees, name, &why);
            }
            Ok(None)
        }
    }
}

fn degrade(guarantees: &mut [Guarantee], name: &str, why: &str) {
    for g in guarantees.iter_mut().filter(|g| g.name == name) {
        g.installed = false;
        g.reason = why.to_string();
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

fn installed(guarantees: &[Guarantee], name: &str) -> bool {
    guarantees.iter().any(|g| g.name == name && g.installed)
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

fn names(guarantees: &[Guarantee], installed: bool) -> Vec<String> {
    guarantees
        .iter()
        .filter(|g| g.installed == installed)
        .map(|g| g.name.to_string())
        .collect()
}

async fn run_in(
    cgroup: Option<&RunCgroup>,
    prepared: &Prepared,
    policy: &Policy,
    original_dst: Option<crate::proxy::OriginalDst>,
    effects: &crate::events::EffectSender,
) -> Result<AgentEnd, Refusal> {
    let start_failed = |what: &str, e: &dyn std::fmt::Display| {
        refuse(exit::START_FAILURE, format!("failed to {what}: {e}"))
    };
    let (plan_read, plan_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the plan pipe", &e))?;
    let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the report pipe", &e))?;
    // Network grants are not implemented yet (the guarantee check refused
    // or warned), so every sandbox gets a private loopback-only network.
    let (gate_read, gate_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed("create the start gate", &e))?;
    let gated = prepared.plan.user_namespace;
    let namespaces = crate::spawn::Namespaces {
        network: true,
        user: prepared.plan.user_namespace,
    };
    let init = crate::spawn::spawn_init(
        "/proc/self/exe",
        &["tartaros-init", crate::init::INIT_ARG],
        cgroup.map(RunCgroup::fd),
        namespaces,
        &plan_read,
        &report_write,
        gated.then_some(&gate_read),
    )
    .map_err(|e| refuse(exit::START_FAILURE, e))?;
    drop(plan_read);
    drop(report_write);
    // The init waits for its plan before it forks, so joining the v1 limit
    // cgroups now covers every process of the agent.
    let joined = match cgroup {
        Some(cgroup) => cgroup.join_v1(init.pid).map_err(|e| e.to_string()),
        None => Ok(()),
    };
    let mapped = if prepared.plan.user_namespace {
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
    let gateways = if installed(&prepared.guarantees, "gateways") {
        crate::egress::open(
            init.pid,
            policy,
            prepared.broker.as_ref(),
            original_dst,
            effects,
        )
        .map_err(|e| e.to_string())
    } else {
        Ok(Vec::new())
    };
    let gateways = match joined.and(mapped).and(gateways) {
        Ok(gateways) => gateways,
        Err(e) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(init.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = wait_exit(&init.pidfd).await;
            return Err(refuse(exit::START_FAILURE, e));
        }
    };
    // Dropped when the run ends: the gateways close with it.
    let _gateways = AbortOnDrop(gateways);

    let mut plan_pipe = std::fs::File::from(plan_write);
    let sent = prepared.plan.send(&mut plan_pipe);
    drop(plan_pipe);
    if let Err(e) = sent {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(init.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = wait_exit(&init.pidfd).await;
        return Err(refuse(exit::START_FAILURE, e));
    }

    let init_status = forward_signals_until_exit(init.pid, &init.pidfd).await;
    let mut report_bytes = Vec::new();
    let _ = std::fs::File::from(report_read).read_to_end(&mut report_bytes);
    let reports = Report::parse_all(&report_bytes);
    for report in &reports {
        match report {
            Report::Failed { code, message } => return Err(refuse(*code, message)),
            Report::Exited { code, signal } => {
                return Ok(AgentEnd {
                    code: *code,
                    signal: *signal,
                });
            }
            Report::Started => {}
        }
    }
    Err(refuse(
        exit::START_FAILURE,
        format!("the sandbox init ended without a report ({init_status})"),
    ))
}

/// Forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the init (which passes them to
/// the agent) until the init exits; returns how it ended.
async fn forward_signals_until_exit(pid: i32, pidfd: &OwnedFd) -> String {
    let mut forwarders = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ] {
        let Ok(mut stream) = signal(kind) else {
            continue;
        };
        let Ok(sig) = nix::sys::signal::Signal::try_from(kind.as_raw_value()) else {
            continue;
        };
        forwarders.push(tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            }
        }));
    }
    let status = wait_exit(pidfd).await;
    for forwarder in forwarders {
        forwarder.abort();
    }
    status
}

/// Waits until the process behind `pidfd` exits, reaps it, and describes
/// its status.
async fn wait_exit(pidfd: &OwnedFd) -> String {
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
