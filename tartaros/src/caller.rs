//! The caller of a run that `tartaros service` carries out (see
//! service/): its identity, a fact of the worker process set once before
//! the run starts, and its file access, which the run takes on for what it
//! reads or creates on the caller's behalf (the config file, the log,
//! placeholders) and for its lookups of the paths it was given (no answer
//! may tell the caller what lies where it cannot look). Outside a service
//! worker there is no caller and these do nothing.

use std::cell::Cell;
use std::path::Path;
use std::sync::OnceLock;

/// At most this many supplementary groups are taken from the caller.
pub const MAX_GROUPS: usize = 256;

/// Who asked the service for the run, as the kernel says (never as the
/// request says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

static CALLER: OnceLock<Caller> = OnceLock::new();

thread_local! {
    /// Whether this thread has the caller's file access now: an inner
    /// [`as_caller`] must not hand root's back to the outer one's rest.
    static TAKEN: Cell<bool> = const { Cell::new(false) };
}

/// The caller of this process's run, if it is a service worker: a fact of
/// the process, like its euid, set once before the run starts.
pub fn caller() -> Option<&'static Caller> {
    CALLER.get()
}

/// Who launched the run: the service's caller, else this process's
/// effective ids.
pub fn launcher_identity() -> crate::credentials::Identity {
    match caller() {
        Some(caller) => crate::credentials::Identity {
            uid: caller.uid,
            gid: caller.gid,
        },
        None => crate::credentials::Identity {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
    }
}

pub(crate) fn set(caller: Caller) {
    let _ = CALLER.set(caller);
}

/// The caller's process attributes (caller_attrs.rs), read from the kernel.
static ATTRIBUTES: OnceLock<crate::caller_attrs::Attributes> = OnceLock::new();

/// The service caller's process attributes, which its agent takes on;
/// `None` outside a service worker (a direct run's agent inherits them).
pub fn attributes() -> Option<&'static crate::caller_attrs::Attributes> {
    ATTRIBUTES.get()
}

pub(crate) fn set_attributes(attributes: crate::caller_attrs::Attributes) {
    let _ = ATTRIBUTES.set(attributes);
}

/// The caller's environment, as the request carried it: the agent's
/// (`launcher_env`), never the root worker's own (see [`UNSAFE_FOR_ROOT`]).
static ENVIRONMENT: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// The variables glibc ignores in a set-user-ID process (its
/// `UNSECURE_ENVVARS`, and `TZ`, whose file it reads), because they make
/// the library open or load what they name: a root service worker that
/// took the caller's `HOSTALIASES` opened any file the caller named as
/// root on its first name lookup (adversarial round 13). The worker keeps
/// them for the agent only.
pub const UNSAFE_FOR_ROOT: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_DYNAMIC_WEAK",
    "LD_HWCAP_MASK",
    "LD_LIBRARY_PATH",
    "LD_ORIGIN_PATH",
    "LD_PRELOAD",
    "LD_PROFILE",
    "LD_SHOW_AUXV",
    "LD_USE_LOAD_BIAS",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_ARENA_MAX",
    "MALLOC_ARENA_TEST",
    "MALLOC_PERTURB_",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZ",
    "TZDIR",
];

/// Keeps the caller's environment for the run (a service worker, once).
pub(crate) fn set_environment(env: Vec<(String, String)>) {
    let _ = ENVIRONMENT.set(env);
}

/// The environment of the run's launcher: the service's caller's, else
/// this process's.
pub fn launcher_environment() -> Vec<(String, String)> {
    match ENVIRONMENT.get() {
        Some(env) => env.clone(),
        None => std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
    }
}

