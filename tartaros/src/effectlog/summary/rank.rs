//! The order of the summary's bounded lists, where an agent's decoys
//! would otherwise push what matters past the cut (adversarial round 20):
//! destinations that carried data before refused ones, and programs the
//! agent brought before the system's tools it ran most.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::Destination;

/// Distinct programs counted; more are counted in `programs_more`.
const MAX_PROGRAMS: usize = 10_000;
/// Programs listed in `processes.programs`; more are counted.
pub(super) const PROGRAMS_LISTED: usize = 1_000;

/// Where the usual tools live: a program run from elsewhere (the agent's
/// own build, a file in a writable root) is rarer and says more.
const SYSTEM_DIRS: &[&str] = &[
    "/bin/",
    "/sbin/",
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/local/bin/",
    "/usr/local/sbin/",
    "/usr/lib/",
    "/usr/lib64/",
    "/usr/libexec/",
    "/lib/",
    "/lib64/",
];

/// Whether `path` (an exec's name, or what the kernel ran) is a common
/// tool: a file in one of the system's directories.
pub(super) fn common_tool(path: &str) -> bool {
    SYSTEM_DIRS.iter().any(|d| path.starts_with(d)) && !path.contains("/../")
}

/// Destinations in the order shown: those that were reached or moved
/// bytes first (most bytes first), then those that only failed, then the
/// refused ones (most refusals first); by name within. Refused first let
/// 20 refused decoys hide a `--port` relay that carried data.
pub(super) fn sort_destinations(destinations: &mut [Destination]) {
    destinations.sort_by_cached_key(|d| {
        let bytes = d.bytes_up.saturating_add(d.bytes_down);
        let group = if d.allowed > 0 || bytes > 0 {
            0u8
        } else if d.refused == 0 {
            1
        } else {
            2
        };
        (
            group,
            Reverse(bytes),
            Reverse(d.refused),
            Reverse(d.allowed + d.failed),
            d.dest.clone(),
            d.via.clone(),
        )
    });
}

/// Whether a destination is one [`sort_destinations`] puts first, which
/// has room past the table's bound.
pub(super) fn reached(allowed: bool, bytes: u64) -> bool {
    allowed || bytes > 0
}

/// The programs run, each with its count and whether it is a common tool.
#[derive(Default)]
pub(super) struct Programs {
    runs: HashMap<String, (u64, bool)>,
    /// Execs of programs the table had no room for.
    untracked: u64,
}

impl Programs {
    pub(super) fn add(&mut self, name: String, common: bool) {
        if self.runs.len() < MAX_PROGRAMS || self.runs.contains_key(&name) {
            self.runs.entry(name).or_insert((0, common)).0 += 1;
        } else {
            self.untracked += 1;
        }
    }

    /// Programs that are not common tools first (fewest runs first: a
    /// program the agent ran once is at least as telling as one run a
    /// thousand times), then the common tools, most run first; at most
    /// [`PROGRAMS_LISTED`], and how many more there were (distinct
    /// programs left out, and execs of programs not tracked).
    pub(super) fn finish(self) -> (Vec<(String, u64)>, u64) {
        let mut all: Vec<(String, (u64, bool))> = self.runs.into_iter().collect();
        // Ascending: the agent's programs by runs, then the common tools
        // by runs counted down from the top.
        all.sort_by(|(a, (na, ca)), (b, (nb, cb))| {
            let runs = |n: u64, common: bool| if common { u64::MAX - n } else { n };
            (ca, runs(*na, *ca), a).cmp(&(cb, runs(*nb, *cb), b))
        });
        let more = all.len().saturating_sub(PROGRAMS_LISTED) as u64 + self.untracked;
        all.truncate(PROGRAMS_LISTED);
        (all.into_iter().map(|(p, (n, _))| (p, n)).collect(), more)
    }
}
