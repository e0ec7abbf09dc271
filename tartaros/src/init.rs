//! The sandbox init: PID 1 of the sandbox's PID namespace.
//!
//! It is a single-threaded process with no runtime, so it may fork and run
//! Rust code in the child: a clone of the template the CLI forked before
//! its runtime started (`zygote.rs`), or, without one, a fresh `execve` of
//! our own binary dispatched in `main()`. Stages, in this fixed order:
//!
//! 1. receive the plan (fd 3); EOF means the supervisor died: exit;
//! 2. name the UTS namespace, apply the mount plan (still root; no socket,
//!    see stage 4);
//! 3. compile seccomp (pure); stages 2 and 3 overlap the supervisor's eBPF
//!    verification;
//! 4. receive the late part of the plan (sent once the eBPF programs are
//!    attached to our cgroup and the run is registered, or they have
//!    failed to attach): bring up loopback, make the gateways' listeners
//!    and pass them to the supervisor (fd 5), and finish the mounts in
//!    the order a plan made in one piece had them: the hiding of the
//!    host's sockets (should the unix policy have failed to attach), the
//!    scope (`--bind`, `--tmpfs`), the unix policy's mirrors; then open
//!    the pty and the Landlock paths;
//! 5. fork the agent; in the child: new session (no TIOCSTI into the
//!    launcher's terminal), drop to the agent's uid/gid with no
//!    capabilities and `no_new_privs`, enforce Landlock, enter the working
//!    directory, mark every inherited fd beyond stdio close-on-exec, install
//!    seccomp last, `execve`;
//! 6. reap orphans and forward SIGINT/SIGTERM/SIGHUP/SIGQUIT to the agent
//!    until the agent exits; report its status (fd 4) and exit with it.
//!    Leaving kills whatever is left in the namespace.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::exit;
use crate::plan::{Late, Plan, Report};
use crate::spawn::{GATEWAY_FD, PLAN_FD, REPORT_FD};

/// The hidden argument that makes `main()` run the init.
pub const INIT_ARG: &str = "__tartaros_sandbox_init";

/// A setup failure with the exit status the run should end with.
struct Failure {
    code: i32,
    message: String,
}

fn failure(code: i32, message: impl std::fmt::Display) -> Failure {
    Failure {
        code,
        message: message.to_string(),
    }
}

/// Runs the init; never returns.
pub fn main() -> ! {
    // SAFETY: the supervisor placed the report pipe on fd 4 for us alone.
    let mut report = unsafe { File::from_raw_fd(REPORT_FD) };
    let code = match run(&mut report) {
        Ok(code) => code,
        Err(failed) => {
            let _ = report.write_all(
                &Report::Failed {
                    code: failed.code,
                    message: failed.message,
                }
                .to_line(),
            );
            failed.code
        }
    };
    std::process::exit(code)
}

