//! A service caller's process attributes, carried to its agent: resource
//! limits, umask, nice value, a low scheduling policy and CPU affinity.
//!
//! A direct run's agent inherits all of these from its launcher by fork.
//! A service run's agent is forked from the root worker, and got the
//! worker's instead (adversarial round 19): a caller held by its admin to
//! `ulimit -u 40` (pam_limits; `RLIMIT_NPROC` counts a uid's processes on
//! the whole host, the usual fork-bomb bound) had an agent that started
//! 200 processes as the same uid, wrote past its `RLIMIT_FSIZE`, ran at
//! nice 0 for a caller at 15, on every CPU for a caller pinned to one, and
//! made its files world-readable under a caller's umask 077.
//!
//! The worker reads them from the kernel ([`read`], through the caller's
//! pidfd, never from the request: the client is the caller's own code),
//! and the agent takes, before it drops its privileges, what [`decide`]
//! makes of them and of its own: per resource the lower soft and hard
//! limit, the caller's umask, a nice value no lower than the caller's, the
//! caller's `SCHED_BATCH` or `SCHED_IDLE`, and CPUs within the caller's.
//! Only ever lower: what the run sets for itself (`RLIMIT_RTPRIO` and
//! `RLIMIT_NICE` of 0, sched_reset.rs) stays. `RLIMIT_CORE` is not
//! carried: the agent's is 1 whatever the caller's (init.rs), and a 0
//! would let a core_pattern pipe run.

use serde::{Deserialize, Serialize};

