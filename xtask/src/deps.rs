//! Installs the eBPF toolchain prerequisites (`cargo xtask deps`).
//!
//! What the eBPF build needs (see `docs/ebpf.md` and TOOLCHAIN.md):
//! - the `rust-src` component of the `nightly` toolchain (`-Z build-std=core`);
//! - `bpf-linker` 0.13.0 linked statically against LLVM 22, the LLVM major of
//!   rustc here. The LLVM libraries come from Debian's `llvm-22-dev`, unpacked
//!   into a cache directory (no system-wide install), and are deleted again
//!   once bpf-linker is built.
//!
//! Every step checks first whether it is already done, so running it again is
//! quick and prints nothing.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The bpf-linker release this project builds with.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM major of the rustc toolchains in use; bpf-linker must match it.
const LLVM_MAJOR: &str = "22";
/// The nightly toolchain used for the eBPF build.
const NIGHTLY: &str = "nightly";

/// Installs everything the eBPF build needs. Idempotent and quiet when every
/// piece is already in place.
pub fn install_prerequisites() -> Result<()> {
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    Ok(())
}

/// Installs (with `apt-get install -y`) those of `pkgs` that dpkg does not
/// report as installed. Does nothing, quietly, when all are installed.
pub fn ensure_debian_packages(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| !debian_package_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    if !apt_candidates_known(&missing) {
        apt_get_update()?;
    }
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(&mut cmd)
        .with_context(|| format!("failed to install Debian packages {}", missing.join(" ")))
}

fn debian_package_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

/// True when apt knows an installation candidate for every package, i.e.
/// the package lists are fresh enough that `apt-get update` can be skipped.
fn apt_candidates_known(pkgs: &[&str]) -> bool {
    let Ok(out) = Command::new("apt-cache")
        .arg("policy")
        .args(pkgs)
        .stderr(Stdio::null())
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let candidates: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .collect();
    candidates.len() == pkgs.len() && candidates.iter().all(|c| *c != "(none)")
}

fn apt_get_update() -> Result<()> {
    run(Command::new("apt-get").args(["update", "-qq"])).context("failed to run apt-get update")
}

fn ensure_rust_src() -> Result<()> {
    let out = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", NIGHTLY])
        .stderr(Stdio::null())
        .output()
        .context("failed to run rustup (is rustup installed and on PATH?)")?;
    let installed = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to the {NIGHTLY} toolchain");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]))
        .with_context(|| format!("failed to add rust-src to the {NIGHTLY} toolchain"))
}

/// `$CARGO_HOME` or `~/.cargo`: bpf-linker goes to its `bin`, which rustup
/// puts on PATH, and which the eBPF build script also searches.
fn cargo_home() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(h));
    }
    let home =
        std::env::var_os("HOME").context("failed to find the home directory: HOME is not set")?;
    Ok(PathBuf::from(home).join(".cargo"))
}

fn cache_dir() -> Result<PathBuf> {
    if let Some(c) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(c).join("tartaros"));
    }
    let home =
        std::env::var_os("HOME").context("failed to find the home directory: HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache").join("tartaros"))
}

/// Version reported by a bpf-linker binary (`bpf-linker 0.13.0` -> `0.13.0`).
fn bpf_linker_version(program: &OsStr) -> Option<String> {
    let out = Command::new(program)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_owned)
}

