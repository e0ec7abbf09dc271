//! `cargo xtask bench proxy`: throughput of a 1 GiB download direct,
//! through a CONNECT tunnel and through the transparent listener, the CPU
//! each of the bench's threads spent per GiB, and the latency of small
//! requests each way, side by side in one run.
//!
//! The measurement lives in `tartaros::proxy::bench` (upstream, proxy and
//! client each on its own thread and current-thread runtime, all on
//! 127.0.0.1); this runs it through the ignored release-mode test
//! `bench_proxy`, so xtask need not link the tartaros crate.
//! Wire it in with `mod bench_proxy;` and `"proxy" => bench_proxy::run(root, runs)`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// `runs`: downloads per path (the median counts); `TARTAROS_BENCH_MIB`
/// in the environment overrides the 1024 MiB download size.
pub fn run(root: &Path, runs: usize) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root)
        .args([
            "test",
            "--release",
            "-p",
            "tartaros",
            "--features",
            "bench",
            "--test",
            "proxy",
            "--",
        ])
        .args(["--ignored", "--exact", "bench_proxy", "--nocapture"])
        .env("TARTAROS_BENCH_RUNS", runs.clamp(1, 15).to_string())
        .status()
        .context("failed to run cargo for the proxy benchmark")?;
    if !status.success() {
        bail!("the proxy benchmark failed: {status}");
    }
    Ok(())
}