/// What can fail while reading or applying the attributes.
#[derive(Debug, thiserror::Error)]
pub enum AttrsError {
    #[error("failed to read the caller's {what}: {source}")]
    Read {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to give the agent the caller's {what}: {source}")]
    Apply {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The resources, by number (asm-generic/resource.h), and their names.
pub const RESOURCES: [&str; 16] = [
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_DATA",
    "RLIMIT_STACK",
    "RLIMIT_CORE",
    "RLIMIT_RSS",
    "RLIMIT_NPROC",
    "RLIMIT_NOFILE",
    "RLIMIT_MEMLOCK",
    "RLIMIT_AS",
    "RLIMIT_LOCKS",
    "RLIMIT_SIGPENDING",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
];
const RLIMIT_CORE: u32 = 4;
const RLIMIT_NPROC: u32 = 6;
const RLIMIT_DATA: u32 = 2;
const RLIMIT_AS: u32 = 9;

/// One resource's limits; `u64::MAX` is `RLIM_INFINITY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// A process's attributes, as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attributes {
    pub limits: Vec<Limit>,
    pub umask: u32,
    pub nice: i32,
    /// The scheduling policy, without `SCHED_RESET_ON_FORK`.
    pub policy: i32,
    /// The CPUs it may run on.
    pub cpus: Vec<u32>,
}

/// What the agent changes of its own attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Only the resources whose limits go down.
    pub limits: Vec<Limit>,
    pub umask: u32,
    /// A higher nice value to take.
    pub nice: Option<i32>,
    /// `SCHED_BATCH` or `SCHED_IDLE` to take.
    pub policy: Option<i32>,
    /// The CPUs to keep to.
    pub cpus: Option<Vec<u32>>,
}

/// The agent's attributes from the caller's and its own (pure): never more
/// than either allows.
pub fn decide(caller: &Attributes, own: &Attributes) -> Decision {
    let limits = own
        .limits
        .iter()
        .filter(|l| l.resource != RLIMIT_CORE)
        .filter_map(|mine| {
            let theirs = caller.limits.iter().find(|l| l.resource == mine.resource)?;
            let hard = mine.hard.min(theirs.hard);
            let soft = mine.soft.min(theirs.soft).min(hard);
            (soft != mine.soft || hard != mine.hard).then_some(Limit {
                resource: mine.resource,
                soft,
                hard,
            })
        })
        .collect();
    let nice = (caller.nice > own.nice).then_some(caller.nice.min(19));
    // SCHED_IDLE is below SCHED_BATCH, which is below SCHED_OTHER.
    let rank = |p: i32| match p {
        libc::SCHED_IDLE => 2,
        libc::SCHED_BATCH => 1,
        _ => 0,
    };
    let policy = (rank(caller.policy) > rank(own.policy)).then_some(caller.policy);
    let within: Vec<u32> = own
        .cpus
        .iter()
        .copied()
        .filter(|c| caller.cpus.contains(c))
        .collect();
    let cpus = if within == own.cpus {
        None
    } else if within.is_empty() {
        // Disjoint sets: the caller's own are what it could take.
        Some(caller.cpus.clone())
    } else {
        Some(within)
    };
    Decision {
        limits,
        umask: caller.umask & 0o777,
        nice,
        policy,
        cpus,
    }
}

fn read_err(what: &'static str) -> impl FnOnce(std::io::Error) -> AttrsError {
    move |source| AttrsError::Read { what, source }
}

/// The attributes of process `pid` (0: this one). The caller must pin the
/// pid (a pidfd checked alive after the reads).
pub fn read(pid: i32) -> Result<Attributes, AttrsError> {
    let proc = |file: &str| {
        if pid == 0 {
            std::fs::read_to_string(format!("/proc/self/{file}"))
        } else {
            std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        }
    };
    // `/proc/<pid>/limits`, not prlimit(2): reading another uid's limits
    // with prlimit needs CAP_SYS_RESOURCE, which a root service in a
    // container may lack; the file is readable by all.
    let limits = proc("limits").map_err(read_err("resource limits"))?;
    let limits = parse_limits(&limits).ok_or_else(|| {
        read_err("resource limits")(std::io::Error::other("unexpected /proc/<pid>/limits"))
    })?;
    let status = proc("status").map_err(read_err("umask"))?;
    let umask = parse_umask(&status).ok_or_else(|| {
        read_err("umask")(std::io::Error::other("no Umask line in /proc/<pid>/status"))
    })?;
    // getpriority's -1 is also a valid nice value: errno tells them apart.
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes integers.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, pid as libc::id_t) };
    let errno = nix::errno::Errno::last_raw();
    if nice == -1 && errno != 0 {
        return Err(read_err("nice value")(std::io::Error::from_raw_os_error(
            errno,
        )));
    }
    // SAFETY: sched_getscheduler takes a pid.
    let policy = unsafe { libc::sched_getscheduler(pid) };
    if policy < 0 {
        return Err(read_err("scheduling policy")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(Attributes {
        limits,
        umask,
        nice,
        policy: policy & !libc::SCHED_RESET_ON_FORK,
        cpus: affinity(pid)?,
    })
}

/// Room for 8192 CPUs: the kernel refuses a mask smaller than its own.
const MASK_WORDS: usize = 128;

fn affinity(pid: i32) -> Result<Vec<u32>, AttrsError> {
    let mut mask = [0u64; MASK_WORDS];
    // SAFETY: the raw syscall writes at most the mask's size into it and
    // returns how many bytes it wrote.
    let got = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            pid,
            std::mem::size_of_val(&mask),
            mask.as_mut_ptr(),
        )
    };
    if got < 0 {
        return Err(read_err("CPU affinity")(std::io::Error::last_os_error()));
    }
    let words = (got as usize / 8).min(MASK_WORDS);
    Ok((0..words as u32 * 64)
        .filter(|cpu| mask[(cpu / 64) as usize] & (1 << (cpu % 64)) != 0)
        .collect())
}

/// The rows of `/proc/<pid>/limits` (fs/proc/base.c), by resource.
const LIMIT_ROWS: [&str; 16] = [
    "Max cpu time",
    "Max file size",
    "Max data size",
    "Max stack size",
    "Max core file size",
    "Max resident set",
    "Max processes",
    "Max open files",
    "Max locked memory",
    "Max address space",
    "Max file locks",
    "Max pending signals",
    "Max msgqueue size",
    "Max nice priority",
    "Max realtime priority",
    "Max realtime timeout",
];

