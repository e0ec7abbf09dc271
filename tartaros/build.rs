//! Builds the eBPF object (`tartaros-ebpf`, target `bpfel-unknown-none`) and
//! places it at `$OUT_DIR/tartaros`, where `tartaros::ebpf` embeds it.
//!
//! - `TARTAROS_EBPF_OBJECT=/path/to/object`: use that prebuilt object; no
//!   nightly toolchain or bpf-linker needed.
//! - otherwise: `rustup run nightly cargo build -p tartaros-ebpf --target
//!   bpfel-unknown-none -Z build-std=core --release` into
//!   `<target dir>/bpf`, which needs nightly + rust-src + bpf-linker
//!   (`cargo xtask deps` installs them).

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const OBJECT_ENV: &str = "TARTAROS_EBPF_OBJECT";
const EBPF_PACKAGE: &str = "tartaros-ebpf";
/// The eBPF crate's binary target (named apart from the `tartaros` binary,
/// so that cargo sees no output filename collision).
const EBPF_BIN: &str = "tartaros-ebpf";
/// The file in `$OUT_DIR` that `tartaros::ebpf` embeds.
const EMBEDDED: &str = "tartaros";
const BPF_TARGET: &str = "bpfel-unknown-none";
const TOOLCHAIN: &str = "nightly";
const HINT: &str = "run `cargo xtask deps` to install the eBPF toolchain, or set TARTAROS_EBPF_OBJECT=/path/to/prebuilt/object (see docs/ebpf.md)";

fn main() {
    if let Err(msg) = run() {
        // Reported by cargo as one `error:` line.
        println!("cargo::error={msg}");
        // Cargo fails the build on `cargo::error` by itself and then prints
        // only the message (a non-zero exit would add the whole stdout).
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed={OBJECT_ENV}");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let dst = out_dir.join(EMBEDDED);

    if let Some(obj) = env::var_os(OBJECT_ENV).filter(|v| !v.is_empty()) {
        let obj = PathBuf::from(obj);
        println!("cargo:rerun-if-changed={}", obj.display());
        std::fs::copy(&obj, &dst).map_err(|e| {
            format!(
                "failed to copy {OBJECT_ENV}={} to {}: {e}",
                obj.display(),
                dst.display()
            )
        })?;
        return write_digest(&dst);
    }

    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?);
    let workspace = manifest_dir
        .parent()
        .ok_or("failed to find the workspace root above CARGO_MANIFEST_DIR")?;
    for krate in ["tartaros-ebpf", "tartaros-common"] {
        for item in ["src", "Cargo.toml"] {
            println!(
                "cargo:rerun-if-changed={}",
                workspace.join(krate).join(item).display()
            );
        }
    }
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );

    let path = search_path();
    check_toolchain(&path)?;

    // A separate target dir next to the host one, shared by debug, release
    // and clippy builds, so the BPF build (with build-std) is done once.
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("bpf");

    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        TOOLCHAIN,
        "cargo",
        "build",
        "--package",
        EBPF_PACKAGE,
    ])
    .args([
        "--bins",
        "--release",
        "--target",
        BPF_TARGET,
        "-Z",
        "build-std=core",
    ])
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(workspace)
    .env("PATH", &path)
    .env(
        "CARGO_ENCODED_RUSTFLAGS",
        format!(
            "--cfg=bpf_target_arch=\"{}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
            bpf_target_arch()
        ),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    scrub_outer_cargo_env(&mut cmd);
    // The workspace's release profile links the host binary with fat LTO
    // in one codegen unit. The BPF object keeps the default settings its
    // verifier budgets were measured with: bpf-linker links its bitcode
    // as one program anyway.
    cmd.env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");

    let out = cmd
        .output()
        .map_err(|e| format!("failed to run rustup for the eBPF build ({e}); {HINT}"))?;
    if !out.status.success() {
        // Relay the compiler output as warnings so it is visible, then fail.
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            println!("cargo:warning={line}");
        }
        return Err(format!(
            "failed to build the eBPF programs ({EBPF_PACKAGE}, {}); see the warnings above; {HINT}",
            out.status
        ));
    }
    let obj = target_dir.join(BPF_TARGET).join("release").join(EBPF_BIN);
    std::fs::copy(&obj, &dst)
        .map_err(|e| format!("failed to copy {} to {}: {e}", obj.display(), dst.display()))?;
    write_digest(&dst)
}

