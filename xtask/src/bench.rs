//! Benchmarks: medians of alternating runs, side by side with a baseline in
//! the same invocation, printed as ratios. Never timed tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::bench_user::{self, Callers, Service, User};

pub fn run(which: &str, runs: usize, root: &Path) -> Result<()> {
    match which {
        "startup" => startup(runs, root),
        "proxy" => crate::bench_proxy::run(root, runs.min(9)),
        "log" => crate::bench_log::run(root, runs),
        "log-start" => crate::bench_log::run_startup(root, runs),
        "log-flood" => crate::bench_log::run_flood(root, runs),
        other => {
            bail!("unknown benchmark {other:?}; use startup, log, log-start, log-flood or proxy")
        }
    }
}

/// One contestant: a name and a full argv, as root in `cwd`, or as the
/// bench's ordinary user (through the service or not).
struct Case {
    name: String,
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    caller: Caller,
}

#[derive(Clone, Copy)]
enum Caller {
    Root,
    User { service: bool },
}

/// The state a case's command is built from.
struct Env<'a> {
    user: Option<&'a User>,
    service: Option<&'a Service>,
}

fn case(name: &str, argv: &[&str]) -> Case {
    Case {
        name: name.to_string(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        caller: Caller::Root,
    }
}

impl Case {
    fn in_dir(mut self, dir: Option<&Path>) -> Self {
        self.cwd = dir.map(Path::to_path_buf);
        self
    }

    /// The case as the bench user, `via_service` or not.
    fn by_user(mut self, via_service: bool) -> Self {
        self.caller = Caller::User {
            service: via_service,
        };
        self
    }

    /// The command, or why it cannot run.
    fn command(&self, env: &Env) -> Result<Command, String> {
        let mut command = match self.caller {
            Caller::Root => {
                let mut command = Command::new(&self.argv[0]);
                if let Some(cwd) = &self.cwd {
                    command.current_dir(cwd);
                }
                command
            }
            Caller::User { service } => {
                let user = env.user.ok_or("no bench user")?;
                let service = if service {
                    Some(env.service.ok_or("no service")?)
                } else {
                    None
                };
                user.command(&self.argv[0], service)
            }
        };
        command.args(&self.argv[1..]).stdin(Stdio::null());
        Ok(command)
    }
}

fn time_once(case: &Case, env: &Env) -> Result<Duration> {
    let mut command = case.command(env).map_err(anyhow::Error::msg)?;
    let start = Instant::now();
    let status = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    let elapsed = start.elapsed();
    if !status.success() {
        bail!("{} failed: {status}", case.argv.join(" "));
    }
    Ok(elapsed)
}

/// One run with its stderr kept: `Err` with the reason when it fails.
fn try_once(case: &Case, env: &Env) -> Result<(), String> {
    let mut command = case.command(env)?;
    let out = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("failed to start {}: {e}", case.argv[0]))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("").trim();
    Err(format!("{}: {last}", out.status))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Runs every case `runs` times, interleaved so drift hits all alike, and
/// returns the medians. A case other than the baseline (the first) that
/// fails is left out of the rest of the race, with the reason in its slot.
fn race(cases: &[Case], runs: usize, env: &Env) -> Result<Vec<Result<Duration, String>>> {
    // Warms the page cache and finds the cases that cannot run.
    let mut results: Vec<Result<Vec<Duration>, String>> = cases
        .iter()
        .map(|case| try_once(case, env).map(|()| Vec::with_capacity(runs)))
        .collect();
    if let Err(why) = &results[0] {
        bail!("{} failed: {why}", cases[0].name);
    }
    for _ in 0..runs {
        for (i, case) in cases.iter().enumerate() {
            bench_user::check_interrupt()?;
            let Ok(samples) = &mut results[i] else {
                continue;
            };
            match time_once(case, env) {
                Ok(elapsed) => samples.push(elapsed),
                Err(e) if i == 0 => return Err(e),
                Err(e) => results[i] = Err(format!("{e:#}")),
            }
        }
    }
    Ok(results.into_iter().map(|r| r.map(median)).collect())
}

fn report(cases: &[Case], medians: &[Result<Duration, String>], baseline: usize) {
    let width = cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0)
        .max(44);
    let Ok(base) = &medians[baseline] else {
        return;
    };
    for (case, m) in cases.iter().zip(medians) {
        match m {
            Ok(m) => println!(
                "{:<width$} median {:>8.2} ms   ratio vs {} {:.2}",
                case.name,
                m.as_secs_f64() * 1e3,
                cases[baseline].name,
                m.as_secs_f64() / base.as_secs_f64()
            ),
            Err(why) => println!("{:<width$} not run: {why}", case.name),
        }
    }
}

