//! The summary as text: one screen for a typical run. Long tables are cut
//! with a count of what was left out (`--json` has everything). Every
//! string in a [`Summary`] is already escaped.

use std::fmt::Write as _;

use super::{FileChange, Summary};
use crate::effectlog::show::tree::SANDBOX_INIT;

const FILES_SHOWN: usize = 20;
const DESTINATIONS_SHOWN: usize = 12;
const REFUSALS_SHOWN: usize = 6;
const PROGRAMS_SHOWN: usize = 10;

/// `1234 B`, `56.7 KiB`, `8.0 MiB`.
fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 10 * 1024 {
        return format!("{n} B");
    }
    let mut unit = 0;
    let mut scaled = n / 1024;
    let mut tenths = (n % 1024) * 10 / 1024;
    while scaled >= 1024 && unit + 1 < UNITS.len() {
        tenths = (scaled % 1024) * 10 / 1024;
        scaled /= 1024;
        unit += 1;
    }
    format!("{scaled}.{tenths} {}", UNITS[unit])
}

/// A command line cut for one screen (the text is already escaped; `--json`
/// has the longer form).
fn short(s: &str) -> String {
    cut(s, 72)
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

fn inside_git(path: &str) -> bool {
    path.contains("/.git/")
}

/// A file of a `.git` directory that the reviewer's next `git` command
/// runs or obeys on the host: a hook, a repository's (or a submodule's)
/// `config` (`core.fsmonitor`, `core.hooksPath`), and what redirects git
/// to another directory's config and hooks: the `hooks` directory itself
/// (replaced by a link to the agent's directory), `commondir`, `gitdir`,
/// and a `.git` that is a file (`gitdir: ../elsewhere`) or a new
/// directory. Never folded into the count of `.git` files, nor left out of
/// a full table of files.
pub(crate) fn runs_on_host(path: &str) -> bool {
    if path.ends_with("/.git") {
        return true;
    }
    let Some(at) = path.find("/.git/") else {
        return false;
    };
    let rest = &path[at + "/.git/".len()..];
    // `git init` and `git clone` copy `*.sample` hooks, which git never
    // runs (a hook has its exact name).
    if rest.ends_with(".sample") {
        return false;
    }
    let module = rest.starts_with("modules/") || rest.starts_with("worktrees/");
    let own = |name: &str| {
        rest == name
            || (module
                && rest
                    .strip_suffix(name)
                    .is_some_and(|dir| dir.ends_with('/')))
    };
    ["config", "config.worktree", "hooks", "commondir", "gitdir"]
        .iter()
        .any(|name| own(name))
        || rest.starts_with("hooks/")
        || (module && rest.contains("/hooks/"))
}

/// An agent's string (already escaped) as one unmistakable field of a
/// line: quoted when it holds a space or a quote, as `log show` quotes
/// values, so that its spaces cannot forge the columns after it
/// (adversarial round 8: a refused TLS server name
/// `pypi.org:443  1 allowed, 9.0 MiB up` read as a destination reached).
fn field(escaped: &str) -> String {
    crate::effectlog::escape::quoted(escaped)
}

fn file_line(f: &FileChange) -> String {
    let mut what = field(&f.path);
    if let Some(from) = &f.renamed_from {
        what = format!("{} -> {what}", field(from));
    }
    let actions = if f.actions.is_empty() {
        String::new()
    } else {
        format!(" ({})", f.actions.join(", "))
    };
    let size = f.size.map_or_else(|| "-".to_string(), size);
    let hash = match (&f.sha256, &f.skipped) {
        (Some(h), _) => format!(
            "sha256 {}",
            h.get(..16).map_or(h.clone(), |p| format!("{p}…"))
        ),
        (None, Some(why)) => format!("no hash: {why}"),
        (None, None) => "-".to_string(),
    };
    format!("  {:<9} {what}{actions}  {size}  {hash}", f.change)
}

/// The summary as text.
pub fn summary_text(s: &Summary) -> String {
    let mut o = String::new();
    if s.verify_code == 0 {
        let _ = writeln!(o, "log: {}", s.verify);
    } else {
        let verdict = crate::effectlog::Verdict {
            code: s.verify_code,
            message: s.verify.clone(),
        };
        let _ = writeln!(o, "{}", crate::effectlog::show::warning_line(&verdict));
    }
    run_section(s, &mut o);
    files_section(s, &mut o);
    network_section(s, &mut o);
    refusals_section(s, &mut o);
    processes_section(s, &mut o);
    o
}

fn run_section(s: &Summary, o: &mut String) {
    let r = &s.run;
    let exit = r.exit.as_deref().unwrap_or("no seal: exit unknown");
    let after = r.duration_ms.map_or_else(String::new, |ms| {
        format!(" after {}.{:03} s", ms / 1000, ms % 1000)
    });
    let cgroup = match r.cgroup_empty {
        Some(true) => ", cgroup emptied",
        Some(false) => ", cgroup NOT emptied",
        None => "",
    };
    let degraded = if r.degraded.is_empty() {
        "none".to_string()
    } else {
        r.degraded.join(", ")
    };
    let _ = writeln!(
        o,
        "run: tartaros {} on kernel {}, {exit}{after}{cgroup}; degraded: {degraded}",
        r.version.as_deref().unwrap_or("?"),
        r.kernel.as_deref().unwrap_or("?"),
    );
    if !r.writable_roots.is_empty() {
        let _ = writeln!(o, "     writable roots: {}", r.writable_roots.join(", "));
    }
    if !r.discarded.is_empty() {
        let _ = writeln!(
            o,
            "     private tmpfs (discarded with the run): {}",
            r.discarded.join(", ")
        );
    }
}

fn files_section(s: &Summary, o: &mut String) {
    let source = if s.seal_has_files {
        "final size and SHA-256 from the seal"
    } else {
        "the seal lists no files: sizes and hashes unknown (-)"
    };
    let total = s.files.len() as u64 + s.files_more;
    let _ = writeln!(o, "\nfiles changed: {total} ({source})");
    if total == 0 {
        let _ = writeln!(o, "  none");
        return;
    }
    // In the summary's order (files.rs `finish`): the tree's own files
    // the run changed before those it created, so decoys cannot push a
    // rewritten Makefile off the screen. Files inside .git are one line:
    // a clone or commit changes hundreds of them.
    let mut shown = 0;
    let mut in_git = 0u64;
    // First, and not behind the work tree's 20 lines.
    let mut control = 0;
    for f in s.files.iter().filter(|f| runs_on_host(&f.path)) {
        if control < FILES_SHOWN {
            let _ = writeln!(o, "{}  [git runs this]", file_line(f));
            control += 1;
        }
    }
    for f in s.files.iter().filter(|f| !runs_on_host(&f.path)) {
        if inside_git(&f.path) {
            in_git += 1;
        } else if shown < FILES_SHOWN {
            let _ = writeln!(o, "{}", file_line(f));
            shown += 1;
        }
    }
    if in_git > 0 {
        let _ = writeln!(o, "  + {in_git} files inside .git directories");
    }
    let rest = total.saturating_sub(shown as u64 + control as u64 + in_git);
    if rest > 0 {
        let _ = writeln!(o, "  … and {rest} more (log summary --json lists them)");
    }
}

fn network_section(s: &Summary, o: &mut String) {
    let total = s.destinations.len() as u64 + s.destinations_more;
    let _ = writeln!(o, "\nnetwork destinations: {total}");
    if total == 0 {
        let _ = writeln!(o, "  none");
    }
    for d in s.destinations.iter().take(DESTINATIONS_SHOWN) {
        let mut counts = Vec::new();
        if d.allowed > 0 {
            counts.push(format!("{} allowed", d.allowed));
        }
        if d.refused > 0 {
            counts.push(format!("{} REFUSED", d.refused));
        }
        if d.failed > 0 {
            counts.push(format!("{} failed", d.failed));
        }
        let bytes = if d.bytes_up + d.bytes_down > 0 {
            format!(", {} up, {} down", size(d.bytes_up), size(d.bytes_down))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  {:<7} {}  {}{bytes}",
            d.via,
            field(&d.dest),
            counts.join(", ")
        );
    }
    // The list is reached-first (rank.rs): what was cut says how many of
    // it were refused, so a cut never hides a destination reached.
    let rest = total.saturating_sub(DESTINATIONS_SHOWN as u64);
    if rest > 0 {
        let refused = s
            .destinations
            .iter()
            .skip(DESTINATIONS_SHOWN)
            .filter(|d| d.allowed == 0 && d.bytes_up == 0 && d.bytes_down == 0 && d.refused > 0)
            .count();
        let _ = writeln!(o, "  … and {rest} more ({refused} only refused)");
    }
}

fn refusals_section(s: &Summary, o: &mut String) {
    let total: u64 = s.refusals.iter().map(|r| r.count).sum::<u64>() + s.refusals_more;
    let _ = writeln!(o, "\nrefused by the sandbox: {total}");
    if total == 0 {
        let _ = writeln!(o, "  none");
    }
    for m in ["filesystem", "network", "signal", "syscall"] {
        let group: Vec<_> = s.refusals.iter().filter(|r| r.mechanism == m).collect();
        if group.is_empty() {
            continue;
        }
        let n: u64 = group.iter().map(|r| r.count).sum();
        let _ = writeln!(o, "  {m} ({n}):");
        for r in group.iter().take(REFUSALS_SHOWN) {
            let errno = r
                .errno
                .as_deref()
                .map_or_else(String::new, |e| format!(" ({e})"));
            let times = if r.count > 1 {
                format!(" ×{}", r.count)
            } else {
                String::new()
            };
            let why = r
                .why
                .as_deref()
                .map_or_else(String::new, |w| format!(" [{w}]"));
            let _ = writeln!(o, "    {} {}{errno}{times}{why}", r.kind, r.target);
            let by = match (r.pid, &r.command) {
                (Some(pid), Some(cmd)) => format!("{pid} {}", short(cmd)),
                (Some(pid), None) => format!("{pid} (no exec recorded)"),
                _ => "an unknown process (the record names no pid)".to_string(),
            };
            // Two parents fit a line; the sandbox init, always the root,
            // says nothing (`--json` has four levels).
            let mut chain = vec![by];
            let parents = r.ancestry.iter().filter(|a| !a.ends_with(SANDBOX_INIT));
            chain.extend(parents.take(2).map(|a| cut(a, 40)));
            let _ = writeln!(o, "      by {}", chain.join(" <- "));
        }
        if group.len() > REFUSALS_SHOWN {
            let _ = writeln!(
                o,
                "    … and {} more kinds of refusal",
                group.len() - REFUSALS_SHOWN
            );
        }
    }
    if s.refusals_more > 0 {
        let _ = writeln!(o, "  … and {} more not grouped", s.refusals_more);
    }
    let failed: u64 = s.failures.values().sum();
    if failed > 0 {
        let mut by: Vec<_> = s.failures.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1));
        let list: Vec<String> = by.iter().take(6).map(|(e, n)| format!("{e} {n}")).collect();
        let _ = writeln!(
            o,
            "ordinary failures (not refusals): {failed} ({}); log show --failed lists them",
            list.join(", ")
        );
    }
}