/// Writes the SHA-256 of the embedded object beside it (`<object>.sha256`,
/// hex): the pin cache names its directory by it (`ebpf/pin_cache.rs`)
/// without hashing 800 KB on every run.
fn write_digest(object: &Path) -> Result<(), String> {
    use sha2::Digest as _;
    let bytes =
        std::fs::read(object).map_err(|e| format!("failed to read {}: {e}", object.display()))?;
    let digest = sha2::Sha256::digest(&bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let path = object.with_extension("sha256");
    std::fs::write(&path, hex).map_err(|e| format!("failed to write {}: {e}", path.display()))
}

/// Architecture the BPF programs are written for (selects aya-ebpf's
/// per-arch bindings); the host architecture of this build.
fn bpf_target_arch() -> String {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    if arch.starts_with("riscv64") {
        "riscv64".to_owned()
    } else {
        arch
    }
}

/// PATH for the nested build, with `$CARGO_HOME/bin` (where `cargo xtask
/// deps` puts bpf-linker) appended in case the outer build did not have it.
fn search_path() -> OsString {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(bin) = cargo_home.map(|h| h.join("bin"))
        && !dirs.contains(&bin)
    {
        dirs.push(bin);
    }
    env::join_paths(dirs).unwrap_or_default()
}

fn find_in(path: &OsString, program: &str) -> Option<PathBuf> {
    env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Fails with one line naming what is missing.
fn check_toolchain(path: &OsString) -> Result<(), String> {
    if find_in(path, "rustup").is_none() {
        return Err(format!(
            "eBPF toolchain missing: rustup not found on PATH; {HINT}"
        ));
    }
    if find_in(path, "bpf-linker").is_none() {
        return Err(format!(
            "eBPF toolchain missing: bpf-linker not found; {HINT}"
        ));
    }
    let mut sysroot = Command::new("rustup");
    sysroot
        .args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .env("PATH", path)
        .stderr(Stdio::null());
    scrub_outer_cargo_env(&mut sysroot);
    let sysroot = sysroot
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .ok_or_else(|| {
            format!(
                "eBPF toolchain missing: the `{TOOLCHAIN}` Rust toolchain is not installed; {HINT}"
            )
        })?;
    let core_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core");
    if !core_src.is_dir() {
        return Err(format!(
            "eBPF toolchain missing: rust-src is not installed for `{TOOLCHAIN}`; {HINT}"
        ));
    }
    Ok(())
}

/// Removes what the outer cargo exports to build scripts and that would
/// leak into the nested nightly build (toolchain pinning, rustc wrappers
/// such as clippy-driver, host RUSTFLAGS, target dir, profile settings).
/// Keeps `CARGO_HOME`, registry / network settings and the jobserver.
fn scrub_outer_cargo_env(cmd: &mut Command) {
    const KEEP_PREFIXES: [&str; 7] = [
        "CARGO_HOME",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_TERM_",
        "CARGO_MAKEFLAGS",
    ];
    const REMOVE: [&str; 11] = [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_LINKER",
        "CLIPPY_ARGS",
        "CLIPPY_CONF_DIR",
        "TARGET",
    ];
    for key in REMOVE {
        cmd.env_remove(key);
    }
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_var = key == "CARGO" || key.starts_with("CARGO_") || key.starts_with("__CARGO");
        if cargo_var
            && key != "CARGO_ENCODED_RUSTFLAGS"
            && !KEEP_PREFIXES.iter().any(|p| key.starts_with(p))
        {
            cmd.env_remove(key);
        }
    }
}