fn ensure_bpf_linker() -> Result<()> {
    let bin_dir = cargo_home()?.join("bin");
    let local = bin_dir.join("bpf-linker");
    for candidate in [OsStr::new("bpf-linker"), local.as_os_str()] {
        if bpf_linker_version(candidate).as_deref() == Some(BPF_LINKER_VERSION) {
            return Ok(());
        }
    }

    let started = std::time::Instant::now();
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR} (static; takes a minute or two)"
    );
    let prefix = cache_dir()?.join(format!("llvm{LLVM_MAJOR}"));
    let debs = prefix.join("debs");
    std::fs::create_dir_all(&debs)
        .with_context(|| format!("failed to create the download directory {}", debs.display()))?;

    let llvm_dev = format!("llvm-{LLVM_MAJOR}-dev");
    let pkgs = [llvm_dev.as_str(), "libzstd-dev"];
    if !apt_candidates_known(&pkgs) {
        apt_get_update()?;
    }
    // Downloaded .deb files stay in the cache so a rebuild needs no network.
    let have_debs = |name: &str| {
        std::fs::read_dir(&debs)
            .map(|rd| {
                rd.flatten().any(|e| {
                    let f = e.file_name();
                    let f = f.to_string_lossy();
                    f.starts_with(&format!("{name}_")) && f.ends_with(".deb")
                })
            })
            .unwrap_or(false)
    };
    let to_download: Vec<&str> = pkgs.iter().copied().filter(|p| !have_debs(p)).collect();
    if !to_download.is_empty() {
        // apt-get download runs as the `_apt` user when possible; the target
        // directory must be writable for it, so download as-is and accept
        // apt's warning about the sandbox.
        run(Command::new("apt-get")
            .args(["download", "-qq"])
            .args(&to_download)
            .current_dir(&debs))
        .with_context(|| {
            format!(
                "failed to download {} (check the Debian mirror)",
                to_download.join(" ")
            )
        })?;
    }

    let unpacked = prefix.join("root");
    let result = (|| -> Result<()> {
        std::fs::create_dir_all(&unpacked)
            .with_context(|| format!("failed to create {}", unpacked.display()))?;
        for entry in std::fs::read_dir(&debs)
            .with_context(|| format!("failed to list {}", debs.display()))?
        {
            let path = entry?.path();
            if path.extension() == Some(OsStr::new("deb")) {
                run(Command::new("dpkg-deb").arg("-x").arg(&path).arg(&unpacked))
                    .with_context(|| format!("failed to unpack {}", path.display()))?;
            }
        }
        let llvm_prefix = unpacked.join(format!("usr/lib/llvm-{LLVM_MAJOR}"));
        let zstd = unpacked.join(multiarch_libdir());
        // bpf-linker's build script reads the static libraries directly;
        // it needs no llvm-config (which lives in the `llvm-22` package).
        if !llvm_prefix.join("lib/libLLVMCore.a").exists() {
            bail!(
                "failed to find libLLVMCore.a in {}/lib after unpacking {llvm_dev}",
                llvm_prefix.display()
            );
        }
        let root = cargo_home()?;
        run(Command::new("cargo")
            .args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
            .args(["--locked", "--force", "--no-default-features"])
            .args(["--features", &format!("llvm-{LLVM_MAJOR},llvm-link-static")])
            .arg("--root")
            .arg(&root)
            .env("LLVM_PREFIX", &llvm_prefix)
            .env("LIBZSTD_PATH", &zstd)
            // Keep an outer cargo's settings (xtask runs under `cargo run`)
            // from leaking into the install.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC"))
        .context("failed to build bpf-linker with cargo install")
    })();
    // The unpacked LLVM is ~460 MB and only needed for the build above.
    if let Err(e) = std::fs::remove_dir_all(&unpacked)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!(
            "xtask: warning: failed to remove {}: {e}",
            unpacked.display()
        );
    }
    result?;

    match bpf_linker_version(local.as_os_str()) {
        Some(v) if v == BPF_LINKER_VERSION => {}
        other => bail!(
            "failed to verify bpf-linker: {} reports version {:?}, expected {BPF_LINKER_VERSION}",
            local.display(),
            other
        ),
    }
    eprintln!(
        "xtask: bpf-linker {BPF_LINKER_VERSION} installed to {} in {:.0?}",
        local.display(),
        started.elapsed()
    );
    if bpf_linker_version(OsStr::new("bpf-linker")).is_none() {
        eprintln!(
            "xtask: note: {} is not on PATH; the eBPF build script finds it there anyway",
            bin_dir.display()
        );
    }
    Ok(())
}

/// Debian multiarch library directory holding libzstd.a.
fn multiarch_libdir() -> &'static Path {
    if cfg!(target_arch = "aarch64") {
        Path::new("usr/lib/aarch64-linux-gnu")
    } else {
        Path::new("usr/lib/x86_64-linux-gnu")
    }
}

/// Runs a command with inherited stdio and fails on a non-zero exit.
fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} exited with {status}", cmd.get_program());
    }
    Ok(())
}
