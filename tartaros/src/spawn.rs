//! Starting the sandbox init: `clone3` straight into the run's cgroup and new
//! namespaces ([`clone_init`], shared with the template of `zygote.rs`),
//! then, on this path, `execve` of our own binary.
//!
//! The supervisor is multithreaded (tokio), so the child of `clone3` runs only
//! async-signal-safe raw system calls prepared beforehand (`dup2`, `prctl`,
//! `setsid`, `execve`) — no allocation, no locks, no Rust runtime — exactly
//! like `posix_spawn`. Everything else happens in the fresh, single-threaded
//! init after `execve`.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("failed to prepare the sandbox init's arguments: {0}")]
    Argument(#[from] std::ffi::NulError),
    #[error(
        "failed to start the sandbox init (clone3): {0}; {hint}",
        hint = crate::process_limit::clone_hint(*.0)
    )]
    Clone(nix::Error),
    #[error("failed to duplicate a descriptor for the sandbox init: {0}")]
    Dup(nix::Error),
    #[error("failed to write the user namespace's {file}: {source}")]
    IdMap {
        file: String,
        source: std::io::Error,
    },
}

/// New namespaces for the sandbox init.
#[derive(Debug, Clone, Copy, Default)]
pub struct Namespaces {
    pub network: bool,
    /// A user namespace, for runs started by an ordinary user: the init is
    /// root inside it, mapped to that user outside.
    pub user: bool,
    /// The cloning process made fresh network, IPC and UTS namespaces of
    /// its own already (the zygote's): the init inherits them.
    pub premade: bool,
}

/// The init as seen from the supervisor.
pub struct InitProcess {
    pub pid: i32,
    /// A pidfd: pollable for exit and immune to pid reuse.
    pub pidfd: OwnedFd,
}

/// The supervisor's ends that the init inherits: the plan (fd 3) and
/// report (fd 4) pipes, the gateway socket (fd 5), the start gate of a
/// user namespace run, and the agent's pty (fd 6).
pub struct InitFds<'a> {
    pub plan: &'a OwnedFd,
    pub report: &'a OwnedFd,
    pub gateway: &'a OwnedFd,
    pub gate: Option<&'a OwnedFd>,
    pub pty: Option<&'a OwnedFd>,
}

/// The fd numbers the init finds its plan and report pipes on.
pub const PLAN_FD: RawFd = 3;
pub const REPORT_FD: RawFd = 4;
/// Where the init finds the socket to pass the gateways' listeners on.
pub const GATEWAY_FD: RawFd = 5;

// Kernel ABI of clone3 (include/uapi/linux/sched.h), version 2 (with cgroup).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts `exe argv...` as PID 1 of new PID, mount, IPC, UTS and cgroup namespaces
/// (and network, if asked), directly inside the cgroup `cgroup_fd`, with
/// `plan` on fd 3, `report` on fd 4, `gateway` on fd 5, an empty environment, its own session,
/// and SIGKILL as its parent-death signal. Must be called from the thread
/// that lives as long as the run (the parent-death signal follows the
/// thread, not the process): the supervisor's main thread.
pub fn spawn_init(
    exe: &str,
    argv: &[&str],
    cgroup_fd: Option<RawFd>,
    namespaces: Namespaces,
    fds: InitFds<'_>,
) -> Result<InitProcess, SpawnError> {
    let InitFds {
        plan,
        report,
        gateway,
        gate,
        pty,
    } = fds;
    let exe = CString::new(exe)?;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(*a))
        .collect::<Result<_, _>>()?;
    let mut arg_ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    arg_ptrs.push(std::ptr::null());
    let env_ptrs: [*const libc::c_char; 1] = [std::ptr::null()];

    // dup2 onto 3 and 4 would be a no-op (and keep CLOEXEC) if a source
    // already had that number; move the sources out of the way first.
    let plan_src = dup_above(plan.as_raw_fd())?;
    let report_src = dup_above(report.as_raw_fd())?;
    let gateway_src = dup_above(gateway.as_raw_fd())?;
    // In a new user namespace the child must not exec before its id map is
    // written: an exec by an unmapped uid drops every capability the init
    // needs. It waits for one byte on `gate` (EOF: the supervisor gave up).
    let gate_src = gate.map(|g| dup_above(g.as_raw_fd())).transpose()?;
    let gate_fd = gate_src.as_ref().map_or(-1, |g| g.as_raw_fd());
    // The agent's pty slave, for the init to hand on (see pty.rs).
    let pty_src = pty.map(|p| dup_above(p.as_raw_fd())).transpose()?;
    let pty_fd = pty_src.as_ref().map_or(-1, |p| p.as_raw_fd());

    let mut pidfd: RawFd = -1;
    // SAFETY: the child branch below only makes raw system calls on memory
    // prepared before the call (`exe`, `arg_ptrs`, `env_ptrs`), then execs
    // or exits; it never returns into Rust code that could take a lock
    // held by another thread.
    let rc = unsafe { clone_init(cgroup_fd, namespaces, 0, &mut pidfd) };
    if rc == 0 {
        // SAFETY: async-signal-safe system calls only (see above).
        unsafe {
            if gate_fd >= 0 {
                let mut byte = 0u8;
                loop {
                    let n = libc::read(gate_fd, (&mut byte as *mut u8).cast(), 1);
                    if n == 1 {
                        break;
                    }
                    if n == 0 || *libc::__errno_location() != libc::EINTR {
                        libc::_exit(crate::exit::START_FAILURE);
                    }
                }
            }
            if libc::dup2(plan_src.as_raw_fd(), PLAN_FD) < 0
                || libc::dup2(report_src.as_raw_fd(), REPORT_FD) < 0
                || libc::dup2(gateway_src.as_raw_fd(), GATEWAY_FD) < 0
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                || (pty_fd >= 0 && libc::dup2(pty_fd, crate::pty::PTY_FD) < 0)
                || libc::setsid() < 0
            {
                libc::_exit(crate::exit::START_FAILURE);
            }
            libc::execve(exe.as_ptr(), arg_ptrs.as_ptr(), env_ptrs.as_ptr());
            libc::_exit(crate::exit::START_FAILURE);
        }
    }
    if rc < 0 {
        return Err(SpawnError::Clone(nix::errno::Errno::last()));
    }
    // SAFETY: the kernel stored a fresh pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(InitProcess {
        pid: rc as i32,
        pidfd,
    })
}

