//! The caller of a run that `tartaros service` carries out (see
//! service/): its identity, a fact of the worker process set once before
//! the run starts, and its file access, which the run takes on for what it
//! reads or creates on the caller's behalf (the config file, the log,
//! placeholders). Outside a service worker there is no caller and these do
//! nothing.

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

/// The caller of this process's run, if it is a service worker: a fact of
/// the process, like its euid, set once before the run starts.
pub fn caller() -> Option<&'static Caller> {
    CALLER.get()
}

pub(crate) fn set(caller: Caller) {
    let _ = CALLER.set(caller);
}

/// Runs `f` with the caller's file access on this thread (fsuid, fsgid and
/// supplementary groups; the kernel keeps these per thread), then returns to
/// root's. Outside a service worker it just runs `f`.
pub fn as_caller<T>(f: impl FnOnce() -> T) -> T {
    let Some(caller) = caller() else {
        return f();
    };
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
    let result = f();
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

/// Whether the service's caller may read `path` itself (true outside a
/// service worker): reach it through every directory on the way, and read
/// it (a directory: read and search it). A bind of it into the sandbox must
/// not show the caller what the caller could not see.
pub fn may_read(path: &std::path::Path) -> bool {
    let mode = if path.is_dir() {
        libc::R_OK | libc::X_OK
    } else {
        libc::R_OK
    };
    access(path, mode)
}

fn access(path: &std::path::Path, mode: libc::c_int) -> bool {
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
