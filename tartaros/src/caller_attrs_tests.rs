use super::*;

const INF: u64 = u64::MAX;

fn attrs(limits: &[(u32, u64, u64)], umask: u32, nice: i32, cpus: &[u32]) -> Attributes {
    Attributes {
        limits: limits
            .iter()
            .map(|&(resource, soft, hard)| Limit {
                resource,
                soft,
                hard,
            })
            .collect(),
        umask,
        nice,
        policy: libc::SCHED_OTHER,
        cpus: cpus.to_vec(),
    }
}

#[test]
fn every_limit_is_the_lower_of_the_two_soft_and_hard() {
    // nproc, nofile, fsize as the caller's ulimit set them; the worker's.
    let caller = attrs(
        &[
            (6, 40, 40),
            (7, 64, 64),
            (1, 100 << 10, 100 << 10),
            (2, INF, INF),
        ],
        0o077,
        0,
        &[0, 1],
    );
    let own = attrs(
        &[
            (6, 96367, 96367),
            (7, 20000, 20000),
            (1, INF, INF),
            (2, INF, INF),
        ],
        0o022,
        0,
        &[0, 1],
    );
    let d = decide(&caller, &own);
    assert_eq!(
        d.limits,
        vec![
            Limit {
                resource: 6,
                soft: 40,
                hard: 40
            },
            Limit {
                resource: 7,
                soft: 64,
                hard: 64
            },
            Limit {
                resource: 1,
                soft: 100 << 10,
                hard: 100 << 10
            },
        ],
        "only what goes down is set"
    );
    assert_eq!(d.umask, 0o077);
    assert_eq!(d.nice, None);
    assert_eq!(d.cpus, None);
}

#[test]
fn never_higher_than_the_runs_own_limits() {
    // The run's RTPRIO/NICE of 0 (sched_reset.rs) stay 0; a caller's soft
    // above the worker's hard is cut to it.
    let caller = attrs(
        &[(13, 40, 40), (14, 99, 99), (7, 1024, INF)],
        0o022,
        0,
        &[0],
    );
    let own = attrs(&[(13, 0, 0), (14, 0, 0), (7, 4096, 4096)], 0o022, 0, &[0]);
    let d = decide(&caller, &own);
    assert_eq!(
        d.limits,
        vec![Limit {
            resource: 7,
            soft: 1024,
            hard: 4096
        }]
    );
}

#[test]
fn the_core_limit_is_the_runs_own() {
    // A 0 would let a core_pattern pipe run; init.rs sets 1 later.
    let caller = attrs(&[(4, 0, 0)], 0o022, 0, &[0]);
    let own = attrs(&[(4, INF, INF)], 0o022, 0, &[0]);
    assert!(decide(&caller, &own).limits.is_empty());
}

#[test]
fn nice_policy_and_cpus_only_go_down() {
    let mut caller = attrs(&[], 0o027, 15, &[0]);
    caller.policy = libc::SCHED_IDLE;
    let own = attrs(&[], 0o022, 0, &[0, 1, 2, 3]);
    let d = decide(&caller, &own);
    assert_eq!(d.nice, Some(15));
    assert_eq!(d.policy, Some(libc::SCHED_IDLE));
    assert_eq!(d.cpus, Some(vec![0]));
    assert_eq!(d.umask, 0o027);

    // A caller below the run keeps the run's: a root launcher's nice 10
    // stays, a caller's -5 is not taken, SCHED_OTHER does not undo IDLE.
    let caller = attrs(&[], 0o022, -5, &[0, 1, 2, 3]);
    let mut own = attrs(&[], 0o022, 10, &[1, 2]);
    own.policy = libc::SCHED_IDLE;
    let d = decide(&caller, &own);
    assert_eq!(d.nice, None);
    assert_eq!(d.policy, None);
    assert_eq!(d.cpus, None);

    // Disjoint CPU sets: the caller's.
    let caller = attrs(&[], 0o022, 0, &[3]);
    let own = attrs(&[], 0o022, 0, &[0, 1]);
    assert_eq!(decide(&caller, &own).cpus, Some(vec![3]));
}

#[test]
fn umask_is_parsed_from_proc_status() {
    let status = "Name:\tsh\nUmask:\t0077\nState:\tS (sleeping)\n";
    assert_eq!(parse_umask(status), Some(0o077));
    assert_eq!(parse_umask("Name:\tsh\n"), None);
}

#[test]
fn an_exhausted_process_limit_is_named() {
    let caller = attrs(&[(6, 40, 40), (9, INF, INF)], 0o022, 0, &[0]);
    let msg = exec_failure(&caller, nix::errno::Errno::EAGAIN).unwrap();
    assert!(msg.contains("RLIMIT_NPROC") && msg.contains("40"), "{msg}");
    assert_eq!(exec_failure(&caller, nix::errno::Errno::ENOMEM), None);
    let capped = attrs(&[(9, 1 << 20, 1 << 20)], 0o022, 0, &[0]);
    assert!(exec_failure(&capped, nix::errno::Errno::ENOMEM).is_some());
    assert_eq!(exec_failure(&caller, nix::errno::Errno::EACCES), None);
}

#[test]
fn this_process_can_be_read() {
    let own = read(0).unwrap();
    assert_eq!(own.limits.len(), RESOURCES.len());
    assert!(!own.cpus.is_empty());
}

#[test]
fn limits_are_parsed_from_proc_limits() {
    let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max file size             102400               102400               bytes     \n\
Max data size             unlimited            unlimited            bytes     \n\
Max stack size            8388608              unlimited            bytes     \n\
Max core file size        0                    unlimited            bytes     \n\
Max resident set          unlimited            unlimited            bytes     \n\
Max processes             40                   40                   processes \n\
Max open files            64                   64                   files     \n\
Max locked memory         0                    0                    bytes     \n\
Max address space         unlimited            unlimited            bytes     \n\
Max file locks            unlimited            unlimited            locks     \n\
Max pending signals       96367                96367                signals   \n\
Max msgqueue size         819200               819200               bytes     \n\
Max nice priority         0                    0                    \n\
Max realtime priority     0                    0                    \n\
Max realtime timeout      unlimited            unlimited            us        \n";
    let limits = parse_limits(text).unwrap();
    assert_eq!(limits.len(), 16);
    assert_eq!(
        limits[1],
        Limit {
            resource: 1,
            soft: 102400,
            hard: 102400
        }
    );
    assert_eq!(
        limits[3],
        Limit {
            resource: 3,
            soft: 8388608,
            hard: INF
        }
    );
    assert_eq!(
        limits[6],
        Limit {
            resource: 6,
            soft: 40,
            hard: 40
        }
    );
    assert_eq!(
        limits[15],
        Limit {
            resource: 15,
            soft: INF,
            hard: INF
        }
    );
    assert_eq!(parse_limits(&text[..400]), None, "a row missing");
}