fn startup(runs: usize, root: &Path) -> Result<()> {
    let tartaros = root.join("target/release/tartaros");
    let t = tartaros.to_str().unwrap_or("tartaros");
    let Ok(bwrap) = which("bwrap") else {
        bail!("bwrap is not installed; run cargo xtask deps");
    };
    let true_bin = which("true")?;
    let callers = Callers::new(&tartaros);
    let result = startup_races(runs, t, &bwrap, &true_bin, &callers);
    callers.finish();
    result
}

/// The two races, each with the ordinary user's rows after root's.
fn startup_races(
    runs: usize,
    t: &str,
    bwrap: &str,
    true_bin: &str,
    callers: &Callers,
) -> Result<()> {
    let env = Env {
        user: callers.user.as_ref().ok(),
        service: callers.service.as_ref().ok(),
    };
    // Every row runs in the user's directory when there is one.
    let dir = env.user.map(User::dir);
    let name = bench_user::NAME;
    println!("startup: median wall time of {runs} alternating runs of `true`");
    match (&callers.user, &callers.service) {
        (Err(why), _) => println!("  (no rows as an ordinary user: {why})"),
        (Ok(user), service) => {
            println!(
                "  ({name}: the bench's throwaway user, uid {}, in {}{})",
                user.uid,
                user.dir().display(),
                match service {
                    Ok(_) => String::new(),
                    Err(why) => format!("; no service rows: {why}"),
                }
            );
        }
    }
    // `TARTAROS_BENCH_BASELINE=<an older tartaros>` races it too (as root),
    // so a change's before and after come from the same invocation.
    let baseline = std::env::var("TARTAROS_BENCH_BASELINE").ok();
    let bwrap_plain = [bwrap, "--unshare-all", "--ro-bind", "/", "/", true_bin];
    let mut plain = vec![
        case("bwrap --unshare-all --ro-bind / / true", &bwrap_plain),
        case("tartaros run -- true", &[t, "run", "--", true_bin]),
    ];
    if let Some(base) = baseline.as_deref() {
        plain.push(case(
            "tartaros run -- true (baseline binary)",
            &[base, "run", "--", true_bin],
        ));
    }
    if env.user.is_some() {
        plain.extend([
            case(
                &format!("bwrap --unshare-all --ro-bind / / true ({name})"),
                &bwrap_plain,
            )
            .by_user(false),
            case(
                &format!("tartaros run -- true ({name}, no service: user namespaces)"),
                &[t, "run", "--", true_bin],
            )
            .by_user(false),
            case(
                &format!("tartaros run -- true ({name}, through the service)"),
                &[t, "run", "--", true_bin],
            )
            .by_user(true),
        ]);
    }
    let plain: Vec<Case> = plain.into_iter().map(|c| c.in_dir(dir)).collect();
    let medians = race(&plain, runs, &env)?;
    report(&plain, &medians, 0);
    let bwrap_hardened = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        true_bin,
    ];
    let tartaros_hardened = [
        t,
        "run",
        "--isolate-pids",
        "--isolate-proc",
        "--seccomp-strict",
        "--",
        true_bin,
    ];
    let mut hardened = vec![
        case(
            "bwrap --unshare-all --die-with-parent --new-session",
            &bwrap_hardened,
        ),
        case(
            "tartaros run --isolate-pids --isolate-proc --seccomp-strict",
            &tartaros_hardened,
        ),
    ];
    if let Some(base) = baseline.as_deref() {
        let mut argv = tartaros_hardened;
        argv[0] = base;
        hardened.push(case("the same, baseline binary", &argv));
    }
    if env.user.is_some() {
        hardened.extend([
            case(
                &format!("bwrap --unshare-all --die-with-parent --new-session ({name})"),
                &bwrap_hardened,
            )
            .by_user(false),
            case(
                &format!("tartaros run --isolate-pids ... ({name}, no service)"),
                &tartaros_hardened,
            )
            .by_user(false),
            case(
                &format!("tartaros run --isolate-pids ... ({name}, through the service)"),
                &tartaros_hardened,
            )
            .by_user(true),
        ]);
    }
    let hardened: Vec<Case> = hardened.into_iter().map(|c| c.in_dir(dir)).collect();
    let medians = race(&hardened, runs, &env)?;
    report(&hardened, &medians, 0);
    Ok(())
}

pub fn which(name: &str) -> Result<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if path.is_empty() {
        bail!("{name} not found");
    }
    Ok(path)
}