/// `clone3` of the sandbox init: new PID, mount, IPC, UTS and cgroup
/// namespaces (network and user ones if asked), straight into `cgroup_fd`,
/// with `extra` flags (the zygote's `CLONE_PARENT`), a pidfd in `pidfd`
/// and SIGCHLD at exit. Returns as fork does: 0 in the child, the pid in
/// the parent, -1 with errno set.
///
/// # Safety
/// Like fork: in a multithreaded caller the child may only make
/// async-signal-safe calls.
pub(crate) unsafe fn clone_init(
    cgroup_fd: Option<RawFd>,
    namespaces: Namespaces,
    extra: u64,
    pidfd: &mut RawFd,
) -> libc::c_long {
    let mut flags =
        (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP | libc::CLONE_PIDFD) as u64
            | extra;
    if cgroup_fd.is_some() {
        flags |= CLONE_INTO_CGROUP;
    }
    if !namespaces.premade {
        flags |= (libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as u64;
        if namespaces.network {
            flags |= libc::CLONE_NEWNET as u64;
        }
    }
    if namespaces.user {
        flags |= libc::CLONE_NEWUSER as u64;
    }
    let mut args = CloneArgs {
        flags,
        pidfd: pidfd as *mut RawFd as u64,
        // clone3 refuses one with CLONE_PARENT: the child then exits with
        // its parent's own signal (SIGCHLD for a forked one).
        exit_signal: if extra & libc::CLONE_PARENT as u64 != 0 {
            0
        } else {
            libc::SIGCHLD as u64
        },
        cgroup: cgroup_fd.map_or(0, |fd| fd as u64),
        ..Default::default()
    };
    // SAFETY: clone3 with no stack behaves like fork; `args` lives across
    // the call (the caller's contract covers the child).
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// Maps root inside the init's new user namespace to `uid`/`gid` outside
/// (the only mapping an unprivileged user may write), with setgroups
/// denied as the kernel requires for that. The init waits for its plan, so
/// this happens before it does anything that needs the mapping.
pub fn map_root_to(pid: i32, uid: u32, gid: u32) -> Result<(), SpawnError> {
    let write = |file: &str, content: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), content).map_err(|source| SpawnError::IdMap {
            file: file.to_string(),
            source,
        })
    };
    write("setgroups", "deny".to_string())?;
    write("uid_map", format!("0 {uid} 1"))?;
    write("gid_map", format!("0 {gid} 1"))
}

fn dup_above(fd: RawFd) -> Result<OwnedFd, SpawnError> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor we then own.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    if new < 0 {
        return Err(SpawnError::Dup(nix::errno::Errno::last()));
    }
    // SAFETY: `new` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}
