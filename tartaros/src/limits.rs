//! Default resource limits: a run without `--max-procs` / `--max-memory`
//! still gets a process and a memory limit, high enough that a normal build
//! or test run never meets them, low enough that a fork bomb or a memory
//! hog cannot take the host. The values land in the normalized policy, so
//! the log's genesis shows what the run was held to; flags (or the config
//! file) raise or lower them.
//!
//! - processes (tasks: the pids controller counts threads too):
//!   `pid_max / 8`, at least 256 and at most 4096, but at least 64 per CPU
//!   (a parallel build on a big machine runs many threads per job), and
//!   never more than half of `pid_max`;
//! - memory: half of `MemTotal`.
//!
//! A default is only applied where the host can enforce it (the check
//! `--max-procs` gets, and on the v2 tree whether the supervisor's cgroup
//! can enable the controller at all): a default never makes a run fail or
//! a `--strict` run refuse.

use crate::host_facts::Host;
use crate::policy::Policy;

/// Fewest processes a default allows, whatever `pid_max` says.
pub const MIN_DEFAULT_PROCS: u64 = 256;
/// Most processes a default allows.
pub const MAX_DEFAULT_PROCS: u64 = 4096;

/// Tasks a default allows per CPU at least.
pub const DEFAULT_PROCS_PER_CPU: u64 = 64;

/// The default limits for a host with `pid_max`, `cpus` CPUs and
/// `mem_total` bytes of RAM (unknown: `None`).
pub fn defaults(
    pid_max: Option<u64>,
    cpus: Option<u64>,
    mem_total: Option<u64>,
) -> crate::cgroup::Limits {
    let base = pid_max
        .map(|p| (p / 8).clamp(MIN_DEFAULT_PROCS, MAX_DEFAULT_PROCS))
        .unwrap_or(MAX_DEFAULT_PROCS);
    let per_cpu = cpus.unwrap_or(0).saturating_mul(DEFAULT_PROCS_PER_CPU);
    let procs = match pid_max {
        Some(p) => base.max(per_cpu).min(p / 2).max(1),
        None => base.max(per_cpu),
    };
    crate::cgroup::Limits {
        max_procs: Some(procs),
        max_memory: mem_total.map(|m| m / 2).filter(|m| *m > 0),
    }
}

/// Share of the host's TCP buffer limit one run may hold (1/8, as the
/// default tasks are 1/8 of `pid_max`).
pub const TCP_SHARE: u64 = 8;

/// The TCP buffer memory a run with `max_memory` may hold, given
/// `net.ipv4.tcp_mem` (three numbers of pages) and the page size. TCP
/// buffers are charged to one budget for the whole host, whatever the
/// network namespace (`tcp_memory_allocated`), and past its third number
/// every TCP socket of the host is starved: the agent's own loopback
/// connections, filled and never read, did that under any memory limit,
/// since a v1 memory cgroup leaves socket memory uncharged. So the run
/// gets its memory limit, and at most an eighth of that budget.
pub fn tcp_buffer_limit(max_memory: u64, tcp_mem: &str, page: u64) -> u64 {
    let host = tcp_mem
        .split_whitespace()
        .nth(2)
        .and_then(|pages| pages.parse::<u64>().ok())
        .map(|pages| pages.saturating_mul(page) / TCP_SHARE);
    host.map_or(max_memory, |h| max_memory.min(h))
}

/// [`tcp_buffer_limit`] on this host.
pub fn host_tcp_buffer_limit(max_memory: u64) -> u64 {
    let tcp_mem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem").unwrap_or_default();
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    tcp_buffer_limit(max_memory, &tcp_mem, page)
}

/// `MemTotal` from the text of `/proc/meminfo`, in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// This host's defaults.
pub fn host_defaults() -> crate::cgroup::Limits {
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total(&m));
    let cpus = std::thread::available_parallelism()
        .ok()
        .map(|n| n.get() as u64);
    defaults(pid_max, cpus, memory)
}

/// `policy` with each unset limit filled from `defaults`, where `host`
/// can enforce it (`enforceable` is the guarantee check, passed in so
/// that this stays a pure function).
pub fn with_defaults(
    policy: &Policy,
    defaults: crate::cgroup::Limits,
    enforceable: &dyn Fn(&Policy, &str) -> bool,
) -> Policy {
    let mut out = policy.clone();
    if out.max_processes.is_none() {
        let mut trial = out.clone();
        trial.max_processes = defaults.max_procs;
        if enforceable(&trial, "max-procs") {
            out.max_processes = defaults.max_procs;
        }
    }
    if out.max_memory.is_none() {
        let mut trial = out.clone();
        trial.max_memory = defaults.max_memory;
        if enforceable(&trial, "max-memory") {
            out.max_memory = defaults.max_memory;
        }
    }
    out
}

