//! Size and inode bounds of a run's private tmpfs mounts (the private
//! `/tmp`, `/dev/shm`, every `--tmpfs`).
//!
//! Without them each had the kernel's defaults, half of the host's RAM and
//! one inode per page of it, and in an ordinary user's run without a
//! delegated cgroup nothing else bounded what an agent parked there until
//! the run ended. The mounts share one budget: the run's memory limit
//! when it has one (the kernel charges tmpfs pages to it anyway), else
//! [`DEFAULT_BUDGET`]. Each gets an equal share, so together they never
//! hold more than the budget, whether the limit is enforced or not (an
//! ordinary user's `--max-memory` without a delegated cgroup is only
//! recorded).

use serde::{Deserialize, Serialize};

use crate::policy::Policy;

/// What the private tmpfs mounts of a run without a memory limit may hold
/// together: a build's or a test's scratch files fit, a host does not
/// lose its memory to them. `--max-memory` sets another budget.
pub const DEFAULT_BUDGET: u64 = 2 << 30;

/// One page per inode at most: the kernel's own default ratio. An inode
/// costs kernel memory (about 1 KiB with its dentry) that no size bound
/// counts, so without this an agent could fill a size-bounded tmpfs with
/// millions of empty files.
const BYTES_PER_INODE: u64 = 4096;

/// Below this a share would break ordinary tools (a compiler's temporary
/// files, a lock in /dev/shm); a `--max-memory` that small would fail the
/// run sooner anyway.
const SMALLEST_SHARE: u64 = 1 << 20;

/// The bounds of one private tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsBounds {
    pub size: u64,
    pub inodes: u64,
}

impl Default for TmpfsBounds {
    fn default() -> Self {
        share(DEFAULT_BUDGET, 1)
    }
}

impl TmpfsBounds {
    /// The mount data for this tmpfs: `extra` (mode, owner), then the
    /// bounds.
    pub fn options(&self, extra: &str) -> String {
        format!("{extra},size={},nr_inodes={}", self.size, self.inodes)
    }
}

/// The bounds of each private tmpfs of a run with `policy`.
pub fn of(policy: &Policy) -> TmpfsBounds {
    // The private /dev/shm is always there.
    let mounts = 1 + usize::from(policy.private_tmp) + policy.tmpfs.len();
    share(policy.max_memory.unwrap_or(DEFAULT_BUDGET), mounts)
}

fn share(budget: u64, mounts: usize) -> TmpfsBounds {
    let mounts = u64::try_from(mounts.max(1)).unwrap_or(u64::MAX);
    // Whole pages: the kernel rounds a size up to one.
    let size = (budget / mounts / BYTES_PER_INODE * BYTES_PER_INODE).max(SMALLEST_SHARE);
    TmpfsBounds {
        size,
        inodes: size / BYTES_PER_INODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mounts_share_the_memory_limit() {
        let policy = Policy {
            private_tmp: true,
            max_memory: Some(64 << 20),
            tmpfs: vec!["/scratch".into()],
            ..Default::default()
        };
        let bounds = of(&policy);
        assert!(3 * bounds.size <= 64 << 20);
        assert_eq!(bounds.inodes, bounds.size / 4096);
        assert_eq!(
            bounds.options("mode=1777"),
            format!("mode=1777,size={},nr_inodes={}", bounds.size, bounds.inodes)
        );
    }

    #[test]
    fn without_a_memory_limit_they_share_the_default() {
        let policy = Policy {
            private_tmp: true,
            ..Default::default()
        };
        assert_eq!(
            of(&policy),
            TmpfsBounds {
                size: 1 << 30,
                inodes: (1 << 30) / 4096
            }
        );
        // /dev/shm alone gets the whole budget.
        assert_eq!(of(&Policy::default()).size, DEFAULT_BUDGET);
    }

    #[test]
    fn a_tiny_limit_still_leaves_each_mount_a_usable_share() {
        let policy = Policy {
            private_tmp: true,
            max_memory: Some(4096),
            ..Default::default()
        };
        assert_eq!(of(&policy).size, 1 << 20);
    }
}
