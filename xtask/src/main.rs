//! Project automation: `cargo xtask <command>`.
//!
//! - `demo`: install prerequisites, build, run the main job (an agent-like
//!   command under `tartaros run --log`), verify the log.
//! - `ci`: install prerequisites, build, run the whole test suite.
//! - `deps`: only install prerequisites (idempotent).
//! - `bench startup|log|log-start|log-flood|proxy`: side-by-side
//!   benchmarks (`log-start` and `log-flood` are the start-up and event
//!   rate parts of `log` alone; `startup` and `log-start` add rows for a
//!   throwaway ordinary user, with and without `tartaros service`;
//!   `TARTAROS_BENCH_BASELINE=<binary>` adds `startup` rows for an older
//!   build, for a before/after in one invocation).
//! - `lab`: install the peer sandboxes and run the contract lab.
//! - `package`: a Debian package (binary, man page, completions).
mod bench;
mod bench_log;
mod bench_proxy;
mod bench_user;
mod deps;
mod lab;
mod package;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the build and test prerequisites.
    Deps,
    /// Build everything and run the main job under `tartaros run --log`.
    Demo,
    /// Build everything and run the whole test suite.
    Ci {
        /// Skip the peer sandboxes of the lab (they take minutes to install).
        #[arg(long)]
        no_peers: bool,
    },
    /// Benchmarks, side by side with baselines.
    Bench {
        /// startup, log, log-start, log-flood or proxy
        which: String,
        #[arg(long, default_value_t = 31)]
        runs: usize,
    },
    /// Install the peers and run the contract lab (arguments go to `python3 -m runner run`).
    Lab {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build a Debian package: binary (with its eBPF object), man page, completions.
    Package {
        /// Package this binary instead of building the release one.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Directory for the .deb (default: target/debian).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Debian packages the tests and the demo need (chromium opens `log
/// report`'s page, python3-jsonschema checks the log schema, gcc builds in
/// the reviewers' realistic run, e2fsprogs makes the log benchmark's
/// filesystems).
const TEST_PACKAGES: &[&str] = &[
    "bubblewrap",
    "e2fsprogs",
    "iproute2",
    "strace",
    "git",
    "procps",
    "chromium",
    "python3-jsonschema",
    "gcc",
];

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Task::Deps => prerequisites(),
        Task::Demo => demo(),
        Task::Ci { no_peers } => ci(no_peers),
        Task::Bench { which, runs } => {
            prerequisites()?;
            build_release()?;
            bench::run(&which, runs, &workspace_root())
        }
        Task::Lab { args } => {
            prerequisites()?;
            build_release()?;
            lab::install_peers()?;
            lab::run_lab(&args)
        }
        Task::Package { binary, out } => {
            let binary = match binary {
                Some(binary) => binary,
                None => {
                    build_release()?;
                    release_binary()
                }
            };
            let out = out.unwrap_or_else(|| workspace_root().join("target/debian"));
            let deb = package::build(&binary, &out)?;
            println!("{}", deb.display());
            Ok(())
        }
    }
}

