//! `cargo xtask bench log`: what the effect log costs, side by side in one
//! invocation: (1) a syscall-heavy workload under `tartaros run` with and
//! without `--log`, and under `strace -f -o` for comparison; (2) the event
//! rate that reaches a verifying log with no loss, from one generator and
//! from one generator per core at once; (3) the start-up time `--log`
//! adds, as root and as a throwaway ordinary user with and without
//! `tartaros service`, side by side with bwrap.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench_user::{self, Callers};

mod flood;
mod fresh_fs;

/// The workload, in C so that the program itself costs next to nothing:
/// `cycles N` creates, writes, closes and unlinks N files; `execs N` runs
/// /bin/true N times; `flood N` opens one file for writing N times and
/// prints how long that took; `procs P pflood N` does the same in P
/// processes at once, each with a file of its own (`gen-K.tmp`), started
/// together, and prints the total of opens and the time until the last
/// one ended. Last, `cpu S`: the CPU time (user + system)
/// of the workload and its children, which the supervisor's own work does
/// not count in. `stamp` alone prints the CLOCK_MONOTONIC time at which the
/// program started: the end of the sandbox's start-up.
const WORKLOAD: &str = include_str!("bench_log/workload.c");

fn build_workload(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("workload.c");
    let binary = dir.join("workload");
    std::fs::write(&source, WORKLOAD)?;
    crate::check(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&binary)
            .arg(&source),
    )
    .context("failed to compile the benchmark workload (is a C compiler installed?)")?;
    Ok(binary)
}

mod tempfile_dir {
    use std::path::{Path, PathBuf};

    /// A work directory the agent (uid nobody when run as root) may write,
    /// removed on drop.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> anyhow::Result<Self> {
            let path = std::env::temp_dir().join(format!(
                "tartaros-bench-{}-{}",
                std::process::id(),
                rand()
            ));
            std::fs::create_dir_all(&path)?;
            crate::check(
                std::process::Command::new("chown")
                    .args(["65534:65534"])
                    .arg(&path),
            )?;
            Ok(Self(path))
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn rand() -> u32 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    }
}

fn timed(cmd: &mut Command) -> Result<Duration> {
    timed_cpu(cmd).map(|(wall, _)| wall)
}

/// Wall time of `cmd`, and the CPU time the workload reports (zero when
/// it reports none).
fn timed_cpu(cmd: &mut Command) -> Result<(Duration, Duration)> {
    let start = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let cpu = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("cpu ")?.trim().parse::<f64>().ok())
        .map_or(Duration::ZERO, Duration::from_secs_f64);
    Ok((elapsed, cpu))
}

/// CLOCK_MONOTONIC in seconds: the clock the workload's `stamp` prints.
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// What every part needs: the binaries and a scratch directory.
struct Setup {
    tartaros: PathBuf,
    workload: String,
    dir: tempfile_dir::Dir,
    /// `dir` as a string, for arguments.
    cwd: String,
    runs: usize,
}

impl Setup {
    fn new(root: &Path, runs: usize) -> Result<Self> {
        let workload = build_workload(root)?;
        let dir = tempfile_dir::Dir::new()?;
        Ok(Self {
            tartaros: root.join("target/release/tartaros"),
            workload: workload.to_str().unwrap_or_default().to_string(),
            cwd: dir.path().to_str().unwrap_or_default().to_string(),
            dir,
            runs: runs.clamp(3, 11),
        })
    }
}

/// All three parts.
pub fn run(root: &Path, runs: usize) -> Result<()> {
    let setup = Setup::new(root, runs)?;
    overhead(&setup)?;
    flood::event_rate(&setup)?;
    startup(&setup)
}

/// Part (2) alone.
pub fn run_flood(root: &Path, runs: usize) -> Result<()> {
    let setup = Setup::new(root, runs)?;
    println!("log: event rate, floods of opens under --log with a 256 MiB ring");
    flood::event_rate(&setup)
}

/// Part (3) alone.
pub fn run_startup(root: &Path, runs: usize) -> Result<()> {
    startup(&Setup::new(root, runs)?)
}