/// Runs `f` with the caller's file access on this thread (fsuid, fsgid and
/// supplementary groups; the kernel keeps these per thread), then returns to
/// root's. Outside a service worker, or within another `as_caller`, it just
/// runs `f`.
pub fn as_caller<T>(f: impl FnOnce() -> T) -> T {
    let Some(caller) = caller() else {
        return f();
    };
    if TAKEN.get() {
        return f();
    }
    let mut saved = vec![0 as libc::gid_t; MAX_GROUPS];
    // A change of fsuid clears the parent-death signal (prctl(2)); the
    // worker must still die with the service, so it is set again after.
    let mut death_signal: libc::c_int = 0;
    let parent = nix::unistd::getppid();
    // SAFETY: PR_GET_PDEATHSIG writes one int we own.
    unsafe {
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut death_signal as *mut libc::c_int,
        )
    };
    // SAFETY: raw syscalls on this thread's credentials with buffers we own
    // (glibc's wrappers would change every thread's).
    unsafe {
        let n = libc::syscall(
            libc::SYS_getgroups,
            saved.len() as libc::c_int,
            saved.as_mut_ptr(),
        );
        saved.truncate(usize::try_from(n).unwrap_or(0));
        let grouped = libc::syscall(
            libc::SYS_setgroups,
            caller.groups.len(),
            caller.groups.as_ptr(),
        );
        libc::syscall(libc::SYS_setfsgid, caller.gid);
        libc::syscall(libc::SYS_setfsuid, caller.uid);
        // setfsuid/setfsgid report no failure; asking again (-1 changes
        // nothing) says what is in force. Acting with root's file access
        // for a caller would fail open: end the worker instead.
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        if grouped != 0 || fsuid != caller.uid || fsgid != caller.gid {
            crate::warn::say(format_args!(
                "failed to take on the caller's file access; ending the run"
            ));
            std::process::exit(crate::exit::START_FAILURE);
        }
    }
    // The fsuid change drops only the file capabilities from the
    // effective set: CAP_SYS_PTRACE would still follow another user's
    // `/proc/<pid>/cwd` for the caller. None are in effect for `f`.
    let effective = effective_caps(None);
    TAKEN.set(true);
    let result = f();
    TAKEN.set(false);
    if let Some(saved) = effective {
        effective_caps(Some(saved));
    }
    // SAFETY: as above; back to root's file access.
    unsafe {
        libc::syscall(libc::SYS_setfsuid, 0);
        libc::syscall(libc::SYS_setfsgid, 0);
        libc::syscall(libc::SYS_setgroups, saved.len(), saved.as_ptr());
        if death_signal != 0 {
            libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
            if nix::unistd::getppid() != parent {
                libc::raise(death_signal);
            }
        }
    }
    result
}

/// Gives this thread (or a process forked for the job) the caller's whole
/// identity for good: groups, real, effective and saved ids, and so no
/// capability at all. For the threads that copy bytes to and from the
/// caller's own descriptors: done as root, a write carried root's
/// credentials to whatever the caller had connected them to (a socket's
/// `SCM_CREDENTIALS`, so a datagram to `/dev/log` was logged as uid 0's)
/// and passed the kernel's write-time capability checks for it. True
/// outside a service worker; false (and the thread must not copy) when the
/// identity could not be taken whole.
pub fn become_for_good() -> bool {
    let Some(caller) = caller() else {
        return true;
    };
    // SAFETY: raw syscalls on this thread's credentials with buffers we
    // own (glibc's wrappers would change every thread's).
    let changed = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            caller.groups.len(),
            caller.groups.as_ptr(),
        ) == 0
            && libc::syscall(libc::SYS_setresgid, caller.gid, caller.gid, caller.gid) == 0
            && libc::syscall(libc::SYS_setresuid, caller.uid, caller.uid, caller.uid) == 0
    };
    // Leaving uid 0 for good clears the permitted and effective sets (no
    // SECBIT_KEEP_CAPS here); a caller that is root keeps them, and is root.
    changed && (caller.uid == 0 || no_capability_left())
}

fn no_capability_left() -> bool {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget of this thread into a header and two words we own.
    let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    got == 0 && data.iter().all(|d| d.effective == 0 && d.permitted == 0)
}