fn prerequisites() -> Result<()> {
    deps::ensure_debian_packages(TEST_PACKAGES)?;
    deps::install_prerequisites()
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

pub fn check(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn build_release() -> Result<()> {
    check(cargo().args(["build", "--release", "-p", "tartaros"]))
}

pub fn release_binary() -> PathBuf {
    workspace_root().join("target/release/tartaros")
}

/// The main job: an agent-like session (a git repository, a Python package
/// with a test, a build artefact, a denied secret) under the strict sandbox
/// with an effect log, then the reviewer's verification.
fn demo() -> Result<()> {
    prerequisites()?;
    build_release()?;
    let tartaros = release_binary();
    let base = std::env::temp_dir().join(format!("tartaros-demo-{}", std::process::id()));
    let work = base.join("project");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join(".env"), "API_TOKEN=demo-secret-never-read\n")?;
    // The agent runs as `nobody` when started as root without sudo.
    check(Command::new("chown").args(["-R", "65534:65534"]).arg(&work))?;
    let log = base.join("effects.jsonl");
    let script = r#"
set -e
git init -q . && git config user.email agent@example.invalid && git config user.name agent
mkdir -p calc tests
printf 'def add(a, b):\n    return a + b\n' > calc/__init__.py
printf 'from calc import add\nassert add(2, 3) == 5\nprint("tests passed")\n' > tests/test_add.py
PYTHONPATH=. python3 tests/test_add.py
python3 -m compileall -q calc
git add calc tests && git commit -qm "add calc"
if cat .env 2>/dev/null; then echo "secret was readable"; exit 1; else echo ".env is denied"; fi
if touch /etc/agent-was-here 2>/dev/null; then echo "escaped"; exit 1; else echo "writes outside the project are denied"; fi
git log --oneline
"#;
    println!(
        "$ tartaros run --strict --write {0} --read-deny {0}/.env --log {1} -- sh -c '...'",
        work.display(),
        log.display()
    );
    let status = Command::new(&tartaros)
        .args(["run", "--strict", "--write"])
        .arg(&work)
        .arg("--read-deny")
        .arg(work.join(".env"))
        .arg("--log")
        .arg(&log)
        .args(["--", "sh", "-c", script])
        .current_dir(&work)
        // The agent runs as nobody: give it a HOME it may read.
        .env("HOME", &work)
        .status()?;
    if !status.success() {
        bail!("the agent failed under tartaros: {status}");
    }
    println!("$ tartaros log verify {}", log.display());
    let verify = Command::new(&tartaros)
        .args(["log", "verify"])
        .arg(&log)
        .status()?;
    if log.exists() {
        println!("$ tartaros log show {} (first 30 lines)", log.display());
        let shown = Command::new(&tartaros)
            .args(["log", "show"])
            .arg(&log)
            .output()?;
        for line in String::from_utf8_lossy(&shown.stdout).lines().take(30) {
            println!("{line}");
        }
    }
    if !verify.success() {
        bail!("tartaros log verify failed: {verify}");
    }
    let _ = std::fs::remove_dir_all(&base);
    println!("demo: ok");
    Ok(())
}

/// The whole suite: Rust unit and integration tests (as root, against the
/// real kernel), the lab's unit tests, and the lab against TartarOS.
fn ci(no_peers: bool) -> Result<()> {
    let result = ci_steps(no_peers);
    // The plain root runs of the tests and the lab pinned their unix
    // programs in /run/tartaros/bpf (docs/architecture.md, "Start-up
    // cost"): CI leaves the host as it found it, also when a step failed.
    // The tests' debug binary pins too, and a failed test step ends the
    // suite before the release build.
    let Some(binary) = [
        release_binary(),
        workspace_root().join("target/debug/tartaros"),
    ]
    .into_iter()
    .find(|b| b.exists()) else {
        return result;
    };
    let dropped = check(Command::new(binary).args(["cache", "drop"]));
    result.and(dropped)
}

fn ci_steps(no_peers: bool) -> Result<()> {
    prerequisites()?;
    // A clean clone builds everything once: incremental caches would only
    // cost time to write.
    let cargo = || {
        let mut cmd = cargo();
        cmd.env("CARGO_INCREMENTAL", "0");
        cmd
    };
    check(cargo().args(["build", "--workspace"]))?;
    check(cargo().args(["build", "--release", "-p", "tartaros"]))?;
    check(cargo().args(["test", "--workspace", "--no-fail-fast"]))?;
    check(
        Command::new("python3")
            .args([
                "-m",
                "unittest",
                "discover",
                "-s",
                "runner/tests",
                "-t",
                ".",
            ])
            .current_dir(workspace_root()),
    )?;
    if !no_peers {
        lab::install_peers()?;
    }
    // Asserted: every attack mitigated, every control passing. A few
    // contracts race short sleeps on a loaded host, so a failing lab run is
    // repeated once before it fails CI.
    let tartaros_lab = [
        "--sandbox".to_string(),
        "tartaros".into(),
        "--fail-on".into(),
        "tartaros".into(),
    ];
    if let Err(first) = lab::run_lab(&tartaros_lab) {
        eprintln!("xtask: the lab failed against TartarOS ({first:#}); running it once more");
        lab::run_lab(&tartaros_lab)?;
    }
    if !no_peers {
        // Peers are printed for comparison, never asserted.
        if let Err(e) = lab::run_lab(&[
            "--sandbox".into(),
            "bwrap,firejail,nsjail,sandlock,codex,srt".into(),
        ]) {
            eprintln!("xtask: peer lab run failed (not asserted): {e:#}");
        }
    }
    Ok(())
}
