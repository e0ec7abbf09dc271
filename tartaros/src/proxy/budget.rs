//! One budget of connections for every gateway of the process (proxy,
//! transparent listener, broker, `--port` relays), sized from the
//! descriptor limit.
//!
//! A listener's own cap (`max_connections`) bounds what one listener holds,
//! not what they hold together: the proxy and the transparent listener on
//! two addresses each, the broker and two relays per port could hold more
//! descriptors than the supervisor may open. Then the supervisor's own
//! work failed with EMFILE: the file notifications name a directory by a
//! handle that takes a descriptor to open, so an agent holding idle
//! connections made the files it changed vanish from the log. The table of
//! descriptors is the process's (the service forks one supervisor per
//! run), so the budget is too.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

/// Descriptors one connection may hold: the agent's socket, the upstream's
/// and two pipes of a spliced tunnel.
pub const DESCRIPTORS_PER_CONNECTION: u64 = 6;

/// Descriptors kept for the supervisor itself: the eBPF maps and links,
/// the fanotify group and the handles it opens, the log, the seal's files
/// (about 60 at rest).
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Above any sum of the listeners' own caps; keeps an unlimited
/// `RLIMIT_NOFILE` from asking the semaphore for more than it holds.
const MOST: u64 = 65_536;

/// How many gateway connections may be open at once under a soft
/// descriptor limit of `limit`. At least one, so the gateways still work
/// (one at a time) under a limit too small for the reserve.
pub fn connections_for(limit: u64) -> usize {
    let spare = limit.saturating_sub(RESERVED_DESCRIPTORS) / DESCRIPTORS_PER_CONNECTION;
    spare.clamp(1, MOST) as usize
}

/// The process's budget, sized on first use from the soft limit then in
/// force (the supervisor raises it to the hard limit before it serves).
pub fn shared() -> Arc<Semaphore> {
    static BUDGET: OnceLock<Arc<Semaphore>> = OnceLock::new();
    BUDGET
        .get_or_init(|| {
            let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024);
            Arc::new(Semaphore::new(connections_for(limit)))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_the_reserve_and_never_drops_to_nothing() {
        assert_eq!(connections_for(1024), 128);
        assert_eq!(connections_for(512), 42);
        assert_eq!(connections_for(100), 1);
        assert_eq!(connections_for(0), 1);
        assert_eq!(connections_for(u64::MAX), 65_536);
        // Every connection's descriptors and the reserve fit the limit.
        for limit in [300, 512, 1024, 4096, 20_000] {
            let used = connections_for(limit) as u64 * DESCRIPTORS_PER_CONNECTION;
            assert!(used + RESERVED_DESCRIPTORS <= limit, "{limit}");
        }
    }
}
