//! The agent starts at an ordinary CPU and I/O priority, whatever the
//! launcher ran at.
//!
//! Scheduling policy, nice value, I/O priority and the `RLIMIT_RTPRIO` /
//! `RLIMIT_NICE` limits are inherited across `fork` and `execve`, and no
//! cgroup limit of a run holds a real-time task: a launcher started under
//! `chrt -f 5` (or by an RT harness, or by a user whose PAM limits grant
//! `rtprio`, as the audio group's do on many distributions) handed its
//! agent `SCHED_FIFO`, and one busy loop per CPU then starved every
//! ordinary task of the host for as long as the run lasted. The agent
//! process resets all of it before it drops its privileges, and the limits
//! of 0 keep it from asking for more.

/// What can fail while resetting the agent's priorities.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("failed to {what} of the agent: {source}")]
    Reset {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn fail(what: &'static str) -> impl FnOnce(std::io::Error) -> SchedError {
    move |source| SchedError::Reset { what, source }
}

/// `IOPRIO_WHO_PROCESS` and the class of `IOPRIO_CLASS_RT`
/// (linux/ioprio.h); the class sits above the 13 data bits.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
const IOPRIO_CLASS_RT: libc::c_int = 1;

/// Resets the calling process to `SCHED_OTHER` (from a real-time or
/// deadline policy; `SCHED_BATCH` and `SCHED_IDLE` are already below it),
/// a nice value of at least 0, no real-time I/O class, and real-time
/// priority and nice limits of 0 (soft and hard). Every step only lowers,
/// which needs no capability, so it holds in an ordinary user's run too.
pub fn reset_priorities() -> Result<(), SchedError> {
    // SAFETY: sched_getscheduler takes a pid and reads nothing of ours.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(fail("read the scheduling policy")(
            std::io::Error::last_os_error(),
        ));
    }
    let real_time = matches!(
        policy & !libc::SCHED_RESET_ON_FORK,
        libc::SCHED_FIFO | libc::SCHED_RR | SCHED_DEADLINE
    );
    if real_time {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param the kernel only reads.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } != 0 {
            return Err(fail("leave the real-time scheduling policy")(
                std::io::Error::last_os_error(),
            ));
        }
    }
    // getpriority's -1 is also a valid nice value: errno tells them apart.
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes two integers.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let read = nix::errno::Errno::last_raw();
    if nice == -1 && read != 0 {
        return Err(fail("read the nice value")(
            std::io::Error::from_raw_os_error(read),
        ));
    }
    // SAFETY: setpriority takes three integers.
    if nice < 0 && unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 0) } != 0 {
        return Err(fail("reset the nice value")(std::io::Error::last_os_error()));
    }
    // SAFETY: ioprio_get takes two integers.
    let ioprio = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if ioprio >= 0 && (ioprio >> IOPRIO_CLASS_SHIFT) as libc::c_int == IOPRIO_CLASS_RT {
        // Class 0 (none): the I/O priority follows the CPU nice value.
        // SAFETY: ioprio_set takes three integers.
        let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, 0) };
        if rc != 0 {
            return Err(fail("leave the real-time I/O class")(
                std::io::Error::last_os_error(),
            ));
        }
    }
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_RTPRIO, 0, 0)
        .map_err(|e| fail("set RLIMIT_RTPRIO to 0")(std::io::Error::from(e)))?;
    setrlimit(Resource::RLIMIT_NICE, 0, 0)
        .map_err(|e| fail("set RLIMIT_NICE to 0")(std::io::Error::from(e)))?;
    Ok(())
}

/// `SCHED_DEADLINE` (linux/sched.h); `libc` does not name it.
const SCHED_DEADLINE: libc::c_int = 6;
