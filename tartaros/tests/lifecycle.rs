//! The process architecture: exit statuses, signal forwarding, teardown of
//! everything the agent started, and a killed supervisor.

mod common;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Tests that compare the set of run cgroups before and after must not
/// overlap with another run in this binary.
static CGROUP_CHECK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn marker(name: &str) -> String {
    // `sleep` takes fractional seconds: a unique, harmless command line.
    format!("1000.{}{}", std::process::id(), name.len())
}

#[test]
fn exit_status_is_the_agents_own_or_128_plus_signal() {
    if !can_run("exit_status") {
        return;
    }
    let work = Dir::new();
    let code = |cmd: &str| {
        tartaros(&["run", "--", "sh", "-c", cmd], work.path())
            .status
            .code()
    };
    assert_eq!(code("exit 0"), Some(0));
    assert_eq!(code("exit 3"), Some(3));
    assert_eq!(code("kill -KILL $$"), Some(137));
    assert_eq!(code("kill -TERM $$"), Some(143));
    let missing = tartaros(&["run", "--", "no-such-command-tartaros"], work.path());
    assert_eq!(missing.status.code(), Some(127));
    assert!(stderr(&missing).starts_with("tartaros:"));
    let data = work.file("data.txt", "not a program");
    let not_exec = tartaros(&["run", "--", data.to_str().unwrap()], work.path());
    assert_eq!(not_exec.status.code(), Some(126));
}

#[test]
fn a_daemonized_grandchild_does_not_survive_the_run() {
    if !can_run("daemonized_grandchild") {
        return;
    }
    let work = Dir::new();
    let m = marker("daemon");
    // Double fork plus setsid: the classic way to escape a parent's wait.
    let script = format!("(setsid sh -c 'sleep {m} & exit' &) ; sleep 0.2; exit 0");
    let _serial = CGROUP_CHECK.lock().unwrap_or_else(|e| e.into_inner());
    let before = run_cgroups();
    let out = tartaros(&["run", "--", "sh", "-c", &script], work.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        eventually(2, || processes_with(&m).is_empty()),
        "daemonized sleep survived: {:?}",
        processes_with(&m)
    );
    assert!(
        eventually(2, || run_cgroups().iter().all(|c| before.contains(c))),
        "cgroups left: {:?}",
        run_cgroups()
    );
}

#[test]
fn sigkill_of_the_supervisor_kills_the_sandbox_and_the_janitor_removes_the_cgroup() {
    if !can_run("sigkill_supervisor") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::new();
    let _serial = CGROUP_CHECK.lock().unwrap_or_else(|e| e.into_inner());
    // Output to /dev/null, and to a host file outside every root, which
    // `tartaros` relays through a pipe from a parent process of its own
    // (stdio_relay.rs): the pid the launcher holds is then that relay's,
    // and its SIGKILL must end the run the same way.
    for (case, to_file) in [("null", false), ("file", true)] {
        let m = marker(&format!("killed-supervisor-{case}"));
        let before = run_cgroups();
        let stdout = if to_file {
            Stdio::from(std::fs::File::create(outside.join("out.txt")).unwrap())
        } else {
            Stdio::null()
        };
        let mut supervisor = KillOnDrop(Some(
            Command::new(bin())
                .args(["run", "--", "sh", "-c", &format!("sleep {m} & sleep {m}")])
                .current_dir(work.path())
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ));
        assert!(
            eventually(5, || processes_with(&m).len() == 2),
            "{case}: agent did not start"
        );
        let mut supervisor = supervisor.take();
        supervisor.kill().unwrap();
        supervisor.wait().unwrap();
        assert!(
            eventually(5, || processes_with(&m).is_empty()),
            "{case}: sandbox processes survived the supervisor: {:?}",
            processes_with(&m)
        );
        assert!(
            eventually(5, || run_cgroups().iter().all(|c| before.contains(c))),
            "{case}: cgroup left behind: {:?}",
            run_cgroups()
        );
    }
}

