//! Benchmarks: medians of alternating runs, side by side with a baseline in
//! the same invocation, printed as ratios. Never timed tests.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

pub fn run(which: &str, runs: usize, root: &Path) -> Result<()> {
    match which {
        "startup" => startup(runs, root),
        "proxy" => crate::bench_proxy::run(root, runs.min(9)),
        "log" => crate::bench_log::run(root, runs),
        "log-start" => crate::bench_log::run_startup(root, runs),
        other => bail!("unknown benchmark {other:?}; use startup, log, log-start or proxy"),
    }
}

/// One contestant: a name and a full argv.
struct Case {
    name: String,
    argv: Vec<String>,
}

fn case(name: &str, argv: &[&str]) -> Case {
    Case {
        name: name.to_string(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
    }
}

fn time_once(argv: &[String]) -> Result<Duration> {
    let start = Instant::now();
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    let elapsed = start.elapsed();
    if !status.success() {
        bail!("{} failed: {status}", argv.join(" "));
    }
    Ok(elapsed)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Runs every case `runs` times, interleaved so drift hits all alike, and
/// returns the medians.
fn race(cases: &[Case], runs: usize) -> Result<Vec<Duration>> {
    for case in cases {
        time_once(&case.argv)?; // warm the page cache
    }
    let mut samples = vec![Vec::with_capacity(runs); cases.len()];
    for _ in 0..runs {
        for (i, case) in cases.iter().enumerate() {
            samples[i].push(time_once(&case.argv)?);
        }
    }
    Ok(samples.into_iter().map(median).collect())
}

fn report(cases: &[Case], medians: &[Duration], baseline: usize) {
    for (case, m) in cases.iter().zip(medians) {
        let ratio = m.as_secs_f64() / medians[baseline].as_secs_f64();
        println!(
            "{:<44} median {:>8.2} ms   ratio vs {} {:.2}",
            case.name,
            m.as_secs_f64() * 1e3,
            cases[baseline].name,
            ratio
        );
    }
}

fn startup(runs: usize, root: &Path) -> Result<()> {
    let tartaros = root.join("target/release/tartaros");
    let t = tartaros.to_str().unwrap_or("tartaros");
    let Ok(bwrap) = which("bwrap") else {
        bail!("bwrap is not installed; run cargo xtask deps");
    };
    let true_bin = which("true")?;
    println!("startup: median wall time of {runs} alternating runs of `true`");
    let plain = [
        case(
            "bwrap --unshare-all --ro-bind / / true",
            &[&bwrap, "--unshare-all", "--ro-bind", "/", "/", &true_bin],
        ),
        case("tartaros run -- true", &[t, "run", "--", &true_bin]),
    ];
    let medians = race(&plain, runs)?;
    report(&plain, &medians, 0);
    let hardened = [
        case(
            "bwrap --unshare-all --die-with-parent --new-session",
            &[
                &bwrap,
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
                &true_bin,
            ],
        ),
        case(
            "tartaros run --isolate-pids --isolate-proc --seccomp-strict",
            &[
                t,
                "run",
                "--isolate-pids",
                "--isolate-proc",
                "--seccomp-strict",
                "--",
                &true_bin,
            ],
        ),
    ];
    let medians = race(&hardened, runs)?;
    report(&hardened, &medians, 0);
    Ok(())
}

fn which(name: &str) -> Result<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if path.is_empty() {
        bail!("{name} not found");
    }
    Ok(path)
}
