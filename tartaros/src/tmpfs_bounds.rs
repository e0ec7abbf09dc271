//! Bounds of a run's in-memory stores: its private tmpfs mounts (the
//! private `/tmp`, `/dev/shm`, every `--tmpfs`) and its IPC namespace's
//! System V shared memory, message queues and semaphores.
//!
//! Without them each had the kernel's defaults: half of the host's RAM
//! and one inode per page of it for a tmpfs, 16 EiB of shared memory,
//! 500 MiB of queued messages and 65 GB of semaphores for the IPC
//! namespace. What an agent parks
//! there outlives every process of it (killing processes frees none of
//! it) until the run ends, and in an ordinary user's run without a
//! delegated cgroup nothing else bounded it. The stores share one budget:
//! the run's memory limit when it has one (the kernel charges their pages
//! to it anyway), else [`DEFAULT_BUDGET`]. Each gets an equal share, so
//! together they never hold more than the budget, whether the limit is
//! enforced or not (an ordinary user's `--max-memory` without a delegated
//! cgroup is only recorded).

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

/// The limits of a run's IPC namespace (`ipc_limits.rs` sets them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcBounds {
    /// `kernel.shmmax`: the largest segment, in bytes.
    pub shm_bytes: u64,
    /// `kernel.shmall`: every segment together, in pages.
    pub shm_pages: u64,
    /// `kernel.msgmni`: message queues, each holding at most `msgmnb`
    /// (16 KiB: raising it for a queue needs CAP_SYS_RESOURCE).
    pub message_queues: u64,
    /// `kernel.sem`'s SEMMNS: semaphores of every set together.
    pub semaphores: u64,
    /// `kernel.sem`'s SEMMNI: semaphore sets.
    pub semaphore_sets: u64,
}

impl Default for IpcBounds {
    fn default() -> Self {
        ipc_share(share(DEFAULT_BUDGET, 1))
    }
}

/// What one queue may hold (`kernel.msgmnb`, the kernel's default).
const QUEUE_BYTES: u64 = 16384;

/// The kernel's default number of queues (and of semaphore sets); it
/// refuses more than 32,768.
const MOST_QUEUES: u64 = 32_000;

/// What one semaphore costs: `struct sem` is cache-line aligned.
const SEMAPHORE_BYTES: u64 = 64;

/// What a set costs beyond its semaphores (`struct sem_array`), rounded
/// up to a page.
const SET_BYTES: u64 = 4096;

/// The shares of the budget: the private /dev/shm (always there), the
/// private /tmp, each `--tmpfs`, and three for the IPC namespace (shared
/// memory, messages, semaphores).
fn shares(policy: &Policy) -> usize {
    1 + usize::from(policy.private_tmp) + policy.tmpfs.len() + 3
}

fn budget(policy: &Policy) -> u64 {
    policy.max_memory.unwrap_or(DEFAULT_BUDGET)
}

/// The bounds of each private tmpfs of a run with `policy`.
pub fn of(policy: &Policy) -> TmpfsBounds {
    share(budget(policy), shares(policy))
}

/// The limits of the IPC namespace of a run with `policy`.
pub fn ipc_of(policy: &Policy) -> IpcBounds {
    ipc_share(share(budget(policy), shares(policy)))
}

fn ipc_share(one: TmpfsBounds) -> IpcBounds {
    IpcBounds {
        shm_bytes: one.size,
        shm_pages: one.size / BYTES_PER_INODE,
        message_queues: (one.size / QUEUE_BYTES).clamp(1, MOST_QUEUES),
        // Half the share for the semaphores, half for the sets' own cost.
        semaphores: (one.size / 2 / SEMAPHORE_BYTES).max(1),
        semaphore_sets: (one.size / 2 / SET_BYTES).clamp(1, MOST_QUEUES),
    }
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
        // Three mounts and three shares for the IPC namespace.
        assert!(6 * bounds.size <= 64 << 20);
        let ipc = ipc_of(&policy);
        assert_eq!(ipc.shm_bytes, bounds.size);
        assert_eq!(ipc.shm_pages * 4096, bounds.size);
        assert!(ipc.message_queues * 16384 <= bounds.size);
        assert!(ipc.semaphores * 64 + ipc.semaphore_sets * 4096 <= bounds.size);
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
        // Whole pages.
        let fifth = DEFAULT_BUDGET / 5 / 4096 * 4096;
        assert_eq!(
            of(&policy),
            TmpfsBounds {
                size: fifth,
                inodes: fifth / 4096
            }
        );
        let quarter = DEFAULT_BUDGET / 4;
        assert_eq!(of(&Policy::default()).size, quarter);
        let ipc = ipc_of(&Policy::default());
        assert_eq!(ipc.shm_bytes, quarter);
        // Past the kernel's ceiling of queues, the default count.
        assert_eq!(ipc.message_queues, 32_000);
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