/// One binary's plain and `--log` medians: wall time and the workload's CPU.
fn print_pair([plain, logged]: [Duration; 2], [plain_cpu, logged_cpu]: [Duration; 2]) {
    println!("  tartaros run                     {:>9.1} ms", ms(plain));
    println!(
        "  tartaros run --log               {:>9.1} ms   overhead of --log {:+.1}%",
        ms(logged),
        (ms(logged) / ms(plain) - 1.0) * 100.0
    );
    println!(
        "  workload CPU time (user+sys, its own processes): {:.1} ms, with --log {:.1} ms ({:+.1}%: the capture in the kernel; the rest of the wall-time overhead is start-up and the supervisor's work)",
        ms(plain_cpu),
        ms(logged_cpu),
        (ms(logged_cpu) / ms(plain_cpu) - 1.0) * 100.0
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// (1) The workload's overhead, runs interleaved.
fn overhead(setup: &Setup) -> Result<()> {
    let Setup {
        tartaros,
        workload: w,
        dir,
        cwd: _,
        runs,
    } = setup;
    let runs = *runs;
    let args = ["cycles", "20000", "execs", "2000"];
    let mut samples: [Vec<Duration>; 4] = Default::default();
    let mut cpu: [Vec<Duration>; 2] = Default::default();
    // `TARTAROS_BENCH_BASELINE=<an older tartaros>` runs the same pair with
    // that binary in the same alternation (as `bench startup` does), so a
    // change's before and after share the host's mood.
    let baseline = std::env::var_os("TARTAROS_BENCH_BASELINE").map(PathBuf::from);
    let mut base_samples: [Vec<Duration>; 2] = Default::default();
    let mut base_cpu: [Vec<Duration>; 2] = Default::default();
    // Each run gets an ext4 filesystem of its own (fresh_fs.rs: the
    // previous runs' deletes would otherwise cost the next one's creates).
    let fresh = |tag: &str| fresh_fs::FreshFs::new(dir.path(), tag);
    for i in 0..runs {
        let log = dir.path().join(format!("effects-{i}.jsonl"));
        let fs = fresh("bare")?;
        samples[0].push(timed(Command::new(w).args(args).current_dir(fs.path()))?);
        drop(fs);
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut binaries = vec![(tartaros.as_path(), false)];
        binaries.extend(baseline.as_deref().map(|b| (b, true)));
        if i % 2 == 1 {
            binaries.reverse();
        }
        for (binary, is_base) in binaries {
            for logged in order {
                let fs = fresh(if logged { "logged" } else { "plain" })?;
                let mut cmd = Command::new(binary);
                cmd.arg("run").arg("--write").arg(fs.path());
                if logged {
                    cmd.arg("--log").arg(&log);
                }
                cmd.arg("--").arg(w).args(args).current_dir(fs.path());
                let (wall, workload_cpu) = timed_cpu(&mut cmd)?;
                let _ = std::fs::remove_file(&log);
                if is_base {
                    base_samples[usize::from(logged)].push(wall);
                    base_cpu[usize::from(logged)].push(workload_cpu);
                } else {
                    samples[1 + usize::from(logged)].push(wall);
                    cpu[usize::from(logged)].push(workload_cpu);
                }
            }
        }
        // strace is 10x slower and its spread small next to its cost:
        // three runs are enough for its median.
        let trace = dir.path().join("strace.out");
        if i < 3 {
            let fs = fresh("strace")?;
            samples[3].push(timed(
                Command::new("strace")
                    .args(["-f", "-o"])
                    .arg(&trace)
                    .arg(w)
                    .args(args)
                    .current_dir(fs.path()),
            )?);
        }
        let _ = std::fs::remove_file(&log);
        let _ = std::fs::remove_file(&trace);
    }
    let [bare, plain, logged, strace] = samples.map(median);
    let [plain_cpu, logged_cpu] = cpu.map(median);
    println!(
        "log: 20,000 create/write/unlink cycles + 2,000 execs on a new ext4 filesystem each, median of {runs} (strace: of 3)"
    );
    println!("  bare workload                    {:>9.1} ms", ms(bare));
    print_pair([plain, logged], [plain_cpu, logged_cpu]);
    println!(
        "  strace -f -o (no sandbox)        {:>9.1} ms   overhead of strace {:+.1}%",
        ms(strace),
        (ms(strace) / ms(bare) - 1.0) * 100.0
    );
    if let Some(base) = &baseline {
        let [plain, logged] = base_samples.map(median);
        let [plain_cpu, logged_cpu] = base_cpu.map(median);
        println!("  baseline binary {}:", base.display());
        print_pair([plain, logged], [plain_cpu, logged_cpu]);
    }

    Ok(())
}

/// Who runs a start-up row, and how.
#[derive(Clone, Copy, PartialEq)]
enum Who {
    /// `bwrap --unshare-all --ro-bind / /`, as root: the baseline.
    Bwrap,
    Root,
    /// The bench's ordinary user, through the service or not.
    User {
        service: bool,
    },
}

struct Row {
    name: String,
    who: Who,
    logged: bool,
    /// Start-up and whole-run samples, or why the row cannot run.
    samples: Result<[Vec<Duration>; 2], String>,
}

/// (3) The start-up `--log` adds: until the agent's first instruction (it
/// prints CLOCK_MONOTONIC, which the sandbox does not offset), and the
/// whole run of a program that does nothing, teardown included; as root,
/// and as an ordinary user with and without the service, side by side
/// with bwrap.
fn startup(setup: &Setup) -> Result<()> {
    let callers = Callers::new(&setup.tartaros);
    let result = startup_rows(setup, &callers);
    callers.finish();
    result
}

fn startup_rows(setup: &Setup, callers: &Callers) -> Result<()> {
    let Setup {
        tartaros,
        workload,
        dir,
        cwd: d,
        runs,
    } = setup;
    let runs = (*runs).max(21);
    let bwrap = crate::bench::which("bwrap").ok();
    let user = callers.user.as_ref().ok();
    let service = callers.service.as_ref().ok();
    // The user's copy of the workload, in its own directory.
    let user_workload = match user {
        Some(user) => {
            let copy = user.dir().join("workload");
            std::fs::copy(workload, &copy)?;
            Some(copy)
        }
        None => None,
    };
    let name = bench_user::NAME;
    let mut rows = Vec::new();
    let mut row = |name: String, who: Who, logged: bool, why_not: Option<&String>| {
        rows.push(Row {
            name,
            who,
            logged,
            samples: match why_not {
                Some(why) => Err(why.clone()),
                None => Ok(Default::default()),
            },
        });
    };
    let no_bwrap = "bwrap is not installed".to_string();
    row(
        "bwrap --unshare-all --ro-bind / /".into(),
        Who::Bwrap,
        false,
        bwrap.is_none().then_some(&no_bwrap),
    );
    row("tartaros run (root)".into(), Who::Root, false, None);
    row("tartaros run --log (root)".into(), Who::Root, true, None);
    let user_why = callers.user.as_ref().err();
    let service_why = callers.service.as_ref().err();
    for logged in [false, true] {
        let flag = if logged { " --log" } else { "" };
        row(
            format!("tartaros run{flag} ({name}, no service)"),
            Who::User { service: false },
            logged,
            user_why,
        );
    }
    for logged in [false, true] {
        let flag = if logged { " --log" } else { "" };
        row(
            format!("tartaros run{flag} ({name}, through the service)"),
            Who::User { service: true },
            logged,
            service_why,
        );
    }
    let command = |who: Who, logged: bool, i: usize| -> Command {
        let stamp = |cmd: &mut Command, w: &Path| {
            cmd.arg("--").arg(w).arg("stamp");
        };
        match who {
            Who::Bwrap => {
                let mut cmd = Command::new(bwrap.as_deref().unwrap_or("bwrap"));
                cmd.args(["--unshare-all", "--ro-bind", "/", "/"])
                    .arg(workload)
                    .arg("stamp")
                    .current_dir(d);
                cmd
            }
            Who::Root => {
                let mut cmd = Command::new(tartaros);
                cmd.arg("run").current_dir(d);
                if logged {
                    cmd.arg("--log")
                        .arg(dir.path().join(format!("start-{i}.jsonl")));
                }
                stamp(&mut cmd, Path::new(workload));
                cmd
            }
            Who::User { service: via } => {
                // Rows with `who` User exist only with a user (and a
                // service for `via`): the others carry their reason.
                let user = user.expect("a user row without a user");
                let mut cmd = user.command(
                    tartaros.to_str().unwrap_or("tartaros"),
                    if via { service } else { None },
                );
                cmd.arg("run");
                if logged {
                    cmd.arg("--log")
                        .arg(user.dir().join(format!("start-{i}.jsonl")));
                }
                stamp(
                    &mut cmd,
                    user_workload.as_deref().unwrap_or(Path::new(workload)),
                );
                cmd
            }
        }
    };
    let remove_log = |who: Who, i: usize| {
        let log = match (who, user) {
            (Who::User { .. }, Some(user)) => user.dir().join(format!("start-{i}.jsonl")),
            _ => dir.path().join(format!("start-{i}.jsonl")),
        };
        let _ = std::fs::remove_file(log);
    };
    // One run of a row: (start-up, whole run), or why it failed. The
    // warm-up (`i` none) keeps stderr for the reason.
    let once = |who: Who, logged: bool, i: Option<usize>| -> Result<[Duration; 2], String> {
        let mut cmd = command(who, logged, i.unwrap_or(0));
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        cmd.stderr(if i.is_some() {
            Stdio::null()
        } else {
            Stdio::piped()
        });
        let begin = monotonic();
        let out = cmd.output().map_err(|e| format!("failed to start: {e}"))?;
        let end = monotonic();
        remove_log(who, i.unwrap_or(0));
        let started = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("started ")?.trim().parse::<f64>().ok());
        match started {
            Some(started) if out.status.success() => Ok([
                Duration::from_secs_f64((started - begin).max(0.0)),
                Duration::from_secs_f64(end - begin),
            ]),
            _ => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let last = stderr.lines().last().unwrap_or("").trim().to_string();
                Err(format!("{}: {last}", out.status))
            }
        }
    };
    for row in &mut rows {
        if row.samples.is_ok()
            && let Err(why) = once(row.who, row.logged, None)
        {
            row.samples = Err(why);
        }
    }
    for i in 0..runs {
        for row in &mut rows {
            bench_user::check_interrupt()?;
            let Ok(samples) = &mut row.samples else {
                continue;
            };
            match once(row.who, row.logged, Some(i)) {
                Ok([start, whole]) => {
                    samples[0].push(start);
                    samples[1].push(whole);
                }
                Err(why) if row.who == Who::Root => bail!("{} failed: {why}", row.name),
                Err(why) => row.samples = Err(format!("failed on run {i}: {why}")),
            }
        }
    }
    let medians: Vec<Result<[Duration; 2], &String>> = rows
        .iter()
        .map(|r| {
            r.samples
                .as_ref()
                .map(|[start, whole]| [median(start.clone()), median(whole.clone())])
        })
        .collect();
    let (Ok([start_plain, whole_plain]), Ok([start_logged, whole_logged])) =
        (&medians[1], &medians[2])
    else {
        bail!("the root rows did not run");
    };
    println!(
        "  start-up (to the agent's first instruction): tartaros run {:.2} ms, with --log {:.2} ms: +{:.2} ms",
        ms(*start_plain),
        ms(*start_logged),
        ms(*start_logged) - ms(*start_plain)
    );
    println!(
        "  whole run of a program that does nothing (start-up and teardown): {:.2} ms, with --log {:.2} ms: +{:.2} ms",
        ms(*whole_plain),
        ms(*whole_logged),
        ms(*whole_logged) - ms(*whole_plain)
    );
    println!(
        "  per caller, medians of {runs} alternating runs of the workload's `stamp`{}:",
        match user {
            Some(user) => format!(" ({name}: the bench's throwaway user, uid {})", user.uid),
            None => String::new(),
        }
    );
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let base = medians[0].as_ref().ok();
    for (row, m) in rows.iter().zip(&medians) {
        match m {
            Ok([start, whole]) => {
                let ratios = match base {
                    Some([bstart, bwhole]) => format!(
                        "   ratio vs bwrap {:.2}, {:.2}",
                        start.as_secs_f64() / bstart.as_secs_f64(),
                        whole.as_secs_f64() / bwhole.as_secs_f64()
                    ),
                    None => String::new(),
                };
                println!(
                    "    {:<width$} start-up {:>7.2} ms   whole run {:>7.2} ms{ratios}",
                    row.name,
                    ms(*start),
                    ms(*whole)
                );
            }
            Err(why) => println!("    {:<width$} not run: {why}", row.name),
        }
    }
    Ok(())
}