fn processes_section(s: &Summary, o: &mut String) {
    let p = &s.processes;
    let _ = writeln!(
        o,
        "\nprocesses: {} ({} execs, tree depth {})",
        p.processes, p.execs, p.max_depth
    );
    if let Some(first) = &p.first {
        let _ = writeln!(o, "  first: {}", short(first));
    }
    if !p.programs.is_empty() {
        let list: Vec<String> = p
            .programs
            .iter()
            .take(PROGRAMS_SHOWN)
            .map(|(prog, n)| format!("{prog} ×{n}"))
            .collect();
        let _ = writeln!(o, "  ran: {}", list.join(", "));
        // Counted like every other cut list: ten programs and silence hid
        // what an agent ran once behind twelve copies of `true`.
        let rest = (p.programs.len().saturating_sub(PROGRAMS_SHOWN) as u64)
            .saturating_add(p.programs_more);
        if rest > 0 {
            let _ = writeln!(o, "  … and {rest} more (log summary --json lists them)");
        }
    }
    let records: u64 = s.counts.values().sum();
    let mut counts: Vec<_> = s.counts.iter().collect();
    counts.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let list: Vec<String> = counts
        .iter()
        .take(10)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(
        o,
        "records: {records} ({}), {} events lost, {} unreadable lines",
        list.join(", "),
        s.lost,
        s.unreadable_lines
    );
}