fn run(report: &mut File) -> Result<i32, Failure> {
    set_cloexec(REPORT_FD);
    // SAFETY: the supervisor placed the plan pipe on fd 3 for us alone.
    let mut plan_pipe = std::io::BufReader::new(unsafe { File::from_raw_fd(PLAN_FD) });
    let plan = Plan::receive(&mut plan_pipe).map_err(|e| failure(exit::START_FAILURE, e))?;
    // First, before the mounts change what /sys shows, and while this
    // process is single-threaded (a fresh exec, no runtime): nothing of
    // the agent may start outside its limits.
    crate::cgroup::join_v1_self(&plan.limit_cgroups)
        .map_err(|e| failure(exit::START_FAILURE, e))?;
    // Before any code of the agent's: it must not possess the launcher's
    // session keyring (session_keyring.rs).
    crate::session_keyring::join_new().map_err(|e| failure(exit::START_FAILURE, e))?;

    // Stage 2: namespaces. Still root, so mounts can be made. No socket
    // yet: the eBPF programs may be attached to our cgroup at any moment
    // from here on, and until the run is registered they refuse every
    // socket of a task in it.
    let _ = nix::unistd::sethostname("tartaros");
    crate::mounts::apply(&plan.mounts).map_err(|e| failure(exit::START_FAILURE, e))?;
    crate::ipc_limits::apply(&plan.ipc).map_err(|e| failure(exit::START_FAILURE, e))?;
    if let Some(counts) = &plan.user_counts {
        crate::user_counts::apply(counts).map_err(|e| failure(exit::START_FAILURE, e))?;
    }

    // Stage 3: the seccomp program the child will install (pure).
    let seccomp = match &plan.seccomp {
        Some(options) => Some(
            crate::seccomp::build_program(&crate::seccomp::SeccompOptions {
                strict: options.strict,
                deny_unix: options.deny_unix,
                host_terminal: options.host_terminal,
            })
            .map_err(|e| failure(exit::START_FAILURE, e))?,
        ),
        None => None,
    };

    // Stage 4. All of the above overlapped the verifier; what follows
    // depends on whether the eBPF programs attached, and only after it may
    // the agent start.
    let late = Late::receive(&mut plan_pipe).map_err(|e| failure(exit::START_FAILURE, e))?;
    drop(plan_pipe);
    // The run is registered (or has no programs): sockets may be made.
    crate::network::loopback_up().map_err(|e| failure(exit::START_FAILURE, e))?;
    pass_listeners(&plan)?;
    // Hidden sockets before the scope, as when they are planned from the
    // start: a `--bind` of a directory holding one copies the hiding with
    // its source's mounts, where a later hiding would miss the copy.
    crate::mounts::apply(&late.hide_sockets).map_err(|e| failure(exit::START_FAILURE, e))?;
    crate::scope::apply(&plan.scope).map_err(|e| failure(exit::START_FAILURE, e))?;
    // Last, so that the mirrors show the denies and the scope's mounts.
    crate::unix_mirror::apply(&late.unix_mirrors).map_err(|e| failure(exit::START_FAILURE, e))?;
    if plan.pty {
        // After the mounts: the pty comes from the sandbox's own devpts
        // when it has one.
        crate::pty::open_in_sandbox(plan.identity).map_err(|e| failure(exit::START_FAILURE, e))?;
    }
    // Opened once every mount is in place: a rule on a directory the scope
    // mounts over must hold the mounted one.
    let landlock = match &plan.landlock {
        Some(rules) => Some(
            crate::landlock::prepare(rules, plan.strict)
                .map_err(|e| failure(exit::START_FAILURE, e))?,
        ),
        None => None,
    };

    // The launcher's pipes get descriptions of the agent's own, whose
    // flags (O_NONBLOCK) it may change without reaching the host's
    // pipeline, and its /dev/null the sandbox's; still root, after the
    // private /dev and /proc.
    crate::stdio_own::reopen_streams().map_err(|e| failure(exit::START_FAILURE, e))?;

    // Stage 5: the agent. Signals are blocked here and waited for
    // synchronously below; the child restores an empty mask before exec.
    let mut forwarded = SigSet::empty();
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGCHLD,
    ] {
        forwarded.add(signal);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), None)
        .map_err(|e| failure(exit::START_FAILURE, format!("failed to block signals: {e}")))?;
    let (error_read, error_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| failure(exit::START_FAILURE, format!("failed to create a pipe: {e}")))?;

    // SAFETY: this process is single-threaded (a fresh exec, no runtime), so
    // the child may run ordinary Rust code.
    let agent = match unsafe { fork() } {
        Err(e) => {
            return Err(failure(
                exit::START_FAILURE,
                format!(
                    "failed to fork the agent: {e}{}",
                    crate::process_limit::plain_hint(e)
                ),
            ));
        }
        Ok(ForkResult::Child) => {
            drop(error_read);
            let failed = become_agent(&plan, landlock, seccomp.as_ref());
            let mut pipe = File::from(error_write);
            let _ = write!(pipe, "{}\t{}", failed.code, failed.message);
            // SAFETY: _exit skips atexit handlers and buffered state that
            // belongs to the parent.
            unsafe { libc::_exit(failed.code) }
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    if plan.pty {
        // Only the agent holds the pty: its end must close the slave.
        let _ = nix::unistd::close(crate::pty::PTY_FD);
    }
    drop(error_write);
    let mut exec_error = String::new();
    let _ = File::from(error_read).read_to_string(&mut exec_error);
    if !exec_error.is_empty() {
        let _ = waitpid(agent, None);
        let (code, message) = exec_error.split_once('\t').unwrap_or(("125", &exec_error));
        return Err(failure(
            code.parse().unwrap_or(exit::START_FAILURE),
            message,
        ));
    }
    let _ = report.write_all(&Report::Started.to_line());

    // Stage 6: reap and forward until the agent is gone.
    let status = supervise(agent, &forwarded);
    let _ = report.write_all(&status.to_line());
    Ok(match status {
        Report::Exited { code, signal } => exit::from_wait(code, signal),
        _ => exit::START_FAILURE,
    })
}

/// The agent child's last steps before `execve`; returns only on failure.
fn become_agent(
    plan: &Plan,
    landlock: Option<crate::landlock::Prepared>,
    seccomp: Option<&seccompiler::BpfProgram>,
) -> Failure {
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // The Rust runtime ignores SIGPIPE, and an ignored signal stays ignored
    // across execve: give the agent the default, as a shell would.
    // SAFETY: SIG_DFL installs no handler; this process is single-threaded.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
    if let Err(e) = nix::unistd::setsid() {
        return failure(
            exit::START_FAILURE,
            format!("failed to start a new session: {e}"),
        );
    }
    if plan.pty
        && let Err(e) = crate::pty::attach_in_agent()
    {
        return failure(exit::START_FAILURE, e);
    }
    // Before drop_to, which then clears the new namespace's capabilities.
    if let Some(user) = plan.map_user
        && let Err(e) = crate::identity_map::become_user(user)
    {
        return failure(exit::START_FAILURE, e);
    }
    // Before drop_to: a launcher's real-time policy, negative nice value or
    // real-time I/O class must not become the agent's (sched_reset.rs).
    if let Err(e) = crate::sched_reset::reset_priorities() {
        return failure(exit::START_FAILURE, e);
    }
    // A service caller's limits, umask, nice value and CPUs, where lower
    // (a direct run's agent inherited them by fork): after the reset, whose
    // limits of 0 stay, and as root, so that the uid change below counts
    // the caller's processes against the caller's RLIMIT_NPROC.
    if let Some(attributes) = &plan.caller_attributes
        && let Err(e) = crate::caller_attrs::take_on(attributes)
    {
        return failure(exit::START_FAILURE, e);
    }
    if let Err(e) = crate::credentials::drop_to(plan.identity, &plan.groups, plan.user_namespace) {
        return failure(exit::START_FAILURE, e);
    }
    // No core dumps. A core file is written by the kernel itself (core_pattern
    // `core`: into the crashing process's cwd, a writable root) with no
    // syscall of the agent's the effect log could record; 1 byte is below
    // an ELF core's minimum (a page), so none is written. A core_pattern
    // pipe (`|/usr/lib/systemd/systemd-coredump`, apport) ignores a limit
    // of 0 and runs that helper as root on the host, outside every wall,
    // with the agent's memory: 1 is the kernel's marker that refuses the
    // pipe. Soft and hard, and seccomp refuses changing it (docs/seccomp.md).
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 1, 1);
    // No pids cgroup holds an unprivileged run: its tasks are bounded here.
    // In the agent's own user namespace (map_user) RLIMIT_NPROC counts only
    // the run's tasks, threads included, and the agent has no capability
    // to raise the hard limit. Fail closed: unbounded, one fork bomb takes
    // every pid of the host.
    if let (Some(max), Some(_)) = (plan.max_tasks, plan.map_user)
        && let Err(e) =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, max, max)
    {
        return failure(
            exit::START_FAILURE,
            format!("failed to limit the agent to {max} tasks (RLIMIT_NPROC): {e}"),
        );
    }
    // Likewise its share of the user's pending signals and queue bytes.
    if let (Some(counts), Some(_)) = (&plan.user_counts, plan.map_user)
        && let Err(e) = crate::user_counts::limit_agent(counts)
    {
        return failure(exit::START_FAILURE, e);
    }
    if let Some(prepared) = landlock
        && let Err(e) = prepared.enforce()
    {
        return failure(
            if plan.strict {
                exit::REFUSED
            } else {
                exit::START_FAILURE
            },
            cannot_install(crate::guarantee::Guarantee::LandlockFilesystem, e),
        );
    }
    if let Err(e) = nix::unistd::chdir(&plan.cwd) {
        return failure(
            exit::START_FAILURE,
            format!(
                "failed to enter the working directory {} as uid {}: {e}; run from a directory the agent may read, or grant it",
                plan.cwd.display(),
                plan.identity.uid
            ),
        );
    }
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only flags descriptors.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };

    let argv: Vec<std::ffi::CString> = match plan
        .argv
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()))
        .collect()
    {
        Ok(argv) => argv,
        Err(e) => {
            return failure(
                exit::CANNOT_EXECUTE,
                format!("failed to pass the command: {e}"),
            );
        }
    };
    let env: Vec<std::ffi::CString> = plan
        .env
        .iter()
        .filter_map(|(k, v)| std::ffi::CString::new(format!("{k}={v}")).ok())
        .collect();
    let Some(program) = argv.first() else {
        return failure(exit::NOT_FOUND, "no command given");
    };
    if let Some(filter) = seccomp
        && let Err(e) = crate::seccomp::install(filter)
    {
        return failure(
            if plan.strict {
                exit::REFUSED
            } else {
                exit::START_FAILURE
            },
            cannot_install(crate::guarantee::Guarantee::Seccomp, e),
        );
    }
    let errno = exec_on_agent_path(program, &argv, &env, &plan.env);
    let name = &plan.argv[0];
    if let Some(why) = plan
        .caller_attributes
        .as_ref()
        .and_then(|a| crate::caller_attrs::exec_failure(a, errno))
    {
        return failure(
            exit::CANNOT_EXECUTE,
            format!("{name}: cannot execute: {}: {why}", errno.desc()),
        );
    }
    match errno {
        nix::errno::Errno::ENOENT => failure(
            exit::NOT_FOUND,
            format!("{name}: command not found in the sandbox"),
        ),
        other => failure(
            exit::CANNOT_EXECUTE,
            format!("{name}: cannot execute: {}", other.desc()),
        ),
    }
}

