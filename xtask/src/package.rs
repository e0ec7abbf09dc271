//! `cargo xtask package`: a Debian package with the binary (the eBPF object
//! is embedded in it), the man page and shell completions, generated from
//! the binary's own command-line definition. Built with `dpkg-deb`
//! directly, so nothing needs installing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Where each generated file goes in the package.
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "usr/share/bash-completion/completions/tartaros"),
    ("zsh", "usr/share/zsh/vendor-completions/_tartaros"),
    ("fish", "usr/share/fish/vendor_completions.d/tartaros.fish"),
];

/// Subcommands with a page of their own (`man tartaros-run`).
const MAN_SUBCOMMANDS: &[&str] = &["run", "doctor", "log", "completions", "service"];

/// The service's systemd units (socket activation), from `dist/`.
const UNITS: &[&str] = &["tartaros.socket", "tartaros.service"];

/// Builds `<out>/tartaros_<version>_<arch>.deb` from `binary`; returns its path.
pub fn build(binary: &Path, out: &Path) -> Result<PathBuf> {
    let binary = binary
        .canonicalize()
        .with_context(|| format!("failed to find the binary {}", binary.display()))?;
    let version = output(Command::new(&binary).arg("--version"))?;
    let version = version
        .split_whitespace()
        .nth(1)
        .context("`tartaros --version` printed no version")?
        .to_string();
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_string();
    std::fs::create_dir_all(out)?;
    let stage = out.join(format!("tartaros_{version}_{arch}"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    let put = |relative: &str, bytes: &[u8], mode: u32| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = stage.join(relative);
        std::fs::create_dir_all(path.parent().context("no parent")?)?;
        std::fs::write(&path, bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put("usr/bin/tartaros", &std::fs::read(&binary)?, 0o755)?;
    for unit in UNITS {
        let text = std::fs::read(crate::workspace_root().join("dist").join(unit))?;
        put(&format!("lib/systemd/system/{unit}"), &text, 0o644)?;
    }
    let man = output_bytes(Command::new(&binary).arg("manpage"))?;
    put("usr/share/man/man1/tartaros.1.gz", &gzip(&man)?, 0o644)?;
    for sub in MAN_SUBCOMMANDS {
        let man = output_bytes(Command::new(&binary).args(["manpage", sub]))?;
        put(
            &format!("usr/share/man/man1/tartaros-{sub}.1.gz"),
            &gzip(&man)?,
            0o644,
        )?;
    }
    for (shell, path) in COMPLETIONS {
        let script = output_bytes(Command::new(&binary).args(["completions", shell]))?;
        put(path, &script, 0o644)?;
    }
    put(
        "usr/share/doc/tartaros/copyright",
        b"TartarOS\nLicense: Apache-2.0\nOn Debian systems the license is in /usr/share/common-licenses/Apache-2.0.\n",
        0o644,
    )?;
    let size_kib = dir_size(&stage)? / 1024 + 1;
    let control = format!(
        "Package: tartaros\nVersion: {version}\nArchitecture: {arch}\nMaintainer: TartarOS developers <tartaros@example.invalid>\nInstalled-Size: {size_kib}\nDepends: libc6\nSection: admin\nPriority: optional\nHomepage: https://example.invalid/tartaros\nDescription: sandbox for AI coding agents with a verifiable effect log\n Runs one command under Landlock, seccomp, namespaces, cgroups and\n cgroup eBPF, and writes a hash-chained log of its effects.\n"
    );
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    let deb = out.join(format!("tartaros_{version}_{arch}.deb"));
    // gzip: a debug binary is over 100 MB, which xz takes a minute on.
    let status = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&stage)
        .arg(&deb)
        .stdout(std::process::Stdio::null())
        .status()
        .context("failed to run dpkg-deb (apt-get install dpkg)")?;
    if !status.success() {
        bail!("dpkg-deb failed with {status}");
    }
    std::fs::remove_dir_all(&stage)?;
    Ok(deb)
}

fn output_bytes(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn output(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8(output_bytes(cmd)?)?)
}

/// `gzip -9n`: no name or time stamp, so the package is reproducible.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .arg("-9nc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("failed to run gzip")?;
    child.stdin.take().context("gzip stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("gzip failed with {}", out.status);
    }
    Ok(out.stdout)
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