#[test]
fn sigterm_to_the_supervisor_reaches_the_agent() {
    if !can_run("sigterm_forwarded") {
        return;
    }
    let work = Dir::new();
    let m = marker("sigterm");
    let mut child = KillOnDrop(Some(
        Command::new(bin())
            .args([
                "run",
                "--",
                "sh",
                "-c",
                &format!("trap 'echo got-term; exit 42' TERM; sleep {m} & wait"),
            ])
            .current_dir(work.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    assert!(
        eventually(5, || !processes_with(&m).is_empty()),
        "agent did not start"
    );
    std::thread::sleep(Duration::from_millis(100));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.take().wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(42), "{}", stderr(&out));
    assert!(stdout(&out).contains("got-term"));
    assert!(eventually(2, || processes_with(&m).is_empty()));
}

#[test]
fn the_agent_sees_only_its_own_processes_and_a_clean_environment() {
    if !can_run("pid_namespace_env") {
        return;
    }
    let work = Dir::new();
    let out = Command::new(bin())
        .args([
            "run",
            "--env",
            "PASSED_VAR",
            "--",
            "sh",
            "-c",
            "echo pid=$$; ls /proc | grep -c '^[0-9]'; env",
        ])
        .current_dir(work.path())
        .env("TARTAROS_TEST_SECRET", "s3cr3t-value")
        .env("PASSED_VAR", "visible")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.contains("pid=2"),
        "the agent is pid 2 under the init: {text}"
    );
    let procs: u32 = text.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(procs <= 4, "the agent sees host processes: {procs}");
    assert!(!text.contains("s3cr3t-value"), "launcher secret leaked");
    assert!(text.contains("PASSED_VAR=visible"));
    let inherited = Command::new(bin())
        .args(["run", "--inherit-env", "--", "sh", "-c", "env"])
        .current_dir(work.path())
        .env("TARTAROS_TEST_SECRET", "s3cr3t-value")
        .output()
        .unwrap();
    assert!(
        stdout(&inherited).contains("s3cr3t-value"),
        "control: --inherit-env passes it"
    );
}

#[test]
fn the_agent_runs_unprivileged_with_no_capabilities_and_no_new_privs() {
    if !can_run("unprivileged") {
        return;
    }
    let work = Dir::new();
    let out = tartaros(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "id -u; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status",
        ],
        work.path(),
    );
    let text = stdout(&out);
    assert!(text.starts_with("65534\n"), "{text}");
    for line in [
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(text.contains(line), "missing {line:?} in {text}");
    }
}

/// The run cgroups (v1 or v2) whose `pids.max` is `max`, anywhere under
/// /sys/fs/cgroup: where the limit of a run with `--max-procs max` lives.
fn pids_cgroups_limited_to(max: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("tartaros-")
                && std::fs::read_to_string(path.join("pids.max")).is_ok_and(|m| m.trim() == max)
            {
                found.push(path.clone());
            }
            dirs.push(path);
        }
    }
    found
}