/// Waits for signals: reaps every child (orphans re-parented to us too) and
/// forwards termination signals to the agent's process group.
fn supervise(agent: Pid, signals: &SigSet) -> Report {
    loop {
        let Ok(signal) = signals.wait() else { continue };
        if signal != Signal::SIGCHLD {
            // The agent leads its own session and process group.
            let _ = kill(Pid::from_raw(-agent.as_raw()), signal);
            continue;
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == agent => {
                    return Report::Exited {
                        code: Some(code),
                        signal: None,
                    };
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == agent => {
                    return Report::Exited {
                        code: None,
                        signal: Some(signal as i32),
                    };
                }
                // An agent that asked to be traced (PTRACE_TRACEME) stops
                // for us on every signal; let it go on with that signal.
                Ok(WaitStatus::Stopped(pid, signal)) => {
                    let _ = nix::sys::ptrace::cont(pid, Some(signal));
                }
                Ok(WaitStatus::PtraceEvent(pid, _, _)) | Ok(WaitStatus::PtraceSyscall(pid)) => {
                    let _ = nix::sys::ptrace::cont(pid, None);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}

/// Makes the gateways' listeners in the sandbox's network namespace and
/// hands them to the supervisor (fd 5), which serves them from the host.
/// The agent never holds them: they are closed here before it is forked.
fn pass_listeners(plan: &Plan) -> Result<(), Failure> {
    // SAFETY: the supervisor placed the gateway socket on fd 5 for us alone.
    let channel = unsafe { std::os::fd::OwnedFd::from_raw_fd(GATEWAY_FD) };
    if plan.listeners.is_empty() {
        return Ok(());
    }
    let listeners =
        crate::network::listen_all(&plan.listeners).map_err(|e| failure(exit::START_FAILURE, e))?;
    use std::os::fd::AsRawFd;
    crate::network::send_listeners(channel.as_raw_fd(), &listeners)
        .map_err(|e| failure(exit::START_FAILURE, e))
}

/// Runs `program` looked up on the agent's own PATH (execvpe would use the
/// init's, which is empty), like a shell: the first candidate that exists
/// and executes wins; EACCES on one is remembered and the search goes on.
fn exec_on_agent_path(
    program: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    env: &[std::ffi::CString],
    plan_env: &[(String, String)],
) -> nix::errno::Errno {
    use nix::errno::Errno;
    let path = plan_env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let name = program.to_string_lossy();
    let mut result = Errno::ENOENT;
    for candidate in crate::environment::exec_candidates(&name, path) {
        let Ok(candidate) = std::ffi::CString::new(candidate.into_os_string().into_encoded_bytes())
        else {
            continue;
        };
        let errno = match nix::unistd::execve(&candidate, argv, env) {
            Err(errno) => errno,
            Ok(never) => match never {},
        };
        match errno {
            Errno::ENOENT | Errno::ENOTDIR => {}
            // A directory on PATH the agent cannot search hides nothing it
            // could run: only a file it can see but not execute is 126.
            Errno::EACCES => {
                if nix::sys::stat::stat(candidate.as_c_str()).is_ok() {
                    result = Errno::EACCES;
                }
            }
            other => return other,
        }
    }
    result
}

fn set_cloexec(fd: i32) {
    // SAFETY: F_SETFD on a descriptor we own only changes its flags.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// A guarantee the plan had that the agent's last steps could not install
/// (the probe saw the mechanism, yet the call was refused: a filter or
/// policy of whatever runs tartaros). Named as the supervisor's own
/// refusals are, so the status channel's `field` names it.
fn cannot_install(g: crate::guarantee::Guarantee, e: impl std::fmt::Display) -> String {
    format!(
        "cannot install {}: {e}; is tartaros itself confined (a seccomp filter or security module that refuses it)? run it outside that confinement",
        g.name()
    )
}