/// Fills the default limits into `policy` for this host.
pub fn apply_host_defaults(policy: &Policy, host: &Host, capture: bool) -> Policy {
    let check = |trial: &Policy, name: &str| {
        let (controller, guarantee) = if name == "max-procs" {
            ("pids", crate::guarantee::Guarantee::MaxProcs)
        } else {
            ("memory", crate::guarantee::Guarantee::MaxMemory)
        };
        // Judged best effort: whether the host can, not whether to refuse.
        let lenient = Policy {
            strict: false,
            ..trial.clone()
        };
        crate::guarantee::requested(&lenient, host, capture)
            .is_ok_and(|ledger| ledger.installed(guarantee))
            && (crate::cgroup::can_limit(controller)
                || (name == "max-procs" && crate::guarantee::tasks_by_rlimit(host)))
    };
    with_defaults(policy, host_defaults(), &check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scale_with_the_host_and_stay_bounded() {
        let gib = 1u64 << 30;
        let d = defaults(Some(32_768), Some(2), Some(24 * gib));
        assert_eq!(d.max_procs, Some(4096));
        assert_eq!(d.max_memory, Some(12 * gib));
        assert_eq!(
            defaults(Some(4_194_304), Some(8), None).max_procs,
            Some(4096)
        );
        assert_eq!(defaults(Some(16_384), Some(4), None).max_procs, Some(2048));
        assert_eq!(defaults(None, None, None).max_procs, Some(4096));
        assert_eq!(defaults(None, None, None).max_memory, None);
        // Big machines: 64 tasks per CPU, but never half of pid_max.
        assert_eq!(
            defaults(Some(4_194_304), Some(256), None).max_procs,
            Some(16_384)
        );
        assert_eq!(
            defaults(Some(32_768), Some(512), None).max_procs,
            Some(16_384)
        );
        // Tiny pid_max: the floor, within half of it.
        assert_eq!(defaults(Some(1024), Some(1), None).max_procs, Some(256));
        assert_eq!(defaults(Some(300), Some(1), None).max_procs, Some(150));
    }

    #[test]
    fn a_runs_tcp_buffers_are_an_eighth_of_the_hosts_at_most() {
        let tcp_mem = "287913\t383885\t575826\n";
        // 575,826 pages of 4 KiB = 2.2 GiB; an eighth is 281 MiB.
        assert_eq!(
            tcp_buffer_limit(12 << 30, tcp_mem, 4096),
            575_826 * 4096 / 8
        );
        assert_eq!(tcp_buffer_limit(64 << 20, tcp_mem, 4096), 64 << 20);
        assert_eq!(tcp_buffer_limit(64 << 20, "", 4096), 64 << 20);
        assert_eq!(tcp_buffer_limit(64 << 20, "1 2 x", 4096), 64 << 20);
    }

    #[test]
    fn meminfo_is_read_in_kib() {
        let text = "MemTotal:       24683520 kB\nMemFree:  1 kB\n";
        assert_eq!(mem_total(text), Some(24_683_520 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn flags_win_and_unenforceable_defaults_are_left_out() {
        let limits = crate::cgroup::Limits {
            max_procs: Some(4096),
            max_memory: Some(1 << 30),
        };
        let all = |_: &Policy, _: &str| true;
        let filled = with_defaults(&Policy::default(), limits, &all);
        assert_eq!(filled.max_processes, Some(4096));
        assert_eq!(filled.max_memory, Some(1 << 30));
        // Raised and lowered by flags: kept as given.
        let given = Policy {
            max_processes: Some(10_000),
            max_memory: Some(1 << 20),
            ..Default::default()
        };
        let kept = with_defaults(&given, limits, &all);
        assert_eq!(
            (kept.max_processes, kept.max_memory),
            (Some(10_000), Some(1 << 20))
        );
        // No memory controller: no default memory limit, and no refusal.
        let no_memory = |_: &Policy, name: &str| name != "max-memory";
        let partial = with_defaults(&Policy::default(), limits, &no_memory);
        assert_eq!(partial.max_processes, Some(4096));
        assert_eq!(partial.max_memory, None);
    }
}