/// The limit is the kernel's: read from the host, the peak number of
/// tasks in the run's pids cgroup (`pids.peak`, Linux 6.13) stays at the
/// limit while the bomb runs, and the kernel refused forks (`pids.events`).
/// (A count of `/proc` entries from inside is no proof either way: a
/// readdir over processes that die and are replaced can list more than
/// ever lived at once.)
#[test]
fn a_fork_bomb_under_max_procs_ends_with_the_limit_holding() {
    if !can_run("fork_bomb") {
        return;
    }
    let _serial = CGROUP_CHECK.lock().unwrap_or_else(|e| e.into_inner());
    let work = Dir::new();
    // While the bomb holds every pid a fork fails, so the script waits
    // with shell builtins only (a busy loop).
    let script = "bomb() { bomb | bomb & }; bomb; \
                  i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done; echo done; exit 0";
    let mut child = Command::new(bin())
        .args([
            "run",
            "--strict",
            "--max-procs",
            "17",
            "--",
            "sh",
            "-c",
            script,
        ])
        .current_dir(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut peak, mut refused, mut seen) = (0u64, 0u64, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        for dir in pids_cgroups_limited_to("17") {
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            if let Ok(p) = read("pids.peak").trim().parse::<u64>() {
                seen = true;
                peak = peak.max(p);
            }
            let max_events = read("pids.events")
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
            refused = refused.max(max_events);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    eprintln!("fork bomb: pids.peak {peak}, forks refused {refused}");
    assert!(seen, "no pids cgroup with the limit: {}", stderr(&out));
    assert!(peak <= 17, "limit did not hold: {peak} tasks at once");
    assert!(refused > 0, "the bomb never hit the limit (peak {peak})");
    assert!(stdout(&out).contains("done"), "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Control: the host can still start processes.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

fn ppid(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The init is cloned from a template that keeps no descriptor
/// (zygote.rs): seen from the host, it must hold only its own, nothing of
/// the supervisor's (the log, the eBPF maps, programs and ring) or of the
/// launcher's (an inherited descriptor the exec'd init used to keep), not
/// the supervisor's command line (`/proc/<pid>/cmdline` is world-readable)
/// or environment, which a clone would show; the agent only stdio; and the
/// template must be gone once the init exists.
#[test]
fn the_init_and_the_agent_hold_only_their_own_descriptors() {
    if !can_run("init_descriptors") {
        return;
    }
    let work = Dir::new();
    let m = marker("init-descriptors");
    let log = work.path().join("effects.jsonl");
    // A descriptor the launcher leaves open (no close-on-exec): the
    // sandbox must not get it.
    let secret = work.file("launcher-secret.txt", "launcher's");
    let leaked = std::fs::File::open(&secret).unwrap();
    let mut command = Command::new(bin());
    command
        .args(["run", "--log", log.to_str().unwrap()])
        .args(["--", "sleep", &m])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let raw = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    // SAFETY: dup2 between fork and exec, async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            if libc::dup2(raw, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut supervisor = KillOnDrop(Some(command.spawn().unwrap()));
    assert!(
        eventually(5, || processes_with(&m).len() == 1),
        "agent did not start"
    );
    let agent = processes_with(&m)[0];
    let init = ppid(agent);
    let supervisor_pid = supervisor.id() as i32;
    assert_eq!(
        ppid(init),
        supervisor_pid,
        "the init is the supervisor's child"
    );
    // Its own: stdio, the report pipe, what it opened itself (the Landlock
    // ruleset); the plan pipe and the gateway socket are closed by now.
    let init_fds = open_fds(init);
    assert!(init_fds.len() >= 4, "init holds {init_fds:?}");
    for (fd, target) in &init_fds {
        let own = *fd <= 6
            && !target.contains("bpf")
            && !target.contains("fanotify")
            && !target.contains("effects.jsonl")
            && !target.contains("launcher-secret");
        assert!(own, "init fd {fd} is {target}: {init_fds:?}");
    }
    // Nor the supervisor's command line (world-readable) or environment.
    let cmdline = std::fs::read(format!("/proc/{init}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.starts_with("tartaros-init") && !cmdline.contains("--log"),
        "init's command line: {cmdline:?}"
    );
    let environ = std::fs::read(format!("/proc/{init}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("PATH="),
        "init's environment: {:?}",
        String::from_utf8_lossy(&environ)
    );
    let agent_fds: Vec<i32> = open_fds(agent).iter().map(|(fd, _)| *fd).collect();
    assert_eq!(agent_fds, [0, 1, 2], "agent holds {:?}", open_fds(agent));
    let children = std::fs::read_to_string(format!(
        "/proc/{supervisor_pid}/task/{supervisor_pid}/children"
    ))
    .unwrap_or_default();
    let children: Vec<i32> = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(children.contains(&init), "children {children:?}");
    // The janitor, which may outlive us by a grace period or two, shows
    // neither either: after `run` returns it must not pass for the agent.
    for janitor in children.iter().filter(|c| **c != init) {
        let cmdline = std::fs::read(format!("/proc/{janitor}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.starts_with("tartaros-janitor") && !cmdline.contains(&m),
            "janitor's command line: {cmdline:?}"
        );
        let environ = std::fs::read(format!("/proc/{janitor}/environ")).unwrap();
        assert!(
            !String::from_utf8_lossy(&environ).contains("PATH="),
            "janitor's environment"
        );
    }
    assert!(
        children.len() <= 2,
        "the supervisor has more children than its janitor and init (a template left?): {children:?}"
    );
    let mut supervisor = supervisor.take();
    // SAFETY: a signal to the supervisor we started.
    unsafe { libc::kill(supervisor_pid, libc::SIGTERM) };
    assert!(supervisor.wait().unwrap().code().is_some());
}

/// The init builds the sandbox while the supervisor attaches the eBPF
/// programs to its cgroup, and those refuse every socket of a task whose
/// run is not registered yet. Once, the init brought loopback up in that
/// window (EPERM, exit 125) in about one start in five with the connect
/// filter: it makes no socket now before the late part of its plan.
#[test]
fn starts_never_race_the_programs_being_attached() {
    if !can_run("attach_race") {
        return;
    }
    let work = Dir::new();
    for i in 0..40 {
        let out = tartaros(
            &["run", "--allow-domain", "example.com", "--", "true"],
            work.path(),
        );
        assert_eq!(out.status.code(), Some(0), "start {i}: {}", stderr(&out));
    }
}
