//! System V shared memory without bounds (adversarial round 9). Every run
//! has its own IPC namespace, which starts with the kernel's limits:
//! `shmmax` and `shmall` of 16 EiB, so one `shmget` could ask for any
//! size, and its pages, touched once, stay in the namespace (no process
//! holds them, so killing processes frees nothing) until the run ends, in
//! an ordinary user's run without a memory limit bounded by nothing. The
//! same class as the private tmpfs mounts (`escape_round9_tmpfs_bounds`).
//! Proved from the host side: the limits of the run's IPC namespace, read
//! by a host process that joined it, and the kernel's answer to a
//! `shmget` bigger than the budget (no page of it is touched).

mod common;
use std::path::Path;

use common::*;

/// The default budget of a run without a memory limit
/// (`tmpfs_bounds::DEFAULT_BUDGET`).
const DEFAULT_BUDGET: u64 = 2 << 30;

const ASK: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
IPC_CREAT, IPC_RMID = 0o1000, 0
# Bigger than any budget a run gets here; never attached, so no page of
# it is ever allocated.
r = libc.shmget(0, 64 << 30, IPC_CREAT | 0o600)
print('shmget big', r < 0 and ctypes.get_errno())
if r >= 0:
    libc.shmctl(r, IPC_RMID, None)
# The agent cannot raise the limits again (the host reads them after).
for name in ('shmmax', 'shmall', 'msgmni'):
    try:
        open('/proc/sys/kernel/' + name, 'w').write('30000' if name == 'msgmni' else str(1 << 60))
        print('raise', name, 'done')
    except OSError as e:
        print('raise', name, e.errno)
small = libc.shmget(0, 1 << 20, IPC_CREAT | 0o600)
print('shmget small', small < 0 and ctypes.get_errno())
sys.stdout.flush()
os.execvp('sleep', ['sleep', sys.argv[1]])
"#;

/// The IPC limits of `pid`'s namespace, as the kernel gives them to a
/// process in it.
fn ipc_limits(pid: i32) -> Vec<(String, u64)> {
    let script = "for f in shmmax shmall msgmni msgmnb; do echo $f $(cat /proc/sys/kernel/$f); done; \
        set -- $(cat /proc/sys/kernel/sem); echo semmsl $1; echo semmns $2; echo semmni $4";
    let out = std::process::Command::new("nsenter")
        .args(["--ipc", "--target", &pid.to_string(), "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn check(command: std::process::Command, marker: &str, budget: u64) {
    let out = command_output(command, marker, budget);
    // The kernel refuses the segment bigger than the budget, and an
    // ordinary one still works.
    expect(&out, "shmget big", &libc::EINVAL.to_string());
    expect(&out, "shmget small", "False");
    for name in ["shmmax", "shmall", "msgmni"] {
        expect(&out, &format!("raise {name}"), &libc::EACCES.to_string());
    }
}

/// Runs `command` to its end, asserting from the host, while its agent
/// (`sleep marker`) lives, that its IPC namespace holds at most `budget`.
fn command_output(
    mut command: std::process::Command,
    marker: &str,
    budget: u64,
) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = KillOnDrop(Some(child));
    let mut agent = None;
    assert!(
        eventually(20, || {
            agent = processes_with(marker).first().copied();
            agent.is_some()
        }),
        "the agent never started"
    );
    let limits = ipc_limits(agent.unwrap());
    let out = run.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let get = |name: &str| limits.iter().find(|(n, _)| n == name).unwrap().1;
    let page = 4096;
    assert!(get("shmmax") <= budget, "{limits:?}");
    assert!(get("shmall") * page <= budget, "{limits:?}");
    // Queued messages are kernel memory too: every queue full at once.
    assert!(get("msgmni") * get("msgmnb") <= budget, "{limits:?}");
    // So are semaphores: 64 bytes each (a cache line).
    assert!(get("semmns") * 64 <= budget, "{limits:?}");
    out
}

#[test]
fn a_root_runs_shared_memory_is_bounded_by_its_memory_limit() {
    if !can_run("a_root_runs_shared_memory_is_bounded_by_its_memory_limit") {
        return;
    }
    let mut command = std::process::Command::new(bin());
    command
        .args([
            "run",
            "--max-memory",
            "64M",
            "--",
            "python3",
            "-c",
            ASK,
            "4.3311",
        ])
        .current_dir("/");
    check(command, "4.3311", 64 << 20);
}

#[test]
fn an_ordinary_users_shared_memory_is_bounded_without_a_memory_limit() {
    if !can_run("an_ordinary_users_shared_memory_is_bounded_without_a_memory_limit") {
        return;
    }
    let command = tartaros_as(
        4392,
        &["run", "--", "python3", "-c", ASK, "4.3373"],
        Path::new("/"),
    );
    check(command, "4.3373", DEFAULT_BUDGET);
}

/// Semaphore arrays are kernel memory that outlives the agent's
/// processes too: 32,000 semaphores of 64 bytes each per array, and the
/// kernel's default allows 1,024,000,000 of them (65 GB). An ordinary
/// user's `--max-memory` is only recorded without a delegated cgroup, so
/// nothing but the namespace's limits holds them; 40 arrays (82 MB) must
/// not all be made under a 64 MiB budget.
const SEMAPHORES: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
made, refused = 0, 0
for _ in range(40):
    r = libc.semget(0, 32000, 0o1000 | 0o600)
    if r >= 0:
        made += 1
    else:
        refused = ctypes.get_errno()
        break
print('made', made)
print('refused', refused)
sys.stdout.flush()
os.execvp('sleep', ['sleep', sys.argv[1]])
"#;

#[test]
fn an_ordinary_users_semaphores_are_bounded_by_its_recorded_limit() {
    if !can_run("an_ordinary_users_semaphores_are_bounded_by_its_recorded_limit") {
        return;
    }
    let command = tartaros_as(
        4393,
        &[
            "run",
            "--max-memory",
            "64M",
            "--",
            "python3",
            "-c",
            SEMAPHORES,
            "4.3457",
        ],
        Path::new("/"),
    );
    let child = command_output(command, "4.3457", 64 << 20);
    expect(&child, "refused", &libc::ENOSPC.to_string());
}