/// Connects to `addr` with a socket of the caller's (outside a service
/// worker: of this process). A gateway of a service run (`--port`, the
/// proxy's and the broker's upstreams) connects on the caller's behalf;
/// the socket's owner is the fsuid of the thread that makes it, and a
/// socket of root's passed the host's rules by owner (`-m owner !
/// --uid-owner 0 -j DROP` before a cloud metadata address or a root-only
/// local API) that stop the caller itself.
pub async fn connect_tcp(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = as_caller(|| {
        if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
    })?;
    socket.connect(addr).await
}

/// `_LINUX_CAPABILITY_VERSION_3` and its two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// With `None`, empties this thread's effective capabilities and returns
/// what they were (the permitted set stays, so they can come back); with
/// `Some`, puts them back. Ends the worker when they cannot be emptied:
/// acting for a caller with root's capabilities would fail open.
fn effective_caps(restore: Option<[u32; 2]>) -> Option<[u32; 2]> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: raw capget/capset on this thread with a header and two data
    // words we own (glibc has no per-thread wrapper).
    let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if got != 0 {
        fail_closed();
    }
    let saved = [data[0].effective, data[1].effective];
    let [low, high] = restore.unwrap_or([0, 0]);
    data[0].effective = low;
    data[1].effective = high;
    // SAFETY: as above.
    let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if set != 0 && restore.is_none() {
        fail_closed();
    }
    Some(saved)
}

fn fail_closed() -> ! {
    crate::warn::say(format_args!(
        "failed to take on the caller's file access; ending the run"
    ));
    std::process::exit(crate::exit::START_FAILURE);
}

/// Whether the service's caller may read `path` itself (true outside a
/// service worker): reach it through every directory on the way, and read
/// it (a directory: read and search it). A bind of it into the sandbox must
/// not show the caller what the caller could not see.
pub fn may_read(path: &Path) -> bool {
    caller().is_none() || as_caller(|| std::fs::metadata(path)).is_ok_and(|m| readable(path, &m))
}

/// Whether the caller could not see `path` itself (false outside a service
/// worker): it is there and the caller cannot read it, or the caller
/// cannot tell whether it is there (a directory on the way it may not
/// search). Only a path the caller can see to be absent (every directory on
/// the way searchable) counts as absent, so the answer, and the refusal
/// that follows it, is the same whether or not such a path exists.
pub fn hidden_from_caller(path: &Path) -> bool {
    if caller().is_none() {
        return false;
    }
    match as_caller(|| std::fs::metadata(path)) {
        Ok(meta) => !readable(path, &meta),
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)),
    }
}

/// The refusal for a path the run would bind or keep visible for the agent
/// (`--bind` sources, writable roots, read and exec allows) that the
/// caller could not see itself ([`hidden_from_caller`]): the same one line
/// whether or not it exists.
pub fn check_visible(policy: &crate::policy::Policy) -> Result<(), String> {
    let named = policy
        .binds
        .iter()
        .map(|b| ("--bind", &b.source))
        .chain(policy.writable_roots.iter().map(|p| ("--write", p)))
        .chain(policy.read_allows.iter().map(|p| ("--read-allow", p)))
        .chain(policy.exec_allows.iter().map(|p| ("--exec-allow", p)));
    for (flag, path) in named {
        if hidden_from_caller(path) {
            return Err(format!(
                "{flag} {}: you cannot read it yourself, and the service grants nothing you could not",
                path.display()
            ));
        }
    }
    Ok(())
}

/// With the caller's file access: whether it may read the object at `path`
/// whose (followed) metadata is `meta`, and search it if it is a directory.
fn readable(path: &Path, meta: &std::fs::Metadata) -> bool {
    let mode = if meta.is_dir() {
        libc::R_OK | libc::X_OK
    } else {
        libc::R_OK
    };
    access(path, mode)
}

fn access(path: &Path, mode: libc::c_int) -> bool {
    if caller().is_none() {
        return true;
    }
    let Ok(path) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
    else {
        return false;
    };
    // SAFETY: a NUL-terminated path we own; AT_EACCESS checks with the
    // current (here: the caller's) file access.
    as_caller(|| unsafe {
        libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mode, libc::AT_EACCESS) == 0
    })
}