#[cfg(test)]
mod tests {
    use super::{runs_on_host, size};

    #[test]
    fn git_hooks_and_configs_are_told_from_other_git_files() {
        for path in [
            "/w/r/.git/hooks/pre-commit",
            "/w/r/.git/config",
            "/w/r/.git/config.worktree",
            "/w/r/.git/modules/sub/hooks/post-checkout",
            "/w/r/.git/modules/sub/config",
            "/w/r/.git/worktrees/wt/config.worktree",
            "/w/r/.git/hooks",
            "/w/r/.git/commondir",
            "/w/r/.git/modules/sub/hooks",
            "/w/r/.git/worktrees/wt/gitdir",
            "/w/sub/.git",
        ] {
            assert!(runs_on_host(path), "{path}");
        }
        for path in [
            "/w/r/.git/objects/ab/cdef",
            "/w/r/.git/refs/heads/hooks/x",
            "/w/r/.git/index",
            "/w/r/config",
            "/w/r/hooks/pre-commit",
            "/w/r/.git/configs/x",
            "/w/r/.git/hooks/pre-commit.sample",
            "/w/r/.git/modules/subhooks",
            "/w/r/.git/refs/heads/commondir",
            "/w/r/.github",
        ] {
            assert!(!runs_on_host(path), "{path}");
        }
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(10_239), "10239 B");
        assert_eq!(size(10_240), "10.0 KiB");
        assert_eq!(size(8 << 20), "8.0 MiB");
        assert_eq!(size(1536 << 20), "1.5 GiB");
    }
}
