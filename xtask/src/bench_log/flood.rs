//! (2) of `cargo xtask bench log`: the event rate that reaches a verifying
//! log with no loss, from one generator and from one per core.

use std::process::{Command, Stdio};

use anyhow::Result;

use super::Setup;

/// One flood under `tartaros run --log` and what reached the log.
struct Flood {
    /// Opens the generators made, and the seconds they took.
    generated: u64,
    seconds: f64,
    /// Open records of the flood's files (the creates before the timed
    /// loop are `create` records, not counted), and events lost by the
    /// gap records' count.
    logged: u64,
    lost: u64,
    verify: i32,
}

impl Flood {
    fn rate(&self) -> f64 {
        self.generated as f64 / self.seconds
    }

    fn zero_loss(&self) -> bool {
        self.lost == 0 && self.logged == self.generated && self.verify == 0
    }
}

/// Runs the workload with `args` (its last pair the flood `mode N`) under
/// `tartaros run --log` with a 256 MiB ring, and counts the open records
/// whose text contains `marker`.
fn flood(setup: &Setup, args: &[String], marker: &str) -> Result<Flood> {
    let Setup {
        tartaros,
        workload: w,
        dir,
        cwd: d,
        ..
    } = setup;
    let log = dir.path().join("flood.jsonl");
    let out = Command::new(tartaros)
        .args(["run", "--write", d, "--log-buffer", "256M", "--log"])
        .arg(&log)
        .arg("--")
        .arg(w)
        .args(args)
        .current_dir(d)
        .stderr(Stdio::null())
        .output()?;
    let mode = &args[args.len() - 2];
    let (generated, seconds) = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut fields = l.split_whitespace();
            if fields.next()? != mode {
                return None;
            }
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .unwrap_or((0, f64::NAN));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let opens = text
        .lines()
        .filter(|l| l.contains("\"kind\":\"open\"") && l.contains(marker))
        .count() as u64;
    let lost: u64 = text
        .lines()
        .filter(|l| l.contains("\"kind\":\"gap\""))
        .filter_map(|l| {
            l.split("\"count\":")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let verify = Command::new(tartaros)
        .args(["log", "verify"])
        .arg(&log)
        .output()?;
    let _ = std::fs::remove_file(&log);
    Ok(Flood {
        generated,
        seconds,
        logged: opens,
        lost,
        verify: verify.status.code().unwrap_or(-1),
    })
}

/// (2) The event rate: floods of opens into a large ring buffer, from one
/// generator, then from one generator per core at once.
pub(super) fn event_rate(setup: &Setup) -> Result<()> {
    for n in [200_000u64, 1_000_000] {
        let f = flood(setup, &["flood".into(), n.to_string()], "flood.tmp")?;
        println!(
            "  flood of {n} opens: {:.0} events/s generated, {} logged, {} lost (gap records), verify exit {}",
            f.rate(),
            f.logged,
            f.lost,
            f.verify
        );
    }
    // One generator per core: a total rate no single process reaches.
    // 500,000 opens each take 2-3 s on this host; when that loses events
    // the size is halved (twice at most) for the largest zero-loss one.
    let procs = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut zero_loss = None;
    for each in [500_000u64, 250_000, 125_000] {
        let args = [
            "procs".to_string(),
            procs.to_string(),
            "pflood".into(),
            each.to_string(),
        ];
        let f = flood(setup, &args, "gen-")?;
        println!(
            "  flood of {} opens, one generator per core ({procs} processes x {each}): {:.2} s, {:.0} events/s generated, {} logged, {} lost (gap records), verify exit {}: {}",
            f.generated,
            f.seconds,
            f.rate(),
            f.logged,
            f.lost,
            f.verify,
            if f.zero_loss() {
                "zero loss"
            } else {
                "NOT zero loss"
            }
        );
        if f.zero_loss() {
            zero_loss = Some((f, each));
            break;
        }
    }
    match zero_loss {
        Some((f, each)) => println!(
            "  zero-loss rate with one generator per core: {:.0} events/s ({procs} x {each} opens)",
            f.rate()
        ),
        None => println!(
            "  no zero-loss size with one generator per core down to {procs} x 125000 opens"
        ),
    }
    Ok(())
}