/// Every resource's soft and hard limit from the text of
/// `/proc/<pid>/limits`; `None` unless all 16 are there.
pub fn parse_limits(text: &str) -> Option<Vec<Limit>> {
    let value = |v: &str| match v {
        "unlimited" => Some(u64::MAX),
        v => v.parse().ok(),
    };
    (0..LIMIT_ROWS.len())
        .map(|resource| {
            let rest = text
                .lines()
                .find_map(|l| l.strip_prefix(LIMIT_ROWS[resource]))?;
            let mut fields = rest.split_whitespace();
            Some(Limit {
                resource: resource as u32,
                soft: value(fields.next()?)?,
                hard: value(fields.next()?)?,
            })
        })
        .collect()
}

/// The `Umask:` line of `/proc/<pid>/status` (Linux 4.7).
pub fn parse_umask(status: &str) -> Option<u32> {
    let value = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(value.trim(), 8).ok()
}

fn apply_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AttrsError {
    let what = what.into();
    move |source| AttrsError::Apply { what, source }
}

/// In the agent, before it drops its privileges: takes on what [`decide`]
/// makes of the caller's attributes and this process's.
pub fn take_on(caller: &Attributes) -> Result<(), AttrsError> {
    let own = read(0).map_err(|e| apply_err("attributes")(std::io::Error::other(e)))?;
    let decision = decide(caller, &own);
    for limit in &decision.limits {
        let new = libc::rlimit64 {
            rlim_cur: limit.soft,
            rlim_max: limit.hard,
        };
        // SAFETY: prlimit64 on this process, reading `new`, writing nothing.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0,
                limit.resource,
                &new as *const libc::rlimit64,
                std::ptr::null_mut::<libc::rlimit64>(),
            )
        };
        if rc != 0 {
            let name = RESOURCES[limit.resource as usize];
            return Err(apply_err(name)(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: umask takes a mode and cannot fail.
    unsafe { libc::umask(decision.umask as libc::mode_t) };
    // SAFETY: setpriority takes integers.
    if let Some(nice) = decision.nice
        && unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0
    {
        return Err(apply_err(format!("nice value {nice}"))(
            std::io::Error::last_os_error(),
        ));
    }
    if let Some(policy) = decision.policy {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param the kernel only reads.
        if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
            return Err(apply_err("scheduling policy")(
                std::io::Error::last_os_error(),
            ));
        }
    }
    if let Some(cpus) = &decision.cpus {
        let mut mask = [0u64; MASK_WORDS];
        for &cpu in cpus.iter().filter(|&&c| (c as usize) < MASK_WORDS * 64) {
            mask[(cpu / 64) as usize] |= 1 << (cpu % 64);
        }
        // SAFETY: the kernel reads the mask, of the size given.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_sched_setaffinity,
                0,
                std::mem::size_of_val(&mask),
                mask.as_ptr(),
            )
        };
        if rc != 0 {
            return Err(apply_err(format!("CPU affinity {cpus:?}"))(
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// Why the agent's `execve` failed with `errno` under the caller's limits,
/// when they are the likely cause: one line that names the limit.
pub fn exec_failure(caller: &Attributes, errno: nix::errno::Errno) -> Option<String> {
    let limit = |resource: u32| caller.limits.iter().find(|l| l.resource == resource);
    match errno {
        // The only EAGAIN of execve: the uid's process count is over the
        // RLIMIT_NPROC in force when the agent took the caller's uid.
        nix::errno::Errno::EAGAIN => limit(RLIMIT_NPROC).map(|l| {
            format!(
                "your process limit (RLIMIT_NPROC, ulimit -u {}) is reached: your user already runs that many processes on this host",
                l.soft
            )
        }),
        nix::errno::Errno::ENOMEM
            if [RLIMIT_DATA, RLIMIT_AS]
                .iter()
                .any(|&r| limit(r).is_some_and(|l| l.soft != u64::MAX)) =>
        {
            Some(
                "your memory limits (RLIMIT_AS or RLIMIT_DATA; ulimit -v, -d) may leave too little to start it"
                    .to_string(),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "caller_attrs_tests.rs"]
mod tests;
